//! `rheo append`, `rheo read`, `rheo query` and `rheo tail`.

use std::io::BufRead;
use std::time::Duration;

use clap::Args;
use rheo::{AppendOptions, Event, OrderBy, Query, Rheo};
use serde_json::{Value, json};

use comfy_table::Table;

use super::output::{Output, progress, render, short_json, table};
use super::{CliError, CliResult, Globals, parse};

/// The most events `append` sends in one batch.
const APPEND_BATCH_MAX: usize = 1000;

/// Arguments of `rheo append`.
#[derive(Debug, Args)]
pub struct AppendArgs {
    /// The stream.
    stream: String,
    /// JSON payloads; none: read JSON lines from stdin.
    payloads: Vec<String>,
    /// Routing key of every event appended.
    #[arg(long)]
    key: Option<String>,
    /// Sets the payload's `type` field (the event type) of every event.
    #[arg(long = "type", value_name = "TYPE")]
    event_type: Option<String>,
    /// Appends to this partition instead of routing by key.
    #[arg(long)]
    partition: Option<u32>,
    /// The event's id (one payload only). An append retried with an id the
    /// stream already has writes nothing and prints the original, marked
    /// duplicate: retrying after an error is safe.
    #[arg(long)]
    id: Option<String>,
    /// Takes each event's id from this top-level payload field (a string
    /// or a number), e.g. `--id-field order_id`: running the same input
    /// again appends each line once.
    #[arg(long, value_name = "FIELD", conflicts_with = "id")]
    id_field: Option<String>,
    /// Schedules every event this long from now (`90s`, `15m`, `2h`, `1d`):
    /// no group claims it before then.
    #[arg(long, value_name = "DURATION")]
    delay: Option<String>,
    /// Schedules every event at this time (RFC 3339 or milliseconds): no
    /// group claims it before then.
    #[arg(long, value_name = "TIME", conflicts_with = "delay")]
    at: Option<String>,
}

/// Arguments of `rheo read`.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The stream.
    stream: String,
    /// Reads only this partition. Without it, every partition in turn:
    /// partition 0's events, then partition 1's, ..., up to `--limit` in all.
    #[arg(long)]
    partition: Option<u32>,
    /// Reads events with sequence above this (in each partition read).
    #[arg(long, default_value_t = 0)]
    after: u64,
    /// The most events to read (1 to 10,000).
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

/// Arguments of `rheo query`.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The stream.
    stream: String,
    /// A condition (repeatable, all must hold): `path=value`, `path>value`,
    /// `path>=value`, `path<value`, `path<=value`, `path in a,b,c`,
    /// `path exists`, `path missing`. Values are JSON when they parse as
    /// JSON (`n=1` is the number), else strings (`s="1"` is the string).
    #[arg(long = "where", value_name = "CONDITION")]
    conditions: Vec<String>,
    /// Timestamp lower bound (inclusive): RFC 3339 or milliseconds.
    #[arg(long)]
    from: Option<String>,
    /// Timestamp upper bound (inclusive): RFC 3339 or milliseconds.
    #[arg(long)]
    to: Option<String>,
    /// Sequence lower bound (exclusive), in every partition.
    #[arg(long)]
    after_sequence: Option<u64>,
    /// Sequence upper bound (inclusive), in every partition.
    #[arg(long)]
    until_sequence: Option<u64>,
    /// Result order.
    #[arg(long, value_enum, default_value_t = Order::Sequence)]
    order: Order,
    /// Descending order.
    #[arg(long)]
    desc: bool,
    /// The most events per page.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Continue after this cursor (printed by the previous page).
    #[arg(long)]
    cursor: Option<String>,
    /// Shows how each run of sequences was read (index or scan).
    #[arg(long)]
    explain: bool,
}

/// The `--order` of a query.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Order {
    /// By sequence, then partition.
    Sequence,
    /// By timestamp.
    Timestamp,
    /// By partition, then sequence.
    Partition,
}

/// Arguments of `rheo tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    /// The stream.
    stream: String,
    /// Follows only this partition.
    #[arg(long)]
    partition: Option<u32>,
    /// Starts at the end: only events appended from now on.
    #[arg(long)]
    from_end: bool,
    /// Stops after this many events.
    #[arg(long)]
    count: Option<u64>,
}

/// The most appended events `append` lists in its table (beyond, a count).
const APPEND_TABLE_MAX: usize = 50;

