//! Retention: how much of a stream's log is kept, and what a retention
//! pass dropped.
//!
//! A stream keeps every event unless its [`Retention`] says otherwise
//! (the default). Limits apply per partition: by age, by stored bytes, by
//! event count. The [`RetentionPolicy`] says what the consumer groups
//! hold: under [`RetentionPolicy::Limits`] nothing (a group behind the new
//! log start moves to it, and the events it skipped are counted); under
//! [`RetentionPolicy::Interest`] everything some group has not settled,
//! with the limits as a ceiling. The rules are in `docs/semantics.md`
//! ("Retention").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest `max_age` and dedupe window accepted: about 100 years.
pub const MAX_RETENTION_AGE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The longest dedupe window accepted: a day.
pub const MAX_DEDUPE_WINDOW: Duration = Duration::from_secs(86_400);

/// What a retention pass may drop once limits are past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RetentionPolicy {
    /// Drop what is past the limits, whatever the groups have done (Kafka's
    /// `delete`, JetStream's `limits`). A group whose frontier is behind the
    /// new log start moves to it; the events it had not settled are counted
    /// ([`crate::GroupInfo::retention_skipped`]).
    #[default]
    Limits,
    /// Drop what every group consuming the partition has settled
    /// (JetStream's `interest`). The limits stay a ceiling: what is past
    /// them is dropped even if unsettled, counted as under `Limits`, and the
    /// pass reports [`RetentionReport::ceiling_hit`]. A partition no group
    /// consumes keeps everything within the limits.
    Interest,
}

impl std::fmt::Display for RetentionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RetentionPolicy::Limits => "limits",
            RetentionPolicy::Interest => "interest",
        })
    }
}

impl std::str::FromStr for RetentionPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "limits" => Ok(RetentionPolicy::Limits),
            "interest" => Ok(RetentionPolicy::Interest),
            _ => Err(Error::invalid("retention policy", format!("{s:?}: expected limits or interest"))),
        }
    }
}

/// How much of each partition a stream keeps (see the module docs).
///
/// The default keeps everything. Each limit is per partition and optional;
/// an event is dropped once any limit is past (it is older than `max_age`,
/// or newer events of its partition alone reach `max_bytes` or
/// `max_events`). The native backend drops whole sealed segments, so it
/// keeps up to one segment more than the limits (and never drops the
/// segment being written); the database backends drop event by event.
///
/// ```
/// use std::time::Duration;
/// use rheo::{Retention, RetentionPolicy, StreamOptions};
/// let opts = StreamOptions::new()
///     .partitions(4)
///     .retention(Retention::new().max_age(Duration::from_secs(7 * 86_400)).max_bytes(1 << 30));
/// assert_eq!(opts.retention.policy, RetentionPolicy::Limits);
/// assert!(Retention::default().is_unlimited());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[non_exhaustive]
pub struct Retention {
    /// Drop events older than this (by their append timestamp).
    #[serde(default, with = "opt_ms", skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    /// Keep at most this many bytes of stored events per partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Keep at most this many events per partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_events: Option<u64>,
    /// What the groups hold back.
    #[serde(default)]
    pub policy: RetentionPolicy,
}

impl Retention {
    /// Keep everything (no limit), policy `Limits`.
    pub fn new() -> Self {
        Self::default()
    }
    /// Drops events older than `age`.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }
    /// Keeps at most `bytes` bytes per partition.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }
    /// Keeps at most `n` events per partition.
    pub fn max_events(mut self, n: u64) -> Self {
        self.max_events = Some(n);
        self
    }
    /// Sets the policy.
    pub fn policy(mut self, policy: RetentionPolicy) -> Self {
        self.policy = policy;
        self
    }
    /// True when nothing is ever dropped: no limit, policy `Limits`.
    pub fn is_unlimited(&self) -> bool {
        self.max_age.is_none()
            && self.max_bytes.is_none()
            && self.max_events.is_none()
            && self.policy == RetentionPolicy::Limits
    }

    /// Checks the limits: each given limit above zero, `max_age` at most
    /// [`MAX_RETENTION_AGE`].
    pub(crate) fn validate(&self, stream: &str) -> Result<()> {
        let bad = |what: &str| Error::invalid("retention", format!("stream {stream:?}: {what}"));
        if self.max_age.is_some_and(|a| a.is_zero() || a > MAX_RETENTION_AGE) {
            return Err(bad("max_age must be above zero and at most 100 years"));
        }
        if self.max_bytes == Some(0) {
            return Err(bad("max_bytes must be above zero"));
        }
        if self.max_events == Some(0) {
            return Err(bad("max_events must be above zero"));
        }
        Ok(())
    }

    /// The cut-off time of `max_age` at `now_ms` (events with an earlier
    /// timestamp are past it), if any.
    pub(crate) fn age_cutoff_ms(&self, now_ms: i64) -> Option<i64> {
        self.max_age.map(|a| now_ms.saturating_sub(i64::try_from(a.as_millis()).unwrap_or(i64::MAX)))
    }
}

impl std::fmt::Display for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_unlimited() {
            return f.write_str("forever");
        }
        let mut parts = Vec::new();
        if let Some(a) = self.max_age {
            parts.push(format!("max_age {}", format_duration(a)));
        }
        if let Some(b) = self.max_bytes {
            parts.push(format!("max_bytes {b}"));
        }
        if let Some(n) = self.max_events {
            parts.push(format!("max_events {n}"));
        }
        if parts.is_empty() {
            parts.push("no limits".to_owned());
        }
        write!(f, "{} ({})", parts.join(", "), self.policy)
    }
}

