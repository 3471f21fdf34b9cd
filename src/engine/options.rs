//! Engine settings.

use std::time::Duration;

/// When an append is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// An append returns after its records are on disk (`fdatasync`).
    /// Concurrent appends share one sync (group commit). The default.
    #[default]
    Sync,
    /// An append returns once written to the OS; a background sync follows
    /// within `max_delay`. A machine crash may lose that window; a process
    /// crash loses nothing.
    Batched {
        /// The longest time between a write and its sync.
        max_delay: Duration,
    },
    /// The OS decides when data reaches the disk. A process crash loses
    /// nothing; a machine crash may lose any recent append.
    None,
}

/// What recovery does with a damaged tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Truncate a torn tail (an append cut short by a crash) and log it;
    /// damage followed by valid records is still `Error::Corrupt`. The default.
    #[default]
    TolerateTornTail,
    /// Any damage to a segment, torn tail included, is `Error::Corrupt`,
    /// and every record of every sealed segment is checked at open (its
    /// checksum and sequence), with its header and footer: an open that
    /// succeeds has read every byte of the log once (about 0.27 s per GiB
    /// from the page cache, the disk's read rate from a cold one; see
    /// `docs/benchmarks.md`). Index files are derived data in every mode:
    /// damaged ones are rebuilt. The other modes check sealed records when
    /// they are read, and read a sealed segment whose header or footer is
    /// damaged by its name and the next segment.
    Strict,
    /// Truncate at the first damaged record even when valid records follow
    /// it, logging what is dropped. For an operator who has read the
    /// `Corrupt` error and accepts losing the rest of the active segment
    /// (e.g. after a power loss that wrote an unsynced tail back out of
    /// order, which can look like damage followed by valid records).
    TruncateAtFirstDamage,
}

/// The largest `segment_bytes` (larger settings act as this).
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// Settings of a native data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineOptions {
    /// When appends are durable (default `Sync`).
    pub durability: Durability,
    /// Recovery policy (default `TolerateTornTail`).
    pub recovery: RecoveryMode,
    /// A segment rolls once it holds this many bytes (default 64 MiB; at
    /// most [`MAX_SEGMENT_BYTES`], so that record offsets and counts within
    /// a segment fit the index files' 32-bit fields).
    pub segment_bytes: u64,
    /// Under `Durability::Sync`, zero-fill the active segment ahead of
    /// writes in steps of up to this many bytes, so that a sync flushes only
    /// data, not the file size, and the commit thread can write a round's
    /// records in one write per partition (default 4 MiB; 0 disables; the
    /// other durabilities never zero-fill segments). The delivery WAL keeps
    /// its own room ahead in steps of up to this much (at least what the
    /// call needs, even with 0). A full disk fails the call with
    /// `Error::NoSpace` in every case, before anything changes: with 0 (or
    /// under `Batched`/`None`) records are written by the appending call,
    /// which undoes a write that failed.
    pub preallocate_bytes: u64,
    /// Under `Batched` and `None`, copy appended records into a shared
    /// mapping of the active segment instead of one `pwrite` per append
    /// (default true; ADR 0035). Used on Linux where writing a mapped page
    /// of reserved space cannot fail for want of space (ext4, tmpfs);
    /// elsewhere, or when mapping fails, records are written as with false.
    /// Space is reserved ahead with `fallocate` in steps of up to 4 MiB.
    /// The cost: what a mapping cannot report as an error kills the process
    /// with `SIGBUS` instead of failing the append: a segment file truncated
    /// from outside (the directory's lock keeps other Rheo processes out),
    /// or a disk read error while the page being written is brought in.
    /// Turn it off where those must be errors.
    pub map_writes: bool,
    /// A stream's consumer-group state is checkpointed once its delivery
    /// WAL holds this many bytes (default 16 MiB) and twice the size of
    /// the last checkpoint (so that a large state is not rewritten for a
    /// little WAL). Bounds reopen time.
    pub checkpoint_bytes: u64,
    /// ... or once this long has passed since the last checkpoint and the
    /// WAL is not empty, checked on the next group call (default 5 min).
    pub checkpoint_interval: Duration,
    /// Build secondary indexes on a background thread (default true).
    /// Without it, queries scan segments whose index file is missing until
    /// the indexes are built (the native backend builds them when
    /// `create_index` is called; the fault-injection tests turn the thread
    /// off to stay deterministic).
    pub background_indexing: bool,
    /// Do the engine's work on the calling thread (default false): commits
    /// run on the threads that wait for durability (no group-commit thread,
    /// no spinning, no hand-off), and the native backend's reads, opens and
    /// large group calls run on the calling task (no blocking-pool hop). The
    /// costs: no batching of concurrent callers' syncs beyond what is queued
    /// when a waiter comes, no background sync (`Batched` syncs as each call
    /// returns, like `Sync`), and an async worker blocked for each disk
    /// read. For single-threaded embedding, deterministic tests and
    /// fuzzing; keep it off in a server.
    pub inline_io: bool,
    /// Open read-only (default false): no lock is taken, so another process
    /// may hold the directory and write; nothing in the directory is ever
    /// written; every write is refused with `Error::ReadOnly`; reads follow
    /// the writer's appends and group changes (the native backend's
    /// `ReadOnlyNative`).
    pub read_only: bool,
    /// How long an append's producer-given id is remembered, per stream, so
    /// that an append retried with the same id ([`AppendOptions::id`](crate::AppendOptions::id))
    /// writes nothing and answers the original (default 2 minutes; zero
    /// turns the check off). At most about a million ids per stream are
    /// kept, about 50 bytes each (the native backend's `dedupe` module).
    pub dedupe_window: Duration,
    /// How often a background thread runs a retention pass over every
    /// stream with a retention (default 10 s; zero: never in the
    /// background, only `Rheo::enforce_retention`).
    pub retention_interval: Duration,
    /// A segment holding records rolls at its next append once this
    /// process has had it open this long (default 1 day; zero: by size
    /// only), so that `max_age` can drop it on a stream that fills segments
    /// slowly (Kafka's `segment.ms`). The age restarts when the directory
    /// is reopened.
    pub segment_max_age: Duration,
    /// A read-only view of a directory a writer may hold: `Strict` recovery
    /// checks every sealed segment and WAL as usual, but tolerates the torn
    /// tail of the active segment and of the last WAL (a live writer's
    /// append in flight), cutting it in the view only.
    pub(crate) live_tail: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            durability: Durability::Sync,
            recovery: RecoveryMode::TolerateTornTail,
            segment_bytes: 64 << 20,
            preallocate_bytes: 4 << 20,
            map_writes: true,
            checkpoint_bytes: 16 << 20,
            checkpoint_interval: Duration::from_secs(300),
            background_indexing: true,
            inline_io: false,
            read_only: false,
            dedupe_window: Duration::from_secs(120),
            retention_interval: Duration::from_secs(10),
            segment_max_age: Duration::from_secs(86_400),
            live_tail: false,
        }
    }
}

