//! Read-only access to a native data directory another process may hold
//! and write: `native:PATH?read_only=true`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;

use super::{NativeBackend, blocking};
use crate::backend::{Backend, Subscription};
use crate::engine::Engine;
use crate::engine::options::EngineOptions;
use crate::error::{Error, Result};
use crate::model::append::NewEvent;
use crate::model::capabilities::Capabilities;
use crate::model::event::{Event, Position};
use crate::model::group::{
    DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, Replay, Reset,
};
use crate::model::lease::{FetchReport, LeaseRef, RetryOutcome};
use crate::model::query::{Page, Query};
use crate::model::stream::{IndexStatus, StreamInfo, StreamOptions};
use crate::model::time::{Clock, Timestamp};

/// How long a view is served, at least, before the directory is looked at
/// again (and at least twice as long as the last refresh took, so that a
/// reader of a large directory spends at most about a third of a core).
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(50);
/// Opens of a new view tried before the previous one is kept: a view read
/// while the writer rotates a checkpoint or rolls a segment may find files
/// from two moments, which the next try does not.
const OPEN_TRIES: u32 = 5;
/// How long refreshes may keep failing before calls fail instead of
/// answering from the last view.
const STALE_AFTER: Duration = Duration::from_secs(10);
/// How long after its last change a directory is still reopened on every
/// refresh (see [`racy`]).
const RACY_WINDOW: Duration = Duration::from_secs(3);
/// Files looked at for a change, at most (a directory with more is
/// reopened on every refresh).
const MAX_FINGERPRINT_FILES: usize = 100_000;

/// A read-only open of a native data directory: no lock, nothing in the
/// directory ever written, every write refused with [`Error::ReadOnly`].
///
/// It serves a view of what a reopen would recover (the engine recovering
/// into an in-memory copy-on-write view, ADR 0016),
/// and refreshes it when a call comes at least [`REFRESH_INTERVAL`] after the
/// last look and the directory's files changed (their sizes and
/// modification times): reads, queries, lag, group info and dead letters
/// follow the writer's appends and group changes within about that long.
/// A refresh reopens the view, which costs about what the writer's
/// recovery costs (the active segments are scanned, each delivery WAL
/// replayed since its checkpoint; on the 2-core test machine about 30 ms
/// for 25k events in 4 partitions, 50 ms for 1.2M events in 4 partitions
/// with 375 MiB of segments and a 4 MiB WAL, `docs/benchmarks.md`), so a
/// view is kept at least twice as long as its last refresh took. It suits inspection, `rheo tail` and `rheo top`, not a hot
/// path. Group state is as the writer last wrote
/// it to its WAL; leases are shown as of the reader's clock.
///
/// ```no_run
/// # async fn f() -> rheo::Result<()> {
/// // Beside a service that has ./data open:
/// let rheo = rheo::Rheo::open("native:./data?read_only=true").await?;
/// println!("{:?}", rheo.lag("orders", "billing").await?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ReadOnlyNative {
    path: PathBuf,
    opts: EngineOptions,
    clock: Arc<dyn Clock>,
    current: tokio::sync::Mutex<View>,
}

#[derive(Debug)]
struct View {
    backend: NativeBackend,
    fingerprint: Fingerprint,
    looked: Instant,
    /// How long the last open of a view took.
    cost: Duration,
    /// Since when every refresh has failed (none: the last one worked).
    failing_since: Option<Instant>,
}

/// (path, length, modification time) of every file of the directory,
/// and when it was taken.
#[derive(Debug, Clone, PartialEq)]
struct Fingerprint {
    files: Vec<(PathBuf, u64, Option<SystemTime>)>,
    taken: SystemTime,
}

impl Fingerprint {
    /// The same files, sizes and times (whenever taken).
    fn same_files(&self, other: &Fingerprint) -> bool {
        self.files == other.files
    }
}

fn fingerprint(root: &Path) -> Fingerprint {
    let taken = SystemTime::now();
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if out.len() >= MAX_FINGERPRINT_FILES {
                // Too many to compare cheaply: always different.
                out.push((PathBuf::new(), 0, Some(SystemTime::now())));
                return Fingerprint { files: out, taken };
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if entry.file_name() != "LOCK" {
                out.push((entry.path(), meta.len(), meta.modified().ok()));
            }
        }
    }
    out.sort();
    Fingerprint { files: out, taken }
}

