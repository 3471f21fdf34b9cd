//! History queries: filters, bounds, ordering and exact keyset paging.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::event::Event;
use super::limits::{MAX_QUERY_TERMS, validate_limit};
use super::path::{canonical_path, is_valid_path};
use super::time::Timestamp;
use crate::error::{Error, Result};

impl From<Timestamp> for Value {
    fn from(t: Timestamp) -> Self {
        Value::from(t.as_millis())
    }
}

/// A comparison of a field with values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Equal (by value type: `1` never equals `"1"`).
    Eq(Value),
    /// Equal to any of these.
    In(Vec<Value>),
    /// Greater than (numbers with numbers, strings with strings).
    Gt(Value),
    /// Greater than or equal.
    Gte(Value),
    /// Less than.
    Lt(Value),
    /// Less than or equal.
    Lte(Value),
    /// The field is present (true) or absent (false).
    Exists(bool),
}

/// One condition of a query's `where`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Filter {
    /// The field path. `id`, `type`, `key`, `partition`, `sequence`,
    /// `timestamp` name the event's own fields; the lineage names
    /// (`correlation_id`, ...) and `metadata.<path>` read the metadata;
    /// `payload.<path>` or any other dotted path reads the payload.
    pub path: String,
    /// The comparison.
    pub op: Op,
}

/// The fields every stream indexes (canonical names, see [`canonical_path`]).
pub const ALWAYS_INDEXED: [&str; 8] =
    ["id", "key", "type", "correlation_id", "causation_id", "producer", "schema", "schema_version"];

/// Checks a field a stream is asked to index and returns its canonical
/// name: a query path of 1 to 256 bytes, no empty dotted segment, naming a
/// value of the event (not `partition`, `sequence`, `timestamp`, `stream`).
pub(crate) fn check_index_field(stream: &str, field: &str) -> Result<String> {
    let bad = |why: &str| Error::invalid("index", format!("stream {stream:?}: cannot index {field:?}: {why}"));
    if field.is_empty() || field.len() > 256 || field.contains('\0') {
        return Err(bad("a field path is 1 to 256 bytes without NUL"));
    }
    if !is_valid_path(field) {
        return Err(bad("a dotted path has no empty segment"));
    }
    canonical_path(field).ok_or_else(|| bad("the log itself orders and bounds this field"))
}

/// Compares two JSON values of the same type; `None` when the types differ
/// (or for arrays and objects, which only compare equal or not).
pub fn compare_values(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let int = |n: &serde_json::Number| n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from));
            match (int(x), int(y)) {
                (Some(i), Some(j)) => Some(i.cmp(&j)),
                _ => x.as_f64()?.partial_cmp(&y.as_f64()?),
            }
        }
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Null, Value::Null) => Some(Ordering::Equal),
        _ if a == b => Some(Ordering::Equal),
        _ => None,
    }
}

impl Filter {
    /// True when the event satisfies this condition.
    pub fn matches(&self, event: &Event) -> bool {
        let field = event.field(&self.path);
        let cmp = |v: &Value| field.as_ref().and_then(|f| compare_values(f, v));
        match &self.op {
            Op::Eq(v) => cmp(v) == Some(Ordering::Equal),
            Op::In(vs) => vs.iter().any(|v| cmp(v) == Some(Ordering::Equal)),
            Op::Gt(v) => cmp(v) == Some(Ordering::Greater),
            Op::Gte(v) => matches!(cmp(v), Some(Ordering::Greater | Ordering::Equal)),
            Op::Lt(v) => cmp(v) == Some(Ordering::Less),
            Op::Lte(v) => matches!(cmp(v), Some(Ordering::Less | Ordering::Equal)),
            Op::Exists(want) => field.is_some() == *want,
        }
    }
}

impl Cursor {
    /// The order it was made for, and the sort key of the last event of
    /// its page: `(0, sequence, partition)` by sequence, `(timestamp,
    /// partition, sequence)` by time, `(0, partition, sequence)` by
    /// partition.
    #[allow(dead_code)]
    pub(crate) fn key(&self) -> (OrderBy, bool, (i64, u64, u64)) {
        (self.order_by, self.descending, self.key)
    }

