//! `rheo stream create|list|info|retention` and `rheo index create|status`.

use clap::{Args, Subcommand};
use comfy_table::Table;
use rheo::{IndexStatus, Retention, RetentionPolicy, RetentionReport, StreamInfo, StreamOptions, format_duration};

use super::output::{Output, progress, render, table};
use super::{CliError, CliResult, Globals, parse};

/// `rheo stream ...`
#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Creates a stream.
    Create(CreateArgs),
    /// Lists the streams with their partitions, indexes and event counts.
    List,
    /// Shows a stream: each partition's first and last sequence, events and
    /// size, its retention and dedupe window.
    Info {
        /// The stream.
        stream: String,
    },
    /// Changes a stream's retention (the flags given replace those limits;
    /// the others stay), and with `--apply` runs a retention pass now.
    Retention(RetentionArgs),
}

/// Retention flags, as `stream create` and `stream retention` take them.
#[derive(Debug, Args, Default)]
pub struct RetentionFlags {
    /// Drop events older than this, e.g. `7d`, `12h` (`none`: no age limit).
    #[arg(long, value_name = "DURATION")]
    max_age: Option<String>,
    /// Keep at most this many bytes per partition, e.g. `10GiB` (`none`: no limit).
    #[arg(long, value_name = "BYTES")]
    max_bytes: Option<String>,
    /// Keep at most this many events per partition (`none`: no limit).
    #[arg(long, value_name = "N")]
    max_events: Option<String>,
    /// `limits` (drop past the limits whatever the groups did) or
    /// `interest` (drop what every group settled; the limits as a ceiling).
    #[arg(long, value_name = "POLICY")]
    policy: Option<String>,
}

impl RetentionFlags {
    fn given(&self) -> bool {
        self.max_age.is_some() || self.max_bytes.is_some() || self.max_events.is_some() || self.policy.is_some()
    }

    /// `base` with the flags given applied.
    fn apply(&self, mut r: Retention) -> Result<Retention, CliError> {
        let none = |v: &str| v == "none";
        if let Some(v) = &self.max_age {
            r.max_age = if none(v) { None } else { Some(parse::duration("--max-age", v)?) };
        }
        if let Some(v) = &self.max_bytes {
            r.max_bytes = if none(v) { None } else { Some(parse::bytes("--max-bytes", v)?) };
        }
        if let Some(v) = &self.max_events {
            r.max_events = if none(v) {
                None
            } else {
                Some(v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    CliError::usage(format!("--max-events {v:?}: expected a whole number above 0, or none"))
                })?)
            };
        }
        if let Some(v) = &self.policy {
            r.policy = v
                .parse::<RetentionPolicy>()
                .map_err(|_| CliError::usage(format!("--policy {v:?}: expected limits or interest")))?;
        }
        Ok(r)
    }
}

