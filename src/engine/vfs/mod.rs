//! The narrow file-system interface every engine file operation goes through.
//!
//! Paths are relative, `/`-separated, and built only by the engine from ids
//! and numbers (never from user input). Three implementations:
//! [`StdVfs`] (a real directory), [`MemVfs`] (in memory, with a separate
//! *durable image* so tests can simulate power loss), and [`FaultyVfs`]
//! (wraps a `MemVfs` and injects failures, torn writes and crashes, seeded).
//!
//! The contract below is what the engine relies on; it is the POSIX contract
//! as Linux provides it, made explicit.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

mod faulty;
mod mem;
mod std_fs;

#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use faulty::{Fault, FaultyVfs};
pub use mem::MemVfs;
pub use std_fs::StdVfs;
#[cfg(test)]
pub(crate) use std_fs::std_maps_writes;

/// A file opened through a [`Vfs`]. Shared between threads; every method
/// takes `&self` and positions are explicit.
pub trait VfsFile: Send + Sync + fmt::Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (0 at or past the end). Sees every completed `write_at`, durable or not.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes all of `buf` at `offset`, extending the file (with zeros in any
    /// gap) when needed. Not durable until `sync_data` returns Ok. On error
    /// any prefix of `buf` may have been written.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// The current length in bytes.
    fn len(&self) -> io::Result<u64>;

    /// True when the file has no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Truncates or extends (with zeros) to `len`. Not durable until `sync_data`.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Makes every completed write and length change of this file durable
    /// (`fdatasync`). After an error, nothing is promised about data written
    /// since the last successful sync, even if a later sync succeeds (the
    /// kernel may have dropped the dirty pages): callers must poison.
    fn sync_data(&self) -> io::Result<()>;

    /// A writable window of `len` bytes at `offset` (a multiple of
    /// [`WINDOW_ALIGN`]) mapped into memory and shared with the file: what
    /// is copied into it is part of the file as a `write_all_at` there
    /// would be (seen by `read_at` at once, made durable by `sync_data`,
    /// kept when the process dies). `Ok(None)` when this file cannot be
    /// written that way (the default; the real file system only on Linux,
    /// on file systems that do not allocate when a mapped page is written:
    /// ext4, tmpfs). The caller copies only into space that
    /// [`VfsFile::reserve`] reserved.
    fn map_window(&self, offset: u64, len: u64) -> io::Result<Option<WriteWindow>> {
        let _ = (offset, len);
        Ok(None)
    }

    /// Sets the file's modification time to now, as a write does. Copies
    /// into a [`WriteWindow`] change it only when they first store to a
    /// page, and a read-only view of a live directory looks for changes by
    /// modification times. The default does nothing.
    fn touch(&self) -> io::Result<()> {
        Ok(())
    }

    /// Reserves the disk space of `from..to` (extending the file to `to`
    /// when shorter; new space reads as zeros) without writing it, so that
    /// copying into a [`WriteWindow`] there cannot run out of space.
    /// `Ok(false)` when this file cannot (the default); a full disk is an
    /// error and changes nothing.
    fn reserve(&self, from: u64, to: u64) -> io::Result<bool> {
        let _ = (from, to);
        Ok(false)
    }
}

/// What a [`WriteWindow`]'s offset is a multiple of (larger than any page
/// size Linux uses for file mappings).
pub const WINDOW_ALIGN: u64 = 64 << 10;

/// The unit in which [`WriteWindow::write`] stores bytes in order: smaller
/// than the smallest record (a frame and a header, 37 bytes; asserted in
/// `segment::format`), so the torn part of one chunk can never hold a
/// whole record.
pub const COPY_CHUNK: usize = 32;

/// A writable window of a file mapped into memory ([`VfsFile::map_window`]).
pub struct WriteWindow {
    offset: u64,
    /// The file offset up to which its pages were brought in writable
    /// ([`WriteWindow::populate`]).
    populated: u64,
    /// Shared with the populating thread while it brings pages in: the
    /// mapping outlives its jobs. Taken out only when the window is dropped.
    #[cfg(target_os = "linux")]
    map: Option<std::sync::Arc<populator::Mapped>>,
}

/// Unmapping a window of brought-in pages takes as long as many copies:
/// the populating thread does it, when its queue has room.
#[cfg(target_os = "linux")]
impl Drop for WriteWindow {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            populator::retire(map);
        }
    }
}

impl fmt::Debug for WriteWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteWindow").field("offset", &self.offset).field("end", &self.end()).finish()
    }
}

