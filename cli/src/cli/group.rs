//! `rheo group ...`, `rheo dlq list`, `rheo fetch` and `rheo ack`.

use clap::{Args, Subcommand};
use rheo::{
    DeadLetterOptions, FetchOptions, GroupOptions, GroupSummary, Lag, LeaseRef, ReplayOptions, ResetOptions,
    RetryOutcome, StartPosition,
};
use serde_json::{Value, json};

use comfy_table::Table;

use super::output::{Output, render, short_json, table, to_json};
use super::{CliError, CliResult, ErrorKind, Globals, events, parse};

/// `rheo group ...`
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Creates a consumer group.
    Create(CreateArgs),
    /// Lists the groups of a stream.
    List {
        /// The stream.
        stream: String,
    },
    /// Shows a group's settings, lag, in-flight, retrying and dead-lettered counts.
    Info(GroupRef),
    /// Shows a group's lag per partition.
    Lag(GroupRef),
    /// Moves a group's position (needs --confirm): pending deliveries are dropped.
    Reset(ResetArgs),
    /// Reopens already settled deliveries for redelivery.
    Replay(ReplayArgs),
    /// Dead-letters one position without reading its event: the way past a
    /// damaged record (see `rheo verify` and the operations guide).
    Skip(SkipArgs),
}

/// Arguments of `rheo group skip`.
#[derive(Debug, Args)]
pub struct SkipArgs {
    #[command(flatten)]
    at: GroupRef,
    /// The partition of the position.
    #[arg(long)]
    partition: u32,
    /// The sequence of the position (the first one, with `--through`).
    #[arg(long)]
    sequence: u64,
    /// Skips every position from `--sequence` through this one, in order,
    /// one call each (at most 100,000): the way past a damaged stretch.
    /// Positions already settled are counted, not skipped. Stops at the
    /// first other failure, saying what it did.
    #[arg(long)]
    through: Option<u64>,
    /// Why it is skipped (kept in the dead letter as `skipped: <reason>`).
    #[arg(long)]
    reason: String,
}

/// The positions one `rheo group skip --through` covers at most.
const SKIP_RANGE_MAX: u64 = 100_000;

/// A stream and one of its groups.
#[derive(Debug, Args)]
pub struct GroupRef {
    /// The stream.
    stream: String,
    /// The group.
    group: String,
}

/// Arguments of `rheo group create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    at: GroupRef,
    /// Claims before a delivery is dead-lettered.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Orders deliveries by event key: one event of a key in flight at a
    /// time, the next once the one before it is settled (backends that
    /// support it: see `Capabilities::ordered_by_key`).
    #[arg(long)]
    ordered_by_key: bool,
    #[command(flatten)]
    start: StartArgs,
}

/// Where a group starts (`create`) or restarts (`reset`); default: the beginning.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// (Re)starts after this sequence in every partition.
    #[arg(long, conflicts_with_all = ["start_at", "latest"])]
    start_after: Option<u64>,
    /// (Re)starts at the first event at or after this time (RFC 3339 or ms).
    #[arg(long, conflicts_with = "latest")]
    start_at: Option<String>,
    /// (Re)starts at the end: only events appended from now on.
    #[arg(long)]
    latest: bool,
}

impl StartArgs {
    fn position(&self) -> Result<StartPosition, CliError> {
        Ok(match (self.start_after, self.start_at.as_deref(), self.latest) {
            (Some(n), _, _) => StartPosition::After(n),
            (_, Some(t), _) => StartPosition::At(parse::time(t)?),
            (_, _, true) => StartPosition::Latest,
            _ => StartPosition::Beginning,
        })
    }
}

/// Arguments of `rheo group reset`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    #[command(flatten)]
    at: GroupRef,
    /// Confirms the reset (it drops the group's pending deliveries).
    #[arg(long)]
    confirm: bool,
    #[command(flatten)]
    start: StartArgs,
}

