//! What a backend guarantees and which mechanisms it uses.

use serde::{Deserialize, Serialize};

/// A backend's honest description of itself.
///
/// `at_least_once` and `lease_fencing` are guarantees every backend gives, so
/// they are not fields that could be set false: they are methods that always
/// answer `true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// The backend's name (`memory`, `native`, `sqlite`, `postgres`, `mongo`).
    pub backend: String,
    /// Data survives a process restart.
    pub durable: bool,
    /// Several processes (on several hosts) may use the same data at once.
    pub distributed: bool,
    /// The backend has a native claim receipt distinct from the lease id.
    pub native_receipts: bool,
    /// A subscription (`rheo::backends::Subscription`) wakes as soon as events are
    /// appended, rather than polling.
    pub wakeups: bool,
    /// Queries use secondary indexes (otherwise they scan).
    pub indexed_query: bool,
    /// The backend answers the ops-inspect calls (`list_streams`, ...).
    pub ops_inspect: bool,
    /// The backend drops events by a stream's [`crate::Retention`]
    /// (`set_retention`, `enforce_retention`, background passes).
    pub retention: bool,
    /// Groups honour an event's scheduled delivery time
    /// ([`crate::AppendOptions::deliver_at`]); a backend without it refuses
    /// appends that carry one (`Unsupported`).
    #[serde(default)]
    pub scheduled_delivery: bool,
    /// Groups can order deliveries by event key
    /// ([`crate::GroupOptions::ordered_by_key`]); a backend without it
    /// refuses to create such a group (`Unsupported`).
    #[serde(default)]
    pub ordered_by_key: bool,
}

impl Capabilities {
    /// A description with every optional mechanism off.
    pub fn new(backend: impl Into<String>) -> Self {
        Capabilities {
            backend: backend.into(),
            durable: false,
            distributed: false,
            native_receipts: false,
            wakeups: false,
            indexed_query: false,
            ops_inspect: false,
            retention: false,
            scheduled_delivery: false,
            ordered_by_key: false,
        }
    }

    /// Deliveries are at-least-once: always true.
    pub fn at_least_once(&self) -> bool {
        true
    }

    /// Settles are fenced by lease id: always true.
    pub fn lease_fencing(&self) -> bool {
        true
    }
}
