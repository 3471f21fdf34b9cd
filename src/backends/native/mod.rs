//! The `native` backend: the [`Backend`] trait over our own storage engine.
//!
//! Open it with `Rheo::open("native:./data")`. The backend owns its
//! settings: they go in the URL query
//! (`native:./data?durability=batched&max_delay_ms=5&recovery=strict`, every
//! key in [`parse_url`]), or, from code, in the [`EngineOptions`] given to
//! [`NativeBackend::open`], wrapped with [`RheoBuilder::with_backend`](crate::RheoBuilder::with_backend).
//!
//! The engine is synchronous. Appends encode and buffer their records on the
//! calling task (microseconds) and then await the group commit without
//! blocking a thread; opening, stream creation (which sync files), reads and
//! queries (which read the disk) run on the blocking pool.
//! Consumer groups live in each stream's write-ahead delivery table
//! (`engine::delivery`): a settle changes the state under the table's lock,
//! writes its WAL record to the OS, then awaits the group commit without
//! blocking a thread (under `Sync`, settles and appends share syncs). Fetch,
//! which reads the claimed events after the lock, does so on the calling task
//! up to 256 deliveries and on the blocking pool beyond.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{Backend, Subscription, Wakeups};
use crate::backends::url::{Taken, read_options};
use crate::engine::Engine;
use crate::engine::delivery::room;
use crate::engine::log::manifest::StreamSettings;
use crate::engine::log::stream::{Routed, StreamLog};
pub use crate::engine::options::{Durability, EngineOptions, MAX_SEGMENT_BYTES, RecoveryMode};
use crate::engine::stream::Stream;
use crate::error::{Error, Result};
use crate::groups::{DAMAGE_PER_PARTITION, EventSource, GroupState, query_matches, scheduled_room, spent_budget};
use crate::model::append::NewEvent;
use crate::model::capabilities::Capabilities;
use crate::model::event::{Event, Position};
use crate::model::group::{
    DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, Replay, ReplayFrom, Reset,
};
use crate::model::lease::{FetchReport, LeaseRef, RetryOutcome};
use crate::model::query::{Page, Query};
use crate::model::retention::{PartitionInfo, Retention, RetentionReport};
use crate::model::routing::route;
use crate::model::stream::{IndexStatus, StreamInfo, StreamOptions};
use crate::model::time::{Clock, Timestamp};

mod dedupe;
mod readonly;
pub use readonly::{REFRESH_INTERVAL, ReadOnlyNative};

const BACKEND: &str = "native";

/// One stream's dedupe window, shared by its appends.
type SharedWindow = Arc<WindowSlot>;

/// A stream's dedupe window, and the lock its one load from the log takes.
#[derive(Debug)]
struct WindowSlot {
    /// The stream's window (its own setting, else the backend's); zero: off.
    duration: Duration,
    window: parking_lot::Mutex<dedupe::Window>,
    loading: tokio::sync::Mutex<()>,
}

/// Fetches of at most this many deliveries read their events on the calling
/// task; larger ones on the blocking pool.
const INLINE_FETCH: usize = 256;

/// The native backend.
#[derive(Debug, Clone)]
pub struct NativeBackend {
    engine: Engine,
    clock: Arc<dyn Clock>,
    /// One wakeup source per stream name (created on first use, at most one
    /// per stream the engine has; each engine stream keeps its own after
    /// the first look-up): appends bump it, `subscribe` hands out
    /// subscriptions. The engine runs no async runtime of its own.
    wakeups: Arc<parking_lot::Mutex<HashMap<Arc<str>, Arc<Wakeups>>>>,
    /// One dedupe window per stream (created on its first append with a
    /// producer-given id).
    dedupe: Arc<parking_lot::Mutex<HashMap<Arc<str>, SharedWindow>>>,
}

/// The options `native:` URLs take.
const NATIVE_OPTIONS: &[&str] = &[
    "durability",
    "max_delay_ms",
    "segment_bytes",
    "preallocate_bytes",
    "map_writes",
    "checkpoint_bytes",
    "checkpoint_interval_ms",
    "background_indexing",
    "inline_io",
    "read_only",
    "dedupe_window_ms",
    "retention_interval_ms",
    "segment_max_age_ms",
    "recovery",
];

