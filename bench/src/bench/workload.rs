//! The workloads, and the targets they run on: a `Rheo` handle on any
//! backend, or a peer measured the same way (bare Redis Streams, with the
//! `peers` feature).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::ProgressBar;
use rheo::{AppendOptions, FetchOptions, GroupOptions, MAX_BATCH_EVENTS, Query, Rheo, StreamOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::probe::micros;
use super::stats::Latencies;

/// The latency samples of one process's tasks: one histogram behind a lock
/// (a histogram per task would be ~190 KB each, 190 MB for 1,024 producers,
/// and its allocation would be measured with the backend).
type Samples = std::sync::Mutex<Latencies>;

/// Records samples into the shared histogram.
fn record(samples: &Samples, micros: impl IntoIterator<Item = u64>) {
    // A poisoned lock means a task panicked; its samples still count.
    let mut h = samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for m in micros {
        h.record(m);
    }
}
use rheo_cli::error::CliError;

/// What a case measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Producers each append one event per call.
    Append,
    /// Producers each append `--batch` events per call, atomically.
    AppendBatch,
    /// Consumers drain a prefilled stream: fetch `--batch`, then ack them all.
    Consume,
    /// Producers (batches) and consumers at once; latency from append to ack.
    EndToEnd,
    /// Queriers ask for the events of one payload value, `--batch` at most.
    Query,
    /// Managed consumers (`Rheo::consumer`) drain a prefilled stream in
    /// per-key order, each handler sleeping `--handler-ms`: with `--keyed`
    /// over a keyed group, `--concurrency` handlers per consumer across
    /// keys; without, the way an unkeyed group keeps a key's order: each
    /// consumer owns its share of the partitions and handles one event at
    /// a time.
    Handle,
    /// The raw fsync rate of the disk, nothing else.
    Fsync,
}

impl Workload {
    /// Every workload that runs on a backend, in report order.
    pub const CASES: [Workload; 5] =
        [Workload::Append, Workload::AppendBatch, Workload::Consume, Workload::EndToEnd, Workload::Query];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Append => "append",
            Workload::AppendBatch => "append-batch",
            Workload::Consume => "consume",
            Workload::EndToEnd => "end-to-end",
            Workload::Query => "query",
            Workload::Handle => "handle",
            Workload::Fsync => "fsync",
        }
    }

    /// What one latency sample of it is.
    pub fn latency_of(self) -> &'static str {
        match self {
            Workload::Append => "one append call",
            Workload::AppendBatch => "one append_batch call",
            Workload::Consume => "one fetch + ack_many cycle",
            Workload::EndToEnd => "append call start to ack, per event",
            Workload::Query => "one query call",
            Workload::Handle => "one handler call, its sleep included",
            Workload::Fsync => "one write + fdatasync",
        }
    }

    /// Whether producers run in it (the `--producers` values apply).
    pub fn has_producers(self) -> bool {
        matches!(self, Workload::Append | Workload::AppendBatch | Workload::EndToEnd)
    }

    /// Whether consumers run in it (the `--consumers` values apply;
    /// queriers count as consumers).
    pub fn has_consumers(self) -> bool {
        matches!(self, Workload::Consume | Workload::EndToEnd | Workload::Query | Workload::Handle)
    }

    /// Whether its events are appended before the clock starts.
    pub fn prefilled(self) -> bool {
        matches!(self, Workload::Consume | Workload::Query | Workload::Handle)
    }
}

/// What one process runs of a case: the timed part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    /// The workload.
    pub workload: Workload,
    /// Producer tasks in this process.
    pub producers: usize,
    /// Consumer (or querier) tasks in this process.
    pub consumers: usize,
    /// Events per call (append-batch, end-to-end producers), the fetch
    /// limit, the query limit.
    pub batch: usize,
    /// Events this process's producers append.
    pub events: u64,
    /// Events of the whole case (every process).
    pub total_events: u64,
    /// Processes running the case at once.
    pub processes: usize,
    /// Payload size, about.
    pub payload_bytes: usize,
    /// The first event number of this process (payloads' `n`).
    pub first: u64,
    /// Every appended event gets its own id (`AppendOptions::id`, as a
    /// producer that retries safely gives), so the dedupe check runs.
    #[serde(default)]
    pub ids: bool,
    /// Handlers per managed consumer (`handle`).
    #[serde(default = "one_handler")]
    pub concurrency: usize,
    /// Milliseconds each handler sleeps (`handle`).
    #[serde(default)]
    pub handler_ms: u64,
    /// Whether the group is keyed (`handle`: else each consumer owns its
    /// share of the partitions).
    #[serde(default)]
    pub keyed: bool,
    /// The stream's partitions (`handle` shares them out).
    #[serde(default)]
    pub partitions: u32,
}

