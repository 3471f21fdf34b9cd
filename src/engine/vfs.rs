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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

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
}

// ---------------------------------------------------------------- StdVfs

/// The real file system, rooted at a directory.
#[derive(Debug, Clone)]
pub struct StdVfs {
    root: PathBuf,
}

impl StdVfs {
    /// A VFS rooted at `root` (created when missing).
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        std::fs::create_dir_all(root.as_ref())?;
        Ok(StdVfs { root: root.as_ref().to_path_buf() })
    }

    /// A VFS rooted at an existing directory (`NotFound` when it is missing;
    /// nothing is created).
    pub fn existing(root: impl AsRef<Path>) -> io::Result<Self> {
        let root = root.as_ref();
        if !std::fs::metadata(root)?.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, format!("{} is not a directory", root.display())));
        }
        Ok(StdVfs { root: root.to_path_buf() })
    }

    fn path(&self, p: &str) -> PathBuf {
        if p.is_empty() { self.root.clone() } else { self.root.join(p) }
    }
}

#[derive(Debug)]
struct StdFile(std::fs::File);

impl VfsFile for StdFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let mut done = 0;
        while done < buf.len() {
            match self.0.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.0.write_all_at(buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

/// The lock files this process holds (canonical paths), so that a second
/// open in the same process is told so rather than blamed on another.
static HELD: std::sync::LazyLock<Mutex<BTreeSet<PathBuf>>> = std::sync::LazyLock::new(Default::default);

#[derive(Debug)]
struct StdLock {
    _file: std::fs::File,
    path: Option<PathBuf>,
}
impl VfsLock for StdLock {}
impl Drop for StdLock {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            HELD.lock().remove(p);
        }
    }
}

impl Vfs for StdVfs {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(create).truncate(false).open(self.path(path))?;
        Ok(Arc::new(StdFile(f)))
    }
    fn open_read(&self, path: &str) -> io::Result<Arc<dyn VfsFile>> {
        Ok(Arc::new(StdFile(std::fs::File::open(self.path(path))?)))
    }
    fn exists(&self, path: &str) -> io::Result<bool> {
        self.path(path).try_exists()
    }
    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        std::fs::create_dir_all(self.path(path))
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.path(dir))? {
            if let Ok(name) = entry?.file_name().into_string() {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.path(from), self.path(to))
    }
    fn remove_file(&self, path: &str) -> io::Result<()> {
        std::fs::remove_file(self.path(path))
    }
    fn remove_dir_all(&self, path: &str) -> io::Result<()> {
        std::fs::remove_dir_all(self.path(path))
    }
    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        std::fs::File::open(self.path(dir))?.sync_all()
    }
    fn lock(&self, path: &str) -> io::Result<Box<dyn VfsLock>> {
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.path(path))?;
        let canonical = std::fs::canonicalize(self.path(path)).ok();
        match f.try_lock() {
            Ok(()) => {
                // Who holds it, for the message of the next one who tries
                // (informational: nothing reads it to decide anything).
                use std::os::unix::fs::FileExt;
                let pid = format!("{}\n", std::process::id());
                if let Err(e) = f.set_len(0).and_then(|()| f.write_all_at(pid.as_bytes(), 0)) {
                    tracing::debug!(error = %e, "could not record the lock holder's pid");
                }
                if let Some(c) = &canonical {
                    HELD.lock().insert(c.clone());
                }
                Ok(Box::new(StdLock { _file: f, path: canonical }))
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let here = canonical.as_ref().is_some_and(|c| HELD.lock().contains(c));
                let who = if here {
                    "another handle in this process (share that handle: Rheo is Clone; or drop it first)".to_owned()
                } else {
                    match std::fs::read_to_string(self.path(path)).ok().and_then(|t| t.trim().parse::<u32>().ok()) {
                        Some(pid) => format!("process {pid}"),
                        None => "another process".to_owned(),
                    }
                };
                Err(io::Error::new(io::ErrorKind::WouldBlock, who))
            }
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
    fn describe(&self, path: &str) -> PathBuf {
        self.path(path)
    }
}

// ---------------------------------------------------------------- MemVfs

#[derive(Debug, Default)]
struct MemData {
    live: Vec<u8>,
    durable: Vec<u8>,
}

