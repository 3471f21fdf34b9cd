//! Idempotent appends: which events of a batch write nothing because
//! their producer-given id is already stored (or earlier in the batch),
//! shared by every backend. Each backend finds the stored ids its own way
//! (a window of recent ids, a primary key) and hands them here.

use std::collections::{BTreeMap, HashMap};

use crate::error::{Error, Result};
use crate::model::append::NewEvent;
use crate::model::event::Position;

/// What an append does with each event of a batch whose ids may repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Write it.
    Store,
    /// Nothing: its id is stored already, there.
    Original(Position),
    /// Nothing: the event at this index of the batch has its id.
    SameAs(usize),
}

/// The plan of a batch: events whose producer-given id is in `known` (or
/// earlier in the batch) write nothing.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) fn dedupe_plan(events: &[NewEvent], known: &BTreeMap<String, Position>) -> Vec<Plan> {
    plan_with(events, |i| known.get(events[i].id.as_str()).copied())
}

/// As [`dedupe_plan`], asking `stored(i)` where event `i`'s id is stored
/// (called only for events whose id the producer gave, in order).
pub(crate) fn plan_with(events: &[NewEvent], mut stored: impl FnMut(usize) -> Option<Position>) -> Vec<Plan> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut plan = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        if !e.id_given {
            plan.push(Plan::Store);
        } else if let Some(at) = stored(i) {
            plan.push(Plan::Original(at));
        } else if let Some(&k) = first.get(e.id.as_str()) {
            plan.push(Plan::SameAs(k));
        } else {
            first.insert(&e.id, i);
            plan.push(Plan::Store);
        }
    }
    plan
}

/// Each event's position, given the positions of the stored ones in order.
pub(crate) fn resolve_plan(plan: Vec<Plan>, stored: &[Position]) -> Result<Vec<Position>> {
    let mut next = stored.iter();
    let mut out: Vec<Position> = Vec::with_capacity(plan.len());
    for p in plan {
        let at = match p {
            Plan::Store => {
                *next.next().ok_or_else(|| Error::failed("append", "fewer positions than events to store"))?
            }
            Plan::Original(at) => at,
            Plan::SameAs(k) => {
                let first = out.get(k).ok_or_else(|| Error::failed("append", "a duplicate before its original"))?;
                Position::duplicate_of(first.partition, first.sequence, first.timestamp)
            }
        };
        out.push(at);
    }
    Ok(out)
}