    /// The sequences of partition `p` that may come after this cursor in
    /// its order: (exclusive lower, inclusive upper).
    fn bounds(&self, p: u32) -> (u64, u64) {
        let (_, a, b) = self.key;
        let none = (u64::MAX, 0);
        match (self.order_by, self.descending) {
            (OrderBy::Sequence, false) => (if u64::from(p) > b { a.saturating_sub(1) } else { a }, u64::MAX),
            (OrderBy::Sequence, true) => (0, if u64::from(p) < b { a } else { a.saturating_sub(1) }),
            (OrderBy::Partition, false) => match u64::from(p).cmp(&a) {
                Ordering::Less => none,
                Ordering::Equal => (b, u64::MAX),
                Ordering::Greater => (0, u64::MAX),
            },
            (OrderBy::Partition, true) => match u64::from(p).cmp(&a) {
                Ordering::Greater => none,
                Ordering::Equal => (0, b.saturating_sub(1)),
                Ordering::Less => (0, u64::MAX),
            },
            (OrderBy::Timestamp, _) => (0, u64::MAX),
        }
    }
}

/// How a query read one run of a partition's sequences (native backend;
/// see [`Page::explain`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explain {
    /// The partition.
    pub partition: u32,
    /// The first sequence of the run.
    pub first: u64,
    /// The last sequence of the run.
    pub last: u64,
    /// How it was read.
    pub access: Access,
}

/// The path a query took through a run of sequences.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Access {
    /// Posting lists of these (canonical) fields were intersected; the
    /// candidates were read and the whole query re-checked on each.
    Index {
        /// The fields whose index narrowed the run.
        fields: Vec<String>,
        /// Candidate events read.
        candidates: u64,
        /// `file` (a sealed segment's index file) or `memory` (the active
        /// segment's in-memory index).
        source: String,
    },
    /// Every event of the run was read and filtered.
    Scan {
        /// Why no index applied.
        reason: String,
    },
}

impl fmt::Display for Explain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "partition {} sequences {}..={}: ", self.partition, self.first, self.last)?;
        match &self.access {
            Access::Index { fields, candidates, source } => {
                write!(f, "index {} ({source}), {candidates} candidates", fields.join(" ∩ "))
            }
            Access::Scan { reason } => write!(f, "scan ({reason})"),
        }
    }
}

/// The order of query results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderBy {
    /// By sequence, then partition (the default).
    #[default]
    Sequence,
    /// By timestamp, then partition, then sequence.
    Timestamp,
    /// By partition, then sequence.
    Partition,
}

/// The default `limit` of a query page.
pub const DEFAULT_QUERY_LIMIT: usize = 100;

/// A history query over one stream. Never touches group state.
///
/// ```
/// use rheo::Query;
/// let q = Query::new("orders").eq("type", "order_paid").gte("amount", 100).after_sequence(100).limit(50);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Query {
    /// The stream.
    pub stream: String,
    /// All must hold.
    pub filters: Vec<Filter>,
    /// Timestamp lower bound (inclusive).
    pub from: Option<Timestamp>,
    /// Timestamp upper bound (inclusive).
    pub to: Option<Timestamp>,
    /// Sequence lower bound (exclusive), every partition.
    pub after_sequence: Option<u64>,
    /// Sequence upper bound (inclusive), every partition.
    pub until_sequence: Option<u64>,
    /// Sequence lower bounds (exclusive) per partition.
    pub after_sequences: BTreeMap<u32, u64>,
    /// The order.
    pub order_by: OrderBy,
    /// Descending instead of ascending.
    pub descending: bool,
    /// The most events per page (1 to [`crate::MAX_LIMIT`]) (default: 100).
    pub limit: usize,
    /// Continue after this cursor (from a previous page).
    pub cursor: Option<Cursor>,
}

impl Query {
    /// Every event of `stream`, ascending by sequence, 100 per page.
    pub fn new(stream: impl Into<String>) -> Self {
        Query {
            stream: stream.into(),
            filters: Vec::new(),
            from: None,
            to: None,
            after_sequence: None,
            until_sequence: None,
            after_sequences: BTreeMap::new(),
            order_by: OrderBy::Sequence,
            descending: false,
            limit: DEFAULT_QUERY_LIMIT,
            cursor: None,
        }
    }

