//! The `memory` backend: every rule of `docs/semantics.md` over in-process maps.
//!
//! Ephemeral (nothing survives the process), single-process, and fast: one
//! mutex per stream. Group state is the shared core in the private `groups` module
//! (a fetch costs O(limit · log n) where n is the number of unsettled
//! deliveries of the partitions it visits; a settle costs O(log n)).
//! Queries scan the stream's partitions in scope (bounded by the sequence
//! bounds) and keep only a page in memory. Starting a group at a time, and
//! replaying from a time, scan the partitions' timestamps.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};

use crate::backend::{Backend, Subscription, Wakeups};
use crate::error::{Error, ObjectKind, Result};
use crate::groups::{EventSource, GroupState, retention};
use crate::model::append::NewEvent;
use crate::model::capabilities::Capabilities;
use crate::model::event::{Event, Position};
use crate::model::group::{
    DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, Replay, Reset,
    check_partitions,
};
use crate::model::lease::{FetchReport, LeaseRef, RetryOutcome};
use crate::model::query::{Page, Query, check_index_field};
use crate::model::retention::{DroppedRange, PartitionInfo, Retention, RetentionReport};
use crate::model::routing::route;
use crate::model::stream::{IndexStatus, MAX_INDEXES, StreamInfo, StreamOptions};
use crate::model::time::{Clock, SystemClock, Timestamp};

const BACKEND: &str = "memory";

/// The in-memory backend. Open it with `Rheo::open("memory:")`.
#[derive(Debug)]
pub struct MemoryBackend {
    clock: Arc<dyn Clock>,
    streams: RwLock<HashMap<String, Arc<Slot>>>,
}

#[derive(Debug)]
struct Slot {
    state: Mutex<StreamState>,
    appended: Wakeups,
}

#[derive(Debug)]
struct StreamState {
    log: MemLog,
    groups: BTreeMap<String, GroupState>,
}

/// A stream's events.
#[derive(Debug)]
struct MemLog {
    name: Arc<str>,
    opts: StreamOptions,
    created_at: Timestamp,
    /// Events of each partition.
    partitions: Vec<MemPart>,
    /// Event id -> (partition, sequence) of its first occurrence.
    ids: HashMap<String, (u32, u64)>,
}

/// One partition's retained events.
#[derive(Debug, Default, Clone)]
struct MemPart {
    /// Events retention dropped: sequence n is at index n - 1 - dropped.
    dropped: u64,
    events: VecDeque<Event>,
    /// What [`stored_bytes`] counts of `events`.
    bytes: u64,
}

/// The size an event counts for, by `max_bytes` and `stream_info`: its
/// payload, id, key, type and metadata as stored, plus a fixed 32 bytes.
fn stored_bytes(e: &Event) -> u64 {
    let meta: usize = e.metadata().iter().map(|(k, v)| k.len() + v.to_string().len()).sum();
    (e.payload().as_bytes().len()
        + e.id().len()
        + e.key().map_or(0, str::len)
        + e.event_type().map_or(0, str::len)
        + meta
        + 32) as u64
}

impl MemPart {
    fn high_watermark(&self) -> u64 {
        self.dropped + self.events.len() as u64
    }
    fn get(&self, seq: u64) -> Option<&Event> {
        let i = seq.checked_sub(self.dropped + 1)?;
        self.events.get(usize::try_from(i).ok()?)
    }
    /// The retained events with `after < sequence <= until`.
    fn between(&self, after: u64, until: u64) -> impl Iterator<Item = &Event> {
        let lo = usize::try_from(after.saturating_sub(self.dropped)).unwrap_or(usize::MAX).min(self.events.len());
        let hi =
            usize::try_from(until.saturating_sub(self.dropped)).unwrap_or(usize::MAX).min(self.events.len()).max(lo);
        self.events.range(lo..hi)
    }
    fn push(&mut self, e: Event) {
        self.bytes += stored_bytes(&e);
        self.events.push_back(e);
    }
    /// The first sequence `retention`'s limits keep at `now`.
    fn limits_start(&self, retention: &Retention, now: Timestamp) -> u64 {
        let hw = self.high_watermark();
        let mut start = self.dropped + 1;
        if let Some(n) = retention.max_events {
            start = start.max((hw + 1).saturating_sub(n));
        }
        if let Some(cutoff) = retention.age_cutoff_ms(now.as_millis()) {
            let older = self.events.iter().take_while(|e| e.timestamp().as_millis() < cutoff).count() as u64;
            start = start.max(self.dropped + 1 + older);
        }
        if let Some(max) = retention.max_bytes {
            let mut kept = 0u64;
            let mut keep = 0u64;
            for e in self.events.iter().rev() {
                kept += stored_bytes(e);
                if kept > max {
                    break;
                }
                keep += 1;
            }
            start = start.max(hw + 1 - keep);
        }
        start
    }
    /// Drops every event below `start`; returns what was dropped.
    fn drop_before(&mut self, p: u32, start: u64, ids: &mut HashMap<String, (u32, u64)>) -> Option<DroppedRange> {
        let first = self.dropped + 1;
        let n = start.checked_sub(first).filter(|&n| n > 0)?.min(self.events.len() as u64);
        let mut bytes = 0;
        for e in self.events.drain(..usize::try_from(n).ok()?) {
            bytes += stored_bytes(&e);
            ids.remove(e.id());
        }
        self.dropped += n;
        self.bytes -= bytes;
        Some(DroppedRange { partition: p, first, last: self.dropped, bytes })
    }
}

