//! Retention: a stream's settings changed in the manifest, and retention
//! passes that move the groups behind the new log start (one delivery-WAL
//! record per group, durable first) and then delete whole sealed segments,
//! oldest first (`format/README.md`, "Retention").

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::Engine;
use super::commit::Committer;
use super::commit::Poison;
use super::delivery::EngineParts;
use super::log::manifest::{self, ManifestBody, StreamEntry, StreamSettings};
use super::options::EngineOptions;
use super::stream::Stream;
use crate::error::{Error, Result};
use crate::groups::retention::new_start;
use crate::model::retention::{DroppedRange, GroupSkip, RetentionReport};

/// WAL room for one group's moves: a fixed part and one `Drop` per partition.
const DROP_ROOM: u64 = 64;
const DROP_ROOM_PER_PARTITION: u64 = 24;

impl Engine {
    /// Replaces a stream's settings (retention, dedupe window) in the
    /// manifest; returns its new entry. Nothing is dropped until the next
    /// retention pass. `StreamNotFound`.
    pub fn set_stream_settings(&self, stream: &str, settings: StreamSettings) -> Result<StreamEntry> {
        let inner = &*self.inner;
        inner.poison.check(stream)?;
        let mut m = inner.manifest.lock();
        let mut next = m.clone();
        let Some(entry) = next.streams.iter_mut().find(|s| s.name == stream) else {
            return Err(Error::stream_not_found(stream));
        };
        if entry.settings == settings {
            return Ok(entry.clone());
        }
        entry.settings = settings;
        let entry = entry.clone();
        manifest::store(&*inner.vfs, &next).map_err(|e| inner.poison.absorb(e))?;
        *m = next;
        Ok(entry)
    }

    /// A stream's manifest entry. `StreamNotFound`.
    pub fn stream_entry(&self, stream: &str) -> Result<StreamEntry> {
        self.inner
            .manifest
            .lock()
            .streams
            .iter()
            .find(|s| s.name == stream)
            .cloned()
            .ok_or_else(|| Error::stream_not_found(stream))
    }

    /// What a retention pass needs, shared with the engine.
    pub(crate) fn retention_parts(&self) -> Parts {
        let inner = &*self.inner;
        Parts {
            opts: inner.opts.clone(),
            manifest: inner.manifest.clone(),
            streams: inner.streams.clone(),
            committer: inner.committer.clone(),
            poison: inner.poison.clone(),
        }
    }

    /// Runs one retention pass over a stream at `now_ms` (see
    /// [`Parts::enforce`]).
    pub fn enforce_retention(&self, name: &str, now_ms: i64) -> Result<RetentionReport> {
        self.retention_parts().enforce(name, now_ms)
    }
}

/// The parts of an engine a retention pass uses: held by the background
/// thread instead of the engine, so that the last handle's drop closes the
/// data directory at once (the thread is stopped before they go).
#[derive(Clone)]
pub(crate) struct Parts {
    opts: EngineOptions,
    manifest: Arc<Mutex<ManifestBody>>,
    streams: Arc<RwLock<HashMap<String, Arc<Stream>>>>,
    committer: Arc<Committer>,
    poison: Arc<Poison>,
}

impl Parts {
    fn stream(&self, name: &str) -> Result<Arc<Stream>> {
        self.streams.read().get(name).cloned().ok_or_else(|| Error::stream_not_found(name))
    }

    fn retention_of(&self, name: &str) -> Result<crate::model::retention::Retention> {
        let m = self.manifest.lock();
        let entry = m.streams.iter().find(|s| s.name == name).ok_or_else(|| Error::stream_not_found(name))?;
        Ok(entry.settings.retention())
    }

