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

/// The key queues of one (group, partition); the group state's
/// transitions keep them (`PartState`'s key methods).
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyOrder {
    /// Key hash -> its materialized, unsettled positions.
    pub(crate) queues: HashMap<u64, BTreeSet<u64>>,
    /// Position -> its key hash, for the positions in `queues`.
    pub(crate) of: HashMap<u64, u64>,
    /// Key hash -> its position held under a lease.
    pub(crate) leased: HashMap<u64, u64>,
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
