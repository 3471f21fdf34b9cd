//! A partition's write path: appends (written at once or deferred to the
//! commit thread), rollback of a failed batch, zero-filling ahead, and
//! segment rolls.

use super::*;
use crate::engine::vfs::WINDOW_ALIGN;

/// How far ahead of the copies into a mapped window its pages are brought
/// in ([`WriteWindow::populate`]): asked for again when the copies are
/// half of it from the end of what was asked.
const POPULATE_AHEAD: u64 = 256 << 10;

/// How often, at most, a partition copying into a mapping sets its active
/// segment's modification time (`VfsFile::touch`): well inside the time a
/// read-only view keeps reopening a recently changed directory
/// (`backends::native::readonly`'s racy window, 3 s).
const TOUCH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// The length of a mapped window of the active segment (ADR 0035).
const MAP_WINDOW: u64 = 4 << 20;

/// Index entries are kept in the writer until this many bytes of them (32
/// entries, one per 4 KiB of records) are written together: one `pwrite`
/// per 128 KiB of records instead of one per 4 KiB.
const IDX_WRITE_BYTES: usize = 32 * ENTRY_LEN;

impl Partition {
    /// The current write state, for rolling back a failed batch.
    pub fn mark(w: &Writer) -> Mark {
        Mark {
            end: w.end,
            next_seq: w.next_seq,
            count: w.count,
            max_ts: w.max_ts,
            max_txn: w.max_txn,
            idx_len: w.idx_len,
            idx_pending: w.idx_pending.len(),
            last_index_offset: w.last_index_offset,
            index_len: w.active.index.read().as_ref().map_or(0, Vec::len),
            base_seq: w.active.base_seq,
        }
    }

    /// True when the active segment (which holds at least one record) must
    /// roll before `len` more bytes: they do not fit, or it is older than
    /// `segment_max_age` (so that retention by age can drop it on a stream
    /// that fills segments slowly).
    pub fn needs_roll(&self, w: &Writer, len: u64) -> bool {
        if w.count == 0 {
            return false;
        }
        let full = w.end + len > self.opts.segment_bytes.min(crate::engine::options::MAX_SEGMENT_BYTES);
        let max_age = i64::try_from(self.opts.segment_max_age.as_millis()).unwrap_or(i64::MAX);
        let old = max_age > 0
            && crate::model::time::Timestamp::now().as_millis().saturating_sub(w.active.opened_ms) >= max_age;
        full || old
    }

    /// The active segment's log file.
    pub fn active_file(w: &Writer) -> Arc<dyn VfsFile> {
        w.active.log.clone()
    }

    /// Appends one append's encoded records (sequences from `w.next_seq`,
    /// `count` of them, largest timestamp `max_ts`, transaction `txn` or 0)
    /// at the end of the active segment: written to the file now, or, when
    /// `defer`, kept in the writer until [`Partition::flush`] (group commit).
    /// Returns the file to sync.
    pub fn write(
        &self,
        w: &mut Writer,
        bytes: &[u8],
        count: u64,
        max_ts: i64,
        txn: u64,
        defer: bool,
    ) -> Result<Arc<dyn VfsFile>> {
        let len = bytes.len() as u64;
        // Zero-filling ahead is what can run out of space; it happens here,
        // before anything is appended, so a full disk fails cleanly.
        self.preallocate(w, w.end + len)?;
        if defer {
            w.pending.extend_from_slice(bytes);
        } else {
            self.write_pending(w)?;
            if !self.copy_mapped(w, bytes)?
                && let Err(e) = w.active.log.write_all_at(bytes, w.end)
            {
                return Err(self.undo_partial_write(w, len, e));
            }
        }
        if w.count == 0 || w.end - w.last_index_offset >= INDEX_INTERVAL_BYTES {
            let entry =
                IndexEntry { seq: w.next_seq, offset: w.end, max_ts_before: w.max_ts, max_txn_before: w.max_txn };
            w.idx_pending.extend_from_slice(&entry.encode());
            if w.idx_pending.len() >= IDX_WRITE_BYTES {
                self.write_idx_pending(w);
            }
            w.last_index_offset = w.end;
            if let Some(ix) = w.active.index.write().as_mut() {
                ix.push(entry);
            }
        }
        w.end += len;
        w.next_seq += count;
        w.count += count;
        w.max_ts = w.max_ts.max(max_ts);
        w.max_txn = w.max_txn.max(txn);
        Ok(w.active.log.clone())
    }