fn one_handler() -> usize {
    1
}

/// What one process measured.
#[derive(Debug, Clone)]
pub struct PhaseOut {
    /// Events appended, settled or returned.
    pub events: u64,
    /// Calls (or cycles) made.
    pub ops: u64,
    /// Latency samples.
    pub latencies: Latencies,
}

/// One event to append: its payload and routing key.
#[derive(Debug, Clone)]
pub struct Item {
    /// The JSON payload.
    pub payload: Value,
    /// The routing key.
    pub key: String,
    /// Its id, when the case gives ids.
    pub id: Option<String>,
}

impl Item {
    /// Its append options.
    pub(super) fn options(self) -> (Value, AppendOptions) {
        let opts = AppendOptions::new().key(self.key);
        (self.payload, if let Some(id) = self.id { opts.id(id) } else { opts })
    }
}

/// The event numbered `n` of a phase (with its id when the phase gives ids).
fn phase_item(n: u64, phase: &Phase, stamp: u64) -> Item {
    let mut it = item(n, phase.payload_bytes, stamp);
    if phase.ids {
        it.id = Some(format!("bench-{n}"));
    }
    it
}

/// Distinct values of a payload's `k` field (what `query` asks for).
pub const QUERY_VALUES: u64 = 100;
/// Distinct routing keys.
const KEYS: u64 = 1024;
/// How long consumers wait with nothing to do before giving up.
const STALL: Duration = Duration::from_secs(120);

/// Microseconds since the Unix epoch (comparable across processes).
pub fn wall_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, micros)
}

/// The event numbered `n`: about `bytes` of JSON, stamped with `stamp`.
pub fn item(n: u64, bytes: usize, stamp: u64) -> Item {
    // `{"type":"bench","n":..,"k":..,"t":..,"pad":""}` is ~70 bytes.
    let pad = "x".repeat(bytes.saturating_sub(70));
    Item {
        payload: json!({"type": "bench", "n": n, "k": n % QUERY_VALUES, "t": stamp, "pad": pad}),
        key: format!("k{}", n % KEYS),
        id: None,
    }
}

/// What a consume call settled.
#[derive(Debug, Default)]
pub struct Consumed {
    /// Events acknowledged.
    pub count: usize,
    /// Their `t` stamps, when asked for.
    pub stamps: Vec<u64>,
}

/// How far a group is: events appended to the stream, events not yet
/// settled by the group.
#[derive(Debug, Clone, Copy)]
pub struct Backlog {
    /// Events in the stream.
    pub appended: u64,
    /// Events the group has not settled.
    pub unsettled: u64,
}

/// A handle on a Rheo stream and its bench group.
#[derive(Clone, Debug)]
pub struct RheoTarget {
    /// The handle.
    pub rheo: Rheo,
    /// The stream a task works on now.
    pub stream: Arc<str>,
    /// The group.
    pub group: Arc<str>,
    /// Every stream of the case (`--streams`): the one name, or `NAME-i`.
    pub streams: Arc<[Arc<str>]>,
}

impl RheoTarget {
    /// The case's `count` streams named after `stream`, its group `bench`.
    pub fn new(rheo: Rheo, stream: &str, count: u32) -> RheoTarget {
        let streams = RheoTarget::stream_names(stream, count);
        RheoTarget { rheo, stream: streams[0].clone(), group: "bench".into(), streams }
    }

    /// The case's `count` stream names: `stream` alone, or `stream-i`.
    pub fn stream_names(stream: &str, count: u32) -> Arc<[Arc<str>]> {
        if count <= 1 {
            Arc::from([Arc::from(stream)])
        } else {
            (0..count).map(|i| Arc::from(format!("{stream}-{i}"))).collect()
        }
    }
}

/// What a case runs on.
#[derive(Clone, Debug)]
pub enum Target {
    /// A backend of this crate.
    Rheo(RheoTarget),
    /// The storage engine without the facade (`engine:DIR`).
    Engine(super::engine::EngineTarget),
    /// Bare Redis Streams.
    #[cfg(feature = "peers")]
    Redis(super::peer::RedisTarget),
}

