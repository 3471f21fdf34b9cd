//! One partition's log: a run of segment files, the active one last.
//!
//! Writers hold the partition's writer lock (taken by the stream, in
//! partition order). Readers never take it: they read the segment list and
//! the published `visible` sequence, and never see a record above it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::engine::error::{DecodeError, corrupt, io_err, sync_err};
use crate::engine::options::{EngineOptions, RecoveryMode};
use crate::engine::segment::file::{Footer, IndexEntry, SegmentHeader, decode_index, encode_index_header};
use crate::engine::segment::format::*;
use crate::engine::segment::record::{PROBE, RecordHeader, decode_doc, plausible_frame};
use crate::engine::segment::scan::{Scanner, Step};
use crate::engine::vfs::{StickySync, Vfs, VfsFile};
use crate::error::{Error, Result};
use crate::model::event::{Document, Event};
use crate::model::time::Timestamp;

/// A record read back from a segment.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRecord {
    /// Its fixed fields.
    pub header: RecordHeader,
    /// Its document.
    pub doc: Document,
}

impl StoredRecord {
    /// The event it holds.
    pub fn into_event(self, stream: &Arc<str>, partition: u32) -> Event {
        self.doc.into_event(stream, partition, self.header.seq, Timestamp::from_millis(self.header.ts))
    }
}

/// A record read by [`Partition::scan_lazy`], not decoded yet.
pub struct LazyRecord<'a> {
    /// Its fixed fields.
    pub header: RecordHeader,
    /// Its MessagePack document, as stored.
    pub doc: &'a [u8],
    offset: u64,
    path: &'a str,
    vfs: &'a dyn Vfs,
}

impl LazyRecord<'_> {
    /// The record, its document checked whole (`Error::Corrupt` naming the
    /// file and offset when it is not a valid document).
    pub fn decode(self) -> Result<StoredRecord> {
        let doc = decode_doc(self.doc).map_err(|reason| corrupt(self.vfs, self.path, self.offset, reason))?;
        Ok(StoredRecord { header: self.header, doc })
    }
}

/// One segment file and its index.
#[derive(Debug)]
pub struct Segment {
    /// The sequence of its first record.
    pub base_seq: u64,
    log_path: String,
    idx_path: String,
    log: Arc<dyn VfsFile>,
    /// The sparse index, complete for the records written so far (sealed
    /// segments: loaded on first use).
    index: RwLock<Option<Vec<IndexEntry>>>,
    /// Set when sealed.
    footer: RwLock<Option<Footer>>,
}

impl Segment {
    /// The log file's path.
    pub fn path(&self) -> &str {
        &self.log_path
    }

    /// The footer, when sealed.
    pub fn footer(&self) -> Option<Footer> {
        *self.footer.read()
    }

    /// The path of its secondary-index file (`<base>.six`).
    pub fn six_path(&self) -> String {
        let stem = self.log_path.strip_suffix(".log").unwrap_or(&self.log_path);
        format!("{stem}.six")
    }
}

/// What a raw scan calls per record: (offset, header, MessagePack document,
/// segment) -> go on?
type RawVisitor<'a> = dyn FnMut(u64, RecordHeader, &[u8], &Segment) -> Result<bool> + 'a;

/// The read size of a scan through many records.
const CHUNK_SCAN: usize = 256 << 10;
/// The read size of a point read (a record and a few around it).
const CHUNK_POINT: usize = 8 << 10;
/// The first read of one record at a known offset (most fit).
const CHUNK_RECORD: usize = 1 << 10;

/// Where a scan of the active segment during recovery stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    /// Where the kept records end.
    pub offset: u64,
    /// How many bytes after it were dropped (up to the first zero or EOF).
    pub dropped_bytes: u64,
    /// Why.
    pub reason: &'static str,
}

/// The writer's state of the active segment.
#[derive(Debug)]
pub struct Writer {
    active: Arc<Segment>,
    idx: Arc<dyn VfsFile>,
    /// The end of the written records in the active segment.
    end: u64,
    /// The end of the zero-filled region; the file's length is
    /// `max(prealloc_end, end)` (deferred records not yet written aside).
    prealloc_end: u64,
    idx_len: u64,
    last_index_offset: u64,
    /// The next sequence to assign.
    pub next_seq: u64,
    count: u64,
    max_ts: i64,
    /// The largest transaction id written in the active segment.
    max_txn: u64,
    /// Records appended but not yet written to the file (group commit
    /// writes them, one write per partition per round); they start at file
    /// offset `end - pending.len()`.
    pending: Vec<u8>,
}

/// What a write changed, so that it can be rolled back.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    end: u64,
    next_seq: u64,
    count: u64,
    max_ts: i64,
    max_txn: u64,
    idx_len: u64,
    last_index_offset: u64,
    index_len: usize,
    base_seq: u64,
}

/// Where a partition lives.
#[derive(Debug, Clone)]
pub struct Location {
    /// Its directory.
    pub dir: String,
    /// Its stream's id.
    pub stream_id: u64,
    /// Its number.
    pub partition: u32,
}

/// One partition of a stream.
#[derive(Debug)]
pub struct Partition {
    /// Its number.
    pub partition: u32,
    stream_id: u64,
    dir: String,
    vfs: Arc<dyn Vfs>,
    opts: EngineOptions,
    writer: Mutex<Writer>,
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    visible: AtomicU64,
}

