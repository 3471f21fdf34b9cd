//! Groups and their options; fetch, replay and reset options; lag, group
//! info and dead letters.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::event::Event;
use super::limits::{MAX_ATTEMPTS, validate_lease};
use super::query::Query;
use super::time::Timestamp;
use crate::error::{Error, Result};

/// Where a new (or reset) group starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum StartPosition {
    /// Deliver everything: sequences > 0.
    #[default]
    Beginning,
    /// Deliver sequences > n in every partition.
    After(u64),
    /// Deliver sequences > n per partition; partitions not named start at the beginning.
    AfterPerPartition(BTreeMap<u32, u64>),
    /// Per partition, from the first event with timestamp >= t; where no
    /// such event exists yet, only new events (after the high watermark).
    At(Timestamp),
    /// Only events appended from now on (after each high watermark).
    Latest,
}

/// How long a retried delivery waits before it is claimable again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Backoff {
    /// Claimable at once (the default).
    #[default]
    None,
    /// The same delay after every retry.
    Fixed(Duration),
    /// `base * 2^(attempt-1)`, capped at `max`.
    Exponential {
        /// The delay after the first attempt.
        base: Duration,
        /// The largest delay.
        max: Duration,
    },
}

impl Backoff {
    /// The delay after a retry of the given attempt (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        match *self {
            Backoff::None => Duration::ZERO,
            Backoff::Fixed(d) => d,
            Backoff::Exponential { base, max } => {
                let shift = attempt.saturating_sub(1).min(31);
                base.saturating_mul(1u32 << shift).min(max)
            }
        }
    }
}

/// Options of `create_group`.
///
/// ```
/// use rheo::{GroupOptions, Backoff};
/// use std::time::Duration;
/// let opts = GroupOptions::new().max_attempts(3).start_after(100)
///     .retry_backoff(Backoff::Fixed(Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupOptions {
    /// Claims per delivery before a retry dead-letters it (default: 5).
    pub max_attempts: u32,
    /// Where the group starts.
    pub start: StartPosition,
    /// The partitions this group consumes (None: all). Others are never
    /// delivered to it and do not count in its lag.
    pub partitions: Option<Vec<u32>>,
    /// Delay before a retried delivery is claimable again (default: none).
    pub retry_backoff: Backoff,
    /// Per-key order (default: off); see [`GroupOptions::ordered_by_key`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ordered_by_key: bool,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            max_attempts: 5,
            start: StartPosition::Beginning,
            partitions: None,
            retry_backoff: Backoff::None,
            ordered_by_key: false,
        }
    }
}

impl GroupOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets `max_attempts` (at least 1).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
    /// Delivers sequences > n in every partition.
    pub fn start_after(mut self, n: u64) -> Self {
        self.start = StartPosition::After(n);
        self
    }
    /// Delivers sequences > n per partition.
    pub fn start_after_partitions(mut self, map: BTreeMap<u32, u64>) -> Self {
        self.start = StartPosition::AfterPerPartition(map);
        self
    }
    /// Starts at the first event at or after `t` in each partition.
    pub fn start_at(mut self, t: Timestamp) -> Self {
        self.start = StartPosition::At(t);
        self
    }
    /// Sets the start position.
    pub fn start(mut self, start: StartPosition) -> Self {
        self.start = start;
        self
    }
    /// Consumes only these partitions.
    pub fn partitions(mut self, partitions: impl Into<Vec<u32>>) -> Self {
        self.partitions = Some(partitions.into());
        self
    }
    /// Sets the retry backoff.
    pub fn retry_backoff(mut self, backoff: Backoff) -> Self {
        self.retry_backoff = backoff;
        self
    }
    /// Orders deliveries by event key: across every consumer of the group
    /// (other processes included), at most one event of a key is in flight,
    /// and the next event of a key in its partition is claimable only once
    /// the one before it is settled (acked, or dead-lettered: rejected, out
    /// of attempts, or skipped). Events of different keys, and events
    /// without a key, are handed out in parallel as usual. A backend
    /// without it ([`crate::Capabilities::ordered_by_key`]) refuses the
    /// group with `Unsupported`. See docs/semantics.md, "Per-key order".
    ///
    /// ```
    /// use rheo::GroupOptions;
    /// let opts = GroupOptions::new().ordered_by_key();
    /// assert!(opts.ordered_by_key);
    /// ```
    pub fn ordered_by_key(mut self) -> Self {
        self.ordered_by_key = true;
        self
    }

    pub(crate) fn validate(&self, stream: &str, partition_count: u32) -> Result<()> {
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(Error::invalid("max_attempts", format!("{} is outside 1..={MAX_ATTEMPTS}", self.max_attempts)));
        }
        if let Some(ps) = &self.partitions {
            check_partitions(stream, ps, partition_count)?;
        }
        if let StartPosition::AfterPerPartition(m) = &self.start {
            check_partitions(stream, &m.keys().copied().collect::<Vec<_>>(), partition_count)?;
        }
        match self.retry_backoff {
            Backoff::None => Ok(()),
            Backoff::Fixed(d) => validate_lease("retry_backoff", d),
            Backoff::Exponential { base, max } => {
                validate_lease("retry_backoff.base", base)?;
                validate_lease("retry_backoff.max", max)
            }
        }
    }
}