/// A duration in its largest whole unit: `7d`, `12h`, `30m`, `90s`, `1500ms`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(rheo::format_duration(Duration::from_secs(7 * 86_400)), "7d");
/// assert_eq!(rheo::format_duration(Duration::from_millis(1500)), "1500ms");
/// ```
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [("d", 86_400_000u128), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Parses what [`format_duration`] writes (a whole number and one unit of
/// `ms`, `s`, `m`, `h`, `d`).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(rheo::parse_duration("7d")?, Duration::from_secs(7 * 86_400));
/// assert!(rheo::parse_duration("7 days").is_err());
/// # Ok::<(), rheo::Error>(())
/// ```
pub fn parse_duration(s: &str) -> Result<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let bad =
        || Error::invalid("duration", format!("{s:?}: expected a whole number and a unit (ms, s, m, h, d), e.g. 7d"));
    let n: u64 = n.parse().map_err(|_| bad())?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    };
    ms.map(Duration::from_millis).ok_or_else(bad)
}

/// `Option<Duration>` as milliseconds.
pub(crate) mod opt_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// One partition of a stream, as `stream_info` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PartitionInfo {
    /// The partition.
    pub partition: u32,
    /// The first retained sequence (the log start); `last_sequence + 1`
    /// when the partition holds no event.
    pub first_sequence: u64,
    /// The last assigned sequence (the high watermark).
    pub last_sequence: u64,
    /// Bytes of stored events (the native backend: its segment files; the
    /// database backends: the stored payloads and metadata, approximately).
    pub bytes: u64,
}

impl PartitionInfo {
    /// A partition's bounds and size.
    pub fn new(partition: u32, first_sequence: u64, last_sequence: u64, bytes: u64) -> Self {
        PartitionInfo { partition, first_sequence, last_sequence, bytes }
    }
    /// Events it holds.
    pub fn events(&self) -> u64 {
        (self.last_sequence + 1).saturating_sub(self.first_sequence)
    }
}

/// A range of one partition a retention pass dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DroppedRange {
    /// The partition.
    pub partition: u32,
    /// The first sequence dropped.
    pub first: u64,
    /// The last sequence dropped; the new log start is `last + 1`.
    pub last: u64,
    /// Bytes freed (as [`PartitionInfo::bytes`] counts them).
    pub bytes: u64,
}

/// A group that a retention pass moved past events it had not settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupSkip {
    /// The group.
    pub group: String,
    /// The partition.
    pub partition: u32,
    /// Dropped events the group had not settled (never delivered,
    /// in flight, or waiting for a retry). Its dead letters stay listed.
    pub skipped: u64,
}

/// What one retention pass did (see [`crate::Rheo::enforce_retention`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[non_exhaustive]
pub struct RetentionReport {
    /// The stream.
    pub stream: String,
    /// The ranges dropped, by partition.
    pub dropped: Vec<DroppedRange>,
    /// The groups moved past unsettled events.
    pub skipped: Vec<GroupSkip>,
    /// Under [`RetentionPolicy::Interest`]: the limits forced a drop of
    /// events some group had not settled.
    pub ceiling_hit: bool,
}

impl RetentionReport {
    /// An empty report of a stream.
    pub fn new(stream: &str) -> Self {
        RetentionReport { stream: stream.to_owned(), ..Default::default() }
    }
    /// Events dropped, over every partition.
    pub fn events_dropped(&self) -> u64 {
        self.dropped.iter().map(|d| d.last + 1 - d.first).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_stream_and_the_limit() {
        assert!(Retention::new().validate("s").is_ok());
        let e = Retention::new().max_events(0).validate("orders").expect_err("zero");
        assert!(e.to_string().contains("orders") && e.to_string().contains("max_events"), "{e}");
        assert!(Retention::new().max_age(Duration::ZERO).validate("s").is_err());
        assert!(Retention::new().max_bytes(0).validate("s").is_err());
        assert!(Retention::new().max_age(Duration::from_secs(1)).validate("s").is_ok());
    }

    #[test]
    fn display_and_parse() {
        assert_eq!(Retention::new().to_string(), "forever");
        let r = Retention::new().max_age(Duration::from_secs(3600)).max_events(10).policy(RetentionPolicy::Interest);
        assert_eq!(r.to_string(), "max_age 1h, max_events 10 (interest)");
        assert_eq!("interest".parse::<RetentionPolicy>().expect("parse"), RetentionPolicy::Interest);
        assert!("both".parse::<RetentionPolicy>().is_err());
        let json = serde_json::to_string(&r).expect("json");
        assert_eq!(json, r#"{"max_age":3600000,"max_events":10,"policy":"interest"}"#);
        assert_eq!(serde_json::from_str::<Retention>(&json).expect("back"), r);
    }

    #[test]
    fn partition_events_count_the_retained_range() {
        assert_eq!(PartitionInfo::new(0, 11, 20, 0).events(), 10);
        assert_eq!(PartitionInfo::new(0, 21, 20, 0).events(), 0);
        assert_eq!(PartitionInfo::new(0, 1, 0, 0).events(), 0);
    }
}