/// Arguments of `rheo stream retention`.
#[derive(Debug, Args)]
pub struct RetentionArgs {
    /// The stream.
    stream: String,
    #[command(flatten)]
    limits: RetentionFlags,
    /// Keep everything again (no limit, policy limits).
    #[arg(long, conflicts_with_all = ["max_age", "max_bytes", "max_events", "policy"])]
    forever: bool,
    /// Run a retention pass now and show what it dropped.
    #[arg(long)]
    apply: bool,
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
    #[command(flatten)]
    retention: RetentionFlags,
    /// How long the native backend remembers producer-given event ids,
    /// e.g. `2m` (0s: off).
    #[arg(long, value_name = "DURATION")]
    dedupe_window: Option<String>,
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
            let mut opts = StreamOptions::new()
                .partitions(a.partitions)
                .indexes(a.indexes)
                .retention(a.retention.apply(Retention::new())?);
            if let Some(w) = &a.dedupe_window {
                opts = opts.dedupe_window(parse::duration("--dedupe-window", w)?);
            }
            let info = ctx.open_write().await?.create_stream(&a.name, opts).await?;
            Output::new(&info)?.line(format!(
                "created stream {} with {} partition(s), retention {}",
                info.name, info.partition_count, info.retention
            ))
        }
        StreamCommand::List => {
            let streams = ctx.open_read().await?.list_streams().await?;
            Output::new(&streams)?.table(stream_table(&streams), "no streams")
        }
        StreamCommand::Info { stream } => {
            let info = ctx.open_read().await?.stream_info(&stream).await?;
            info_output(&info)?
        }
        StreamCommand::Retention(a) => {
            if !a.forever && !a.limits.given() && !a.apply {
                return Err(CliError::usage(
                    "stream retention: give --max-age, --max-bytes, --max-events, --policy or --forever (and --apply to run a pass now)",
                ));
            }
            let rheo = ctx.open_write().await?;
            let mut info = rheo.stream_info(&a.stream).await?;
            if a.forever || a.limits.given() {
                let r = if a.forever { Retention::new() } else { a.limits.apply(info.retention)? };
                info = rheo.set_retention(&a.stream, r).await?;
            }
            if a.apply {
                let report = rheo.enforce_retention(&a.stream).await?;
                info = rheo.stream_info(&a.stream).await?;
                let mut out = Output::new(&serde_json::json!({"stream": info, "pass": report}))?;
                out = out.line(format!("retention of {}: {}", info.name, info.retention));
                for l in report_lines(&report) {
                    out = out.line(l);
                }
                out
            } else {
                info_output(&info)?.line(format!(
                    "retention set; the next pass applies it (or: rheo stream retention {} --apply)",
                    info.name
                ))
            }
        }
    };
    render(ctx.json, out)?;
    Ok(true)
}

/// Events a stream holds: retained ones where the backend says, else its
/// high watermarks' sum.
fn events_of(s: &StreamInfo) -> u64 {
    if s.partitions.is_empty() { s.high_watermarks.iter().sum() } else { s.partitions.iter().map(|p| p.events()).sum() }
}

/// `stream info`: a table of the partitions, then the settings.
fn info_output(info: &StreamInfo) -> Result<Output, CliError> {
    let mut t = table(&["PARTITION", "FIRST", "LAST", "EVENTS", "BYTES"]);
    for p in &info.partitions {
        t.add_row([
            p.partition.to_string(),
            p.first_sequence.to_string(),
            p.last_sequence.to_string(),
            p.events().to_string(),
            p.bytes.to_string(),
        ]);
    }
    let window = match info.dedupe_window {
        None => "forever (the backend's unique key)".to_owned(),
        Some(w) if w.is_zero() => "off".to_owned(),
        Some(w) => format_duration(w),
    };
    Ok(Output::new(info)?
        .line(format!(
            "stream       {} ({} partition(s), created {})",
            info.name, info.partition_count, info.created_at
        ))
        .table(t, "no partitions")
        .line(format!("events       {} in {} bytes", events_of(info), info.bytes()))
        .line(format!("retention    {}", info.retention))
        .line(format!("dedupe ids   {window}")))
}

/// What a retention pass did, line by line.
fn report_lines(r: &RetentionReport) -> Vec<String> {
    let mut out = Vec::new();
    if r.dropped.is_empty() {
        out.push("nothing dropped".to_owned());
    }
    for d in &r.dropped {
        out.push(format!("partition {}: dropped {}..={} ({} bytes)", d.partition, d.first, d.last, d.bytes));
    }
    for s in &r.skipped {
        out.push(format!("group {} partition {}: moved past {} unsettled event(s)", s.group, s.partition, s.skipped));
    }
    if r.ceiling_hit {
        out.push("interest policy: the limits dropped events some group had not settled".to_owned());
    }
    out
}

fn stream_table(streams: &[StreamInfo]) -> Table {
    let mut t = table(&["NAME", "PARTITIONS", "EVENTS", "INDEXES", "CREATED"]);
    for s in streams {
        t.add_row([
            s.name.clone(),
            s.partition_count.to_string(),
            events_of(s).to_string(),
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
    render(ctx.json, out)?;
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