    /// Adds a condition.
    pub fn filter(mut self, path: impl Into<String>, op: Op) -> Self {
        self.filters.push(Filter { path: path.into(), op });
        self
    }
    /// `path == value`.
    pub fn eq(self, path: impl Into<String>, value: impl Into<Value>) -> Self {
        self.filter(path, Op::Eq(value.into()))
    }
    /// `path` equals one of `values`.
    pub fn is_in<V: Into<Value>>(self, path: impl Into<String>, values: impl IntoIterator<Item = V>) -> Self {
        self.filter(path, Op::In(values.into_iter().map(Into::into).collect()))
    }
    /// `path > value`.
    pub fn gt(self, path: impl Into<String>, value: impl Into<Value>) -> Self {
        self.filter(path, Op::Gt(value.into()))
    }
    /// `path >= value`.
    pub fn gte(self, path: impl Into<String>, value: impl Into<Value>) -> Self {
        self.filter(path, Op::Gte(value.into()))
    }
    /// `path < value`.
    pub fn lt(self, path: impl Into<String>, value: impl Into<Value>) -> Self {
        self.filter(path, Op::Lt(value.into()))
    }
    /// `path <= value`.
    pub fn lte(self, path: impl Into<String>, value: impl Into<Value>) -> Self {
        self.filter(path, Op::Lte(value.into()))
    }
    /// `path` is present.
    pub fn exists(self, path: impl Into<String>) -> Self {
        self.filter(path, Op::Exists(true))
    }
    /// `path` is absent.
    pub fn missing(self, path: impl Into<String>) -> Self {
        self.filter(path, Op::Exists(false))
    }
    /// Only this partition.
    pub fn partition(self, partition: u32) -> Self {
        self.eq("partition", partition)
    }
    /// Timestamp >= t.
    pub fn from(mut self, t: Timestamp) -> Self {
        self.from = Some(t);
        self
    }
    /// Timestamp <= t.
    pub fn to(mut self, t: Timestamp) -> Self {
        self.to = Some(t);
        self
    }
    /// Sequence > n in every partition.
    pub fn after_sequence(mut self, n: u64) -> Self {
        self.after_sequence = Some(n);
        self
    }
    /// Sequence <= n in every partition.
    pub fn until_sequence(mut self, n: u64) -> Self {
        self.until_sequence = Some(n);
        self
    }
    /// Sequence > n for partition p.
    pub fn after_sequences(mut self, map: BTreeMap<u32, u64>) -> Self {
        self.after_sequences = map;
        self
    }
    /// Sets the order.
    pub fn order_by(mut self, order: OrderBy) -> Self {
        self.order_by = order;
        self
    }
    /// Descending order.
    pub fn descending(mut self) -> Self {
        self.descending = true;
        self
    }
    /// Sets the page size.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
    /// Continues after a cursor from a previous page.
    pub fn cursor(mut self, cursor: Cursor) -> Self {
        self.cursor = Some(cursor);
        self
    }

    /// Checks the limit, the filter paths (see [`is_valid_path`]) and that
    /// the cursor was made for this order.
    pub fn validate(&self) -> Result<()> {
        validate_limit("limit", self.limit)?;
        if let Some(f) = self.filters.iter().find(|f| !is_valid_path(&f.path)) {
            return Err(Error::invalid(
                "query",
                format!("filter path {:?} has an empty dotted segment and names no value", f.path),
            ));
        }
        let terms: usize = self.filters.iter().map(|f| if let Op::In(v) = &f.op { v.len().max(1) } else { 1 }).sum();
        if terms > MAX_QUERY_TERMS {
            return Err(Error::invalid(
                "query",
                format!("{terms} filter terms is above the maximum {MAX_QUERY_TERMS}"),
            ));
        }
        if let Some(c) = &self.cursor
            && (c.order_by != self.order_by || c.descending != self.descending)
        {
            return Err(Error::invalid("cursor", "the cursor was made for another order"));
        }
        Ok(())
    }

    /// The exclusive lower and inclusive upper sequence bound in a partition.
    pub(crate) fn sequence_bounds(&self, partition: u32) -> (u64, u64) {
        let after = self.after_sequence.unwrap_or(0).max(self.after_sequences.get(&partition).copied().unwrap_or(0));
        (after, self.until_sequence.unwrap_or(u64::MAX))
    }

