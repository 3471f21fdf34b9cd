//! Secondary indexes: per sealed segment an index file (`<base>.six`,
//! `format/secondary-index.md`), for the active segment an in-memory index
//! caught up from the log by the background builder and by every query
//! before it reads (never by the append path), the builder, and the query
//! planner.
//!
//! Index files are derived data. They are written without fsync, checked
//! against the segment they describe when loaded, and rebuilt when missing,
//! damaged, of another version or covering other fields than the stream
//! declares. Until a segment's index is ready the planner scans it, so an
//! index only ever makes a query faster, never different.

pub mod extract;
pub mod file;
pub mod planner;
pub mod prefilter;
pub mod term;

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::engine::log::partition::{Partition, Segment};
use crate::engine::log::stream::StreamLog;
use crate::engine::vfs::{Vfs, VfsFile};
use crate::error::{Error, Result};
use extract::{DocParts, Extractor, FieldPath};
use file::{SixError, SixHeader, SixMeta};
use term::{ALWAYS_INDEXED, KeyRange, canonical, scalar_key};

/// The fields a stream indexes: the fixed ones and those it declares,
/// canonical and sorted.
#[derive(Debug)]
pub struct FieldSet {
    names: Vec<String>,
    extractor: Extractor,
    /// Distinct for every set made in this process.
    version: u64,
}

impl PartialEq for FieldSet {
    fn eq(&self, other: &Self) -> bool {
        self.names == other.names
    }
}

impl FieldSet {
    /// The fixed fields plus `declared` (query paths).
    pub fn new(declared: &[String]) -> FieldSet {
        let mut names: Vec<String> = ALWAYS_INDEXED.iter().map(|s| (*s).to_owned()).collect();
        names.extend(declared.iter().filter_map(|d| canonical(d)));
        names.sort();
        names.dedup();
        let extractor = Extractor::new(names.iter().map(|n| FieldPath::parse(n)).collect());
        static VERSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let version = VERSIONS.fetch_add(1, Ordering::Relaxed);
        FieldSet { names, extractor, version }
    }

    /// The canonical names, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// True when the set holds this canonical field.
    pub fn contains(&self, field: &str) -> bool {
        self.names.binary_search_by(|n| n.as_str().cmp(field)).is_ok()
    }
}

/// A fast hasher for term keys, a word at a time, started from a random
/// per-process seed ([`hash_seed`]).
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(w) ^ (rest.len() as u64) << 56).wrapping_mul(K);
        }
        // Spread the high bits (hashbrown uses the top 7 for its tags).
        self.0 = h ^ (h >> 29);
    }
}

/// The record offsets (from the segment's base) holding one term: most
/// terms of a unique field (ids) hold one, without an allocation.
#[derive(Debug)]
enum SeqList {
    One(u32),
    Many(Vec<u32>),
}

impl SeqList {
    /// Adds the next record (ascending; a repeat is ignored).
    fn push(&mut self, off: u32) {
        match self {
            SeqList::One(o) if *o != off => *self = SeqList::Many(vec![*o, off]),
            SeqList::One(_) => {}
            SeqList::Many(v) => {
                if v.last() != Some(&off) {
                    v.push(off);
                }
            }
        }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            SeqList::One(o) => std::slice::from_ref(o),
            SeqList::Many(v) => v,
        }
    }
}

/// A hasher for keys that already are hashes.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The seed of every term hash in this process, random: producers choose
/// ids and values, and must not be able to make keys collide on purpose.
fn hash_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64) | 1
    })
}

fn hash_key(key: &[u8]) -> u64 {
    let mut h = WordHasher(hash_seed());
    h.write(key);
    h.finish()
}

/// One field's terms in insertion order (so a field whose values grow with
/// the sequence, like time-ordered ids, is nearly sorted already), their
/// keys in one arena, found by hash.
#[derive(Debug, Default)]
struct TermMap {
    arena: Vec<u8>,
    /// (key start in the arena, key length, records).
    terms: Vec<(usize, usize, SeqList)>,
    /// Key hash -> the first term with that hash; `chain` links the others.
    by_hash: HashMap<u64, u32, BuildHasherDefault<Prehashed>>,
    chain: Vec<u32>,
}

const NO_TERM: u32 = u32::MAX;

impl TermMap {
    fn with_capacity(terms: usize) -> TermMap {
        TermMap {
            arena: Vec::with_capacity(terms * 40),
            terms: Vec::with_capacity(terms),
            by_hash: HashMap::with_capacity_and_hasher(terms, Default::default()),
            chain: Vec::with_capacity(terms),
        }
    }