impl Target {
    /// How many streams the case spreads over.
    pub fn stream_count(&self) -> usize {
        match self {
            Target::Rheo(t) => t.streams.len(),
            Target::Engine(t) => t.streams.len(),
            #[cfg(feature = "peers")]
            Target::Redis(_) => 1,
        }
    }

    /// The same target on the case's `i`-th stream (modulo their count).
    pub fn on_stream(&self, i: usize) -> Target {
        match self {
            Target::Rheo(t) => {
                let mut t = t.clone();
                t.stream = t.streams[i % t.streams.len()].clone();
                Target::Rheo(t)
            }
            Target::Engine(t) => {
                let mut t = t.clone();
                t.stream = t.streams[i % t.streams.len()].clone();
                Target::Engine(t)
            }
            #[cfg(feature = "peers")]
            Target::Redis(_) => self.clone(),
        }
    }

    /// Creates the case's streams (and groups, keyed when asked) on the
    /// target.
    pub async fn setup(&self, partitions: u32, retention: rheo::Retention, keyed: bool) -> Result<(), CliError> {
        if keyed && !self.keyed_groups() {
            return Err(CliError::new("this target has no keyed groups (--keyed)"));
        }
        match self {
            Target::Rheo(t) => {
                let group = if keyed { GroupOptions::new().ordered_by_key() } else { GroupOptions::new() };
                for s in t.streams.iter() {
                    let opts = StreamOptions::new().partitions(partitions).retention(retention);
                    t.rheo.create_stream(s, opts).await?;
                    t.rheo.create_group(s, &t.group, group.clone()).await?;
                }
                Ok(())
            }
            Target::Engine(t) => t.setup(partitions),
            #[cfg(feature = "peers")]
            Target::Redis(t) => t.setup().await,
        }
    }

    /// Whether it can run `w`.
    pub fn supports(&self, w: Workload) -> bool {
        match self {
            Target::Rheo(_) => w != Workload::Fsync,
            Target::Engine(_) => matches!(w, Workload::Append | Workload::AppendBatch),
            #[cfg(feature = "peers")]
            Target::Redis(_) => !matches!(w, Workload::Query | Workload::Fsync | Workload::Handle),
        }
    }

    /// Whether it has keyed groups (`--keyed`).
    pub fn keyed_groups(&self) -> bool {
        match self {
            Target::Rheo(t) => t.rheo.capabilities().ordered_by_key,
            _ => false,
        }
    }

    /// Appends one event.
    pub async fn append(&self, item: Item) -> Result<(), CliError> {
        match self {
            Target::Rheo(t) => {
                let (payload, opts) = item.options();
                t.rheo.append(&t.stream, &payload, opts).await?;
                Ok(())
            }
            Target::Engine(t) => t.append(vec![item]).await,
            #[cfg(feature = "peers")]
            Target::Redis(t) => t.append(item).await,
        }
    }

    /// Appends events atomically.
    pub async fn append_batch(&self, items: Vec<Item>) -> Result<(), CliError> {
        match self {
            Target::Rheo(t) => {
                let items = items.into_iter().map(Item::options);
                t.rheo.append_batch_with(&t.stream, items).await?;
                Ok(())
            }
            Target::Engine(t) => t.append(items).await,
            #[cfg(feature = "peers")]
            Target::Redis(t) => t.append_batch(items).await,
        }
    }

    /// Claims up to `limit` events and acknowledges them all.
    pub async fn consume(&self, limit: usize, stamps: bool) -> Result<Consumed, CliError> {
        match self {
            Target::Rheo(t) => {
                let leases = t.rheo.fetch(&t.stream, &t.group, FetchOptions::new().limit(limit)).await?;
                let mut out = Consumed { count: 0, stamps: Vec::new() };
                let acks = t.rheo.ack_many(leases.iter()).await?;
                if acks.len() != leases.len() {
                    return Err(CliError::new(format!("ack_many answered {} of {} leases", acks.len(), leases.len())));
                }
                for (lease, r) in leases.iter().zip(acks) {
                    match r {
                        Ok(()) => {}
                        // The lease ran out before the ack (an overloaded
                        // server): the event is delivered again and counted
                        // when that delivery is acked, as a consumer would.
                        Err(rheo::Error::StaleLease { .. }) => continue,
                        Err(e) => {
                            return Err(CliError::new(format!(
                                "ack of {}/{} #{}: {e}",
                                lease.stream(),
                                lease.partition(),
                                lease.sequence()
                            )));
                        }
                    }
                    out.count += 1;
                    if let Some(t) = lease.event.field("t").and_then(|v| v.as_u64()).filter(|_| stamps) {
                        out.stamps.push(t);
                    }
                }
                Ok(out)
            }
            Target::Engine(_) => Err(CliError::new("the engine level has no consumer groups (the facade's)")),
            #[cfg(feature = "peers")]
            Target::Redis(t) => t.consume(limit, stamps).await,
        }
    }

