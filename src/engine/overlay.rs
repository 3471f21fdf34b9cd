//! A private, copy-on-write view of a data directory: the file system of a
//! read-only open.
//!
//! [`OverlayVfs`] reads the real directory through read-only handles and
//! keeps every change the engine makes while opening (a torn tail cut, an
//! index rebuilt, a checkpoint compacted) in memory, visible only to this
//! view. Nothing it does can write, truncate, rename or remove a file of
//! the directory: the only calls it makes on the directory underneath are
//! [`Vfs::open_read`], [`Vfs::exists`], [`Vfs::list`] and
//! [`Vfs::describe`]. Another process may hold the directory's lock and
//! keep appending; what this view shows is what a reopen would have
//! recovered when each file was first read.
//!
//! A file's length is taken when the view first opens it: bytes the writer
//! adds past that length later read as zeros here (the view is refreshed
//! by opening a new one, `backends::native::ReadOnlyNative`).

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use super::vfs::{Vfs, VfsFile, VfsLock};

/// A copy-on-write view over a directory that is never written.
#[derive(Debug)]
pub struct OverlayVfs {
    base: Arc<dyn Vfs>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Every file this view has opened, created or renamed, by path.
    files: HashMap<String, Arc<OverlayFile>>,
    /// Paths removed in this view (files, or directories with everything
    /// under them).
    removed: HashSet<String>,
    /// Directories created in this view.
    dirs: HashSet<String>,
}

impl State {
    fn is_removed(&self, path: &str) -> bool {
        if self.removed.contains(path) {
            return true;
        }
        let mut p = path;
        while let Some((parent, _)) = p.rsplit_once('/') {
            if self.removed.contains(parent) {
                return true;
            }
            p = parent;
        }
        false
    }
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

impl OverlayVfs {
    /// A view over `base`.
    pub fn new(base: Arc<dyn Vfs>) -> Self {
        OverlayVfs { base, state: Mutex::new(State::default()) }
    }

    /// How many bytes this view holds in memory (its changes).
    pub fn overlay_bytes(&self) -> u64 {
        self.state.lock().files.values().map(|f| f.patch_bytes()).sum()
    }
}

impl Vfs for OverlayVfs {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        let mut s = self.state.lock();
        if let Some(f) = s.files.get(path) {
            return Ok(f.clone());
        }
        let removed = s.is_removed(path);
        let file = if removed {
            None
        } else {
            match self.base.open_read(path) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            }
        };
        let f = match file {
            Some(base) => Arc::new(OverlayFile::over(base)?),
            None if create => {
                s.removed.remove(path);
                Arc::new(OverlayFile::empty())
            }
            None => return Err(io::Error::new(io::ErrorKind::NotFound, format!("{path}: no such file"))),
        };
        s.files.insert(path.to_owned(), f.clone());
        Ok(f)
    }

    fn open_read(&self, path: &str) -> io::Result<Arc<dyn VfsFile>> {
        self.open(path, false)
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        let s = self.state.lock();
        if s.files.contains_key(path) || s.dirs.contains(path) {
            return Ok(true);
        }
        if s.is_removed(path) {
            return Ok(false);
        }
        drop(s);
        self.base.exists(path)
    }

    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        let mut p = path;
        while !p.is_empty() {
            s.removed.remove(p);
            s.dirs.insert(p.to_owned());
            p = parent_of(p);
        }
        Ok(())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let s = self.state.lock();
        let in_view = s.dirs.contains(dir) || dir.is_empty();
        let mut names: Vec<String> = if s.is_removed(dir) {
            Vec::new()
        } else {
            match self.base.list(dir) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::NotFound && in_view => Vec::new(),
                Err(e) => return Err(e),
            }
        };
        let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        names.retain(|n| !s.is_removed(&format!("{prefix}{n}")));
        for p in s.files.keys().chain(s.dirs.iter()) {
            if parent_of(p) == dir
                && let Some(name) = p.strip_prefix(&prefix)
                && !names.iter().any(|n| n == name)
            {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let f = self.open(from, false)?;
        let mut s = self.state.lock();
        let f = s.files.remove(from).unwrap_or_else(|| Arc::new(OverlayFile::copy_of(&*f)));
        s.files.insert(to.to_owned(), f);
        s.removed.remove(to);
        s.removed.insert(from.to_owned());
        Ok(())
    }

    fn remove_file(&self, path: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        s.files.remove(path);
        s.removed.insert(path.to_owned());
        Ok(())
    }

    fn remove_dir_all(&self, path: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        let prefix = format!("{path}/");
        s.files.retain(|p, _| !p.starts_with(&prefix));
        s.dirs.retain(|p| p != path && !p.starts_with(&prefix));
        s.removed.insert(path.to_owned());
        Ok(())
    }

    fn sync_dir(&self, _dir: &str) -> io::Result<()> {
        Ok(())
    }

    fn lock(&self, _path: &str) -> io::Result<Box<dyn VfsLock>> {
        // A view takes no lock: the writer may hold it.
        Ok(Box::new(NoLock))
    }

    fn describe(&self, path: &str) -> PathBuf {
        self.base.describe(path)
    }
}

