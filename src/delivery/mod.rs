//! The consumer-group core shared by backends that keep group state in
//! process (memory now, the native delivery table next): every rule of
//! SEMANTICS.md about fetch, settles, retries, dead letters, the frontier,
//! replay, reset and lag, over any [`EventSource`].
//!
//! Costs (n = materialized, unsettled deliveries of a partition): a claim,
//! settle or timer is O(log n); `fetch(limit)` is O(limit · log n) plus the
//! timers that came due and one step per partition in scope. Settled
//! sequences above the frontier are kept as ranges, so memory follows what
//! is in flight and unsettled, not the length of the log. Starting at or
//! replaying from a time costs what the source's `first_at_or_after` costs.

pub(crate) mod journal;
pub(crate) mod state;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::model::event::Event;
use crate::model::group::{
    Backoff, DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, PartitionLag,
    ReplayMode, ReplayOptions, ResetOptions, StartPosition, check_partitions,
};
use crate::model::lease::{Lease, LeaseRef, RetryOutcome};
use crate::model::query::Query;
use crate::model::time::Timestamp;
use journal::Op;
use state::{Delivery, PartState};

/// What the group core needs from a stream's log.
pub(crate) trait EventSource {
    /// The stream's name.
    fn stream(&self) -> &str;
    /// Its partition count.
    fn partition_count(&self) -> u32;
    /// The last assigned sequence of a partition.
    fn high_watermark(&self, p: u32) -> u64;
    /// The event at a position (which exists: at most the high watermark).
    fn event(&self, p: u32, seq: u64) -> Result<Event>;
    /// The events at ascending positions of one partition (which exist).
    fn events(&self, p: u32, seqs: &[u64]) -> Result<Vec<Event>> {
        seqs.iter().map(|&seq| self.event(p, seq)).collect()
    }
    /// The first sequence of a partition with a timestamp at or after `t`.
    fn first_at_or_after(&self, p: u32, t: Timestamp) -> Result<Option<u64>>;
    /// Calls `f` with the sequence of every event of a partition matching `q`.
    fn matching(&self, p: u32, q: &Query, f: &mut dyn FnMut(u64)) -> Result<()>;
    /// The position of the event with this id (its first occurrence).
    fn position_of(&self, id: &str) -> Result<Option<(u32, u64)>>;
}

/// A new lease id: a UUID (version 4 layout) whose upper half is random per
/// process and whose lower half counts, so ids never repeat within a
/// process nor, but with negligible probability (2^-58 per pair of
/// processes), across restarts. Unlike `Uuid::new_v4` it costs no system
/// call (a `getrandom` per lease was a tenth of a fetch's time).
fn new_lease_id() -> u128 {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        // Version 4 in bits 76..80 of the UUID (bits 12..16 of this half).
        let random = (uuid::Uuid::new_v4().as_u128() >> 64) as u64;
        (random & !0xf000) | 0x4000
    });
    // The variant (0b10) in the top bits of the lower half.
    let low = (COUNTER.fetch_add(1, Ordering::Relaxed) & (u64::MAX >> 2)) | (1 << 63);
    (u128::from(prefix) << 64) | u128::from(low)
}

/// A claim made by a fetch: (sequence, lease id, attempt).
type Claimed = (u64, u128, u32);

/// What a fetch claimed, before its events are read.
#[derive(Debug)]
pub(crate) struct Claims {
    group: String,
    consumer_id: String,
    expires_at: Timestamp,
    count: usize,
    /// (partition, claims) in delivery order.
    parts: Vec<(u32, Vec<Claimed>)>,
}