    fn key(&self, i: usize) -> &[u8] {
        let (start, len, _) = self.terms[i];
        &self.arena[start..start + len]
    }

    fn find(&self, key: &[u8], h: u64) -> Option<usize> {
        let mut i = *self.by_hash.get(&h)?;
        while i != NO_TERM {
            let idx = i as usize;
            if self.key(idx) == key {
                return Some(idx);
            }
            i = self.chain[idx];
        }
        None
    }

    fn get(&self, key: &[u8]) -> Option<&SeqList> {
        self.find(key, hash_key(key)).map(|i| &self.terms[i].2)
    }

    /// Adds record `off` to the term `key`.
    fn add(&mut self, key: &[u8], off: u32) {
        let h = hash_key(key);
        if let Some(i) = self.find(key, h) {
            self.terms[i].2.push(off);
            return;
        }
        let Ok(idx) = u32::try_from(self.terms.len()) else { return };
        if idx == NO_TERM {
            return;
        }
        let start = self.arena.len();
        self.arena.extend_from_slice(key);
        self.terms.push((start, key.len(), SeqList::One(off)));
        let prev = self.by_hash.insert(h, idx).unwrap_or(NO_TERM);
        self.chain.push(prev);
    }

    fn iter(&self) -> impl Iterator<Item = (&[u8], &SeqList)> {
        self.terms.iter().map(|(start, len, list)| (&self.arena[*start..*start + *len], list))
    }
}

/// An in-memory index of one segment's records `base..=upto`, per field.
#[derive(Debug)]
pub struct MemIndex {
    base: u64,
    upto: u64,
    fields: Arc<FieldSet>,
    maps: Vec<TermMap>,
    /// The byte offset of each record `base + i` (emptied for good if one
    /// does not fit u32: such a segment is read through its sparse index).
    offsets: Vec<u32>,
    offsets_ok: bool,
}

impl MemIndex {
    /// An empty index of the segment starting at `base`, sized for about
    /// `records` records (the id field gets a term per record).
    fn new(base: u64, fields: Arc<FieldSet>, records: usize) -> MemIndex {
        let maps = fields.names.iter().map(|n| TermMap::with_capacity(if n == "id" { records } else { 16 })).collect();
        MemIndex { base, upto: base - 1, fields, maps, offsets: Vec::with_capacity(records), offsets_ok: true }
    }

    /// Indexes the visible records of its segment after `upto`, up to
    /// `until` (never past the segment's end).
    fn extend(&mut self, part: &Partition, until: u64) -> Result<()> {
        if self.upto >= until {
            return Ok(());
        }
        let mut key = Vec::new();
        let base = self.base;
        part.scan_raw(self.upto, until, |off, h, doc, seg| {
            if seg.base_seq != base || h.seq != self.upto + 1 {
                return Ok(false);
            }
            self.add(h.seq, off, doc, &mut key);
            Ok(true)
        })
    }