/// Parses `PATH[?key=value&...]` of a `native:` URL into a path and options
/// (applied over `opts`). The keys, each setting the [`EngineOptions`]
/// field of the same meaning: `durability=sync|batched|none`,
/// `max_delay_ms` (of `batched`, default 5), `segment_bytes`,
/// `preallocate_bytes`, `map_writes=true|false` (ADR 0035), `checkpoint_bytes`, `checkpoint_interval_ms`,
/// `recovery=strict|tolerate_torn_tail|truncate_at_first_damage`,
/// `background_indexing=true|false`, `inline_io=true|false`,
/// `read_only=true|false` (a [`ReadOnlyNative`] open, beside a writer),
/// `dedupe_window_ms` (0 turns the check of producer-given ids off; at most
/// a day), `retention_interval_ms` (how often the background thread runs
/// retention passes; 0: never), `segment_max_age_ms` (a segment rolls at
/// its next append once this old; 0: by size only).
///
/// ```
/// use rheo::backends::native::Durability;
/// use rheo::backends::native::EngineOptions;
/// let (path, opts) =
///     rheo::backends::native::parse_url("./data?durability=none&inline_io=true", EngineOptions::default())?;
/// assert_eq!((path.as_str(), opts.durability, opts.inline_io), ("./data", Durability::None, true));
/// # Ok::<(), rheo::Error>(())
/// ```
pub fn parse_url(rest: &str, mut opts: EngineOptions) -> Result<(String, EngineOptions)> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = path.strip_prefix("//").unwrap_or(path);
    if path.is_empty() {
        return Err(Error::invalid("url", "native: needs a directory, e.g. native:./rheo-data"));
    }
    let mut max_delay = None;
    let mut durability = None;
    let max_bytes = crate::engine::options::MAX_SEGMENT_BYTES;
    read_options("native", query, |opt| {
        match opt.key {
            "durability" => {
                durability = Some(opt.choice(&[("sync", "sync"), ("batched", "batched"), ("none", "none")])?);
            }
            "max_delay_ms" => max_delay = Some(opt.millis(0, 3_600_000)?),
            "segment_bytes" => opts.segment_bytes = opt.number(4096, max_bytes)?,
            "preallocate_bytes" => opts.preallocate_bytes = opt.number(0, max_bytes)?,
            "map_writes" => opts.map_writes = opt.boolean()?,
            "checkpoint_bytes" => opts.checkpoint_bytes = opt.number(4096, u64::MAX)?,
            "checkpoint_interval_ms" => opts.checkpoint_interval = opt.millis(0, u64::MAX)?,
            "background_indexing" => opts.background_indexing = opt.boolean()?,
            "inline_io" => opts.inline_io = opt.boolean()?,
            "read_only" => opts.read_only = opt.boolean()?,
            "dedupe_window_ms" => opts.dedupe_window = opt.millis(0, 86_400_000)?,
            "retention_interval_ms" => opts.retention_interval = opt.millis(0, 86_400_000)?,
            "segment_max_age_ms" => opts.segment_max_age = opt.millis(0, u64::MAX)?,
            "recovery" => {
                opts.recovery = opt.choice(&[
                    ("strict", RecoveryMode::Strict),
                    ("tolerate_torn_tail", RecoveryMode::TolerateTornTail),
                    ("truncate_at_first_damage", RecoveryMode::TruncateAtFirstDamage),
                ])?;
            }
            _ => return Err(opt.unknown(NATIVE_OPTIONS)),
        }
        Ok(Taken::Yes)
    })?;
    match (durability, max_delay) {
        (None, Some(_)) => {
            return Err(Error::invalid("url", "max_delay_ms applies to durability=batched; give both"));
        }
        (Some("batched"), d) => {
            opts.durability = Durability::Batched { max_delay: d.unwrap_or(Duration::from_millis(5)) };
        }
        (Some(v), Some(_)) => {
            return Err(Error::invalid("url", format!("max_delay_ms applies to durability=batched, not {v:?}")));
        }
        (Some("sync"), None) => opts.durability = Durability::Sync,
        (Some(_), None) => opts.durability = Durability::None,
        (None, None) => {}
    }
    Ok((path.to_owned(), opts))
}

impl NativeBackend {
    /// Opens (recovering) the data directory at `path`.
    /// With `opts.read_only`, open a [`ReadOnlyNative`] instead.
    pub async fn open(path: &str, opts: EngineOptions, clock: Arc<dyn Clock>) -> Result<Self> {
        if opts.read_only {
            return Err(Error::invalid(
                "read_only",
                format!(
                    "{path}: a read-only open is a ReadOnlyNative (ReadOnlyNative::open, or the URL native:{path}?read_only=true)"
                ),
            ));
        }
        let path = path.to_owned();
        let engine = if opts.inline_io {
            Engine::open_dir(&path, opts)?
        } else {
            blocking(move || Engine::open_dir(&path, opts)).await?
        };
        Ok(NativeBackend::from_engine(engine, clock))
    }

