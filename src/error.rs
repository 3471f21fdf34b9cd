//! The portable error vocabulary shared by every backend.
//!
//! Every message names the stream, group, value or file involved, so that an
//! operator reading a log line at 3 a.m. knows what failed without a debugger.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cause behind a driver-level failure, kept cheap to clone.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What kind of object a name refers to (used by [`Error::AlreadyExists`] and
/// [`Error::InvalidName`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ObjectKind {
    /// A stream.
    Stream,
    /// A consumer group.
    Group,
    /// A consumer id.
    Consumer,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Stream => "stream",
            ObjectKind::Group => "group",
            ObjectKind::Consumer => "consumer",
        })
    }
}

/// What kind of failure an [`Error`] is: one kind per way a caller reacts,
/// so that code (and the `rheo` command's exit codes) need not list the
/// variants. `#[non_exhaustive]`: keep a wildcard arm.
///
/// ```
/// use rheo::{Error, ErrorKind};
/// fn should_retry(e: &Error) -> bool {
///     matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Ambiguous)
/// }
/// let e = Error::StreamNotFound { stream: "orders".into() };
/// assert_eq!(e.kind(), ErrorKind::NotFound);
/// assert_eq!(e.kind().to_string(), "not_found");
/// assert!(!should_retry(&e));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A bad argument, name, partition, option or payload type, a missing
    /// confirmation, an event over the size limit: nothing was changed;
    /// fix the call.
    InvalidInput,
    /// The stream, group or cursor does not exist (or a time-based replay
    /// found no event).
    NotFound,
    /// A stream or group of that name exists already.
    AlreadyExists,
    /// The lease no longer holds its delivery (expired, or settled by
    /// another consumer): drop the work's result.
    StaleLease,
    /// The data directory is held by another process.
    Locked,
    /// A write on a read-only open.
    ReadOnly,
    /// Stored data failed a check, or has a format this build cannot read.
    Corrupt,
    /// The backend could not be reached; nothing was changed: retry later.
    Unavailable,
    /// The outcome of a write is unknown (a reply was lost): retry with the
    /// same event ids, or read to find out.
    Ambiguous,
    /// The disk is full; nothing was changed.
    NoSpace,
    /// A write or sync failed earlier; the writer refuses writes until the
    /// directory is reopened.
    Poisoned,
    /// The backend does not implement the operation.
    Unsupported,
    /// Any other failed operation.
    Failed,
}