impl WriteWindow {
    /// A window of `map` at file offset `offset`.
    #[cfg(target_os = "linux")]
    pub(crate) fn new(offset: u64, map: memmap2::MmapRaw) -> Self {
        WriteWindow { offset, populated: offset, map: Some(std::sync::Arc::new(populator::Mapped::new(map))) }
    }

    /// Has the window's pages from file offset `from` (or from where the
    /// last call stopped, when further) up to `upto` brought into memory,
    /// writable (`MADV_POPULATE_WRITE`), by a background thread when it
    /// keeps up, else here: a page first stored to otherwise faults once
    /// for each 4 KiB, and the kernel's work for each page (a page-cache
    /// page, its buffers, marking it dirty) costs more than the copies into
    /// it. The caller passes only space the file holds reserved
    /// ([`VfsFile::reserve`]), so nothing is allocated. Best effort and
    /// never needed: a page not brought in yet (the thread is behind, or
    /// the kernel is older than Linux 5.14) faults in when written, as
    /// without it; a page the file no longer holds (a segment cut back
    /// while the thread works) fails the call, never the process.
    pub fn populate(&mut self, from: u64, upto: u64) {
        let upto = upto.min(self.end());
        self.populated = self.populated.max(from.min(upto));
        if upto <= self.populated {
            return;
        }
        #[cfg(target_os = "linux")]
        if let (Some(map), Ok(from), Ok(len)) =
            (&self.map, usize::try_from(self.populated - self.offset), usize::try_from(upto - self.populated))
        {
            populator::populate(map, from, len);
        }
        self.populated = upto;
    }

    /// The file offset up to which its pages were brought in
    /// ([`WriteWindow::populate`]).
    pub fn populated(&self) -> u64 {
        self.populated
    }

    /// The file offset of its first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The file offset just past its last byte.
    pub fn end(&self) -> u64 {
        #[cfg(target_os = "linux")]
        return self.offset + self.map.as_ref().map_or(0, |m| m.map.len() as u64);
        #[cfg(not(target_os = "linux"))]
        return self.offset;
    }

    /// Copies `bytes` to file offset `at`; false, copying nothing, when
    /// they do not fit in the window. The caller copies only into space the
    /// file holds ([`VfsFile::reserve`]): a page past the file's end faults.
    ///
    /// The bytes are stored front to back, [`COPY_CHUNK`] at a time, so a
    /// process killed during the copy leaves a prefix of them (and a torn
    /// chunk) in the file, as a `pwrite` cut short does: never a later
    /// record of the copy complete behind a torn earlier one, which
    /// recovery would take for damage in the middle of the log. (`memcpy`
    /// promises no order; glibc's copies store the last bytes first for
    /// some sizes.) No record fits in the torn part of one chunk.
    pub fn write(&mut self, at: u64, bytes: &[u8]) -> bool {
        if at < self.offset || at.saturating_add(bytes.len() as u64) > self.end() {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            use std::sync::atomic::{Ordering, compiler_fence};
            let Ok(start) = usize::try_from(at - self.offset) else { return false };
            let Some(map) = &self.map else { return false };
            let dst = map.map.as_mut_ptr();
            let mut chunks = bytes.chunks_exact(COPY_CHUNK);
            let mut done = start;
            for chunk in chunks.by_ref() {
                #[expect(unsafe_code, reason = "a copy into the mapped window (ADR 0035)")]
                // SAFETY: `start + bytes.len()` is within the mapping (checked
                // above against `end()`), so every chunk's destination is, and
                // the mapping lives while `self.map` does (the populating
                // thread's jobs hold it too, and only advise it); no Rust
                // reference to its bytes exists (a raw mapping); the source is
                // a separate Rust slice, so they do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(chunk.as_ptr(), dst.add(done), COPY_CHUNK);
                }
                // Keeps the compiler from merging or reordering the chunks'
                // stores: a kill takes effect between instructions, and every
                // store executed before it reaches the page.
                compiler_fence(Ordering::Release);
                done += COPY_CHUNK;
            }
            let rest = chunks.remainder();
            #[expect(unsafe_code, reason = "a copy into the mapped window (ADR 0035)")]
            // SAFETY: as above, for the last bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(rest.as_ptr(), dst.add(done), rest.len());
            }
            true
        }
        #[cfg(not(target_os = "linux"))]
        false
    }
}

/// A held exclusive lock; released when dropped.
pub trait VfsLock: Send + Sync + fmt::Debug {}