impl Claims {
    /// The leases, with their events. A failed read leaves the claims to
    /// expire and be delivered again.
    pub(crate) fn leases(self, src: &dyn EventSource) -> Result<Vec<Lease>> {
        let mut leases = Vec::with_capacity(self.count);
        for (p, here) in self.parts {
            let seqs: Vec<u64> = here.iter().map(|&(seq, _, _)| seq).collect();
            let events = src.events(p, &seqs)?;
            for ((_, lease_id, attempt), event) in here.into_iter().zip(events) {
                leases.push(Lease {
                    lease_id: uuid::Uuid::from_u128(lease_id).to_string(),
                    receipt: None,
                    group: self.group.clone(),
                    consumer_id: self.consumer_id.clone(),
                    attempt,
                    expires_at: self.expires_at,
                    event,
                });
            }
        }
        Ok(leases)
    }
}

/// One consumer group's state.
#[derive(Debug)]
pub(crate) struct GroupState {
    pub(crate) summary: GroupSummary,
    backoff: Backoff,
    parts: BTreeMap<u32, PartState>,
    /// Dead-letter order -> (partition, sequence).
    dead_order: BTreeMap<u64, (u32, u64)>,
    next_dead_order: u64,
    /// Transitions made since the last `take_ops`, when journaling.
    journal: Option<Vec<Op>>,
}

/// The frontier a group starts at in one partition.
fn start_frontier(src: &dyn EventSource, start: &StartPosition, p: u32) -> Result<u64> {
    let hw = src.high_watermark(p);
    Ok(match start {
        StartPosition::Beginning => 0,
        StartPosition::After(n) => *n,
        StartPosition::AfterPerPartition(m) => m.get(&p).copied().unwrap_or(0),
        StartPosition::At(t) => src.first_at_or_after(p, *t)?.map_or(hw, |seq| seq - 1),
        StartPosition::Latest => hw,
    })
}

impl GroupState {
    /// A new group (options validated here); the frontier of each partition
    /// starts at its start position minus one.
    pub(crate) fn create(src: &dyn EventSource, group: &str, opts: &GroupOptions, now: Timestamp) -> Result<Self> {
        let count = src.partition_count();
        opts.validate(src.stream(), count)?;
        let partitions: Vec<u32> = match &opts.partitions {
            Some(ps) => {
                let mut ps = ps.clone();
                ps.sort_unstable();
                ps.dedup();
                ps
            }
            None => (0..count).collect(),
        };
        let mut parts = BTreeMap::new();
        for &p in &partitions {
            parts.insert(p, PartState::starting_after(start_frontier(src, &opts.start, p)?));
        }
        let summary = GroupSummary {
            name: group.to_owned(),
            max_attempts: opts.max_attempts,
            partitions: opts.partitions.as_ref().map(|_| partitions),
            created_at: now,
        };
        Ok(GroupState {
            summary,
            backoff: opts.retry_backoff,
            parts,
            dead_order: BTreeMap::new(),
            next_dead_order: 0,
            journal: None,
        })
    }

    /// The group's partitions within `requested`, checking those exist.
    fn scope(&self, src: &dyn EventSource, requested: Option<&[u32]>) -> Result<Vec<u32>> {
        if let Some(r) = requested {
            check_partitions(src.stream(), r, src.partition_count())?;
        }
        Ok(self.parts.keys().copied().filter(|p| requested.is_none_or(|r| r.contains(p))).collect())
    }

    fn dead_letter(&mut self, p: u32, seq: u64, reason: String, now: Timestamp) {
        if self.journal.is_some() {
            self.log(Op::DeadLetter { p, seq, reason: reason.clone(), at: now });
        }
        self.dead_letter_now(p, seq, reason, now);
    }

    fn dead_letter_now(&mut self, p: u32, seq: u64, reason: String, now: Timestamp) {
        let Some(part) = self.parts.get_mut(&p) else { return };
        let order = self.next_dead_order;
        self.next_dead_order = self.next_dead_order.saturating_add(1);
        self.dead_order.insert(order, (p, seq));
        part.dead_letter(seq, reason, now, order);
    }