    /// Copies records to the end of the active segment through a mapped
    /// window of it instead of writing them (ADR 0035), under `Batched` and
    /// `None`, reserving space ahead first (in steps growing from 64 KiB to
    /// [`MAP_WINDOW`], as zero-filling does). False when they are to be
    /// written instead: the option is off, the file cannot be mapped (then
    /// not tried again in this segment), or the records do not fit in one
    /// window. Fails, changing nothing, only when the disk is full.
    fn copy_mapped(&self, w: &mut Writer, bytes: &[u8]) -> Result<bool> {
        let syncs = matches!(self.opts.durability, crate::engine::Durability::Sync);
        if w.unmapped || syncs || !self.opts.map_writes {
            return Ok(false);
        }
        let (at, end) = (w.end, w.end + bytes.len() as u64);
        let offset = at - at % WINDOW_ALIGN;
        if end > offset + MAP_WINDOW {
            return Ok(false);
        }
        if end > w.reserved_end && !self.reserve_mapped(w, at, end)? {
            return Ok(false);
        }
        if w.window.as_ref().is_none_or(|win| at < win.offset() || end > win.end()) {
            w.window = None;
            match w.active.log.map_window(offset, MAP_WINDOW) {
                Ok(Some(win)) => w.window = Some(win),
                Ok(None) => return Ok(self.unmap(w, None)),
                Err(e) => return Ok(self.unmap(w, Some(e))),
            }
        }
        let Some(win) = w.window.as_mut() else { return Ok(false) };
        // Under `None`, pages ahead are brought in writable by the
        // populating thread, within the reserved space, a step before the
        // copies reach them. Not under `Batched`: each of its syncs would
        // write the pages brought in ahead (zeros), and leave them to fault
        // again when written.
        let none = matches!(self.opts.durability, crate::engine::Durability::None);
        if none && end + POPULATE_AHEAD / 2 > win.populated() {
            win.populate(at, (end + POPULATE_AHEAD).next_multiple_of(WINDOW_ALIGN).min(w.reserved_end));
        }
        if !win.write(at, bytes) {
            return Ok(false);
        }
        // A copy into a page already written changes no modification time:
        // set it, at most every `TOUCH_EVERY`, for read-only views.
        let now = std::time::Instant::now();
        if w.touched.is_none_or(|t| now.saturating_duration_since(t) >= TOUCH_EVERY) {
            if let Err(e) = w.active.log.touch() {
                let file = self.vfs.describe(&w.active.log_path);
                tracing::debug!(file = %file.display(), error = %e, "setting the segment's modification time failed");
            }
            w.touched = Some(now);
        }
        Ok(true)
    }

    /// Reserves the space from `at` through at least `end` for copies into
    /// a mapping. A reservation is never taken from the file's length: a
    /// file's tail may be a hole (recovery cuts a torn tail by truncating
    /// and extending; a sparse copy of the directory does the same), and a
    /// mapped page over a hole is allocated when written, which on a full
    /// disk is `SIGBUS`. A full disk fails with `NoSpace` after trying the
    /// bare `at..end`, and leaves the file's length as it was. False when
    /// the file cannot reserve (the records are written instead).
    fn reserve_mapped(&self, w: &mut Writer, at: u64, end: u64) -> Result<bool> {
        let mut target = step_target(w.reserved_end, end, MAP_WINDOW);
        let log = &*w.active.log;
        let old_len = w.prealloc_end.max(w.end);
        let mut result = log.reserve(at, target);
        if result.as_ref().is_err_and(crate::engine::error::is_no_space) {
            // The bare need, to a whole window alignment: a mapped page must
            // be reserved whole (file system blocks may be smaller than a
            // page, and a page's unreserved blocks would allocate when it is
            // written).
            target = end.next_multiple_of(WINDOW_ALIGN);
            result = log.reserve(at, target);
        }
        match result {
            Ok(true) => {
                w.reserved_end = target;
                w.prealloc_end = w.prealloc_end.max(target);
                Ok(true)
            }
            Ok(false) => Ok(self.unmap(w, None)),
            Err(e) if crate::engine::error::is_no_space(&e) => {
                // A reservation cut short may have grown the file.
                if log.len().is_ok_and(|len| len > old_len)
                    && let Err(e2) = log.set_len(old_len)
                {
                    let file = self.vfs.describe(&w.active.log_path);
                    tracing::warn!(file = %file.display(), error = %e2, "a failed reservation's space could not be given back");
                }
                Err(io_err(&*self.vfs, &w.active.log_path, "reserve space in", e))
            }
            Err(e) => Ok(self.unmap(w, Some(e))),
        }
    }