impl ErrorKind {
    /// A stable snake-case name (`not_found`), as the `rheo` command's
    /// `--json` errors use.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::StaleLease => "stale_lease",
            ErrorKind::Locked => "locked",
            ErrorKind::ReadOnly => "read_only",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Ambiguous => "ambiguous",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Poisoned => "poisoned",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Failed => "failed",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every error a Rheo operation can return, whatever the backend.
///
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a
/// wildcard arm. Driver errors never leak through; adapters map them to
/// [`Error::BackendUnavailable`], [`Error::Failed`] or [`Error::Ambiguous`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The stream does not exist.
    #[error("stream {stream:?} does not exist")]
    StreamNotFound {
        /// The stream name.
        stream: String,
    },
    /// The group does not exist on that stream.
    #[error("group {group:?} does not exist on stream {stream:?}")]
    GroupNotFound {
        /// The stream name.
        stream: String,
        /// The group name.
        group: String,
    },
    /// A stream or group with that name already exists.
    #[error("{kind} {name:?} already exists")]
    AlreadyExists {
        /// What already exists.
        kind: ObjectKind,
        /// Its name (for a group: `stream/group`).
        name: String,
    },
    /// The lease no longer holds the delivery: it was settled, or the delivery
    /// was reclaimed by another fetch after the lease expired.
    #[error(
        "stale lease {lease_id} for {stream:?}/{group:?} partition {partition} sequence {sequence}: the delivery is no longer held under this lease"
    )]
    StaleLease {
        /// The stream name.
        stream: String,
        /// The group name.
        group: String,
        /// The partition of the delivery.
        partition: u32,
        /// The sequence of the delivery.
        sequence: u64,
        /// The lease that was presented.
        lease_id: crate::ids::LeaseId,
    },
    /// The backend's native receipt differs from the one presented.
    #[error("receipt mismatch for lease {lease_id} on {stream:?}/{group:?} partition {partition} sequence {sequence}")]
    ReceiptMismatch {
        /// The stream name.
        stream: String,
        /// The group name.
        group: String,
        /// The partition of the delivery.
        partition: u32,
        /// The sequence of the delivery.
        sequence: u64,
        /// The lease that was presented.
        lease_id: crate::ids::LeaseId,
    },
    /// A paging cursor (a dead-letter event id, a query cursor) is unknown.
    #[error("cursor {cursor:?} not found in {scope}")]
    CursorNotFound {
        /// Where the cursor was looked up (e.g. `dead letters of "orders"/"billing"`).
        scope: String,
        /// The cursor that was presented.
        cursor: String,
    },
    /// A destructive operation was called without explicit confirmation.
    #[error("{operation} on {stream:?}/{group:?} needs explicit confirmation (confirm: true)")]
    ConfirmRequired {
        /// The operation, e.g. `reset_group`.
        operation: &'static str,
        /// The stream name.
        stream: String,
        /// The group name.
        group: String,
    },
    /// A stream, group or consumer name is not acceptable.
    #[error("invalid {kind} name {name:?}: {reason}")]
    InvalidName {
        /// What the name is for.
        kind: ObjectKind,
        /// The rejected name (may be truncated for display by the caller).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An explicit partition outside `0..partition_count`.
    #[error("partition {partition} is out of range for stream {stream:?} (it has {partition_count} partitions)")]
    InvalidPartition {
        /// The stream name.
        stream: String,
        /// The requested partition.
        partition: u32,
        /// The stream's partition count.
        partition_count: u32,
    },
    /// A partition count of zero or above the maximum.
    #[error("invalid partition count {count} for stream {stream:?}: must be between 1 and {max}")]
    InvalidPartitionCount {
        /// The stream name.
        stream: String,
        /// The requested count.
        count: u32,
        /// The largest count accepted.
        max: u32,
    },
    /// `replay` needs exactly one of `from_sequence`, `from` or `query`.
    #[error("invalid replay options for {stream:?}/{group:?}: {reason}")]
    InvalidReplayOpts {
        /// The stream name.
        stream: String,
        /// The group name.
        group: String,
        /// What was wrong.
        reason: String,
    },
    /// A time-based replay found no event at or after the time in any partition.
    #[error("no events in range for {stream:?}/{group:?}: {detail}")]
    NoEventsInRange {
        /// The stream name.
        stream: String,
        /// The group name.
        group: String,
        /// The range that was empty.
        detail: String,
    },
    /// An event is larger than the configured maximum; nothing was written.
    #[error("event of {size_bytes} bytes is too large for stream {stream:?} (maximum {max_bytes} bytes)")]
    EventTooLarge {
        /// The stream name.
        stream: String,
        /// The encoded size of the event.
        size_bytes: usize,
        /// The configured maximum.
        max_bytes: usize,
    },
    /// An argument is outside its documented bounds (a zero limit, a lease of
    /// zero length, a batch above the maximum, an unparsable URL...).
    #[error("invalid argument {argument}: {reason}")]
    InvalidArgument {
        /// The argument's name.
        argument: &'static str,
        /// What was wrong with it.
        reason: String,
    },
    /// A payload could not be encoded or decoded as the requested type.
    #[error("payload {context}: {reason}")]
    Payload {
        /// Which payload: `of event "<id>"` or `appended to stream "<name>"`.
        context: String,
        /// What the serializer said.
        reason: String,
    },
    /// The backend does not implement this operation.
    #[error("backend {backend} does not support {operation}")]
    Unsupported {
        /// The backend name.
        backend: &'static str,
        /// The operation.
        operation: &'static str,
    },
    /// The backend could not be reached; nothing was done. Safe to retry.
    #[error("backend {backend} is unavailable during {operation}: {cause}")]
    BackendUnavailable {
        /// The backend name.
        backend: &'static str,
        /// The operation.
        operation: &'static str,
        /// The underlying cause.
        #[source]
        cause: Cause,
    },
    /// The operation definitely failed and changed nothing.
    #[error("{operation} failed: {cause}")]
    Failed {
        /// The operation.
        operation: &'static str,
        /// The underlying cause (for storage failures, the engine's typed
        /// error, whose own source is the `io::Error`).
        #[source]
        cause: Cause,
    },
    /// The operation may or may not have taken effect (e.g. a connection lost
    /// after the commit was sent).
    #[error("{operation} outcome unknown: {cause}")]
    Ambiguous {
        /// The operation.
        operation: &'static str,
        /// The underlying cause.
        #[source]
        cause: Cause,
    },
    /// On-disk data failed a check.
    #[error("corrupt data in {} at offset {offset}: {reason}", file.display())]
    Corrupt {
        /// The file that failed the check.
        file: PathBuf,
        /// The byte offset of the bad data.
        offset: u64,
        /// What check failed.
        reason: String,
        /// The typed error underneath, when the engine found it (a
        /// storage error whose source is the decoder's error).
        source: Option<Cause>,
    },
    /// A file was written by a newer (or unknown) format version.
    #[error("{} has format version {found}; this build reads version {supported}", file.display())]
    UnsupportedVersion {
        /// The file.
        file: PathBuf,
        /// The version found in it.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// The disk (or quota) holding a file is full. Returned where nothing
    /// was changed: the call can be retried once space is freed, and
    /// everything acknowledged before it is kept. (A full disk met after a
    /// change, which only a failed `fsync` can report, poisons instead.)
    #[error("no space left for {}: {reason}; nothing was changed: free space and retry", file.display())]
    NoSpace {
        /// The file being written.
        file: PathBuf,
        /// What the write was and what the system said.
        reason: String,
        /// The storage error underneath (its source is the `io::Error`).
        source: Option<Cause>,
    },
    /// The data directory is open for writing in another process (or by
    /// another handle of this one). A read-only open
    /// (`native:PATH?read_only=true`) works beside it.
    #[error(
        "data directory {} is in use by {holder} (its LOCK file is held); to look inside while it runs, open it read-only (native:{}?read_only=true, as the rheo commands that only read do)",
        path.display(), path.display()
    )]
    Locked {
        /// The data directory.
        path: PathBuf,
        /// Who holds it, as far as known: `process 1234`, or another handle
        /// of this process.
        holder: String,
    },
    /// A write was asked of a read-only open.
    #[error(
        "{operation} is not possible on data directory {}: it is open read-only (only the process holding its LOCK writes)",
        path.display()
    )]
    ReadOnly {
        /// The data directory.
        path: PathBuf,
        /// What was asked (`append to stream "orders"`).
        operation: String,
    },
    /// A previous durable write failed; the writer refuses further writes
    /// until the data directory is reopened.
    #[error("writer for {scope} is poisoned after a failed write or fsync; reopen to recover: {reason}")]
    Poisoned {
        /// What is poisoned (a data dir, a partition).
        scope: String,
        /// The original failure.
        reason: String,
        /// The `io::Error` of the failed write or sync, when there was one.
        source: Option<Cause>,
    },
}