impl EngineOptions {
    /// The defaults (see each field).
    ///
    /// ```
    /// use rheo::backends::native::Durability;
    /// use rheo::backends::native::EngineOptions;
    /// let opts = EngineOptions::new().durability(Durability::None).segment_bytes(8 << 20);
    /// assert_eq!(opts.segment_bytes, 8 << 20);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `durability`: When appends are durable.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }
    /// Sets `recovery`: The recovery policy.
    pub fn recovery(mut self, recovery: RecoveryMode) -> Self {
        self.recovery = recovery;
        self
    }
    /// Sets `segment_bytes`: The size at which a segment rolls.
    pub fn segment_bytes(mut self, segment_bytes: u64) -> Self {
        self.segment_bytes = segment_bytes;
        self
    }
    /// Sets `preallocate_bytes`: The zero-fill step ahead of writes (0 disables).
    pub fn preallocate_bytes(mut self, preallocate_bytes: u64) -> Self {
        self.preallocate_bytes = preallocate_bytes;
        self
    }
    /// Sets `map_writes`: Whether `Batched` and `None` appends copy into a mapping of the segment.
    pub fn map_writes(mut self, map_writes: bool) -> Self {
        self.map_writes = map_writes;
        self
    }
    /// Sets `checkpoint_bytes`: The delivery WAL size that triggers a checkpoint.
    pub fn checkpoint_bytes(mut self, checkpoint_bytes: u64) -> Self {
        self.checkpoint_bytes = checkpoint_bytes;
        self
    }
    /// Sets `checkpoint_interval`: The age that triggers a checkpoint of a non-empty WAL.
    pub fn checkpoint_interval(mut self, checkpoint_interval: Duration) -> Self {
        self.checkpoint_interval = checkpoint_interval;
        self
    }
    /// Sets `background_indexing`: Whether secondary indexes build on a background thread.
    pub fn background_indexing(mut self, background_indexing: bool) -> Self {
        self.background_indexing = background_indexing;
        self
    }
    /// Sets `inline_io`: Whether the engine's work runs on the calling thread.
    pub fn inline_io(mut self, inline_io: bool) -> Self {
        self.inline_io = inline_io;
        self
    }
    /// Sets `dedupe_window`: How long producer-given ids are remembered (zero: off).
    pub fn dedupe_window(mut self, dedupe_window: Duration) -> Self {
        self.dedupe_window = dedupe_window;
        self
    }
    /// Sets `retention_interval`: How often background retention passes run (zero: never).
    pub fn retention_interval(mut self, retention_interval: Duration) -> Self {
        self.retention_interval = retention_interval;
        self
    }
    /// Sets `segment_max_age`: The age at which a segment rolls at its next append (zero: by size only).
    pub fn segment_max_age(mut self, segment_max_age: Duration) -> Self {
        self.segment_max_age = segment_max_age;
        self
    }
    /// Sets `read_only`: Whether to open without the lock, for reading only.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }
}
