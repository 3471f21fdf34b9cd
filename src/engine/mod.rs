//! The native storage engine: synchronous, no async runtime inside.
//!
//! A data directory holds a `LOCK` file (held exclusively while open), the
//! `MANIFEST` (the stream registry), and per stream a directory
//! `streams/<id: 16 hex digits>/` with a transaction log `txn` and one
//! directory per partition (`00000`, `00001`, ...) of segments
//! `<base sequence: 20 digits>.log` with their sparse index `.idx`. Stream
//! names are never part of a path. The byte layouts are specified in
//! `format/` and mirrored by the constants in [`segment::format`].

pub mod commit;
/// Whether the calling task runs as one whose worker must not block on a
/// sync (the consumer runtime's settler and renewer): for tests.
#[cfg(feature = "internals")]
pub use crate::backend::worker_kept_free;
pub mod delivery;
pub mod error;
pub mod index;
pub mod inspect;
pub mod log;
pub mod options;
pub mod overlay;
pub mod retention;
pub mod segment;
pub mod stream;
pub mod vfs;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, ObjectKind, Result};
use commit::{Committer, Poison, Ticket};
use delivery::{DeliveryRecovery, EngineParts};
use error::{io_err, sync_err};
use log::manifest::{self, ManifestBody, StreamEntry, StreamSettings};
use log::partition::Truncation;
use log::stream::{Routed, stream_dir};
pub use options::{Durability, EngineOptions};
use stream::Stream;
use vfs::{StdVfs, Vfs, VfsLock};
/// Named by tests, benches and fuzzers (the `internals` feature).
#[cfg(any(test, feature = "internals"))]
pub use {crate::model::event::Document, options::RecoveryMode};

const LOCK: &str = "LOCK";
const STREAMS: &str = "streams";

/// An open data directory.
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    vfs: Arc<dyn Vfs>,
    opts: EngineOptions,
    manifest: Arc<Mutex<ManifestBody>>,
    /// Every stream: its log, indexes and groups.
    streams: Arc<RwLock<HashMap<String, Arc<Stream>>>>,
    /// The background index builder (when enabled).
    builder: Option<index::Builder>,
    /// The background retention passes (when enabled; set once open).
    retainer: std::sync::OnceLock<index::Builder>,
    delivery_recovery: Vec<(String, DeliveryRecovery)>,
    committer: Arc<Committer>,
    poison: Arc<Poison>,
    truncations: Vec<(String, Truncation)>,
    _lock: Box<dyn VfsLock>,
}

impl Engine {
    /// Opens the data directory at `path` (created when missing).
    pub fn open_dir(path: impl AsRef<std::path::Path>, opts: EngineOptions) -> Result<Engine> {
        let path = path.as_ref();
        let vfs = StdVfs::new(path)
            .map_err(|e| Error::failed("open", format!("cannot create data directory {}: {e}", path.display())))?;
        Engine::open(Arc::new(vfs), opts)
    }

    /// Opens the data directory at `path` read-only, without its lock: a
    /// private view ([`overlay::OverlayVfs`]) of what a reopen would
    /// recover now, while another process may hold the directory and keep
    /// writing. Nothing in the directory is created, written, truncated or
    /// removed, whatever recovery finds (a torn tail is cut in the view
    /// only). The view does not follow later writes: open another one.
    /// `Strict` recovery checks every sealed segment and WAL but tolerates
    /// the tail of the active segment and of the last WAL (a live writer's
    /// append may be in flight there); no background index builder runs.
    pub fn open_read_only(path: impl AsRef<std::path::Path>, opts: EngineOptions) -> Result<Engine> {
        let path = path.as_ref();
        let missing = |why: &str| Error::failed("open", format!("no Rheo data directory at {}: {why}", path.display()));
        let base = StdVfs::existing(path).map_err(|e| missing(&e.to_string()))?;
        if !base.exists(manifest::MANIFEST).map_err(|e| io_err(&base, manifest::MANIFEST, "stat", e))? {
            return Err(missing("it has no MANIFEST"));
        }
        Engine::open_view(Arc::new(overlay::OverlayVfs::new(Arc::new(base))), opts)
    }

    /// Opens a read-only view through `vfs` (an [`overlay::OverlayVfs`]):
    /// see [`Engine::open_read_only`].
    pub fn open_view(vfs: Arc<overlay::OverlayVfs>, mut opts: EngineOptions) -> Result<Engine> {
        opts.background_indexing = false;
        opts.inline_io = true;
        opts.live_tail = true;
        Engine::open_inner(vfs, opts, true)
    }

    /// Opens a data directory through `vfs`, recovering every stream.
    pub fn open(vfs: Arc<dyn Vfs>, opts: EngineOptions) -> Result<Engine> {
        Engine::open_inner(vfs, opts, false)
    }