/// Arguments of `rheo group replay`: exactly one of the three modes.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["from_sequence", "from", "conditions"])))]
pub struct ReplayArgs {
    #[command(flatten)]
    at: GroupRef,
    /// Replays the deliveries with sequence above N.
    #[arg(long, value_name = "N")]
    from_sequence: Option<u64>,
    /// Replays from the first event at or after this time (RFC 3339 or ms).
    #[arg(long, value_name = "TIME")]
    from: Option<String>,
    /// Replays exactly the events matching these conditions (as `query --where`).
    #[arg(long = "where", value_name = "CONDITION")]
    conditions: Vec<String>,
}

/// `rheo dlq ...`
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Lists a group's dead letters.
    List(DlqListArgs),
}

/// Arguments of `rheo dlq list`.
#[derive(Debug, Args)]
pub struct DlqListArgs {
    #[command(flatten)]
    at: GroupRef,
    /// Lists those after the dead letter of this event id.
    #[arg(long, value_name = "EVENT_ID", conflicts_with = "after_position")]
    after: Option<String>,
    /// Lists those after the dead letter at this position (pages past
    /// damaged entries, which have no event id).
    #[arg(long, value_name = "PARTITION:SEQ")]
    after_position: Option<String>,
    /// The most to list.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

/// Arguments of `rheo fetch`.
#[derive(Debug, Args)]
pub struct FetchArgs {
    #[command(flatten)]
    at: GroupRef,
    /// The most deliveries to claim.
    #[arg(long, default_value_t = 10)]
    limit: usize,
    /// The lease duration in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    lease: u64,
}

/// Arguments of `rheo ack`.
#[derive(Debug, Args)]
pub struct AckArgs {
    /// The stream (every reference must name it).
    stream: String,
    /// The group (every reference must name it).
    group: String,
    /// Lease references as printed by `rheo fetch` (`lr1:...`).
    #[arg(required = true, value_name = "LEASE_REF")]
    leases: Vec<String>,
}

/// Arguments of `rheo retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// Lease references as printed by `rheo fetch` (`lr1:...`).
    #[arg(required = true, value_name = "LEASE_REF")]
    leases: Vec<String>,
    /// Why (kept as the dead letter's reason if it runs out of attempts).
    #[arg(long, default_value = "retried with rheo retry")]
    reason: String,
    /// Claimable again after this many seconds (0 to 86400); default: the
    /// group's backoff.
    #[arg(long, value_name = "SECS")]
    delay: Option<u64>,
}

/// Arguments of `rheo reject`.
#[derive(Debug, Args)]
pub struct RejectArgs {
    /// Lease references as printed by `rheo fetch` (`lr1:...`).
    #[arg(required = true, value_name = "LEASE_REF")]
    leases: Vec<String>,
    /// Why (the dead letter's reason).
    #[arg(long, default_value = "rejected with rheo reject")]
    reason: String,
}

/// Arguments of `rheo renew`.
#[derive(Debug, Args)]
pub struct RenewArgs {
    /// Lease references as printed by `rheo fetch` (`lr1:...`).
    #[arg(required = true, value_name = "LEASE_REF")]
    leases: Vec<String>,
    /// The new lease duration from now, in seconds (1 to 86400).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    lease: u64,
}

