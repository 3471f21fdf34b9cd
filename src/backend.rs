//! The `Backend` trait: the contract every storage backend fulfils.
//!
//! Users hold a [`crate::Rheo`]; backends implement this trait and are held as
//! `Arc<dyn Backend>`. Data flows one way: a URL picks a backend
//! (`backends::open`), the facade validates, the backend stores. So a
//! backend may assume: stream and group names are valid, limits and lease
//! durations are within bounds, every [`NewEvent`] is within the size limit,
//! a replay names exactly one start ([`Replay`]) and a reset was confirmed
//! ([`Reset`]). It returns where appended events went ([`Position`]) and
//! the facade builds the events. Rules that need no storage (whether a
//! delivery has attempts left, a retry's backoff, dead-letter reasons) live
//! in one place, the crate's group rules, which every backend calls.
//!
//! Rules every implementation obeys (the conformance suite in `tests/` checks
//! each one, see `docs/semantics.md`):
//! - `StreamNotFound` is checked before `GroupNotFound`;
//! - every settle (`renew`, `ack`, `retry`, `reject`) fails with `StaleLease`
//!   unless the delivery is still held under that lease id; a backend with
//!   native receipts fails with `ReceiptMismatch` when the receipt differs;
//! - driver errors become `BackendUnavailable` (nothing happened, retry
//!   freely), `Failed` (definitely not done) or `Ambiguous` (unknown);
//! - [`Capabilities`] are honest.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::model::append::NewEvent;
use crate::model::capabilities::Capabilities;
use crate::model::event::{Event, Position};
use crate::model::group::{
    DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, Replay, Reset,
};
use crate::model::lease::{FetchReport, LeaseRef, RetryOutcome};
use crate::model::query::{Page, Query};
use crate::model::retention::{Retention, RetentionReport};
use crate::model::stream::{IndexStatus, StreamInfo, StreamOptions};
use crate::model::time::Timestamp;

tokio::task_local! {
    /// Set on a task whose worker must not block on a sync (see
    /// [`keeping_the_worker_free`]).
    static KEEP_WORKER_FREE: ();
}

/// Runs `call` as a task whose worker must not block on a sync: a native
/// backend hands the commit of a round left to this caller to its commit
/// thread instead of syncing on the caller's thread. For a caller that
/// other tasks of its worker wait behind (the consumer runtime's settler
/// and renewer, while handlers run); a lone caller is faster leading its
/// own sync (two thread switches fewer).
pub(crate) async fn keeping_the_worker_free<F: std::future::Future>(call: F) -> F::Output {
    KEEP_WORKER_FREE.scope((), call).await
}

/// True inside `keeping_the_worker_free`. (Public only through the
/// `internals` feature's `engine` module, for the runtime's tests.)
pub fn worker_kept_free() -> bool {
    KEEP_WORKER_FREE.try_with(|()| ()).is_ok()
}