type FileId = u64;

#[derive(Debug, Default)]
struct MemState {
    /// The namespace as the running process sees it.
    files: BTreeMap<String, FileId>,
    dirs: BTreeSet<String>,
    /// The namespace that survives a crash.
    durable_files: BTreeMap<String, FileId>,
    durable_dirs: BTreeSet<String>,
    data: BTreeMap<FileId, Arc<Mutex<MemData>>>,
    next_id: FileId,
    locks: BTreeSet<String>,
}

/// An in-memory file system that keeps, beside what the process sees, the
/// image that would survive a power loss: file contents as of their last
/// `sync_data`, and directory entries as of their directory's last
/// `sync_dir`. [`MemVfs::crash`] drops everything else.
#[derive(Debug, Clone, Default)]
pub struct MemVfs {
    state: Arc<Mutex<MemState>>,
    /// Bumped by `crash`; handles from an earlier generation fail.
    generation: Arc<AtomicU64>,
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

fn not_found(path: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{path}: no such file or directory"))
}

#[derive(Debug)]
struct MemFile {
    data: Arc<Mutex<MemData>>,
    generation: Arc<AtomicU64>,
    opened_in: u64,
}

impl MemFile {
    fn check(&self) -> io::Result<()> {
        if self.generation.load(Ordering::SeqCst) != self.opened_in {
            return Err(io::Error::other("file handle from before a simulated crash"));
        }
        Ok(())
    }
}

fn to_usize(n: u64) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))
}

impl VfsFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.check()?;
        let d = self.data.lock();
        let start = to_usize(offset)?.min(d.live.len());
        let n = buf.len().min(d.live.len() - start);
        buf[..n].copy_from_slice(&d.live[start..start + n]);
        Ok(n)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check()?;
        let mut d = self.data.lock();
        let start = to_usize(offset)?;
        let end = start + buf.len();
        if d.live.len() < end {
            d.live.resize(end, 0);
        }
        d.live[start..end].copy_from_slice(buf);
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.check()?;
        Ok(self.data.lock().live.len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check()?;
        let len = to_usize(len)?;
        self.data.lock().live.resize(len, 0);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.check()?;
        let mut d = self.data.lock();
        d.durable = d.live.clone();
        Ok(())
    }
}

#[derive(Debug)]
struct MemLock {
    state: Arc<Mutex<MemState>>,
    path: String,
}
impl VfsLock for MemLock {}
impl Drop for MemLock {
    fn drop(&mut self) {
        self.state.lock().locks.remove(&self.path);
    }
}

impl MemVfs {
    /// An empty file system.
    pub fn new() -> Self {
        Self::default()
    }

    /// Simulates a power loss: every file reverts to its last synced
    /// content, every directory to its last synced entries, every open handle
    /// and lock is invalidated.
    pub fn crash(&self) {
        let mut s = self.state.lock();
        self.generation.fetch_add(1, Ordering::SeqCst);
        s.files = s.durable_files.clone();
        s.dirs = s.durable_dirs.clone();
        s.locks.clear();
        let live: BTreeSet<FileId> = s.files.values().copied().collect();
        s.data.retain(|id, _| live.contains(id));
        for d in s.data.values() {
            let mut d = d.lock();
            d.live = d.durable.clone();
        }
    }

    /// The bytes of every file, as the process sees them (for a simulated
    /// disk capacity).
    pub fn live_bytes(&self) -> u64 {
        let s = self.state.lock();
        s.files.values().filter_map(|id| s.data.get(id)).map(|d| d.lock().live.len() as u64).sum()
    }

    /// The live content of a file (for tests).
    pub fn read_file(&self, path: &str) -> Option<Vec<u8>> {
        let s = self.state.lock();
        let id = s.files.get(path)?;
        Some(s.data.get(id)?.lock().live.clone())
    }

    /// Replaces the live and durable content of a file (for tests that
    /// inject corruption).
    pub fn write_file(&self, path: &str, bytes: &[u8]) -> io::Result<()> {
        let f = self.open(path, true)?;
        f.set_len(0)?;
        f.write_all_at(bytes, 0)?;
        f.sync_data()?;
        self.sync_dir(parent_of(path))
    }