    /// Runs one retention pass over a stream at `now_ms`, in three steps:
    ///
    /// 1. per partition, the new log start: the first segment the limits
    ///    keep (and, under `interest`, past what every group settled),
    ///    published at once so that readers stop below it;
    /// 2. every group behind a new start moved to it, by one delivery-WAL
    ///    record per group, waited for (durable under `Sync`; a reopen
    ///    moves them again from the segment files whatever was lost);
    /// 3. the segments below each start deleted, oldest first.
    ///
    /// A failure in step 2 or 3 returns the error naming the file; the log
    /// start stays published, and the segments not deleted yet are
    /// deleted by the next pass.
    pub(crate) fn enforce(&self, name: &str, now_ms: i64) -> Result<RetentionReport> {
        self.poison.check(name)?;
        let stream = self.stream(name)?;
        let retention = self.retention_of(name)?;
        let mut report = RetentionReport::new(name);
        if retention.is_unlimited() {
            return Ok(report);
        }
        let _one = stream.retention.lock();
        let mut plan = Vec::new();
        for p in 0..stream.log.partition_count() {
            let part = stream.log.partition(p)?;
            let limits_start = part.limits_start(&retention, now_ms);
            let interest = stream.groups.interest_start(p).map(|i| part.boundary_at_or_below(i));
            let (start, ceiling) = new_start(retention.policy, limits_start, interest);
            if start > part.log_start() {
                report.ceiling_hit |= ceiling;
                part.set_log_start(start);
                plan.push((p, start));
            }
        }
        // Segments a failed pass published but did not delete.
        let pending: Vec<(u32, u64)> = (0..stream.log.partition_count())
            .filter_map(|p| {
                let part = stream.log.partition(p).ok()?;
                let first = part.segments().first().map(|s| s.base_seq)?;
                (first < part.log_start() && !plan.iter().any(|&(q, _)| q == p)).then(|| (p, part.log_start()))
            })
            .collect();
        // Groups behind a start published by an earlier pass that failed
        // before moving them all move too (moving a group again changes
        // nothing).
        let moves: Vec<(u32, u64)> = plan.iter().chain(&pending).copied().collect();
        if !moves.is_empty() {
            self.move_groups(&stream, &moves, &mut report)?;
        }
        for &(p, start) in plan.iter().chain(&pending) {
            if let Some((first, last, bytes)) = stream.log.partition(p)?.delete_segments_before(start)? {
                report.dropped.push(DroppedRange { partition: p, first, last, bytes });
            }
        }
        Ok(report)
    }

    /// Step 2 of a pass: every group's `Drop` transitions, one WAL record
    /// per group, each waited for.
    fn move_groups(&self, stream: &Arc<Stream>, plan: &[(u32, u64)], report: &mut RetentionReport) -> Result<()> {
        let ctx = EngineParts { opts: &self.opts, committer: &self.committer, poison: &self.poison };
        let room = DROP_ROOM + DROP_ROOM_PER_PARTITION * plan.len() as u64;
        for g in stream.groups.list() {
            let (skips, ticket) = match stream.with_group(&ctx, &g.name, room, |gs, _| {
                Ok(plan.iter().map(|&(p, start)| (p, gs.drop_before(p, start))).collect::<Vec<_>>())
            }) {
                Ok(done) => done,
                // Deleted meanwhile: nothing to move.
                Err(Error::GroupNotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            ticket.wait()?;
            for (p, skipped) in skips.into_iter().filter(|&(_, n)| n > 0) {
                report.skipped.push(GroupSkip { group: g.name.clone(), partition: p, skipped });
            }
        }
        Ok(())
    }

    /// One background round: a pass over every stream with a retention,
    /// each failure logged.
    pub(crate) fn round(&self) {
        let now = super::log::stream::now_ms();
        let names: Vec<String> = self
            .manifest
            .lock()
            .streams
            .iter()
            .filter(|s| !s.settings.retention().is_unlimited())
            .map(|s| s.name.clone())
            .collect();
        for name in names {
            match self.enforce(&name, now) {
                Ok(report) => crate::observe::retention(&report),
                Err(e) => tracing::warn!(stream = %name, error = %e, "retention pass failed; the next one retries"),
            }
        }
    }
}