impl EventSource for MemLog {
    fn stream(&self) -> &str {
        &self.name
    }
    fn partition_count(&self) -> u32 {
        self.opts.partition_count
    }
    fn high_watermark(&self, p: u32) -> u64 {
        self.partitions.get(p as usize).map_or(0, MemPart::high_watermark)
    }
    fn event(&self, p: u32, seq: u64) -> Result<Event> {
        self.partitions
            .get(p as usize)
            .and_then(|part| part.get(seq))
            .cloned()
            .ok_or_else(|| Error::failed("read", format!("stream {:?} partition {p} has no sequence {seq}", self.name)))
    }
    fn first_at_or_after(&self, p: u32, t: Timestamp) -> Result<Option<u64>> {
        let Some(part) = self.partitions.get(p as usize) else { return Ok(None) };
        Ok(part.events.iter().find(|e| e.timestamp() >= t).map(|e| e.sequence()))
    }
    fn matching(&self, p: u32, q: &Query, f: &mut dyn FnMut(u64)) -> Result<()> {
        let Some(part) = self.partitions.get(p as usize) else { return Ok(()) };
        part.events.iter().filter(|e| q.matches(e)).for_each(|e| f(e.sequence()));
        Ok(())
    }
    fn log_start(&self, p: u32) -> u64 {
        self.partitions.get(p as usize).map_or(1, |part| part.dropped + 1)
    }
    fn position_of(&self, id: &str) -> Result<Option<(u32, u64)>> {
        Ok(self.ids.get(id).copied())
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }
}

