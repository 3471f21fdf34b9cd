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
//! backend obeys, and [`Backend`] for the contract a backend implements.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![warn(missing_docs)]

pub mod backend;
pub mod backends;
pub mod client;
mod decode;
pub mod engine;
pub mod error;
mod groups;
pub mod model;
mod msgpack;
pub mod observe;
mod rangeset;
pub mod runtime;

pub use backend::{Backend, Subscription, Wakeups};
pub use backends::memory::MemoryBackend;
pub use backends::native::NativeBackend;
pub use client::{IndexBuild, Rheo, RheoBuilder};
pub use engine::{Durability, EngineOptions, RecoveryMode};
pub use error::{Error, ObjectKind, Result};
pub use model::capabilities::Capabilities;
pub use model::damage::Damage;
pub use model::event::{
    AppendOptions, Event, EventParts, LINEAGE_FIELDS, Lineage, MAX_PAYLOAD_DEPTH, Metadata, NewEvent, Payload,
    PayloadFormat, Position,
};
pub use model::group::{
    Backoff, DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, IndexStatus, Lag,
    MAX_INDEXES, PartitionLag, Replay, ReplayFrom, ReplayOptions, Reset, ResetOptions, StartPosition, StreamInfo,
    StreamOptions,
};
pub use model::lease::{FetchReport, Lease, LeaseId, LeaseRef, RetryOutcome};
pub use model::limits::{
    DEFAULT_MAX_EVENT_BYTES, MAX_ATTEMPTS, MAX_BATCH_EVENTS, MAX_LEASE, MAX_LIMIT, MAX_NAME_BYTES, MAX_PARTITIONS,
    MAX_QUERY_TERMS, MAX_REASON_BYTES, validate_name,
};
pub use model::path::{canonical_path, is_valid_path};
pub use model::query::{Access, Cursor, Explain, Filter, Op, OrderBy, Page, Query, compare_values};
pub use model::routing::{partition_for_key, phash2, phash2_range};
pub use model::time::{Clock, ManualClock, SystemClock, Timestamp};
pub use runtime::{
    Group, GroupBuilder, GroupHandle, Handler, LeaseStream, LeaseStreamOptions, Outcome, RunSummary, StreamLease,
    handler_fn,
};

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
