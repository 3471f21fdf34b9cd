//! The consumer-group core shared by backends that keep group state in
//! process (memory, and the native delivery table): every rule of
//! `docs/semantics.md` about fetch, settles, retries, dead letters, the frontier,
//! replay, reset and lag, over any [`EventSource`].
//!
//! Costs (n = materialized, unsettled deliveries of a partition): a claim,
//! settle or timer is O(log n); `fetch(limit)` is O(limit · log n) plus the
//! timers that came due and one step per partition in scope. Settled
//! sequences above the frontier are kept as ranges, so memory follows what
//! is in flight and unsettled, not the length of the log. Starting at or
//! replaying from a time costs what the source's `first_at_or_after` costs.

pub(crate) mod journal;
pub(crate) mod keys;
pub(crate) mod retention;
pub(crate) mod rules;
pub(crate) mod state;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::model::damage::Damage;
use crate::model::event::Event;
use crate::model::group::{
    Backoff, DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, PartitionLag,
    Replay, ReplayFrom, Reset, StartPosition, check_partitions,
};
use crate::model::lease::{FetchReport, Lease, LeaseId, LeaseRef, RetryOutcome};
use crate::model::query::Query;
use crate::model::time::Timestamp;
use journal::Transition;
use keys::KeyTurn;
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
    /// The events at strictly ascending positions of one partition (which
    /// exist), one outcome per position: `Err(Error::Corrupt)` for a
    /// position whose stored record fails a check, which affects no other.
    /// The outer error is a failure to read at all.
    fn read_each(&self, p: u32, seqs: &[u64]) -> Result<Vec<Result<Event>>> {
        seqs.iter()
            .map(|&seq| self.event(p, seq))
            .map(|r| match r {
                Ok(e) => Ok(Ok(e)),
                Err(e @ Error::Corrupt { .. }) => Ok(Err(e)),
                Err(e) => Err(e),
            })
            .collect()
    }
    /// The first sequence of a partition with a timestamp at or after `t`.
    fn first_at_or_after(&self, p: u32, t: Timestamp) -> Result<Option<u64>>;
    /// Calls `f` with the sequence of every event of a partition matching `q`.
    fn matching(&self, p: u32, q: &Query, f: &mut dyn FnMut(u64)) -> Result<()>;
    /// The position of the event with this id (its first occurrence).
    fn position_of(&self, id: &str) -> Result<Option<(u32, u64)>>;
    /// The first retained sequence of a partition (the log start):
    /// retention dropped every sequence below it.
    fn log_start(&self, _p: u32) -> u64 {
        1
    }
}

/// Spent deliveries (leased on their last attempt, expired) one fetch
/// dead-letters at most, beyond its limit; the rest wait for the next
/// fetch. Bounds the WAL record of a fetch.
pub(crate) const SPENT_PER_FETCH: usize = 64;

/// Damaged positions one fetch reads, reports and passes over at most in
/// each partition, beyond its limit. Bounds the reads of damaged records per
/// fetch and the fetch's WAL record; per partition, so that damage in one
/// partition never holds back another.
pub(crate) const DAMAGE_PER_PARTITION: usize = 64;

/// The most scheduled events one fetch sets aside (ADR 0036), beyond its
/// limit; see [`scheduled_budget`].
pub(crate) const SCHEDULED_PER_FETCH: usize = 1024;

/// The scheduled events a fetch of `limit` sets aside: its limit, at least
/// 64 and at most [`SCHEDULED_PER_FETCH`], shared evenly by the partitions
/// it looks at (each at least one, so a fetch over more partitions than
/// that sets aside one in each: see [`scheduled_room`]); a partition also
/// gets what the partitions before it left unused. Past its share, a
/// partition stops at its next event that is not due yet (the rest wait for
/// the next fetch), and due events before it are still claimed. Bounds a
/// fetch's reads and its WAL record when a group first meets a long run of
/// events scheduled in the future, and keeps one partition's run from
/// holding back the others.
pub(crate) const fn scheduled_budget(limit: usize) -> usize {
    if limit < 64 {
        64
    } else if limit > SCHEDULED_PER_FETCH {
        SCHEDULED_PER_FETCH
    } else {
        limit
    }
}