/// The file system of one data directory.
pub trait Vfs: Send + Sync + fmt::Debug + 'static {
    /// Opens a file for reading and writing. With `create`, creates it empty
    /// when missing (the new name is durable only after `sync_dir` of its
    /// parent); without, a missing file is `NotFound`.
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn VfsFile>>;

    /// Opens an existing file for reading only (a missing file is
    /// `NotFound`). Writing through the handle fails. A read-only view
    /// (`engine::overlay`) opens every file this way.
    fn open_read(&self, path: &str) -> io::Result<Arc<dyn VfsFile>> {
        self.open(path, false)
    }

    /// True when a file or directory exists at `path`.
    fn exists(&self, path: &str) -> io::Result<bool>;

    /// Creates a directory and its parents (durable after `sync_dir` of each parent).
    fn create_dir_all(&self, path: &str) -> io::Result<()>;

    /// The names (not paths) of the entries of a directory, sorted.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;

    /// Atomically replaces `to` with `from` (durable after `sync_dir`).
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;

    /// Removes a file (durable after `sync_dir`).
    fn remove_file(&self, path: &str) -> io::Result<()>;

    /// Removes a directory and everything in it.
    fn remove_dir_all(&self, path: &str) -> io::Result<()>;

    /// Makes the entries of a directory (creations, renames, removals) durable.
    /// `""` is the root.
    fn sync_dir(&self, dir: &str) -> io::Result<()>;

    /// Takes an exclusive advisory lock on a file (created when missing).
    /// `WouldBlock` when another holder has it, in this or another process.
    fn lock(&self, path: &str) -> io::Result<Box<dyn VfsLock>>;

    /// The full path of `path`, for error messages.
    fn describe(&self, path: &str) -> PathBuf;
}

// ---------------------------------------------------------------- StickySync

/// Wraps a file so that its syncs never run concurrently and, once one
/// fails, every later sync fails too. Linux reports a writeback error once
/// per open file: without this, a second syncer (the commit thread after a
/// roll's failed sync, say) could see success for pages the kernel already
/// dropped.
#[derive(Debug)]
pub struct StickySync {
    inner: Arc<dyn VfsFile>,
    failed: parking_lot::Mutex<Option<String>>,
}

impl StickySync {
    /// Wraps `file`.
    pub fn wrap(file: Arc<dyn VfsFile>) -> Arc<dyn VfsFile> {
        Arc::new(StickySync { inner: file, failed: parking_lot::Mutex::new(None) })
    }
}

impl VfsFile for StickySync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        let mut failed = self.failed.lock();
        if let Some(reason) = &*failed {
            return Err(io::Error::other(format!("an earlier fsync of this file failed: {reason}")));
        }
        self.inner.sync_data().inspect_err(|e| *failed = Some(e.to_string()))
    }
    fn map_window(&self, offset: u64, len: u64) -> io::Result<Option<WriteWindow>> {
        self.inner.map_window(offset, len)
    }
    fn reserve(&self, from: u64, to: u64) -> io::Result<bool> {
        self.inner.reserve(from, to)
    }
    fn touch(&self) -> io::Result<()> {
        self.inner.touch()
    }
}

/// The thread that brings mapped pages in ahead of the copies
/// ([`WriteWindow::populate`]): one per process, started on first use, its
/// queue bounded (a full queue, or a thread that could not start, makes
/// the caller do the job itself).
#[cfg(target_os = "linux")]
mod populator {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
    use std::sync::{Arc, OnceLock};

    /// A window's mapping, and whether the window let it go.
    pub(super) struct Mapped {
        pub(super) map: memmap2::MmapRaw,
        /// Set when its window is dropped: its queued jobs are skipped (the
        /// segment may be rolled, cut back, or reopened by another engine
        /// since, and a page brought in over a hole there would allocate).
        retired: AtomicBool,
    }

    impl Mapped {
        pub(super) fn new(map: memmap2::MmapRaw) -> Self {
            Mapped { map, retired: AtomicBool::new(false) }
        }
    }

    /// Pages of a mapping to bring in: offset and length in it.
    struct Job(Arc<Mapped>, usize, usize);

    impl Job {
        fn run(self) {
            if self.2 == 0 || self.0.retired.load(Ordering::Acquire) {
                return;
            }
            // Best effort (see `WriteWindow::populate`): on an error the
            // pages fault in when written.
            let _ = self.0.map.advise_range(memmap2::Advice::PopulateWrite, self.1, self.2);
        }
    }

    /// Jobs queued at most: a window's worth of steps ahead.
    const QUEUED: usize = 16;

