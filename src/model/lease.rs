//! Leases: a delivery claimed by one consumer for a while.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::event::Event;
use super::time::Timestamp;

pub use crate::ids::LeaseId;

impl std::str::FromStr for LeaseId {
    type Err = crate::error::Error;
    /// Reads the UUID form (hyphenated, simple, braced or URN).
    fn from_str(s: &str) -> crate::error::Result<Self> {
        uuid::Uuid::try_parse(s)
            .map(|u| LeaseId::from_u128(u.as_u128()))
            .map_err(|_| crate::error::Error::invalid("lease id", format!("{s:?} is not a lease id (a UUID)")))
    }
}

/// A claimed delivery. Settle it with `ack`, `retry`, `reject`, or extend it
/// with `renew`, before `expires_at`; after that another fetch may reclaim it
/// and this lease becomes stale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Lease {
    /// The fencing token of this claim: unique per claim.
    pub lease_id: LeaseId,
    /// The backend's own claim receipt, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
    /// The group that claimed it.
    pub group: Arc<str>,
    /// The consumer holding it.
    pub consumer_id: Arc<str>,
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
        self.event.stream()
    }
    /// The partition of the delivery.
    pub fn partition(&self) -> u32 {
        self.event.partition()
    }
    /// The sequence of the delivery.
    pub fn sequence(&self) -> u64 {
        self.event.sequence()
    }
}

/// What a fetch claimed, and the positions it could not deliver.
///
/// A position whose stored record fails a check is not claimed (no attempt
/// is counted, no lease made): it is reported in `damaged` and stays where
/// it was, blocking only itself, until it is skipped
/// ([`crate::Rheo::skip`]) or its file restored. Other positions and
/// partitions keep flowing.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct FetchReport {
    /// The deliveries claimed, in (partition, sequence) order.
    pub leases: Vec<Lease>,
    /// Positions that were due but could not be read, in (partition,
    /// sequence) order; at most 64 per partition per fetch (a partition
    /// with more due stops at the 65th until they are skipped or restored;
    /// the others go on).
    pub damaged: Vec<super::damage::Damage>,
    /// Events this fetch met before their scheduled delivery time
    /// ([`crate::AppendOptions::deliver_at`]) and set aside until then
    /// (at most the fetch's limit, at least 64 and at most 1,024, shared
    /// by its partitions; past its share, a partition stops at its next
    /// one, and the next fetch goes on from there).
    pub scheduled: u64,
}

/// What a settle call needs to name a lease: everything but the event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseRef {
    /// The stream.
    pub stream: Arc<str>,
    /// The group.
    pub group: Arc<str>,
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub sequence: u64,
    /// The lease id.
    pub lease_id: LeaseId,
    /// The backend receipt, if the backend has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
}

impl LeaseRef {
    /// `StaleLease` for this lease (it no longer holds its delivery).
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mongo", feature = "redis")),
        allow(dead_code)
    )]
    pub(crate) fn stale(&self) -> crate::error::Error {
        crate::error::Error::StaleLease {
            stream: self.stream.to_string(),
            group: self.group.to_string(),
            partition: self.partition,
            sequence: self.sequence,
            lease_id: self.lease_id,
        }
    }
}

impl From<&Lease> for LeaseRef {
    fn from(l: &Lease) -> Self {
        LeaseRef {
            stream: l.event.stream_name().clone(),
            group: l.group.clone(),
            partition: l.event.partition(),
            sequence: l.event.sequence(),
            lease_id: l.lease_id,
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

impl LeaseRef {
    /// Escapes one field of the string form: `%` and `:` are percent-encoded.
    fn escape(field: &str, out: &mut String) {
        for c in field.chars() {
            match c {
                '%' => out.push_str("%25"),
                ':' => out.push_str("%3A"),
                c => out.push(c),
            }
        }
    }

    /// Undoes [`LeaseRef::escape`]; None for a `%` not followed by `25` or `3A`.
    fn unescape(field: &str) -> Option<String> {
        let mut out = String::with_capacity(field.len());
        let mut rest = field;
        while let Some(i) = rest.find('%') {
            out.push_str(&rest[..i]);
            let code = rest.get(i + 1..i + 3)?;
            match code {
                "25" => out.push('%'),
                "3A" | "3a" => out.push(':'),
                _ => return None,
            }
            rest = &rest[i + 3..];
        }
        out.push_str(rest);
        Some(out)
    }
}

/// The string form a script passes around (`rheo fetch` prints it, `rheo
/// ack` reads it): `lr1:stream:group:partition:sequence:lease_id[:receipt]`,
/// with `%` and `:` inside the names percent-encoded. `parse` reads it back.
///
/// ```
/// use rheo::{LeaseId, LeaseRef};
/// let r = LeaseRef { stream: "a:b".into(), group: "g".into(), partition: 1, sequence: 7,
///                    lease_id: LeaseId::from_u128(7), receipt: None };
/// assert_eq!(r.to_string().parse::<LeaseRef>().ok(), Some(r));
/// ```
impl std::fmt::Display for LeaseRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::from("lr1:");
        LeaseRef::escape(&self.stream, &mut s);
        s.push(':');
        LeaseRef::escape(&self.group, &mut s);
        s.push_str(&format!(":{}:{}:{}", self.partition, self.sequence, self.lease_id));
        if let Some(r) = &self.receipt {
            s.push(':');
            LeaseRef::escape(r, &mut s);
        }
        f.write_str(&s)
    }
}

impl std::str::FromStr for LeaseRef {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        let bad = || {
            crate::error::Error::invalid(
                "lease",
                format!("{s:?} is not a lease reference (lr1:stream:group:partition:sequence:lease_id[:receipt])"),
            )
        };
        let parts: Vec<&str> = s.split(':').collect();
        if parts.first() != Some(&"lr1") || !(parts.len() == 6 || parts.len() == 7) {
            return Err(bad());
        }
        let text = |i: usize| parts.get(i).and_then(|p| LeaseRef::unescape(p)).ok_or_else(bad);
        Ok(LeaseRef {
            stream: text(1)?.into(),
            group: text(2)?.into(),
            partition: parts[3].parse().map_err(|_| bad())?,
            sequence: parts[4].parse().map_err(|_| bad())?,
            lease_id: parts[5].parse().map_err(|_| bad())?,
            receipt: if parts.len() == 7 { Some(text(6)?) } else { None },
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ref_string_form_round_trips() {
        let mut r = LeaseRef {
            stream: "orders:eu%1".into(),
            group: "billing".into(),
            partition: 3,
            sequence: 42,
            lease_id: LeaseId::from_u128(0x0001_93ab),
            receipt: None,
        };
        assert_eq!(r.to_string(), "lr1:orders%3Aeu%251:billing:3:42:00000000-0000-0000-0000-0000000193ab");
        assert_eq!(r.to_string().parse::<LeaseRef>().ok(), Some(r.clone()));
        r.receipt = Some("rc:1".into());
        assert_eq!(r.to_string().parse::<LeaseRef>().ok(), Some(r));
    }

    #[test]
    fn malformed_lease_refs_are_refused() {
        for s in [
            "",
            "lr1:a:b:1:2",
            "lr1:a:b:1:2:l",
            "lr2:a:b:1:2:00000000-0000-0000-0000-0000000193ab",
            "lr1:a:b:x:2:l",
            "lr1:a%zz:b:1:2:l",
            "lr1:a:b:1:2:l:r:x",
        ] {
            assert!(s.parse::<LeaseRef>().is_err(), "{s:?}");
        }
    }
}