/// Fails with `InvalidPartition` for the first partition out of range.
pub(crate) fn check_partitions(stream: &str, partitions: &[u32], partition_count: u32) -> Result<()> {
    match partitions.iter().find(|&&p| p >= partition_count) {
        Some(&p) => Err(Error::InvalidPartition { stream: stream.to_owned(), partition: p, partition_count }),
        None => Ok(()),
    }
}

/// Options of `fetch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FetchOptions {
    /// The most deliveries to claim (1 to [`crate::MAX_LIMIT`]) (default: 10).
    pub limit: usize,
    /// Who is claiming (None: the client's own consumer id).
    pub consumer_id: Option<String>,
    /// How long the leases last (default: 30 s).
    pub lease: Duration,
    /// Claim only from these partitions (None: all of the group's).
    pub partitions: Option<Vec<u32>>,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions { limit: 10, consumer_id: None, lease: Duration::from_secs(30), partitions: None }
    }
}

impl FetchOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the limit.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
    /// Sets the consumer id.
    pub fn consumer(mut self, id: impl Into<String>) -> Self {
        self.consumer_id = Some(id.into());
        self
    }
    /// Sets the lease duration.
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }
    /// Restricts to these partitions.
    pub fn partitions(mut self, partitions: impl Into<Vec<u32>>) -> Self {
        self.partitions = Some(partitions.into());
        self
    }
}

/// Options of `replay`: exactly one of `from_sequence`, `from` and `query`.
///
/// ```
/// use rheo::ReplayOptions;
/// let replay = ReplayOptions::from_sequence(40).partitions([0, 2]);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Reopen deliveries with sequence > n (per partition).
    pub from_sequence: Option<u64>,
    /// Reopen, per partition, from the first event at or after this time.
    pub from: Option<Timestamp>,
    /// Reopen exactly the events matching this query.
    pub query: Option<Query>,
    /// Limit the replay to these partitions (None: all of the group's).
    pub partitions: Option<Vec<u32>>,
}

impl ReplayOptions {
    /// Nothing chosen yet (calling replay with this is `InvalidReplayOpts`).
    pub fn new() -> Self {
        Self::default()
    }
    /// Replays sequences > n.
    pub fn from_sequence(n: u64) -> Self {
        ReplayOptions { from_sequence: Some(n), ..Self::default() }
    }
    /// Replays from the first event at or after `t`, per partition.
    pub fn from_time(t: Timestamp) -> Self {
        ReplayOptions { from: Some(t), ..Self::default() }
    }
    /// Replays exactly the events matching `q` (its stream must be the group's).
    pub fn query(q: Query) -> Self {
        ReplayOptions { query: Some(q), ..Self::default() }
    }
    /// Restricts the replay to these partitions.
    pub fn partitions(mut self, partitions: impl Into<Vec<u32>>) -> Self {
        self.partitions = Some(partitions.into());
        self
    }