    fn from_engine(engine: Engine, clock: Arc<dyn Clock>) -> Self {
        NativeBackend { engine, clock, wakeups: Arc::default(), dedupe: Arc::default() }
    }

    /// Wraps an open engine (tests use a `MemVfs` or `FaultyVfs` engine).
    #[cfg(any(test, feature = "internals"))]
    #[doc(hidden)]
    pub fn with_engine(engine: Engine, clock: Arc<dyn Clock>) -> Self {
        NativeBackend::from_engine(engine, clock)
    }

    /// The wakeup of a stream the engine has (see `wakeups`; kept by the
    /// stream after the first look-up, and the same for a stream
    /// created again under the name).
    fn wakeup<'s>(&self, s: &'s Stream) -> &'s Wakeups {
        s.wakeups.get_or_init(|| self.wakeups.lock().entry(s.name().clone()).or_default().clone())
    }

    /// The engine underneath.
    #[cfg(any(test, feature = "internals"))]
    #[doc(hidden)]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Runs engine work that may block (disk reads, syncs) off the async
    /// workers, on the blocking pool; on the calling task when the engine
    /// was opened with `inline_io`.
    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
        if self.engine.options().inline_io {
            return f();
        }
        blocking(f).await
    }

    /// Runs `f` on a group's state under its stream's table lock, logging
    /// what it changed; waits (without blocking a thread) until that is as
    /// durable as the settings promise.
    /// `room` bounds the WAL record the call makes (`engine::delivery::room`).
    async fn group_op<T>(
        &self,
        stream: &str,
        group: &str,
        room: u64,
        f: impl FnOnce(&mut GroupState, &dyn EventSource) -> Result<T>,
    ) -> Result<T> {
        let s = self.engine.stream(stream)?;
        let (out, ticket) = s.with_group(&self.engine.ctx(), group, room, f)?;
        durable(ticket).await?;
        Ok(out)
    }

    /// As [`NativeBackend::group_op`], on the blocking pool: for calls that
    /// read events from disk.
    async fn group_op_blocking<T: Send + 'static>(
        &self,
        stream: &str,
        group: &str,
        room: u64,
        f: impl FnOnce(&mut GroupState, &dyn EventSource) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let s = self.engine.stream(stream)?;
        let engine = self.engine.clone();
        let group = group.to_owned();
        let (out, ticket) = self.blocking(move || s.with_group(&engine.ctx(), &group, room, f)).await?;
        durable(ticket).await?;
        Ok(out)
    }

    /// One settle per lease, with one WAL record and one sync per (stream,
    /// group) run of the batch; one result per lease, in order. `room`
    /// bounds the record of a run of `n` leases.
    async fn settle_many<T: Clone>(
        &self,
        call: &'static str,
        leases: &[LeaseRef],
        room: fn(usize) -> u64,
        settle: impl Fn(&mut GroupState, &LeaseRef) -> Result<T>,
    ) -> Result<Vec<Result<T>>> {
        let mut out: Vec<Option<Result<T>>> = (0..leases.len()).map(|_| None).collect();
        let mut runs: Vec<(&str, &str, Vec<usize>)> = Vec::new();
        for (i, l) in leases.iter().enumerate() {
            match runs.iter_mut().find(|(s, g, _)| *s == &*l.stream && *g == &*l.group) {
                Some(run) => run.2.push(i),
                None => {
                    // The first run is sized for every lease (the common
                    // case: all of one group), the others grow.
                    let mut idx = Vec::with_capacity(if runs.is_empty() { leases.len() } else { 1 });
                    idx.push(i);
                    runs.push((&l.stream, &l.group, idx));
                }
            }
        }
        for (stream, group, idx) in runs {
            let results = self
                .group_op(stream, group, room(idx.len()), |g, _| {
                    Ok(idx.iter().map(|&i| settle(g, &leases[i])).collect::<Vec<_>>())
                })
                .await;
            match results {
                Ok(rs) => idx.iter().zip(rs).for_each(|(&i, r)| out[i] = Some(r)),
                Err(e) => idx.iter().for_each(|&i| out[i] = Some(Err(e.clone()))),
            }
        }
        Ok(out.into_iter().map(|r| r.unwrap_or_else(|| Err(Error::failed(call, "lease not settled")))).collect())
    }

    fn stream_info(&self, entry: &crate::engine::log::manifest::StreamEntry, log: &StreamLog) -> StreamInfo {
        let parts = (0..entry.partition_count)
            .filter_map(|p| {
                let part = log.partition(p).ok()?;
                let last = part.visible();
                Some(PartitionInfo::new(p, part.log_start().min(last + 1), last, part.bytes()))
            })
            .collect();
        let window = entry.settings.dedupe_window().unwrap_or(self.engine.options().dedupe_window);
        StreamInfo::new(
            &entry.name,
            entry.partition_count,
            entry.indexes.clone(),
            Vec::new(),
            Timestamp::from_millis(entry.created_ms),
        )
        .with_partitions(parts)
        .with_options(entry.settings.retention(), Some(window))
    }

    /// The dedupe window of a stream: its own setting, else the backend's.
    fn dedupe_window_of(&self, stream: &str) -> Result<Duration> {
        let entry = self.engine.stream_entry(stream)?;
        Ok(entry.settings.dedupe_window().unwrap_or(self.engine.options().dedupe_window))
    }

    fn append_events(
        &self,
        stream: &str,
        events: &[NewEvent],
    ) -> Result<(Vec<Position>, crate::engine::commit::Ticket, Arc<Stream>)> {
        let s = self.engine.stream(stream)?;
        let log = &s.log;
        let count = log.partition_count();
        let now = self.clock.now();
        let routed = events
            .iter()
            .map(|e| {
                Ok(Routed { partition: route(stream, e, count)?, ts: e.timestamp.unwrap_or(now).as_millis(), event: e })
            })
            .collect::<Result<smallvec::SmallVec<[_; 1]>>>()?;
        let (assigned, ticket) = self.engine.append(&s, &routed)?;
        let out = events
            .iter()
            .zip(assigned)
            .map(|(e, (partition, sequence))| Position::new(partition, sequence, e.timestamp.unwrap_or(now)))
            .collect();
        Ok((out, ticket, s))
    }
}