/// Runs `rheo group ...`.
pub async fn run_group(ctx: &Globals, command: GroupCommand) -> CliResult {
    let out = match command {
        GroupCommand::Create(a) => {
            let mut opts = GroupOptions::new().start(a.start.position()?);
            if let Some(n) = a.max_attempts {
                opts = opts.max_attempts(parse::in_range("--max-attempts", n, 1, rheo::MAX_ATTEMPTS, "")?);
            }
            if a.ordered_by_key {
                opts = opts.ordered_by_key();
            }
            let g = ctx.open_write().await?.create_group(&a.at.stream, &a.at.group, opts).await?;
            let order = if g.ordered_by_key { ", ordered by key" } else { "" };
            let text = format!("created group {} on {} (max {} attempts{order})", g.name, a.at.stream, g.max_attempts);
            Output::new(&g)?.line(text)
        }
        GroupCommand::List { stream } => {
            let groups = ctx.open_read().await?.list_groups(&stream).await?;
            Output::new(&groups)?.table(group_table(&groups), "no groups")
        }
        GroupCommand::Info(g) => {
            let info = ctx.open_read().await?.group_info(&g.stream, &g.group).await?;
            let s = &info.summary;
            Output::new(&info)?
                .line(format!("group        {} on {}", s.name, g.stream))
                .line(format!("max attempts {}", s.max_attempts))
                .line(format!("order        {}", if s.ordered_by_key { "by key" } else { "by partition" }))
                .line(format!("created      {}", s.created_at))
                .line(format!("lag          {}", info.lag.total))
                .line(format!("in flight    {}", info.inflight))
                .line(format!("retrying     {}", info.retry_waiting))
                .line(match info.next_due {
                    Some(t) => format!("scheduled    {} (next due {t})", info.scheduled),
                    None => format!("scheduled    {}", info.scheduled),
                })
                .line(format!("dead letters {}", info.dead_letters))
                .line(format!("skipped by retention {}", info.retention_skipped))
        }
        GroupCommand::Lag(g) => {
            let lag = ctx.open_read().await?.lag(&g.stream, &g.group).await?;
            Output::new(&lag)?.table(lag_table(&lag), "no partitions").line(format!("total lag {}", lag.total))
        }
        GroupCommand::Reset(a) => {
            if !a.confirm {
                return Err(CliError::usage(format!(
                    "resetting group {:?} drops its pending deliveries: add --confirm",
                    a.at.group
                )));
            }
            let opts = ResetOptions::confirmed().start(a.start.position()?);
            ctx.open_write().await?.reset_group(&a.at.stream, &a.at.group, opts).await?;
            Output::new(&json!({"stream": a.at.stream, "group": a.at.group, "reset": true}))?
                .line(format!("reset group {} on {}", a.at.group, a.at.stream))
        }
        GroupCommand::Replay(a) => {
            let opts = if let Some(n) = a.from_sequence {
                ReplayOptions::from_sequence(n)
            } else if let Some(t) = &a.from {
                ReplayOptions::from_time(parse::time(t)?)
            } else {
                ReplayOptions::query(events::build_query(&a.at.stream, &a.conditions)?)
            };
            let n = ctx.open_write().await?.replay(&a.at.stream, &a.at.group, opts).await?;
            Output::new(&json!({"stream": a.at.stream, "group": a.at.group, "replayed": n}))?
                .line(format!("reopened {n} deliveries of group {} on {}", a.at.group, a.at.stream))
        }
        GroupCommand::Skip(a) if a.through.is_some() => skip_range(ctx, &a).await?,
        GroupCommand::Skip(a) => {
            let rheo = ctx.open_write().await?;
            let skipped = rheo.skip(&a.at.stream, &a.at.group, a.partition, a.sequence, &a.reason).await?;
            let doc = json!({
                "stream": a.at.stream, "group": a.at.group, "partition": a.partition,
                "sequence": a.sequence, "skipped": skipped,
            });
            Output::new(&doc)?.line(if skipped {
                format!(
                    "dead-lettered partition {} sequence {} of group {} on {} (skipped: {})",
                    a.partition, a.sequence, a.at.group, a.at.stream, a.reason
                )
            } else {
                format!(
                    "partition {} sequence {} already is a dead letter of group {} on {}",
                    a.partition, a.sequence, a.at.group, a.at.stream
                )
            })
        }
    };
    render(ctx.json, out)?;
    Ok(true)
}

