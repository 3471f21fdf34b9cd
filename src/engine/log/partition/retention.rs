//! Retention on a partition: which sealed segments the limits let go, the
//! log start moved, and the segments below it deleted oldest first
//! (`format/README.md`, "Retention").

use super::*;
use crate::model::retention::Retention;

impl Partition {
    /// The first sequence the limits of `retention` keep at `now_ms`,
    /// always a segment's base: whole sealed segments go, oldest first, and
    /// the active segment never does. A sealed segment goes when every
    /// event in it is older than `max_age`, or when the segments after it
    /// still hold `max_events` events or `max_bytes` bytes.
    pub fn limits_start(&self, retention: &Retention, now_ms: i64) -> u64 {
        let segs = self.segments();
        let total_bytes = self.bytes();
        let hw = self.visible();
        let cutoff = retention.age_cutoff_ms(now_ms);
        let mut dropped_bytes = 0u64;
        let mut start = self.log_start();
        for seg in &segs {
            let Some(f) = seg.footer() else { break };
            if f.last_seq < start {
                continue;
            }
            dropped_bytes += f.records_end.saturating_sub(HEADER_LEN as u64);
            let by_age = cutoff.is_some_and(|c| f.max_ts < c);
            let by_events = retention.max_events.is_some_and(|n| hw.saturating_sub(f.last_seq) >= n);
            let by_bytes = retention.max_bytes.is_some_and(|n| total_bytes.saturating_sub(dropped_bytes) >= n);
            if !(by_age || by_events || by_bytes) {
                break;
            }
            start = f.last_seq + 1;
        }
        start
    }

    /// The base of the segment holding `seq` (the active segment's base when
    /// `seq` is past it): the highest log start at or below `seq` that
    /// drops whole segments only.
    pub fn boundary_at_or_below(&self, seq: u64) -> u64 {
        let map = self.segments.read();
        let active = map.keys().next_back().copied().unwrap_or(1);
        map.range(..=seq).next_back().map_or(self.log_start(), |(&b, _)| b).min(active)
    }

    /// Moves the log start up to `start` (a segment base, see
    /// [`Partition::boundary_at_or_below`]): readers no longer see the
    /// sequences below it. The files go with
    /// [`Partition::delete_segments_before`].
    pub fn set_log_start(&self, start: u64) {
        self.start.fetch_max(start, Ordering::AcqRel);
    }

    /// Deletes every segment below `start`, oldest first: each one's log
    /// file, then a sync of the directory (so that a crash never leaves a
    /// newer segment deleted and an older one back), then its index files.
    /// Returns the sequences and bytes dropped, None when none was. A
    /// failure leaves the segments not yet deleted in place, and says which
    /// file failed.
    pub fn delete_segments_before(&self, start: u64) -> Result<Option<(u64, u64, u64)>> {
        let doomed: Vec<Arc<Segment>> = {
            let map = self.segments.read();
            let active = map.keys().next_back().copied().unwrap_or(1);
            map.range(..start.min(active)).map(|(_, s)| s.clone()).collect()
        };
        let (Some(first), Some(last)) = (doomed.first(), doomed.last()) else { return Ok(None) };
        let range_first = first.base_seq;
        let range_last = last.footer().map_or(start - 1, |f| f.last_seq);
        let mut bytes = 0;
        for seg in &doomed {
            self.segments.write().remove(&seg.base_seq);
            bytes += seg.footer().map_or(0, |f| f.records_end.saturating_sub(HEADER_LEN as u64));
            let vfs = &*self.vfs;
            vfs.remove_file(&seg.log_path).map_err(|e| io_err(vfs, &seg.log_path, "remove", e))?;
            vfs.sync_dir(&self.dir).map_err(|e| sync_err(vfs, &self.dir, e))?;
            for path in [seg.idx_path.clone(), seg.six_path()] {
                match vfs.remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(vfs, &path, "remove", e)),
                }
            }
        }
        self.vfs.sync_dir(&self.dir).map_err(|e| sync_err(&*self.vfs, &self.dir, e))?;
        Ok(Some((range_first, range_last, bytes)))
    }
}

/// Removes the index files (`.idx`, `.six`) of segments whose log file is
/// gone (a crash while retention deleted a segment): derived data with
/// nothing to describe. Names are `<base:020>.<ext>`.
pub(super) fn remove_orphan_indexes(vfs: &dyn Vfs, dir: &str, names: &[String], bases: &[u64]) {
    for n in names {
        let Some((stem, ext)) = n.split_once('.') else { continue };
        if !matches!(ext, "idx" | "six") || stem.len() != 20 {
            continue;
        }
        let Ok(base) = stem.parse::<u64>() else { continue };
        if bases.binary_search(&base).is_ok() {
            continue;
        }
        let path = format!("{dir}/{n}");
        match vfs.remove_file(&path) {
            Ok(()) => {
                tracing::info!(file = %vfs.describe(&path).display(), "removed the index of a segment retention deleted")
            }
            Err(e) => {
                tracing::warn!(file = %vfs.describe(&path).display(), error = %e, "could not remove an orphan index file")
            }
        }
    }
}