    /// Claims up to `opts.limit` deliveries in (partition, sequence) order.
    pub(crate) fn fetch(&mut self, src: &dyn EventSource, opts: &FetchOptions, now: Timestamp) -> Result<Vec<Lease>> {
        self.claim(src, opts, now)?.leases(src)
    }

    /// The claims of a fetch, without reading their events (which a caller
    /// may do after releasing its lock: published events never change).
    pub(crate) fn claim(&mut self, src: &dyn EventSource, opts: &FetchOptions, now: Timestamp) -> Result<Claims> {
        let expires_at = now.saturating_add(opts.lease);
        let consumer_id = opts.consumer_id.clone().unwrap_or_default();
        let consumer: Arc<str> = Arc::from(consumer_id.as_str());
        let scope = self.scope(src, opts.partitions.as_deref())?;
        let max_attempts = self.summary.max_attempts;
        // (partition, claims) in order.
        let mut claimed: Vec<(u32, Vec<Claimed>)> = Vec::new();
        let mut count = 0;
        for p in scope {
            let hw = src.high_watermark(p);
            let cursor_before = self.parts.get(&p).map_or(0, |part| part.cursor);
            let mut here = Vec::new();
            while count < opts.limit {
                let Some(part) = self.parts.get_mut(&p) else { break };
                part.fire_timers(now);
                let Some(seq) = part.next_claimable(hw) else { break };
                let spent = part.deliveries.get(&seq).is_some_and(|d| d.attempt >= max_attempts);
                if spent {
                    // A lease that expired on its last attempt: the consumer
                    // died holding it (a poison pill); stop redelivering.
                    self.dead_letter(p, seq, "max_attempts: lease expired".to_owned(), now);
                    continue;
                }
                let lease_id = new_lease_id();
                let attempt = part.lease(seq, lease_id, consumer.clone(), expires_at);
                here.push((seq, lease_id, attempt));
                count += 1;
            }
            if self.journal.is_some() {
                if !here.is_empty() {
                    let leases = here.iter().map(|&(seq, id, _)| (seq, id)).collect();
                    self.log(Op::Claim { p, consumer: consumer_id.clone(), expires_at, leases });
                }
                // Claims replay the cursor up to their largest sequence; a
                // skip past it must be logged for replay to match.
                let claimed_to = here.iter().map(|&(seq, _, _)| seq).max().unwrap_or(0);
                let cursor = self.parts.get(&p).map_or(0, |part| part.cursor);
                if cursor != cursor_before && cursor > claimed_to {
                    self.log(Op::Cursor { p, cursor });
                }
            }
            if !here.is_empty() {
                claimed.push((p, here));
            }
        }
        Ok(Claims { group: self.summary.name.clone(), consumer_id, expires_at, count, parts: claimed })
    }

    /// The delivery a lease names, when it still holds it; else `StaleLease`.
    fn held(&self, lease: &LeaseRef) -> Result<Delivery> {
        let stale = || Error::StaleLease {
            stream: lease.stream.clone(),
            group: lease.group.clone(),
            partition: lease.partition,
            sequence: lease.sequence,
            lease_id: lease.lease_id.clone(),
        };
        let id = uuid::Uuid::try_parse(&lease.lease_id).map_err(|_| stale())?.as_u128();
        let part = self.parts.get(&lease.partition).ok_or_else(stale)?;
        part.held(lease.sequence, id).cloned().ok_or_else(stale)
    }

    /// Extends a lease; returns the new expiry.
    pub(crate) fn renew(&mut self, lease: &LeaseRef, d: Duration, now: Timestamp) -> Result<Timestamp> {
        self.held(lease)?;
        let expires_at = now.saturating_add(d);
        if let Some(part) = self.parts.get_mut(&lease.partition) {
            part.renew(lease.sequence, expires_at);
        }
        self.log(Op::Renew { p: lease.partition, seq: lease.sequence, expires_at });
        Ok(expires_at)
    }