/// A storage backend. Object-safe; see the module docs for the shared rules.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// The backend's name, as errors and metrics give it (`"native"`,
    /// `"memory"`, `"postgres"`...).
    fn name(&self) -> &'static str;

    /// What this backend guarantees and how it works.
    fn capabilities(&self) -> Capabilities;

    /// Checks the backend is reachable. `BackendUnavailable` when it is not.
    async fn ping(&self) -> Result<()>;

    /// Creates whatever tables, collections or files the backend needs;
    /// idempotent.
    async fn ensure_schema(&self) -> Result<()>;

    /// Creates a stream. `AlreadyExists` when it exists (whatever its
    /// options); `InvalidPartitionCount` for 0 or above the maximum.
    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo>;

    /// Creates a consumer group. `StreamNotFound`, then `AlreadyExists`;
    /// `InvalidPartition` for a partition out of range in `opts`.
    /// The group's frontier starts at its start position minus one.
    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> Result<GroupSummary>;

    /// Appends events atomically: all or none. Each event's partition is
    /// explicit (else `InvalidPartition` when out of range), else
    /// `phash2(key, partition_count)`, else 0; it gets the next sequence of
    /// that partition, so per partition the sequences are contiguous and in
    /// input order. Returns where each event went, in input order (the
    /// facade builds the events from them). `StreamNotFound`.
    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>>;

    /// Events of one partition with sequence > `after`, ascending, at most
    /// `limit`. Never touches group state. `StreamNotFound`,
    /// `InvalidPartition`.
    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>>;

    /// One page of a history query. `StreamNotFound`.
    async fn query(&self, query: &Query) -> Result<Page>;

    /// Claims up to `limit` deliveries in (partition, sequence) order.
    /// Claimable: never claimed, or leased with an expired lease, or retried
    /// with its backoff passed. Each claim has a fresh `lease_id` and
    /// increments `attempt`. `StreamNotFound`, `GroupNotFound`,
    /// `InvalidPartition`.
    ///
    /// A fetch reads its events before it claims anything: when a read
    /// fails the fetch fails with nothing changed (no claim, no attempt
    /// counted). A position whose stored record fails a check is not
    /// claimed but reported in [`FetchReport::damaged`], and the fetch goes
    /// on with the other positions and partitions.
    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<FetchReport>;

    /// Extends a lease to now + `lease`; returns the new expiry. `StaleLease`.
    async fn renew(&self, lease: &LeaseRef, lease_duration: Duration) -> Result<Timestamp>;

    /// Extends many leases to now + `lease_duration`; one result per lease,
    /// in order (the new expiry, or the lease's own error such as
    /// `StaleLease`). The outer error is for failures of the whole call.
    /// Backends override this to renew the batch in one round trip or one
    /// commit.
    async fn renew_many(&self, leases: &[LeaseRef], lease_duration: Duration) -> Result<Vec<Result<Timestamp>>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            match self.renew(lease, lease_duration).await {
                Err(e) if e.is_transient() || matches!(e, Error::Failed { .. }) => return Err(e),
                r => out.push(r),
            }
        }
        Ok(out)
    }

    /// Acknowledges a delivery. `StaleLease` (also for a second ack).
    async fn ack(&self, lease: &LeaseRef) -> Result<()>;

    /// Acknowledges many deliveries; one result per lease, in order. The outer
    /// error is for failures of the whole call. Backends override this to
    /// settle the batch in one round trip or one commit.
    async fn ack_many(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            match self.ack(lease).await {
                Err(e) if e.is_transient() || matches!(e, Error::Failed { .. }) => return Err(e),
                r => out.push(r),
            }
        }
        Ok(out)
    }

    /// Gives a delivery back. With attempts left it becomes claimable after
    /// `delay` (None: the group's backoff); otherwise it is dead-lettered
    /// with reason `max_attempts: <reason>`. `StaleLease`.
    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> Result<RetryOutcome>;

    /// Dead-letters a delivery for this group. `StaleLease`.
    async fn reject(&self, lease: &LeaseRef, reason: &str) -> Result<()>;

    /// Dead-letters one position of a group without reading its event (an
    /// operator's way past a damaged record), whatever its state; a lease
    /// holding it becomes stale. The dead letter's reason is
    /// `skipped: <reason>`. Returns true when it dead-lettered the
    /// position, false when it already was a dead letter.
    /// `StreamNotFound`, `GroupNotFound`, `InvalidPartition`;
    /// `InvalidArgument` for a partition the group does not consume, a
    /// sequence outside `1..=high watermark`, or a position already
    /// acknowledged (or before the group's start).
    async fn skip(&self, _stream: &str, _group: &str, _partition: u32, _sequence: u64, _reason: &str) -> Result<bool> {
        Err(self.unsupported("skip"))
    }

    /// Reopens deliveries (see [`Replay`], validated by the facade);
    /// returns how many events were reopened. `NoEventsInRange` when a
    /// replay by time finds no event at or after the time.
    async fn replay(&self, stream: &str, group: &str, replay: &Replay) -> Result<u64>;

    /// Clears the group's state in scope and restarts it at `reset.start`
    /// (the facade has checked the caller confirmed it).
    async fn reset_group(&self, stream: &str, group: &str, reset: &Reset) -> Result<()>;

    /// Lag per partition (the group's partitions, or `partitions`).
    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag>;

    /// Every stream, by name. `Unsupported` unless implemented.
    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        Err(self.unsupported("list_streams"))
    }

    /// One stream, with each partition's first and last sequence and size
    /// ([`StreamInfo::partitions`]), its retention and dedupe window.
    /// `StreamNotFound`. The default picks it from `list_streams`.
    async fn stream_info(&self, stream: &str) -> Result<StreamInfo> {
        self.list_streams().await?.into_iter().find(|s| s.name == stream).ok_or_else(|| Error::stream_not_found(stream))
    }

    /// Replaces a stream's retention (validated by the facade) and returns
    /// the stream as [`Backend::stream_info`] does. Nothing is dropped until
    /// the next retention pass. `StreamNotFound`.
    async fn set_retention(&self, _stream: &str, _retention: &Retention) -> Result<StreamInfo> {
        Err(self.unsupported("set_retention"))
    }

    /// Runs one retention pass over a stream now (backends also run them in
    /// the background) and says what it dropped. Under the `limits` policy
    /// (and past the `interest` policy's ceiling) every group behind the
    /// new log start is moved to it first, durably, and what it skipped is
    /// counted; then the events go. `StreamNotFound`.
    async fn enforce_retention(&self, _stream: &str) -> Result<RetentionReport> {
        Err(self.unsupported("enforce_retention"))
    }

    /// True when concurrent calls are worth combining (a backend behind a
    /// network round trip): the facade then coalesces the single acks of
    /// one (stream, group), and the fetches of one (stream, group) with the
    /// same consumer, lease and partitions, that arrive while one is in
    /// flight (a combined fetch claims for all and hands each caller its
    /// share, in order). The default is false (an in-process backend
    /// serves one call as cheaply as it would wait for company).
    fn combines_calls(&self) -> bool {
        false
    }

    /// How often the facade should run [`Backend::retention_round`] in the
    /// background (None: never, the default; the native backend runs its
    /// own thread).
    fn retention_interval(&self) -> Option<Duration> {
        None
    }

    /// One background retention round: a pass over every stream that has
    /// a retention, each failure logged (not returned). The default does
    /// nothing.
    async fn retention_round(&self) -> Result<Vec<RetentionReport>> {
        Ok(Vec::new())
    }

    /// The groups of a stream, by name.
    async fn list_groups(&self, _stream: &str) -> Result<Vec<GroupSummary>> {
        Err(self.unsupported("list_groups"))
    }

    /// Dead letters of a group, oldest first; `CursorNotFound` when
    /// `opts.after` names no dead letter of the group.
    async fn dead_letters(&self, _stream: &str, _group: &str, _opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        Err(self.unsupported("dead_letters"))
    }

    /// Lag, in-flight and dead-letter counts of a group.
    async fn group_info(&self, _stream: &str, _group: &str) -> Result<GroupInfo> {
        Err(self.unsupported("group_info"))
    }

    /// Adds an index on `field` (a query path) to `stream`. Events already
    /// in the stream are indexed in the background ([`Backend::index_status`]
    /// reports how far); queries stay exact meanwhile. Adding a field that is
    /// already indexed is a no-op. `StreamNotFound`; an invalid field is
    /// refused with a message naming it.
    async fn create_index(&self, _stream: &str, _field: &str) -> Result<()> {
        Err(self.unsupported("create_index"))
    }

    /// How far each indexed field of `stream` is built. `StreamNotFound`.
    async fn index_status(&self, _stream: &str) -> Result<Vec<IndexStatus>> {
        Err(self.unsupported("index_status"))
    }

    /// A subscription to appends on `stream`: its [`Subscription::wait`]
    /// returns when new events may be claimable. A backend serves one
    /// source per stream (its own append path, one Postgres `LISTEN`, one
    /// change stream) and hands every subscriber a receiver of it
    /// ([`Wakeups::subscribe`]); the default is polling (the wait just
    /// sleeps), and callers keep polling as the safety net either way.
    /// `StreamNotFound`.
    async fn subscribe(&self, _stream: &str) -> Result<Subscription> {
        Ok(Subscription::polling())
    }

    /// The error for an operation this backend does not implement.
    fn unsupported(&self, operation: &'static str) -> Error {
        Error::Unsupported { backend: self.name(), operation }
    }
}

