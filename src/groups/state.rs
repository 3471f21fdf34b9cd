//! The delivery state of one (group, partition) and its transitions.
//!
//! Costs (n = deliveries materialized and unsettled in the partition):
//! a claim, settle or timer firing is O(log n); `fetch(limit)` is
//! O(limit · log n) plus the timers that came due. Sequences above the
//! materialization cursor cost nothing until claimed, and settled sequences
//! above the frontier are kept as ranges, so memory follows what is in
//! flight and unsettled, not the length of the log.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::keys::{KeyOrder, KeyTurn, Queue};
use crate::model::time::Timestamp;
use crate::rangeset::RangeSet;

/// Where a materialized, unsettled delivery stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holding {
    /// Claimable (in `ready`).
    Available,
    /// Claimed; claimable again once `expires_at` passes. The lease id is a
    /// UUID kept as its 128 bits (16 bytes, not a 36-byte string).
    Leased { lease_id: u128, consumer_id: Arc<str>, expires_at: Timestamp },
    /// Retried; claimable again at `ready_at`.
    Waiting { ready_at: Timestamp },
}

#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) attempt: u32,
    pub(crate) holding: Holding,
}

#[derive(Debug, Clone)]
pub(crate) struct DeadInfo {
    pub(crate) reason: String,
    pub(crate) attempts: u32,
    pub(crate) at: Timestamp,
    /// Position in the group's dead-letter order.
    pub(crate) order: u64,
}

/// What [`PartState::counts`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) leased: u64,
    pub(crate) retry_waiting: u64,
    pub(crate) scheduled: u64,
    pub(crate) next_due: Option<Timestamp>,
}

