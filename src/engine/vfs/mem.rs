//! [`MemVfs`]: an in-memory file system with the image a power loss would
//! leave.

use super::{Vfs, VfsFile, VfsLock};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

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