    fn dir_exists(s: &MemState, dir: &str) -> bool {
        dir.is_empty() || s.dirs.contains(dir)
    }
}

impl Vfs for MemVfs {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        let mut s = self.state.lock();
        let id = match s.files.get(path) {
            Some(&id) => id,
            None if create => {
                if !Self::dir_exists(&s, parent_of(path)) {
                    return Err(not_found(parent_of(path)));
                }
                let id = s.next_id;
                s.next_id += 1;
                s.files.insert(path.to_owned(), id);
                s.data.insert(id, Arc::new(Mutex::new(MemData::default())));
                id
            }
            None => return Err(not_found(path)),
        };
        let data = s.data.get(&id).cloned().ok_or_else(|| not_found(path))?;
        Ok(Arc::new(MemFile {
            data,
            generation: self.generation.clone(),
            opened_in: self.generation.load(Ordering::SeqCst),
        }))
    }
    fn exists(&self, path: &str) -> io::Result<bool> {
        let s = self.state.lock();
        Ok(s.files.contains_key(path) || Self::dir_exists(&s, path))
    }
    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        let mut acc = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            s.dirs.insert(acc.clone());
        }
        Ok(())
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let s = self.state.lock();
        if !Self::dir_exists(&s, dir) {
            return Err(not_found(dir));
        }
        let mut out: Vec<String> = s
            .files
            .keys()
            .chain(s.dirs.iter())
            .filter(|p| parent_of(p) == dir && !p.is_empty())
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_owned())
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        let id = s.files.remove(from).ok_or_else(|| not_found(from))?;
        s.files.insert(to.to_owned(), id);
        Ok(())
    }
    fn remove_file(&self, path: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        s.files.remove(path).map(|_| ()).ok_or_else(|| not_found(path))
    }
    fn remove_dir_all(&self, path: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        let prefix = format!("{path}/");
        s.files.retain(|p, _| !p.starts_with(&prefix));
        s.dirs.retain(|p| p != path && !p.starts_with(&prefix));
        Ok(())
    }
    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        if !Self::dir_exists(&s, dir) {
            return Err(not_found(dir));
        }
        let s = &mut *s;
        s.durable_files.retain(|p, _| parent_of(p) != dir);
        s.durable_dirs.retain(|p| parent_of(p) != dir);
        for (p, id) in s.files.iter().filter(|(p, _)| parent_of(p) == dir) {
            s.durable_files.insert(p.clone(), *id);
        }
        for p in s.dirs.iter().filter(|p| parent_of(p) == dir) {
            s.durable_dirs.insert(p.clone());
        }
        Ok(())
    }
    fn lock(&self, path: &str) -> io::Result<Box<dyn VfsLock>> {
        let mut s = self.state.lock();
        if !s.locks.insert(path.to_owned()) {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, "another handle"));
        }
        Ok(Box::new(MemLock { state: self.state.clone(), path: path.to_owned() }))
    }
    fn describe(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("mem:/{path}"))
    }
}

// ---------------------------------------------------------------- FaultyVfs

/// What happens when a [`FaultyVfs`]'s countdown reaches zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The process dies before the operation: it and everything after fails
    /// until [`FaultyVfs::restart`].
    Crash,
    /// A write stores only a prefix (seeded length) of its buffer, then the
    /// process dies. Other operations behave as `Crash`.
    TornWrite,
    /// The operation fails with `StorageFull` (a write may store a prefix);
    /// the process goes on and later operations succeed.
    DiskFull,
    /// The next `sync_data` fails with an I/O error and makes nothing
    /// durable; the process goes on.
    FsyncFails,
}

#[derive(Debug)]
struct FaultPlan {
    countdown: AtomicU64,
    fault: Fault,
    seed: AtomicU64,
}

/// A [`MemVfs`] that injects one seeded fault after a number of mutating
/// operations (write, set_len, sync, create, rename, remove).
#[derive(Debug, Clone)]
pub struct FaultyVfs {
    mem: MemVfs,
    plan: Arc<FaultPlan>,
    dead: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    /// Reads (read_at, list, exists) left before one fails; 0 = never.
    read_countdown: Arc<AtomicU64>,
    /// The simulated disk's size in bytes (`u64::MAX`: unlimited).
    capacity: Arc<AtomicU64>,
}