/// True when a file's modification time is within [`RACY_WINDOW`] before
/// `view` was taken (or later): modification times are coarse (a jiffy, or
/// a second or two on some file systems), and the writer appends into
/// preallocated space (the size does not change), so a write in the same
/// tick as the view's fingerprint leaves it unchanged. Such a view is
/// reopened until its files are older than that (as git treats "racily
/// clean" files).
fn racy(view: &Fingerprint) -> bool {
    let Some(horizon) = view.taken.checked_sub(RACY_WINDOW) else { return true };
    view.files.iter().any(|(_, _, modified)| modified.is_none_or(|m| m >= horizon))
}

fn open_view(path: &Path, opts: &EngineOptions, clock: &Arc<dyn Clock>) -> Result<(NativeBackend, Fingerprint)> {
    let mut last = None;
    for attempt in 0..OPEN_TRIES {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(20 << attempt.min(3)));
        }
        let before = fingerprint(path);
        // What recovery logs about a view (a torn tail cut, group state
        // above the log's end) is the writer's work in flight, not damage:
        // not logged, or a reader beside a busy writer would log it on every
        // refresh. Damage still fails the reads it affects.
        let opened = tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            Engine::open_read_only(path, opts.clone())
        });
        match opened {
            Ok(engine) => return Ok((NativeBackend::from_engine(engine, clock.clone()), before)),
            // A missing directory or manifest does not come back by retrying.
            Err(e @ Error::Failed { .. }) if attempt == 0 && !path.join("MANIFEST").is_file() => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::failed("open", "no attempt made")))
}

impl ReadOnlyNative {
    /// Opens the data directory at `path` read-only (it must exist).
    pub async fn open(path: &str, opts: EngineOptions, clock: Arc<dyn Clock>) -> Result<Self> {
        let path = PathBuf::from(path);
        let (p, o, c) = (path.clone(), opts.clone(), clock.clone());
        let started = Instant::now();
        let (backend, fingerprint) = blocking(move || open_view(&p, &o, &c)).await?;
        let view = View { backend, fingerprint, looked: Instant::now(), cost: started.elapsed(), failing_since: None };
        Ok(ReadOnlyNative { path, opts, clock, current: tokio::sync::Mutex::new(view) })
    }

    /// The current view, refreshed first when it is older than
    /// [`REFRESH_INTERVAL`] and the directory changed. A refresh that fails
    /// keeps the previous view (and says so in the log): a reader is not
    /// cut off by a writer caught mid-rotation. Once refreshes have failed
    /// for [`STALE_AFTER`], calls fail with the last error instead of
    /// answering from an ever older view.
    async fn view(&self) -> Result<NativeBackend> {
        let mut v = self.current.lock().await;
        if v.looked.elapsed() < REFRESH_INTERVAL.max(v.cost * 2) {
            return Ok(v.backend.clone());
        }
        let path = self.path.clone();
        let now = blocking(move || Ok(fingerprint(&path))).await?;
        v.looked = Instant::now();
        if now.same_files(&v.fingerprint) && !racy(&v.fingerprint) {
            return Ok(v.backend.clone());
        }
        let (p, o, c) = (self.path.clone(), self.opts.clone(), self.clock.clone());
        let started = Instant::now();
        let opened = blocking(move || open_view(&p, &o, &c)).await;
        v.cost = started.elapsed();
        v.looked = Instant::now();
        match opened {
            Ok((backend, fingerprint)) => {
                v.backend = backend;
                v.fingerprint = fingerprint;
                v.failing_since = None;
            }
            Err(e) => {
                let since = *v.failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= STALE_AFTER {
                    return Err(Error::failed(
                        "read-only view",
                        format!(
                            "data directory {}: the view could not be refreshed for {:?}; the last attempt: {e}",
                            self.path.display(),
                            since.elapsed()
                        ),
                    ));
                }
                tracing::warn!(dir = %self.path.display(), error = %e, "could not refresh a read-only view; serving the previous one");
            }
        }
        Ok(v.backend.clone())
    }

