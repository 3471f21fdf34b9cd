//! The `Backend` trait: the contract every storage backend fulfils.
//!
//! Users hold a [`crate::Rheo`]; backends implement this trait and are held as
//! `Arc<dyn Backend>`. The facade validates names and limits and normalizes
//! appended events before a backend sees them, so a backend may assume:
//! stream and group names are valid, limits and lease durations are within
//! bounds, and every [`NewEvent`] is within the size limit.
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

use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::model::capabilities::Capabilities;
use crate::model::event::{Event, NewEvent};
use crate::model::group::{
    DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, IndexStatus, Lag,
    ReplayOptions, ResetOptions, StreamInfo, StreamOptions,
};
use crate::model::lease::{FetchReport, LeaseRef, RetryOutcome};
use crate::model::query::{Page, Query};
use crate::model::time::Timestamp;

/// A storage backend. Object-safe; see the module docs for the shared rules.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
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

    /// Appends one event. Partition: explicit (else `InvalidPartition` when
    /// out of range), else `phash2(key, partition_count)`, else 0. The next
    /// sequence of that partition is assigned. `StreamNotFound`.
    async fn append(&self, stream: &str, event: NewEvent) -> Result<Event>;

    /// Appends events atomically: all or none. Per partition the sequences
    /// are contiguous and in input order. Returns events in input order.
    async fn append_batch(&self, stream: &str, events: Vec<NewEvent>) -> Result<Vec<Event>>;

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

    /// Reopens deliveries (see [`ReplayOptions`]); returns how many events
    /// were reopened. `InvalidReplayOpts`, `NoEventsInRange`.
    async fn replay(&self, stream: &str, group: &str, opts: &ReplayOptions) -> Result<u64>;

    /// Clears the group's state in scope and restarts it at `opts.start`.
    /// `ConfirmRequired` unless `opts.confirm`.
    async fn reset_group(&self, stream: &str, group: &str, opts: &ResetOptions) -> Result<()>;

    /// Lag per partition (the group's partitions, or `partitions`).
    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag>;

    /// Every stream, by name. `Unsupported` unless implemented.
    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        Err(self.unsupported("list_streams"))
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

    /// Returns when new events may be claimable on `stream`, or after
    /// `timeout`. The default just sleeps: polling. `StreamNotFound`.
    async fn wait_for_events(&self, _stream: &str, timeout: Duration) -> Result<()> {
        tokio::time::sleep(timeout).await;
        Ok(())
    }

    /// The error for an operation this backend does not implement.
    fn unsupported(&self, operation: &'static str) -> Error {
        Error::Unsupported { backend: "unknown", operation }
    }
}