#[derive(Debug)]
struct NoLock;
impl VfsLock for NoLock {}

/// A file of the view: the real file's bytes below `base_limit`, zeros
/// above, and this view's writes over both.
#[derive(Debug)]
struct OverlayFile {
    base: Option<Arc<dyn VfsFile>>,
    state: Mutex<FileState>,
}

#[derive(Debug, Default)]
struct FileState {
    /// Bytes of the real file at or above this read as zeros (under any
    /// write of this view).
    base_limit: u64,
    /// The length as this view sees it.
    len: u64,
    /// This view's writes, applied in order over the base.
    patches: Vec<(u64, Vec<u8>)>,
}

impl OverlayFile {
    fn over(base: Arc<dyn VfsFile>) -> io::Result<Self> {
        let len = base.len()?;
        Ok(OverlayFile { base: Some(base), state: Mutex::new(FileState { base_limit: len, len, patches: Vec::new() }) })
    }

    fn empty() -> Self {
        OverlayFile { base: None, state: Mutex::new(FileState::default()) }
    }

    /// A file with the same contents as `f` (a rename of a file only read
    /// so far shares the handle; this is the fallback when it was not
    /// in the map).
    fn copy_of(f: &dyn VfsFile) -> Self {
        let len = f.len().unwrap_or(0);
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
        let n = f.read_at(&mut buf, 0).unwrap_or(0);
        buf.truncate(n);
        OverlayFile { base: None, state: Mutex::new(FileState { base_limit: 0, len, patches: vec![(0, buf)] }) }
    }

    fn patch_bytes(&self) -> u64 {
        self.state.lock().patches.iter().map(|(_, b)| b.len() as u64).sum()
    }
}