/// How a mutating operation should proceed.
enum Gate {
    Go,
    /// Fail with this error; for a write, store this many bytes first.
    Fail(io::Error, usize),
}

impl FaultyVfs {
    /// Wraps `mem`; `fault` fires on the `after`-th mutating operation
    /// (0 = never). `seed` chooses torn-write lengths.
    pub fn new(mem: MemVfs, fault: Fault, after: u64, seed: u64) -> Self {
        FaultyVfs {
            mem,
            plan: Arc::new(FaultPlan { countdown: AtomicU64::new(after), fault, seed: AtomicU64::new(seed | 1) }),
            dead: Arc::new(AtomicBool::new(false)),
            ops: Arc::new(AtomicU64::new(0)),
            read_countdown: Arc::new(AtomicU64::new(0)),
            capacity: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// Simulates a disk of `bytes` (None: unlimited): a write that would
    /// grow the files' total past it stores what fits and fails with
    /// `StorageFull`, as `write(2)` does on a full disk, until the capacity
    /// is raised again ("space freed"). Overwrites within a file's length,
    /// truncation and `set_len` (sparse) always succeed.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.capacity.store(bytes.unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// Fails a write that does not fit the capacity, after storing the
    /// part that does.
    fn check_capacity(&self, file: &dyn VfsFile, buf: &[u8], offset: u64) -> io::Result<()> {
        let capacity = self.capacity.load(Ordering::SeqCst);
        if capacity == u64::MAX {
            return Ok(());
        }
        let len = file.len()?;
        let growth = (offset + buf.len() as u64).saturating_sub(len);
        let used = self.mem.live_bytes();
        if used + growth <= capacity {
            return Ok(());
        }
        // What fits: everything up to the file's end, then the free space.
        let free = capacity.saturating_sub(used);
        let fits = usize::try_from(len.saturating_sub(offset) + free).unwrap_or(usize::MAX).min(buf.len());
        if fits > 0 {
            file.write_all_at(&buf[..fits], offset)?;
        }
        Err(io::Error::new(io::ErrorKind::StorageFull, "simulated: no space left on device"))
    }

    /// The file system underneath.
    pub fn mem(&self) -> &MemVfs {
        &self.mem
    }

    /// True once a `Crash` or `TornWrite` fault has fired.
    pub fn crashed(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// How many mutating operations ran so far.
    pub fn op_count(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// Arms the fault again: it fires on the `after`-th mutating operation
    /// from now (0: disarmed).
    pub fn arm(&self, after: u64) {
        self.plan.countdown.store(after, Ordering::SeqCst);
    }

    /// Simulates the machine coming back: drops what was not durable, clears
    /// the crash, and disarms the fault.
    pub fn restart(&self) {
        self.mem.crash();
        self.plan.countdown.store(0, Ordering::SeqCst);
        self.dead.store(false, Ordering::SeqCst);
    }

    fn next_random(&self) -> u64 {
        // xorshift64*: seeded, reproducible torn-write lengths.
        let mut x = self.plan.seed.load(Ordering::SeqCst);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.plan.seed.store(x, Ordering::SeqCst);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn crashed_error() -> io::Error {
        io::Error::other("simulated crash: the process is dead")
    }

    /// Counts a mutating operation and decides whether it fails.
    fn gate(&self, is_write: usize, is_sync: bool) -> Gate {
        if self.crashed() {
            return Gate::Fail(Self::crashed_error(), 0);
        }
        self.ops.fetch_add(1, Ordering::SeqCst);
        let left = self.plan.countdown.load(Ordering::SeqCst);
        if left == 0 {
            return Gate::Go;
        }
        if left > 1 {
            self.plan.countdown.store(left - 1, Ordering::SeqCst);
            return Gate::Go;
        }
        match self.plan.fault {
            Fault::FsyncFails if !is_sync => return Gate::Go,
            _ => self.plan.countdown.store(0, Ordering::SeqCst),
        }
        let prefix =
            if is_write > 0 { usize::try_from(self.next_random() % (is_write as u64)).unwrap_or(0) } else { 0 };
        match self.plan.fault {
            Fault::Crash => {
                self.dead.store(true, Ordering::SeqCst);
                Gate::Fail(Self::crashed_error(), 0)
            }
            Fault::TornWrite => {
                self.dead.store(true, Ordering::SeqCst);
                Gate::Fail(Self::crashed_error(), prefix)
            }
            Fault::DiskFull => {
                Gate::Fail(io::Error::new(io::ErrorKind::StorageFull, "simulated: no space left on device"), prefix)
            }
            Fault::FsyncFails => Gate::Fail(io::Error::other("simulated: fsync failed (EIO)"), 0),
        }
    }

    fn check(&self) -> io::Result<()> {
        if self.crashed() { Err(Self::crashed_error()) } else { Ok(()) }
    }

    /// Makes the `n`-th read from now (`read_at`, `list`, `exists`; 1 = the
    /// next) fail once with an I/O error, independently of the write fault.
    pub fn fail_read_after(&self, n: u64) {
        self.read_countdown.store(n, Ordering::SeqCst);
    }

    fn read_gate(&self) -> io::Result<()> {
        self.check()?;
        let left = self.read_countdown.load(Ordering::SeqCst);
        if left == 0 {
            return Ok(());
        }
        self.read_countdown.store(left - 1, Ordering::SeqCst);
        if left == 1 {
            return Err(io::Error::other("simulated: read failed (EIO)"));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: Arc<dyn VfsFile>,
    vfs: FaultyVfs,
}

impl VfsFile for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.vfs.read_gate()?;
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.vfs.gate(buf.len(), false) {
            Gate::Go => {
                self.vfs.check_capacity(&*self.inner, buf, offset)?;
                self.inner.write_all_at(buf, offset)
            }
            Gate::Fail(e, prefix) => {
                if prefix > 0 {
                    // The torn part reaches the file even though the process died.
                    self.inner.write_all_at(&buf[..prefix], offset)?;
                }
                Err(e)
            }
        }
    }
    fn len(&self) -> io::Result<u64> {
        self.vfs.check()?;
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        match self.vfs.gate(0, false) {
            Gate::Go => self.inner.set_len(len),
            Gate::Fail(e, _) => Err(e),
        }
    }
    fn sync_data(&self) -> io::Result<()> {
        match self.vfs.gate(0, true) {
            Gate::Go => self.inner.sync_data(),
            Gate::Fail(e, _) => Err(e),
        }
    }
}

impl Vfs for FaultyVfs {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        if create && !self.mem.exists(path)? {
            if let Gate::Fail(e, _) = self.gate(0, false) {
                return Err(e);
            }
        } else {
            self.check()?;
        }
        let inner = self.mem.open(path, create)?;
        Ok(Arc::new(FaultyFile { inner, vfs: self.clone() }))
    }
    fn exists(&self, path: &str) -> io::Result<bool> {
        self.read_gate()?;
        self.mem.exists(path)
    }
    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        match self.gate(0, false) {
            Gate::Go => self.mem.create_dir_all(path),
            Gate::Fail(e, _) => Err(e),
        }
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.read_gate()?;
        self.mem.list(dir)
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        match self.gate(0, false) {
            Gate::Go => self.mem.rename(from, to),
            Gate::Fail(e, _) => Err(e),
        }
    }
    fn remove_file(&self, path: &str) -> io::Result<()> {
        match self.gate(0, false) {
            Gate::Go => self.mem.remove_file(path),
            Gate::Fail(e, _) => Err(e),
        }
    }
    fn remove_dir_all(&self, path: &str) -> io::Result<()> {
        match self.gate(0, false) {
            Gate::Go => self.mem.remove_dir_all(path),
            Gate::Fail(e, _) => Err(e),
        }
    }
    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        match self.gate(0, true) {
            Gate::Go => self.mem.sync_dir(dir),
            Gate::Fail(e, _) => Err(e),
        }
    }
    fn lock(&self, path: &str) -> io::Result<Box<dyn VfsLock>> {
        self.check()?;
        self.mem.lock(path)
    }
    fn describe(&self, path: &str) -> PathBuf {
        self.mem.describe(path)
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