    /// The byte offset of record `seq`, when known.
    fn offset_of(&self, seq: u64) -> Option<u64> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.offsets.get(i).map(|&o| u64::from(o))
    }

    /// Indexes the record `seq` (the next one), at byte `offset`, from its
    /// raw document.
    fn add(&mut self, seq: u64, offset: u64, doc: &[u8], key: &mut Vec<u8>) {
        self.upto = seq;
        match u32::try_from(offset) {
            Ok(o) if self.offsets_ok => self.offsets.push(o),
            _ => {
                self.offsets_ok = false;
                self.offsets = Vec::new();
            }
        }
        let Some(parts) = DocParts::split(doc) else { return };
        let Ok(off) = u32::try_from(seq - self.base) else { return };
        let maps = &mut self.maps;
        self.fields.extractor.extract(&parts, |i, v| {
            key.clear();
            scalar_key(&v, key);
            maps[i].add(key, off);
        });
    }

    fn lookup(&self, field: &str, ranges: &[KeyRange], cap: u64) -> Option<Vec<u64>> {
        let i = self.fields.names.binary_search_by(|n| n.as_str().cmp(field)).ok()?;
        let map = &self.maps[i];
        let mut out: Vec<u64> = Vec::new();
        let mut add = |list: &SeqList| -> bool {
            out.extend(list.as_slice().iter().map(|&o| self.base + u64::from(o)));
            out.len() as u64 <= cap
        };
        for r in ranges {
            if r.is_point() {
                if let std::ops::Bound::Included(k) = &r.lo
                    && let Some(list) = map.get(k.as_slice())
                    && !add(list)
                {
                    return None;
                }
            } else {
                for (k, list) in map.iter() {
                    if r.contains(k) && !add(list) {
                        return None;
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// The index file of this (complete, sealed) segment.
    fn encode(&self, header: &SixHeader) -> Vec<u8> {
        // Fields are in name order (= ordinal order); each field's terms sorted.
        let per_field: Vec<Vec<(&[u8], &[u32])>> = self
            .maps
            .iter()
            .map(|map| {
                let mut terms: Vec<(&[u8], &[u32])> = map.iter().map(|(k, l)| (k, l.as_slice())).collect();
                // Stable sort: runs already in order (insertion order) are cheap.
                terms.sort_by(|a, b| a.0.cmp(b.0));
                terms
            })
            .collect();
        let terms = per_field.iter().enumerate().flat_map(|(i, terms)| {
            let ord = u16::try_from(i).unwrap_or(u16::MAX);
            terms.iter().map(move |&(k, l)| (ord, k, l))
        });
        file::encode(header, &self.fields.names, terms, &self.offsets)
    }
}

/// Where a loaded index file's bytes are.
#[derive(Debug)]
enum Source {
    /// Built in memory, not written yet.
    Memory(Vec<u8>),
    /// On disk.
    File(Arc<dyn VfsFile>),
}

/// A sealed segment's index: its directory in memory, its blocks read on
/// demand (and checked on every read).
#[derive(Debug)]
pub struct SixFile {
    meta: SixMeta,
    source: Source,
    path: String,
}

impl SixFile {
    /// Opens and checks an index file against the segment it must describe.
    fn open(vfs: &dyn Vfs, path: &str, expect: &SixHeader) -> std::result::Result<SixFile, SixError> {
        let damaged = |r: String| SixError::Damaged(r.into());
        let f = vfs.open(path, false).map_err(|e| damaged(format!("open: {e}")))?;
        let len = f.len().map_err(|e| damaged(format!("stat: {e}")))?;
        if len < (file::SIX_HEADER_LEN + file::SIX_TRAILER_LEN) as u64 {
            return Err(damaged("index file too short".into()));
        }
        let head = read_exact(&*f, 0, file::SIX_HEADER_LEN).map_err(|e| damaged(format!("read: {e}")))?;
        let header = SixHeader::decode(&head)?;
        if header != *expect {
            return Err(damaged(format!("describes {header:?}, the segment is {expect:?}")));
        }
        let trailer = read_exact(&*f, len - file::SIX_TRAILER_LEN as u64, file::SIX_TRAILER_LEN)
            .map_err(|e| damaged(format!("read: {e}")))?;
        let (offset, dlen, crc) = file::decode_trailer(&trailer, len)?;
        let dir = read_exact(&*f, offset, dlen as usize).map_err(|e| damaged(format!("read: {e}")))?;
        let meta = file::decode_dir(header, &dir, offset, crc)?;
        Ok(SixFile { meta, source: Source::File(f), path: path.to_owned() })
    }

    fn in_memory(bytes: Vec<u8>, path: String) -> std::result::Result<SixFile, SixError> {
        let header = SixHeader::decode(&bytes)?;
        let t = bytes.len().checked_sub(file::SIX_TRAILER_LEN).ok_or(SixError::Damaged("too short".into()))?;
        let (offset, dlen, crc) = file::decode_trailer(&bytes[t..], bytes.len() as u64)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let dir = bytes.get(start..start + dlen as usize).ok_or(SixError::Damaged("directory".into()))?;
        let meta = file::decode_dir(header, dir, offset, crc)?;
        Ok(SixFile { meta, source: Source::Memory(bytes), path })
    }

    /// The file's path (in messages).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The byte offset of record `seq` in its segment, from the file's
    /// offset table (checked by the caller against the record found there).
    fn offset_of(&self, seq: u64) -> Option<u64> {
        let m = &self.meta;
        if m.offsets == 0 || seq < m.header.base_seq || seq > m.header.last_seq {
            return None;
        }
        let at = m.offsets_at + (seq - m.header.base_seq) * 4;
        let b: [u8; 4] = match &self.source {
            Source::Memory(bytes) => {
                let i = usize::try_from(at).ok()?;
                bytes.get(i..i + 4)?.try_into().ok()?
            }
            Source::File(f) => read_exact(&**f, at, 4).ok()?.try_into().ok()?,
        };
        Some(u64::from(u32::from_le_bytes(b)))
    }

    /// The fields it covers.
    pub fn fields(&self) -> &[String] {
        &self.meta.fields
    }

    fn block_bytes(&self, i: usize) -> std::result::Result<std::borrow::Cow<'_, [u8]>, SixError> {
        let b = &self.meta.blocks[i];
        match &self.source {
            Source::Memory(bytes) => {
                let at = usize::try_from(b.offset).unwrap_or(usize::MAX);
                bytes
                    .get(at..at + b.len as usize)
                    .map(std::borrow::Cow::Borrowed)
                    .ok_or(SixError::Damaged("block out of range".into()))
            }
            Source::File(f) => read_exact(&**f, b.offset, b.len as usize)
                .map(std::borrow::Cow::Owned)
                .map_err(|e| SixError::Damaged(format!("read: {e}").into())),
        }
    }

    /// The sequences of `field` whose values fall in any of `ranges`;
    /// `Ok(None)` when the field is not covered or more than `cap` match.
    fn lookup(&self, field: &str, ranges: &[KeyRange], cap: u64) -> std::result::Result<Option<Vec<u64>>, SixError> {
        let Some(ord) = self.meta.ordinal(field) else { return Ok(None) };
        let mut out = Vec::new();
        for r in ranges {
            if self.meta.span_excludes(ord, r) {
                continue;
            }
            let r = file::term_range(ord, r);
            if self.meta.excludes(&r.lo, &r.hi) {
                continue;
            }
            let start = match &r.lo {
                std::ops::Bound::Included(k) | std::ops::Bound::Excluded(k) => self.meta.block_for(k),
                std::ops::Bound::Unbounded => 0,
            };
            'blocks: for i in start..self.meta.blocks.len() {
                let bytes = self.block_bytes(i)?;
                let mut it = self.meta.block(i, &bytes)?;
                while let Some(e) = it.next_entry()? {
                    let past = match &r.hi {
                        std::ops::Bound::Included(h) => e.key > h.as_slice(),
                        std::ops::Bound::Excluded(h) => e.key >= h.as_slice(),
                        std::ops::Bound::Unbounded => false,
                    };
                    if past {
                        break 'blocks;
                    }
                    if r.contains(e.key) {
                        if out.len() as u64 + e.count > cap {
                            return Ok(None);
                        }
                        e.sequences(&self.meta.header, &mut out)?;
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(Some(out))
    }
}

fn read_exact(f: &dyn VfsFile, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = f.read_at(&mut buf[done..], at + done as u64)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file ends early"));
        }
        done += n;
    }
    Ok(buf)
}

/// What is known of a sealed segment's index file.
#[derive(Debug, Clone)]
enum Sealed {
    /// Loaded and checked (maybe for other fields than the current set).
    Ready(Arc<SixFile>, bool),
    /// Probed: no usable file on disk; to build.
    Absent,
    /// Building it failed (reading the segment): retried after a while.
    Failed(std::time::Instant),
}

/// The smallest record a segment can hold (frame + fixed body + a minimal
/// document), for sizing an index before reading the segment.
const MIN_RECORD_BYTES: u64 =
    (crate::engine::segment::format::FRAME_LEN + crate::engine::segment::format::BODY_MIN) as u64;

/// How long a segment whose index could not be built is left alone (its
/// queries scan it meanwhile).
const RETRY_FAILED_BUILD: Duration = Duration::from_secs(60);

/// One partition's indexes.
#[derive(Debug, Default)]
pub struct PartitionIndex {
    sealed: RwLock<BTreeMap<u64, Sealed>>,
    active: Mutex<Option<MemIndex>>,
    /// (segment count, field set) when a build pass last found every
    /// sealed segment's file written: the next pass may skip the walk.
    built: Mutex<Option<(usize, u64)>>,
}

/// A stream's indexes.
#[derive(Debug)]
pub struct StreamIndex {
    fields: RwLock<Arc<FieldSet>>,
    parts: Vec<PartitionIndex>,
}

pub use crate::model::group::IndexStatus;

fn header_of(part: &Partition, seg: &Segment) -> Option<SixHeader> {
    let f = seg.footer()?;
    Some(SixHeader {
        partition: part.partition,
        stream_id: part.stream_id(),
        base_seq: seg.base_seq,
        last_seq: f.last_seq,
        records_end: f.records_end,
        max_ts: f.max_ts,
    })
}

impl StreamIndex {
    /// The indexes of a stream of `partitions` partitions declaring `declared`.
    pub fn new(partitions: u32, declared: &[String]) -> StreamIndex {
        StreamIndex {
            fields: RwLock::new(Arc::new(FieldSet::new(declared))),
            parts: (0..partitions).map(|_| PartitionIndex::default()).collect(),
        }
    }

    /// The fields indexed now.
    pub fn fields(&self) -> Arc<FieldSet> {
        self.fields.read().clone()
    }

    /// Changes the declared fields (the builder then backfills).
    pub fn set_declared(&self, declared: &[String]) {
        *self.fields.write() = Arc::new(FieldSet::new(declared));
    }

    /// A partition's indexes.
    pub fn partition(&self, p: u32) -> Option<&PartitionIndex> {
        self.parts.get(p as usize)
    }

    /// How far each field is built.
    pub fn status(&self, log: &StreamLog) -> Vec<IndexStatus> {
        let fields = self.fields();
        let mut ready = vec![0u64; fields.names.len()];
        let (mut total, mut failed) = (0u64, 0u64);
        for (p, pix) in self.parts.iter().enumerate() {
            let Ok(part) = log.partition(u32::try_from(p).unwrap_or(u32::MAX)) else { continue };
            // Lock order: `active`, then `sealed` (as catch_up takes them).
            let active = pix.active.lock().as_ref().map(|m| (m.base, m.fields.clone()));
            let sealed = pix.sealed.read();
            for seg in part.segments() {
                total += 1;
                let covered: &[String] = match (seg.footer(), sealed.get(&seg.base_seq)) {
                    (Some(_), Some(Sealed::Ready(f, _))) => f.fields(),
                    (Some(_), Some(Sealed::Failed(_))) => {
                        failed += 1;
                        &[]
                    }
                    (Some(_), _) => &[],
                    (None, _) => match &active {
                        Some((base, f)) if *base == seg.base_seq => &f.names,
                        _ => &[],
                    },
                };
                for (i, n) in fields.names.iter().enumerate() {
                    if covered.contains(n) {
                        ready[i] += 1;
                    }
                }
            }
        }
        fields
            .names
            .iter()
            .zip(ready)
            .map(|(f, r)| IndexStatus {
                field: f.clone(),
                segments_ready: r,
                segments_total: total,
                segments_failed: failed,
            })
            .collect()
    }

    /// One round of building for every partition: catch up the active
    /// segments' in-memory indexes, then build (or write) at most one
    /// sealed segment's file per partition. True when work remains; the
    /// errors met (logged too; the segments concerned are scanned).
    pub fn build_step(&self, log: &StreamLog, errors: &mut Vec<Error>) -> bool {
        let mut more = false;
        for (p, pix) in self.parts.iter().enumerate() {
            let Ok(part) = log.partition(u32::try_from(p).unwrap_or(u32::MAX)) else { continue };
            let fields = self.fields();
            if let Err(e) = pix.catch_up(part, &fields) {
                tracing::warn!(stream = %log.name, partition = p, error = %e, "indexing the active segment failed");
                errors.push(e);
            }
            match pix.build_one(part, &fields) {
                Ok(done) => more |= done,
                Err(e) => {
                    tracing::warn!(stream = %log.name, partition = p, error = %e, "building a segment index failed; it is scanned until a retry succeeds");
                    errors.push(e);
                }
            }
        }
        more
    }
}

impl PartitionIndex {
    /// Brings the in-memory index of the active segment up to the visible
    /// records. When the segment it covered has sealed, it becomes that
    /// segment's (not yet written) index file, once every record of that
    /// segment is visible (under `Sync` a roll can precede the publication
    /// of the last records); until then the new active segment is scanned.
    ///
    /// Lock order: `active`, then `sealed`.
    pub fn catch_up(&self, part: &Partition, fields: &Arc<FieldSet>) -> Result<()> {
        let Some(seg) = part.active_segment() else { return Ok(()) };
        let mut guard = self.active.lock();
        if let Some(m) = guard.as_ref()
            && (m.base != seg.base_seq || m.fields != *fields)
        {
            if m.fields == *fields {
                let old = part.segments().into_iter().find(|s| s.base_seq == m.base);
                match old.as_deref().and_then(|s| header_of(part, s)) {
                    Some(h) if part.visible() < h.last_seq => return Ok(()),
                    Some(h) => {
                        if let (Some(old), Some(mem)) = (old, guard.take()) {
                            self.seal_from_memory(part, mem, &old, &h)?;
                        }
                    }
                    None => *guard = None,
                }
            } else {
                *guard = None;
            }
        }
        let mem = match guard.as_mut() {
            Some(m) => m,
            None => guard.insert(MemIndex::new(seg.base_seq, fields.clone(), 1024)),
        };
        mem.extend(part, part.visible())
    }

    /// Completes a sealed segment's in-memory index and keeps it as that
    /// segment's index file (written later by the builder).
    fn seal_from_memory(&self, part: &Partition, mut mem: MemIndex, seg: &Segment, header: &SixHeader) -> Result<()> {
        mem.extend(part, header.last_seq)?;
        if mem.upto != header.last_seq {
            return Ok(()); // the builder reads it from the log instead
        }
        match SixFile::in_memory(mem.encode(header), seg.six_path()) {
            Ok(f) => {
                self.sealed.write().insert(seg.base_seq, Sealed::Ready(Arc::new(f), false));
                *self.built.lock() = None;
            }
            Err(e) => {
                tracing::warn!(segment = %seg.path(), error = %e, "an encoded index does not decode; it will be rebuilt")
            }
        }
        Ok(())
    }

    /// The loaded index of a sealed segment, probing its file on first use.
    pub fn sealed(&self, part: &Partition, seg: &Segment) -> Option<Arc<SixFile>> {
        match self.sealed.read().get(&seg.base_seq) {
            Some(Sealed::Ready(f, _)) => return Some(f.clone()),
            Some(Sealed::Absent | Sealed::Failed(_)) => return None,
            None => {}
        }
        let header = header_of(part, seg)?;
        let state = match SixFile::open(&**part.vfs(), &seg.six_path(), &header) {
            Ok(f) => Sealed::Ready(Arc::new(f), true),
            Err(e) => {
                if part.vfs().exists(&seg.six_path()).unwrap_or(false) {
                    tracing::info!(file = %part.vfs().describe(&seg.six_path()).display(), reason = %e, "index file refused; it will be rebuilt");
                }
                Sealed::Absent
            }
        };
        let mut map = self.sealed.write();
        let entry = map.entry(seg.base_seq).or_insert(state);
        match entry {
            Sealed::Ready(f, _) => Some(f.clone()),
            Sealed::Absent | Sealed::Failed(_) => None,
        }
    }

    /// Forgets a sealed segment's index (found damaged while reading it).
    pub fn invalidate(&self, base: u64) {
        self.sealed.write().insert(base, Sealed::Absent);
        *self.built.lock() = None;
    }

    /// Builds or writes one sealed segment's index file. True when it did.
    fn build_one(&self, part: &Partition, fields: &Arc<FieldSet>) -> Result<bool> {
        let segs = part.segments();
        // Nothing changed since a pass found everything built: skip the walk.
        let state = (segs.len(), fields.version);
        if *self.built.lock() == Some(state) {
            return Ok(false);
        }
        let mut complete = true;
        for seg in &segs {
            let Some(header) = header_of(part, seg) else { continue };
            if header.last_seq > part.visible() {
                complete = false; // its last records are not published yet
                continue;
            }
            if let Some(Sealed::Failed(at)) = self.sealed.read().get(&seg.base_seq) {
                complete = false;
                if at.elapsed() < RETRY_FAILED_BUILD {
                    continue;
                }
            }
            let current = self.sealed(part, seg);
            let persisted = matches!(self.sealed.read().get(&seg.base_seq), Some(Sealed::Ready(_, true)));
            let file = match current {
                Some(f) if f.fields() == fields.names.as_slice() => {
                    if persisted {
                        continue;
                    }
                    f
                }
                _ => match self.build_from_log(part, seg, &header, fields) {
                    Ok(f) => Arc::new(f),
                    Err(e) => {
                        self.sealed.write().insert(seg.base_seq, Sealed::Failed(std::time::Instant::now()));
                        return Err(e);
                    }
                },
            };
            self.persist(part, seg, &header, &file);
            return Ok(true);
        }
        if complete {
            *self.built.lock() = Some(state);
        }
        Ok(false)
    }

    /// Reads a sealed segment and builds its index in memory.
    fn build_from_log(
        &self,
        part: &Partition,
        seg: &Segment,
        header: &SixHeader,
        fields: &Arc<FieldSet>,
    ) -> Result<SixFile> {
        // Sized for the records the segment can hold (a footer may lie:
        // never allocate by its count alone).
        let fit = header.records_end / MIN_RECORD_BYTES;
        let records = usize::try_from(header.count().min(fit).min(1 << 20)).unwrap_or(0);
        let mut mem = MemIndex::new(seg.base_seq, fields.clone(), records);
        mem.extend(part, header.last_seq)?;
        if mem.upto != header.last_seq {
            return Err(Error::failed(
                "index",
                format!("segment {} ended at sequence {}, its footer says {}", seg.path(), mem.upto, header.last_seq),
            ));
        }
        SixFile::in_memory(mem.encode(header), seg.six_path())
            .map_err(|e| Error::failed("index", format!("encoding the index of {}: {e}", seg.path())))
    }

    /// Writes an index file (temporary name, then rename; no fsync: it is
    /// derived data) and switches to reading it from disk. A failed write
    /// keeps the in-memory copy.
    fn persist(&self, part: &Partition, seg: &Segment, header: &SixHeader, f: &SixFile) {
        let vfs = &**part.vfs();
        let path = seg.six_path();
        let written = match &f.source {
            Source::Memory(bytes) => {
                // A name of its own: two builders never share a temporary file.
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let tmp = format!("{path}.{}-{n}.tmp", std::process::id());
                vfs.open(&tmp, true)
                    .and_then(|file| {
                        file.set_len(0)?;
                        file.write_all_at(bytes, 0)
                    })
                    .and_then(|()| vfs.rename(&tmp, &path))
            }
            Source::File(_) => Ok(()),
        };
        let state = match written {
            Ok(()) => match SixFile::open(vfs, &path, header) {
                Ok(on_disk) => Sealed::Ready(Arc::new(on_disk), true),
                Err(e) => {
                    tracing::warn!(file = %vfs.describe(&path).display(), error = %e, "a written index file does not read back; retrying later");
                    Sealed::Failed(std::time::Instant::now())
                }
            },
            Err(e) => {
                tracing::warn!(file = %vfs.describe(&path).display(), error = %e, "could not write an index file; keeping it in memory");
                match &f.source {
                    Source::Memory(bytes) => match SixFile::in_memory(bytes.clone(), path.clone()) {
                        Ok(m) => Sealed::Ready(Arc::new(m), true),
                        Err(_) => Sealed::Failed(std::time::Instant::now()),
                    },
                    Source::File(_) => Sealed::Failed(std::time::Instant::now()),
                }
            }
        };
        self.sealed.write().insert(seg.base_seq, state);
    }
}

/// The background builder: one thread per engine, stopped (and joined)
/// when the engine closes.
#[derive(Debug)]
pub struct Builder {
    shared: Arc<(Mutex<bool>, Condvar)>,
    stopped: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How often an idle builder looks for new records.
const IDLE: Duration = Duration::from_millis(20);

impl Builder {
    /// Starts the thread. Each round it calls `step` (one round of
    /// [`StreamIndex::build_step`] over every stream; true when work
    /// remains, and it checks `stop` between streams); it sleeps while
    /// there is nothing to do.
    pub fn start(step: impl Fn(&AtomicBool) -> bool + Send + 'static) -> Result<Builder> {
        let shared = Arc::new((Mutex::new(false), Condvar::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let (s, stop) = (shared.clone(), stopped.clone());
        let thread = std::thread::Builder::new()
            .name("rheo-index".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    if !step(&stop) {
                        let mut woken = s.0.lock();
                        if !*woken {
                            s.1.wait_for(&mut woken, IDLE);
                        }
                        *woken = false;
                    }
                }
            })
            .map_err(|e| Error::failed("open", format!("cannot start the index builder thread: {e}")))?;
        Ok(Builder { shared, stopped, thread: Mutex::new(Some(thread)) })
    }

    /// Wakes the builder (new work, e.g. an index was added).
    pub fn wake(&self) {
        *self.shared.0.lock() = true;
        self.shared.1.notify_one();
    }

    /// Stops and joins the thread.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::log::stream::Routed;
    use crate::engine::vfs::MemVfs;
    use crate::engine::{Engine, EngineOptions};
    use crate::model::event::{AppendOptions, NewEvent};
    use crate::model::query::{Access, Query};
    use serde_json::json;

    fn opts() -> EngineOptions {
        EngineOptions::default().segment_bytes(4096).preallocate_bytes(1024).background_indexing(false)
    }

    fn append(engine: &Engine, from: u64, n: u64) {
        let stream = engine.stream("s").expect("stream");
        for i in from..from + n {
            let e = NewEvent::prepare(
                json!({"type": format!("t{}", i % 5), "n": i, "pad": "x".repeat(60)}),
                AppendOptions::new(),
            );
            let (_, ticket) = engine.append(&stream, &[Routed { partition: 0, ts: 1, event: &e }]).expect("append");
            ticket.wait().expect("durable");
        }
    }

    /// The page of `q` by the planner, and by a filtered read of everything.
    fn both(engine: &Engine, q: &Query) -> (Vec<u64>, Vec<u64>, Vec<Access>) {
        let stream = engine.stream("s").expect("stream");
        let log = &stream.log;
        let page = stream.query_page(q).expect("query");
        let all = log.read(0, 0, usize::MAX).expect("read").into_iter().map(|r| r.into_event(&"s".into(), 0));
        let want = q.page_from(all);
        let seqs = |p: &crate::model::query::Page| p.events.iter().map(|e| e.sequence()).collect::<Vec<_>>();
        (seqs(&page), seqs(&want), page.explain.into_iter().map(|e| e.access).collect())
    }

    #[test]
    fn index_files_that_lost_their_content_to_a_power_cut_are_refused_and_rebuilt() {
        let mem = MemVfs::new();
        let vfs: Arc<dyn crate::engine::vfs::Vfs> = Arc::new(mem.clone());
        let engine = Engine::open(vfs.clone(), opts()).expect("open");
        engine.create_stream("s", 1, &["n".into()], 0).expect("create");
        append(&engine, 0, 150);
        engine.build_indexes().expect("build");
        let sealed = engine.stream("s").expect("s").log.partition(0).expect("p").segments().len() - 1;
        assert!(sealed >= 3, "{sealed} sealed segments");
        // More appends roll segments, which syncs the directory: the index
        // files' names become durable, their (never synced) bytes do not.
        append(&engine, 150, 60);
        drop(engine);
        mem.crash();
        let six: Vec<String> = mem
            .list("streams/0000000000000001/00000")
            .expect("list")
            .into_iter()
            .filter(|n| n.ends_with(".six"))
            .collect();
        assert!(!six.is_empty(), "some index file names survived");
        for n in &six {
            let bytes = mem.read_file(&format!("streams/0000000000000001/00000/{n}")).expect("file");
            assert!(file::decode_all(&bytes).is_err(), "{n} kept content it never synced");
        }
        let engine = Engine::open(vfs, opts()).expect("reopen");
        let q = Query::new("s").eq("type", "t3").limit(1000);
        let (got, want, access) = both(&engine, &q);
        assert_eq!(got, want);
        assert!(access.iter().any(|a| matches!(a, Access::Scan { .. })), "refused files are scanned: {access:?}");
        engine.build_indexes().expect("rebuild");
        let (got, want, access) = both(&engine, &q);
        assert_eq!(got, want);
        assert!(access.iter().all(|a| matches!(a, Access::Index { .. })), "{access:?}");
        let ranged = Query::new("s").gte("n", 40).lt("n", 47).limit(1000);
        let (got, want, _) = both(&engine, &ranged);
        assert_eq!((got.len(), got), (7, want));
    }

    #[test]
    fn concurrent_producers_under_sync_with_the_builder_stay_exact_and_get_indexed() {
        let vfs: Arc<dyn crate::engine::vfs::Vfs> = Arc::new(MemVfs::new());
        let o = opts().durability(crate::engine::Durability::Sync).background_indexing(true);
        let engine = Engine::open(vfs, o).expect("open");
        engine.create_stream("s", 1, &["n".into()], 0).expect("create");
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                let engine = engine.clone();
                std::thread::spawn(move || append(&engine, t * 1000, 250))
            })
            .collect();
        let stream = engine.stream("s").expect("stream");
        let log = &stream.log;
        let mut checked = 0;
        while producers.iter().any(|p| !p.is_finished()) || checked < 5 {
            let hw = log.high_watermark(0);
            let q = Query::new("s").eq("type", "t2").until_sequence(hw).limit(10_000);
            let (got, want, _) = both(&engine, &q);
            assert_eq!(got, want, "at high watermark {hw}");
            checked += 1;
        }
        for p in producers {
            p.join().expect("producer");
        }
        // Every sealed segment gets its file soon (no stall on a segment whose
        // last records were published after the roll).
        let t = std::time::Instant::now();
        loop {
            let status = engine.index_status("s").expect("status");
            assert!(status.iter().all(|s| s.segments_failed == 0), "{status:?}");
            if status.iter().all(IndexStatus::ready) {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "not built after 20 s: {status:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        let q = Query::new("s").eq("type", "t2").limit(10_000);
        let (got, want, access) = both(&engine, &q);
        assert_eq!((got.len(), got), (200, want));
        assert!(access.iter().all(|a| matches!(a, Access::Index { .. })), "{access:?}");
    }
}