    /// Queries the events whose `k` is `k`, at most `limit`; returns how many.
    pub async fn query(&self, k: u64, limit: usize) -> Result<usize, CliError> {
        match self {
            Target::Rheo(t) => Ok(t.rheo.query(&Query::new(&*t.stream).eq("k", k).limit(limit)).await?.len()),
            Target::Engine(_) => Err(CliError::new("the engine level has no query here (the facade's)")),
            #[cfg(feature = "peers")]
            Target::Redis(_) => Err(CliError::new("bare Redis Streams has no query")),
        }
    }

    /// How far the group is.
    pub async fn backlog(&self) -> Result<Backlog, CliError> {
        match self {
            Target::Rheo(t) => {
                let mut b = Backlog { appended: 0, unsettled: 0 };
                for s in t.streams.iter() {
                    let lag = t.rheo.lag(s, &t.group).await?;
                    b.appended += lag.partitions.iter().map(|p| p.high_watermark).sum::<u64>();
                    b.unsettled += lag.total;
                }
                Ok(b)
            }
            Target::Engine(t) => t.backlog(),
            #[cfg(feature = "peers")]
            Target::Redis(t) => t.backlog().await,
        }
    }
}

/// Appends `events` before the clock starts, in atomic batches of up to
/// 1,000 (numbered from 1, payloads as the case's).
pub async fn prefill(target: &Target, events: u64, payload_bytes: usize, bar: &ProgressBar) -> Result<(), CliError> {
    let chunk = 1000.min(MAX_BATCH_EVENTS) as u64;
    let streams = target.stream_count();
    let mut n = 1;
    for i in 0..streams {
        let on = target.on_stream(i);
        let end_of_stream = n + share(events, streams, i);
        while n < end_of_stream {
            let end = (n + chunk).min(end_of_stream);
            on.append_batch((n..end).map(|i| item(i, payload_bytes, 0)).collect()).await?;
            bar.inc(end - n);
            n = end;
        }
    }
    Ok(())
}

/// Appends `events` scheduled a day ahead (spread over the case's streams
/// as `prefill` spreads its events) and has the group set them all aside
/// before the case runs, so a `consume` case measures due events behind
/// them (issue 35's target: due events behind 1M scheduled ones). Rheo
/// targets only.
pub async fn schedule_ahead(
    target: &Target,
    events: u64,
    payload_bytes: usize,
    bar: &ProgressBar,
) -> Result<(), CliError> {
    let Target::Rheo(_) = target else {
        return Err(CliError::new("--scheduled-ahead needs a backend of this crate (not engine: or a peer)"));
    };
    let at = rheo::Timestamp::now().saturating_add(Duration::from_secs(86_400));
    let chunk = 1000.min(MAX_BATCH_EVENTS) as u64;
    let streams = target.stream_count();
    let mut n = 1;
    for i in 0..streams {
        let Target::Rheo(t) = target.on_stream(i) else { continue };
        let end_of_stream = n + share(events, streams, i);
        while n < end_of_stream {
            let end = (n + chunk).min(end_of_stream);
            let batch = (n..end).map(|i| {
                let (payload, opts) = item(i, payload_bytes, 0).options();
                (payload, opts.deliver_at(at))
            });
            t.rheo.append_batch_with(&t.stream, batch).await?;
            bar.inc(end - n);
            n = end;
        }
        // Fetches until nothing is left to set aside (nothing is due).
        loop {
            let report = t.rheo.fetch_report(&t.stream, &t.group, FetchOptions::new().limit(1000)).await?;
            if !report.leases.is_empty() {
                return Err(CliError::new(format!("{} events due a day ahead were claimed", report.leases.len())));
            }
            if report.scheduled == 0 {
                break;
            }
        }
    }
    Ok(())
}