    /// The replay a backend receives: `InvalidReplayOpts` unless exactly
    /// one of the three starts is chosen (and a query names this stream).
    pub fn validate(self, stream: &str, group: &str) -> Result<Replay> {
        let invalid = |reason: &str| Error::InvalidReplayOpts {
            stream: stream.to_owned(),
            group: group.to_owned(),
            reason: reason.to_owned(),
        };
        let from = match (self.from_sequence, self.from, self.query) {
            (Some(s), None, None) => ReplayFrom::Sequence(s),
            (None, Some(t), None) => ReplayFrom::Time(t),
            (None, None, Some(q)) => {
                if q.stream != stream {
                    return Err(invalid("the replay query names another stream"));
                }
                ReplayFrom::Query(q)
            }
            (None, None, None) => return Err(invalid("give one of from_sequence, from or query")),
            _ => return Err(invalid("give only one of from_sequence, from or query")),
        };
        Ok(Replay { from, partitions: self.partitions })
    }
}

/// A validated replay, as a backend receives it: the facade builds it from
/// [`ReplayOptions`], so a backend never sees an ambiguous request.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Replay {
    /// Where the replay starts.
    pub from: ReplayFrom,
    /// The partitions it covers (None: all of the group's). Not yet checked
    /// against the stream: a backend answers `InvalidPartition`.
    pub partitions: Option<Vec<u32>>,
}

/// Which settled deliveries a [`Replay`] reopens.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ReplayFrom {
    /// Every sequence above this one, per partition.
    Sequence(u64),
    /// Per partition, from the first event at or after this time.
    Time(Timestamp),
    /// Exactly the events matching this query (of the group's stream).
    Query(Query),
}

/// A confirmed reset, as a backend receives it: the facade builds it from
/// [`ResetOptions`] once `confirm` is checked, so backends never check it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reset {
    /// Where the group restarts.
    pub start: StartPosition,
    /// The partitions reset (None: all of the group's). Not yet checked
    /// against the stream: a backend answers `InvalidPartition`.
    pub partitions: Option<Vec<u32>>,
}

/// Options of `reset_group`; `confirm` must be true.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ResetOptions {
    /// Must be true, or the reset fails with `ConfirmRequired`.
    pub confirm: bool,
    /// Where the group restarts.
    pub start: StartPosition,
    /// Reset only these partitions (None: all of the group's).
    pub partitions: Option<Vec<u32>>,
}

impl ResetOptions {
    /// A confirmed reset to the beginning.
    pub fn confirmed() -> Self {
        ResetOptions { confirm: true, ..Self::default() }
    }

    /// The reset a backend receives; `ConfirmRequired` unless `confirm` is
    /// set (checked by the facade before anything else).
    pub fn confirmed_for(self, stream: &str, group: &str) -> Result<Reset> {
        if !self.confirm {
            return Err(Error::ConfirmRequired {
                operation: "reset_group",
                stream: stream.to_owned(),
                group: group.to_owned(),
            });
        }
        Ok(Reset { start: self.start, partitions: self.partitions })
    }
    /// Sets the start position.
    pub fn start(mut self, start: StartPosition) -> Self {
        self.start = start;
        self
    }
    /// Restarts after sequence n.
    pub fn start_after(self, n: u64) -> Self {
        self.start(StartPosition::After(n))
    }
    /// Restarts at time t.
    pub fn start_at(self, t: Timestamp) -> Self {
        self.start(StartPosition::At(t))
    }
    /// Resets only these partitions.
    pub fn partitions(mut self, partitions: impl Into<Vec<u32>>) -> Self {
        self.partitions = Some(partitions.into());
        self
    }
}

/// Lag of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PartitionLag {
    /// The partition.
    pub partition: u32,
    /// The last assigned sequence.
    pub high_watermark: u64,
    /// The contiguous committed frontier.
    pub frontier: u64,
    /// `max(high_watermark - frontier, 0)`.
    pub lag: u64,
}

impl PartitionLag {
    /// Builds the lag of one partition from its watermark and frontier.
    /// A frontier below the log start counts from the log start (lag never
    /// counts dropped events): pass `frontier.max(first_sequence - 1)`.
    pub fn new(partition: u32, high_watermark: u64, frontier: u64) -> Self {
        PartitionLag { partition, high_watermark, frontier, lag: high_watermark.saturating_sub(frontier) }
    }
}