impl NativeBackend {
    /// The dedupe window of a stream, filled from its recent records on
    /// first use.
    async fn window(&self, s: &Arc<Stream>) -> Result<SharedWindow> {
        let now = self.clock.now().as_millis();
        let existing = self.dedupe.lock().get(s.name()).cloned();
        let slot = match existing {
            Some(slot) => slot,
            None => {
                let duration = self.dedupe_window_of(s.name())?;
                self.dedupe
                    .lock()
                    .entry(s.name().clone())
                    .or_insert_with(|| {
                        Arc::new(WindowSlot {
                            duration,
                            window: parking_lot::Mutex::new(dedupe::Window::new(duration, now)),
                            loading: tokio::sync::Mutex::new(()),
                        })
                    })
                    .clone()
            }
        };
        let duration = slot.duration;
        if duration.is_zero() {
            return Ok(slot);
        }
        if !slot.window.lock().loaded {
            // One load per window: the others wait for it.
            let _loading = slot.loading.lock().await;
            if !slot.window.lock().loaded {
                let (slot2, s2) = (slot.clone(), s.clone());
                self.blocking(move || {
                    let mut fresh = dedupe::Window::new(duration, now);
                    fresh.load(&s2, now)?;
                    *slot2.window.lock() = fresh;
                    Ok(())
                })
                .await?;
            }
        }
        Ok(slot)
    }