/// One partition's part of what is left of a fetch's scheduled budget when
/// `partitions_left` partitions (this one included) are still to be looked
/// at: an even share, at least one.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) const fn park_share(left: usize, partitions_left: usize) -> usize {
    let share = match left.checked_div(partitions_left) {
        Some(share) => share,
        None => left,
    };
    if share == 0 { 1 } else { share }
}

/// The most scheduled events a fetch of `limit` over `partitions` sets
/// aside (what its WAL room must hold): its budget, or one per partition
/// when there are more partitions.
pub(crate) const fn scheduled_room(limit: usize, partitions: usize) -> usize {
    let budget = scheduled_budget(limit);
    if partitions > budget { partitions } else { budget }
}

/// The spent deliveries a fetch of `limit` dead-letters at most.
pub(crate) const fn spent_budget(limit: usize) -> usize {
    limit + SPENT_PER_FETCH
}

/// What a fetch read for one partition, before it changes anything.
struct PartPlan {
    p: u32,
    /// (sequence, what to do) in claim order.
    items: Vec<(u64, Planned)>,
    /// The highest fresh position examined (see `PartState::plan`).
    walked: u64,
}

enum Planned {
    /// Out of attempts: dead-letter it.
    Spent,
    /// Read: claim it (with its key's hash when the group orders by key).
    Claim(Event, Option<u64>),
    /// Its record can't be read: leave it, and report it.
    Damaged(Damage),
    /// Scheduled after the fetch's time: set it aside until then (with
    /// its key's hash when the group orders by key).
    Park(Timestamp, Option<u64>),
    /// Behind an unsettled position of its key (its hash): materialize it,
    /// claimable once its key's turn comes.
    Hold(u64),
}

/// The positions of every event matching `q`, per partition it names:
/// what a replay by query reopens (the settled ones among them).
pub(crate) fn query_matches(src: &dyn EventSource, q: &Query) -> Result<Vec<(u32, Vec<u64>)>> {
    let mut matched = Vec::new();
    for p in q.partitions(src.partition_count()) {
        let mut seqs = Vec::new();
        src.matching(p, q, &mut |seq| seqs.push(seq))?;
        matched.push((p, seqs));
    }
    Ok(matched)
}

/// One consumer group's state.
#[derive(Debug)]
pub(crate) struct GroupState {
    pub(crate) summary: GroupSummary,
    /// The group's name, shared by its leases.
    name: Arc<str>,
    backoff: Backoff,
    parts: BTreeMap<u32, PartState>,
    /// Dead-letter order -> (partition, sequence).
    dead_order: BTreeMap<u64, (u32, u64)>,
    next_dead_order: u64,
    /// Transitions made since the last `take_ops`, when journaling.
    journal: Option<Vec<Transition>>,
}