    /// Stops copying into mapped windows until the next segment (records
    /// are written instead); a failure that made it stop is logged. False.
    fn unmap(&self, w: &mut Writer, failure: Option<std::io::Error>) -> bool {
        if let Some(e) = failure {
            let file = self.vfs.describe(&w.active.log_path);
            tracing::warn!(file = %file.display(), error = %e, "mapping the segment failed; its records are written instead");
        }
        w.window = None;
        w.unmapped = true;
        false
    }

    /// True while records are copied into a mapped window of the active
    /// segment rather than written (ADR 0035).
    #[cfg(test)]
    pub(crate) fn writes_mapped(&self) -> bool {
        self.writer.lock().window.is_some()
    }

    /// Writes the index entries kept in the writer to the segment's index
    /// file. The index is derived data: a failed write is logged and its
    /// entries dropped (seeks in their range scan a little further; a
    /// reopen rebuilds the active segment's index anyway), and entries not
    /// written when the process dies are rebuilt the same way.
    fn write_idx_pending(&self, w: &mut Writer) {
        if w.idx_pending.is_empty() {
            return;
        }
        if w.idx.write_all_at(&w.idx_pending, w.idx_len).is_ok() {
            w.idx_len += w.idx_pending.len() as u64;
        } else {
            let file = self.vfs.describe(&w.active.idx_path);
            tracing::warn!(file = %file.display(), "index write failed; it will be rebuilt");
        }
        w.idx_pending.clear();
    }

    /// Writes the deferred records to the file (under the writer lock).
    /// A failure here cannot be undone (sequences are assigned): poison.
    pub(super) fn write_pending(&self, w: &mut Writer) -> Result<()> {
        if w.pending.is_empty() {
            return Ok(());
        }
        let at = w.end - w.pending.len() as u64;
        w.active.log.write_all_at(&w.pending, at).map_err(|e| {
            let scope = self.vfs.describe(&w.active.log_path).display().to_string();
            crate::engine::error::poisoned(scope, "writing committed records failed", e)
        })?;
        w.pending.clear();
        Ok(())
    }

    /// Writes this partition's deferred records; returns the file to sync.
    pub fn flush(&self) -> Result<Arc<dyn VfsFile>> {
        let mut w = self.writer.lock();
        self.write_pending(&mut w)?;
        Ok(w.active.log.clone())
    }

    /// Writes the deferred records of a writer already locked.
    pub fn flush_locked(&self, w: &mut Writer) -> Result<Arc<dyn VfsFile>> {
        self.write_pending(w)?;
        Ok(w.active.log.clone())
    }

    /// After a failed write: remove what may have reached the file so no
    /// partial record can resurface, and report the failure (a full disk
    /// is `Error::NoSpace`). Nothing is allocated doing so: the part of the
    /// write inside the file's old length (zero-filled space) is zeroed
    /// again, the part past it is cut off, then the file is synced. Only a
    /// failure of that is `Poisoned`.
    pub(super) fn undo_partial_write(&self, w: &Writer, len: u64, e: std::io::Error) -> Error {
        let path = &w.active.log_path;
        let log = &*w.active.log;
        // The file's length before the write (see `Writer::prealloc_end`).
        let old_len = w.prealloc_end.max(w.end);
        let undone = write_zeros(log, w.end, (w.end + len).min(old_len))
            .and_then(|()| if log.len()? > old_len { log.set_len(old_len) } else { Ok(()) })
            .and_then(|()| log.sync_data());
        match undone {
            Ok(()) => io_err(&*self.vfs, path, "write", e),
            Err(e2) => Error::Poisoned {
                scope: self.vfs.describe(path).display().to_string(),
                reason: format!("write failed ({e}) and could not be undone ({e2})"),
                source: Some(Arc::new(e)),
            },
        }
    }