/// Runs `rheo append`. Arguments are all checked before anything is
/// appended; stdin is appended in batches as it is read, and a bad line
/// stops the run once every line before it is appended (the error says
/// how many).
pub async fn append(ctx: &Globals, a: AppendArgs) -> CliResult {
    let mut opts = AppendOptions::new();
    if let Some(k) = &a.key {
        opts = opts.key(k.clone());
    }
    if let Some(p) = a.partition {
        opts = opts.partition(p);
    }
    if a.id.is_some() && a.payloads.len() != 1 {
        return Err(CliError::usage(format!(
            "--id names one event: give exactly one payload (got {}); for many, use --id-field",
            a.payloads.len()
        )));
    }
    if let Some(id) = &a.id {
        opts = opts.id(id.clone());
    }
    if let Some(d) = &a.delay {
        opts = opts.delay(parse::duration("--delay", d)?);
    }
    if let Some(t) = &a.at {
        opts = opts.deliver_at(parse::time(t)?);
    }
    if a.payloads.is_empty() {
        return append_stdin(ctx, &a, &opts).await;
    }
    let mut appended: Vec<Event> = Vec::new();
    let mut items = Vec::with_capacity(a.payloads.len());
    for (n, text) in a.payloads.iter().enumerate() {
        items.push(item(&a, &opts, text, &format!("argument {}", n + 1))?);
    }
    let rheo = ctx.open_write().await?;
    for chunk in items.chunks(APPEND_BATCH_MAX) {
        let mut batch = chunk.to_vec();
        flush(&rheo, &a.stream, &mut batch, &mut appended).await?;
    }
    let mut out = Output::new(&appended)?;
    if appended.len() <= APPEND_TABLE_MAX {
        out = out.table(event_table(&appended), "");
    }
    render(ctx.json, out.line(appended_line(&a.stream, appended.len(), duplicates(&appended))))?;
    Ok(true)
}

/// How many of these events were answered as duplicates (nothing written).
fn duplicates(events: &[Event]) -> usize {
    events.iter().filter(|e| e.is_duplicate()).count()
}

/// `appended N event(s) to S`, with how many were already there.
fn appended_line(stream: &str, count: usize, duplicates: usize) -> String {
    if duplicates == 0 {
        return format!("appended {count} event(s) to {stream}");
    }
    format!(
        "appended {} event(s) to {stream}; {duplicates} had an id already in the stream (nothing written; the original is shown)",
        count - duplicates
    )
}

/// One event to append: its payload and its options (its id from
/// `--id-field` when asked).
fn item(a: &AppendArgs, opts: &AppendOptions, text: &str, what: &str) -> Result<(Value, AppendOptions), CliError> {
    let v = payload(text, what, a.event_type.as_deref())?;
    let Some(field) = &a.id_field else { return Ok((v, opts.clone())) };
    let id = match v.get(field) {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => {
            return Err(CliError::usage(format!(
                "{what}: --id-field {field:?}: the payload has no string or number field {field:?}"
            )));
        }
    };
    Ok((v, opts.clone().id(id)))
}

/// Lines read from stdin ahead of the appends, at most.
const STDIN_AHEAD: usize = 2 * APPEND_BATCH_MAX;

/// `rheo append` of JSON lines on stdin, as they arrive: each batch is what
/// was read while the previous one was appended (at most
/// [`APPEND_BATCH_MAX`]), so a slow producer piped in sees each line
/// appended at once and a fast one in batches. Under `--json` each event
/// is printed (a JSON line) once appended, so a pipeline knows what is
/// durable; the text output is the count (and the events, when few).
/// Memory stays bounded however long it runs.
async fn append_stdin(ctx: &Globals, a: &AppendArgs, opts: &AppendOptions) -> CliResult {
    let rheo = ctx.open_write().await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<(usize, String), String>>(STDIN_AHEAD);
    // A plain thread: a blocked read of stdin must not hold the runtime's
    // shutdown. It ends at EOF, or when nobody receives any more.
    std::thread::spawn(move || {
        for (n, line) in std::io::stdin().lock().lines().enumerate() {
            let item = line.map(|l| (n + 1, l)).map_err(|e| format!("reading stdin: {e}"));
            let failed = item.is_err();
            if tx.blocking_send(item).is_err() || failed {
                return;
            }
        }
    });
    let bar = progress(None, "{spinner} appending to {msg}: {pos} events ({per_sec})", a.stream.clone());
    let mut first: Vec<Event> = Vec::new();
    let (mut count, mut dups) = (0usize, 0usize);
    let mut batch = Vec::new();
    // One stdin line: its payload, nothing (a blank line), or why it is bad.
    let parse = |line: Result<(usize, String), String>| -> Result<Option<(Value, AppendOptions)>, CliError> {
        let (n, text) = line.map_err(CliError::new)?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        item(a, opts, &text, &format!("stdin line {n}")).map(Some)
    };
    let mut bad = None;
    while let Some(item) = rx.recv().await {
        let mut next = Some(item);
        while let Some(item) = next.take() {
            match parse(item) {
                Ok(Some(v)) => batch.push(v),
                Ok(None) => {}
                Err(e) => {
                    bad = Some(e);
                    break;
                }
            }
            if batch.len() < APPEND_BATCH_MAX {
                next = rx.try_recv().ok();
            }
        }
        // Every line before a bad one is appended, then the run stops.
        let mut appended = Vec::new();
        flush(&rheo, &a.stream, &mut batch, &mut appended).await?;
        count += appended.len();
        dups += duplicates(&appended);
        bar.set_position(count as u64);
        if ctx.json {
            render(ctx.json, Output::lines(&appended)?)?;
        }
        if first.len() <= APPEND_TABLE_MAX {
            first.extend(appended.into_iter().take(APPEND_TABLE_MAX + 1 - first.len()));
        }
        if let Some(e) = bad {
            bar.finish_and_clear();
            let usage = e.kind() == super::ErrorKind::Usage;
            let message = format!("{e} (stopped after appending the {count} event(s) before it)");
            return Err(if usage { CliError::usage(message) } else { CliError::new(message) });
        }
    }
    bar.finish_and_clear();
    if count == 0 {
        return Err(CliError::usage("nothing to append: give JSON payloads as arguments or JSON lines on stdin"));
    }
    if !ctx.json {
        let mut out = Output::text_only();
        if count <= APPEND_TABLE_MAX {
            out = out.table(event_table(&first), "");
        }
        render(ctx.json, out.line(appended_line(&a.stream, count, dups)))?;
    }
    Ok(true)
}

