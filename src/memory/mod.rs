//! The `memory` backend: every rule of `SEMANTICS.md` over in-process maps.
//!
//! Ephemeral (nothing survives the process), single-process, and fast: one
//! mutex per stream; a fetch costs O(limit · log n) where n is the number of
//! unsettled deliveries of the partitions it visits (plus one step per
//! partition in scope); a settle costs O(log n). Queries scan the stream's
//! partitions in scope (bounded by the sequence bounds) and keep only a page
//! in memory. Starting a group at a time, and replaying from a time, scan the
//! partitions' timestamps.

mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::backend::Backend;
use crate::error::{Error, ObjectKind, Result};
use crate::model::capabilities::Capabilities;
use crate::model::event::{Event, NewEvent};
use crate::model::group::{
    Backoff, DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, PartitionLag,
    ReplayMode, ReplayOptions, ResetOptions, StartPosition, StreamInfo, StreamOptions, check_partitions,
};
use crate::model::lease::{Lease, LeaseRef, RetryOutcome};
use crate::model::query::{Page, Query};
use crate::model::routing::route;
use crate::model::time::{Clock, SystemClock, Timestamp};
use state::PartState;

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
    appended: Notify,
}

#[derive(Debug)]
struct StreamState {
    name: String,
    opts: StreamOptions,
    created_at: Timestamp,
    /// Events of each partition; sequence n is at index n - 1.
    partitions: Vec<Vec<Event>>,
    /// Event id -> (partition, sequence) of its first occurrence.
    ids: HashMap<String, (u32, u64)>,
    groups: BTreeMap<String, GroupState>,
}

#[derive(Debug)]
struct GroupState {
    summary: GroupSummary,
    backoff: Backoff,
    parts: BTreeMap<u32, PartState>,
    /// Dead-letter order -> (partition, sequence).
    dead_order: BTreeMap<u64, (u32, u64)>,
    next_dead_order: u64,
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

    /// Runs `f` on a group's state under its stream's lock.
    fn with_group<T>(
        &self,
        stream: &str,
        group: &str,
        f: impl FnOnce(&mut GroupState, &[Vec<Event>], &HashMap<String, (u32, u64)>) -> Result<T>,
    ) -> Result<T> {
        self.with_stream(stream, |s| {
            let g = s.groups.get_mut(group).ok_or_else(|| Error::group_not_found(stream, group))?;
            f(g, &s.partitions, &s.ids)
        })
    }

    /// Runs a settle on the delivery a lease names, failing with
    /// `StaleLease` unless it is held under that lease.
    fn settle<T>(
        &self,
        lease: &LeaseRef,
        f: impl FnOnce(&mut GroupState, u32, &state::Delivery, Timestamp) -> T,
    ) -> Result<T> {
        let now = self.clock.now();
        self.with_group(&lease.stream, &lease.group, |g, _, _| {
            let stale = || Error::StaleLease {
                stream: lease.stream.clone(),
                group: lease.group.clone(),
                partition: lease.partition,
                sequence: lease.sequence,
                lease_id: lease.lease_id.clone(),
            };
            let part = g.parts.get(&lease.partition).ok_or_else(stale)?;
            let delivery = part.held(lease.sequence, &lease.lease_id).ok_or_else(stale)?.clone();
            Ok(f(g, lease.partition, &delivery, now))
        })
    }

    fn append_locked(&self, s: &mut StreamState, events: Vec<NewEvent>) -> Result<Vec<Event>> {
        let count = s.opts.partition_count;
        // Route every event first so that a bad partition appends nothing.
        let routed = events.into_iter().map(|e| Ok((route(&s.name, &e, count)?, e))).collect::<Result<Vec<_>>>()?;
        let now = self.clock.now();
        let mut out = Vec::with_capacity(routed.len());
        for (p, e) in routed {
            let events = &mut s.partitions[p as usize];
            let seq = events.len() as u64 + 1;
            let event = e.into_event(&s.name, p, seq, now);
            s.ids.entry(event.id.clone()).or_insert((p, seq));
            events.push(event.clone());
            out.push(event);
        }
        Ok(out)
    }
}

