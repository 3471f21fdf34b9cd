//! The state transitions a group logs, and the snapshot a checkpoint holds.
//!
//! A backend that persists group state (the native delivery table) turns
//! journaling on: every call that changes a [`GroupState`] then leaves the
//! primitive transitions it made in the journal, in order. Applying them to
//! the state as it was before the call, with [`GroupState::apply`], rebuilds
//! the state after it exactly — without the event source, so reopening does
//! not read the log. Timers are not logged: they fire from the clock on the
//! next fetch, as they do live.
//!
//! Both types are encoded with MessagePack (structs as arrays, enums as
//! `{variant: fields}` maps); `format/delivery-wal.md` and
//! `format/checkpoint.md` give the field order.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::GroupState;
use super::state::{DeadInfo, Delivery, Holding, PartState};
use crate::model::group::{Backoff, GroupSummary};
use crate::model::time::Timestamp;
use crate::rangeset::RangeSet;

/// One primitive transition of a group's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Transition {
    /// Claims of partition `p` by one consumer until `expires_at`:
    /// (sequence, lease id) in claim order. Each claim adds one attempt.
    Claim { p: u32, consumer: String, expires_at: Timestamp, leases: Vec<(u64, u128)> },
    /// A fetch moved the cursor over sequences it skipped (in flight or
    /// settled) past the last one it claimed.
    Cursor { p: u32, cursor: u64 },
    /// A held lease's new expiry.
    Renew { p: u32, seq: u64, expires_at: Timestamp },
    /// Acknowledged sequences of partition `p`.
    Ack { p: u32, seqs: Vec<u64> },
    /// A retried delivery, claimable again at `ready_at`.
    Reschedule { p: u32, seq: u64, now: Timestamp, ready_at: Timestamp },
    /// A dead-lettered delivery (its order in the group's dead-letter list is
    /// the next one).
    DeadLetter { p: u32, seq: u64, reason: String, at: Timestamp },
    /// Every sequence above `after` reopened.
    ReopenAfter { p: u32, after: u64 },
    /// These settled sequences reopened.
    ReopenOne { p: u32, seqs: Vec<u64> },
    /// The partition restarted after `frontier`.
    Reset { p: u32, frontier: u64 },
    /// Fresh positions a fetch passed over without claiming them (their
    /// records could not be read): materialized as claimable, with no
    /// attempt counted, and the cursor moved over them. (WAL version 2.)
    Pass { p: u32, seqs: Vec<u64> },
    /// Retention dropped every sequence of partition `p` below `start`: the
    /// frontier moves to `start - 1` when behind, the unsettled dropped
    /// positions are counted as skipped. (WAL version 3.)
    Drop { p: u32, start: u64 },
    /// Positions a fetch met before their event's scheduled delivery time:
    /// (sequence, that time), each set aside as a waiting delivery keeping
    /// its attempts, and the cursor moved over it (see
    /// `PartState::park`). (WAL version 4.)
    Park { p: u32, seqs: Vec<(u64, Timestamp)> },
}

/// A whole group, as a checkpoint and a group-creation record hold it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupSnapshot {
    pub(crate) summary: GroupSummary,
    pub(crate) backoff: Backoff,
    pub(crate) next_dead_order: u64,
    pub(crate) parts: Vec<PartSnapshot>,
}

/// One partition of a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PartSnapshot {
    pub(crate) p: u32,
    pub(crate) frontier: u64,
    /// See `PartState::floor`.
    pub(crate) floor: u64,
    pub(crate) cursor: u64,
    /// Settled ranges above the frontier (inclusive).
    pub(crate) done: Vec<(u64, u64)>,
    pub(crate) deliveries: Vec<DeliverySnapshot>,
    pub(crate) dead: Vec<DeadSnapshot>,
    /// Events retention dropped unsettled (checkpoint version 2; absent,
    /// 0, in version 1).
    #[serde(default)]
    pub(crate) skipped: u64,
}