    /// Acknowledges a delivery.
    pub(crate) fn ack(&mut self, lease: &LeaseRef) -> Result<()> {
        self.held(lease)?;
        if let Some(part) = self.parts.get_mut(&lease.partition) {
            part.ack(lease.sequence);
        }
        if self.journal.is_some() {
            self.log(Op::Ack { p: lease.partition, seqs: vec![lease.sequence] });
        }
        Ok(())
    }

    /// Gives a delivery back, or dead-letters it when out of attempts.
    pub(crate) fn retry(
        &mut self,
        lease: &LeaseRef,
        reason: &str,
        delay: Option<Duration>,
        now: Timestamp,
    ) -> Result<RetryOutcome> {
        let delivery = self.held(lease)?;
        if delivery.attempt >= self.summary.max_attempts {
            self.dead_letter(lease.partition, lease.sequence, format!("max_attempts: {reason}"), now);
            return Ok(RetryOutcome::DeadLettered);
        }
        let wait = delay.unwrap_or_else(|| self.backoff.delay(delivery.attempt));
        let available_at = now.saturating_add(wait);
        if let Some(part) = self.parts.get_mut(&lease.partition) {
            part.reschedule(lease.sequence, now, available_at);
        }
        self.log(Op::Reschedule { p: lease.partition, seq: lease.sequence, now, ready_at: available_at });
        Ok(RetryOutcome::Scheduled { available_at })
    }

    /// Dead-letters a delivery.
    pub(crate) fn reject(&mut self, lease: &LeaseRef, reason: &str, now: Timestamp) -> Result<()> {
        self.held(lease)?;
        self.dead_letter(lease.partition, lease.sequence, reason.to_owned(), now);
        Ok(())
    }

    /// Reopens deliveries; returns how many settled events were reopened.
    pub(crate) fn replay(&mut self, src: &dyn EventSource, opts: &ReplayOptions) -> Result<u64> {
        let (stream, group) = (src.stream(), self.summary.name.clone());
        let mode = opts.mode(stream, &group)?;
        let scope = self.scope(src, opts.partitions.as_deref())?;
        let mut reopened = 0;
        let mut dead_orders = Vec::new();
        let starts: Vec<(u32, u64)> = match mode {
            ReplayMode::Sequence(from) => scope.iter().map(|&p| (p, from)).collect(),
            ReplayMode::Time(t) => {
                let mut starts = Vec::new();
                for &p in &scope {
                    if let Some(seq) = src.first_at_or_after(p, t)? {
                        starts.push((p, seq - 1));
                    }
                }
                if starts.is_empty() {
                    return Err(Error::NoEventsInRange {
                        stream: stream.to_owned(),
                        group,
                        detail: format!("no event at or after {t} in partitions {scope:?}"),
                    });
                }
                starts
            }
            ReplayMode::Query(q) => {
                for p in q.partitions(src.partition_count()).into_iter().filter(|p| scope.contains(p)) {
                    let Some(part) = self.parts.get_mut(&p) else { continue };
                    let mut seqs = Vec::new();
                    src.matching(p, q, &mut |seq| {
                        let (done, dead) = part.reopen_one(seq);
                        if done {
                            seqs.push(seq);
                        }
                        dead_orders.extend(dead);
                    })?;
                    reopened += seqs.len() as u64;
                    if !seqs.is_empty() && self.journal.is_some() {
                        self.log(Op::ReopenOne { p, seqs });
                    }
                }
                Vec::new()
            }
        };
        for (p, after) in starts {
            if let Some(part) = self.parts.get_mut(&p) {
                let (n, dead) = part.reopen_after(after, src.high_watermark(p));
                reopened += n;
                dead_orders.extend(dead);
                self.log(Op::ReopenAfter { p, after });
            }
        }
        for order in dead_orders {
            self.dead_order.remove(&order);
        }
        Ok(reopened)
    }

