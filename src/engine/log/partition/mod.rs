//! One partition's log: a run of segment files, the active one last.
//!
//! Writers hold the partition's writer lock (taken by the stream, in
//! partition order). Readers never take it: they read the segment list and
//! the published `visible` sequence, and never see a record above it.

mod reader;
mod recovery;
mod retention;
mod writer;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::engine::error::{DecodeError, corrupt, io_err, sync_err};
use crate::engine::options::{EngineOptions, RecoveryMode};
use crate::engine::segment::file::{Footer, IndexEntry, SegmentHeader, decode_index, encode_index_header};
use crate::engine::segment::format::*;
use crate::engine::segment::record::{PROBE, RecordHeader, plausible_frame};
use crate::engine::segment::scan::{Doc, Scanner, Step};
use crate::engine::vfs::{StickySync, Vfs, VfsFile, WriteWindow};
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
    pub doc: Doc<'a>,
    offset: u64,
    path: &'a str,
    vfs: &'a dyn Vfs,
}

impl LazyRecord<'_> {
    /// The record, its document checked whole (`Error::Corrupt` naming the
    /// file and offset when it is not a valid document).
    pub fn decode(self) -> Result<StoredRecord> {
        // A filtered scan keeps few records: a copy, not the whole buffer.
        let doc = self.doc.decode_copy().map_err(|reason| corrupt(self.vfs, self.path, self.offset, reason))?;
        Ok(StoredRecord { header: self.header, doc })
    }
}

/// One segment file and its index.
#[derive(Debug)]
pub struct Segment {
    /// The sequence of its first record.
    pub base_seq: u64,
    /// When this process created or opened it (system clock, ms; not
    /// stored): the age at which it rolls counts from here.
    pub opened_ms: i64,
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
type RawVisitor<'a> = dyn FnMut(u64, RecordHeader, Doc<'_>, &Segment) -> Result<bool> + 'a;

/// The read size of a scan through many records.
const CHUNK_SCAN: usize = 64 << 10;
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
    /// The end of the zero-filled region; the file's length is at least
    /// `max(prealloc_end, end)` (deferred records not yet written aside),
    /// and longer only by a hole: a tail recovery cut (truncated, then
    /// extended back), which is not counted as filled.
    prealloc_end: u64,
    /// The length of the index file written so far.
    idx_len: u64,
    /// Index entries not written to the index file yet (written together,
    /// at a roll, or never: a reopen rebuilds the active segment's index).
    idx_pending: Vec<u8>,
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
    /// Where records are copied instead of written, when the file can be
    /// mapped (ADR 0035): a window of the active segment at `end`.
    window: Option<WriteWindow>,
    /// Mapping failed or the file cannot be mapped: records are written.
    unmapped: bool,
    /// The end of the space reserved for copies into a mapping (0: none
    /// yet). Kept apart from `prealloc_end`, which only says how long the
    /// file is: space past the records may be a hole.
    reserved_end: u64,
    /// When the active segment's modification time was last set after a
    /// copy into a mapping (see `VfsFile::touch`).
    touched: Option<std::time::Instant>,
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
    idx_pending: usize,
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
    /// The log start: the first sequence readers may see. The base of the
    /// first segment file at open; retention moves it up before it deletes
    /// the segments below it (format/README.md, "Retention").
    start: AtomicU64,
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

    /// The partition's directory, for messages.
    fn describe(&self) -> String {
        self.vfs.describe(&self.dir).display().to_string()
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

    /// Every segment, oldest first (for `verify` and `inspect`).
    pub fn segments(&self) -> Vec<Arc<Segment>> {
        self.segments.read().values().cloned().collect()
    }

    /// The log start: the first sequence kept (every sequence below it was
    /// dropped by retention); `visible + 1` when the partition holds none.
    pub fn log_start(&self) -> u64 {
        self.start.load(Ordering::Acquire)
    }

    /// Bytes of records stored: each sealed segment's records and the active
    /// segment's written ones (headers, footers and preallocation aside).
    pub fn bytes(&self) -> u64 {
        let active_end = self.writer.lock().end;
        self.segments
            .read()
            .values()
            .map(|s| s.footer().map_or(active_end, |f| f.records_end).saturating_sub(HEADER_LEN as u64))
            .sum()
    }
}
