//! # Rheo
//!
//! Durable consumer groups — partitions, fenced leases, ack / retry /
//! dead-letter, replay, lag over a contiguous frontier — over an immutable,
//! queryable event log, with one API over several backends.
//!
//! ```
//! # fn main() -> rheo::Result<()> {
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
//! use rheo::{AppendOptions, FetchOptions, GroupOptions, Rheo, StreamOptions};
//! use serde_json::json;
//!
//! let rheo = Rheo::open("memory:").await?;
//! rheo.create_stream("orders", StreamOptions::new().partitions(4)).await?;
//! rheo.create_group("orders", "billing", GroupOptions::new()).await?;
//!
//! rheo.append("orders", &json!({"type": "order_placed", "key": "c-7", "total": 42}), AppendOptions::new()).await?;
//!
//! for lease in rheo.fetch("orders", "billing", FetchOptions::new().limit(10)).await? {
//!     println!("partition {} #{}: {}", lease.partition(), lease.sequence(), lease.event.payload());
//!     rheo.ack(&lease).await?;
//! }
//! assert_eq!(rheo.lag("orders", "billing").await?.total, 0);
//! # Ok(()) }) }
//! ```
//!
//! See `docs/semantics.md` (summarized in the README) for the exact rules every
//! backend obeys, and [`backends::Backend`] for the contract a backend implements.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(feature = "internals"), warn(unnameable_types))]
#![warn(missing_docs)]

// Modules are private; the API is the flat list of re-exports below (plus
// `backends`, one home per backend, `inspect`, the data-file reader, and
// `observe`, the metric names). The engine is reachable only with the
// `internals` feature, for this crate's tests, benches and fuzzers: it is not
// part of the API and changes without notice.
mod backend;
pub mod backends;
mod client;
mod decode;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod engine;
// Without `internals`, what only tests and tools call is unused here.
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod engine;
mod error;
mod groups;
mod ids;
pub use engine::inspect;
mod model;
mod msgpack;
pub mod observe;
mod rangeset;
mod runtime;

pub use backends::redact_url;
pub use client::{IndexBuild, Rheo, RheoBuilder};
pub use decode::DecodeError;
pub use engine::error::StorageError;
pub use error::{Cause, Error, ErrorKind, ObjectKind, Result};
pub use model::append::{AppendOptions, NewEvent};
pub use model::capabilities::Capabilities;
pub use model::damage::Damage;
pub use model::event::{Event, EventParts, Lineage, Position};
pub use model::group::{
    Backoff, DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, PartitionLag,
    Replay, ReplayFrom, ReplayOptions, Reset, ResetOptions, StartPosition,
};
pub use model::lease::{FetchReport, Lease, LeaseId, LeaseRef, RetryOutcome};
pub use model::limits::{
    DEFAULT_MAX_EVENT_BYTES, MAX_ATTEMPTS, MAX_BATCH_EVENTS, MAX_LEASE, MAX_LIMIT, MAX_NAME_BYTES, MAX_PARTITIONS,
    MAX_QUERY_TERMS, MAX_REASON_BYTES, validate_name,
};
pub use model::path::{DELIVER_AT, LINEAGE_FIELDS};
pub use model::path::{canonical_path, is_valid_path};
pub use model::payload::{MAX_PAYLOAD_DEPTH, Metadata, Payload, PayloadFormat};
pub use model::query::{Access, Cursor, Explain, Filter, Op, OrderBy, Page, Query, compare_values};
pub use model::retention::{
    DroppedRange, GroupSkip, MAX_DEDUPE_WINDOW, MAX_RETENTION_AGE, PartitionInfo, Retention, RetentionPolicy,
    RetentionReport, format_duration, parse_duration,
};
pub use model::routing::{partition_for_key, phash2, phash2_range};
pub use model::stream::{IndexStatus, MAX_INDEXES, StreamInfo, StreamOptions};
pub use model::time::{Clock, ManualClock, SystemClock, Timestamp};
pub use runtime::{
    ConsumerBuilder, ConsumerHandle, Handler, HandlerFn, LeaseStream, LeaseStreamOptions, Outcome, RunSummary, Settled,
    StreamLease, handler_fn,
};
#[allow(deprecated)]
pub use runtime::{GroupBuilder, GroupHandle};

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