    /// Rolls back the active segment to `mark` (a batch spanning several
    /// partitions failed in another partition).
    pub fn rollback(&self, w: &mut Writer, mark: Mark) -> Result<()> {
        if w.active.base_seq != mark.base_seq || w.end < mark.end {
            return Err(Error::Poisoned {
                scope: self.vfs.describe(&self.dir).display().to_string(),
                reason: "a failed batch spanned a segment roll and cannot be rolled back".into(),
                source: None,
            });
        }
        let deferred = w.pending.len() as u64;
        if w.end - mark.end <= deferred {
            // Still in memory: nothing reached the file.
            let keep = usize::try_from(deferred - (w.end - mark.end)).unwrap_or(0);
            w.pending.truncate(keep);
        } else {
            // The zeros must be durable before anything else is appended, or a
            // crash could bring the rolled-back records back.
            w.pending.clear();
            let file = &*w.active.log;
            write_zeros(file, mark.end, w.end).and_then(|()| file.sync_data()).map_err(|e| {
                let scope = self.vfs.describe(&w.active.log_path).display().to_string();
                crate::engine::error::poisoned(scope, "rolling back a failed batch", e)
            })?;
        }
        w.end = mark.end;
        w.next_seq = mark.next_seq;
        w.count = mark.count;
        w.max_ts = mark.max_ts;
        w.max_txn = mark.max_txn;
        // A batch's partition gets one write after its mark, so at most one
        // entry came since, and at most one write of the kept entries.
        if w.idx_len == mark.idx_len {
            w.idx_pending.truncate(mark.idx_pending);
        } else {
            // The entries kept at the mark were written since, with the new
            // one after them: that one is overwritten by what follows.
            w.idx_len = mark.idx_len + mark.idx_pending as u64;
            w.idx_pending.clear();
        }
        w.last_index_offset = mark.last_index_offset;
        if let Some(ix) = w.active.index.write().as_mut() {
            ix.truncate(mark.index_len);
        }
        Ok(())
    }

    /// Extends the zero-filled region to cover `upto`.
    pub(super) fn preallocate(&self, w: &mut Writer, upto: u64) -> Result<()> {
        let chunk = self.opts.preallocate_bytes;
        // Zero-filling pays off only when every append waits for a sync; in
        // the other modes it would just copy every byte twice.
        let syncs = matches!(self.opts.durability, crate::engine::Durability::Sync);
        if chunk == 0 || !syncs || upto <= w.prealloc_end {
            return Ok(());
        }
        let target = step_target(w.prealloc_end, upto, chunk);
        let from = w.prealloc_end.max(w.end);
        write_zeros(&*w.active.log, from, target)
            .map_err(|e| io_err(&*self.vfs, &w.active.log_path, "preallocate", e))?;
        w.prealloc_end = target;
        Ok(())
    }