/// The source of one stream's wakeups, kept by a backend: every append
/// (seen by this process, or reported by the database) calls
/// [`Wakeups::appended`], and every subscriber's [`Subscription`] sees it.
///
/// An append with nobody waiting costs one atomic increment and one load:
/// subscribers are woken only while one of them waits.
#[derive(Debug, Default)]
pub struct Wakeups(Arc<WakeState>);

/// What a [`Wakeups`] shares with its subscriptions.
#[derive(Debug, Default)]
struct WakeState {
    /// Appends seen so far.
    appends: AtomicU64,
    /// Subscriptions waiting now.
    waiting: AtomicUsize,
    /// Set when the source is dropped: its subscriptions poll from then on.
    closed: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Wakeups {
    /// Tells every subscriber that events were appended.
    pub fn appended(&self) {
        // SeqCst on both sides: either this load sees a waiter, which was
        // registered with `notify` before it counted itself, or that
        // waiter's load of `appends` sees this increment (wait()).
        self.0.appends.fetch_add(1, Ordering::SeqCst);
        if self.0.waiting.load(Ordering::SeqCst) > 0 {
            self.0.notify.notify_waiters();
        }
    }

    /// A new subscriber: it sees the appends from now on.
    pub fn subscribe(&self) -> Subscription {
        Subscription { state: Some(self.0.clone()), seen: self.0.appends.load(Ordering::SeqCst) }
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }
}

/// A subscription to one stream's appends (see [`Backend::subscribe`]).
///
/// Appends between two waits are not lost: a wait returns at once when
/// anything was appended since the previous one returned (or since the
/// subscription was made). Keep one per consumer loop rather than
/// subscribing for each wait.
#[derive(Debug)]
pub struct Subscription {
    /// None: polling (the backend has no wakeups, or its source is gone).
    state: Option<Arc<WakeState>>,
    /// The appends counted when the last wait returned.
    seen: u64,
}

impl Subscription {
    /// A subscription that never wakes early: each wait sleeps its timeout.
    pub fn polling() -> Self {
        Subscription { state: None, seen: 0 }
    }

