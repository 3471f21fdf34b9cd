//! One stream of the engine, held whole: its log, its secondary indexes and
//! its consumer groups, opened together and kept in one map.
//!
//! The parts depend on each other in one direction only: the indexes read
//! the log, the groups read both (through a `LogSource`), and nothing below
//! this module knows the others are held together.

use std::sync::Arc;

use super::delivery::{DeliveryRecovery, DeliveryTable, EngineParts, LogSource};
use super::index::{IndexStatus, StreamIndex, planner};
use super::log::manifest::StreamEntry;
use super::log::partition::Truncation;
use super::log::stream::StreamLog;
use super::options::EngineOptions;
use super::vfs::Vfs;
use crate::error::{Error, Result};
use crate::groups::{EventSource, GroupState};
use crate::model::query::{Page, Query};

/// A stream's log, indexes and consumer groups.
#[derive(Debug)]
pub struct Stream {
    /// The partitions and the write path.
    pub log: StreamLog,
    /// The secondary indexes over the log.
    pub index: StreamIndex,
    /// The consumer groups' state (the delivery table and its WAL).
    pub(crate) groups: DeliveryTable,
    /// Held by a retention pass: one at a time per stream.
    pub(crate) retention: parking_lot::Mutex<()>,
    /// The native backend's wakeups of this stream's name, found once
    /// rather than looked up by name on every append.
    pub(crate) wakeups: std::sync::OnceLock<Arc<crate::backend::Wakeups>>,
}

impl Stream {
    /// Opens (recovering) or creates a stream's files: the log first, then
    /// the group state, which is checked against the log's end.
    pub(crate) fn open(
        vfs: Arc<dyn Vfs>,
        opts: &EngineOptions,
        entry: &StreamEntry,
        now_ms: i64,
        truncations: &mut Vec<(String, Truncation)>,
    ) -> Result<(Stream, DeliveryRecovery)> {
        let log = StreamLog::open(vfs.clone(), opts, entry, now_ms, truncations)?;
        let (groups, report) = DeliveryTable::open(vfs, opts, &log)?;
        let index = StreamIndex::new(entry.partition_count, &entry.indexes);
        let stream = Stream { log, index, groups, retention: parking_lot::Mutex::new(()), wakeups: Default::default() };
        // Per-key order's queues are derived from the events, not journaled.
        stream.groups.learn_keys(stream.source())?;
        Ok((stream, report))
    }

    /// The stream's name.
    pub fn name(&self) -> &Arc<str> {
        &self.log.name
    }

    /// The log and indexes as the group core reads them.
    pub(crate) fn source(&self) -> LogSource<'_> {
        LogSource { log: &self.log, index: &self.index }
    }

    /// One page of a history query, through the indexes.
    pub fn query_page(&self, q: &Query) -> Result<Page> {
        planner::query_page(&self.log, &self.index, q)
    }

    /// The sequences of partition `p` whose events match `q`, ascending
    /// (see [`planner::matching`]).
    pub fn matching(&self, p: u32, q: &Query, f: &mut dyn FnMut(u64)) -> Result<()> {
        planner::matching(&self.log, &self.index, p, q, f)
    }

    /// The first (partition, sequence) holding the event `id` (see
    /// [`planner::position_of`]).
    pub fn position_of(&self, id: &str) -> Result<Option<(u32, u64)>> {
        planner::position_of(&self.log, &self.index, id)
    }

    /// How far each indexed field is built.
    pub fn index_status(&self) -> Vec<IndexStatus> {
        self.index.status(&self.log)
    }

    /// One round of index building (see [`StreamIndex::build_step`]).
    pub fn build_step(&self, errors: &mut Vec<Error>) -> bool {
        self.index.build_step(&self.log, errors)
    }

    /// Runs `f` on a group's state (see [`DeliveryTable::with_group`]).
    pub(crate) fn with_group<T>(
        &self,
        ctx: &EngineParts<'_>,
        group: &str,
        room: u64,
        f: impl FnOnce(&mut GroupState, &dyn EventSource) -> Result<T>,
    ) -> Result<(T, super::commit::Ticket)> {
        self.groups.with_group(ctx, self.source(), group, room, f)
    }
}