    /// Clears the group's state in scope and restarts it at `opts.start`.
    pub(crate) fn reset(&mut self, src: &dyn EventSource, opts: &ResetOptions) -> Result<()> {
        if let StartPosition::AfterPerPartition(m) = &opts.start {
            check_partitions(src.stream(), &m.keys().copied().collect::<Vec<_>>(), src.partition_count())?;
        }
        let scope = self.scope(src, opts.partitions.as_deref())?;
        let frontiers = scope.iter().map(|&p| start_frontier(src, &opts.start, p)).collect::<Result<Vec<_>>>()?;
        for (p, frontier) in scope.into_iter().zip(frontiers) {
            self.reset_part(p, frontier);
            self.log(Op::Reset { p, frontier });
        }
        Ok(())
    }

    fn reset_part(&mut self, p: u32, frontier: u64) {
        if let Some(part) = self.parts.get_mut(&p) {
            for info in part.dead.values() {
                self.dead_order.remove(&info.order);
            }
            *part = PartState::starting_after(frontier);
        }
    }

    /// Lag per partition of the group (or of `partitions`).
    pub(crate) fn lag(&self, src: &dyn EventSource, partitions: Option<&[u32]>) -> Result<Lag> {
        let scope = self.scope(src, partitions)?;
        Ok(self.lag_of(src, &scope))
    }

    fn lag_of(&self, src: &dyn EventSource, scope: &[u32]) -> Lag {
        let per = scope
            .iter()
            .filter_map(|&p| {
                let part = self.parts.get(&p)?;
                Some(PartitionLag::new(p, src.high_watermark(p), part.frontier))
            })
            .collect();
        Lag::new(src.stream(), &self.summary.name, per)
    }

    /// Lag, in-flight, waiting and dead-letter counts.
    pub(crate) fn info(&mut self, src: &dyn EventSource, now: Timestamp) -> GroupInfo {
        // Backoffs that have passed are claimable, not waiting.
        self.parts.values_mut().for_each(|part| part.fire_timers(now));
        let scope: Vec<u32> = self.parts.keys().copied().collect();
        let (inflight, retry_waiting) =
            self.parts.values().map(PartState::counts).fold((0, 0), |(a, b), (l, w)| (a + l, b + w));
        GroupInfo {
            summary: self.summary.clone(),
            lag: self.lag_of(src, &scope),
            inflight,
            retry_waiting,
            dead_letters: self.dead_order.len() as u64,
        }
    }

    /// Dead letters, oldest first, after the one of `opts.after`.
    pub(crate) fn dead_letters(&self, src: &dyn EventSource, opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        let start = match &opts.after {
            None => 0,
            Some(id) => {
                let not_found = || Error::CursorNotFound {
                    scope: format!("dead letters of {:?}/{:?}", src.stream(), self.summary.name),
                    cursor: id.clone(),
                };
                let (p, seq) = src.position_of(id)?.ok_or_else(not_found)?;
                let info = self.parts.get(&p).and_then(|part| part.dead.get(&seq)).ok_or_else(not_found)?;
                info.order.saturating_add(1)
            }
        };
        let mut out = Vec::new();
        for &(p, seq) in self.dead_order.range(start..).map(|(_, v)| v).take(opts.limit) {
            let Some(info) = self.parts.get(&p).and_then(|part| part.dead.get(&seq)) else { continue };
            out.push(DeadLetter {
                event: src.event(p, seq)?,
                reason: info.reason.clone(),
                attempts: info.attempts,
                dead_lettered_at: info.at,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::new_lease_id;

    #[test]
    fn lease_ids_are_distinct_version_4_uuids() {
        let ids: Vec<uuid::Uuid> = (0..1000).map(|_| uuid::Uuid::from_u128(new_lease_id())).collect();
        let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        for id in &ids {
            assert_eq!(id.get_version_num(), 4, "{id}");
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122, "{id}");
            assert_eq!(uuid::Uuid::try_parse(&id.to_string()).ok().as_ref(), Some(id));
        }
    }
}