    fn open_inner(vfs: Arc<dyn Vfs>, opts: EngineOptions, view: bool) -> Result<Engine> {
        let lock = vfs.lock(LOCK).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => Error::Locked { path: vfs.describe(""), holder: e.to_string() },
            _ => io_err(&*vfs, LOCK, "lock", e),
        })?;
        let body = match manifest::load(&*vfs)? {
            Some(body) => body,
            None if view => {
                return Err(Error::failed(
                    "open",
                    format!("no Rheo data directory at {}: it has no MANIFEST", vfs.describe("").display()),
                ));
            }
            None => {
                vfs.create_dir_all(STREAMS).map_err(|e| io_err(&*vfs, STREAMS, "create", e))?;
                vfs.sync_dir("").map_err(|e| sync_err(&*vfs, "", e))?;
                let body = ManifestBody { next_stream_id: 1, streams: Vec::new() };
                manifest::store(&*vfs, &body)?;
                body
            }
        };
        vfs.create_dir_all(STREAMS).map_err(|e| io_err(&*vfs, STREAMS, "create", e))?;
        remove_orphans(&*vfs, &body)?;
        let now = log::stream::now_ms();
        let mut truncations = Vec::new();
        let mut streams = HashMap::new();
        let mut delivery_recovery = Vec::new();
        for s in &body.streams {
            let (stream, report) = Stream::open(vfs.clone(), &opts, s, now, &mut truncations)?;
            delivery_recovery.push((s.name.clone(), report));
            streams.insert(s.name.clone(), Arc::new(stream));
        }
        let poison = Arc::new(Poison::default());
        let committer = if opts.inline_io {
            Committer::inline(opts.durability, poison.clone())?
        } else {
            Committer::start(opts.durability, poison.clone())?
        };
        let streams = Arc::new(RwLock::new(streams));
        let builder = if opts.background_indexing {
            let streams = streams.clone();
            Some(index::Builder::start(move |stop: &std::sync::atomic::AtomicBool| {
                let all: Vec<Arc<Stream>> = streams.read().values().cloned().collect();
                let mut more = false;
                for s in all {
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        break;
                    }
                    more |= s.build_step(&mut Vec::new());
                }
                more
            })?)
        } else {
            None
        };
        let engine = Engine {
            inner: Arc::new(Inner {
                vfs,
                opts,
                manifest: Arc::new(Mutex::new(body)),
                streams,
                builder,
                retainer: std::sync::OnceLock::new(),
                delivery_recovery,
                committer: Arc::new(committer),
                poison,
                truncations,
                _lock: lock,
            }),
        };
        if !view && !engine.inner.opts.retention_interval.is_zero() {
            // The thread holds the parts a pass needs, never the engine:
            // dropping the last handle closes the directory at once.
            let parts = engine.retention_parts();
            let retainer = index::Builder::start_named(
                "rheo-retention",
                engine.inner.opts.retention_interval,
                move |_stop: &std::sync::atomic::AtomicBool| {
                    parts.round();
                    false
                },
            )?;
            let _ = engine.inner.retainer.set(retainer);
        }
        Ok(engine)
    }

    /// The settings it was opened with.
    pub fn options(&self) -> &EngineOptions {
        &self.inner.opts
    }

    /// Torn tails truncated while opening: (file, what was dropped).
    pub fn recovery_report(&self) -> &[(String, Truncation)] {
        &self.inner.truncations
    }

    /// What reopening each stream's consumer-group state found.
    pub fn delivery_recovery(&self) -> &[(String, DeliveryRecovery)] {
        &self.inner.delivery_recovery
    }

    /// Why writes are refused, once a sync has failed.
    pub fn poisoned(&self) -> Option<String> {
        self.inner.poison.reason()
    }

    /// Creates a stream with default settings. `AlreadyExists` when the
    /// name is taken.
    pub fn create_stream(
        &self,
        name: &str,
        partition_count: u32,
        indexes: &[String],
        created_ms: i64,
    ) -> Result<StreamEntry> {
        self.create_stream_with(name, partition_count, indexes, created_ms, StreamSettings::default())
    }

    /// Creates a stream with its settings (retention, dedupe window).
    pub fn create_stream_with(
        &self,
        name: &str,
        partition_count: u32,
        indexes: &[String],
        created_ms: i64,
        settings: StreamSettings,
    ) -> Result<StreamEntry> {
        // A failed sync may have dropped pages of any file: refuse writes
        // until reopen, as after a failed sync of an append.
        self.create_stream_inner(name, partition_count, indexes, created_ms, settings)
            .map_err(|e| self.inner.poison.absorb(e))
    }

    fn create_stream_inner(
        &self,
        name: &str,
        partition_count: u32,
        indexes: &[String],
        created_ms: i64,
        settings: StreamSettings,
    ) -> Result<StreamEntry> {
        let inner = &*self.inner;
        inner.poison.check(name)?;
        let mut m = inner.manifest.lock();
        if m.streams.iter().any(|s| s.name == name) {
            return Err(Error::AlreadyExists { kind: ObjectKind::Stream, name: name.to_owned() });
        }
        let id = m.next_stream_id;
        let dir = stream_dir(id);
        if inner.vfs.exists(&dir).map_err(|e| io_err(&*inner.vfs, &dir, "stat", e))? {
            inner.vfs.remove_dir_all(&dir).map_err(|e| io_err(&*inner.vfs, &dir, "remove", e))?;
        }
        let mut truncations = Vec::new();
        // Kept as given (stream info shows them so), one per canonical field.
        let mut declared: Vec<String> = Vec::new();
        let mut seen = Vec::new();
        for f in indexes {
            let c = crate::model::query::check_index_field(name, f)?;
            if !seen.contains(&c) {
                seen.push(c);
                declared.push(f.clone());
            }
        }
        let entry = StreamEntry { id, name: name.to_owned(), partition_count, indexes: declared, created_ms, settings };
        let (stream, _) = Stream::open(inner.vfs.clone(), &inner.opts, &entry, created_ms, &mut truncations)?;
        let dir = stream.log.dir();
        inner.vfs.sync_dir(dir).map_err(|e| sync_err(&*inner.vfs, dir, e))?;
        inner.vfs.sync_dir(STREAMS).map_err(|e| sync_err(&*inner.vfs, STREAMS, e))?;
        let mut next = m.clone();
        next.next_stream_id = id + 1;
        next.streams.push(entry.clone());
        manifest::store(&*inner.vfs, &next)?;
        *m = next;
        inner.streams.write().insert(name.to_owned(), Arc::new(stream));
        Ok(entry)
    }

    /// A stream: its log, indexes and groups. `StreamNotFound`.
    pub fn stream(&self, name: &str) -> Result<Arc<Stream>> {
        self.inner.streams.read().get(name).cloned().ok_or_else(|| Error::stream_not_found(name))
    }

    /// What a delivery table writes through.
    pub(crate) fn ctx(&self) -> EngineParts<'_> {
        EngineParts { opts: &self.inner.opts, committer: &self.inner.committer, poison: &self.inner.poison }
    }

    /// Checkpoints a stream's consumer-group state now (normally triggered
    /// by WAL size or age) and deletes the WAL it covers.
    pub fn checkpoint(&self, stream: &str) -> Result<()> {
        self.stream(stream)?.groups.checkpoint(&self.inner.poison)
    }

    /// Every stream's manifest entry, in creation order.
    pub fn stream_entries(&self) -> Vec<StreamEntry> {
        self.inner.manifest.lock().streams.clone()
    }

    /// Appends events atomically (see [`log::stream::StreamLog::append`]).
    pub fn append(&self, stream: &Stream, items: &[Routed<'_>]) -> Result<(log::stream::Assigned, Ticket)> {
        let inner = &*self.inner;
        stream.log.append(items, &inner.opts, &inner.committer, &inner.poison)
    }

    /// The file system underneath.
    pub fn vfs(&self) -> &Arc<dyn Vfs> {
        &self.inner.vfs
    }

    /// Adds a field to a stream's indexes: recorded in the manifest at
    /// once; existing segments are indexed in the background (see
    /// [`Engine::index_status`]). Adding a field already indexed is a no-op.
    pub fn create_index(&self, stream: &str, field: &str) -> Result<()> {
        let canonical = crate::model::query::check_index_field(stream, field)?;
        let inner = &*self.inner;
        inner.poison.check(stream)?;
        let s = self.stream(stream)?;
        // Under the manifest lock from the check to the new field set, so
        // that concurrent calls neither lose a field nor record one twice.
        let mut m = inner.manifest.lock();
        let mut next = m.clone();
        let Some(entry) = next.streams.iter_mut().find(|s| s.name == stream) else {
            return Err(Error::stream_not_found(stream));
        };
        if index::FieldSet::new(&entry.indexes).contains(&canonical) {
            return Ok(());
        }
        if entry.indexes.len() >= crate::model::stream::MAX_INDEXES {
            return Err(Error::invalid(
                "index",
                format!("stream {stream:?} has {} indexes, the maximum", crate::model::stream::MAX_INDEXES),
            ));
        }
        entry.indexes.push(field.to_owned());
        let declared = entry.indexes.clone();
        manifest::store(&*inner.vfs, &next).map_err(|e| inner.poison.absorb(e))?;
        *m = next;
        s.index.set_declared(&declared);
        drop(m);
        if let Some(b) = &inner.builder {
            b.wake();
        }
        Ok(())
    }

    /// How far each indexed field of a stream is built.
    pub fn index_status(&self, stream: &str) -> Result<Vec<index::IndexStatus>> {
        Ok(self.stream(stream)?.index_status())
    }

    /// Runs index building to completion on the calling thread (what the
    /// background builder does over time): every sealed segment gets its
    /// index file, every active segment's in-memory index catches up.
    /// Returns the first error met (a segment that could not be read is
    /// left to be scanned, and retried after a while).
    pub fn build_indexes(&self) -> Result<()> {
        let all: Vec<Arc<Stream>> = self.inner.streams.read().values().cloned().collect();
        let mut errors = Vec::new();
        for s in all {
            while s.build_step(&mut errors) {}
        }
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(b) = &self.builder {
            b.stop();
        }
        if let Some(r) = self.retainer.get() {
            r.stop();
        }
        self.committer.shutdown();
    }
}