    fn queue() -> Option<&'static SyncSender<Job>> {
        static QUEUE: OnceLock<Option<SyncSender<Job>>> = OnceLock::new();
        QUEUE
            .get_or_init(|| {
                let (tx, rx) = sync_channel::<Job>(QUEUED);
                let started = std::thread::Builder::new()
                    .name("rheo-populate".to_owned())
                    .spawn(move || rx.into_iter().for_each(Job::run));
                started.is_ok().then_some(tx)
            })
            .as_ref()
    }

    pub(super) fn populate(map: &Arc<Mapped>, from: usize, len: usize) {
        queue_or_run(Job(map.clone(), from, len));
    }

    /// Has the thread drop a window's mapping (unmapping it, once its
    /// queued jobs, now skipped, are gone).
    pub(super) fn retire(map: Arc<Mapped>) {
        map.retired.store(true, Ordering::Release);
        queue_or_run(Job(map, 0, 0));
    }

    fn queue_or_run(job: Job) {
        match queue() {
            Some(tx) => match tx.try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => job.run(),
            },
            None => job.run(),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::{Job, Mapped};
        use std::os::unix::fs::FileExt;
        use std::sync::Arc;

        /// Bringing in pages the file does not hold (a segment cut back
        /// while the thread works) fails quietly, never with SIGBUS, and
        /// bringing pages in changes neither the file's bytes nor its length.
        #[test]
        fn populating_past_the_end_fails_quietly_and_changes_nothing() {
            let dir = tempfile::tempdir().expect("dir");
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.path().join("f"))
                .expect("create");
            file.write_all_at(&[7u8; 100], 0).expect("write");
            file.set_len(64 << 10).expect("extend");
            let map = Arc::new(Mapped::new(memmap2::MmapOptions::new().len(1 << 20).map_raw(&file).expect("map")));
            Job(map.clone(), 0, 1 << 20).run();
            Job(map.clone(), 4096, 8192).run();
            Job(map, 0, 0).run();
            assert_eq!(file.metadata().expect("stat").len(), 64 << 10, "the length is the file's");
            let mut back = vec![0u8; 64 << 10];
            file.read_exact_at(&mut back, 0).expect("read");
            assert!(back[..100].iter().all(|&b| b == 7) && back[100..].iter().all(|&b| b == 0), "bytes unchanged");
        }

        /// A job queued for a window that was dropped since does nothing:
        /// bringing in a page over a hole would allocate it.
        #[test]
        fn a_retired_windows_jobs_are_skipped() {
            use std::os::unix::fs::MetadataExt;
            let dir = tempfile::tempdir().expect("dir");
            let blocks_after = |retired: bool| {
                let path = dir.path().join(format!("hole-{retired}"));
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)
                    .expect("create");
                file.set_len(256 << 10).expect("a hole");
                let map = Arc::new(Mapped::new(memmap2::MmapOptions::new().map_raw(&file).expect("map")));
                let job = Job(map.clone(), 0, 256 << 10);
                if retired {
                    super::retire(map);
                }
                job.run();
                file.sync_all().expect("sync");
                std::fs::metadata(&path).expect("stat").blocks()
            };
            assert!(blocks_after(false) > 0, "a live window's job brings the pages in (allocating the hole)");
            assert_eq!(blocks_after(true), 0, "a retired window's job does nothing");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every implementation honours the same contract.
    fn contract(vfs: &dyn Vfs) {
        vfs.create_dir_all("a/b").expect("mkdir");
        let f = vfs.open("a/b/f", true).expect("create");
        f.write_all_at(b"hello", 0).expect("write");
        f.write_all_at(b"!", 7).expect("write past end");
        assert_eq!(f.len().expect("len"), 8);
        let mut buf = [9u8; 8];
        assert_eq!(f.read_at(&mut buf, 0).expect("read"), 8);
        assert_eq!(&buf, b"hello\0\0!");
        assert_eq!(f.read_at(&mut buf, 100).expect("read past end"), 0);
        f.set_len(2).expect("truncate");
        assert_eq!(f.len().expect("len"), 2);
        f.sync_data().expect("sync");
        assert_eq!(vfs.list("a/b").expect("list"), vec!["f".to_owned()]);
        assert_eq!(vfs.list("a").expect("list"), vec!["b".to_owned()]);
        vfs.rename("a/b/f", "a/b/g").expect("rename");
        assert!(!vfs.exists("a/b/f").expect("exists"));
        assert!(vfs.exists("a/b/g").expect("exists"));
        assert_eq!(vfs.open("a/b/missing", false).err().map(|e| e.kind()), Some(io::ErrorKind::NotFound));
        vfs.sync_dir("a/b").expect("sync dir");
        let lock = vfs.lock("LOCK").expect("lock");
        assert_eq!(vfs.lock("LOCK").err().map(|e| e.kind()), Some(io::ErrorKind::WouldBlock));
        drop(lock);
        vfs.lock("LOCK").expect("lock again after release");
        vfs.remove_file("a/b/g").expect("remove");
        vfs.remove_dir_all("a").expect("rmdir");
        assert!(!vfs.exists("a/b/g").expect("exists"));
    }

    #[test]
    fn std_vfs_honours_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        contract(&StdVfs::new(dir.path()).expect("vfs"));
    }

    #[test]
    fn mem_vfs_honours_the_contract() {
        contract(&MemVfs::new());
    }

    #[test]
    fn faulty_vfs_without_fault_honours_the_contract() {
        contract(&FaultyVfs::new(MemVfs::new(), Fault::Crash, 0, 1));
    }

    #[test]
    fn crash_keeps_only_synced_data_and_entries() {
        let vfs = MemVfs::new();
        vfs.create_dir_all("d").expect("mkdir");
        vfs.sync_dir("").expect("sync root");
        let f = vfs.open("d/synced", true).expect("create");
        f.write_all_at(b"durable", 0).expect("write");
        f.sync_data().expect("sync");
        vfs.sync_dir("d").expect("sync dir");
        f.write_all_at(b"-lost", 7).expect("write");
        let g = vfs.open("d/unsynced-entry", true).expect("create");
        g.write_all_at(b"x", 0).expect("write");
        g.sync_data().expect("sync data but not the entry");
        vfs.crash();
        assert_eq!(vfs.read_file("d/synced").as_deref(), Some(&b"durable"[..]));
        assert!(!vfs.exists("d/unsynced-entry").expect("exists"));
        assert!(f.len().is_err(), "old handles are dead after a crash");
    }

    #[test]
    fn torn_write_stores_a_prefix_and_kills_the_process() {
        let vfs = FaultyVfs::new(MemVfs::new(), Fault::TornWrite, 2, 7);
        let f = vfs.open("f", true).expect("create is op 1");
        assert!(f.write_all_at(&[1u8; 100], 0).is_err(), "op 2 tears");
        assert!(vfs.crashed());
        assert!(vfs.open("f", false).is_err(), "dead process can't open");
        let live = vfs.mem().read_file("f").expect("file");
        assert!(live.len() < 100);
        vfs.restart();
        assert!(!vfs.crashed());
    }

    #[test]
    fn disk_full_fails_once_and_the_process_continues() {
        let vfs = FaultyVfs::new(MemVfs::new(), Fault::DiskFull, 2, 3);
        let f = vfs.open("f", true).expect("create");
        let err = f.write_all_at(b"abc", 0).expect_err("disk full");
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        f.write_all_at(b"abc", 0).expect("space again");
        assert!(!vfs.crashed());
    }

    #[test]
    fn a_failed_sync_stays_failed() {
        let vfs = FaultyVfs::new(MemVfs::new(), Fault::FsyncFails, 2, 1);
        let f = StickySync::wrap(vfs.open("f", true).expect("create"));
        f.write_all_at(b"abc", 0).expect("write");
        assert!(f.sync_data().is_err(), "the armed sync fails");
        assert!(f.sync_data().is_err(), "and every later one, though the disk would now say Ok");
    }

    #[test]
    fn a_read_fault_fails_one_read() {
        let vfs = FaultyVfs::new(MemVfs::new(), Fault::Crash, 0, 1);
        let f = vfs.open("f", true).expect("create");
        f.write_all_at(b"abc", 0).expect("write");
        vfs.fail_read_after(2);
        let mut buf = [0u8; 3];
        f.read_at(&mut buf, 0).expect("first read");
        assert!(f.read_at(&mut buf, 0).is_err(), "second read fails");
        f.read_at(&mut buf, 0).expect("then reads work again");
        assert!(!vfs.crashed());
    }

    #[test]
    fn fsync_failure_makes_nothing_durable() {
        let vfs = FaultyVfs::new(MemVfs::new(), Fault::FsyncFails, 1, 3);
        vfs.sync_dir("").expect_err("the first sync fails");
        let f = vfs.open("f", true).expect("create");
        vfs.sync_dir("").expect("later syncs work");
        f.write_all_at(b"abc", 0).expect("write");
        f.sync_data().expect("sync");
        assert!(!vfs.crashed());
    }
}