    /// `append_batch` with producer-given ids checked against the stream's
    /// dedupe window: an id already there (or earlier in the batch) writes
    /// nothing and answers the original's position; the others are
    /// appended atomically, and their ids remembered. New ids are reserved
    /// under the window's lock before the append and filled after it, so
    /// two appends of one id cannot both write it (the second waits for the
    /// first). A window hit is checked against the stored record's id, so a
    /// hash collision stores the event rather than answering a stranger.
    async fn append_deduped(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
        use crate::backends::dedupe::{Plan, plan_with, resolve_plan};
        let s = self.engine.stream(stream)?;
        let window = self.window(&s).await?;
        if window.duration.is_zero() {
            let (out, ticket, s) = self.append_events(stream, events)?;
            ticket.resolved().await?;
            self.wakeup(&s).appended();
            return Ok(out);
        }
        let now = self.clock.now();
        let waiting_since = std::time::Instant::now();
        // Each id hashed once (0 for generated ids, never looked up).
        let keys: Vec<u64> = {
            let w = window.window.lock();
            events.iter().map(|e| if e.id_given { w.key(&e.id) } else { 0 }).collect()
        };
        // Under the window's lock: the plan, and a reservation of each new
        // id. An id another append has reserved and not yet written is
        // waited for (its outcome decides this one's).
        let plan = loop {
            {
                let mut w = window.window.lock();
                w.expire(now.as_millis());
                let mut in_flight = false;
                let mut failed = None;
                let plan = plan_with(events, |i| {
                    let seen = w.get_key(keys[i])?;
                    if seen.sequence == 0 {
                        in_flight = true;
                        return None;
                    }
                    // A hash is a hint: the stored record must have the id.
                    match s.log.read(seen.partition, seen.sequence - 1, 1) {
                        Ok(r) if r.first().is_some_and(|r| r.doc.id() == events[i].id()) => {}
                        // Written, not yet published (its append is still
                        // waiting for its sync): wait for it like a reservation.
                        Ok(r) if r.is_empty() => {
                            in_flight = true;
                            return None;
                        }
                        Ok(_) => return None,
                        Err(e) => {
                            failed = Some(e);
                            return None;
                        }
                    }
                    Some(Position::duplicate_of(seen.partition, seen.sequence, Timestamp::from_millis(seen.at_ms)))
                });
                if let Some(e) = failed {
                    return Err(e);
                }
                if !in_flight {
                    for ((p, e), &k) in plan.iter().zip(events).zip(&keys) {
                        if *p == Plan::Store && e.id_given {
                            w.reserve_key(k, now.as_millis());
                        }
                    }
                    break plan;
                }
            }
            if waiting_since.elapsed() > IN_FLIGHT_WAIT {
                return Err(Error::ambiguous(
                    "append",
                    format!(
                        "stream {stream:?}: an append of one of these ids has been in flight for {IN_FLIGHT_WAIT:?}; retry"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        let all_new = plan.iter().all(|p| *p == Plan::Store);
        if plan.iter().all(|p| *p != Plan::Store) {
            return resolve_plan(plan, &[]);
        }
        // The usual case (no duplicate) appends the events as given.
        let copied: Vec<NewEvent>;
        let fresh: &[NewEvent] = if all_new {
            events
        } else {
            copied = plan.iter().zip(events).filter(|(p, _)| **p == Plan::Store).map(|(_, e)| e.clone()).collect();
            &copied
        };
        let appended = self.append_events(stream, fresh);
        let (stored, ticket) = {
            let mut w = window.window.lock();
            match appended {
                Ok((stored, ticket, _)) => {
                    let new_keys = plan.iter().zip(events).zip(&keys).filter(|((p, _), _)| **p == Plan::Store);
                    for (((_, e), &k), p) in new_keys.zip(&stored) {
                        if e.id_given {
                            w.fill_key(k, p.partition, p.sequence);
                        }
                    }
                    (stored, ticket)
                }
                Err(err) => {
                    // Nothing was written: the ids are free again.
                    for ((p, e), &k) in plan.iter().zip(events).zip(&keys) {
                        if *p == Plan::Store && e.id_given {
                            w.release_key(k);
                        }
                    }
                    return Err(err);
                }
            }
        };
        ticket.resolved().await?;
        self.wakeup(&s).appended();
        resolve_plan(plan, &stored)
    }
}

/// The longest an append waits for another append of the same id that is
/// being written (normally microseconds).
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(5);

/// The most matches of a replay by query reopened in one step (one WAL
/// record of at most about 9 MiB, well under the record limit).
const REPLAY_STEP: usize = 1 << 20;

/// Splits a replay's matches into steps of at most [`REPLAY_STEP`]
/// positions, in order (at least one step, perhaps empty).
fn replay_steps(matched: Vec<(u32, Vec<u64>)>) -> Vec<Vec<(u32, Vec<u64>)>> {
    let mut steps = vec![Vec::new()];
    let mut size = 0;
    for (p, seqs) in matched {
        let mut rest = seqs.as_slice();
        while !rest.is_empty() {
            if size == REPLAY_STEP {
                steps.push(Vec::new());
                size = 0;
            }
            let (take, left) = rest.split_at(rest.len().min(REPLAY_STEP - size));
            size += take.len();
            if let Some(step) = steps.last_mut() {
                step.push((p, take.to_vec()));
            }
            rest = left;
        }
    }
    steps
}

/// The wait for a group operation's ticket: led on this thread unless the
/// caller keeps its worker free ([`crate::backend::keeping_the_worker_free`]).
fn durable(ticket: crate::engine::commit::Ticket) -> crate::engine::commit::TicketFuture {
    if crate::backend::worker_kept_free() { ticket.resolved_unled() } else { ticket.resolved() }
}

/// Runs blocking engine work off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::failed("native", format!("engine task failed: {e}")))?
}

#[async_trait]
impl Backend for NativeBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::new(BACKEND);
        c.durable = true;
        c.ops_inspect = true;
        c.indexed_query = true;
        c.wakeups = true;
        c.retention = true;
        c.scheduled_delivery = true;
        c.ordered_by_key = true;
        c
    }

    async fn ping(&self) -> Result<()> {
        match self.engine.poisoned() {
            Some(reason) => Err(Error::Poisoned { scope: "native data directory".into(), reason, source: None }),
            None => Ok(()),
        }
    }

    async fn ensure_schema(&self) -> Result<()> {
        Ok(())
    }

    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        opts.validate(stream)?;
        let engine = self.engine.clone();
        let (name, o) = (stream.to_owned(), opts.clone());
        let now = self.clock.now().as_millis();
        let settings = StreamSettings::of(&o.retention, o.dedupe_window);
        let entry = self
            .blocking(move || engine.create_stream_with(&name, o.partition_count, &o.indexes, now, settings))
            .await?;
        let s = self.engine.stream(stream)?;
        Ok(self.stream_info(&entry, &s.log))
    }

    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> Result<GroupSummary> {
        let s = self.engine.stream(stream)?;
        let now = self.clock.now();
        let (summary, ticket) = s.groups.create(&self.engine.ctx(), s.source(), group, opts, now)?;
        ticket.resolved().await?;
        Ok(summary)
    }

    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
        if events.iter().any(|e| e.id_given) {
            return self.append_deduped(stream, events).await;
        }
        let (out, ticket, s) = self.append_events(stream, events)?;
        ticket.resolved().await?;
        // Visible now (published before the ticket resolves): wake waiters.
        self.wakeup(&s).appended();
        Ok(out)
    }

    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        let s = self.engine.stream(stream)?;
        // Disk reads and decoding run on the blocking pool, not on a worker.
        self.blocking(move || s.log.read_events(s.name(), partition, after, limit)).await
    }

    async fn query(&self, query: &Query) -> Result<Page> {
        let s = self.engine.stream(&query.stream)?;
        let query = query.clone();
        // Reading may touch the disk: keep it off the workers.
        self.blocking(move || s.query_page(&query)).await
    }

    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<FetchReport> {
        let now = self.clock.now();
        let partitions = self.engine.stream(stream)?.log.partition_count();
        let consumer = opts.consumer_id.as_deref().map_or(0, str::len);
        let room = room::fetch(
            opts.limit,
            partitions,
            consumer,
            partitions as usize * DAMAGE_PER_PARTITION,
            scheduled_room(opts.limit, partitions as usize),
            spent_budget(opts.limit),
        );
        // The events are read under the table's lock, before anything is
        // claimed, so that a read failure leaves nothing claimed. A small
        // fetch reads on this task (tens of microseconds from the page
        // cache: less than a hop to the blocking pool and back); a large one
        // on the blocking pool.
        if opts.limit <= INLINE_FETCH {
            self.group_op(stream, group, room, |g, src| g.fetch(src, opts, now)).await
        } else {
            let opts = opts.clone();
            self.group_op_blocking(stream, group, room, move |g, src| g.fetch(src, &opts, now)).await
        }
    }

    async fn renew(&self, lease: &LeaseRef, d: Duration) -> Result<Timestamp> {
        let now = self.clock.now();
        self.group_op(&lease.stream, &lease.group, room::settle(0), |g, _| g.renew(lease, d, now)).await
    }

    async fn ack(&self, lease: &LeaseRef) -> Result<()> {
        self.group_op(&lease.stream, &lease.group, room::settle(0), |g, _| g.ack(lease)).await
    }

    async fn renew_many(&self, leases: &[LeaseRef], d: Duration) -> Result<Vec<Result<Timestamp>>> {
        let now = self.clock.now();
        self.settle_many("renew_many", leases, room::renews, |g, lease| g.renew(lease, d, now)).await
    }

    async fn ack_many(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        self.settle_many("ack_many", leases, room::acks, |g, lease| g.ack(lease)).await
    }

    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> Result<RetryOutcome> {
        let now = self.clock.now();
        self.group_op(&lease.stream, &lease.group, room::settle(reason.len() + 16), |g, _| {
            g.retry(lease, reason, delay, now)
        })
        .await
    }

    async fn reject(&self, lease: &LeaseRef, reason: &str) -> Result<()> {
        let now = self.clock.now();
        self.group_op(&lease.stream, &lease.group, room::settle(reason.len()), |g, _| g.reject(lease, reason, now))
            .await
    }

    async fn skip(&self, stream: &str, group: &str, partition: u32, sequence: u64, reason: &str) -> Result<bool> {
        let now = self.clock.now();
        self.group_op(stream, group, room::settle(reason.len() + 16), |g, src| {
            g.skip(src, partition, sequence, reason, now)
        })
        .await
    }

    async fn replay(&self, stream: &str, group: &str, replay: &Replay) -> Result<u64> {
        let partitions = self.engine.stream(stream)?.log.partition_count();
        let ReplayFrom::Query(q) = &replay.from else {
            let replay = replay.clone();
            // Replaying by time reads the log.
            let room = room::reopen(partitions, 0);
            return self.group_op_blocking(stream, group, room, move |g, src| g.replay(src, &replay)).await;
        };
        // The group and the partitions first, so that a wrong name does not
        // wait for the query.
        let scope = replay.partitions.as_deref();
        self.group_op(stream, group, room::NONE, |g, src| g.partitions_in(src, scope)).await?;
        // The matches are read without the table's lock (published events
        // never change), then reopened in steps of at most
        // `REPLAY_STEP` events, each one WAL record.
        let (s, q) = (self.engine.stream(stream)?, q.clone());
        let matched = self.blocking(move || query_matches(&s.source(), &q)).await?;
        let total: usize = matched.iter().map(|(_, seqs)| seqs.len()).sum();
        let mut reopened = 0;
        let mut looked_at = 0;
        for (i, step) in replay_steps(matched).into_iter().enumerate() {
            let n: usize = step.iter().map(|(_, seqs)| seqs.len()).sum();
            let room = room::reopen(partitions, n);
            match self.group_op(stream, group, room, |g, src| g.replay_matches(src, scope, &step)).await {
                Ok(k) => reopened += k,
                Err(e) if i == 0 => return Err(e),
                Err(e) => {
                    return Err(Error::failed(
                        "replay",
                        format!(
                            "a replay by query of {stream:?}/{group:?} reopened {reopened} events (of the first {looked_at} of {total} matches, each step durable) before a step failed: {e}"
                        ),
                    ));
                }
            }
            looked_at += n;
        }
        Ok(reopened)
    }

    async fn reset_group(&self, stream: &str, group: &str, reset: &Reset) -> Result<()> {
        let partitions = self.engine.stream(stream)?.log.partition_count();
        let reset = reset.clone();
        self.group_op_blocking(stream, group, room::reopen(partitions, 0), move |g, src| g.reset(src, &reset)).await
    }

    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag> {
        self.group_op(stream, group, room::NONE, |g, src| g.lag(src, partitions)).await
    }

    async fn list_groups(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        Ok(self.engine.stream(stream)?.groups.list())
    }

    async fn dead_letters(&self, stream: &str, group: &str, opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        let opts = opts.clone();
        self.group_op_blocking(stream, group, room::NONE, move |g, src| g.dead_letters(src, &opts)).await
    }

    async fn group_info(&self, stream: &str, group: &str) -> Result<GroupInfo> {
        let now = self.clock.now();
        self.group_op(stream, group, room::NONE, |g, src| Ok(g.info(src, now))).await
    }

    async fn create_index(&self, stream: &str, field: &str) -> Result<()> {
        let engine = self.engine.clone();
        let (stream, field) = (stream.to_owned(), field.to_owned());
        self.blocking(move || {
            engine.create_index(&stream, &field)?;
            // Without the background builder, build now (tests, tools).
            if !engine.options().background_indexing {
                engine.build_indexes()?;
            }
            Ok(())
        })
        .await
    }

    async fn index_status(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        // It takes partition locks a catch-up may hold for a while.
        let (engine, stream) = (self.engine.clone(), stream.to_owned());
        self.blocking(move || engine.index_status(&stream)).await
    }

    async fn subscribe(&self, stream: &str) -> Result<Subscription> {
        let s = self.engine.stream(stream)?;
        Ok(self.wakeup(&s).subscribe())
    }

    async fn stream_info(&self, stream: &str) -> Result<StreamInfo> {
        let entry = self.engine.stream_entry(stream)?;
        let s = self.engine.stream(stream)?;
        Ok(self.stream_info(&entry, &s.log))
    }

    async fn set_retention(&self, stream: &str, retention: &Retention) -> Result<StreamInfo> {
        let engine = self.engine.clone();
        let name = stream.to_owned();
        let retention = *retention;
        let entry = self
            .blocking(move || {
                let mut settings = engine.stream_entry(&name)?.settings;
                let dedupe = settings.dedupe_window_ms;
                settings = StreamSettings::of(&retention, None);
                settings.dedupe_window_ms = dedupe;
                engine.set_stream_settings(&name, settings)
            })
            .await?;
        let s = self.engine.stream(stream)?;
        Ok(self.stream_info(&entry, &s.log))
    }

    async fn enforce_retention(&self, stream: &str) -> Result<RetentionReport> {
        let engine = self.engine.clone();
        let name = stream.to_owned();
        let now = self.clock.now().as_millis();
        self.blocking(move || engine.enforce_retention(&name, now)).await
    }

    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        let mut out = Vec::new();
        for entry in self.engine.stream_entries() {
            let s = self.engine.stream(&entry.name)?;
            out.push(self.stream_info(&entry, &s.log));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option is honoured or refused with its name, never clamped or
    /// ignored.
    #[test]
    fn url_options_are_honoured_or_refused() {
        let (path, o) = parse_url(
            "./d?durability=batched&max_delay_ms=7&segment_bytes=4096&checkpoint_bytes=4096&dedupe_window_ms=0&recovery=strict",
            EngineOptions::default(),
        )
        .expect("parse");
        assert_eq!(path, "./d");
        assert_eq!(o.durability, Durability::Batched { max_delay: Duration::from_millis(7) });
        assert_eq!((o.segment_bytes, o.checkpoint_bytes, o.dedupe_window), (4096, 4096, Duration::ZERO));
        assert_eq!(o.recovery, RecoveryMode::Strict);
        for (query, says) in [
            ("segment_bytes=100", "segment_bytes=\"100\": expected a whole number from 4096 to 1073741824"),
            ("segment_bytes=2000000000", "segment_bytes"),
            ("checkpoint_bytes=10", "checkpoint_bytes"),
            ("dedupe_window_ms=999999999999", "dedupe_window_ms"),
            ("retention_interval_ms=-1", "retention_interval_ms"),
            ("max_delay_ms=5", "max_delay_ms applies to durability=batched"),
            ("durability=sync&max_delay_ms=5", "not \"sync\""),
            ("durability=batched&max_delay_ms=4000000", "max_delay_ms"),
            ("recovery=lenient", "recovery=\"lenient\""),
            ("segment_byte=4096", "unknown native option \"segment_byte\""),
        ] {
            match parse_url(&format!("./d?{query}"), EngineOptions::default()) {
                Err(Error::InvalidArgument { argument: "url", reason }) => {
                    assert!(reason.contains(says), "{query}: {reason}")
                }
                other => panic!("{query}: {:?}", other.map(|(_, o)| o)),
            }
        }
    }

    /// Two ids whose hashes collide: the window's hint is checked against
    /// the stored record, and the second event is stored, not answered
    /// with the first.
    #[tokio::test]
    async fn a_hash_collision_in_the_dedupe_window_stores_the_event() {
        use crate::model::append::AppendOptions;
        use crate::model::payload::Payload;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().display().to_string();
        let clock: Arc<dyn Clock> = Arc::new(crate::model::time::SystemClock);
        let b = NativeBackend::open(&path, EngineOptions::default(), clock.clone()).await.expect("open");
        b.create_stream("s", &StreamOptions::new()).await.expect("stream");
        let ev = |id: &str| NewEvent::prepare(Payload::from_value(&serde_json::json!({})), AppendOptions::new().id(id));
        let first = b.append_batch("s", &[ev("a")]).await.expect("append a");
        let slot = b.window(&b.engine.stream("s").expect("stream")).await.expect("window");
        {
            let mut w = slot.window.lock();
            let kb = w.key("b");
            let seen = dedupe::Seen { partition: 0, sequence: first[0].sequence, at_ms: clock.now().as_millis() };
            w.insert_key(kb, seen);
        }
        let second = b.append_batch("s", &[ev("b")]).await.expect("append b");
        assert!(!second[0].duplicate, "b is not a duplicate of a: {second:?}");
        assert_eq!(second[0].sequence, 2);
        // And a real retry of a is still recognised.
        assert!(b.append_batch("s", &[ev("a")]).await.expect("retry a")[0].duplicate);
    }

    #[test]
    fn a_replay_by_query_is_split_in_steps_of_bounded_size() {
        let many: Vec<u64> = (1..=(REPLAY_STEP as u64 + 10)).collect();
        let steps = replay_steps(vec![(0, vec![1, 2, 3]), (1, many), (2, vec![7])]);
        let sizes: Vec<usize> = steps.iter().map(|s| s.iter().map(|(_, q)| q.len()).sum()).collect();
        assert_eq!(sizes, vec![REPLAY_STEP, 14]);
        assert!(sizes.iter().all(|&n| n <= REPLAY_STEP));
        let flat: Vec<(u32, u64)> =
            steps.iter().flatten().flat_map(|(p, seqs)| seqs.iter().map(move |&s| (*p, s))).collect();
        assert_eq!(flat.len(), REPLAY_STEP + 14, "every match once, in order");
        assert!(flat.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(replay_steps(Vec::new()), vec![Vec::new()], "one (empty) step: the group is still checked");
        // One step's WAL record stays far below the record limit.
        let bound = room::reopen(crate::model::limits::MAX_PARTITIONS, REPLAY_STEP);
        assert!(bound < u64::from(crate::engine::delivery::wal::WAL_MAX_BODY) / 4, "{bound}");
    }
}