    /// True when appends wake it (false: it polls).
    pub fn wakes(&self) -> bool {
        self.state.is_some()
    }

    /// Returns when events were appended since the last wait (true), or
    /// after `timeout` (false).
    pub async fn wait(&mut self, timeout: Duration) -> bool {
        let Some(state) = self.state.clone() else {
            tokio::time::sleep(timeout).await;
            return false;
        };
        /// Uncounts a waiter however its wait ends (a wakeup, a timeout,
        /// or the caller dropping the future).
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before counting itself as waiting (see
            // `appended`): a `notify_waiters` from then on wakes it.
            let notified = state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            state.waiting.fetch_add(1, Ordering::SeqCst);
            let _waiting = Waiting(&state.waiting);
            let now = state.appends.load(Ordering::SeqCst);
            if now != self.seen {
                self.seen = now;
                return true;
            }
            if state.closed.load(Ordering::SeqCst) {
                // The backend dropped its source (it was closed): poll from now.
                self.state = None;
                return false;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
            // Woken: by an append counted since (or one already seen, whose
            // wakeup came late), or by the source closing. Look again.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Wakeups, keeping_the_worker_free, worker_kept_free};
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    #[tokio::test]
    async fn a_subscription_sees_appends_made_before_and_during_its_wait() {
        let source = Wakeups::default();
        let mut sub = source.subscribe();
        assert!(sub.wakes());
        assert!(!sub.wait(Duration::from_millis(20)).await, "nothing appended yet");
        source.appended();
        source.appended();
        assert!(sub.wait(Duration::from_secs(5)).await, "appended between two waits");
        assert!(!sub.wait(Duration::from_millis(20)).await, "both were seen by the last wait");
        let late = source.subscribe();
        drop(late);

        let source = std::sync::Arc::new(source);
        let appender = source.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            appender.appended();
        });
        assert!(sub.wait(Duration::from_secs(10)).await, "woken by an append during the wait");
        assert!(started.elapsed() < Duration::from_secs(5), "woken, not timed out: {:?}", started.elapsed());
        task.await.expect("appender");
        assert_eq!(source.0.waiting.load(Ordering::SeqCst), 0, "no waiter counted after the wait");
    }

    #[tokio::test]
    async fn a_dropped_wait_uncounts_itself_and_a_dropped_source_turns_subscriptions_to_polling() {
        let source = Wakeups::default();
        let mut sub = source.subscribe();
        {
            let wait = sub.wait(Duration::from_secs(10));
            tokio::pin!(wait);
            assert!(futures::poll!(wait.as_mut()).is_pending());
            assert_eq!(source.0.waiting.load(Ordering::SeqCst), 1, "counted while it waits");
        }
        assert_eq!(source.0.waiting.load(Ordering::SeqCst), 0, "uncounted when the wait is dropped");

        let waiting = tokio::spawn(async move {
            let woke = sub.wait(Duration::from_secs(10)).await;
            (woke, sub.wakes())
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let started = Instant::now();
        drop(source);
        let (woke, wakes) = waiting.await.expect("waiter");
        assert!(!woke, "a closed source is not an append");
        assert!(!wakes, "the subscription polls from then on");
        assert!(started.elapsed() < Duration::from_secs(5), "the drop ended the wait");
    }

    #[tokio::test]
    async fn the_worker_is_kept_free_only_inside_the_scope() {
        assert!(!worker_kept_free());
        let inside = keeping_the_worker_free(async {
            tokio::task::yield_now().await;
            worker_kept_free()
        })
        .await;
        assert!(inside, "set across an await inside the scope");
        assert!(!worker_kept_free(), "cleared after it");
    }
}
