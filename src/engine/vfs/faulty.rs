//! [`FaultyVfs`]: a [`MemVfs`] that injects one seeded fault (crash, torn
//! write, full disk, failed sync) after a number of operations.

use super::{MemVfs, Vfs, VfsFile, VfsLock};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