fn overlap(a: u64, a_len: usize, b: u64, b_len: usize) -> Option<(u64, u64)> {
    let start = a.max(b);
    let end = (a + a_len as u64).min(b + b_len as u64);
    (start < end).then_some((start, end))
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl VfsFile for OverlayFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let s = self.state.lock();
        if offset >= s.len {
            return Ok(0);
        }
        let n = to_usize((s.len - offset).min(buf.len() as u64));
        let buf = &mut buf[..n];
        let from_base = to_usize(s.base_limit.saturating_sub(offset).min(n as u64));
        let mut got = 0;
        if let Some(base) = &self.base
            && from_base > 0
        {
            got = base.read_at(&mut buf[..from_base], offset)?;
        }
        buf[got..].fill(0);
        for (at, bytes) in &s.patches {
            if let Some((start, end)) = overlap(offset, n, *at, bytes.len()) {
                let dst = to_usize(start - offset)..to_usize(end - offset);
                let src = to_usize(start - at)..to_usize(end - at);
                buf[dst].copy_from_slice(&bytes[src]);
            }
        }
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        let end = offset + buf.len() as u64;
        // Zeros over a range that already reads as zeros change nothing
        // (the engine zero-fills ahead of its writes).
        let reads_as_zero = offset >= s.base_limit
            && !s.patches.iter().any(|(at, b)| overlap(offset, buf.len(), *at, b.len()).is_some());
        if !(reads_as_zero && buf.iter().all(|&b| b == 0)) {
            s.patches.push((offset, buf.to_vec()));
        }
        s.len = s.len.max(end);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.state.lock().len)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        if len < s.len {
            s.base_limit = s.base_limit.min(len);
            s.patches.retain(|(at, _)| *at < len);
            for (at, bytes) in &mut s.patches {
                bytes.truncate(to_usize(len - *at));
            }
        }
        s.len = len;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::vfs::MemVfs;

    fn base_with(path: &str, bytes: &[u8]) -> Arc<MemVfs> {
        let mem = Arc::new(MemVfs::new());
        mem.create_dir_all(parent_of(path)).expect("mkdir");
        mem.write_file(path, bytes).expect("write");
        mem
    }

    #[test]
    fn changes_stay_in_the_view_and_the_base_is_untouched() {
        let mem = base_with("d/f", b"0123456789");
        let view = OverlayVfs::new(mem.clone());
        let f = view.open("d/f", false).expect("open");
        f.write_all_at(b"ab", 2).expect("write");
        f.set_len(6).expect("truncate");
        f.set_len(8).expect("extend");
        let mut buf = [9u8; 10];
        assert_eq!(f.read_at(&mut buf, 0).expect("read"), 8);
        assert_eq!(&buf[..8], b"01ab45\0\0");
        view.create_dir_all("d/new").expect("mkdir");
        view.open("d/new/g", true).expect("create").write_all_at(b"x", 0).expect("write");
        view.rename("d/f", "d/h").expect("rename");
        view.remove_file("d/new/g").expect("remove");
        assert_eq!(view.list("d").expect("list"), vec!["h".to_owned(), "new".to_owned()]);
        assert!(!view.exists("d/f").expect("exists"));
        // The base still has exactly what it had.
        assert_eq!(mem.read_file("d/f").as_deref(), Some(&b"0123456789"[..]));
        assert_eq!(mem.list("d").expect("list"), vec!["f".to_owned()]);
        assert!(!mem.exists("d/new").expect("exists"));
    }

    #[test]
    fn zero_fill_past_the_base_holds_no_memory() {
        let mem = base_with("f", b"abc");
        let view = OverlayVfs::new(mem);
        let f = view.open("f", false).expect("open");
        f.write_all_at(&vec![0u8; 1 << 20], 3).expect("zero fill");
        assert_eq!(f.len().expect("len"), 3 + (1 << 20));
        assert_eq!(view.overlay_bytes(), 0);
        // Zeros over real bytes are a change and are kept.
        f.write_all_at(&[0u8; 2], 0).expect("zero over data");
        let mut buf = [9u8; 4];
        f.read_at(&mut buf, 0).expect("read");
        assert_eq!(&buf, b"\0\0c\0");
    }

    #[test]
    fn a_removed_directory_hides_its_files_and_a_lock_is_always_granted() {
        let mem = base_with("s/p/f", b"x");
        let view = OverlayVfs::new(mem.clone());
        let _held = mem.lock("LOCK").expect("the writer's lock");
        let _view_lock = view.lock("LOCK").expect("a view takes no lock");
        view.remove_dir_all("s").expect("rmdir");
        assert!(!view.exists("s/p/f").expect("exists"));
        assert_eq!(view.open("s/p/f", false).err().map(|e| e.kind()), Some(io::ErrorKind::NotFound));
        assert!(mem.exists("s/p/f").expect("exists"));
    }
}