fn high_watermark(partitions: &[Vec<Event>], p: u32) -> u64 {
    partitions.get(p as usize).map_or(0, |v| v.len() as u64)
}

fn event_at(partitions: &[Vec<Event>], p: u32, seq: u64) -> Option<&Event> {
    let idx = usize::try_from(seq.checked_sub(1)?).ok()?;
    partitions.get(p as usize)?.get(idx)
}

/// The frontier a group starts at in one partition, given its events.
fn start_frontier(start: &StartPosition, partition: u32, events: &[Event]) -> u64 {
    let hw = events.len() as u64;
    match start {
        StartPosition::Beginning => 0,
        StartPosition::After(n) => *n,
        StartPosition::AfterPerPartition(m) => m.get(&partition).copied().unwrap_or(0),
        StartPosition::At(t) => first_at_or_after(events, *t).map_or(hw, |seq| seq - 1),
        StartPosition::Latest => hw,
    }
}

/// The first sequence whose timestamp is at or after `t`.
fn first_at_or_after(events: &[Event], t: Timestamp) -> Option<u64> {
    events.iter().find(|e| e.timestamp >= t).map(|e| e.sequence)
}

/// The group's partitions within `requested`, checking the requested ones exist.
fn scope(stream: &str, partition_count: u32, group: &GroupState, requested: Option<&[u32]>) -> Result<Vec<u32>> {
    if let Some(r) = requested {
        check_partitions(stream, r, partition_count)?;
    }
    Ok(group.parts.keys().copied().filter(|p| requested.is_none_or(|r| r.contains(p))).collect())
}