    /// The sequence bounds of a partition narrowed by everything that
    /// implies one: the explicit bounds, `sequence` filters with integer
    /// values, and the cursor (for orders by sequence or partition). Events
    /// outside them cannot match; `after >= until` means none can.
    pub(crate) fn narrowed_bounds(&self, partition: u32) -> (u64, u64) {
        let (mut after, mut until) = self.sequence_bounds(partition);
        for f in self.filters.iter().filter(|f| f.path == "sequence") {
            let n = |v: &Value| v.as_u64();
            match &f.op {
                Op::Eq(v) => match n(v) {
                    Some(x) => {
                        after = after.max(x.saturating_sub(1));
                        until = until.min(x);
                    }
                    None if v.as_f64().is_none_or(|x| x.fract() != 0.0 || x < 0.0) => return (0, 0),
                    None => {}
                },
                Op::Gt(v) => after = after.max(n(v).unwrap_or(0)),
                Op::Gte(v) => after = after.max(n(v).unwrap_or(1).saturating_sub(1)),
                Op::Lt(v) => {
                    if let Some(x) = n(v) {
                        until = until.min(x.saturating_sub(1));
                    }
                }
                Op::Lte(v) => {
                    if let Some(x) = n(v) {
                        until = until.min(x);
                    }
                }
                _ => {}
            }
        }
        if let Some(c) = self.cursor.as_ref().filter(|c| c.order_by == self.order_by && c.descending == self.descending)
        {
            let (a, u) = c.bounds(partition);
            after = after.max(a);
            until = until.min(u);
        }
        (after, until)
    }

    /// The partitions an event may match in, from `partition` equality
    /// filters; every partition when none restricts it.
    pub(crate) fn partitions(&self, partition_count: u32) -> Vec<u32> {
        (0..partition_count)
            .filter(|&p| {
                self.filters.iter().filter(|f| f.path == "partition").all(|f| {
                    let probe = Value::from(p);
                    match &f.op {
                        Op::Eq(v) => compare_values(&probe, v) == Some(Ordering::Equal),
                        Op::In(vs) => vs.iter().any(|v| compare_values(&probe, v) == Some(Ordering::Equal)),
                        _ => true,
                    }
                })
            })
            .collect()
    }

    /// True when the event satisfies every filter and bound, and comes after
    /// the cursor.
    pub fn matches(&self, e: &Event) -> bool {
        self.matches_position(e.partition(), e.sequence(), e.timestamp()) && self.filters.iter().all(|f| f.matches(e))
    }

    /// True when an event at this position and time is within the query's
    /// bounds and after its cursor: every check of [`Query::matches`] but
    /// the filters, which need the event's document.
    pub(crate) fn matches_position(&self, partition: u32, sequence: u64, timestamp: Timestamp) -> bool {
        let (after, until) = self.sequence_bounds(partition);
        sequence > after
            && sequence <= until
            && self.from.is_none_or(|t| timestamp >= t)
            && self.to.is_none_or(|t| timestamp <= t)
            && self.cursor.as_ref().is_none_or(|c| {
                self.compare_keys(self.key_at(partition, sequence, timestamp), c.key) == Ordering::Greater
            })
    }

    /// The key of `e` in this query's order (what cursors hold).
    pub(crate) fn sort_key(&self, e: &Event) -> SortKey {
        self.key_at(e.partition(), e.sequence(), e.timestamp())
    }

    fn key_at(&self, partition: u32, sequence: u64, timestamp: Timestamp) -> SortKey {
        match self.order_by {
            OrderBy::Sequence => (0, sequence, u64::from(partition)),
            OrderBy::Timestamp => (timestamp.as_millis(), u64::from(partition), sequence),
            OrderBy::Partition => (0, u64::from(partition), sequence),
        }
    }

    /// Orders two keys in the query's direction.
    fn compare_keys(&self, a: SortKey, b: SortKey) -> Ordering {
        if self.descending { b.cmp(&a) } else { a.cmp(&b) }
    }

