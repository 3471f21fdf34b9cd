//! Idempotent appends: which events of a batch write nothing because
//! their producer-given id is already stored (or earlier in the batch),
//! shared by every backend. Each backend finds the stored ids its own way
//! (a window of recent ids, a primary key) and hands them here.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::model::event::{NewEvent, Position};

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
pub(crate) fn dedupe_plan(events: &[NewEvent], known: &BTreeMap<String, Position>) -> Vec<Plan> {
    let mut first: BTreeMap<&str, usize> = BTreeMap::new();
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            if !e.id_given {
                return Plan::Store;
            }
            if let Some(&at) = known.get(e.id.as_str()) {
                return Plan::Original(at);
            }
            if let Some(&k) = first.get(e.id.as_str()) {
                return Plan::SameAs(k);
            }
            first.insert(&e.id, i);
            Plan::Store
        })
        .collect()
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