impl Error {
    /// Its [`ErrorKind`]: how a caller reacts to it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument { .. }
            | Error::InvalidName { .. }
            | Error::InvalidPartition { .. }
            | Error::InvalidPartitionCount { .. }
            | Error::InvalidReplayOpts { .. }
            | Error::ConfirmRequired { .. }
            | Error::EventTooLarge { .. }
            | Error::Payload { .. } => ErrorKind::InvalidInput,
            Error::StreamNotFound { .. }
            | Error::GroupNotFound { .. }
            | Error::CursorNotFound { .. }
            | Error::NoEventsInRange { .. } => ErrorKind::NotFound,
            Error::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            Error::StaleLease { .. } | Error::ReceiptMismatch { .. } => ErrorKind::StaleLease,
            Error::Locked { .. } => ErrorKind::Locked,
            Error::ReadOnly { .. } => ErrorKind::ReadOnly,
            Error::Corrupt { .. } | Error::UnsupportedVersion { .. } => ErrorKind::Corrupt,
            Error::BackendUnavailable { .. } => ErrorKind::Unavailable,
            Error::Ambiguous { .. } => ErrorKind::Ambiguous,
            Error::NoSpace { .. } => ErrorKind::NoSpace,
            Error::Poisoned { .. } => ErrorKind::Poisoned,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::Failed { .. } => ErrorKind::Failed,
        }
    }

    /// A `Payload` error with its context replaced (the caller knows what
    /// the payload belonged to); any other error as it is.
    pub(crate) fn payload_context(self, context: impl FnOnce() -> String) -> Error {
        match self {
            Error::Payload { reason, .. } => Error::Payload { context: context(), reason },
            other => other,
        }
    }

    /// True when retrying the same call later may succeed without any change
    /// by the caller (the backend was unavailable or the outcome unknown).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::BackendUnavailable { .. } | Error::Ambiguous { .. })
    }

    /// True when the error says the disk is full (see [`Error::NoSpace`]).
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::NoSpace { .. })
    }

    /// The kind of the operating system's error underneath, when an I/O
    /// call failed: found by walking the [`source`](std::error::Error::source)
    /// chain down to its `io::Error`. A full disk is
    /// `Some(ErrorKind::StorageFull)` whether it was met before a change
    /// ([`Error::NoSpace`]) or by a sync after one ([`Error::Poisoned`]).
    pub fn io_error_kind(&self) -> Option<std::io::ErrorKind> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = self.cause().map(|c| c as _);
        while let Some(e) = next {
            // A shared cause (`Cause`) hides its inner error's type.
            let e = e.downcast_ref::<Cause>().map_or(e, |c| &**c as &(dyn std::error::Error + 'static));
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                return Some(io.kind());
            }
            next = e.source();
        }
        None
    }

    /// The typed error underneath, to downcast: for a storage failure the
    /// engine's `StorageError` (whose source is the `io::Error`), for a
    /// poisoning the `io::Error` of the failed sync, for a driver failure
    /// the driver's error. `source()` reaches the same error's own source.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::BackendUnavailable { cause, .. } | Error::Failed { cause, .. } | Error::Ambiguous { cause, .. } => {
                Some(&**cause)
            }
            Error::Corrupt { source, .. } | Error::NoSpace { source, .. } | Error::Poisoned { source, .. } => {
                source.as_deref()
            }
            _ => None,
        }
    }

    /// True when the error says a lease no longer holds its delivery.
    pub fn is_stale_lease(&self) -> bool {
        matches!(self, Error::StaleLease { .. } | Error::ReceiptMismatch { .. })
    }

    /// Wraps any error as a definite [`Error::Failed`].
    pub fn failed(operation: &'static str, cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Failed { operation, cause: Arc::from(cause.into()) }
    }

    /// Wraps any error as an [`Error::Ambiguous`] outcome.
    pub fn ambiguous(operation: &'static str, cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Ambiguous { operation, cause: Arc::from(cause.into()) }
    }

    /// Wraps any error as [`Error::BackendUnavailable`].
    pub fn unavailable(
        backend: &'static str,
        operation: &'static str,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::BackendUnavailable { backend, operation, cause: Arc::from(cause.into()) }
    }

    pub(crate) fn invalid(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { argument, reason: reason.into() }
    }

    pub(crate) fn stream_not_found(stream: &str) -> Self {
        Error::StreamNotFound { stream: stream.to_owned() }
    }

    pub(crate) fn group_not_found(stream: &str, group: &str) -> Self {
        Error::GroupNotFound { stream: stream.to_owned(), group: group.to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_objects_involved() {
        let e = Error::group_not_found("orders", "billing");
        assert_eq!(e.to_string(), r#"group "billing" does not exist on stream "orders""#);
        let e = Error::EventTooLarge { stream: "s".into(), size_bytes: 10, max_bytes: 5 };
        assert!(e.to_string().contains("10 bytes"));
        assert!(e.to_string().contains("maximum 5"));
    }

    #[test]
    fn transient_classification() {
        assert!(Error::unavailable("memory", "fetch", "down").is_transient());
        assert!(Error::ambiguous("ack", "lost").is_transient());
        assert!(!Error::failed("ack", "no").is_transient());
        assert!(!Error::stream_not_found("x").is_transient());
    }
}