/// Lag of a group over some partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Lag {
    /// The stream.
    pub stream: String,
    /// The group.
    pub group: String,
    /// Per partition, in partition order.
    pub partitions: Vec<PartitionLag>,
    /// The sum of the partitions' lag.
    pub total: u64,
}

impl Lag {
    /// Builds a lag report, summing the total.
    pub fn new(stream: &str, group: &str, partitions: Vec<PartitionLag>) -> Self {
        let total = partitions.iter().map(|p| p.lag).sum();
        Lag { stream: stream.to_owned(), group: group.to_owned(), partitions, total }
    }
}

/// A group as listed by `list_groups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupSummary {
    /// The group name.
    pub name: String,
    /// Its `max_attempts`.
    pub max_attempts: u32,
    /// Its partitions (None: all).
    pub partitions: Option<Vec<u32>>,
    /// When it was created.
    pub created_at: Timestamp,
    /// Whether it orders deliveries by key
    /// ([`GroupOptions::ordered_by_key`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ordered_by_key: bool,
}

/// Everything an operator wants to know about a group at a glance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupInfo {
    /// The group's settings.
    pub summary: GroupSummary,
    /// Its lag.
    pub lag: Lag,
    /// Deliveries currently leased (expired leases not yet reclaimed included).
    pub inflight: u64,
    /// Deliveries waiting out a retry backoff.
    pub retry_waiting: u64,
    /// Deliveries dead-lettered.
    pub dead_letters: u64,
    /// Events retention dropped before this group settled them (under the
    /// `limits` policy, or past the `interest` policy's ceiling), since the
    /// group was created (a reset keeps the count).
    #[serde(default)]
    pub retention_skipped: u64,
    /// Events set aside until their scheduled delivery time
    /// ([`crate::AppendOptions::deliver_at`]): those the group's fetches
    /// have met (a fetch sets aside each scheduled event it meets early).
    #[serde(default)]
    pub scheduled: u64,
    /// The earliest scheduled time among them.
    #[serde(default)]
    pub next_due: Option<Timestamp>,
}

/// A dead-lettered delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The partition of the delivery.
    pub partition: u32,
    /// The sequence of the delivery.
    pub sequence: u64,
    /// The event; None when its stored record can't be read (the reason
    /// in `damage`) or when retention dropped it (`dropped`).
    pub event: Option<Event>,
    /// Retention dropped the event (the dead letter stays listed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped: bool,
    /// Why the event can't be read, when it can't (a damaged position,
    /// typically one an operator skipped with [`crate::Rheo::skip`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damage: Option<super::damage::Damage>,
    /// The reason given to `reject`, `max_attempts: <reason>`, or
    /// `skipped: <reason>` for a position skipped by an operator.
    pub reason: String,
    /// Claims made before it was dead-lettered.
    pub attempts: u32,
    /// When it was dead-lettered.
    pub dead_lettered_at: Timestamp,
}

/// Options of `dead_letters`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetterOptions {
    /// The most to return (default: 100).
    pub limit: usize,
    /// Return only those after the dead letter of this event id.
    pub after: Option<String>,
    /// Return only those after the dead letter at this (partition,
    /// sequence): a cursor that needs no event id, so it pages past damaged
    /// entries too. Takes precedence over `after`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_position: Option<(u32, u64)>,
}

impl Default for DeadLetterOptions {
    fn default() -> Self {
        DeadLetterOptions { limit: 100, after: None, after_position: None }
    }
}

impl DeadLetterOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the limit.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
    /// Pages after the dead letter of this event id.
    pub fn after(mut self, event_id: impl Into<String>) -> Self {
        self.after = Some(event_id.into());
        self
    }
    /// Pages after the dead letter at this position (which needs no event
    /// id: it pages past damaged entries too).
    pub fn after_position(mut self, partition: u32, sequence: u64) -> Self {
        self.after_position = Some((partition, sequence));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_backoff_doubles_and_caps() {
        let b = Backoff::Exponential { base: Duration::from_millis(100), max: Duration::from_secs(1) };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(5), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn lag_never_negative() {
        assert_eq!(PartitionLag::new(0, 5, 9).lag, 0);
        assert_eq!(Lag::new("s", "g", vec![PartitionLag::new(0, 5, 2), PartitionLag::new(1, 3, 0)]).total, 6);
    }
}
