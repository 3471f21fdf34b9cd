//! Per-key order within a partition (`GroupOptions::ordered_by_key`,
//! docs/semantics.md "Per-key order").
//!
//! Each keyed position a group has materialized and not settled is queued
//! under a 64-bit hash of its key; two keys sharing a hash are ordered as
//! one (more order than asked, never less). A position is claimable only
//! when it heads its key's queue and no other position of that key is
//! leased (only a replay can put a leased position behind an unsettled
//! one). `ready` holds claimable positions only, so a position waiting for
//! its key costs a fetch nothing until the one before it settles.
//!
//! The queues are derived, not journaled: a fetch learns a position's key
//! when it reads the event; a group reopened from a delivery log would
//! have to learn the keys of its materialized deliveries from the log
//! (the native step of ADR 0037). A materialized position whose key is not
//! known yet (a reopened one) is claimable until a fetch reads it, which
//! checks its key before claiming it.

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;

/// The hash a key is ordered by.
pub(crate) fn key_hash(key: &str) -> u64 {
    foldhash::fast::FixedState::with_seed(0x5248_454f_4b45_5953).hash_one(key)
}

/// A map keyed by a key hash or a sequence: foldhash, not SipHash (the
/// keys are not chosen by a peer over a network, and a fetch and a settle
/// look them up per event).
pub(crate) type U64Map<V> = HashMap<u64, V, foldhash::fast::RandomState>;

/// The key queues of one (group, partition); the group state's
/// transitions keep them (`PartState`'s key methods).
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyOrder {
    /// Key hash -> its materialized, unsettled positions (never empty: a
    /// queue is removed with its last position).
    pub(crate) queues: U64Map<Queue>,
    /// Position -> its key hash, for the positions in `queues`.
    pub(crate) of: U64Map<u64>,
    /// Key hash -> its position held under a lease.
    pub(crate) leased: U64Map<u64>,
}

/// The positions of one key, in order. Most keys have one unsettled
/// position at a time, kept without an allocation of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Queue {
    /// One position.
    One(u64),
    /// Two or more.
    Many(BTreeSet<u64>),
}

impl Queue {
    /// Its first position.
    pub(crate) fn first(&self) -> Option<u64> {
        match self {
            Queue::One(s) => Some(*s),
            Queue::Many(set) => set.first().copied(),
        }
    }

    /// Its second position.
    pub(crate) fn second(&self) -> Option<u64> {
        match self {
            Queue::One(_) => None,
            Queue::Many(set) => set.iter().nth(1).copied(),
        }
    }

    /// Adds `seq`.
    pub(crate) fn insert(&mut self, seq: u64) {
        match self {
            Queue::One(s) if *s == seq => {}
            Queue::One(s) => *self = Queue::Many(BTreeSet::from([*s, seq])),
            Queue::Many(set) => {
                set.insert(seq);
            }
        }
    }

    /// Removes `seq`; true when nothing is left (the caller drops it).
    #[must_use]
    pub(crate) fn remove(&mut self, seq: u64) -> bool {
        match self {
            Queue::One(s) => *s == seq,
            Queue::Many(set) => {
                set.remove(&seq);
                set.is_empty()
            }
        }
    }
}

/// What per-key order lets a fetch do with a keyed position it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyTurn {
    /// Nothing of its key is ahead of it: it may be claimed (or set aside
    /// until its time).
    Free,
    /// An earlier position of its key is unsettled, or another is leased.
    Behind,
}

#[cfg(test)]
mod tests {
    use super::Queue;

    #[test]
    fn a_queue_keeps_its_positions_in_order_and_says_when_it_is_empty() {
        let mut q = Queue::One(7);
        assert_eq!((q.first(), q.second()), (Some(7), None));
        q.insert(7);
        assert_eq!(q, Queue::One(7), "a position is queued once");
        q.insert(3);
        q.insert(9);
        assert_eq!((q.first(), q.second()), (Some(3), Some(7)));
        assert!(!q.remove(3));
        assert!(!q.remove(4), "removing what is not there leaves the rest");
        assert_eq!((q.first(), q.second()), (Some(7), Some(9)));
        assert!(!q.remove(7));
        assert!(q.remove(9));
        assert!(!Queue::One(1).remove(2));
        assert!(Queue::One(1).remove(1));
    }
}