    /// Builds a page from candidate events in any order: keeps those that
    /// match, sorts them, cuts at `limit` and sets `next_cursor` when more
    /// matches remain. Memory is bounded by the limit, not the candidates.
    #[doc(hidden)]
    pub fn page_from<I>(&self, candidates: I) -> Page
    where
        I: IntoIterator<Item = Event>,
    {
        let mut builder = self.page_builder();
        for e in candidates {
            builder.offer(e);
        }
        builder.finish()
    }

    /// True when, within one partition, ascending sequence is also this
    /// query's order (ascending by sequence or by partition).
    pub(crate) fn scan_is_ordered(&self) -> bool {
        !self.descending && matches!(self.order_by, OrderBy::Sequence | OrderBy::Partition)
    }

    /// A builder that takes candidate events one at a time (see [`Query::page_from`]).
    pub(crate) fn page_builder(&self) -> PageBuilder<'_> {
        let keep = self.limit.saturating_add(1);
        PageBuilder { query: self, keep, heap: BinaryHeap::with_capacity(keep.min(1024)) }
    }
}

/// A candidate ranked in its query's order (the heap's top is the last).
struct Ranked<'q>(SortKey, Event, &'q Query);

impl PartialEq for Ranked<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.0 == o.0
    }
}
impl Eq for Ranked<'_> {}
impl PartialOrd for Ranked<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ranked<'_> {
    fn cmp(&self, o: &Self) -> Ordering {
        self.2.compare_keys(self.0, o.0)
    }
}

/// Collects the first `limit + 1` matches of a query, in its order, from
/// candidates offered in any order.
pub(crate) struct PageBuilder<'q> {
    query: &'q Query,
    keep: usize,
    heap: BinaryHeap<Ranked<'q>>,
}

impl<'q> PageBuilder<'q> {
    /// The query the page is for.
    pub fn query(&self) -> &'q Query {
        self.query
    }

    /// Considers one candidate.
    pub fn offer(&mut self, e: Event) {
        let q = self.query;
        if !q.matches(&e) {
            return;
        }
        let key = q.sort_key(&e);
        if self.heap.len() < self.keep {
            self.heap.push(Ranked(key, e, q));
        } else if self.heap.peek().is_some_and(|top| q.compare_keys(key, top.0) == Ordering::Less) {
            self.heap.pop();
            self.heap.push(Ranked(key, e, q));
        }
    }

    /// True when the page is full and the event at (`partition`,
    /// `sequence`) ranks after everything kept, so it cannot be on the page;
    /// in a scan whose candidates come in the query's order (see
    /// [`Query::scan_is_ordered`]) every later candidate is past the end too
    /// and the scan may stop. Always false for the timestamp order, whose
    /// key needs the event.
    pub fn past_end_at(&self, partition: u32, sequence: u64) -> bool {
        if self.query.order_by == OrderBy::Timestamp {
            return false;
        }
        // The sequence and partition orders do not read the timestamp.
        let key = self.query.key_at(partition, sequence, Timestamp::from_millis(0));
        self.heap.len() >= self.keep
            && self.heap.peek().is_some_and(|top| self.query.compare_keys(key, top.0) == Ordering::Greater)
    }

    /// The page.
    pub fn finish(self) -> Page {
        let q = self.query;
        let mut ranked = self.heap.into_sorted_vec();
        let more = ranked.len() > q.limit;
        ranked.truncate(q.limit);
        let next_cursor = if more {
            ranked.last().map(|r| Cursor { order_by: q.order_by, descending: q.descending, key: r.0 })
        } else {
            None
        };
        Page { events: ranked.into_iter().map(|r| r.1).collect(), next_cursor, explain: Vec::new() }
    }
}

pub(crate) type SortKey = (i64, u64, u64);

/// One page of query results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Page {
    /// The events, in the query's order.
    pub events: Vec<Event>,
    /// Where the next page starts; `None` when this was the last.
    pub next_cursor: Option<Cursor>,
    /// How the backend read each run of sequences (the native backend says
    /// which index or scan it used; others leave it empty). For humans and
    /// tests; its shape may grow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explain: Vec<Explain>,
}