/// This task's share of `total` split over `tasks`.
fn share(total: u64, tasks: usize, index: usize) -> u64 {
    let tasks = tasks.max(1) as u64;
    let index = index as u64;
    total / tasks + u64::from(index < total % tasks)
}

/// Runs the timed part of a case in this process. The clock is the
/// caller's: this returns when the work is done.
pub async fn run(target: &Target, phase: &Phase, bar: &ProgressBar) -> Result<PhaseOut, CliError> {
    let settled = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Samples::new(Latencies::new()?));
    let mut tasks: JoinSet<Result<TaskOut, CliError>> = JoinSet::new();
    let producing = phase.workload.has_producers();
    if producing {
        let mut first = phase.first;
        for p in 0..phase.producers {
            let count = share(phase.events, phase.producers, p);
            let (target, phase, bar, samples) = (target.on_stream(p), phase.clone(), bar.clone(), samples.clone());
            tasks.spawn(async move { produce(&target, &phase, first, count, &bar, &samples).await });
            first += count;
        }
    }
    match phase.workload {
        Workload::Consume | Workload::EndToEnd => {
            for c in 0..phase.consumers {
                let (target, phase, bar, settled, samples) =
                    (target.clone(), phase.clone(), bar.clone(), settled.clone(), samples.clone());
                tasks.spawn(async move { consume(&target, c, &phase, &settled, &bar, &samples).await });
            }
        }
        Workload::Query => {
            let queries = (phase.events / phase.batch.max(1) as u64).max(1);
            for q in 0..phase.consumers {
                let count = share(queries, phase.consumers, q);
                let (target, phase, bar, samples) = (target.clone(), phase.clone(), bar.clone(), samples.clone());
                tasks.spawn(async move { query(&target, &phase, q as u64, count, &bar, &samples).await });
            }
        }
        Workload::Handle => {
            // One task watches the group for every consumer, and tells
            // them all when the case is settled.
            let (done, settled) = tokio::sync::watch::channel(false);
            for c in 0..phase.consumers {
                let (target, phase, bar, samples, settled) =
                    (target.clone(), phase.clone(), bar.clone(), samples.clone(), settled.clone());
                tasks.spawn(async move { handle(&target, c, &phase, (&bar, &samples), settled).await });
            }
            let (target, phase) = (target.clone(), phase.clone());
            tasks.spawn(async move { watch_settled(&target, &phase, &done).await });
        }
        Workload::Append | Workload::AppendBatch | Workload::Fsync => {}
    }
    let mut out = PhaseOut { events: 0, ops: 0, latencies: Latencies::new()? };
    while let Some(joined) = tasks.join_next().await {
        let task = match joined {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tasks.abort_all();
                return Err(e);
            }
            Err(e) => {
                tasks.abort_all();
                return Err(CliError::new(format!("a bench task failed: {e}")));
            }
        };
        // End to end counts what the consumers settled, with their latency
        // samples; its producers' calls are not samples of it.
        if phase.workload == Workload::EndToEnd && task.producer {
            continue;
        }
        out.events += task.events;
        out.ops += task.ops;
    }
    out.latencies =
        std::mem::replace(&mut *samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner), Latencies::new()?);
    Ok(out)
}

/// What one task of a case did.
struct TaskOut {
    /// A producer (else a consumer or querier).
    producer: bool,
    /// Events it appended, settled or was returned.
    events: u64,
    /// Calls or cycles it made.
    ops: u64,
}

/// One producer: `count` events numbered from `first`, one call per event
/// or per batch.
async fn produce(
    target: &Target,
    phase: &Phase,
    first: u64,
    count: u64,
    bar: &ProgressBar,
    samples: &Samples,
) -> Result<TaskOut, CliError> {
    let per_call = if phase.workload == Workload::Append { 1 } else { phase.batch.max(1) as u64 };
    let stamped = phase.workload == Workload::EndToEnd;
    let (mut n, end, mut ops) = (first, first + count, 0);
    while n < end {
        let take = per_call.min(end - n);
        let started = Instant::now();
        let stamp = if stamped { wall_micros() } else { 0 };
        if take == 1 && phase.workload == Workload::Append {
            target.append(phase_item(n, phase, stamp)).await?;
        } else {
            target.append_batch((n..n + take).map(|i| phase_item(i, phase, stamp)).collect()).await?;
        }
        if !stamped {
            record(samples, [micros(started.elapsed())]);
            bar.inc(take);
        }
        ops += 1;
        n += take;
    }
    Ok(TaskOut { producer: true, events: count, ops })
}