    fn refuse(&self, operation: String) -> Error {
        Error::ReadOnly { path: self.path.clone(), operation }
    }
}

#[async_trait]
impl Backend for ReadOnlyNative {
    fn name(&self) -> &'static str {
        super::BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::new(super::BACKEND);
        c.durable = true;
        c.ops_inspect = true;
        c.indexed_query = true;
        c
    }

    async fn ping(&self) -> Result<()> {
        self.view().await.map(|_| ())
    }

    async fn ensure_schema(&self) -> Result<()> {
        Ok(())
    }

    async fn create_stream(&self, stream: &str, _opts: &StreamOptions) -> Result<StreamInfo> {
        Err(self.refuse(format!("creating stream {stream:?}")))
    }

    async fn create_group(&self, stream: &str, group: &str, _opts: &GroupOptions) -> Result<GroupSummary> {
        Err(self.refuse(format!("creating group {stream:?}/{group:?}")))
    }

    async fn append_batch(&self, stream: &str, _events: &[NewEvent]) -> Result<Vec<Position>> {
        Err(self.refuse(format!("appending to stream {stream:?}")))
    }

    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.view().await?.read(stream, partition, after, limit).await
    }

    async fn query(&self, query: &Query) -> Result<Page> {
        self.view().await?.query(query).await
    }

    async fn fetch(&self, stream: &str, group: &str, _opts: &FetchOptions) -> Result<FetchReport> {
        Err(self.refuse(format!("fetching for group {stream:?}/{group:?}")))
    }

    async fn renew(&self, lease: &LeaseRef, _d: Duration) -> Result<Timestamp> {
        Err(self.refuse(format!("renewing a lease of {:?}/{:?}", lease.stream, lease.group)))
    }

    async fn ack(&self, lease: &LeaseRef) -> Result<()> {
        Err(self.refuse(format!("acknowledging a lease of {:?}/{:?}", lease.stream, lease.group)))
    }

    async fn retry(&self, lease: &LeaseRef, _reason: &str, _delay: Option<Duration>) -> Result<RetryOutcome> {
        Err(self.refuse(format!("retrying a lease of {:?}/{:?}", lease.stream, lease.group)))
    }

    async fn reject(&self, lease: &LeaseRef, _reason: &str) -> Result<()> {
        Err(self.refuse(format!("rejecting a lease of {:?}/{:?}", lease.stream, lease.group)))
    }

    async fn skip(&self, stream: &str, group: &str, _partition: u32, _sequence: u64, _reason: &str) -> Result<bool> {
        Err(self.refuse(format!("skipping an event for group {stream:?}/{group:?}")))
    }

    async fn replay(&self, stream: &str, group: &str, _replay: &Replay) -> Result<u64> {
        Err(self.refuse(format!("replaying for group {stream:?}/{group:?}")))
    }

    async fn reset_group(&self, stream: &str, group: &str, _reset: &Reset) -> Result<()> {
        Err(self.refuse(format!("resetting group {stream:?}/{group:?}")))
    }

    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag> {
        self.view().await?.lag(stream, group, partitions).await
    }

    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        self.view().await?.list_streams().await
    }

    async fn list_groups(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        self.view().await?.list_groups(stream).await
    }

    async fn dead_letters(&self, stream: &str, group: &str, opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        self.view().await?.dead_letters(stream, group, opts).await
    }

    async fn group_info(&self, stream: &str, group: &str) -> Result<GroupInfo> {
        self.view().await?.group_info(stream, group).await
    }

    async fn create_index(&self, stream: &str, field: &str) -> Result<()> {
        Err(self.refuse(format!("creating index {field:?} on stream {stream:?}")))
    }

    async fn index_status(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        self.view().await?.index_status(stream).await
    }

    async fn subscribe(&self, stream: &str) -> Result<Subscription> {
        // Checks the stream; appends of another process wake nobody here:
        // callers poll (each poll refreshes the view).
        self.view().await?.list_groups(stream).await?;
        Ok(Subscription::polling())
    }
}