fn dead_letter(g: &mut GroupState, p: u32, seq: u64, reason: String, now: Timestamp) {
    let order = g.next_dead_order;
    g.next_dead_order += 1;
    g.dead_order.insert(order, (p, seq));
    if let Some(part) = g.parts.get_mut(&p) {
        part.dead_letter(seq, reason, now, order);
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::new(BACKEND);
        c.wakeups = true;
        c.ops_inspect = true;
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
        let state = StreamState {
            name: stream.to_owned(),
            opts: opts.clone(),
            created_at: self.clock.now(),
            partitions: vec![Vec::new(); opts.partition_count as usize],
            ids: HashMap::new(),
            groups: BTreeMap::new(),
        };
        let info = stream_info(&state);
        streams.insert(stream.to_owned(), Arc::new(Slot { state: Mutex::new(state), appended: Notify::new() }));
        Ok(info)
    }

    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> Result<GroupSummary> {
        let now = self.clock.now();
        self.with_stream(stream, |s| {
            if s.groups.contains_key(group) {
                return Err(Error::AlreadyExists { kind: ObjectKind::Group, name: format!("{stream}/{group}") });
            }
            opts.validate(stream, s.opts.partition_count)?;
            let partitions: Vec<u32> = match &opts.partitions {
                Some(ps) => {
                    let mut ps = ps.clone();
                    ps.sort_unstable();
                    ps.dedup();
                    ps
                }
                None => (0..s.opts.partition_count).collect(),
            };
            let parts = partitions
                .iter()
                .map(|&p| (p, PartState::starting_after(start_frontier(&opts.start, p, &s.partitions[p as usize]))))
                .collect();
            let summary = GroupSummary {
                name: group.to_owned(),
                max_attempts: opts.max_attempts,
                partitions: opts.partitions.as_ref().map(|_| partitions),
                created_at: now,
            };
            s.groups.insert(
                group.to_owned(),
                GroupState {
                    summary: summary.clone(),
                    backoff: opts.retry_backoff,
                    parts,
                    dead_order: BTreeMap::new(),
                    next_dead_order: 0,
                },
            );
            Ok(summary)
        })
    }

    async fn append(&self, stream: &str, event: NewEvent) -> Result<Event> {
        let mut out = self.append_batch(stream, vec![event]).await?;
        out.pop().ok_or_else(|| Error::failed("append", "the batch returned no event"))
    }

    async fn append_batch(&self, stream: &str, events: Vec<NewEvent>) -> Result<Vec<Event>> {
        let slot = self.slot(stream)?;
        let out = {
            let mut state = slot.state.lock();
            self.append_locked(&mut state, events)?
        };
        slot.appended.notify_waiters();
        Ok(out)
    }

    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.with_stream(stream, |s| {
            check_partitions(stream, &[partition], s.opts.partition_count)?;
            let events = &s.partitions[partition as usize];
            let start = usize::try_from(after).unwrap_or(usize::MAX).min(events.len());
            Ok(events[start..].iter().take(limit).cloned().collect())
        })
    }

    async fn query(&self, query: &Query) -> Result<Page> {
        self.with_stream(&query.stream, |s| {
            let candidates = query.partitions(s.opts.partition_count).into_iter().flat_map(|p| {
                let events = &s.partitions[p as usize];
                let (after, until) = query.sequence_bounds(p);
                let lo = usize::try_from(after).unwrap_or(usize::MAX).min(events.len());
                let hi = usize::try_from(until).unwrap_or(usize::MAX).min(events.len()).max(lo);
                events[lo..hi].iter().cloned()
            });
            Ok(query.page_from(candidates))
        })
    }

    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<Vec<Lease>> {
        let now = self.clock.now();
        let expires_at = now.saturating_add(opts.lease);
        let consumer_id = opts.consumer_id.clone().unwrap_or_default();
        self.with_stream(stream, |s| {
            let count = s.opts.partition_count;
            let g = s.groups.get_mut(group).ok_or_else(|| Error::group_not_found(stream, group))?;
            let scope = scope(stream, count, g, opts.partitions.as_deref())?;
            let max_attempts = g.summary.max_attempts;
            let mut leases = Vec::new();
            for p in scope {
                let hw = high_watermark(&s.partitions, p);
                while leases.len() < opts.limit {
                    let Some(part) = g.parts.get_mut(&p) else { break };
                    part.fire_timers(now);
                    let Some(seq) = part.next_claimable(hw) else { break };
                    let spent = part.deliveries.get(&seq).is_some_and(|d| d.attempt >= max_attempts);
                    if spent {
                        // A lease that expired on its last attempt: the consumer
                        // died holding it (a poison pill); stop redelivering.
                        dead_letter(g, p, seq, "max_attempts: lease expired".to_owned(), now);
                        continue;
                    }
                    let lease_id = uuid::Uuid::new_v4().to_string();
                    let attempt = part.lease(seq, lease_id.clone(), consumer_id.clone(), expires_at);
                    let event = event_at(&s.partitions, p, seq)
                        .ok_or_else(|| Error::failed("fetch", format!("partition {p} has no sequence {seq}")))?;
                    leases.push(Lease {
                        lease_id,
                        receipt: None,
                        group: group.to_owned(),
                        consumer_id: consumer_id.clone(),
                        attempt,
                        expires_at,
                        event: event.clone(),
                    });
                }
            }
            Ok(leases)
        })
    }

    async fn renew(&self, lease: &LeaseRef, lease_duration: Duration) -> Result<Timestamp> {
        self.settle(lease, |g, p, _, now| {
            let expires_at = now.saturating_add(lease_duration);
            if let Some(part) = g.parts.get_mut(&p) {
                part.renew(lease.sequence, expires_at);
            }
            expires_at
        })
    }

    async fn ack(&self, lease: &LeaseRef) -> Result<()> {
        self.settle(lease, |g, p, _, _| {
            if let Some(part) = g.parts.get_mut(&p) {
                part.ack(lease.sequence);
            }
        })
    }

    async fn ack_many(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            out.push(self.ack(lease).await);
        }
        Ok(out)
    }

    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> Result<RetryOutcome> {
        self.settle(lease, |g, p, delivery, now| {
            if delivery.attempt >= g.summary.max_attempts {
                dead_letter(g, p, lease.sequence, format!("max_attempts: {reason}"), now);
                return RetryOutcome::DeadLettered;
            }
            let wait = delay.unwrap_or_else(|| g.backoff.delay(delivery.attempt));
            let available_at = now.saturating_add(wait);
            if let Some(part) = g.parts.get_mut(&p) {
                part.reschedule(lease.sequence, now, available_at);
            }
            RetryOutcome::Scheduled { available_at }
        })
    }

    async fn reject(&self, lease: &LeaseRef, reason: &str) -> Result<()> {
        self.settle(lease, |g, p, _, now| dead_letter(g, p, lease.sequence, reason.to_owned(), now))
    }

    async fn replay(&self, stream: &str, group: &str, opts: &ReplayOptions) -> Result<u64> {
        let mode = opts.mode(stream, group)?;
        self.with_stream(stream, |s| {
            let count = s.opts.partition_count;
            let g = s.groups.get_mut(group).ok_or_else(|| Error::group_not_found(stream, group))?;
            let scope = scope(stream, count, g, opts.partitions.as_deref())?;
            let mut reopened = 0;
            let mut dead_orders = Vec::new();
            match mode {
                ReplayMode::Sequence(from) => {
                    for &p in &scope {
                        if let Some(part) = g.parts.get_mut(&p) {
                            let (n, dead) = part.reopen_after(from, high_watermark(&s.partitions, p));
                            reopened += n;
                            dead_orders.extend(dead);
                        }
                    }
                }
                ReplayMode::Time(t) => {
                    let starts: Vec<(u32, u64)> = scope
                        .iter()
                        .filter_map(|&p| first_at_or_after(&s.partitions[p as usize], t).map(|seq| (p, seq)))
                        .collect();
                    if starts.is_empty() {
                        return Err(Error::NoEventsInRange {
                            stream: stream.to_owned(),
                            group: group.to_owned(),
                            detail: format!("no event at or after {t} in partitions {scope:?}"),
                        });
                    }
                    for (p, seq) in starts {
                        if let Some(part) = g.parts.get_mut(&p) {
                            let (n, dead) = part.reopen_after(seq - 1, high_watermark(&s.partitions, p));
                            reopened += n;
                            dead_orders.extend(dead);
                        }
                    }
                }
                ReplayMode::Query(q) => {
                    for p in q.partitions(count).into_iter().filter(|p| scope.contains(p)) {
                        let Some(part) = g.parts.get_mut(&p) else { continue };
                        for e in s.partitions[p as usize].iter().filter(|e| q.matches(e)) {
                            let (done, dead) = part.reopen_one(e.sequence);
                            reopened += u64::from(done);
                            dead_orders.extend(dead);
                        }
                    }
                }
            }
            for order in dead_orders {
                g.dead_order.remove(&order);
            }
            Ok(reopened)
        })
    }

    async fn reset_group(&self, stream: &str, group: &str, opts: &ResetOptions) -> Result<()> {
        if !opts.confirm {
            return Err(Error::ConfirmRequired {
                operation: "reset_group",
                stream: stream.to_owned(),
                group: group.to_owned(),
            });
        }
        self.with_stream(stream, |s| {
            let count = s.opts.partition_count;
            let g = s.groups.get_mut(group).ok_or_else(|| Error::group_not_found(stream, group))?;
            if let StartPosition::AfterPerPartition(m) = &opts.start {
                check_partitions(stream, &m.keys().copied().collect::<Vec<_>>(), count)?;
            }
            for p in scope(stream, count, g, opts.partitions.as_deref())? {
                let frontier = start_frontier(&opts.start, p, &s.partitions[p as usize]);
                if let Some(part) = g.parts.get_mut(&p) {
                    for info in part.dead.values() {
                        g.dead_order.remove(&info.order);
                    }
                    *part = PartState::starting_after(frontier);
                }
            }
            Ok(())
        })
    }

    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag> {
        self.with_stream(stream, |s| {
            let g = s.groups.get(group).ok_or_else(|| Error::group_not_found(stream, group))?;
            let scope = scope(stream, s.opts.partition_count, g, partitions)?;
            Ok(lag_of(stream, group, g, &scope, &s.partitions))
        })
    }

    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        let slots: Vec<Arc<Slot>> = self.streams.read().values().cloned().collect();
        let mut out: Vec<StreamInfo> = slots.iter().map(|slot| stream_info(&slot.state.lock())).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn list_groups(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        self.with_stream(stream, |s| Ok(s.groups.values().map(|g| g.summary.clone()).collect()))
    }

    async fn dead_letters(&self, stream: &str, group: &str, opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        self.with_group(stream, group, |g, partitions, ids| {
            let start = match &opts.after {
                None => 0,
                Some(id) => {
                    let not_found = || Error::CursorNotFound {
                        scope: format!("dead letters of {stream:?}/{group:?}"),
                        cursor: id.clone(),
                    };
                    let (p, seq) = ids.get(id).copied().ok_or_else(not_found)?;
                    let info = g.parts.get(&p).and_then(|part| part.dead.get(&seq)).ok_or_else(not_found)?;
                    info.order + 1
                }
            };
            let mut out = Vec::new();
            for (&_order, &(p, seq)) in g.dead_order.range(start..).take(opts.limit) {
                let (Some(info), Some(event)) =
                    (g.parts.get(&p).and_then(|part| part.dead.get(&seq)), event_at(partitions, p, seq))
                else {
                    continue;
                };
                out.push(DeadLetter {
                    event: event.clone(),
                    reason: info.reason.clone(),
                    attempts: info.attempts,
                    dead_lettered_at: info.at,
                });
            }
            Ok(out)
        })
    }

    async fn group_info(&self, stream: &str, group: &str) -> Result<GroupInfo> {
        let now = self.clock.now();
        self.with_group(stream, group, |g, partitions, _| {
            // Backoffs that have passed are claimable, not waiting.
            g.parts.values_mut().for_each(|part| part.fire_timers(now));
            let scope: Vec<u32> = g.parts.keys().copied().collect();
            let (inflight, retry_waiting) =
                g.parts.values().map(PartState::counts).fold((0, 0), |(a, b), (l, w)| (a + l, b + w));
            Ok(GroupInfo {
                summary: g.summary.clone(),
                lag: lag_of(stream, group, g, &scope, partitions),
                inflight,
                retry_waiting,
                dead_letters: g.dead_order.len() as u64,
            })
        })
    }

    async fn wait_for_events(&self, stream: &str, timeout: Duration) -> Result<()> {
        let slot = self.slot(stream)?;
        let _ = tokio::time::timeout(timeout, slot.appended.notified()).await;
        Ok(())
    }

    fn unsupported(&self, operation: &'static str) -> Error {
        Error::Unsupported { backend: BACKEND, operation }
    }
}

fn lag_of(stream: &str, group: &str, g: &GroupState, scope: &[u32], partitions: &[Vec<Event>]) -> Lag {
    let per = scope
        .iter()
        .filter_map(|&p| {
            let part = g.parts.get(&p)?;
            let hw = high_watermark(partitions, p);
            debug_assert!(part.frontier <= hw.max(part.cursor), "frontier passed the cursor");
            Some(PartitionLag::new(p, hw, part.frontier))
        })
        .collect();
    Lag::new(stream, group, per)
}

fn stream_info(s: &StreamState) -> StreamInfo {
    StreamInfo {
        name: s.name.clone(),
        partition_count: s.opts.partition_count,
        indexes: s.opts.indexes.clone(),
        high_watermarks: s.partitions.iter().map(|p| p.len() as u64).collect(),
        created_at: s.created_at,
    }
}