/// Writes zeros over `from..to`, from one shared buffer (allocating and
/// faulting in a fresh zero buffer per call would cost more than the write).
fn write_zeros(file: &dyn VfsFile, from: u64, to: u64) -> std::io::Result<()> {
    static ZEROS: std::sync::OnceLock<Box<[u8]>> = std::sync::OnceLock::new();
    let zeros = ZEROS.get_or_init(|| vec![0u8; 1 << 20].into_boxed_slice());
    let mut at = from;
    while at < to {
        let n = usize::try_from((to - at).min(zeros.len() as u64)).unwrap_or(zeros.len());
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

fn log_name(base_seq: u64) -> String {
    format!("{base_seq:020}.log")
}

impl crate::engine::commit::Deferred for Partition {
    fn flush(&self) -> Result<Arc<dyn VfsFile>> {
        Partition::flush(self)
    }
    fn publish(&self, seq: u64) {
        Partition::publish(self, seq);
    }
}

impl Partition {
    /// Opens (recovering) or creates the partition at `at`. Multi-partition
    /// batches above `committed_txn` are dropped from the tail.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        opts: &EngineOptions,
        at: Location,
        now_ms: i64,
        committed_txn: u64,
        truncations: &mut Vec<(String, Truncation)>,
    ) -> Result<Partition> {
        let Location { dir, stream_id, partition } = at;
        vfs.create_dir_all(&dir).map_err(|e| io_err(&*vfs, &dir, "create", e))?;
        let names = vfs.list(&dir).map_err(|e| io_err(&*vfs, &dir, "list", e))?;
        let mut bases: Vec<u64> = names
            .iter()
            .filter_map(|n| n.strip_suffix(".log").filter(|b| b.len() == 20).and_then(|b| b.parse().ok()))
            .collect();
        bases.sort_unstable();
        // An index file's temporary copy left by a crash mid-write (derived
        // data: the builder writes it again if needed).
        for n in names.iter().filter(|n| n.ends_with(".tmp") && n.contains(".six.")) {
            let path = format!("{dir}/{n}");
            if let Err(e) = vfs.remove_file(&path) {
                tracing::warn!(file = %vfs.describe(&path).display(), error = %e, "could not remove a leftover index file");
            }
        }
        let mut segments = BTreeMap::new();
        let mut expected_base = None;
        // A segment followed by another was sealed: its footer was synced
        // before the next segment was created. Damage to its header or
        // footer (bit rot: they hold nothing its records do not) need not
        // make the partition unreadable: outside strict recovery it is read
        // by what its name and its successor say (each record is still
        // checked when read).
        let tolerant = opts.recovery != RecoveryMode::Strict;
        for (i, &base) in bases.iter().enumerate() {
            let last = i + 1 == bases.len();
            let successor = bases.get(i + 1).copied().filter(|&next| next > base && tolerant);
            let seg = match open_segment(&*vfs, &dir, base, stream_id, partition, successor.is_some()) {
                Ok(seg) => seg,
                Err(e) if last && torn_creation(&*vfs, &dir, base)? => {
                    // A crash while creating the segment: its name reached the
                    // disk but not its header, and no record was ever in it.
                    tracing::warn!(dir = %vfs.describe(&dir).display(), base, error = %e, "removing a segment whose creation was cut short");
                    for ext in ["log", "idx"] {
                        let path = format!("{dir}/{base:020}.{ext}");
                        if vfs.exists(&path).map_err(|e| io_err(&*vfs, &path, "stat", e))? {
                            vfs.remove_file(&path).map_err(|e| io_err(&*vfs, &path, "remove", e))?;
                        }
                    }
                    vfs.sync_dir(&dir).map_err(|e| sync_err(&*vfs, &dir, e))?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(exp) = expected_base
                && base != exp
            {
                return Err(corrupt(
                    &*vfs,
                    &seg.log_path,
                    0,
                    format!("segment starts at sequence {base}, expected {exp}"),
                ));
            }
            match read_footer(&*vfs, &seg)? {
                Some(f) => {
                    if opts.recovery == RecoveryMode::Strict {
                        check_sealed(&*vfs, &seg, &f)?;
                    }
                    expected_base = Some(f.last_seq.saturating_add(1));
                    *seg.footer.write() = Some(f);
                    segments.insert(base, Arc::new(seg));
                }
                None if last => {
                    segments.insert(base, Arc::new(seg));
                }
                None => {
                    let Some(next) = successor else {
                        let why = if tolerant {
                            "a segment before the last one is not sealed"
                        } else {
                            "the footer of a sealed segment is damaged (strict recovery refuses it)"
                        };
                        let len = seg.log.len().map_err(|e| io_err(&*vfs, &seg.log_path, "stat", e))?;
                        return Err(corrupt(&*vfs, &seg.log_path, len.saturating_sub(FOOTER_LEN as u64), why));
                    };
                    let f = inferred_footer(&*vfs, &seg, next)?;
                    tracing::warn!(
                        file = %vfs.describe(&seg.log_path).display(),
                        last_seq = f.last_seq,
                        records_end = f.records_end,
                        "a sealed segment's footer is damaged; its bounds are taken from the next segment and the file's length (each record is still checked when read; `rheo verify` lists it)"
                    );
                    expected_base = Some(next);
                    *seg.footer.write() = Some(f);
                    segments.insert(base, Arc::new(seg));
                }
            }
        }
        let p = |w| Partition {
            partition,
            stream_id,
            dir: dir.clone(),
            vfs: vfs.clone(),
            opts: opts.clone(),
            writer: Mutex::new(w),
            segments: RwLock::new(BTreeMap::new()),
            visible: AtomicU64::new(0),
        };
        let last = segments.values().next_back().cloned();
        let writer = match last {
            Some(seg) if seg.footer().is_none() => {
                let (w, t) = recover_active(&*vfs, opts, seg, committed_txn)?;
                if let Some(t) = t {
                    truncations.push((w.active.log_path.clone(), t));
                }
                w
            }
            Some(seg) => {
                let next = seg.footer().map_or(1, |f| f.last_seq.saturating_add(1));
                create_segment(&*vfs, &dir, stream_id, partition, next, now_ms)?
            }
            None => create_segment(&*vfs, &dir, stream_id, partition, 1, now_ms)?,
        };
        let visible = writer.next_seq - 1;
        segments.insert(writer.active.base_seq, writer.active.clone());
        let part = p(writer);
        *part.segments.write() = segments;
        part.visible.store(visible, Ordering::SeqCst);
        Ok(part)
    }

    /// The last sequence readers may see.
    pub fn visible(&self) -> u64 {
        self.visible.load(Ordering::Acquire)
    }

    /// Makes sequences up to `seq` visible to readers.
    pub fn publish(&self, seq: u64) {
        self.visible.fetch_max(seq, Ordering::AcqRel);
    }

    /// Locks the writer.
    pub fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock()
    }

    /// The current write state, for rolling back a failed batch.
    pub fn mark(w: &Writer) -> Mark {
        Mark {
            end: w.end,
            next_seq: w.next_seq,
            count: w.count,
            max_ts: w.max_ts,
            max_txn: w.max_txn,
            idx_len: w.idx_len,
            last_index_offset: w.last_index_offset,
            index_len: w.active.index.read().as_ref().map_or(0, Vec::len),
            base_seq: w.active.base_seq,
        }
    }

    /// True when `len` more bytes do not fit in the active segment (which
    /// holds at least one record), so it must roll first.
    pub fn needs_roll(&self, w: &Writer, len: u64) -> bool {
        w.count > 0 && w.end + len > self.opts.segment_bytes.min(crate::engine::options::MAX_SEGMENT_BYTES)
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
        let vfs = &*self.vfs;
        // Zero-filling ahead is what can run out of space; it happens here,
        // before anything is appended, so a full disk fails cleanly.
        self.preallocate(w, w.end + len)?;
        if defer {
            w.pending.extend_from_slice(bytes);
        } else {
            self.write_pending(w)?;
            if let Err(e) = w.active.log.write_all_at(bytes, w.end) {
                return Err(self.undo_partial_write(w, len, e));
            }
        }
        if w.count == 0 || w.end - w.last_index_offset >= INDEX_INTERVAL_BYTES {
            let entry =
                IndexEntry { seq: w.next_seq, offset: w.end, max_ts_before: w.max_ts, max_txn_before: w.max_txn };
            // The index is derived data: a failed write only costs a rebuild.
            if w.idx.write_all_at(&entry.encode(), w.idx_len).is_ok() {
                w.idx_len += ENTRY_LEN as u64;
            } else {
                tracing::warn!(file = %vfs.describe(&w.active.idx_path).display(), "index write failed; it will be rebuilt");
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

    /// Writes the deferred records to the file (under the writer lock).
    /// A failure here cannot be undone (sequences are assigned): poison.
    fn write_pending(&self, w: &mut Writer) -> Result<()> {
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
    fn undo_partial_write(&self, w: &Writer, len: u64, e: std::io::Error) -> Error {
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
                source: None,
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
        w.idx_len = mark.idx_len;
        w.last_index_offset = mark.last_index_offset;
        if let Some(ix) = w.active.index.write().as_mut() {
            ix.truncate(mark.index_len);
        }
        Ok(())
    }

    /// Extends the zero-filled region to cover `upto`.
    fn preallocate(&self, w: &mut Writer, upto: u64) -> Result<()> {
        let chunk = self.opts.preallocate_bytes;
        // Zero-filling pays off only when every append waits for a sync; in
        // the other modes it would just copy every byte twice.
        let syncs = matches!(self.opts.durability, crate::engine::Durability::Sync);
        if chunk == 0 || !syncs || upto <= w.prealloc_end {
            return Ok(());
        }
        // Grow geometrically from 64 KiB up to `chunk`, so that thousands of
        // small partitions do not each reserve a whole chunk.
        let step = chunk.min(w.prealloc_end.max(64 << 10));
        let target = upto.div_ceil(step) * step;
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

    /// Events with sequence > `after`, ascending, at most `limit`, never above
    /// the visible sequence.
    pub fn read(&self, after: u64, limit: usize) -> Result<Vec<StoredRecord>> {
        let mut out = Vec::new();
        self.scan(after, u64::MAX, |r| {
            out.push(r);
            out.len() < limit
        })?;
        Ok(out)
    }

    /// Calls `f` on each record with `after < seq <= until` (and visible), in
    /// order, until `f` returns false.
    pub fn scan(&self, after: u64, until: u64, mut f: impl FnMut(StoredRecord) -> bool) -> Result<()> {
        self.scan_raw(after, until, |offset, header, doc, seg| {
            let doc = decode_doc(doc).map_err(|reason| corrupt(&*self.vfs, &seg.log_path, offset, reason))?;
            Ok(f(StoredRecord { header, doc }))
        })
    }

    /// As [`Partition::scan`], but each record comes undecoded: `f` looks
    /// at its header and MessagePack document and decodes it (checking the
    /// document whole) only if it wants the event. A record passed over is
    /// neither copied nor checked beyond its frame's checksum.
    pub fn scan_lazy(&self, after: u64, until: u64, mut f: impl FnMut(LazyRecord<'_>) -> Result<bool>) -> Result<()> {
        self.scan_raw(after, until, |offset, header, doc, seg| {
            f(LazyRecord { header, doc, offset, path: &seg.log_path, vfs: &*self.vfs })
        })
    }

    /// As [`Partition::scan`], with each record's undecoded MessagePack
    /// document (and its offset and segment, for errors).
    pub fn scan_raw(
        &self,
        after: u64,
        until: u64,
        mut f: impl FnMut(u64, RecordHeader, &[u8], &Segment) -> Result<bool>,
    ) -> Result<()> {
        let visible = self.visible();
        let until = until.min(visible);
        if after >= until {
            return Ok(());
        }
        let first = after + 1;
        let segs: Vec<Arc<Segment>> = {
            let map = self.segments.read();
            let start = map.range(..=first).next_back().map_or(0, |(&b, _)| b);
            map.range(start..).map(|(_, s)| s.clone()).collect()
        };
        for seg in segs {
            if !self.scan_segment(&seg, first, until, CHUNK_SCAN, &mut f)? {
                break;
            }
        }
        Ok(())
    }

    /// Scans one segment from `first` to `until` (both within the visible
    /// records); false when `f` asked to stop or `until` was reached.
    /// Damage before `first` (met on the way from the index point to it) is
    /// stepped over when the scan can resynchronise after it; damage at or
    /// after `first` is `Error::Corrupt`.
    fn scan_segment(
        &self,
        seg: &Segment,
        first: u64,
        until: u64,
        chunk: usize,
        f: &mut RawVisitor<'_>,
    ) -> Result<bool> {
        let (start, start_seq) = self.seek_point(seg, first)?;
        let limit = self.records_limit(seg)?;
        let mut scanner = Scanner::with_chunk(&*seg.log, start, limit, chunk);
        let mut expected = start_seq;
        loop {
            let step = scanner.next_step().map_err(|e| io_err(&*self.vfs, &seg.log_path, "read", e))?;
            let (offset, reason) = match step {
                Step::Record { header, doc, offset } => {
                    if header.seq != expected {
                        (offset, format!("sequence {} where {expected} was expected", header.seq))
                    } else {
                        expected = header.seq + 1;
                        if header.seq > until {
                            return Ok(false);
                        }
                        if header.seq < first {
                            continue;
                        }
                        if !f(offset, header, doc, seg)? {
                            return Ok(false);
                        }
                        if header.seq == until {
                            return Ok(false);
                        }
                        continue;
                    }
                }
                Step::End { offset, .. } => {
                    // A sealed segment ends where its footer says; records
                    // missing before that end are damage.
                    match seg.footer() {
                        Some(ft) if expected <= ft.last_seq && expected <= until => (
                            offset,
                            format!("records end at sequence {}, the footer says {}", expected - 1, ft.last_seq),
                        ),
                        _ => return Ok(true),
                    }
                }
                Step::Truncated { offset } => (offset, "record runs past the end of the file".to_owned()),
                Step::Invalid { offset, reason } => (offset, reason.to_owned()),
            };
            // Beyond the visible records a writer may be mid-write; before
            // them, or anywhere in a sealed segment, it is damage.
            if seg.footer().is_none() && expected > until {
                return Ok(false);
            }
            if expected >= first {
                return Err(corrupt(&*self.vfs, &seg.log_path, offset, reason));
            }
            match self.resync(seg, offset, expected)? {
                Some((at, seq)) if seq <= first => {
                    scanner = Scanner::with_chunk(&*seg.log, at, limit, chunk);
                    expected = seq;
                }
                _ => return Err(corrupt(&*self.vfs, &seg.log_path, offset, reason)),
            }
        }
    }

    /// Reads the records of `seqs` (strictly ascending, each a visible
    /// sequence): one outcome per sequence, in order. A record that fails a
    /// check is `Err(Error::Corrupt)` naming its file and offset, for its
    /// own position only: the read resynchronises at the next record it can
    /// trust (see [`Partition::resync`]) and goes on, so damage blocks only
    /// the positions it covers. The outer error is a failure to read at all
    /// (an I/O error, a sequence that is not visible): nothing was read.
    pub fn read_each(&self, seqs: &[u64]) -> Result<Vec<Result<StoredRecord>>> {
        let visible = self.visible();
        let mut out = Vec::with_capacity(seqs.len());
        let mut i = 0;
        while i < seqs.len() {
            let s = seqs[i];
            if s == 0 || s > visible || seqs[..i].last().is_some_and(|&prev| prev >= s) {
                return Err(Error::failed(
                    "read",
                    format!("{}: sequence {s} is not a visible position (visible up to {visible})", self.describe()),
                ));
            }
            let Some(seg) = self.segments.read().range(..=s).next_back().map(|(_, g)| g.clone()) else {
                return Err(Error::failed("read", format!("{}: no segment holds sequence {s}", self.describe())));
            };
            let seg_last = seg.footer().map_or(visible, |f| f.last_seq.min(visible));
            let j = i + seqs[i..].partition_point(|&x| x <= seg_last);
            if j == i {
                return Err(Error::failed("read", format!("{}: no segment holds sequence {s}", self.describe())));
            }
            self.read_segment_each(&seg, &seqs[i..j], seg_last, &mut out)?;
            i = j;
        }
        Ok(out)
    }

    /// [`Partition::read_each`] within one segment (`wanted` all at most `seg_last`).
    fn read_segment_each(
        &self,
        seg: &Segment,
        wanted: &[u64],
        seg_last: u64,
        out: &mut Vec<Result<StoredRecord>>,
    ) -> Result<()> {
        let vfs = &*self.vfs;
        let limit = self.records_limit(seg)?;
        let (start, mut expected) = self.seek_point(seg, wanted[0])?;
        let mut scanner = Scanner::with_chunk(&*seg.log, start, limit, CHUNK_POINT);
        let mut k = 0;
        while k < wanted.len() {
            let step = scanner.next_step().map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
            let (offset, reason) = match step {
                Step::Record { header, doc, offset } if header.seq == expected => {
                    expected += 1;
                    if header.seq == wanted[k] {
                        out.push(
                            decode_doc(doc)
                                .map(|doc| StoredRecord { header, doc })
                                .map_err(|reason| corrupt(vfs, &seg.log_path, offset, reason)),
                        );
                        k += 1;
                        // A far next position is reached by a new seek.
                        if k < wanted.len() {
                            let (at, seq) = self.seek_point(seg, wanted[k])?;
                            if seq > expected && at > scanner.position() + 2 * INDEX_INTERVAL_BYTES {
                                scanner = Scanner::with_chunk(&*seg.log, at, limit, CHUNK_POINT);
                                expected = seq;
                            }
                        }
                    }
                    continue;
                }
                Step::Record { header, offset, .. } => {
                    (offset, format!("sequence {} where {expected} was expected", header.seq))
                }
                Step::End { offset, .. } => {
                    (offset, format!("records end at sequence {}, before sequence {seg_last}", expected - 1))
                }
                Step::Truncated { offset } => (offset, "record runs past the end of the file".to_owned()),
                Step::Invalid { offset, reason } => (offset, reason.to_owned()),
            };
            // Damage at `offset`, where sequence `expected` should start.
            let next = self.resync(seg, offset, expected)?;
            let resumed = next.map_or(u64::MAX, |(_, seq)| seq);
            while k < wanted.len() && wanted[k] < resumed {
                let why = if wanted[k] == expected {
                    reason.clone()
                } else {
                    format!("unreadable: damage at this offset (sequence {expected}: {reason}) covers it")
                };
                out.push(Err(corrupt(vfs, &seg.log_path, offset, why)));
                k += 1;
            }
            match next {
                Some((at, seq)) => {
                    scanner = Scanner::with_chunk(&*seg.log, at, limit, CHUNK_POINT);
                    expected = seq;
                }
                None => break,
            }
        }
        Ok(())
    }

    /// After damage at `damaged_at` (where sequence `expected` should have
    /// started), the next record start that can be trusted, with its
    /// sequence (greater than `expected`); None when nothing after the
    /// damage can be trusted.
    ///
    /// Trusted: a record start the writer recorded in the sparse index, or
    /// a checksummed record whose chain of following records, each with the
    /// next sequence, reaches such an index point exactly; past the last
    /// index point, the end of the segment's records (a sealed segment's
    /// `records_end` exactly, with its last sequence done; the active
    /// segment's last visible record). Candidates, cheapest first: the end
    /// the damaged record's own length gives, then every later byte offset
    /// with a plausible frame (the search stops at the boundary).
    pub fn resync(&self, seg: &Segment, damaged_at: u64, expected: u64) -> Result<Option<(u64, u64)>> {
        let limit = self.records_limit(seg)?;
        let (last, end) = match seg.footer() {
            Some(f) => (f.last_seq, Some(f.records_end)),
            None => (self.visible(), None),
        };
        if expected >= last {
            return Ok(None);
        }
        self.ensure_index(seg)?;
        let point = {
            let ix = seg.index.read();
            ix.as_deref().unwrap_or(&[]).iter().find(|e| e.offset > damaged_at && e.seq > expected).copied()
        };
        let bound = match point {
            Some(e) if e.seq <= last => Boundary { offset: Some(e.offset), seq: e.seq, limit },
            _ => Boundary { offset: end, seq: last.saturating_add(1), limit },
        };
        let read_err = |e| io_err(&*self.vfs, &seg.log_path, "read", e);
        let found = find_chained_record(&*seg.log, damaged_at, expected, bound).map_err(read_err)?;
        Ok(match (found, point) {
            (Some(hit), _) => Some(hit),
            (None, Some(e)) if e.seq <= last => Some((e.offset, e.seq)),
            (None, _) => None,
        })
    }

    /// The end of a segment's records (or of its file, when active).
    fn records_limit(&self, seg: &Segment) -> Result<u64> {
        match seg.footer() {
            Some(f) => Ok(f.records_end),
            None => seg.log.len().map_err(|e| io_err(&*self.vfs, &seg.log_path, "stat", e)),
        }
    }

    /// The partition's directory, for messages.
    fn describe(&self) -> String {
        self.vfs.describe(&self.dir).display().to_string()
    }

    /// Calls `f` on the records of the given sequences (ascending; those
    /// above the visible records are skipped), reading each from the
    /// nearest index point with small reads, until `f` returns false.
    pub fn fetch(&self, seqs: &[u64], mut f: impl FnMut(StoredRecord) -> bool) -> Result<()> {
        let visible = self.visible();
        let mut i = 0;
        while i < seqs.len() {
            let s = seqs[i];
            if s == 0 || s > visible {
                break;
            }
            let Some(seg) = self.segments.read().range(..=s).next_back().map(|(_, g)| g.clone()) else {
                i += 1;
                continue;
            };
            let seg_last = seg.footer().map_or(visible, |f| f.last_seq.min(visible));
            // One pass over this segment while the next wanted record is
            // near; a far one is reached by a new seek.
            let mut stop = false;
            let far = |from: u64, to: u64| -> Result<bool> {
                Ok(self.seek(&seg, to)? > self.seek(&seg, from)? + 2 * INDEX_INTERVAL_BYTES)
            };
            let mut decode_err = None;
            self.scan_segment(&seg, s, seg_last, CHUNK_POINT, &mut |offset, header, doc, seg| {
                while i < seqs.len() && seqs[i] < header.seq {
                    i += 1; // not in the log (never expected): skip it
                }
                if i >= seqs.len() || seqs[i] > seg_last {
                    return Ok(false);
                }
                if seqs[i] == header.seq {
                    match decode_doc(doc) {
                        Ok(doc) => {
                            if !f(StoredRecord { header, doc }) {
                                stop = true;
                                return Ok(false);
                            }
                        }
                        Err(reason) => {
                            decode_err = Some(corrupt(&*self.vfs, &seg.log_path, offset, reason));
                            return Ok(false);
                        }
                    }
                    i += 1;
                    if i < seqs.len() && seqs[i] <= seg_last && far(header.seq, seqs[i])? {
                        return Ok(false);
                    }
                }
                Ok(true)
            })?;
            if let Some(e) = decode_err {
                return Err(e);
            }
            if stop {
                return Ok(());
            }
            // A wanted sequence the segment did not hold: skip it.
            if i < seqs.len() && seqs[i] == s {
                i += 1;
            }
        }
        Ok(())
    }

    /// The record `seq` of `seg`, read at byte `offset` (from an index's
    /// offset table). `None` when the bytes there are not that visible
    /// record: the caller falls back to [`Partition::fetch`].
    pub fn record_at(&self, seg: &Segment, offset: u64, seq: u64) -> Result<Option<StoredRecord>> {
        if seq > self.visible() || offset < HEADER_LEN as u64 {
            return Ok(None);
        }
        let limit = match seg.footer() {
            Some(f) => f.records_end,
            None => seg.log.len().map_err(|e| io_err(&*self.vfs, &seg.log_path, "stat", e))?,
        };
        let mut scanner = Scanner::with_chunk(&*seg.log, offset, limit, CHUNK_RECORD);
        match scanner.next_step().map_err(|e| io_err(&*self.vfs, &seg.log_path, "read", e))? {
            Step::Record { header, doc, .. } if header.seq == seq => {
                let doc = decode_doc(doc).map_err(|reason| corrupt(&*self.vfs, &seg.log_path, offset, reason))?;
                Ok(Some(StoredRecord { header, doc }))
            }
            _ => Ok(None),
        }
    }

    /// The active segment.
    pub fn active_segment(&self) -> Option<Arc<Segment>> {
        self.segments.read().values().next_back().cloned()
    }

    /// The partition's directory.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The file system underneath.
    pub fn vfs(&self) -> &Arc<dyn Vfs> {
        &self.vfs
    }

    /// Its stream's id.
    pub fn stream_id(&self) -> u64 {
        self.stream_id
    }

    /// The byte offset to start scanning `seg` for sequence `first`.
    fn seek(&self, seg: &Segment, first: u64) -> Result<u64> {
        Ok(self.seek_point(seg, first)?.0)
    }

    /// The index point at or before `first` in `seg`: the byte offset of a
    /// record start and that record's sequence.
    fn seek_point(&self, seg: &Segment, first: u64) -> Result<(u64, u64)> {
        self.ensure_index(seg)?;
        let ix = seg.index.read();
        let entries = ix.as_deref().unwrap_or(&[]);
        let i = entries.partition_point(|e| e.seq <= first);
        Ok(if i == 0 { (HEADER_LEN as u64, seg.base_seq) } else { (entries[i - 1].offset, entries[i - 1].seq) })
    }

    /// Loads a sealed segment's index, rebuilding it from the log when the
    /// file is missing, stale or corrupt.
    fn ensure_index(&self, seg: &Segment) -> Result<()> {
        if seg.index.read().is_some() {
            return Ok(());
        }
        let Some(footer) = seg.footer() else { return Ok(()) };
        let vfs = &*self.vfs;
        let loaded = match vfs.open(&seg.idx_path, false) {
            Ok(f) => {
                let most = footer.count.saturating_mul(ENTRY_LEN as u64).saturating_add(IDX_HEADER_LEN as u64);
                let len = f.len().unwrap_or(0).min(most);
                let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
                let n = f.read_at(&mut buf, 0).unwrap_or(0);
                decode_index(&buf[..n], seg.base_seq)
            }
            Err(_) => Vec::new(),
        };
        let entries = if loaded.last().is_some_and(|e| e.offset < footer.records_end && e.seq <= footer.last_seq)
            && !loaded.is_empty()
        {
            loaded
        } else {
            let (rebuilt, damaged) = rebuild_index(vfs, seg, &footer)?;
            if damaged {
                tracing::warn!(file = %vfs.describe(&seg.log_path).display(), "a sealed segment's index was rebuilt over damaged records; it is kept in memory only");
            } else {
                write_index(vfs, &seg.idx_path, seg.base_seq, &rebuilt);
            }
            rebuilt
        };
        *seg.index.write() = Some(entries);
        Ok(())
    }

    /// The first visible sequence whose timestamp is at or after `t` (the
    /// time index), or None. Timestamps need not be monotonic: each index
    /// point carries the largest timestamp before it, so whole blocks (and
    /// whole sealed segments, by their footer) whose events are all older
    /// than `t` are skipped without being read.
    pub fn seek_time(&self, t: i64) -> Result<Option<u64>> {
        let visible = self.visible();
        for seg in self.segments() {
            if seg.footer().is_some_and(|f| f.max_ts < t) || seg.base_seq > visible {
                continue;
            }
            self.ensure_index(&seg)?;
            // The first point with an event at/after t before it ends the block
            // that holds the answer; the block starts at the point before it.
            let start = {
                let ix = seg.index.read();
                let entries = ix.as_deref().unwrap_or(&[]);
                let i = entries.partition_point(|e| e.max_ts_before < t);
                if i == 0 { seg.base_seq } else { entries[i - 1].seq }
            };
            let mut found = None;
            let until = seg.footer().map_or(visible, |f| f.last_seq.min(visible));
            self.scan(start - 1, until, |r| {
                if r.header.ts >= t {
                    found = Some(r.header.seq);
                    return false;
                }
                true
            })?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Every segment, oldest first (for `verify` and `inspect`).
    pub fn segments(&self) -> Vec<Arc<Segment>> {
        self.segments.read().values().cloned().collect()
    }
}

/// Opens a segment file and checks its header against its name.
/// `sealed_by_successor`: a later segment exists (and recovery is not
/// strict), so a damaged header is reported and the file read by its name;
/// a header of another format version, or of another partition, is still
/// refused.
fn open_segment(
    vfs: &dyn Vfs,
    dir: &str,
    base: u64,
    stream_id: u64,
    partition: u32,
    sealed_by_successor: bool,
) -> Result<Segment> {
    let log_path = format!("{dir}/{}", log_name(base));
    let idx_path = format!("{dir}/{base:020}.idx");
    if base == 0 || base == u64::MAX {
        return Err(corrupt(vfs, &log_path, 0, format!("segment base sequence {base} is impossible")));
    }
    let log = StickySync::wrap(vfs.open(&log_path, false).map_err(|e| io_err(vfs, &log_path, "open", e))?);
    let mut hdr = [0u8; HEADER_LEN];
    let n = log.read_at(&mut hdr, 0).map_err(|e| io_err(vfs, &log_path, "read", e))?;
    let h = match SegmentHeader::decode(&hdr[..n]) {
        Ok(h) => h,
        Err(e @ DecodeError::Version { .. }) => return Err(corrupt(vfs, &log_path, 0, e)),
        Err(reason) if sealed_by_successor => {
            tracing::warn!(
                file = %vfs.describe(&log_path).display(),
                %reason,
                "a sealed segment's header is damaged; it is read by its name (each record is still checked when read; `rheo verify` lists it)"
            );
            SegmentHeader { partition, stream_id, base_seq: base, created_ms: 0 }
        }
        Err(reason) => return Err(corrupt(vfs, &log_path, 0, reason)),
    };
    if h.base_seq != base || h.partition != partition || h.stream_id != stream_id {
        return Err(corrupt(
            vfs,
            &log_path,
            0,
            format!(
                "header names stream {} partition {} base {}, the file name says stream {stream_id} partition {partition} base {base}",
                h.stream_id, h.partition, h.base_seq
            ),
        ));
    }
    Ok(Segment { base_seq: base, log_path, idx_path, log, index: RwLock::new(None), footer: RwLock::new(None) })
}

/// True when a segment file with a bad header holds nothing but zeros after
/// it (or is shorter than a header): its creation was interrupted.
fn torn_creation(vfs: &dyn Vfs, dir: &str, base: u64) -> Result<bool> {
    let path = format!("{dir}/{}", log_name(base));
    let log = vfs.open(&path, false).map_err(|e| io_err(vfs, &path, "open", e))?;
    let len = log.len().map_err(|e| io_err(vfs, &path, "stat", e))?;
    if len <= HEADER_LEN as u64 {
        return Ok(true);
    }
    let data_end = zero_run_start(&*log, HEADER_LEN as u64, len).map_err(|e| io_err(vfs, &path, "read", e))?;
    Ok(data_end == HEADER_LEN as u64)
}

/// The footer at the end of a segment, when it is sealed.
fn read_footer(vfs: &dyn Vfs, seg: &Segment) -> Result<Option<Footer>> {
    let len = seg.log.len().map_err(|e| io_err(vfs, &seg.log_path, "stat", e))?;
    if len < (HEADER_LEN + FOOTER_LEN) as u64 {
        return Ok(None);
    }
    let mut b = [0u8; FOOTER_LEN];
    let n = seg.log.read_at(&mut b, len - FOOTER_LEN as u64).map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
    Ok(Footer::decode(&b[..n])
        .ok()
        .filter(|f| f.records_end.checked_add(FOOTER_LEN as u64) == Some(len) && f.first_seq == seg.base_seq))
}

/// The bounds of a sealed segment whose footer is damaged, from what
/// surrounds it: its records run from its base to the sequence before the
/// next segment's base, and end where the footer starts (`FOOTER_LEN`
/// before the end of the file, when the footer's magic is there; else at
/// the end of the file, where a read stops at what is not a record). Its
/// largest timestamp is unknown: `i64::MAX`, so that no time bound skips it.
fn inferred_footer(vfs: &dyn Vfs, seg: &Segment, next_base: u64) -> Result<Footer> {
    let len = seg.log.len().map_err(|e| io_err(vfs, &seg.log_path, "stat", e))?;
    let mut magic = [0u8; 8];
    let footer_at = len.checked_sub(FOOTER_LEN as u64).filter(|&at| at >= HEADER_LEN as u64);
    let records_end = match footer_at {
        Some(at) => {
            let n = seg.log.read_at(&mut magic, at).map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
            if n == magic.len() && magic == FOOTER_MAGIC { at } else { len }
        }
        None => len.max(HEADER_LEN as u64),
    };
    let last_seq = next_base - 1;
    Ok(Footer { records_end, first_seq: seg.base_seq, last_seq, count: last_seq - seg.base_seq + 1, max_ts: i64::MAX })
}

/// Checks every record of a sealed segment (`RecoveryMode::Strict` at
/// open): each one's checksum, sequences from the base one by one up to
/// the footer's last, the records ending exactly where the footer starts.
/// The first problem is `Error::Corrupt` with its offset.
fn check_sealed(vfs: &dyn Vfs, seg: &Segment, footer: &Footer) -> Result<()> {
    let bad = |offset: u64, reason: String| {
        corrupt(vfs, &seg.log_path, offset, format!("{reason} (strict recovery checks every record)"))
    };
    let mut scanner = Scanner::new(&*seg.log, HEADER_LEN as u64, footer.records_end);
    let mut expected = seg.base_seq;
    loop {
        match scanner.next_step().map_err(|e| io_err(vfs, &seg.log_path, "read", e))? {
            Step::Record { offset, header, .. } => {
                if header.seq != expected || header.seq > footer.last_seq {
                    return Err(bad(offset, format!("sequence {} where {expected} was expected", header.seq)));
                }
                expected += 1;
            }
            Step::End { offset, .. } => {
                if offset != footer.records_end || expected != footer.last_seq.saturating_add(1) {
                    return Err(bad(
                        offset,
                        format!(
                            "records end at sequence {} (offset {offset}); the footer says {} (offset {})",
                            expected - 1,
                            footer.last_seq,
                            footer.records_end
                        ),
                    ));
                }
                return Ok(());
            }
            Step::Truncated { offset } => return Err(bad(offset, "record runs past the footer".into())),
            Step::Invalid { offset, reason } => return Err(bad(offset, reason.into())),
        }
    }
}

/// Creates a new, empty active segment (header synced, directory synced).
fn create_segment(vfs: &dyn Vfs, dir: &str, stream_id: u64, partition: u32, base: u64, now_ms: i64) -> Result<Writer> {
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
    })
}

/// Scans a whole sealed segment and returns index points at append
/// boundaries, and whether it met damage. Past damage it goes on at the next
/// record whose chain of records reaches the end of the segment exactly
/// (see [`find_chained_record`]) and puts a point there, so that reads
/// after the damage still seek; the points from the damage on say that any
/// timestamp and transaction may precede them (the damaged records' are
/// unknown). An index built over damage is kept in memory, not written: it
/// is not the writer's index.
fn rebuild_index(vfs: &dyn Vfs, seg: &Segment, footer: &Footer) -> Result<(Vec<IndexEntry>, bool)> {
    let limit = footer.records_end;
    let mut out = Vec::new();
    let mut scanner = Scanner::new(&*seg.log, HEADER_LEN as u64, limit);
    let mut last_entry_offset = 0u64;
    let mut boundary = true;
    let mut max_ts = i64::MIN;
    let mut max_txn = 0;
    let mut expected = seg.base_seq;
    let mut damaged = false;
    loop {
        let step = scanner.next_step().map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
        let at = match step {
            Step::Record { offset, header, .. } if header.seq == expected => {
                if boundary && (out.is_empty() || offset - last_entry_offset >= INDEX_INTERVAL_BYTES) {
                    out.push(IndexEntry { seq: header.seq, offset, max_ts_before: max_ts, max_txn_before: max_txn });
                    last_entry_offset = offset;
                }
                boundary = header.flags & FLAG_END != 0;
                max_ts = max_ts.max(header.ts);
                max_txn = max_txn.max(header.txn);
                expected += 1;
                continue;
            }
            Step::End { .. } => return Ok((out, damaged)),
            Step::Record { offset, .. } | Step::Truncated { offset } | Step::Invalid { offset, .. } => offset,
        };
        damaged = true;
        let bound = Boundary { offset: Some(limit), seq: footer.last_seq.saturating_add(1), limit };
        match find_chained_record(&*seg.log, at, expected, bound).map_err(|e| io_err(vfs, &seg.log_path, "read", e))? {
            Some((next, seq)) => {
                (max_ts, max_txn) = (i64::MAX, u64::MAX);
                out.push(IndexEntry { seq, offset: next, max_ts_before: max_ts, max_txn_before: max_txn });
                last_entry_offset = next;
                boundary = false;
                expected = seq;
                scanner = Scanner::new(&*seg.log, next, limit);
            }
            None => return Ok((out, damaged)),
        }
    }
}

/// Writes a complete index file; failures are only logged (derived data).
fn write_index(vfs: &dyn Vfs, path: &str, base: u64, entries: &[IndexEntry]) {
    let mut bytes = encode_index_header(base).to_vec();
    for e in entries {
        bytes.extend_from_slice(&e.encode());
    }
    let r = vfs.open(path, true).and_then(|f| {
        f.set_len(0)?;
        f.write_all_at(&bytes, 0)
    });
    if let Err(e) = r {
        tracing::warn!(file = %vfs.describe(path).display(), error = %e, "could not rewrite index");
    }
}

/// A scanned record's position, for recovery.
#[derive(Debug, Clone, Copy)]
struct Seen {
    offset: u64,
    end: u64,
    header: RecordHeader,
}

/// Recovers the active (unsealed) segment: finds the last complete append
/// (and drops multi-partition batches above `committed_txn`), truncates
/// anything after it, and rebuilds the writer state.
fn recover_active(
    vfs: &dyn Vfs,
    opts: &EngineOptions,
    seg: Arc<Segment>,
    committed_txn: u64,
) -> Result<(Writer, Option<Truncation>)> {
    let file_len = seg.log.len().map_err(|e| io_err(vfs, &seg.log_path, "stat", e))?;
    let idx = vfs.open(&seg.idx_path, true).map_err(|e| io_err(vfs, &seg.idx_path, "open", e))?;
    // The index is never synced and its points may be written before their
    // records reach the disk, so no point proves the bytes before it are
    // whole (pages may persist out of order): scan the whole active segment
    // — at most `segment_bytes` — and rebuild its index from the records.
    let mut entries: Vec<IndexEntry> = Vec::new();
    let (start, start_seq, start_max_ts, start_max_txn) = (HEADER_LEN as u64, seg.base_seq, i64::MIN, 0);

    // Scan to the end of the valid records.
    let mut scanner = Scanner::new(&*seg.log, start, file_len);
    let mut seen: Vec<Seen> = Vec::new();
    let mut expected = start_seq;
    let stop = loop {
        match scanner.next_step().map_err(|e| io_err(vfs, &seg.log_path, "read", e))? {
            Step::Record { offset, header, .. } => {
                if header.seq != expected {
                    break Some((offset, "sequence out of order"));
                }
                expected += 1;
                let end = scanner.position();
                seen.push(Seen { offset, end, header });
            }
            Step::End { footer: false, .. } => break None,
            Step::End { offset, footer: true } => break Some((offset, "torn footer")),
            Step::Truncated { offset } => break Some((offset, "record runs past the end of the file")),
            Step::Invalid { offset, reason } => break Some((offset, reason)),
        }
    };
    if let Some((offset, reason)) = stop
        && opts.recovery != RecoveryMode::TruncateAtFirstDamage
    {
        check_tail(vfs, &seg, offset, reason, expected, file_len)?;
    }

    let keep = complete_prefix(&seen, committed_txn);
    let kept = &seen[..keep];
    let cut = kept.last().map_or(start, |s| s.end);
    // Anything non-zero after the cut (a torn write, an unacknowledged append,
    // pages flushed out of order) must go, or a later crash could revive it.
    let data_end = zero_run_start(&*seg.log, cut, file_len).map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
    let mut truncation = None;
    if data_end > cut || stop.is_some() {
        let reason = stop.map_or("incomplete or uncommitted batch", |(_, r)| r);
        if opts.recovery == RecoveryMode::Strict {
            return Err(corrupt(vfs, &seg.log_path, cut, format!("{reason} (strict recovery refuses to truncate)")));
        }
        tracing::warn!(file = %vfs.describe(&seg.log_path).display(), offset = cut, dropped_bytes = data_end.saturating_sub(cut), reason, "truncating torn tail");
        truncate_tail(vfs, &seg, cut, file_len)?;
        truncation = Some(Truncation { offset: cut, dropped_bytes: data_end.saturating_sub(cut), reason });
    }

    let count = kept.last().map_or(start_seq - seg.base_seq, |s| s.header.seq - seg.base_seq + 1);
    let max_ts = kept.iter().map(|s| s.header.ts).fold(start_max_ts, i64::max);
    let max_txn = kept.iter().map(|s| s.header.txn).fold(start_max_txn, u64::max);
    // Rebuild the index tail from the scanned records.
    let mut last_index_offset = entries.last().map_or(HEADER_LEN as u64, |e| e.offset);
    // Without a trusted entry the scan started at the first record, which
    // gets the first index point, as the writer gives it.
    let mut boundary = entries.is_empty();
    let (mut running_ts, mut running_txn) = (start_max_ts, start_max_txn);
    for s in kept {
        if boundary && (entries.is_empty() || s.offset - last_index_offset >= INDEX_INTERVAL_BYTES) {
            entries.push(IndexEntry {
                seq: s.header.seq,
                offset: s.offset,
                max_ts_before: running_ts,
                max_txn_before: running_txn,
            });
            last_index_offset = s.offset;
        }
        boundary = s.header.flags & FLAG_END != 0;
        running_ts = running_ts.max(s.header.ts);
        running_txn = running_txn.max(s.header.txn);
    }
    write_index(vfs, &seg.idx_path, seg.base_seq, &entries);
    let idx_len = (IDX_HEADER_LEN + entries.len() * ENTRY_LEN) as u64;
    let prealloc_end = seg.log.len().map_err(|e| io_err(vfs, &seg.log_path, "stat", e))?;
    *seg.index.write() = Some(entries);
    let next_seq = seg.base_seq + count;
    Ok((
        Writer {
            idx,
            end: cut,
            prealloc_end,
            idx_len,
            last_index_offset,
            next_seq,
            count,
            max_ts,
            max_txn,
            active: seg,
            pending: Vec::new(),
        },
        truncation,
    ))
}

/// How many of the scanned records recovery keeps: only complete appends,
/// i.e. up to the last record flagged END, and before the first
/// multi-partition batch whose commit is not recorded. Cutting at such a
/// batch may leave a run without its END record in front of it, so the END
/// rule applies again to what is left: the kept prefix always ends with an
/// END record (or is empty), which makes recovery idempotent (a second open
/// of what the first one kept keeps all of it).
fn complete_prefix(seen: &[Seen], committed_txn: u64) -> usize {
    let through_last_end = |s: &[Seen]| s.iter().rposition(|s| s.header.flags & FLAG_END != 0).map_or(0, |i| i + 1);
    let keep = through_last_end(seen);
    match seen[..keep].iter().position(|s| s.header.flags & FLAG_MULTI != 0 && s.header.txn > committed_txn) {
        Some(i) => through_last_end(&seen[..i]),
        None => keep,
    }
}

/// Consecutive damaged records whose lengths a resynchronisation follows.
const MAX_HOPS: u64 = 64;

/// Where a chain of records found after damage must lead to be trusted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Boundary {
    /// The next index point's byte offset, which the chain must reach
    /// exactly; None at the end of the segment's records.
    pub(crate) offset: Option<u64>,
    /// The sequence due there (the index point's, or the last sequence + 1).
    pub(crate) seq: u64,
    /// Where the search for a record start stops (the index point, or the
    /// end of the records or file).
    pub(crate) limit: u64,
}

/// The first record start after damage at `damaged_at` (where `expected`
/// should have started) whose chain of records, each with the next
/// sequence, leads to `b` (see [`Boundary`]); with its sequence. The
/// damaged record's own length is tried first, then every later byte
/// offset with a plausible frame.
pub(crate) fn find_chained_record(
    log: &dyn VfsFile,
    damaged_at: u64,
    expected: u64,
    b: Boundary,
) -> std::io::Result<Option<(u64, u64)>> {
    let stop = b.offset.unwrap_or(b.limit);
    let chains = |at: u64| -> std::io::Result<Option<u64>> {
        let mut s = Scanner::with_chunk(log, at, b.limit, CHUNK_POINT);
        let mut first = None;
        let mut next = None;
        loop {
            let pos = s.position();
            if next == Some(b.seq) {
                return Ok(if b.offset.is_none_or(|o| o == pos) { first } else { None });
            }
            if pos >= stop {
                return Ok(None);
            }
            match s.next_step()? {
                Step::Record { header, .. } if next.is_none_or(|n| n == header.seq) && header.seq < b.seq => {
                    first.get_or_insert(header.seq);
                    next = Some(header.seq + 1);
                }
                _ => return Ok(None),
            }
        }
    };
    // 1. A damaged record's length is often intact (a flipped bit in its
    // body): the next record starts right after it. Follow the lengths of
    // consecutive damaged records (dense damage must not hide the good
    // records between): a checksummed record with exactly the sequence the
    // hops predict, at exactly the offset they predict, is believed without
    // a chain to the boundary (bytes inside a payload would have to carry
    // that sequence and a valid checksum at that offset). A chain that
    // reaches the boundary is believed from the first hop on.
    let mut at = damaged_at;
    for hop in 1..=MAX_HOPS {
        let mut frame = [0u8; PROBE];
        if log.read_at(&mut frame, at)? < PROBE {
            break;
        }
        let len = u64::from(get_u32(&frame, REC_LEN));
        if !(u64::from(BODY_MIN_U32)..=u64::from(MAX_BODY_LEN)).contains(&len) {
            break;
        }
        let next = at + FRAME_LEN as u64 + len;
        if next >= stop {
            break;
        }
        let want = expected + hop;
        match record_at(log, next, b.limit) {
            Some(h) if h.seq == want && h.seq < b.seq => return Ok(Some((next, want))),
            Some(_) => break,
            None => {}
        }
        if hop == 1
            && let Some(seq) = chains(next)?
            && seq > expected
        {
            return Ok(Some((next, seq)));
        }
        at = next;
    }
    // 2. Every later offset with a plausible frame.
    let mut buf = vec![0u8; 64 << 10];
    let mut at = damaged_at + 1;
    while at + PROBE as u64 <= stop {
        let n = log.read_at(&mut buf, at)?;
        if n < PROBE {
            break;
        }
        for i in 0..=(n - PROBE) {
            let pos = at + i as u64;
            if pos + PROBE as u64 > stop {
                break;
            }
            if plausible_frame(&buf[i..i + PROBE], expected + 1, b.seq)
                && let Some(seq) = chains(pos)?
            {
                return Ok(Some((pos, seq)));
            }
        }
        at += (n - PROBE + 1) as u64;
    }
    Ok(None)
}

/// The header of the record at `offset`, when a valid one starts there.
fn record_at(log: &dyn VfsFile, offset: u64, file_len: u64) -> Option<RecordHeader> {
    let mut s = Scanner::new(log, offset, file_len);
    match s.next_step().ok()? {
        Step::Record { header, .. } => Some(header),
        _ => None,
    }
}

/// Decides whether a bad record at `offset` is a torn tail (the last write
/// was cut short) or corruption in the middle of the log. It is corruption
/// Decides whether a bad record at `offset` is a torn tail (the last write
/// was cut short) or damage in the middle of the log: it is damage when a
/// valid record with a later sequence appears anywhere after it, before the
/// zeros that end the written data.
fn check_tail(vfs: &dyn Vfs, seg: &Segment, offset: u64, reason: &str, expected: u64, file_len: u64) -> Result<()> {
    let log = &*seg.log;
    let read_err = |e| io_err(vfs, &seg.log_path, "read", e);
    let data_end = zero_run_start(log, offset, file_len).map_err(read_err)?;
    // Only positions whose length is plausible and whose sequence is just
    // after the damage are checked in full (CRC), so the search is linear.
    let plausible = |b: &[u8]| plausible_frame(b, expected + 1, expected.saturating_add(1 << 24).saturating_add(1));
    let mut buf = vec![0u8; read_buffer_len(data_end.saturating_sub(offset))];
    let mut at = offset + 1;
    while at + PROBE as u64 <= data_end {
        let n = log.read_at(&mut buf, at).map_err(read_err)?;
        if n < PROBE {
            break;
        }
        for i in 0..=(n - PROBE) {
            let pos = at + i as u64;
            if pos + PROBE as u64 > data_end {
                break;
            }
            if plausible(&buf[i..i + PROBE])
                && let Some(h) = record_at(log, pos, file_len)
                && h.seq > expected
            {
                return Err(corrupt(
                    vfs,
                    &seg.log_path,
                    offset,
                    format!("{reason}, followed by valid records (sequence {} at offset {pos})", h.seq),
                ));
            }
        }
        at += (n - PROBE + 1) as u64;
    }
    Ok(())
}

/// A buffer for reading `left` bytes in steps of at most 1 MiB (a small
/// file gets a small buffer: opening many small partitions stays cheap).
fn read_buffer_len(left: u64) -> usize {
    usize::try_from(left.clamp(PROBE as u64, 1 << 20)).unwrap_or(1 << 20)
}

/// The offset where the run of zeros at the end of the written data starts
/// (searching from `from`).
fn zero_run_start(log: &dyn VfsFile, from: u64, file_len: u64) -> std::io::Result<u64> {
    let mut last_nonzero_end = from;
    let mut at = from;
    let mut buf = vec![0u8; read_buffer_len(file_len.saturating_sub(from))];
    while at < file_len {
        let n = log.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().rposition(|&b| b != 0) {
            last_nonzero_end = at + i as u64 + 1;
        }
        at += n as u64;
    }
    Ok(last_nonzero_end)
}

/// Drops everything after `cut` (keeping the file's preallocated length
/// filled with zeros), durably.
fn truncate_tail(vfs: &dyn Vfs, seg: &Segment, cut: u64, file_len: u64) -> Result<()> {
    let log = &*seg.log;
    log.set_len(cut).map_err(|e| io_err(vfs, &seg.log_path, "truncate", e))?;
    if file_len > cut {
        log.set_len(file_len).map_err(|e| io_err(vfs, &seg.log_path, "extend", e))?;
    }
    log.sync_data().map_err(|e| sync_err(vfs, &seg.log_path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(records: &[(u8, u64)]) -> Vec<Seen> {
        records
            .iter()
            .enumerate()
            .map(|(i, &(flags, txn))| Seen {
                offset: 64 + 100 * i as u64,
                end: 164 + 100 * i as u64,
                header: RecordHeader { seq: i as u64 + 1, ts: 0, flags, txn },
            })
            .collect()
    }

    /// The `segment_recovery` regression of issue 11: cutting at an
    /// uncommitted multi-partition batch must not leave a run without its
    /// END record in front (the next open would drop it).
    #[test]
    fn the_kept_prefix_always_ends_with_an_end_record() {
        let multi_end = FLAG_MULTI | FLAG_END;
        assert_eq!(complete_prefix(&seen(&[(0, 0), (multi_end, 5)]), 0), 0);
        assert_eq!(complete_prefix(&seen(&[(FLAG_END, 0), (0, 0), (multi_end, 5)]), 0), 1);
        assert_eq!(complete_prefix(&seen(&[(FLAG_END, 0), (0, 0), (multi_end, 5)]), 5), 3, "committed: all kept");
        assert_eq!(complete_prefix(&seen(&[(FLAG_END, 0), (FLAG_MULTI, 6), (multi_end, 6), (FLAG_END, 0)]), 5), 1);
        assert_eq!(complete_prefix(&seen(&[(FLAG_END, 0), (0, 0)]), 0), 1, "a torn batch");
        for records in [&[(0u8, 0u64), (multi_end, 5)][..], &[(FLAG_END, 0), (0, 0), (multi_end, 9), (FLAG_END, 0)]] {
            let s = seen(records);
            let keep = complete_prefix(&s, 0);
            assert_eq!(complete_prefix(&s[..keep], 0), keep, "idempotent on {records:?}");
        }
    }
}