impl std::ops::Add for Counts {
    type Output = Counts;
    fn add(self, o: Counts) -> Counts {
        Counts {
            leased: self.leased + o.leased,
            retry_waiting: self.retry_waiting + o.retry_waiting,
            scheduled: self.scheduled + o.scheduled,
            next_due: match (self.next_due, o.next_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// One group's view of one partition.
#[derive(Debug, Clone, Default)]
pub(crate) struct PartState {
    /// Every sequence <= frontier is acked or dead-lettered.
    pub(crate) frontier: u64,
    /// The frontier the partition (re)started at, lowered by replays from a
    /// sequence or time: sequences up to here may be settled without having
    /// been appended (a start after a sequence not yet appended).
    pub(crate) floor: u64,
    /// Sequences above the cursor were never claimed since the last
    /// (re)start, except those still in `deliveries` or `done`.
    pub(crate) cursor: u64,
    /// Acked or dead-lettered sequences above the frontier.
    pub(crate) done: RangeSet,
    /// Materialized, unsettled deliveries.
    pub(crate) deliveries: BTreeMap<u64, Delivery>,
    /// Claimable materialized sequences.
    pub(crate) ready: BTreeSet<u64>,
    /// (due time, sequence) of lease expiries and retry backoffs.
    pub(crate) timers: BTreeSet<(Timestamp, u64)>,
    /// Dead letters by sequence.
    pub(crate) dead: BTreeMap<u64, DeadInfo>,
    /// Events retention dropped before they were settled, since the group
    /// was created (a reset keeps it).
    pub(crate) skipped: u64,
    /// The key queues, when the group orders by key (see `keys`).
    pub(crate) keys: Option<Box<KeyOrder>>,
}

impl PartState {
    /// A partition state whose first delivery is `frontier + 1`.
    pub(crate) fn starting_after(frontier: u64) -> Self {
        PartState { frontier, floor: frontier, cursor: frontier, ..PartState::default() }
    }

    /// Moves every timer due at `now` into `ready`.
    pub(crate) fn fire_timers(&mut self, now: Timestamp) {
        while let Some(&(due, seq)) = self.timers.first() {
            if due > now {
                break;
            }
            self.timers.pop_first();
            let Some(d) = self.deliveries.get_mut(&seq) else { continue };
            let expired = match d.holding {
                Holding::Waiting { .. } => {
                    d.holding = Holding::Available;
                    false
                }
                Holding::Leased { .. } => true,
                Holding::Available => false,
            };
            if expired {
                // An expired lease releases its key.
                self.key_released(seq);
            }
            self.make_ready(seq);
        }
    }

    /// The next claimable sequence (materializing it when it comes from
    /// above the cursor), or None. Sequences come out ascending. (The
    /// reference for [`PartState::plan`], which fetches use.)
    #[cfg(test)]
    pub(crate) fn next_claimable(&mut self, high_watermark: u64) -> Option<u64> {
        loop {
            let ready = self.ready.first().copied();
            let fresh = (self.cursor < high_watermark).then(|| self.cursor + 1);
            match (ready, fresh) {
                (Some(r), Some(f)) if r <= f => {
                    if r == f {
                        self.cursor = f;
                    }
                    return Some(r);
                }
                (_, Some(f)) => {
                    self.cursor = f;
                    if self.deliveries.contains_key(&f) || self.done.contains(f) || f <= self.frontier {
                        continue;
                    }
                    self.deliveries.insert(f, Delivery { attempt: 0, holding: Holding::Available });
                    self.ready.insert(f);
                    return Some(f);
                }
                (Some(r), None) => return Some(r),
                (None, None) => return None,
            }
        }
    }

    /// The claimable positions after `after`, in ascending order, without
    /// changing anything (call [`PartState::fire_timers`] first): the ready
    /// ones merged with the fresh ones above the cursor up to
    /// `high_watermark` (skipping settled and materialized ones; a replay
    /// can leave ready deliveries above the cursor). Pushes
    /// `(sequence, spent)` to `out`, `spent` when a ready delivery has used
    /// up `max_attempts`; stops once `want` positions that are not spent
    /// are listed, or before a spent one when `spent_left` is 0
    /// (decremented per spent one); nothing after the `want`-th is looked
    /// at. Returns the highest fresh position
    /// examined (0 when none was): every fresh position up to it is listed,
    /// settled or materialized, so the cursor may move up to it.
    pub(crate) fn plan(
        &self,
        high_watermark: u64,
        after: u64,
        want: usize,
        max_attempts: u32,
        spent_left: &mut usize,
        out: &mut Vec<(u64, bool)>,
    ) -> u64 {
        let Some(from) = after.checked_add(1) else { return 0 };
        let mut ready = self.ready.range(from..).copied().peekable();
        let mut next_fresh = self.cursor.max(self.frontier).max(after).checked_add(1);
        let (mut listed, mut walked) = (0, 0);
        while listed < want {
            // The next fresh position that is neither settled nor materialized.
            let fresh = loop {
                let Some(f) = next_fresh.filter(|&f| f <= high_watermark) else { break None };
                if let Some(end) = self.done.end_of(f) {
                    walked = end.min(high_watermark);
                    next_fresh = end.checked_add(1);
                } else if self.deliveries.contains_key(&f) {
                    walked = f;
                    next_fresh = f.checked_add(1);
                } else {
                    break Some(f);
                }
            };
            match (ready.peek().copied(), fresh) {
                (Some(r), f) if f.is_none_or(|f| r < f) => {
                    let spent = self.deliveries.get(&r).is_some_and(|d| super::rules::spent(d.attempt, max_attempts));
                    if spent {
                        if *spent_left == 0 {
                            return walked;
                        }
                        *spent_left -= 1;
                    } else {
                        listed += 1;
                    }
                    out.push((r, spent));
                    ready.next();
                }
                (_, Some(f)) => {
                    // A ready delivery below it was taken by the arm above.
                    listed += 1;
                    out.push((f, false));
                    walked = f;
                    next_fresh = f.checked_add(1);
                }
                _ => return walked,
            }
        }
        walked
    }

    /// Materializes a fresh position (above the cursor) that a fetch passed
    /// over without claiming it (its record could not be read): it stays
    /// claimable, with no attempt counted, and the cursor moves over it.
    pub(crate) fn pass(&mut self, seq: u64) {
        self.cursor = self.cursor.max(seq);
        if seq > self.frontier && !self.done.contains(seq) && !self.deliveries.contains_key(&seq) {
            self.deliveries.insert(seq, Delivery { attempt: 0, holding: Holding::Available });
            self.make_ready(seq);
        }
    }

    /// Stops tracking any timer or readiness of `seq`.
    fn unschedule(&mut self, seq: u64) {
        self.ready.remove(&seq);
        if let Some(d) = self.deliveries.get(&seq) {
            match d.holding {
                Holding::Leased { expires_at, .. } => {
                    self.timers.remove(&(expires_at, seq));
                    self.release_key(seq);
                }
                Holding::Waiting { ready_at } => {
                    self.timers.remove(&(ready_at, seq));
                }
                Holding::Available => {}
            }
        }
    }

    /// Claims `seq` (a claimable position, see [`PartState::plan`]) under a
    /// new lease; the cursor must already be at or above it.
    pub(crate) fn lease(&mut self, seq: u64, lease_id: u128, consumer_id: Arc<str>, expires_at: Timestamp) -> u32 {
        self.unschedule(seq);
        self.timers.insert((expires_at, seq));
        let d = self.deliveries.entry(seq).or_insert(Delivery { attempt: 0, holding: Holding::Available });
        d.attempt = d.attempt.saturating_add(1);
        d.holding = Holding::Leased { lease_id, consumer_id, expires_at };
        let attempt = d.attempt;
        self.key_leased(seq);
        attempt
    }

    /// The delivery at `seq` when it is held under `lease_id`.
    pub(crate) fn held(&self, seq: u64, lease_id: u128) -> Option<&Delivery> {
        self.deliveries
            .get(&seq)
            .filter(|d| matches!(&d.holding, Holding::Leased { lease_id: l, .. } if *l == lease_id))
    }

    /// Extends the lease of `seq` (which must be held). A delivery that is
    /// not leased is left as it is, timer included: a WAL replayed from a
    /// damaged or foreign file may name one, and dropping a retry's timer
    /// would leave it waiting forever.
    pub(crate) fn renew(&mut self, seq: u64, expires_at: Timestamp) {
        if !matches!(self.deliveries.get(&seq), Some(Delivery { holding: Holding::Leased { .. }, .. })) {
            return;
        }
        // An expired lease nobody reclaimed yet is ready: it is held again.
        self.unschedule(seq);
        if let Some(Delivery { holding: Holding::Leased { expires_at: e, .. }, .. }) = self.deliveries.get_mut(&seq) {
            *e = expires_at;
            self.timers.insert((expires_at, seq));
            self.key_leased(seq);
        }
    }

    /// Marks `seq` settled for good and advances the frontier.
    fn mark_done(&mut self, seq: u64) {
        if seq <= self.frontier {
            // Only a replayed log can settle twice; it is already settled.
            return;
        }
        self.done.insert(seq);
        if let Some(end) = self.done.take_range_at(self.frontier + 1) {
            self.frontier = end;
        }
    }

    /// Acknowledges `seq` (which must be held).
    pub(crate) fn ack(&mut self, seq: u64) {
        self.unschedule(seq);
        self.deliveries.remove(&seq);
        self.forget_key(seq);
        self.mark_done(seq);
    }

    /// Schedules `seq` (which must be held) to be claimable at `ready_at`.
    pub(crate) fn reschedule(&mut self, seq: u64, now: Timestamp, ready_at: Timestamp) {
        self.unschedule(seq);
        if let Some(d) = self.deliveries.get_mut(&seq) {
            if ready_at <= now {
                d.holding = Holding::Available;
                self.make_ready(seq);
            } else {
                d.holding = Holding::Waiting { ready_at };
                self.timers.insert((ready_at, seq));
            }
            self.resettle_key(seq);
        }
    }

    /// Dead-letters `seq` (which must be materialized).
    pub(crate) fn dead_letter(&mut self, seq: u64, reason: String, at: Timestamp, order: u64) {
        self.unschedule(seq);
        let attempts = self.deliveries.remove(&seq).map_or(0, |d| d.attempt);
        self.forget_key(seq);
        self.dead.insert(seq, DeadInfo { reason, attempts, at, order });
        self.mark_done(seq);
    }

    /// Reopens every sequence > `s`: settled ones become claimable again with
    /// fresh attempts; in-flight and waiting ones keep their state. Returns
    /// how many settled events were reopened and the dead letters removed.
    pub(crate) fn reopen_after(&mut self, s: u64, high_watermark: u64) -> (u64, Vec<u64>) {
        // Sequences above the high watermark (a start past it) hold no event.
        let mut reopened = self.frontier.min(high_watermark).saturating_sub(s);
        let Some(above) = s.checked_add(1) else { return (0, Vec::new()) };
        // Settled positions above the high watermark hold no event: they
        // are cleared, not counted.
        reopened += self.done.count_in(above, high_watermark);
        self.done.remove_from(above);
        let dead: Vec<u64> = self.dead.split_off(&above).into_values().map(|d| d.order).collect();
        self.frontier = self.frontier.min(s);
        self.floor = self.floor.min(s);
        self.cursor = self.cursor.min(s);
        (reopened, dead)
    }

    /// Reopens exactly `seq` when it is settled. Returns whether it was
    /// reopened and the dead-letter order it had, if any.
    pub(crate) fn reopen_one(&mut self, seq: u64) -> (bool, Option<u64>) {
        let settled = if seq <= self.frontier {
            // Everything between stays settled: keep it as a range.
            if let Some(next) = seq.checked_add(1) {
                self.done.insert_range(next, self.frontier);
            }
            self.frontier = seq - 1;
            true
        } else {
            self.done.remove(seq)
        };
        if !settled {
            return (false, None);
        }
        let dead = self.dead.remove(&seq).map(|d| d.order);
        if seq <= self.cursor {
            // Its key is learned when a fetch reads it.
            self.deliveries.insert(seq, Delivery { attempt: 0, holding: Holding::Available });
            self.make_ready(seq);
        }
        (true, dead)
    }

    /// Forgets everything above `high_watermark`: after a machine crash
    /// under `Batched`/`None` the log may have lost a tail that the delivery
    /// log still mentions. Returns None when nothing was above it, else the
    /// dead-letter orders removed.
    pub(crate) fn clamp(&mut self, high_watermark: u64) -> Option<Vec<u64>> {
        // Settled positions may run up to the floor (a start after a
        // sequence not yet appended); deliveries and dead letters, which
        // only ever come from claims, never go above the high watermark.
        let top = high_watermark.max(self.floor);
        let above = high_watermark.saturating_add(1);
        let settled_above = self.done.remove_from(top.saturating_add(1));
        let changed = self.frontier > top
            || self.cursor > top
            || settled_above > 0
            || self.deliveries.last_key_value().is_some_and(|(&s, _)| s > high_watermark)
            || self.dead.last_key_value().is_some_and(|(&s, _)| s > high_watermark);
        if !changed {
            return None;
        }
        self.frontier = self.frontier.min(top);
        self.cursor = self.cursor.min(top);
        for seq in self.deliveries.split_off(&above).into_keys() {
            self.ready.remove(&seq);
            self.forget_key(seq);
        }
        self.timers.retain(|&(_, seq)| seq <= high_watermark);
        Some(self.dead.split_off(&above).into_values().map(|d| d.order).collect())
    }

    /// Retention dropped every sequence below `start`: the frontier moves to
    /// `start - 1` when it is behind, forgetting the deliveries below
    /// `start` (their leases become stale) and the settled ranges there.
    /// Dead letters stay (listed with their event gone). Returns how many
    /// dropped sequences were not settled, and adds them to `skipped`.
    pub(crate) fn drop_before(&mut self, start: u64) -> u64 {
        let below = start.saturating_sub(1);
        if self.frontier >= below {
            return 0;
        }
        let unsettled = (below - self.frontier) - self.done.count_in(self.frontier + 1, below);
        for seq in self.deliveries.range(..start).map(|(&s, _)| s).collect::<Vec<_>>() {
            self.unschedule(seq);
            self.deliveries.remove(&seq);
            self.forget_key(seq);
        }
        self.done.remove_to(below);
        self.frontier = below;
        self.cursor = self.cursor.max(below);
        if let Some(end) = self.done.take_range_at(below + 1) {
            self.frontier = end;
        }
        self.skipped = self.skipped.saturating_add(unsettled);
        unsettled
    }

    /// The deliveries leased, waiting out a retry's backoff, and set aside
    /// until their scheduled time (waiting with no attempt yet), with the
    /// earliest of those times.
    pub(crate) fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for d in self.deliveries.values() {
            match d.holding {
                Holding::Leased { .. } => c.leased += 1,
                Holding::Waiting { ready_at } if d.attempt == 0 => {
                    c.scheduled += 1;
                    c.next_due = Some(c.next_due.map_or(ready_at, |t: Timestamp| t.min(ready_at)));
                }
                Holding::Waiting { .. } => c.retry_waiting += 1,
                Holding::Available => {}
            }
        }
        c
    }

    /// Sets `seq` aside until `ready_at`: a fetch met its event before its
    /// scheduled time. It becomes a waiting delivery (a lease on it, if an
    /// expired one was still recorded, is gone) keeping its attempts (0
    /// for a fresh position), and the cursor moves over it. A settled
    /// position is left as it is.
    pub(crate) fn park(&mut self, seq: u64, ready_at: Timestamp) {
        self.cursor = self.cursor.max(seq);
        if seq <= self.frontier || self.done.contains(seq) {
            return;
        }
        self.unschedule(seq);
        let d = self.deliveries.entry(seq).or_insert(Delivery { attempt: 0, holding: Holding::Available });
        d.holding = Holding::Waiting { ready_at };
        self.timers.insert((ready_at, seq));
        self.resettle_key(seq);
    }
}

/// Per-key order (see `super::keys`).
impl PartState {
    /// Whether this partition orders by key.
    pub(crate) fn keyed(&self) -> bool {
        self.keys.is_some()
    }

    /// Whether another position of `seq`'s key holds a lease (so `seq`,
    /// whose lease expired, may not be renewed).
    pub(crate) fn key_held_elsewhere(&self, seq: u64) -> bool {
        let Some(k) = &self.keys else { return false };
        let Some(h) = k.of.get(&seq) else { return false };
        k.leased.get(h).is_some_and(|&s| s != seq)
    }

    /// Whether per-key order lets `seq` be claimed now (true for an unkeyed
    /// position, or one whose key is not known yet).
    pub(crate) fn key_free(&self, seq: u64) -> bool {
        let Some(k) = &self.keys else { return true };
        let Some(h) = k.of.get(&seq) else { return true };
        k.queues.get(h).and_then(Queue::first) == Some(seq) && k.leased.get(h).is_none_or(|&s| s == seq)
    }

    /// Whether a position with key hash `h` may go ahead, were it queued:
    /// `taken` holds the keys a fetch being planned already claimed or set
    /// aside.
    pub(crate) fn key_turn(&self, seq: u64, h: u64, taken: &[u64]) -> KeyTurn {
        let Some(k) = &self.keys else { return KeyTurn::Free };
        if taken.contains(&h) {
            return KeyTurn::Behind;
        }
        let first_ok = k.queues.get(&h).and_then(Queue::first).is_none_or(|f| seq <= f);
        if first_ok && k.leased.get(&h).is_none_or(|&s| s == seq) { KeyTurn::Free } else { KeyTurn::Behind }
    }

    /// Marks `seq` claimable: into `ready` when its key lets it go.
    pub(crate) fn make_ready(&mut self, seq: u64) {
        if self.key_free(seq) {
            self.ready.insert(seq);
        }
    }

    /// Queues materialized `seq` under key hash `h` (no-op unless keyed),
    /// and puts what heads the key's queue in or out of `ready`.
    pub(crate) fn learn_key(&mut self, seq: u64, h: u64) {
        let Some(k) = &mut self.keys else { return };
        if let Some(old) = k.of.insert(seq, h) {
            if old == h {
                self.settle_readiness(h);
                return;
            }
            if k.queues.get_mut(&old).is_some_and(|q| q.remove(seq)) {
                k.queues.remove(&old);
            }
            self.settle_readiness(old);
        }
        let Some(k) = &mut self.keys else { return };
        match k.queues.entry(h) {
            Entry::Occupied(mut q) => q.get_mut().insert(seq),
            Entry::Vacant(v) => {
                v.insert(Queue::One(seq));
            }
        }
        // Ready only if it heads the queue (settled below); an unknown key
        // left it ready until now.
        self.ready.remove(&seq);
        let Some(k) = &mut self.keys else { return };
        let expiry = |s: &u64| match self.deliveries.get(s).map(|d| &d.holding) {
            Some(Holding::Leased { expires_at, .. }) => Some(*expires_at),
            _ => None,
        };
        if let Some(mine) = expiry(&seq) {
            // Two leased positions of one key (only a replay makes them: an
            // earlier event reopened and claimed once the later one's lease
            // expired): the key moves only once its holder's lease expired,
            // and the next lease ends after that, so the holder is the one
            // whose lease ends last, whatever order they are learned in.
            if k.leased.get(&h).and_then(expiry).is_none_or(|other| mine > other) {
                k.leased.insert(h, seq);
            }
        }
        self.settle_readiness(h);
    }

    /// A lease on `seq` began.
    pub(crate) fn key_leased(&mut self, seq: u64) {
        let Some(k) = &mut self.keys else { return };
        if let Some(&h) = k.of.get(&seq) {
            // Only a renewal of an expired lease can find the key held by
            // another position: that one keeps it.
            k.leased.entry(h).or_insert(seq);
            self.settle_readiness(h);
        }
    }

    /// The lease on `seq` expired: its key is free for it (or, after a
    /// replay, for the position ahead of it).
    pub(crate) fn key_released(&mut self, seq: u64) {
        if let Some(h) = self.release_key(seq) {
            self.settle_readiness(h);
        }
    }

    /// The lease on `seq` is ending (the caller changes its state and then
    /// calls [`PartState::resettle_key`] or forgets it); returns its key.
    pub(crate) fn release_key(&mut self, seq: u64) -> Option<u64> {
        let k = self.keys.as_mut()?;
        let &h = k.of.get(&seq)?;
        if k.leased.get(&h) == Some(&seq) {
            k.leased.remove(&h);
        }
        Some(h)
    }

    /// `seq` changed state: puts its key's head in or out of `ready`.
    pub(crate) fn resettle_key(&mut self, seq: u64) {
        if let Some(&h) = self.keys.as_ref().and_then(|k| k.of.get(&seq)) {
            self.settle_readiness(h);
        }
    }

    /// `seq` is settled or no longer materialized: its key's next position
    /// may go.
    pub(crate) fn forget_key(&mut self, seq: u64) {
        let Some(k) = &mut self.keys else { return };
        let Some(h) = k.of.remove(&seq) else { return };
        if k.leased.get(&h) == Some(&seq) {
            k.leased.remove(&h);
        }
        if k.queues.get_mut(&h).is_some_and(|q| q.remove(seq)) {
            k.queues.remove(&h);
        }
        self.settle_readiness(h);
    }

    /// This state, ordering by key when `by_key`.
    pub(crate) fn ordered(mut self, by_key: bool) -> Self {
        self.keys = by_key.then(Box::default);
        self
    }

    /// Puts the available positions of key `h` in `ready` exactly when they
    /// may go: only the head of the queue can (the rest were never put in,
    /// or are taken out here after a position queued ahead of them).
    fn settle_readiness(&mut self, h: u64) {
        let Some(k) = &self.keys else { return };
        let Some(q) = k.queues.get(&h) else { return };
        let Some(head) = q.first() else { return };
        let holder = k.leased.get(&h).copied();
        let second = q.second();
        // Claimable: available, or leased with the lease expired (its key
        // released); not while its lease runs or a retry's backoff waits.
        let claimable = holder.is_none_or(|s| s == head)
            && match self.deliveries.get(&head).map(|d| &d.holding) {
                Some(Holding::Available) => true,
                Some(Holding::Leased { .. }) => holder.is_none(),
                Some(Holding::Waiting { .. }) | None => false,
            };
        if claimable {
            self.ready.insert(head);
        } else {
            self.ready.remove(&head);
        }
        // A position queued ahead of the old head took its place: at most
        // the one behind the head can have been ready.
        if let Some(s) = second {
            self.ready.remove(&s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn dropping_moves_the_frontier_counts_what_was_unsettled_and_keeps_dead_letters() {
        let mut p = PartState::starting_after(0);
        // 1 acked, 2 leased, 3 dead, 4 waiting, 5 never claimed, 6 acked.
        for seq in 1..=4 {
            p.cursor = seq;
            p.lease(seq, u128::from(seq), Arc::from("c"), t(100));
        }
        p.cursor = 6;
        p.lease(6, 6, Arc::from("c"), t(100));
        p.ack(1);
        p.dead_letter(3, "bad".into(), t(1), 0);
        p.reschedule(4, t(1), t(50));
        p.ack(6);
        assert_eq!(p.frontier, 1);
        // Drop 1..=5: 2, 4 and 5 were unsettled.
        assert_eq!(p.drop_before(6), 3);
        assert_eq!((p.frontier, p.skipped), (6, 3), "6 was acked: the frontier collapses over it");
        assert!(p.deliveries.is_empty() && p.ready.is_empty() && p.timers.is_empty());
        assert!(p.dead.contains_key(&3), "dead letters stay listed");
        assert!(p.held(2, 2).is_none(), "a dropped lease is stale");
        // Dropping again, or below the frontier, changes nothing.
        assert_eq!(p.drop_before(6), 0);
        assert_eq!(p.drop_before(3), 0);
        assert_eq!((p.frontier, p.skipped), (6, 3));
    }

    #[test]
    fn a_parked_position_waits_for_its_time_unsettled_and_counted_as_scheduled() {
        let mut p = PartState::starting_after(0);
        p.park(2, t(50));
        p.park(4, t(30));
        assert_eq!(p.cursor, 4, "the cursor moves over what was set aside");
        let c = p.counts();
        assert_eq!((c.scheduled, c.next_due, c.retry_waiting, c.leased), (2, Some(t(30)), 0, 0));
        // Fresh 1 and 3 are below the cursor now: a fetch plans them from
        // `ready` only after they are materialized, as a fetch does.
        p.pass(1);
        p.pass(3);
        assert_eq!(p.next_claimable(4), Some(1));
        p.lease(1, 1, "c".into(), t(10));
        p.ack(1);
        p.fire_timers(t(29));
        assert_eq!(p.next_claimable(4), Some(3), "2 and 4 are not due");
        p.lease(3, 3, "c".into(), t(10));
        p.ack(3);
        assert_eq!(p.frontier, 1, "the frontier waits at the parked 2");
        p.fire_timers(t(30));
        assert_eq!(p.next_claimable(4), Some(4));
        assert_eq!(p.lease(4, 4, "c".into(), t(40)), 1, "its first attempt");
        p.fire_timers(t(50));
        assert_eq!(p.next_claimable(4), Some(2));
        // Parking a settled position, or one below the frontier, changes nothing.
        p.ack(4);
        p.park(4, t(99));
        p.park(1, t(99));
        assert_eq!(p.counts().scheduled, 0);
        assert!(p.done.contains(4) && !p.deliveries.contains_key(&1));
    }

    #[test]
    fn frontier_waits_for_the_hole() {
        let mut p = PartState::starting_after(0);
        for _ in 0..3 {
            let s = p.next_claimable(3).expect("claimable");
            p.lease(s, u128::from(s), "c".into(), t(10));
        }
        p.ack(2);
        p.ack(3);
        assert_eq!(p.frontier, 0);
        p.ack(1);
        assert_eq!(p.frontier, 3);
        assert_eq!(p.done.len(), 0);
    }

    #[test]
    fn expired_lease_becomes_claimable_after_timers_fire() {
        let mut p = PartState::starting_after(0);
        let s = p.next_claimable(1).expect("claimable");
        p.lease(s, 0xa, "c".into(), t(10));
        assert_eq!(p.next_claimable(1), None);
        p.fire_timers(t(10));
        assert_eq!(p.next_claimable(1), Some(1));
        assert!(p.held(1, 0xa).is_some(), "an expired lease holds until reclaimed");
        assert_eq!(p.lease(1, 0xb, "c".into(), t(20)), 2);
        assert!(p.held(1, 0xa).is_none());
    }

    #[test]
    fn reopen_one_below_frontier_keeps_the_rest_settled() {
        let mut p = PartState::starting_after(0);
        for _ in 0..5 {
            let s = p.next_claimable(5).expect("claimable");
            p.lease(s, u128::from(s), "c".into(), t(10));
            p.ack(s);
        }
        assert_eq!(p.frontier, 5);
        assert_eq!(p.reopen_one(3), (true, None));
        assert_eq!(p.frontier, 2);
        assert_eq!(p.next_claimable(5), Some(3));
        assert_eq!(p.reopen_one(3), (false, None), "already open");
    }

    #[test]
    fn renewing_a_delivery_that_is_not_leased_keeps_its_timer() {
        // A WAL replayed from a crafted file can renew a retrying delivery;
        // its backoff must still fire (found by the wal_decoder fuzzer).
        let mut p = PartState::starting_after(0);
        let s = p.next_claimable(1).expect("claimable");
        p.lease(s, 0xa, "c".into(), t(10));
        p.reschedule(s, t(5), t(20));
        p.renew(s, t(99));
        assert_eq!((p.counts().leased, p.counts().retry_waiting), (0, 1), "still waiting");
        p.fire_timers(t(20));
        assert_eq!((p.counts().leased, p.counts().retry_waiting), (0, 0), "the backoff fired");
        assert_eq!(p.next_claimable(1), Some(1));
    }

    #[test]
    fn renewing_an_expired_lease_nobody_reclaimed_holds_it_again() {
        let mut p = PartState::starting_after(0);
        let s = p.next_claimable(1).expect("claimable");
        p.lease(s, 0xa, "c".into(), t(10));
        p.fire_timers(t(10));
        p.renew(s, t(30));
        assert_eq!(p.next_claimable(1), None, "held again");
        p.fire_timers(t(30));
        assert_eq!(p.next_claimable(1), Some(1));
    }
}