/// Appends `batch` (emptying it) and adds the events to `appended`.
async fn flush(
    rheo: &Rheo,
    stream: &str,
    batch: &mut Vec<(Value, AppendOptions)>,
    appended: &mut Vec<Event>,
) -> Result<(), CliError> {
    if batch.is_empty() {
        return Ok(());
    }
    appended.extend(rheo.append_batch_with(stream, batch.drain(..)).await?);
    Ok(())
}

/// One payload: a JSON object (or any JSON value), with `type` set when asked.
fn payload(text: &str, what: &str, event_type: Option<&str>) -> Result<Value, CliError> {
    let mut v: Value =
        serde_json::from_str(text).map_err(|e| CliError::usage(format!("{what} is not valid JSON: {e}")))?;
    if let Some(t) = event_type {
        let Value::Object(map) = &mut v else {
            return Err(CliError::usage(format!("{what}: --type needs a JSON object payload")));
        };
        map.insert("type".into(), Value::String(t.to_owned()));
    }
    Ok(v)
}

/// Runs `rheo read`: one partition, or every partition in turn (0, 1,
/// ...) until `--limit` events are read.
pub async fn read(ctx: &Globals, a: ReadArgs) -> CliResult {
    let limit = parse::limit(a.limit)?;
    let rheo = ctx.open_read().await?;
    let partitions = match a.partition {
        Some(p) => p..p + 1,
        None => 0..stream_info(&rheo, &a.stream).await?.partition_count,
    };
    let mut events = Vec::new();
    for p in partitions {
        if events.len() == limit {
            break;
        }
        events.extend(rheo.read(&a.stream, p, a.after, limit - events.len()).await?);
    }
    render(ctx.json, Output::lines(&events)?.table(event_table(&events), "no events"))?;
    Ok(true)
}

/// A stream's description (`not_found` when it does not exist).
pub async fn stream_info(rheo: &Rheo, stream: &str) -> Result<rheo::StreamInfo, CliError> {
    let streams = rheo.list_streams().await?;
    let info = streams.into_iter().find(|s| s.name == stream);
    info.ok_or_else(|| rheo::Error::StreamNotFound { stream: stream.to_owned() }.into())
}

fn event_table(events: &[Event]) -> Table {
    let mut t = table(&["PARTITION", "SEQ", "TIMESTAMP", "KEY", "TYPE", "PAYLOAD"]);
    for e in events {
        t.add_row([
            e.partition().to_string(),
            e.sequence().to_string(),
            e.timestamp().to_string(),
            e.key().unwrap_or("-").to_owned(),
            e.event_type().unwrap_or("-").to_owned(),
            short_json(e.payload(), 80),
        ]);
    }
    t
}

/// Builds the query of `rheo query` (and of `group replay --where`).
pub fn build_query(stream: &str, conditions: &[String]) -> Result<Query, CliError> {
    let mut q = Query::new(stream);
    for c in conditions {
        let (path, op) = parse::condition(c)?;
        q = q.filter(path, op);
    }
    Ok(q)
}

