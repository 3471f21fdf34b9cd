//! `rheo stream create|list` and `rheo index create|status`.

use clap::{Args, Subcommand};
use comfy_table::Table;
use rheo::{IndexStatus, StreamInfo, StreamOptions};

use super::output::{Output, progress, render, table};
use super::{CliResult, Globals};

/// `rheo stream ...`
#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Creates a stream.
    Create(CreateArgs),
    /// Lists the streams with their partitions, indexes and event counts.
    List,
}

/// Arguments of `rheo stream create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The stream name.
    name: String,
    /// The number of partitions.
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// A payload field to index (repeatable), e.g. `--index customer`.
    #[arg(long = "index", value_name = "FIELD")]
    indexes: Vec<String>,
}

/// `rheo index ...`
#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Declares an index on a field and shows its backfill until it is built.
    Create {
        /// The stream.
        stream: String,
        /// The field path, e.g. `customer` or `payload.order.total`.
        field: String,
    },
    /// Shows how far each index of a stream is built.
    Status {
        /// The stream.
        stream: String,
    },
}

/// Runs `rheo stream ...`.
pub async fn run_stream(ctx: &Globals, command: StreamCommand) -> CliResult {
    let out = match command {
        StreamCommand::Create(a) => {
            let opts = StreamOptions::new().partitions(a.partitions).indexes(a.indexes);
            let info = ctx.open_write().await?.create_stream(&a.name, opts).await?;
            Output::new(&info)?.line(format!("created stream {} with {} partition(s)", info.name, info.partition_count))
        }
        StreamCommand::List => {
            let streams = ctx.open_read().await?.list_streams().await?;
            Output::new(&streams)?.table(stream_table(&streams), "no streams")
        }
    };
    render(ctx, out)?;
    Ok(true)
}

fn stream_table(streams: &[StreamInfo]) -> Table {
    let mut t = table(&["NAME", "PARTITIONS", "EVENTS", "INDEXES", "CREATED"]);
    for s in streams {
        t.add_row([
            s.name.clone(),
            s.partition_count.to_string(),
            s.high_watermarks.iter().sum::<u64>().to_string(),
            if s.indexes.is_empty() { "-".into() } else { s.indexes.join(",") },
            s.created_at.to_string(),
        ]);
    }
    t
}

/// Runs `rheo index ...`.
pub async fn run_index(ctx: &Globals, command: IndexCommand) -> CliResult {
    let out = match command {
        IndexCommand::Create { stream, field } => {
            let build = ctx.open_write().await?.create_index(&stream, &field).await?;
            let bar = progress(None, "building index {msg} [{bar:30}] {pos}/{len} segments", field.clone());
            let done = build
                .wait(|s| {
                    bar.set_length(s.segments_total);
                    bar.set_position(s.segments_ready);
                })
                .await;
            bar.finish_and_clear();
            let done = done?;
            Output::new(&done)?.line(format!(
                "index {} on {stream} is built: {}/{} segments",
                done.field, done.segments_ready, done.segments_total
            ))
        }
        IndexCommand::Status { stream } => {
            let statuses = ctx.open_read().await?.index_status(&stream).await?;
            Output::new(&statuses)?.table(index_table(&statuses), "no declared indexes")
        }
    };
    render(ctx, out)?;
    Ok(true)
}

fn index_table(statuses: &[IndexStatus]) -> Table {
    let mut t = table(&["FIELD", "READY", "SEGMENTS", "FAILED"]);
    for s in statuses {
        t.add_row([
            s.field.clone(),
            if s.ready() { "yes".into() } else { "no".into() },
            format!("{}/{}", s.segments_ready, s.segments_total),
            s.segments_failed.to_string(),
        ]);
    }
    t
}
