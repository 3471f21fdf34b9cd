//! [`StdVfs`]: the real file system, rooted at a directory.

use super::{Vfs, VfsFile, VfsLock};
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

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
    #[cfg(target_os = "linux")]
    fn map_window(&self, offset: u64, len: u64) -> io::Result<Option<super::WriteWindow>> {
        if !maps_without_allocating(&self.0)? || !offset.is_multiple_of(super::WINDOW_ALIGN) {
            return Ok(None);
        }
        let Ok(len) = usize::try_from(len) else { return Ok(None) };
        // A raw mapping: nothing can reach its bytes but through raw
        // pointers, and `WriteWindow::write` only stores to them, under the
        // partition's writer lock, into reserved space past the published
        // records that nothing else writes (the engine's own zeroing
        // `pwrite`s of a rollback run under the same lock; readers use
        // `pread`, which copies whatever the page holds and keeps only
        // published records). The directory's lock keeps other Rheo
        // processes from writing the file. What a mapping cannot report as
        // an error kills the process with SIGBUS instead: a foreign process
        // truncating the file, or a read error (or a file system shut down
        // after errors) when the page being written is brought in; ADR 0035.
        let map = memmap2::MmapOptions::new().offset(offset).len(len).map_raw(&self.0)?;
        Ok(Some(super::WriteWindow::new(offset, map)))
    }
    /// `UTIME_NOW`, which (unlike setting a given time) needs only write
    /// access, not ownership of the file.
    #[cfg(target_os = "linux")]
    fn touch(&self) -> io::Result<()> {
        use rustix::fs::{Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};
        let times = Timestamps {
            last_access: Timespec { tv_sec: 0, tv_nsec: UTIME_OMIT },
            last_modification: Timespec { tv_sec: 0, tv_nsec: UTIME_NOW },
        };
        rustix::fs::futimens(&self.0, &times).map_err(io::Error::from)
    }
    #[cfg(target_os = "linux")]
    fn reserve(&self, from: u64, to: u64) -> io::Result<bool> {
        if to <= from || !maps_without_allocating(&self.0)? {
            return Ok(false);
        }
        match rustix::fs::fallocate(&self.0, rustix::fs::FallocateFlags::empty(), from, to - from) {
            Ok(()) => Ok(true),
            // ext2/3 files without extents cannot reserve: they are written.
            Err(rustix::io::Errno::OPNOTSUPP) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// True when files in `dir` can be written through mapped windows.
#[cfg(test)]
pub(crate) fn std_maps_writes(dir: &Path) -> bool {
    #[cfg(target_os = "linux")]
    return std::fs::File::open(dir).and_then(|f| maps_without_allocating(&f)).unwrap_or(false);
    #[cfg(not(target_os = "linux"))]
    return false;
}

/// True on the file systems where writing a mapped page of reserved space
/// never allocates (so it cannot fail for want of space, which a mapping
/// could only report as SIGBUS): ext4 (files with extents; others cannot
/// reserve and are written) and tmpfs. Not XFS, whose
/// reflinked extents (a `cp` of the file shares them by default) are copied
/// when written, nor Btrfs or ZFS (copy on write) or network file systems:
/// their files are written with `pwrite`.
#[cfg(target_os = "linux")]
fn maps_without_allocating(f: &std::fs::File) -> io::Result<bool> {
    const EXT4: u64 = 0xEF53;
    const TMPFS: u64 = 0x0102_1994;
    let st = rustix::fs::fstatfs(f)?;
    #[allow(clippy::unnecessary_cast, reason = "f_type's width differs between targets")]
    let kind = st.f_type as u64;
    Ok(matches!(kind, EXT4 | TMPFS))
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
