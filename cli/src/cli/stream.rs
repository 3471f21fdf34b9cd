//! `rheo stream create|list` and `rheo index create|status`.

use std::io::Write;

use clap::{Args, Subcommand};
use rheo::{IndexStatus, StreamInfo, StreamOptions};

use super::output::{Table, line, print_json};
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
    let rheo = ctx.open().await?;
    match command {
        StreamCommand::Create(a) => {
            let info =
                rheo.create_stream(&a.name, StreamOptions::new().partitions(a.partitions).indexes(a.indexes)).await?;
            if ctx.json {
                print_json(&info)?;
            } else {
                line(format!("created stream {} with {} partition(s)", info.name, info.partition_count))?;
            }
        }
        StreamCommand::List => {
            let streams = rheo.list_streams().await?;
            if ctx.json {
                print_json(&streams)?;
            } else {
                stream_table(&streams).print("no streams")?;
            }
        }
    }
    Ok(true)
}

fn stream_table(streams: &[StreamInfo]) -> Table {
    let mut t = Table::new(&["NAME", "PARTITIONS", "EVENTS", "INDEXES", "CREATED"]);
    for s in streams {
        t.row(vec![
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
    let rheo = ctx.open().await?;
    match command {
        IndexCommand::Create { stream, field } => {
            let build = rheo.create_index(&stream, &field).await?;
            let human = !ctx.json;
            let done = build
                .wait(|s| {
                    if human {
                        eprint!("\rbuilding index {}: {}/{} segments", s.field, s.segments_ready, s.segments_total);
                        let _ = std::io::stderr().flush();
                    }
                })
                .await?;
            if ctx.json {
                print_json(&done)?;
            } else {
                eprintln!();
                line(format!(
                    "index {} on {stream} is built: {}/{} segments",
                    done.field, done.segments_ready, done.segments_total
                ))?;
            }
        }
        IndexCommand::Status { stream } => {
            let statuses = rheo.index_status(&stream).await?;
            if ctx.json {
                print_json(&statuses)?;
            } else {
                index_table(&statuses).print("no declared indexes")?;
            }
        }
    }
    Ok(true)
}

fn index_table(statuses: &[IndexStatus]) -> Table {
    let mut t = Table::new(&["FIELD", "READY", "SEGMENTS", "FAILED"]);
    for s in statuses {
        t.row(vec![
            s.field.clone(),
            if s.ready() { "yes".into() } else { "no".into() },
            format!("{}/{}", s.segments_ready, s.segments_total),
            s.segments_failed.to_string(),
        ]);
    }
    t
}