/// `rheo group skip --through`: one skip per position, in order. The
/// stretch is checked against the group's lag first (the partition is
/// consumed, the stretch ends at or before the high watermark), so that a
/// position the group already settled (acknowledged, or dead) is counted as
/// such instead of stopping the stretch.
async fn skip_range(ctx: &Globals, a: &SkipArgs) -> Result<Output, CliError> {
    let (first, last) = (a.sequence, a.through.unwrap_or(a.sequence));
    if first == 0 || last < first || last - first >= SKIP_RANGE_MAX {
        return Err(CliError::usage(format!(
            "--sequence must be at least 1 and --through from it to {} positions after it (got {first} to {last})",
            SKIP_RANGE_MAX - 1
        )));
    }
    let rheo = ctx.open_write().await?;
    let (stream, group, p) = (&a.at.stream, &a.at.group, a.partition);
    let lag = rheo.lag_of(stream, group, &[p]).await?;
    let Some(part) = lag.partitions.iter().find(|l| l.partition == p) else {
        return Err(CliError::usage(format!("group {group} on {stream} does not consume partition {p}")));
    };
    if last > part.high_watermark {
        return Err(CliError::usage(format!(
            "--through {last} is past partition {p}'s high watermark ({}); nothing was skipped",
            part.high_watermark
        )));
    }
    let (mut skipped, mut settled) = (0u64, 0u64);
    let start = first.max(part.frontier.saturating_add(1));
    settled += start - first;
    for seq in start..=last {
        match rheo.skip(stream, group, p, seq, &a.reason).await {
            Ok(true) => skipped += 1,
            Ok(false) => settled += 1,
            // In range, of a consumed partition: already acknowledged.
            Err(rheo::Error::InvalidArgument { .. }) => settled += 1,
            Err(e) => {
                let done = if seq == first {
                    "nothing was skipped".to_owned()
                } else {
                    format!("sequences {first} to {} are done ({skipped} skipped, {settled} already settled)", seq - 1)
                };
                return Err(CliError::of(
                    ErrorKind::of(&e),
                    format!("partition {p} sequence {seq} of group {group} on {stream}: {e}; {done}"),
                ));
            }
        }
    }
    let doc = json!({
        "stream": stream, "group": group, "partition": p,
        "from_sequence": first, "through_sequence": last, "skipped": skipped, "already": settled,
    });
    Ok(Output::new(&doc)?.line(format!(
        "dead-lettered {skipped} positions of partition {p} (sequences {first} to {last}; {settled} were already settled) of group {group} on {stream} (skipped: {})",
        a.reason
    )))
}