/// A materialized, unsettled delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DeliverySnapshot {
    pub(crate) seq: u64,
    pub(crate) attempt: u32,
    pub(crate) holding: HoldingSnapshot,
}

/// Where a delivery stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum HoldingSnapshot {
    /// Claimable.
    Available,
    /// Claimed.
    Leased { lease_id: u128, consumer_id: String, expires_at: Timestamp },
    /// Retried, claimable at `ready_at`.
    Waiting { ready_at: Timestamp },
}

/// A dead letter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DeadSnapshot {
    pub(crate) seq: u64,
    pub(crate) reason: String,
    pub(crate) attempts: u32,
    pub(crate) at: Timestamp,
    pub(crate) order: u64,
}

impl GroupState {
    /// Records transitions from now on (see [`GroupState::take_ops`]).
    pub(crate) fn journaled(mut self) -> Self {
        self.journal = Some(Vec::new());
        self
    }

    /// The transitions made since the last call.
    pub(crate) fn take_ops(&mut self) -> Vec<Transition> {
        self.journal.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Logs one acked sequence: added to the last record when that acks the
    /// same partition, so a batch of acks builds no list per lease.
    pub(super) fn log_ack(&mut self, p: u32, seq: u64) {
        /// The acks of one partition a journal entry is sized for.
        const ACKS_AHEAD: usize = 32;
        let Some(journal) = self.journal.as_mut() else { return };
        match journal.last_mut() {
            Some(Transition::Ack { p: last, seqs }) if *last == p => seqs.push(seq),
            _ => {
                // Sized for a batch's acks of one partition, so that they
                // do not grow one reallocation at a time.
                let mut seqs = Vec::with_capacity(ACKS_AHEAD);
                seqs.push(seq);
                journal.push(Transition::Ack { p, seqs });
            }
        }
    }

    /// Records a transition, merging claims and acks into the previous one
    /// where they extend it.
    pub(super) fn log(&mut self, op: Transition) {
        let Some(journal) = self.journal.as_mut() else { return };
        match (journal.last_mut(), op) {
            (
                Some(Transition::Claim { p, consumer, expires_at, leases }),
                Transition::Claim { p: p2, consumer: c2, expires_at: e2, leases: l2 },
            ) if *p == p2 && *consumer == c2 && *expires_at == e2 => leases.extend(l2),
            (Some(Transition::Ack { p, seqs }), Transition::Ack { p: p2, seqs: s2 }) if *p == p2 => seqs.extend(s2),
            (Some(Transition::ReopenOne { p, seqs }), Transition::ReopenOne { p: p2, seqs: s2 }) if *p == p2 => {
                seqs.extend(s2)
            }
            (Some(Transition::Pass { p, seqs }), Transition::Pass { p: p2, seqs: s2 }) if *p == p2 => seqs.extend(s2),
            (_, op) => journal.push(op),
        }
    }

    /// Applies a logged transition (reopening: no event source, no journal).
    /// It makes exactly the calls the live transition made, with no guard of
    /// its own (each record is applied once, by LSN): a guard that the live
    /// call lacked would make a replayed state differ from the live one
    /// whenever the state is odd (a fuzzer's hand-made WAL found one). Every
    /// call is total: odd input changes nothing it should not.
    pub(crate) fn apply(&mut self, op: &Transition) {
        match op {
            Transition::Claim { p, consumer, expires_at, leases } => {
                let Some(part) = self.parts.get_mut(p) else { return };
                let consumer: Arc<str> = Arc::from(consumer.as_str());
                for &(seq, lease_id) in leases {
                    part.cursor = part.cursor.max(seq);
                    part.lease(seq, lease_id, consumer.clone(), *expires_at);
                }
            }
            Transition::Cursor { p, cursor } => {
                if let Some(part) = self.parts.get_mut(p) {
                    part.cursor = part.cursor.max(*cursor);
                }
            }
            Transition::Renew { p, seq, expires_at } => {
                if let Some(part) = self.parts.get_mut(p) {
                    part.renew(*seq, *expires_at);
                }
            }
            Transition::Ack { p, seqs } => {
                if let Some(part) = self.parts.get_mut(p) {
                    for &seq in seqs {
                        part.ack(seq);
                    }
                }
            }
            Transition::Reschedule { p, seq, now, ready_at } => {
                if let Some(part) = self.parts.get_mut(p) {
                    part.reschedule(*seq, *now, *ready_at);
                }
            }
            Transition::DeadLetter { p, seq, reason, at } => self.dead_letter_now(*p, *seq, reason.clone(), *at),
            Transition::ReopenAfter { p, after } => {
                if let Some(part) = self.parts.get_mut(p) {
                    let (_, dead) = part.reopen_after(*after, u64::MAX);
                    for order in dead {
                        self.dead_order.remove(&order);
                    }
                }
            }
            Transition::ReopenOne { p, seqs } => {
                if let Some(part) = self.parts.get_mut(p) {
                    for &seq in seqs {
                        if seq == 0 {
                            continue;
                        }
                        if let (_, Some(order)) = part.reopen_one(seq) {
                            self.dead_order.remove(&order);
                        }
                    }
                }
            }
            Transition::Reset { p, frontier } => self.reset_part(*p, *frontier),
            Transition::Pass { p, seqs } => {
                if let Some(part) = self.parts.get_mut(p) {
                    for &seq in seqs {
                        part.pass(seq);
                    }
                }
            }
            Transition::Drop { p, start } => {
                if let Some(part) = self.parts.get_mut(p) {
                    part.drop_before(*start);
                }
            }
            Transition::Park { p, seqs } => {
                if let Some(part) = self.parts.get_mut(p) {
                    for &(seq, at) in seqs {
                        part.park(seq, at);
                    }
                }
            }
        }
    }

    /// Forgets every position above each partition's high watermark (see
    /// [`PartState::clamp`]). Returns how many partitions changed.
    pub(crate) fn clamp(&mut self, high_watermark: impl Fn(u32) -> u64) -> usize {
        let mut changed = 0;
        for (&p, part) in &mut self.parts {
            if let Some(dead) = part.clamp(high_watermark(p)) {
                changed += 1;
                for order in dead {
                    self.dead_order.remove(&order);
                }
            }
        }
        changed
    }

    /// The whole state, for a checkpoint.
    pub(crate) fn snapshot(&self) -> GroupSnapshot {
        let parts = self
            .parts
            .iter()
            .map(|(&p, part)| PartSnapshot {
                p,
                frontier: part.frontier,
                floor: part.floor,
                cursor: part.cursor,
                done: part.done.iter().collect(),
                deliveries: part
                    .deliveries
                    .iter()
                    .map(|(&seq, d)| DeliverySnapshot {
                        seq,
                        attempt: d.attempt,
                        holding: match &d.holding {
                            Holding::Available => HoldingSnapshot::Available,
                            Holding::Leased { lease_id, consumer_id, expires_at } => HoldingSnapshot::Leased {
                                lease_id: *lease_id,
                                consumer_id: consumer_id.to_string(),
                                expires_at: *expires_at,
                            },
                            Holding::Waiting { ready_at } => HoldingSnapshot::Waiting { ready_at: *ready_at },
                        },
                    })
                    .collect(),
                dead: part
                    .dead
                    .iter()
                    .map(|(&seq, d)| DeadSnapshot {
                        seq,
                        reason: d.reason.clone(),
                        attempts: d.attempts,
                        at: d.at,
                        order: d.order,
                    })
                    .collect(),
                skipped: part.skipped,
            })
            .collect();
        GroupSnapshot {
            summary: self.summary.clone(),
            backoff: self.backoff,
            next_dead_order: self.next_dead_order,
            parts,
        }
    }

    /// Checks what `restore` relies on: partitions, sequences and
    /// dead-letter orders unique and ascending, settled ranges disjoint.
    /// A snapshot that breaks them was not written by this code.
    pub(crate) fn check_snapshot(snap: &GroupSnapshot) -> Result<(), String> {
        let name = &snap.summary.name;
        let mut orders = std::collections::BTreeSet::new();
        let mut last_p = None;
        for ps in &snap.parts {
            if last_p.is_some_and(|l| l >= ps.p) {
                return Err(format!("group {name:?}: partition {} out of order or repeated", ps.p));
            }
            last_p = Some(ps.p);
            let mut end = None::<u64>;
            for &(s, e) in &ps.done {
                if s > e || end.is_some_and(|end| s <= end.saturating_add(1)) {
                    return Err(format!("group {name:?} partition {}: settled range {s}..={e} out of order", ps.p));
                }
                end = Some(e);
            }
            if ps.deliveries.windows(2).any(|w| w[0].seq >= w[1].seq) {
                return Err(format!("group {name:?} partition {}: deliveries out of order or repeated", ps.p));
            }
            if ps.dead.windows(2).any(|w| w[0].seq >= w[1].seq) {
                return Err(format!("group {name:?} partition {}: dead letters out of order or repeated", ps.p));
            }
            for d in &ps.dead {
                if !orders.insert(d.order) {
                    return Err(format!("group {name:?}: dead-letter order {} repeated", d.order));
                }
            }
        }
        Ok(())
    }

    /// The state a snapshot describes (journaling off). Ready sets and timers
    /// are rebuilt from the deliveries. Call `check_snapshot` first.
    pub(crate) fn restore(snap: &GroupSnapshot) -> GroupState {
        let mut parts = BTreeMap::new();
        let mut dead_order = BTreeMap::new();
        // Interned consumer ids: one allocation per consumer, not per lease.
        let mut consumers: BTreeMap<&str, Arc<str>> = BTreeMap::new();
        for ps in &snap.parts {
            let mut part = PartState::starting_after(ps.frontier).ordered(snap.summary.ordered_by_key);
            part.cursor = ps.cursor;
            part.floor = ps.floor;
            part.skipped = ps.skipped;
            let mut done = RangeSet::default();
            for &(s, e) in &ps.done {
                done.insert_range(s, e);
            }
            part.done = done;
            for d in &ps.deliveries {
                let holding = match &d.holding {
                    HoldingSnapshot::Available => {
                        part.ready.insert(d.seq);
                        Holding::Available
                    }
                    HoldingSnapshot::Leased { lease_id, consumer_id, expires_at } => {
                        part.timers.insert((*expires_at, d.seq));
                        let consumer =
                            consumers.entry(consumer_id.as_str()).or_insert_with(|| Arc::from(consumer_id.as_str()));
                        Holding::Leased { lease_id: *lease_id, consumer_id: consumer.clone(), expires_at: *expires_at }
                    }
                    HoldingSnapshot::Waiting { ready_at } => {
                        part.timers.insert((*ready_at, d.seq));
                        Holding::Waiting { ready_at: *ready_at }
                    }
                };
                part.deliveries.insert(d.seq, Delivery { attempt: d.attempt, holding });
            }
            for d in &ps.dead {
                dead_order.insert(d.order, (ps.p, d.seq));
                part.dead.insert(
                    d.seq,
                    DeadInfo { reason: d.reason.clone(), attempts: d.attempts, at: d.at, order: d.order },
                );
            }
            parts.insert(ps.p, part);
        }
        GroupState {
            name: Arc::from(snap.summary.name.as_str()),
            summary: snap.summary.clone(),
            backoff: snap.backoff,
            parts,
            dead_order,
            next_dead_order: snap.next_dead_order,
            journal: None,
        }
    }
}