/// An exact keyset position in a query's order: the sort key of the last
/// event returned. Pages that follow each other by cursor return every
/// matching event exactly once, across partitions, even while events are
/// appended. Opaque: pass it back, or print it with `Display` and read it
/// back with `parse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    order_by: OrderBy,
    descending: bool,
    key: SortKey,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = match self.order_by {
            OrderBy::Sequence => 's',
            OrderBy::Timestamp => 't',
            OrderBy::Partition => 'p',
        };
        let d = if self.descending { 'd' } else { 'a' };
        write!(f, "c1.{o}{d}.{}.{}.{}", self.key.0, self.key.1, self.key.2)
    }
}

impl std::str::FromStr for Cursor {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::invalid("cursor", format!("{s:?} is not a query cursor"));
        let mut parts = s.split('.');
        if parts.next() != Some("c1") {
            return Err(bad());
        }
        let mode = parts.next().ok_or_else(bad)?;
        let order_by = match mode.as_bytes().first() {
            Some(b's') => OrderBy::Sequence,
            Some(b't') => OrderBy::Timestamp,
            Some(b'p') => OrderBy::Partition,
            _ => return Err(bad()),
        };
        let descending = match mode.as_bytes().get(1) {
            Some(b'd') => true,
            Some(b'a') => false,
            _ => return Err(bad()),
        };
        let a = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let b = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let c = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        if parts.next().is_some() || mode.len() != 2 {
            return Err(bad());
        }
        Ok(Cursor { order_by, descending, key: (a, b, c) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_path_with_an_empty_segment_names_nothing_and_is_refused() {
        for bad in ["", ".", "payload.", ".a", "a..b", "metadata.", "a."] {
            assert!(!is_valid_path(bad), "{bad:?}");
            let q = Query::new("s").eq(bad, json!(1));
            assert!(matches!(q.validate(), Err(Error::InvalidArgument { .. })), "{bad:?}");
            let e = ev(0, 1, 0, json!({"": 1, "a": {"": 2}}));
            assert_eq!(e.field(bad), None, "{bad:?}");
        }
        for good in ["a", "payload.a", "a.b.0", "metadata.producer", "id"] {
            assert!(is_valid_path(good), "{good:?}");
        }
    }

    fn ev(partition: u32, sequence: u64, ts: i64, payload: Value) -> Event {
        Event::from(crate::model::event::EventParts {
            timestamp: Timestamp::from_millis(ts),
            event_type: payload.get("type").and_then(Value::as_str).map(str::to_owned),
            payload: payload.into(),
            ..crate::model::event::EventParts::new("s", partition, sequence)
        })
    }

    #[test]
    fn typed_comparison() {
        assert_eq!(compare_values(&json!(1), &json!("1")), None);
        assert_eq!(compare_values(&json!(1), &json!(1.0)), Some(Ordering::Equal));
        assert_eq!(compare_values(&json!(u64::MAX), &json!(-1)), Some(Ordering::Greater));
        assert_eq!(compare_values(&json!("b"), &json!("a")), Some(Ordering::Greater));
    }

    #[test]
    fn cursor_round_trips() {
        let c = Cursor { order_by: OrderBy::Timestamp, descending: true, key: (-5, 2, 9) };
        assert_eq!(c.to_string().parse::<Cursor>().ok(), Some(c));
        assert!("c1.xx.1.2.3".parse::<Cursor>().is_err());
        assert!("c1.sa.1.2".parse::<Cursor>().is_err());
        assert!("".parse::<Cursor>().is_err());
    }

    #[test]
    fn page_sorts_cuts_and_continues() {
        let q = Query::new("s").gte("n", 2).limit(2);
        let events = || (1..=5).rev().map(|i| ev(0, i, 0, json!({"n": i})));
        let p1 = q.page_from(events());
        assert_eq!(p1.events.iter().map(|e| e.sequence()).collect::<Vec<_>>(), vec![2, 3]);
        let p2 = q.clone().cursor(p1.next_cursor.expect("more")).page_from(events());
        assert_eq!(p2.events.iter().map(|e| e.sequence()).collect::<Vec<_>>(), vec![4, 5]);
        assert!(p2.next_cursor.is_none());
    }

    #[test]
    fn partition_pushdown() {
        assert_eq!(Query::new("s").partition(2).partitions(4), vec![2]);
        assert_eq!(Query::new("s").is_in("partition", [0, 3, 9]).partitions(4), vec![0, 3]);
        assert_eq!(Query::new("s").partitions(2), vec![0, 1]);
    }
}