/// Runs `rheo query`.
pub async fn query(ctx: &Globals, a: QueryArgs) -> CliResult {
    let mut q = build_query(&a.stream, &a.conditions)?;
    if let Some(t) = &a.from {
        q = q.from(parse::time(t)?);
    }
    if let Some(t) = &a.to {
        q = q.to(parse::time(t)?);
    }
    if let Some(n) = a.after_sequence {
        q = q.after_sequence(n);
    }
    if let Some(n) = a.until_sequence {
        q = q.until_sequence(n);
    }
    q = q.order_by(match a.order {
        Order::Sequence => OrderBy::Sequence,
        Order::Timestamp => OrderBy::Timestamp,
        Order::Partition => OrderBy::Partition,
    });
    if a.desc {
        q = q.descending();
    }
    q = q.limit(parse::limit(a.limit)?);
    if let Some(c) = &a.cursor {
        q = q.cursor(c.parse()?);
    }
    let page = ctx.open_read().await?.query_page(&q).await?;
    let cursor = page.next_cursor.map(|c| c.to_string());
    let mut doc = json!({"events": page.events, "next_cursor": cursor});
    if a.explain {
        doc["explain"] =
            json!(page.explain.iter().map(|e| json!({"text": e.to_string(), "run": e})).collect::<Vec<_>>());
    }
    let mut out = Output::new(&doc)?.table(event_table(&page.events), "no matching events");
    if let Some(c) = cursor {
        out = out.line(format!("more: --cursor {c}"));
    }
    if a.explain {
        out = out.line("explain:");
        if page.explain.is_empty() {
            out = out.line("  (this backend does not explain its plans)");
        }
        for e in &page.explain {
            out = out.line(format!("  {e}"));
        }
    }
    render(ctx.json, out)?;
    Ok(true)
}

/// The longest a tail waits for a wakeup before polling again.
const TAIL_POLL: Duration = Duration::from_millis(500);
/// How often a tail polls a backend whose appends wake nobody here (a
/// native directory read beside the process that writes it): with the
/// view's refresh, another process's appends show within about 100 ms.
const TAIL_POLL_UNWOKEN: Duration = Duration::from_millis(40);
/// The most events a tail reads from one partition per round.
const TAIL_BATCH: usize = 500;

/// Runs `rheo tail`: polls every followed partition, waiting on
/// `wait_for_events` between rounds that found nothing; stops at `--count`
/// or on Ctrl-C.
pub async fn tail(ctx: &Globals, a: TailArgs) -> CliResult {
    let rheo = ctx.open_read().await?;
    let info = stream_info(&rheo, &a.stream).await?;
    let partitions: Vec<u32> = match a.partition {
        Some(p) if p >= info.partition_count => {
            return Err(CliError::usage(format!(
                "--partition {p}: stream {:?} has {} partition(s)",
                a.stream, info.partition_count
            )));
        }
        Some(p) => vec![p],
        None => (0..info.partition_count).collect(),
    };
    let mut after: Vec<u64> = partitions
        .iter()
        .map(|&p| if a.from_end { info.high_watermarks.get(p as usize).copied().unwrap_or(0) } else { 0 })
        .collect();
    let follow = follow(ctx, &rheo, &a, &partitions, &mut after);
    tokio::select! {
        r = follow => r,
        _ = tokio::signal::ctrl_c() => Ok(true),
    }
}

async fn follow(ctx: &Globals, rheo: &Rheo, a: &TailArgs, partitions: &[u32], after: &mut [u64]) -> CliResult {
    let mut printed = 0u64;
    // One subscription for the whole run, taken before the first read, so
    // that an append between a read and the wait is not missed.
    let mut appends = rheo.subscribe(&a.stream).await?;
    let poll = if appends.wakes() { TAIL_POLL } else { TAIL_POLL_UNWOKEN };
    render(ctx.json, Output::text_only().line(format!("following {} (Ctrl-C to stop)", a.stream)))?;
    loop {
        let mut found = false;
        for (i, &p) in partitions.iter().enumerate() {
            let mut events = rheo.read(&a.stream, p, after[i], TAIL_BATCH).await?;
            if let Some(limit) = a.count {
                events.truncate(usize::try_from(limit - printed).unwrap_or(usize::MAX));
            }
            if let Some(last) = events.last() {
                after[i] = last.sequence();
                found = true;
            }
            for e in &events {
                let text = format!(
                    "{}/{} {} {} {}",
                    e.partition(),
                    e.sequence(),
                    e.timestamp(),
                    e.event_type().unwrap_or("-"),
                    e.payload()
                );
                render(ctx.json, Output::lines(std::slice::from_ref(e))?.line(text))?;
            }
            printed += events.len() as u64;
            if a.count.is_some_and(|c| printed >= c) {
                return Ok(true);
            }
        }
        if !found {
            appends.wait(poll).await;
        }
    }
}
