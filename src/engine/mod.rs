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
pub mod log;
pub mod options;
pub mod segment;
pub mod vfs;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, ObjectKind, Result};
use commit::{Committer, Poison, Ticket};
use log::manifest::{self, ManifestBody, StreamEntry, io_err};
use log::partition::Truncation;
use log::stream::{Routed, StreamLog, stream_dir};
pub use options::{Durability, EngineOptions, RecoveryMode};
use vfs::{StdVfs, Vfs, VfsLock};

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
    manifest: Mutex<ManifestBody>,
    streams: RwLock<HashMap<String, Arc<StreamLog>>>,
    committer: Committer,
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

    /// Opens a data directory through `vfs`, recovering every stream.
    pub fn open(vfs: Arc<dyn Vfs>, opts: EngineOptions) -> Result<Engine> {
        let lock = vfs.lock(LOCK).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => Error::Locked { path: vfs.describe("") },
            _ => io_err(&*vfs, LOCK, "lock", e),
        })?;
        let body = match manifest::load(&*vfs)? {
            Some(body) => body,
            None => {
                vfs.create_dir_all(STREAMS).map_err(|e| io_err(&*vfs, STREAMS, "create", e))?;
                vfs.sync_dir("").map_err(|e| io_err(&*vfs, "", "sync", e))?;
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
        for s in &body.streams {
            let log = StreamLog::open(vfs.clone(), &opts, s.id, &s.name, s.partition_count, now, &mut truncations)?;
            streams.insert(s.name.clone(), Arc::new(log));
        }
        let poison = Arc::new(Poison::default());
        let committer = Committer::start(opts.durability, poison.clone())?;
        Ok(Engine {
            inner: Arc::new(Inner {
                vfs,
                opts,
                manifest: Mutex::new(body),
                streams: RwLock::new(streams),
                committer,
                poison,
                truncations,
                _lock: lock,
            }),
        })
    }

    /// The settings it was opened with.
    pub fn options(&self) -> &EngineOptions {
        &self.inner.opts
    }

    /// Torn tails truncated while opening: (file, what was dropped).
    pub fn recovery_report(&self) -> &[(String, Truncation)] {
        &self.inner.truncations
    }

    /// Why writes are refused, once a sync has failed.
    pub fn poisoned(&self) -> Option<String> {
        self.inner.poison.reason()
    }

    /// Creates a stream. `AlreadyExists` when the name is taken.
    pub fn create_stream(
        &self,
        name: &str,
        partition_count: u32,
        indexes: &[String],
        created_ms: i64,
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
        let log =
            StreamLog::open(inner.vfs.clone(), &inner.opts, id, name, partition_count, created_ms, &mut truncations)?;
        inner.vfs.sync_dir(STREAMS).map_err(|e| io_err(&*inner.vfs, STREAMS, "sync", e))?;
        let entry = StreamEntry { id, name: name.to_owned(), partition_count, indexes: indexes.to_vec(), created_ms };
        let mut next = m.clone();
        next.next_stream_id = id + 1;
        next.streams.push(entry.clone());
        manifest::store(&*inner.vfs, &next)?;
        *m = next;
        inner.streams.write().insert(name.to_owned(), Arc::new(log));
        Ok(entry)
    }

    /// A stream's log. `StreamNotFound`.
    pub fn stream(&self, name: &str) -> Result<Arc<StreamLog>> {
        self.inner.streams.read().get(name).cloned().ok_or_else(|| Error::stream_not_found(name))
    }

    /// Every stream's manifest entry, in creation order.
    pub fn stream_entries(&self) -> Vec<StreamEntry> {
        self.inner.manifest.lock().streams.clone()
    }

    /// Appends events atomically (see [`StreamLog::append`]).
    pub fn append(&self, stream: &StreamLog, items: &[Routed<'_>]) -> Result<(Vec<(u32, u64)>, Ticket)> {
        let inner = &*self.inner;
        stream.append(items, &inner.opts, &inner.committer, &inner.poison)
    }

    /// The file system underneath.
    pub fn vfs(&self) -> &Arc<dyn Vfs> {
        &self.inner.vfs
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
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
