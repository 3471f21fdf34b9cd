//! Leases: a delivery claimed by one consumer for a while.

use serde::{Deserialize, Serialize};

use super::event::Event;
use super::time::Timestamp;

/// A claimed delivery. Settle it with `ack`, `retry`, `reject`, or extend it
/// with `renew`, before `expires_at`; after that another fetch may reclaim it
/// and this lease becomes stale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The fencing token of this claim: unique per claim.
    pub lease_id: String,
    /// The backend's own claim receipt, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
    /// The group that claimed it.
    pub group: String,
    /// The consumer holding it.
    pub consumer_id: String,
    /// How many times this delivery has been claimed, this claim included.
    pub attempt: u32,
    /// When the lease runs out.
    pub expires_at: Timestamp,
    /// The event delivered.
    pub event: Event,
}

impl Lease {
    /// The reference used to settle this lease.
    pub fn to_ref(&self) -> LeaseRef {
        LeaseRef::from(self)
    }
    /// The stream of the delivery.
    pub fn stream(&self) -> &str {
        &self.event.stream
    }
    /// The partition of the delivery.
    pub fn partition(&self) -> u32 {
        self.event.partition
    }
    /// The sequence of the delivery.
    pub fn sequence(&self) -> u64 {
        self.event.sequence
    }
}

/// What a settle call needs to name a lease: everything but the event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseRef {
    /// The stream.
    pub stream: String,
    /// The group.
    pub group: String,
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub sequence: u64,
    /// The lease id.
    pub lease_id: String,
    /// The backend receipt, if the backend has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
}

impl From<&Lease> for LeaseRef {
    fn from(l: &Lease) -> Self {
        LeaseRef {
            stream: l.event.stream.clone(),
            group: l.group.clone(),
            partition: l.event.partition,
            sequence: l.event.sequence,
            lease_id: l.lease_id.clone(),
            receipt: l.receipt.clone(),
        }
    }
}

impl From<Lease> for LeaseRef {
    fn from(l: Lease) -> Self {
        LeaseRef::from(&l)
    }
}

impl From<&LeaseRef> for LeaseRef {
    fn from(l: &LeaseRef) -> Self {
        l.clone()
    }
}

/// What became of a delivery after `retry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetryOutcome {
    /// It will be claimable again at this time.
    Scheduled {
        /// When it becomes claimable.
        available_at: Timestamp,
    },
    /// It had used all its attempts and was dead-lettered.
    DeadLettered,
}