    /// Seals the active segment and starts a new one at `w.next_seq`. The
    /// caller first makes every multi-partition batch in it committed.
    pub fn roll(&self, w: &mut Writer, now_ms: i64) -> Result<()> {
        let vfs = &*self.vfs;
        let seg = w.active.clone();
        let poisoned = |what: &str, e: std::io::Error| {
            let scope = vfs.describe(&seg.log_path).display().to_string();
            crate::engine::error::poisoned(scope, &format!("sealing the segment failed at {what}"), e)
        };
        self.write_pending(w)?;
        self.write_idx_pending(w);
        w.window = None;
        let footer = Footer {
            records_end: w.end,
            first_seq: seg.base_seq,
            last_seq: w.next_seq - 1,
            count: w.count,
            max_ts: w.max_ts,
        };
        // Failures before anything is appended (a full disk writing the
        // footer or creating the next segment) take the footer off again:
        // the segment stays active and the append fails cleanly. A crash in
        // between leaves a sealed segment and perhaps a cut-short creation,
        // which recovery removes.
        let unseal = |w: &mut Writer, e: Error| -> Error {
            *seg.footer.write() = None;
            // The zero-filled space past the records is gone: fill it again
            // before the next append (which fails cleanly if it can't).
            w.prealloc_end = w.end;
            w.reserved_end = 0;
            match seg.log.set_len(w.end).and_then(|()| seg.log.sync_data()) {
                Ok(()) => e,
                Err(e2) => Error::Poisoned {
                    scope: vfs.describe(&seg.log_path).display().to_string(),
                    reason: format!("sealing the segment failed ({e}) and it could not be reopened ({e2})"),
                    source: None,
                },
            }
        };
        seg.log.set_len(w.end).map_err(|e| poisoned("truncate", e))?;
        if let Err(e) = seg.log.write_all_at(&footer.encode(), w.end) {
            return Err(unseal(w, io_err(vfs, &seg.log_path, "write the footer of", e)));
        }
        seg.log.sync_data().map_err(|e| poisoned("sync", e))?;
        *seg.footer.write() = Some(footer);
        let next = match create_segment(vfs, &self.dir, self.stream_id, self.partition, w.next_seq, now_ms) {
            Ok(next) => next,
            Err(e @ Error::Poisoned { .. }) => return Err(e),
            Err(e) => {
                // What was created of the next segment must go, or the
                // unsealed segment would no longer be the last one.
                for path in
                    [format!("{}/{}", self.dir, log_name(w.next_seq)), format!("{}/{:020}.idx", self.dir, w.next_seq)]
                {
                    let gone = match vfs.exists(&path) {
                        Ok(true) => vfs.remove_file(&path),
                        Ok(false) => Ok(()),
                        Err(e) => Err(e),
                    };
                    gone.and_then(|()| vfs.sync_dir(&self.dir)).map_err(|e2| Error::Poisoned {
                        scope: vfs.describe(&self.dir).display().to_string(),
                        reason: format!("starting a new segment failed ({e}) and {path} could not be removed ({e2})"),
                        source: None,
                    })?;
                }
                return Err(unseal(w, e));
            }
        };
        self.segments.write().insert(next.active.base_seq, next.active.clone());
        *w = next;
        Ok(())
    }
}

/// Where space filled (or reserved) ahead of writes up to `done` must end to
/// cover `upto`: in steps that grow geometrically from 64 KiB up to `most`,
/// so that thousands of small partitions do not each take a whole `most`.
fn step_target(done: u64, upto: u64, most: u64) -> u64 {
    let step = most.min(done.max(64 << 10));
    upto.div_ceil(step) * step
}

/// Creates a new, empty active segment (header synced, directory synced).
pub(super) fn create_segment(
    vfs: &dyn Vfs,
    dir: &str,
    stream_id: u64,
    partition: u32,
    base: u64,
    now_ms: i64,
) -> Result<Writer> {
    let log_path = format!("{dir}/{}", log_name(base));
    let idx_path = format!("{dir}/{base:020}.idx");
    let log = StickySync::wrap(vfs.open(&log_path, true).map_err(|e| io_err(vfs, &log_path, "create", e))?);
    let header = SegmentHeader { partition, stream_id, base_seq: base, created_ms: now_ms }.encode();
    log.set_len(0).map_err(|e| io_err(vfs, &log_path, "truncate", e))?;
    log.write_all_at(&header, 0).map_err(|e| io_err(vfs, &log_path, "write", e))?;
    let prealloc_end = HEADER_LEN as u64;
    log.sync_data().map_err(|e| sync_err(vfs, &log_path, e))?;
    let idx = vfs.open(&idx_path, true).map_err(|e| io_err(vfs, &idx_path, "create", e))?;
    idx.set_len(0).map_err(|e| io_err(vfs, &idx_path, "truncate", e))?;
    idx.write_all_at(&encode_index_header(base), 0).map_err(|e| io_err(vfs, &idx_path, "write", e))?;
    vfs.sync_dir(dir).map_err(|e| sync_err(vfs, dir, e))?;
    let active = Arc::new(Segment {
        base_seq: base,
        opened_ms: crate::model::time::Timestamp::now().as_millis(),
        log_path,
        idx_path,
        log,
        index: RwLock::new(Some(Vec::new())),
        footer: RwLock::new(None),
    });
    Ok(Writer {
        active,
        idx,
        end: HEADER_LEN as u64,
        prealloc_end,
        idx_len: IDX_HEADER_LEN as u64,
        last_index_offset: HEADER_LEN as u64,
        next_seq: base,
        count: 0,
        max_ts: i64::MIN,
        max_txn: 0,
        pending: Vec::new(),
        window: None,
        unmapped: false,
        reserved_end: 0,
        touched: None,
        idx_pending: Vec::new(),
    })
}
