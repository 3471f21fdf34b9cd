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

mod builder;
pub mod extract;
pub mod file;
mod memory;
pub mod planner;
pub mod prefilter;
mod reader;
pub mod term;

pub use builder::Builder;
use memory::MemIndex;
use reader::{SixFile, Source};

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

pub use crate::model::stream::IndexStatus;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::log::stream::Routed;
    use crate::engine::vfs::MemVfs;
    use crate::engine::{Engine, EngineOptions};
    use crate::model::append::{AppendOptions, NewEvent};
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