impl MemoryBackend {
    /// An empty backend on the system clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty backend reading time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryBackend { clock, streams: RwLock::new(HashMap::new()) }
    }

    fn slot(&self, stream: &str) -> Result<Arc<Slot>> {
        self.streams.read().get(stream).cloned().ok_or_else(|| Error::stream_not_found(stream))
    }

    /// Runs `f` on a stream's state under its lock.
    fn with_stream<T>(&self, stream: &str, f: impl FnOnce(&mut StreamState) -> Result<T>) -> Result<T> {
        let slot = self.slot(stream)?;
        let mut state = slot.state.lock();
        f(&mut state)
    }

    /// Runs `f` on a group's state and its stream's events under the lock.
    fn with_group<T>(
        &self,
        stream: &str,
        group: &str,
        f: impl FnOnce(&mut GroupState, &MemLog) -> Result<T>,
    ) -> Result<T> {
        self.with_stream(stream, |s| {
            let g = s.groups.get_mut(group).ok_or_else(|| Error::group_not_found(stream, group))?;
            f(g, &s.log)
        })
    }

    fn append_locked(&self, log: &mut MemLog, events: &[NewEvent]) -> Result<Vec<Position>> {
        let count = log.opts.partition_count;
        // Route every event first so that a bad partition appends nothing.
        let routed = events.iter().map(|e| Ok((route(&log.name, e, count)?, e))).collect::<Result<Vec<_>>>()?;
        let now = self.clock.now();
        let mut out = Vec::with_capacity(routed.len());
        for (p, e) in routed {
            // An id already in the stream (appended before, or earlier in
            // this batch): nothing is written, the original is answered.
            // The memory backend keeps every id, so its window is forever.
            if let Some(&(op, oseq)) = log.ids.get(e.id()) {
                let at = log.partitions.get(op as usize).and_then(|part| part.get(oseq));
                out.push(Position::duplicate_of(op, oseq, at.map_or(now, Event::timestamp)));
                continue;
            }
            let part = &mut log.partitions[p as usize];
            let seq = part.high_watermark() + 1;
            let event = e.clone().into_event(&log.name, p, seq, now);
            log.ids.insert(event.id().to_owned(), (p, seq));
            out.push(Position::new(p, seq, event.timestamp()));
            part.push(event);
        }
        Ok(out)
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::new(BACKEND);
        c.wakeups = true;
        c.ops_inspect = true;
        c.retention = true;
        c.scheduled_delivery = true;
        c.ordered_by_key = true;
        c
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    async fn ensure_schema(&self) -> Result<()> {
        Ok(())
    }

    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        opts.validate(stream)?;
        let mut streams = self.streams.write();
        if streams.contains_key(stream) {
            return Err(Error::AlreadyExists { kind: ObjectKind::Stream, name: stream.to_owned() });
        }
        let log = MemLog {
            name: Arc::from(stream),
            opts: opts.clone(),
            created_at: self.clock.now(),
            partitions: vec![MemPart::default(); opts.partition_count as usize],
            ids: HashMap::new(),
        };
        let info = stream_info(&log);
        let state = StreamState { log, groups: BTreeMap::new() };
        streams.insert(stream.to_owned(), Arc::new(Slot { state: Mutex::new(state), appended: Wakeups::default() }));
        Ok(info)
    }

    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> Result<GroupSummary> {
        let now = self.clock.now();
        self.with_stream(stream, |s| {
            if s.groups.contains_key(group) {
                return Err(Error::AlreadyExists { kind: ObjectKind::Group, name: format!("{stream}/{group}") });
            }
            let g = GroupState::create(&s.log, group, opts, now)?;
            let summary = g.summary.clone();
            s.groups.insert(group.to_owned(), g);
            Ok(summary)
        })
    }

    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
        let slot = self.slot(stream)?;
        let out = {
            let mut state = slot.state.lock();
            self.append_locked(&mut state.log, events)?
        };
        slot.appended.appended();
        Ok(out)
    }

    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.with_stream(stream, |s| {
            check_partitions(stream, &[partition], s.log.opts.partition_count)?;
            Ok(s.log.partitions[partition as usize].between(after, u64::MAX).take(limit).cloned().collect())
        })
    }

    async fn query(&self, query: &Query) -> Result<Page> {
        self.with_stream(&query.stream, |s| {
            let log = &s.log;
            let candidates = query.partitions(log.opts.partition_count).into_iter().flat_map(|p| {
                let (after, until) = query.sequence_bounds(p);
                log.partitions[p as usize].between(after, until).cloned()
            });
            Ok(query.page_from(candidates))
        })
    }

    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<FetchReport> {
        let now = self.clock.now();
        self.with_group(stream, group, |g, log| g.fetch(log, opts, now))
    }

    async fn renew(&self, lease: &LeaseRef, lease_duration: Duration) -> Result<Timestamp> {
        let now = self.clock.now();
        self.with_group(&lease.stream, &lease.group, |g, _| g.renew(lease, lease_duration, now))
    }

    async fn ack(&self, lease: &LeaseRef) -> Result<()> {
        self.with_group(&lease.stream, &lease.group, |g, _| g.ack(lease))
    }

    async fn renew_many(&self, leases: &[LeaseRef], lease_duration: Duration) -> Result<Vec<Result<Timestamp>>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            out.push(self.renew(lease, lease_duration).await);
        }
        Ok(out)
    }

    async fn ack_many(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            out.push(self.ack(lease).await);
        }
        Ok(out)
    }

    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> Result<RetryOutcome> {
        let now = self.clock.now();
        self.with_group(&lease.stream, &lease.group, |g, _| g.retry(lease, reason, delay, now))
    }

    async fn reject(&self, lease: &LeaseRef, reason: &str) -> Result<()> {
        let now = self.clock.now();
        self.with_group(&lease.stream, &lease.group, |g, _| g.reject(lease, reason, now))
    }

    async fn skip(&self, stream: &str, group: &str, partition: u32, sequence: u64, reason: &str) -> Result<bool> {
        let now = self.clock.now();
        self.with_group(stream, group, |g, log| g.skip(log, partition, sequence, reason, now))
    }

    async fn replay(&self, stream: &str, group: &str, replay: &Replay) -> Result<u64> {
        self.with_group(stream, group, |g, log| g.replay(log, replay))
    }

    async fn reset_group(&self, stream: &str, group: &str, reset: &Reset) -> Result<()> {
        self.with_group(stream, group, |g, log| g.reset(log, reset))
    }

    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag> {
        self.with_group(stream, group, |g, log| g.lag(log, partitions))
    }

    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        let slots: Vec<Arc<Slot>> = self.streams.read().values().cloned().collect();
        let mut out: Vec<StreamInfo> = slots.iter().map(|slot| stream_info(&slot.state.lock().log)).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn stream_info(&self, stream: &str) -> Result<StreamInfo> {
        self.with_stream(stream, |s| Ok(stream_info(&s.log)))
    }

    async fn set_retention(&self, stream: &str, retention: &Retention) -> Result<StreamInfo> {
        self.with_stream(stream, |s| {
            s.log.opts.retention = *retention;
            Ok(stream_info(&s.log))
        })
    }

    async fn enforce_retention(&self, stream: &str) -> Result<RetentionReport> {
        let now = self.clock.now();
        self.with_stream(stream, |s| {
            let mut report = RetentionReport::new(stream);
            let retention = s.log.opts.retention;
            if retention.is_unlimited() {
                return Ok(report);
            }
            for p in 0..s.log.opts.partition_count {
                let part = &s.log.partitions[p as usize];
                let limits_start = part.limits_start(&retention, now);
                let interest = retention::interest_start(s.groups.values(), p);
                let (start, ceiling) = retention::new_start(retention.policy, limits_start, interest);
                let start = start.min(part.high_watermark() + 1);
                if start <= part.dropped + 1 {
                    continue;
                }
                // The groups first, as a durable backend must: no frontier
                // ever points below the log start.
                retention::move_groups(s.groups.values_mut(), p, start, &mut report);
                report.ceiling_hit |= ceiling;
                let log = &mut s.log;
                if let Some(range) = log.partitions[p as usize].drop_before(p, start, &mut log.ids) {
                    report.dropped.push(range);
                }
            }
            Ok(report)
        })
    }

    async fn list_groups(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        self.with_stream(stream, |s| Ok(s.groups.values().map(|g| g.summary.clone()).collect()))
    }

    async fn dead_letters(&self, stream: &str, group: &str, opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        self.with_group(stream, group, |g, log| g.dead_letters(log, opts))
    }

    async fn group_info(&self, stream: &str, group: &str) -> Result<GroupInfo> {
        let now = self.clock.now();
        self.with_group(stream, group, |g, log| Ok(g.info(log, now)))
    }

    async fn create_index(&self, stream: &str, field: &str) -> Result<()> {
        let canonical = check_index_field(stream, field)?;
        self.with_stream(stream, |s| {
            let opts = &mut s.log.opts;
            if !super::index_declared(&opts.indexes, &canonical) {
                if opts.indexes.len() >= MAX_INDEXES {
                    return Err(Error::invalid(
                        "indexes",
                        format!("stream {stream:?} has {MAX_INDEXES} indexes, the maximum"),
                    ));
                }
                opts.indexes.push(field.to_owned());
            }
            Ok(())
        })
    }

    async fn index_status(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        // Queries scan memory: every declared field is "ready" at once.
        self.with_stream(stream, |s| Ok(super::scanned_index_status(&s.log.opts.indexes)))
    }

    async fn subscribe(&self, stream: &str) -> Result<Subscription> {
        Ok(self.slot(stream)?.appended.subscribe())
    }
}

fn stream_info(log: &MemLog) -> StreamInfo {
    let parts = (0u32..)
        .zip(&log.partitions)
        .map(|(p, part)| PartitionInfo::new(p, part.dropped + 1, part.high_watermark(), part.bytes))
        .collect();
    StreamInfo::new(&log.name, log.opts.partition_count, log.opts.indexes.clone(), Vec::new(), log.created_at)
        .with_partitions(parts)
        .with_options(log.opts.retention, None)
}