/// Removes stream directories the manifest does not name (a crash during
/// `create_stream`, before the manifest was replaced).
fn remove_orphans(vfs: &dyn Vfs, body: &ManifestBody) -> Result<()> {
    let names = vfs.list(STREAMS).map_err(|e| io_err(vfs, STREAMS, "list", e))?;
    for name in names {
        let known = u64::from_str_radix(&name, 16).is_ok_and(|id| body.streams.iter().any(|s| s.id == id));
        if !known {
            let path = format!("{STREAMS}/{name}");
            tracing::warn!(dir = %vfs.describe(&path).display(), "removing a stream directory the manifest does not know");
            vfs.remove_dir_all(&path).map_err(|e| io_err(vfs, &path, "remove", e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::append::{AppendOptions, NewEvent};
    use serde_json::json;
    use vfs::{MemVfs, VfsFile};

    fn small() -> EngineOptions {
        EngineOptions::default().segment_bytes(4096).preallocate_bytes(1024).background_indexing(false)
    }

    fn append(engine: &Engine, stream: &str, partitions: &[u32]) -> Result<Vec<(u32, u64)>> {
        let stream = engine.stream(stream)?;
        let events: Vec<NewEvent> = partitions
            .iter()
            .map(|&p| NewEvent::prepare(json!({"p": p, "pad": "x".repeat(100)}), AppendOptions::new().partition(p)))
            .collect();
        let routed: Vec<Routed<'_>> =
            events.iter().map(|e| Routed { partition: e.partition.unwrap_or(0), ts: 1, event: e }).collect();
        let (assigned, ticket) = engine.append(&stream, &routed)?;
        ticket.wait()?;
        Ok(assigned.into_vec())
    }

    /// An engine on a new `MemVfs` with stream "s" of `partitions` partitions.
    fn fresh(partitions: u32) -> (MemVfs, Arc<dyn Vfs>, Engine) {
        let mem = MemVfs::new();
        let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
        let engine = Engine::open(vfs.clone(), small()).expect("open");
        engine.create_stream("s", partitions, &[], 0).expect("create");
        (mem, vfs, engine)
    }

    fn seqs(engine: &Engine, stream: &str, p: u32) -> Vec<u64> {
        let stream = engine.stream(stream).expect("stream");
        let log = &stream.log;
        log.read(p, 0, 100_000).expect("read").iter().map(|r| r.header.seq).collect()
    }

    /// Appends 12 MiB of records of 200 B to 4.5 MiB to a one-partition
    /// stream (records straddling window ends, a few larger than a window,
    /// two segment rolls); the sizes and whether the first append was
    /// copied into a mapping.
    fn fill_for_mapping(dir: &std::path::Path, opts: &EngineOptions) -> (Vec<usize>, bool) {
        let engine = Engine::open_dir(dir, opts.clone()).expect("open");
        engine.create_stream("s", 1, &[], 0).expect("create");
        let stream = engine.stream("s").expect("stream");
        let (mut sizes, mut total, mut mapped) = (Vec::new(), 0usize, false);
        while total < 12 << 20 {
            let i = sizes.len();
            let pad = match i % 50 {
                7 => 300_000,
                31 if i % 150 == 31 => 4_500_000,
                n => 200 + n * 37,
            };
            let opts = AppendOptions::new().id(format!("event-{i}"));
            let event = NewEvent::prepare(json!({"i": i, "pad": "y".repeat(pad)}), opts);
            let (_, ticket) = engine.append(&stream, &[Routed { partition: 0, ts: 1, event: &event }]).expect("append");
            ticket.wait().expect("durable");
            if i == 0 {
                mapped = stream.log.partition(0).expect("partition").writes_mapped();
            }
            sizes.push(pad);
            total += pad;
        }
        assert!(stream.log.partition(0).expect("partition").segments().len() >= 3, "segments rolled");
        (sizes, mapped)
    }

    /// Every segment file under `dir` (by path), without its header (which
    /// holds its creation time) and without the zeros after its data.
    fn segment_bytes_of(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
        segment_paths(dir)
            .into_iter()
            .map(|path| {
                let bytes = std::fs::read(&path).expect("read");
                let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                let body = bytes[segment::format::HEADER_LEN.min(end)..end].to_vec();
                (path.strip_prefix(dir).expect("under dir").to_path_buf(), body)
            })
            .collect()
    }

    /// Under `None` and `Batched` on a real directory, records are copied
    /// into mapped windows of the segment (ADR 0035) where the file system
    /// allows it (always on tmpfs: `/dev/shm` is used when there is one):
    /// across window boundaries, with records too large for a window
    /// written instead, through segment rolls. The segment files hold the
    /// same bytes as when every record is written with `pwrite`, and a
    /// reopen reads every record back.
    #[test]
    fn mapped_writes_cross_windows_and_rolls_and_leave_the_bytes_writes_would() {
        let shm = std::path::Path::new("/dev/shm");
        for durability in [Durability::None, Durability::Batched { max_delay: std::time::Duration::from_millis(2) }] {
            let on_shm = cfg!(target_os = "linux") && shm.is_dir();
            let mapped_dir =
                if on_shm { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.expect("temporary directory");
            let opts =
                EngineOptions::default().durability(durability).segment_bytes(6 << 20).background_indexing(false);
            let (sizes, mapped) = fill_for_mapping(mapped_dir.path(), &opts);
            if on_shm {
                assert!(mapped, "appends under {durability:?} on tmpfs are copied into a mapping");
            } else {
                assert_eq!(mapped, vfs::std_maps_writes(mapped_dir.path()));
            }
            let written_dir = tempfile::tempdir().expect("temporary directory");
            let (same_sizes, written) = fill_for_mapping(written_dir.path(), &opts.clone().map_writes(false));
            assert!(!written, "map_writes(false) writes");
            assert_eq!(sizes, same_sizes);
            let (a, b) = (segment_bytes_of(mapped_dir.path()), segment_bytes_of(written_dir.path()));
            assert_eq!(a.len(), b.len(), "as many segments");
            for ((pa, ba), (pb, bb)) in a.iter().zip(&b) {
                assert_eq!(pa, pb);
                assert!(ba == bb, "{} differs: {} bytes mapped, {} written", pa.display(), ba.len(), bb.len());
            }
            let engine = Engine::open_dir(mapped_dir.path(), opts).expect("reopen");
            assert!(engine.recovery_report().is_empty(), "{:?}", engine.recovery_report());
            let stream = engine.stream("s").expect("stream");
            let read: Vec<(u64, usize)> = stream
                .log
                .read(0, 0, 100_000)
                .expect("read")
                .iter()
                .map(|r| {
                    let payload: serde_json::Value = r.doc.payload().decode().expect("payload");
                    assert_eq!(payload["i"], json!(r.header.seq - 1), "record {}", r.header.seq);
                    (r.header.seq, payload["pad"].as_str().map_or(0, str::len))
                })
                .collect();
            let want: Vec<(u64, usize)> = sizes.iter().enumerate().map(|(i, &n)| (i as u64 + 1, n)).collect();
            assert_eq!(read, want, "{durability:?}");
        }
    }

    /// A real directory whose segment files refuse to reserve space while
    /// `full` is set (a full disk as `fallocate` reports it).
    #[derive(Debug)]
    struct FullWhenAsked {
        inner: vfs::StdVfs,
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    #[derive(Debug)]
    struct FullFile {
        inner: Arc<dyn VfsFile>,
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    impl VfsFile for FullFile {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
            self.inner.read_at(buf, offset)
        }
        fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.inner.write_all_at(buf, offset)
        }
        fn len(&self) -> std::io::Result<u64> {
            self.inner.len()
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.inner.sync_data()
        }
        fn map_window(&self, offset: u64, len: u64) -> std::io::Result<Option<vfs::WriteWindow>> {
            self.inner.map_window(offset, len)
        }
        fn touch(&self) -> std::io::Result<()> {
            self.inner.touch()
        }
        fn reserve(&self, from: u64, to: u64) -> std::io::Result<bool> {
            if self.full.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
            }
            self.inner.reserve(from, to)
        }
    }

    impl Vfs for FullWhenAsked {
        fn open(&self, path: &str, create: bool) -> std::io::Result<Arc<dyn VfsFile>> {
            let inner = self.inner.open(path, create)?;
            Ok(Arc::new(FullFile { inner, full: self.full.clone() }))
        }
        fn exists(&self, path: &str) -> std::io::Result<bool> {
            self.inner.exists(path)
        }
        fn create_dir_all(&self, path: &str) -> std::io::Result<()> {
            self.inner.create_dir_all(path)
        }
        fn list(&self, dir: &str) -> std::io::Result<Vec<String>> {
            self.inner.list(dir)
        }
        fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
            self.inner.rename(from, to)
        }
        fn remove_file(&self, path: &str) -> std::io::Result<()> {
            self.inner.remove_file(path)
        }
        fn remove_dir_all(&self, path: &str) -> std::io::Result<()> {
            self.inner.remove_dir_all(path)
        }
        fn sync_dir(&self, dir: &str) -> std::io::Result<()> {
            self.inner.sync_dir(dir)
        }
        fn lock(&self, path: &str) -> std::io::Result<Box<dyn vfs::VfsLock>> {
            self.inner.lock(path)
        }
        fn describe(&self, path: &str) -> std::path::PathBuf {
            self.inner.describe(path)
        }
    }

    /// A copy into a page already written sets no modification time by
    /// itself; the writer sets it (at most every 500 ms), so that a
    /// read-only view, which looks for changed files by their times, sees
    /// the append.
    #[test]
    fn copies_into_a_mapping_keep_the_segments_modification_time_moving() {
        let dir = tempfile::tempdir().expect("tempdir");
        if !vfs::std_maps_writes(dir.path()) {
            eprintln!("skipped: {} cannot be written through mappings", dir.path().display());
            return;
        }
        let opts = EngineOptions::default().durability(Durability::None).background_indexing(false);
        let engine = Engine::open_dir(dir.path(), opts).expect("open");
        engine.create_stream("s", 1, &[], 0).expect("create");
        let stream = engine.stream("s").expect("stream");
        let append_one = |i: usize| {
            let event = NewEvent::prepare(json!({"i": i}), AppendOptions::new());
            let (_, ticket) = engine.append(&stream, &[Routed { partition: 0, ts: 1, event: &event }]).expect("append");
            ticket.wait().expect("written");
        };
        append_one(0);
        assert!(stream.log.partition(0).expect("partition").writes_mapped());
        let mut dirs = vec![dir.path().to_path_buf()];
        let mut segments = Vec::new();
        while let Some(d) = dirs.pop() {
            for entry in std::fs::read_dir(&d).expect("list").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|x| x == "log") && !d.ends_with("groups") {
                    segments.push(path);
                }
            }
        }
        let [segment] = &segments[..] else { panic!("one segment: {segments:?}") };
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let set_old = || {
            let f = std::fs::OpenOptions::new().write(true).open(segment).expect("open segment");
            f.set_modified(old).expect("set time");
        };
        set_old();
        std::thread::sleep(std::time::Duration::from_millis(600));
        // Lands in the page the first append wrote: no fault.
        append_one(1);
        let modified = std::fs::metadata(segment).expect("stat").modified().expect("mtime");
        assert!(modified > old, "{} still shows {modified:?}", segment.display());
    }

    /// A mapped append that cannot reserve its space fails with `NoSpace`
    /// naming the segment, having changed nothing; appends work again once
    /// space is back, and a reopen finds exactly the acknowledged events.
    #[test]
    fn a_mapped_append_on_a_full_disk_fails_cleanly_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        if !vfs::std_maps_writes(dir.path()) {
            eprintln!("skipped: {} cannot be written through mappings", dir.path().display());
            return;
        }
        let full = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let vfs: Arc<dyn Vfs> =
            Arc::new(FullWhenAsked { inner: vfs::StdVfs::new(dir.path()).expect("vfs"), full: full.clone() });
        let opts = EngineOptions::default().durability(Durability::None).background_indexing(false);
        let engine = Engine::open(vfs.clone(), opts.clone()).expect("open");
        engine.create_stream("s", 1, &[], 0).expect("create");
        let stream = engine.stream("s").expect("stream");
        let append_one = |i: usize, pad: usize| {
            let event = NewEvent::prepare(json!({"i": i, "pad": "z".repeat(pad)}), AppendOptions::new());
            engine.append(&stream, &[Routed { partition: 0, ts: 1, event: &event }]).map(|(a, _)| a.into_vec())
        };
        // The first step reserved is 64 KiB: fill most of it, then ask for more.
        let mut acked = 0u64;
        for i in 0..200 {
            assert_eq!(append_one(i, 200).expect("append"), vec![(0, acked + 1)]);
            acked += 1;
        }
        assert!(stream.log.partition(0).expect("partition").writes_mapped());
        full.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut refused = 0;
        for i in 200..400 {
            match append_one(i, 200) {
                Ok(a) => {
                    assert_eq!(a, vec![(0, acked + 1)], "an append inside the reserved space still lands");
                    acked += 1;
                }
                Err(e) => {
                    assert!(e.is_no_space(), "{e}");
                    assert!(e.to_string().contains(".log"), "the error names the segment: {e}");
                    refused += 1;
                }
            }
        }
        assert!(refused > 0, "the disk filled up");
        full.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(append_one(400, 200).expect("append after space is back"), vec![(0, acked + 1)]);
        acked += 1;
        assert_eq!(seqs(&engine, "s", 0), (1..=acked).collect::<Vec<_>>());
        drop(stream);
        drop(engine);
        let engine = Engine::open(vfs, opts).expect("reopen");
        assert!(engine.recovery_report().is_empty(), "{:?}", engine.recovery_report());
        assert_eq!(seqs(&engine, "s", 0), (1..=acked).collect::<Vec<_>>());
        // The reopened file is longer than its records (reserved space, or a
        // hole where recovery cut a tail), but only a reservation made by
        // this writer counts: on a full disk the first append fails.
        let stream = engine.stream("s").expect("stream");
        full.store(true, std::sync::atomic::Ordering::SeqCst);
        let event = NewEvent::prepare(json!({"i": 401}), AppendOptions::new());
        let refused = engine.append(&stream, &[Routed { partition: 0, ts: 1, event: &event }]).expect_err("full");
        assert!(refused.is_no_space(), "{refused}");
        full.store(false, std::sync::atomic::Ordering::SeqCst);
        let (assigned, _) = engine.append(&stream, &[Routed { partition: 0, ts: 1, event: &event }]).expect("append");
        assert_eq!(assigned.into_vec(), vec![(0, acked + 1)]);
        assert_eq!(seqs(&engine, "s", 0), (1..=acked + 1).collect::<Vec<_>>());
    }

    /// Recovery cuts a torn tail by truncating and extending the file back:
    /// a hole. Reopened under `Sync`, the writer zero-fills (allocates) the
    /// hole again before writing there, so a full disk fails an append
    /// cleanly instead of poisoning on the commit thread's write.
    #[test]
    fn a_tail_cut_by_recovery_is_filled_again_before_sync_writes_there() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let dir = tempfile::tempdir().expect("tempdir");
        let none = EngineOptions::default().durability(Durability::None).background_indexing(false);
        let engine = Engine::open_dir(dir.path(), none).expect("open");
        engine.create_stream("s", 1, &[], 0).expect("create");
        append(&engine, "s", &[0, 0, 0]).expect("append");
        drop(engine);
        let log = segment_paths(dir.path()).pop().expect("a segment");
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&log).expect("segment");
        let bytes = std::fs::read(&log).expect("read");
        let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1) as u64;
        // A torn append: junk after the records, and the file 256 KiB long.
        file.write_all_at(&[0xAB; 100], end).expect("junk");
        file.set_len(256 << 10).expect("extend");
        file.sync_all().expect("sync");
        let engine = Engine::open_dir(dir.path(), EngineOptions::default().background_indexing(false)).expect("reopen");
        assert_eq!(engine.recovery_report().len(), 1, "the torn tail was cut: {:?}", engine.recovery_report());
        append(&engine, "s", &[0]).expect("append under Sync");
        // The first zero-fill step is 64 KiB: without it, the records alone
        // (under 4 KiB) would be allocated.
        let allocated = std::fs::metadata(&log).expect("stat").blocks() * 512;
        assert!(allocated >= 64 << 10, "the hole after the cut is filled before Sync writes there: {allocated} bytes");
        assert_eq!(seqs(&engine, "s", 0), vec![1, 2, 3, 4]);
    }

    /// The segment files under `dir` (`<base:020>.log`), by path.
    fn segment_paths(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for entry in std::fs::read_dir(&d).expect("list") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    todo.push(path);
                } else if path.extension().is_some_and(|e| e == "log")
                    && path.file_stem().and_then(|s| s.to_str()).is_some_and(|s| s.len() == 20)
                {
                    out.push(path);
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn appends_roll_segments_and_survive_reopen() {
        let (mem, vfs, engine) = fresh(2);
        for _ in 0..100 {
            append(&engine, "s", &[0, 1, 1]).expect("append");
        }
        assert_eq!(seqs(&engine, "s", 0), (1..=100).collect::<Vec<_>>());
        assert_eq!(seqs(&engine, "s", 1), (1..=200).collect::<Vec<_>>());
        let stream = engine.stream("s").expect("stream");
        let log = &stream.log;
        assert!(log.partition(1).expect("p").segments().len() > 3, "small segments roll");
        let mid: Vec<u64> = log.read(1, 150, 5).expect("read").iter().map(|r| r.header.seq).collect();
        assert_eq!(mid, vec![151, 152, 153, 154, 155]);
        drop(stream);
        drop(engine);
        mem.crash();
        let engine = Engine::open(vfs, small()).expect("reopen");
        assert!(engine.recovery_report().is_empty(), "{:?}", engine.recovery_report());
        assert_eq!(seqs(&engine, "s", 1), (1..=200).collect::<Vec<_>>());
        assert_eq!(append(&engine, "s", &[1]).expect("append"), vec![(1, 201)]);
    }

    #[test]
    fn an_append_marks_its_last_record_of_each_partition_as_the_end() {
        use crate::engine::segment::format::{FLAG_END, FLAG_MULTI};
        let (_mem, _vfs, engine) = fresh(2);
        append(&engine, "s", &[0, 0, 0]).expect("one partition");
        append(&engine, "s", &[0, 1, 0, 1]).expect("two partitions");
        append(&engine, "s", &[1]).expect("one event");
        let stream = engine.stream("s").expect("stream");
        let flags = |p: u32| -> Vec<(u8, bool)> {
            let records = stream.log.read(p, 0, 100).expect("read");
            records.iter().map(|r| (r.header.flags, r.header.txn > 0)).collect()
        };
        let (end, multi_end) = (FLAG_END, FLAG_MULTI | FLAG_END);
        assert_eq!(flags(0), vec![(0, false), (0, false), (end, false), (FLAG_MULTI, true), (multi_end, true)]);
        assert_eq!(flags(1), vec![(FLAG_MULTI, true), (multi_end, true), (end, false)]);
    }

    #[test]
    fn a_second_open_of_the_same_directory_is_refused() {
        let vfs: Arc<dyn Vfs> = Arc::new(MemVfs::new());
        let _engine = Engine::open(vfs.clone(), small()).expect("open");
        assert!(matches!(Engine::open(vfs, small()), Err(Error::Locked { .. })));
    }

    #[test]
    fn a_torn_tail_is_truncated_and_corruption_before_it_is_an_error() {
        let (mem, vfs, engine) = fresh(1);
        for _ in 0..5 {
            append(&engine, "s", &[0]).expect("append");
        }
        drop(engine);
        let path = "streams/0000000000000001/00000/00000000000000000001.log";
        let bytes = mem.read_file(path).expect("segment");
        // Tear the last record: zero its second half.
        let record_len = (bytes.len() - 64 - bytes.iter().rev().take_while(|&&b| b == 0).count()) / 5;
        let end = 64 + 5 * record_len;
        let mut torn = bytes.clone();
        torn[end - record_len / 2..end].fill(0);
        mem.write_file(path, &torn).expect("write");
        let engine = Engine::open(vfs.clone(), small()).expect("reopen tolerates a torn tail");
        assert_eq!(engine.recovery_report().len(), 1);
        assert_eq!(seqs(&engine, "s", 0), vec![1, 2, 3, 4]);
        drop(engine);
        // Strict mode refuses the same damage.
        mem.write_file(path, &torn).expect("write");
        let strict = small().recovery(RecoveryMode::Strict);
        assert!(matches!(Engine::open(vfs.clone(), strict), Err(Error::Corrupt { .. })));
        // A flipped byte in the middle record, followed by good records, is corruption.
        let mut flipped = bytes;
        flipped[64 + 2 * record_len + 20] ^= 0xff;
        mem.write_file(path, &flipped).expect("write");
        match Engine::open(vfs, small()) {
            Err(Error::Corrupt { file, offset, .. }) => {
                assert!(file.to_string_lossy().ends_with(".log"));
                assert_eq!(offset, 64 + 2 * record_len as u64);
            }
            other => panic!("expected corruption, got {other:?}"),
        }
    }

    #[test]
    fn a_multi_partition_batch_is_all_or_nothing_across_a_crash() {
        let (mem, vfs, engine) = fresh(3);
        append(&engine, "s", &[0, 1, 2]).expect("committed batch");
        // Sync partition files of a second batch but not its transaction:
        // simulate by writing it with Durability::None, then syncing only data.
        drop(engine);
        let none = small().durability(Durability::None);
        let engine = Engine::open(vfs.clone(), none).expect("open");
        append(&engine, "s", &[0, 1, 2]).expect("unsynced batch");
        for p in 0..3 {
            let stream = engine.stream("s").expect("stream");
            let log = &stream.log;
            let part = log.partition(p).expect("partition");
            let file = Partition::active_file(&part.lock_writer());
            file.sync_data().expect("sync the data only");
        }
        drop(engine);
        mem.crash();
        let engine = Engine::open(vfs, small()).expect("reopen");
        for p in 0..3 {
            assert_eq!(seqs(&engine, "s", p), vec![1], "partition {p} keeps only the committed batch");
        }
    }

    #[test]
    fn a_failing_read_is_a_typed_error_and_leaves_the_data_intact() {
        let mem = MemVfs::new();
        let faulty = vfs::FaultyVfs::new(mem, vfs::Fault::Crash, 0, 1);
        let vfs: Arc<dyn Vfs> = Arc::new(faulty.clone());
        let engine = Engine::open(vfs.clone(), small()).expect("open");
        engine.create_stream("s", 1, &[], 0).expect("create");
        for _ in 0..40 {
            append(&engine, "s", &[0]).expect("append");
        }
        let stream = engine.stream("s").expect("stream");
        let log = &stream.log;
        for n in 1..=3 {
            faulty.fail_read_after(n);
            match log.read(0, 0, 1000) {
                Err(Error::Failed { .. }) => {}
                other => panic!("read {n}: expected a failed read, got {other:?}"),
            }
        }
        assert_eq!(seqs(&engine, "s", 0), (1..=40).collect::<Vec<_>>(), "a later read sees everything");
        assert!(engine.poisoned().is_none(), "a failed read does not poison");
        append(&engine, "s", &[0]).expect("writes go on");
        drop(stream);
        drop(engine);
        faulty.fail_read_after(3);
        assert!(Engine::open(vfs.clone(), small()).is_err(), "a read failing during recovery fails the open");
        let engine = Engine::open(vfs, small()).expect("the next open recovers");
        assert_eq!(seqs(&engine, "s", 0), (1..=41).collect::<Vec<_>>());
    }

    #[test]
    fn seek_time_finds_the_first_event_at_or_after_a_time_across_segments() {
        let vfs: Arc<dyn Vfs> = Arc::new(MemVfs::new());
        let engine = Engine::open(vfs, small()).expect("open");
        engine.create_stream("s", 1, &[], 0).expect("create");
        let stream = engine.stream("s").expect("stream");
        let log = &stream.log;
        // Timestamps go up by 10 with a dip: 10, 20, ..., except that every
        // 7th event is stamped 5 (producer-supplied times need not be ordered).
        let ts = |n: u64| if n.is_multiple_of(7) { 5 } else { i64::try_from(n).expect("small") * 10 };
        for n in 1..=300u64 {
            let e = NewEvent::prepare(json!({"n": n, "pad": "x".repeat(100)}), AppendOptions::new());
            let (_, ticket) = engine.append(&stream, &[Routed { partition: 0, ts: ts(n), event: &e }]).expect("append");
            ticket.wait().expect("durable");
        }
        assert!(log.partition(0).expect("p").segments().len() > 3);
        for t in [0, 5, 6, 10, 11, 695, 700, 1234, 2990, 3000] {
            let expected = (1..=300u64).find(|&n| ts(n) >= t);
            assert_eq!(log.seek_time(0, t).expect("seek"), expected, "t = {t}");
        }
        assert_eq!(log.seek_time(0, 3001).expect("seek"), None);
    }

    #[test]
    fn lost_pages_before_surviving_ones_never_leave_a_hole_in_the_sequences() {
        // Pages may reach the disk out of order before a sync: records 20..=22
        // lost, later ones (and their index points) persisted.
        let mem = MemVfs::new();
        let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
        let big = small().segment_bytes(1 << 20);
        let engine = Engine::open(vfs.clone(), big.clone()).expect("open");
        engine.create_stream("s", 1, &[], 0).expect("create");
        for _ in 0..60 {
            append(&engine, "s", &[0]).expect("append");
        }
        drop(engine);
        let path = "streams/0000000000000001/00000/00000000000000000001.log";
        let mut bytes = mem.read_file(path).expect("segment");
        let file = mem.open(path, false).expect("open");
        let mut offsets = Vec::new();
        let mut scanner = segment::scan::Scanner::new(&*file, 64, bytes.len() as u64);
        while let segment::scan::Step::Record { offset, .. } = scanner.next_step().expect("scan") {
            offsets.push(usize::try_from(offset).expect("small"));
        }
        drop(file);
        assert_eq!(offsets.len(), 60);
        bytes[offsets[19]..offsets[22]].fill(0);
        mem.write_file(path, &bytes).expect("write");
        let engine = Engine::open(vfs, big).expect("reopen");
        assert_eq!(seqs(&engine, "s", 0), (1..=19).collect::<Vec<_>>(), "nothing after the hole is kept");
        assert_eq!(engine.stream("s").expect("stream").log.high_watermark(0), 19);
        assert_eq!(append(&engine, "s", &[0]).expect("append"), vec![(0, 20)]);
    }

    use log::partition::Partition;
}