/// The frontier a group starts at in one partition.
/// A start before the log start begins at it.
fn start_frontier(src: &dyn EventSource, start: &StartPosition, p: u32) -> Result<u64> {
    let hw = src.high_watermark(p);
    let first = src.log_start(p).saturating_sub(1);
    Ok(first.max(match start {
        StartPosition::Beginning => 0,
        StartPosition::After(n) => *n,
        StartPosition::AfterPerPartition(m) => m.get(&p).copied().unwrap_or(0),
        StartPosition::At(t) => src.first_at_or_after(p, *t)?.map_or(hw, |seq| seq - 1),
        StartPosition::Latest => hw,
    }))
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
            parts.insert(
                p,
                PartState::starting_after(start_frontier(src, &opts.start, p)?).ordered(opts.ordered_by_key),
            );
        }
        let summary = GroupSummary {
            name: group.to_owned(),
            max_attempts: opts.max_attempts,
            partitions: opts.partitions.as_ref().map(|_| partitions),
            created_at: now,
            ordered_by_key: opts.ordered_by_key,
        };
        Ok(GroupState {
            name: Arc::from(group),
            summary,
            backoff: opts.retry_backoff,
            parts,
            dead_order: BTreeMap::new(),
            next_dead_order: 0,
            journal: None,
        })
    }

    /// Learns the keys of a keyed group's materialized deliveries from the
    /// log: what a group reopened from its delivery log needs before it
    /// hands anything out, since the key queues are derived, not journaled
    /// (a lease restored without its key would let a later event of the key
    /// be claimed beside it). A position whose record cannot be read stays
    /// with its key unknown (claimable, as damage is); a failure to read at
    /// all is returned.
    pub(crate) fn learn_keys(&mut self, src: &dyn EventSource) -> Result<()> {
        const CHUNK: usize = 1024;
        for (&p, part) in &mut self.parts {
            if !part.keyed() {
                continue;
            }
            let (start, end) = (src.log_start(p), src.high_watermark(p));
            let seqs: Vec<u64> = part.deliveries.range(start..=end).map(|(&s, _)| s).collect();
            for chunk in seqs.chunks(CHUNK) {
                let reads = src.read_each(p, chunk)?;
                if reads.len() != chunk.len() {
                    return Err(Error::failed(
                        "opening a keyed group",
                        format!(
                            "group {:?} of stream {:?}: a read of {} positions of partition {p} came back with {}",
                            self.summary.name,
                            src.stream(),
                            chunk.len(),
                            reads.len()
                        ),
                    ));
                }
                for (&seq, read) in chunk.iter().zip(reads) {
                    if let Some(key) = read.ok().as_ref().and_then(Event::key) {
                        part.learn_key(seq, keys::key_hash(key));
                    }
                }
            }
        }
        Ok(())
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
            self.log(Transition::DeadLetter { p, seq, reason: reason.clone(), at: now });
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

    /// Claims up to `opts.limit` deliveries in (partition, sequence) order
    /// and reads their events.
    ///
    /// Every read happens before anything changes: a read that fails (an
    /// I/O error) fails the fetch with nothing claimed, no attempt counted
    /// and nothing journaled. A position whose record fails a check is not
    /// claimed: it is reported in [`FetchReport::damaged`] and the fetch goes
    /// on with the next positions and partitions, so damage blocks only the
    /// positions it covers. Damage has its own budget, per partition
    /// ([`DAMAGE_PER_PARTITION`]), not the limit's: damaged due positions
    /// cannot starve healthy ones, in their partition or another. Past its
    /// budget, a partition stops at its next damaged position (the rest of
    /// it waits for the next fetch) and the fetch goes on with the other
    /// partitions.
    /// A fresh position passed over is materialized (claimable, attempt 0)
    /// so the cursor can move past it.
    pub(crate) fn fetch(&mut self, src: &dyn EventSource, opts: &FetchOptions, now: Timestamp) -> Result<FetchReport> {
        /// The most positions a fetch's per-partition lists are sized for
        /// ahead (they grow past it when a partition has more).
        const PLAN_ROOM: usize = 256;
        let scope = self.scope(src, opts.partitions.as_deref())?;
        let max_attempts = self.summary.max_attempts;
        let mut plans = Vec::new();
        let (mut claims, mut spent_left) = (0, spent_budget(opts.limit));
        // Each partition's share of the scheduled budget, plus what the
        // partitions before it left unused.
        let (park_share, mut park_carry) = ((scheduled_budget(opts.limit) / scope.len().max(1)).max(1), 0);
        // Reused for every partition, sized once for what a fetch claims (up
        // to a bound), so that they do not grow one reallocation at a time.
        let room = opts.limit.min(PLAN_ROOM);
        let (mut listed, mut reads) = (Vec::with_capacity(room), Vec::with_capacity(room));
        for p in scope {
            if claims >= opts.limit {
                break;
            }
            let mut damage_left = DAMAGE_PER_PARTITION;
            // Positions set aside (until their time, or behind their key)
            // share one budget.
            let mut park_here = park_share + park_carry;
            // Keys this plan claimed or set aside: later positions of them
            // wait (per-key order).
            let mut taken: Vec<u64> = Vec::new();
            let Some(part) = self.parts.get_mut(&p) else { continue };
            // Timers are not journaled: firing them changes nothing durable.
            part.fire_timers(now);
            let part = &*part;
            let hw = src.high_watermark(p);
            let mut plan = PartPlan { p, items: Vec::new(), walked: 0 };
            let mut after = 0;
            // After positions set aside, the next plan lists more than the
            // claims left (up to what may still be set aside), so that a
            // small fetch does not read a run of future events one by one.
            let mut widen = false;
            'part: while claims < opts.limit {
                listed.clear();
                let want =
                    if widen { (opts.limit - claims).max(park_here.min(PLAN_ROOM)) } else { opts.limit - claims };
                let walked = part.plan(hw, after, want, max_attempts, &mut spent_left, &mut listed);
                plan.walked = plan.walked.max(walked);
                let Some(&(last, _)) = listed.last() else { break };
                after = last;
                // Sized once for what was found (an idle partition allocates nothing).
                plan.items.reserve(listed.len());
                reads.clear();
                reads.extend(listed.iter().filter(|(_, spent)| !spent).map(|&(seq, _)| seq));
                let mut read = src.read_each(p, &reads)?.into_iter();
                for &(seq, spent) in &listed {
                    if claims == opts.limit {
                        // A widened list holds more than the limit: the rest
                        // waits, and the cursor stays below it.
                        plan.walked = plan.walked.min(seq - 1);
                        break 'part;
                    }
                    if spent {
                        plan.items.push((seq, Planned::Spent));
                        continue;
                    }
                    match read.next() {
                        Some(Ok(event)) => {
                            // Its key's hash and whether its key lets it go,
                            // when the group orders by key.
                            let key = event.key().filter(|_| part.keyed()).map(|k| {
                                let h = keys::key_hash(k);
                                let turn = part.key_turn(seq, h, &taken);
                                if !taken.contains(&h) {
                                    taken.push(h);
                                }
                                (h, turn)
                            });
                            let later = event.deliver_at().filter(|&at| at > now);
                            let hash = key.map(|(h, _)| h);
                            let hold = key.and_then(|(h, turn)| (turn == KeyTurn::Behind).then_some(h));
                            // Not due yet: set aside until its time (and, when
                            // behind its key, until its key's turn too).
                            let planned = match (later, hold) {
                                (None, None) => {
                                    claims += 1;
                                    plan.items.push((seq, Planned::Claim(event, hash)));
                                    continue;
                                }
                                (Some(at), _) => Planned::Park(at, hash),
                                (None, Some(h)) => Planned::Hold(h),
                            };
                            if park_here == 0 {
                                // Out of budget: as for damage below.
                                plan.walked = plan.walked.min(seq - 1);
                                break 'part;
                            }
                            (park_here, widen) = (park_here - 1, true);
                            plan.items.push((seq, planned));
                        }
                        Some(Err(e)) => match Damage::from_error(src.stream(), p, seq, &e) {
                            Some(d) if damage_left > 0 => {
                                damage_left -= 1;
                                plan.items.push((seq, Planned::Damaged(d)));
                            }
                            Some(_) => {
                                // Out of budget: this partition stops here, and
                                // the cursor must not pass what was not looked at.
                                plan.walked = plan.walked.min(seq - 1);
                                break 'part;
                            }
                            None => return Err(e),
                        },
                        None => {
                            return Err(Error::failed(
                                "fetch",
                                format!("a read of {} positions came back short", reads.len()),
                            ));
                        }
                    }
                }
            }
            park_carry = park_here;
            plans.push(plan);
        }
        Ok(self.apply_fetch(plans, opts, now))
    }

    /// The changes of a fetch whose reads are done (nothing here fails).
    fn apply_fetch(&mut self, plans: Vec<PartPlan>, opts: &FetchOptions, now: Timestamp) -> FetchReport {
        let expires_at = now.saturating_add(opts.lease);
        let consumer_id = opts.consumer_id.clone().unwrap_or_default();
        let consumer: Arc<str> = Arc::from(consumer_id.as_str());
        let mut report = FetchReport::default();
        report.leases.reserve(plans.iter().map(|plan| plan.items.len()).sum());
        for PartPlan { p, items, walked } in plans {
            let mut leased = Vec::with_capacity(items.len());
            let (mut passed, mut parked) = (Vec::new(), Vec::new());
            for (seq, planned) in items {
                match planned {
                    Planned::Spent => {
                        // A lease that expired on its last attempt: the consumer
                        // died holding it (a poison pill); stop redelivering.
                        self.dead_letter(p, seq, rules::EXPIRED_ON_LAST_ATTEMPT.to_owned(), now);
                    }
                    Planned::Claim(event, key) => {
                        let Some(part) = self.parts.get_mut(&p) else { continue };
                        part.cursor = part.cursor.max(seq);
                        let lease_id = crate::ids::new_lease_id();
                        let attempt = part.lease(seq, lease_id, consumer.clone(), expires_at);
                        if let Some(h) = key {
                            part.learn_key(seq, h);
                        }
                        leased.push((seq, lease_id));
                        report.leases.push(Lease {
                            lease_id: LeaseId::from_u128(lease_id),
                            receipt: None,
                            group: self.name.clone(),
                            consumer_id: consumer.clone(),
                            attempt,
                            expires_at,
                            event,
                        });
                    }
                    Planned::Damaged(d) => {
                        let Some(part) = self.parts.get_mut(&p) else { continue };
                        if seq > part.cursor {
                            part.pass(seq);
                            passed.push(seq);
                        }
                        report.damaged.push(d);
                    }
                    Planned::Park(at, key) => {
                        let Some(part) = self.parts.get_mut(&p) else { continue };
                        part.park(seq, at);
                        if let Some(h) = key {
                            part.learn_key(seq, h);
                        }
                        parked.push((seq, at));
                    }
                    Planned::Hold(h) => {
                        let Some(part) = self.parts.get_mut(&p) else { continue };
                        if seq > part.cursor {
                            part.pass(seq);
                            passed.push(seq);
                        }
                        part.learn_key(seq, h);
                    }
                }
            }
            report.scheduled += parked.len() as u64;
            if self.journal.is_some() {
                if !leased.is_empty() {
                    self.log(Transition::Claim { p, consumer: consumer_id.clone(), expires_at, leases: leased });
                }
                if !passed.is_empty() {
                    self.log(Transition::Pass { p, seqs: passed });
                }
                if !parked.is_empty() {
                    self.log(Transition::Park { p, seqs: parked });
                }
            }
            // Settled positions examined past the last claim: move the cursor
            // over them so the next fetch does not walk them again.
            if let Some(part) = self.parts.get_mut(&p)
                && walked > part.cursor
            {
                part.cursor = walked;
                self.log(Transition::Cursor { p, cursor: walked });
            }
        }
        report
    }

    /// The delivery a lease names, when it still holds it; else `StaleLease`.
    fn held(&self, lease: &LeaseRef) -> Result<Delivery> {
        let stale = || Error::StaleLease {
            stream: lease.stream.to_string(),
            group: lease.group.to_string(),
            partition: lease.partition,
            sequence: lease.sequence,
            lease_id: lease.lease_id,
        };
        let id = lease.lease_id.as_u128();
        let part = self.parts.get(&lease.partition).ok_or_else(stale)?;
        part.held(lease.sequence, id).cloned().ok_or_else(stale)
    }

    /// Extends a lease; returns the new expiry.
    pub(crate) fn renew(&mut self, lease: &LeaseRef, d: Duration, now: Timestamp) -> Result<Timestamp> {
        self.held(lease)?;
        if self.parts.get(&lease.partition).is_some_and(|part| part.key_held_elsewhere(lease.sequence)) {
            // Its lease expired and its key went to an earlier event (one a
            // replay reopened): renewing would put two of the key in flight.
            return Err(Error::StaleLease {
                stream: lease.stream.to_string(),
                group: lease.group.to_string(),
                partition: lease.partition,
                sequence: lease.sequence,
                lease_id: lease.lease_id,
            });
        }
        let expires_at = now.saturating_add(d);
        if let Some(part) = self.parts.get_mut(&lease.partition) {
            part.renew(lease.sequence, expires_at);
        }
        self.log(Transition::Renew { p: lease.partition, seq: lease.sequence, expires_at });
        Ok(expires_at)
    }

    /// Acknowledges a delivery.
    pub(crate) fn ack(&mut self, lease: &LeaseRef) -> Result<()> {
        self.held(lease)?;
        if let Some(part) = self.parts.get_mut(&lease.partition) {
            part.ack(lease.sequence);
        }
        self.log_ack(lease.partition, lease.sequence);
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
        let decision = rules::retry(delivery.attempt, self.summary.max_attempts, reason, delay, &self.backoff, now);
        let outcome = decision.outcome();
        match decision {
            rules::RetryDecision::DeadLetter { reason } => {
                self.dead_letter(lease.partition, lease.sequence, reason, now);
            }
            rules::RetryDecision::Reschedule { available_at } => {
                if let Some(part) = self.parts.get_mut(&lease.partition) {
                    part.reschedule(lease.sequence, now, available_at);
                }
                let (p, seq) = (lease.partition, lease.sequence);
                self.log(Transition::Reschedule { p, seq, now, ready_at: available_at });
            }
        }
        Ok(outcome)
    }

    /// Dead-letters a delivery.
    pub(crate) fn reject(&mut self, lease: &LeaseRef, reason: &str, now: Timestamp) -> Result<()> {
        self.held(lease)?;
        self.dead_letter(lease.partition, lease.sequence, rules::rejected(reason), now);
        Ok(())
    }

    /// Reopens deliveries; returns how many settled events were reopened.
    pub(crate) fn replay(&mut self, src: &dyn EventSource, replay: &Replay) -> Result<u64> {
        let (stream, group) = (src.stream(), self.summary.name.clone());
        let scope = self.scope(src, replay.partitions.as_deref())?;
        let mut reopened = 0;
        let mut dead_orders = Vec::new();
        let starts: Vec<(u32, u64)> = match &replay.from {
            ReplayFrom::Sequence(from) => scope.iter().map(|&p| (p, *from)).collect(),
            ReplayFrom::Time(t) => {
                let mut starts = Vec::new();
                for &p in &scope {
                    if let Some(seq) = src.first_at_or_after(p, *t)? {
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
            ReplayFrom::Query(q) => {
                // Every match is read before anything changes: a query that
                // fails (damage, an I/O error) reopens nothing.
                let matched = query_matches(src, q)?;
                let (n, dead) = self.reopen_matches(&scope, &matched);
                reopened += n;
                dead_orders.extend(dead);
                Vec::new()
            }
        };
        for (p, after) in starts {
            // A replay from before the log start begins at it.
            let after = after.max(src.log_start(p).saturating_sub(1));
            if let Some(part) = self.parts.get_mut(&p) {
                let (n, dead) = part.reopen_after(after, src.high_watermark(p));
                reopened += n;
                dead_orders.extend(dead);
                self.log(Transition::ReopenAfter { p, after });
            }
        }
        for order in dead_orders {
            self.dead_order.remove(&order);
        }
        Ok(reopened)
    }

    /// Reopens the settled ones of `matched` (from [`query_matches`]) in the
    /// partitions of `opts`'s scope: one step of a replay by query that a
    /// backend applies in several (each a bounded WAL record). Returns how
    /// many were reopened.
    pub(crate) fn replay_matches(
        &mut self,
        src: &dyn EventSource,
        partitions: Option<&[u32]>,
        matched: &[(u32, Vec<u64>)],
    ) -> Result<u64> {
        let scope = self.scope(src, partitions)?;
        let (reopened, dead) = self.reopen_matches(&scope, matched);
        for order in dead {
            self.dead_order.remove(&order);
        }
        Ok(reopened)
    }

    /// Reopens the settled positions of `matched` within `scope`; returns
    /// how many, and the dead-letter orders to drop.
    fn reopen_matches(&mut self, scope: &[u32], matched: &[(u32, Vec<u64>)]) -> (u64, Vec<u64>) {
        let mut reopened = 0;
        let mut dead_orders = Vec::new();
        for (p, seqs) in matched.iter().filter(|(p, _)| scope.contains(p)) {
            let Some(part) = self.parts.get_mut(p) else { continue };
            let mut done = Vec::new();
            for &seq in seqs {
                let (reopened_one, dead) = part.reopen_one(seq);
                if reopened_one {
                    done.push(seq);
                }
                dead_orders.extend(dead);
            }
            reopened += done.len() as u64;
            if !done.is_empty() && self.journal.is_some() {
                self.log(Transition::ReopenOne { p: *p, seqs: done });
            }
        }
        (reopened, dead_orders)
    }

    /// The partitions a group consumes within `requested`, checked.
    pub(crate) fn partitions_in(&self, src: &dyn EventSource, requested: Option<&[u32]>) -> Result<Vec<u32>> {
        self.scope(src, requested)
    }

    /// Clears the group's state in scope and restarts it at `opts.start`.
    pub(crate) fn reset(&mut self, src: &dyn EventSource, opts: &Reset) -> Result<()> {
        if let StartPosition::AfterPerPartition(m) = &opts.start {
            check_partitions(src.stream(), &m.keys().copied().collect::<Vec<_>>(), src.partition_count())?;
        }
        let scope = self.scope(src, opts.partitions.as_deref())?;
        let frontiers = scope.iter().map(|&p| start_frontier(src, &opts.start, p)).collect::<Result<Vec<_>>>()?;
        for (p, frontier) in scope.into_iter().zip(frontiers) {
            self.reset_part(p, frontier);
            self.log(Transition::Reset { p, frontier });
        }
        Ok(())
    }

    fn reset_part(&mut self, p: u32, frontier: u64) {
        if let Some(part) = self.parts.get_mut(&p) {
            for info in part.dead.values() {
                self.dead_order.remove(&info.order);
            }
            // What retention skipped is history: a reset keeps the count.
            let skipped = part.skipped;
            *part = PartState::starting_after(frontier).ordered(part.keyed());
            part.skipped = skipped;
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
                let frontier = part.frontier.max(src.log_start(p).saturating_sub(1));
                Some(PartitionLag::new(p, src.high_watermark(p), frontier))
            })
            .collect();
        Lag::new(src.stream(), &self.summary.name, per)
    }

    /// Lag, in-flight, waiting and dead-letter counts.
    pub(crate) fn info(&mut self, src: &dyn EventSource, now: Timestamp) -> GroupInfo {
        // Backoffs that have passed are claimable, not waiting.
        self.parts.values_mut().for_each(|part| part.fire_timers(now));
        let scope: Vec<u32> = self.parts.keys().copied().collect();
        let counts = self.parts.values().map(PartState::counts).fold(state::Counts::default(), |a, b| a + b);
        GroupInfo {
            summary: self.summary.clone(),
            lag: self.lag_of(src, &scope),
            inflight: counts.leased,
            retry_waiting: counts.retry_waiting,
            dead_letters: self.dead_order.len() as u64,
            retention_skipped: self.parts.values().map(|part| part.skipped).sum(),
            scheduled: counts.scheduled,
            next_due: counts.next_due,
        }
    }

    /// Retention dropped every sequence of partition `p` below `start`:
    /// the group's frontier moves to `start - 1` when it is behind (see
    /// [`PartState::drop_before`]). Returns how many dropped events the
    /// group had not settled (0 for a partition it does not consume).
    pub(crate) fn drop_before(&mut self, p: u32, start: u64) -> u64 {
        let Some(part) = self.parts.get_mut(&p) else { return 0 };
        if part.frontier.saturating_add(1) >= start {
            return 0;
        }
        let skipped = part.drop_before(start);
        self.log(Transition::Drop { p, start });
        skipped
    }

    /// The frontier of partition `p`, when the group consumes it.
    pub(crate) fn frontier(&self, p: u32) -> Option<u64> {
        self.parts.get(&p).map(|part| part.frontier)
    }

    /// Dead letters, oldest first, after the one of `opts.after_position`
    /// (or `opts.after`). An entry whose event can't be read (damage) is
    /// listed with the damage and no event; any other read failure fails
    /// the listing.
    pub(crate) fn dead_letters(&self, src: &dyn EventSource, opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        let scope = || format!("dead letters of {:?}/{:?}", src.stream(), self.summary.name);
        let order_at = |p: u32, seq: u64| self.parts.get(&p).and_then(|part| part.dead.get(&seq)).map(|d| d.order);
        let start = match (&opts.after_position, &opts.after) {
            (Some((p, seq)), _) => order_at(*p, *seq)
                .ok_or_else(|| Error::CursorNotFound { scope: scope(), cursor: format!("{p}:{seq}") })?
                .saturating_add(1),
            (None, Some(id)) => {
                let not_found = || Error::CursorNotFound { scope: scope(), cursor: id.clone() };
                let (p, seq) = src.position_of(id)?.ok_or_else(not_found)?;
                order_at(p, seq).ok_or_else(not_found)?.saturating_add(1)
            }
            (None, None) => 0,
        };
        let mut out = Vec::new();
        for &(p, seq) in self.dead_order.range(start..).map(|(_, v)| v).take(opts.limit) {
            let Some(info) = self.parts.get(&p).and_then(|part| part.dead.get(&seq)) else { continue };
            let dropped = seq < src.log_start(p);
            let read = if dropped { None } else { src.read_each(p, &[seq])?.pop() };
            let (event, damage) = match read {
                None if dropped => (None, None),
                Some(Ok(event)) => (Some(event), None),
                Some(Err(e)) => match Damage::from_error(src.stream(), p, seq, &e) {
                    Some(d) => (None, Some(d)),
                    None => return Err(e),
                },
                None => return Err(Error::failed("dead_letters", format!("no read of partition {p} sequence {seq}"))),
            };
            out.push(DeadLetter {
                partition: p,
                sequence: seq,
                event,
                dropped,
                damage,
                reason: info.reason.clone(),
                attempts: info.attempts,
                dead_lettered_at: info.at,
            });
        }
        Ok(out)
    }

    /// Dead-letters one position without reading its event (an operator's
    /// way past damage), whatever its state: never claimed, claimable,
    /// waiting out a backoff, or leased (whose holder's settles then fail
    /// with `StaleLease`). The reason is recorded as `skipped: <reason>`.
    /// Returns true when it dead-lettered the position, false when it
    /// already was a dead letter. An acknowledged position (or one before
    /// the group's start), one above the high watermark, or a partition the
    /// group does not consume is refused, changing nothing.
    pub(crate) fn skip(
        &mut self,
        src: &dyn EventSource,
        p: u32,
        seq: u64,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool> {
        check_partitions(src.stream(), &[p], src.partition_count())?;
        let group = &self.summary.name;
        let Some(part) = self.parts.get(&p) else {
            return Err(Error::invalid("partition", format!("group {group:?} does not consume partition {p}")));
        };
        let hw = src.high_watermark(p);
        if seq == 0 || seq > hw {
            return Err(Error::invalid(
                "sequence",
                format!("sequence {seq} is not in partition {p} of stream {:?} (it holds 1..={hw})", src.stream()),
            ));
        }
        let start = src.log_start(p);
        if seq < start {
            return Err(Error::invalid(
                "sequence",
                format!(
                    "sequence {seq} of partition {p} of stream {:?} was dropped by retention (the partition starts at {start}): nothing to skip",
                    src.stream()
                ),
            ));
        }
        if part.dead.contains_key(&seq) {
            return Ok(false);
        }
        if seq <= part.frontier || part.done.contains(seq) {
            return Err(Error::invalid(
                "sequence",
                format!(
                    "sequence {seq} of partition {p} is already settled for group {group:?} (acknowledged, or before its start): nothing to skip"
                ),
            ));
        }
        self.dead_letter(p, seq, rules::skipped(reason), now);
        Ok(true)
    }
}