/// One consumer: fetch and ack until the case's events are all settled,
/// on stream `index` first and on the next one whenever its own is empty.
async fn consume(
    all: &Target,
    index: usize,
    phase: &Phase,
    settled: &AtomicU64,
    bar: &ProgressBar,
    samples: &Samples,
) -> Result<TaskOut, CliError> {
    let stamps = phase.workload == Workload::EndToEnd;
    let (mut mine, mut ops) = (0u64, 0u64);
    let (mut on, mut target) = (index, all.on_stream(index));
    // Idle since when, and the backlog then: any change in the group's
    // backlog (another consumer's progress) restarts the clock.
    let mut idle: Option<(Instant, u64, u64)> = None;
    loop {
        if phase.processes == 1 && settled.load(Ordering::Acquire) >= phase.total_events {
            break;
        }
        let started = Instant::now();
        let got = target.consume(phase.batch, stamps).await?;
        if got.count == 0 && all.stream_count() > 1 {
            on += 1;
            target = all.on_stream(on);
            if on % all.stream_count() != index % all.stream_count() {
                continue;
            }
        }
        if got.count == 0 {
            // Done when every event of the case is in and settled (other
            // processes' consumers included); else wait a moment.
            let b = target.backlog().await?;
            if b.appended >= phase.total_events && b.unsettled == 0 {
                break;
            }
            let since = match idle {
                Some((since, appended, unsettled)) if (appended, unsettled) == (b.appended, b.unsettled) => since,
                _ => {
                    idle = Some((Instant::now(), b.appended, b.unsettled));
                    Instant::now()
                }
            };
            if since.elapsed() > STALL {
                return Err(CliError::new(format!(
                    "consumers made no progress for {} s: {} of {} events appended, {} unsettled",
                    STALL.as_secs(),
                    b.appended,
                    phase.total_events,
                    b.unsettled
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        idle = None;
        ops += 1;
        let n = got.count as u64;
        if stamps {
            let now = wall_micros();
            record(samples, got.stamps.into_iter().map(|t| now.saturating_sub(t)));
        } else {
            record(samples, [micros(started.elapsed())]);
        }
        mine += n;
        settled.fetch_add(n, Ordering::AcqRel);
        bar.inc(n);
    }
    Ok(TaskOut { producer: false, events: mine, ops })
}

/// The partitions consumer `index` of `consumers` owns when an unkeyed
/// group keeps per-key order (`handle` without `--keyed`): every
/// `consumers`-th from `index`.
fn owned_partitions(index: usize, consumers: usize, partitions: u32) -> Vec<u32> {
    (0..partitions).filter(|&p| p as usize % consumers.max(1) == index).collect()
}

/// One managed consumer of `handle`: runs until [`watch_settled`] says
/// every event of the case is settled, then shuts down.
async fn handle(
    target: &Target,
    index: usize,
    phase: &Phase,
    (bar, samples): (&ProgressBar, &Arc<Samples>),
    mut settled: tokio::sync::watch::Receiver<bool>,
) -> Result<TaskOut, CliError> {
    let Target::Rheo(t) = target else {
        return Err(CliError::new("`handle` needs a backend of this crate (not engine: or a peer)"));
    };
    let nap = Duration::from_millis(phase.handler_ms);
    let (bar, samples) = (bar.clone(), samples.clone());
    let handler = rheo::handler_fn(move |_lease| {
        let (bar, samples) = (bar.clone(), samples.clone());
        async move {
            let started = Instant::now();
            if !nap.is_zero() {
                tokio::time::sleep(nap).await;
            }
            record(&samples, [micros(started.elapsed())]);
            bar.inc(1);
            rheo::Outcome::Ack
        }
    });
    // Fetches ask for half of `max_demand`: one lease per handler, and as
    // many fetched ahead. Not `--batch`: leases a consumer holds ahead
    // hold their keys from the other consumers of a keyed group.
    let demand = (2 * phase.concurrency).min(rheo::MAX_LIMIT);
    let mut builder = t.rheo.consumer(&*t.stream, &*t.group).concurrency(phase.concurrency).max_demand(demand);
    if !phase.keyed {
        builder = builder.partitions(owned_partitions(index, phase.consumers, phase.partitions));
    }
    let consumer = builder.spawn(handler).await?;
    settled
        .wait_for(|&done| done)
        .await
        .map_err(|_| CliError::new("the watch of the case ended before it was settled"))?;
    let summary = consumer.shutdown().await?;
    Ok(TaskOut { producer: false, events: summary.acked, ops: summary.ack_batches })
}

/// Watches `handle`'s group until every event of the case is settled
/// (other processes' consumers included), then says so to the consumers.
async fn watch_settled(
    target: &Target,
    phase: &Phase,
    done: &tokio::sync::watch::Sender<bool>,
) -> Result<TaskOut, CliError> {
    let mut idle: Option<(Instant, u64)> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let b = target.backlog().await?;
        if b.appended >= phase.total_events && b.unsettled == 0 {
            done.send_replace(true);
            return Ok(TaskOut { producer: false, events: 0, ops: 0 });
        }
        match idle {
            Some((since, unsettled)) if unsettled == b.unsettled => {
                if since.elapsed() > STALL {
                    return Err(CliError::new(format!(
                        "consumers made no progress for {} s: {} events unsettled",
                        STALL.as_secs(),
                        b.unsettled
                    )));
                }
            }
            _ => idle = Some((Instant::now(), b.unsettled)),
        }
    }
}

/// One querier: `count` queries for spread-out values of `k`.
async fn query(
    target: &Target,
    phase: &Phase,
    index: u64,
    count: u64,
    bar: &ProgressBar,
    samples: &Samples,
) -> Result<TaskOut, CliError> {
    let mut events = 0u64;
    for i in 0..count {
        let k = (index * 37 + i * 7) % QUERY_VALUES;
        let started = Instant::now();
        let n = target.query(k, phase.batch).await? as u64;
        record(samples, [micros(started.elapsed())]);
        events += n;
        bar.inc(1);
    }
    Ok(TaskOut { producer: false, events, ops: count })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_partitions_cover_each_once() {
        for consumers in 1..=4 {
            let mut all: Vec<u32> = (0..consumers).flat_map(|c| owned_partitions(c, consumers, 4)).collect();
            all.sort_unstable();
            assert_eq!(all, vec![0, 1, 2, 3], "{consumers} consumers");
        }
        assert_eq!(owned_partitions(1, 2, 4), vec![1, 3]);
    }

    #[test]
    fn shares_add_up() {
        for (total, tasks) in [(10, 3), (3, 10), (0, 4), (1024, 1024), (7, 1)] {
            let sum: u64 = (0..tasks).map(|i| share(total, tasks, i)).sum();
            assert_eq!(sum, total, "{total} over {tasks}");
        }
    }

    /// Every workload on a backend, for a few hundred events: what a case
    /// reports is what the stream and the group hold afterwards.
    async fn counts_match_the_store(url: &str) {
        let rheo = Rheo::open(url).await.unwrap();
        let events = 300u64;
        for w in Workload::CASES {
            // Over 3 streams too (`--streams`), where a consumer moves on
            // from a drained stream (fewer consumers than streams).
            for (producers, consumers, streams) in [(1, 1, 1), (3, 2, 1), (3, 2, 3)] {
                if w == Workload::Query && streams > 1 {
                    continue;
                }
                let stream = format!("counts-{}-{producers}-{consumers}-{streams}", w.name());
                let target = Target::Rheo(RheoTarget::new(rheo.clone(), &stream, streams));
                target.setup(4, rheo::Retention::new(), false).await.unwrap();
                if w.prefilled() {
                    prefill(&target, events, 120, &ProgressBar::hidden()).await.unwrap();
                }
                let phase = Phase {
                    workload: w,
                    producers,
                    consumers,
                    batch: 7,
                    events,
                    total_events: events,
                    processes: 1,
                    payload_bytes: 120,
                    first: 1,
                    ids: producers > 1,
                    concurrency: 1,
                    handler_ms: 0,
                    keyed: false,
                    partitions: 4,
                };
                let bar = ProgressBar::hidden();
                let out = run(&target, &phase, &bar).await.unwrap();
                let backlog = target.backlog().await.unwrap();
                let (stored, unsettled) = (backlog.appended, backlog.unsettled);
                if streams > 1 {
                    for i in 0..streams {
                        let lag = rheo.lag(&format!("{stream}-{i}"), "bench").await.unwrap();
                        let held: u64 = lag.partitions.iter().map(|p| p.high_watermark).sum();
                        assert_eq!(held, events / 3, "{w:?}: stream {i} holds its share");
                    }
                }
                assert_eq!(stored, events, "{w:?} {producers}/{consumers}: events in the stream");
                match w {
                    Workload::Append | Workload::AppendBatch => {
                        assert_eq!(out.events, events, "{w:?}: events appended");
                        let per_call = if w == Workload::Append { 1 } else { 7 };
                        let calls: u64 = (0..producers).map(|p| share(events, producers, p).div_ceil(per_call)).sum();
                        assert_eq!(out.ops, calls, "{w:?}: calls");
                        assert_eq!(unsettled, events, "{w:?}: nothing consumed");
                    }
                    Workload::Consume | Workload::EndToEnd => {
                        assert_eq!(out.events, events, "{w:?}: events settled");
                        assert_eq!(unsettled, 0, "{w:?}: the group settled every event");
                        assert_eq!(out.latencies.len(), if w == Workload::EndToEnd { events } else { out.ops });
                    }
                    Workload::Query => {
                        // Each of the 42 queries asks for one of 100 values of
                        // `k`, each held by 3 of the 300 events.
                        let queries = events / 7;
                        assert_eq!(out.ops, queries);
                        assert_eq!(out.events, queries * 3, "query: events returned");
                    }
                    Workload::Fsync | Workload::Handle => unreachable!("not in CASES"),
                }
                assert_eq!(bar.position(), if w == Workload::Query { events / 7 } else { events }, "{w:?}: progress");
            }
        }
    }

    /// `handle` settles every event of the case, keyed (handlers across
    /// keys) or not (each consumer owning partitions), one sample per
    /// handler call.
    async fn handle_settles_every_event(url: &str) {
        let rheo = Rheo::open(url).await.unwrap();
        let events = 300u64;
        for (keyed, consumers, concurrency) in [(false, 1, 1), (false, 3, 1), (true, 2, 4)] {
            let stream = format!("handle-{keyed}-{consumers}");
            let target = Target::Rheo(RheoTarget::new(rheo.clone(), &stream, 1));
            target.setup(4, rheo::Retention::new(), keyed).await.unwrap();
            prefill(&target, events, 120, &ProgressBar::hidden()).await.unwrap();
            let phase = Phase {
                workload: Workload::Handle,
                producers: 0,
                consumers,
                batch: 10,
                events: 0,
                total_events: events,
                processes: 1,
                payload_bytes: 120,
                first: 1,
                ids: false,
                concurrency,
                handler_ms: 1,
                keyed,
                partitions: 4,
            };
            let out = run(&target, &phase, &ProgressBar::hidden()).await.unwrap();
            assert_eq!(out.events, events, "keyed {keyed}, {consumers} consumers: events acked");
            assert_eq!(out.latencies.len(), events, "one sample per handler call");
            assert!(out.latencies.summary().p50_us >= 1000, "a handler sleeps 1 ms");
            assert_eq!(target.backlog().await.unwrap().unsettled, 0, "the group settled every event");
        }
    }

    #[tokio::test]
    async fn handle_settles_every_event_on_memory() {
        handle_settles_every_event("memory:").await;
    }

    #[tokio::test]
    async fn handle_settles_every_event_on_native() {
        let dir = tempfile::tempdir().unwrap();
        handle_settles_every_event(&format!("native:{}", dir.path().display())).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counts_match_the_store_on_memory() {
        counts_match_the_store("memory:").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counts_match_the_store_on_native() {
        let dir = tempfile::tempdir().unwrap();
        counts_match_the_store(&format!("native:{}", dir.path().display())).await;
    }

    #[test]
    fn payloads_are_about_the_size_asked() {
        for bytes in [200usize, 1000, 4096] {
            let len = serde_json::to_vec(&item(123_456, bytes, wall_micros()).payload).unwrap().len();
            assert!(len.abs_diff(bytes) < 40, "{bytes} asked, {len} made");
        }
        assert_eq!(item(5, 0, 0).payload["k"], 5);
    }
}