fn group_table(groups: &[GroupSummary]) -> Table {
    let mut t = table(&["NAME", "MAX_ATTEMPTS", "PARTITIONS", "CREATED"]);
    for g in groups {
        let parts = g
            .partitions
            .as_ref()
            .map_or_else(|| "all".to_owned(), |p| p.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
        t.add_row([g.name.clone(), g.max_attempts.to_string(), parts, g.created_at.to_string()]);
    }
    t
}

fn lag_table(lag: &Lag) -> Table {
    let mut t = table(&["PARTITION", "HIGH_WATERMARK", "FRONTIER", "LAG"]);
    for p in &lag.partitions {
        t.add_row([p.partition.to_string(), p.high_watermark.to_string(), p.frontier.to_string(), p.lag.to_string()]);
    }
    t
}

/// Runs `rheo dlq list`.
pub async fn run_dlq(ctx: &Globals, command: DlqCommand) -> CliResult {
    let DlqCommand::List(a) = command;
    let mut opts = DeadLetterOptions::new().limit(parse::limit(a.limit)?);
    if let Some(id) = a.after {
        opts = opts.after(id);
    }
    if let Some(at) = &a.after_position {
        let bad = || CliError::usage(format!("--after-position {at:?}: expected PARTITION:SEQ, e.g. 0:42"));
        let (p, seq) = at.split_once(':').ok_or_else(bad)?;
        opts = opts.after_position(p.parse().map_err(|_| bad())?, seq.parse().map_err(|_| bad())?);
    }
    let dead = ctx.open_read().await?.dead_letters(&a.at.stream, &a.at.group, opts).await?;
    let mut t = table(&["PARTITION", "SEQ", "EVENT_ID", "ATTEMPTS", "AT", "REASON", "PAYLOAD"]);
    for d in &dead {
        let (id, payload) = match (&d.event, &d.damage) {
            (Some(e), _) => (e.id().to_owned(), short_json(e.payload(), 60)),
            (None, Some(damage)) => (
                "-".to_owned(),
                format!("DAMAGED: {} at offset {} of {}", damage.reason, damage.offset, damage.file.display()),
            ),
            (None, None) if d.dropped => ("-".to_owned(), "DROPPED: retention deleted the event".to_owned()),
            (None, None) => ("-".to_owned(), "-".to_owned()),
        };
        t.add_row([
            d.partition.to_string(),
            d.sequence.to_string(),
            id,
            d.attempts.to_string(),
            d.dead_lettered_at.to_string(),
            d.reason.clone(),
            payload,
        ]);
    }
    render(ctx.json, Output::new(&dead)?.table(t, "no dead letters"))?;
    Ok(true)
}

/// Runs `rheo fetch`: each lease with its reference (`ref`), which `rheo
/// ack`, `retry`, `reject` and `renew` take.
pub async fn fetch(ctx: &Globals, a: FetchArgs) -> CliResult {
    let opts = FetchOptions::new().limit(parse::limit(a.limit)?).lease(parse::seconds("--lease", a.lease, 1)?);
    let report = ctx.open_write().await?.fetch_report(&a.at.stream, &a.at.group, opts).await?;
    // Damage goes to stderr, so that stdout stays the leases alone.
    for d in &report.damaged {
        if ctx.json {
            eprintln!("{}", json!({"warning": "not delivered: its record can't be read", "damage": d}));
        } else {
            eprintln!(
                "warning: {d}; not delivered (skip it with `rheo group skip {} {} --partition {} --sequence {} --reason ...`)",
                a.at.stream, a.at.group, d.partition, d.sequence
            );
        }
    }
    let leases = report.leases;
    let mut docs = Vec::with_capacity(leases.len());
    let mut t = table(&["PARTITION", "SEQ", "ATTEMPT", "EXPIRES", "PAYLOAD", "REF"]);
    for l in &leases {
        let mut v = to_json(l)?;
        if let Value::Object(m) = &mut v {
            m.insert("ref".into(), Value::String(l.to_ref().to_string()));
        }
        docs.push(v);
        t.add_row([
            l.partition().to_string(),
            l.sequence().to_string(),
            l.attempt.to_string(),
            l.expires_at.to_string(),
            short_json(l.event.payload(), 40),
            l.to_ref().to_string(),
        ]);
    }
    render(ctx.json, Output::new(&docs)?.table(t, "nothing to deliver"))?;
    Ok(true)
}

/// Lease references as printed by `rheo fetch`, each checked (a usage
/// error names the bad one).
fn lease_refs(texts: &[String]) -> Result<Vec<LeaseRef>, CliError> {
    texts.iter().map(|t| t.parse::<LeaseRef>().map_err(CliError::from)).collect()
}

/// Runs `rheo ack`: every reference is tried, in one call.
pub async fn ack(ctx: &Globals, a: AckArgs) -> CliResult {
    let refs = lease_refs(&a.leases)?;
    for (text, r) in a.leases.iter().zip(&refs) {
        if *r.stream != *a.stream || *r.group != *a.group {
            return Err(CliError::usage(format!(
                "lease {text:?} belongs to group {:?} of stream {:?}, not {:?} of {:?}",
                r.group, r.stream, a.group, a.stream
            )));
        }
    }
    let results = ctx.open_write().await?.ack_many(refs.iter()).await?;
    let done = results.into_iter().map(|r| r.map(|()| (json!({}), String::new())));
    settled(ctx, "ack", "acked", &a.leases, done)
}

/// Runs `rheo retry`: each lease is given back, claimable again after
/// `--delay` (or the group's backoff), or dead-lettered when it has used
/// all its attempts.
pub async fn retry(ctx: &Globals, a: RetryArgs) -> CliResult {
    let refs = lease_refs(&a.leases)?;
    let delay = a.delay.map(|d| parse::seconds("--delay", d, 0)).transpose()?;
    let rheo = ctx.open_write().await?;
    let mut results = Vec::with_capacity(refs.len());
    for r in refs {
        let outcome = match delay {
            Some(d) => rheo.retry_after(r, &a.reason, d).await,
            None => rheo.retry(r, &a.reason).await,
        };
        results.push(outcome.map(|o| match o {
            RetryOutcome::Scheduled { available_at } => (
                json!({"outcome": "scheduled", "available_at": available_at}),
                format!(": claimable again at {available_at}"),
            ),
            RetryOutcome::DeadLettered => {
                (json!({"outcome": "dead_lettered"}), ": out of attempts, dead-lettered".to_owned())
            }
        }));
    }
    settled(ctx, "retry", "retried", &a.leases, results)
}

/// Runs `rheo reject`: each lease's delivery is dead-lettered.
pub async fn reject(ctx: &Globals, a: RejectArgs) -> CliResult {
    let refs = lease_refs(&a.leases)?;
    let rheo = ctx.open_write().await?;
    let mut results = Vec::with_capacity(refs.len());
    for r in refs {
        let done = rheo.reject(r, &a.reason).await;
        results.push(done.map(|()| (json!({}), format!(" (dead-lettered: {})", a.reason))));
    }
    settled(ctx, "reject", "rejected", &a.leases, results)
}

/// Runs `rheo renew`: each lease is extended to `--lease` seconds from now.
pub async fn renew(ctx: &Globals, a: RenewArgs) -> CliResult {
    let refs = lease_refs(&a.leases)?;
    let lease = parse::seconds("--lease", a.lease, 1)?;
    let rheo = ctx.open_write().await?;
    let mut results = Vec::with_capacity(refs.len());
    for r in refs {
        let expiry = rheo.renew(r, lease).await;
        results.push(expiry.map(|t| (json!({"expires_at": t}), format!(" until {t}"))));
    }
    settled(ctx, "renew", "renewed", &a.leases, results)
}

/// Prints what became of each lease of `rheo ack|retry|reject|renew`: per
/// lease a line (`<done> <ref><detail>`) and a JSON document
/// `{"ref", "ok", "error", ...fields}`; then, when any failed, the error
/// (its kind the first failure's) naming each failed lease.
fn settled(
    ctx: &Globals,
    verb: &str,
    done: &str,
    texts: &[String],
    results: impl IntoIterator<Item = Result<(Value, String), rheo::Error>>,
) -> CliResult {
    let mut docs = Vec::with_capacity(texts.len());
    let mut out_lines = Vec::new();
    let mut failed: Vec<(String, ErrorKind)> = Vec::new();
    for (text, r) in texts.iter().zip(results) {
        let mut doc = json!({"ref": text, "ok": r.is_ok(), "error": r.as_ref().err().map(ToString::to_string)});
        match r {
            Ok((Value::Object(fields), detail)) => {
                if let Value::Object(m) = &mut doc {
                    m.extend(fields);
                }
                out_lines.push(format!("{done} {text}{detail}"));
            }
            Ok((_, detail)) => out_lines.push(format!("{done} {text}{detail}")),
            Err(e) => failed.push((format!("{verb} {text}: {e}"), ErrorKind::of(&e))),
        }
        docs.push(doc);
    }
    let out = out_lines.into_iter().fold(Output::new(&docs)?, Output::line);
    render(ctx.json, out)?;
    match failed.first() {
        None => Ok(true),
        Some((message, kind)) if failed.len() == 1 => Err(CliError::of(*kind, message.clone())),
        Some((_, kind)) => {
            let all: Vec<String> = failed.iter().map(|(m, _)| m.clone()).collect();
            Err(CliError::of(*kind, format!("{} of {} leases failed: {}", failed.len(), texts.len(), all.join("; "))))
        }
    }
}
