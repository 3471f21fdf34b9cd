//! Appends by group commit (ADR 0020): concurrent `append`/`append_batch`
//! calls of one handle that write to the same (stream, partition) go to the
//! database together, one flush in flight per key.
//!
//! - **PostgreSQL:** a flush is one autocommitted statement. A CTE reserves
//!   the flush's range on each partition's counter row
//!   (`rheo_stream_sequences`, the reference's, in ascending partition
//!   order, so flushes never deadlock) and the same statement inserts every
//!   event from one JSON array, numbering them `base + k`. The counter row
//!   is locked for that one statement and its commit, not for the 3 round
//!   trips of a transaction, and no `pg_notify` runs inside it (see
//!   `listen::Notifier`), so flushes of different partitions and streams
//!   share PostgreSQL's own group commit.
//! - **SQLite:** a flush is one `BEGIN IMMEDIATE` transaction (one commit,
//!   one fsync for every call in it).
//!
//! Sequences stay gapless and commit-ordered per partition, exactly as
//! before, and an Elixir Rheo appending through the same counter rows
//! interleaves correctly: both reserve their range under the row lock.
//!
//! Each call gets its own positions or its own error. A flush that fails as
//! a whole with an error that may be one call's fault (not a lost
//! connection or an unknown commit) is run again call by call, so one bad
//! call fails alone. An unknown commit is `Ambiguous` for every call in it.
//! Calls with producer-given ids do not combine (their duplicate check reads
//! the table in the append's own transaction): they take `append_tx`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::db::{Phase, Pool, Stmt};
use super::dialect::Dialect;
use super::schema::Names;
use super::{Now, TxError, TxResult};
use crate::backends::WakeupMap;
use crate::backends::combine::{Answers, Call, Combiner};
use crate::error::{Error, Result};
use crate::model::append::NewEvent;
use crate::model::event::Position;
use crate::model::time::Timestamp;

/// The most events in one flush.
pub(crate) const FLUSH_MAX_EVENTS: usize = 1000;
/// The most bytes (of encoded rows) in one flush.
pub(crate) const FLUSH_MAX_BYTES: usize = 4 << 20;
/// Flushes of one key in flight at once. The second waits for the first's
/// counter-row lock in the database, so their sequences never interleave,
/// but it is sent, parsed and queued meanwhile: the partition's lock is
/// never idle for a client round trip.
pub(crate) const FLUSH_DEPTH: usize = 1;

/// One event, encoded for a flush: its partition and the JSON of its
/// columns `"id", ts, key, type, metadata, payload` (without brackets).
pub(crate) struct Row {
    partition: u32,
    /// The timestamp the row carries; None: the database's `now()`.
    ts: Option<Timestamp>,
    cols: String,
    /// The event carries a delivery time (ADR 0036): `cols` ends with it
    /// (milliseconds on PostgreSQL, the text form on SQLite), and the
    /// write records it in `rheo_rs_scheduled`.
    scheduled: bool,
}

/// Where a flush goes: a stream, and its partition when every event of
/// the calls in it routes to one (multi-partition calls combine apart).
pub(crate) type Key = (Arc<str>, Option<u32>);

/// What a flush needs of the backend (it runs in a task of its own).
#[derive(Debug)]
pub(crate) struct Appender {
    d: Dialect,
    pool: Pool,
    names: Names,
    wakeups: Arc<WakeupMap>,
    busy_budget: Option<std::time::Duration>,
    #[cfg(feature = "postgres")]
    notifier: Option<(Arc<super::listen::Notifier>, sqlx::postgres::PgPool)>,
}

/// The rows of one atomic write: `ks` numbers each within its partition
/// (from 1), `per` counts each partition's.
#[derive(Clone, Copy)]
struct Numbered<'a> {
    stream: &'a str,
    rows: &'a [&'a Row],
    ks: &'a [u64],
    per: &'a BTreeMap<u32, u64>,
}

/// Where a write went: each partition's base (its events are base + k),
/// and the database's `now()` where the rows took it.
type Written = (BTreeMap<u32, u64>, Option<Timestamp>);

impl Appender {
    pub(crate) fn new(
        d: Dialect,
        pool: Pool,
        names: Names,
        wakeups: Arc<WakeupMap>,
        origin: &str,
        busy_budget: Option<std::time::Duration>,
    ) -> Self {
        #[cfg(feature = "postgres")]
        let notifier = match &pool {
            Pool::Pg(p) => Some((
                Arc::new(super::listen::Notifier::new(origin.to_owned(), names.schema().map(str::to_owned))),
                p.clone(),
            )),
            #[allow(unreachable_patterns)]
            _ => None,
        };
        #[cfg(not(feature = "postgres"))]
        let _ = origin;
        Appender {
            d,
            pool,
            names,
            wakeups,
            busy_budget,
            #[cfg(feature = "postgres")]
            notifier,
        }
    }

    /// The combiner whose flushes this appender runs.
    pub(crate) fn combiner(self: &Arc<Self>) -> Combiner<Key, Row, Position> {
        let me = self.clone();
        Combiner::new(
            "append",
            FLUSH_MAX_EVENTS,
            FLUSH_MAX_BYTES,
            FLUSH_DEPTH,
            move |key: Key, calls: Vec<Call<Row>>| {
                let me = me.clone();
                async move { me.flush(key.0, calls).await }
            },
        )
    }

    pub(crate) fn be(&self) -> &'static str {
        self.d.name()
    }

    pub(crate) fn busy_budget(&self) -> Option<std::time::Duration> {
        self.busy_budget
    }

    /// Tells this process's subscribers at once, and other processes'
    /// through the notifier, that `count` events were committed to `stream`.
    pub(crate) fn committed(&self, stream: &str, count: usize) {
        if count == 0 {
            return;
        }
        self.wakeups.wake(stream);
        #[cfg(feature = "postgres")]
        if let Some((n, pool)) = &self.notifier {
            n.appended(pool, stream, count);
        }
    }

    pub(crate) fn stop(&self) {
        #[cfg(feature = "postgres")]
        if let Some((n, _)) = &self.notifier {
            n.stop();
        }
    }

    /// Encodes the events of a call (routed to `routed`) for a flush.
    /// Returns the rows and their size in bytes.
    pub(crate) fn encode(&self, events: &[NewEvent], routed: &[u32], now: Now) -> Result<(Vec<Row>, usize)> {
        let mut rows = Vec::with_capacity(events.len());
        let mut bytes = 0;
        for (e, &partition) in events.iter().zip(routed) {
            let at = e.timestamp.or(match now {
                Now::At(t) => Some(t),
                Now::Db => None,
            });
            let ts = match (at, self.d) {
                (Some(t), Dialect::Sqlite) => Value::from(super::dialect::format_ts(t)),
                (Some(t), Dialect::Postgres) => Value::from(t.as_millis()),
                (None, _) => Value::Null,
            };
            let mut cols = Vec::with_capacity(256);
            let arr = [
                Value::from(e.id.as_str()),
                ts,
                e.key.as_deref().map_or(Value::Null, Value::from),
                e.event_type.as_deref().map_or(Value::Null, Value::from),
            ];
            for (i, v) in arr.iter().enumerate() {
                if i > 0 {
                    cols.push(b',');
                }
                serde_json::to_writer(&mut cols, v).map_err(|err| Error::failed("append", err.to_string()))?;
            }
            cols.push(b',');
            serde_json::to_writer(&mut cols, &e.metadata).map_err(|err| Error::failed("append", err.to_string()))?;
            cols.push(b',');
            e.payload.write_json(&mut cols)?;
            let deliver_at = e.deliver_at();
            if let Some(t) = deliver_at {
                let v = match self.d {
                    Dialect::Sqlite => Value::from(super::dialect::format_ts(t)),
                    Dialect::Postgres => Value::from(t.as_millis()),
                };
                cols.push(b',');
                serde_json::to_writer(&mut cols, &v).map_err(|err| Error::failed("append", err.to_string()))?;
            }
            let cols = String::from_utf8(cols).map_err(|err| Error::failed("append", err.to_string()))?;
            bytes += cols.len() + 16;
            rows.push(Row { partition, ts: at, cols, scheduled: deliver_at.is_some() });
        }
        Ok((rows, bytes))
    }

    /// Writes the calls of one flush and answers each.
    async fn flush(&self, stream: Arc<str>, calls: Vec<Call<Row>>) -> Answers<Position> {
        let all: Vec<&Row> = calls.iter().flat_map(|c| c.items.iter()).collect();
        match self.write(&stream, &all).await {
            Ok(positions) => {
                self.committed(&stream, positions.len());
                let mut rest = positions.into_iter();
                calls.iter().map(|c| Ok(rest.by_ref().take(c.items.len()).collect())).collect()
            }
            // Nothing was written, or nobody knows: the same for every call.
            Err(e) if e.is_transient() || calls.len() == 1 => calls.iter().map(|_| Err(e.clone())).collect(),
            // Perhaps one call's fault: each call alone.
            Err(_) => {
                let mut out = Vec::with_capacity(calls.len());
                for c in &calls {
                    let rows: Vec<&Row> = c.items.iter().collect();
                    let r = self.write(&stream, &rows).await;
                    if let Ok(p) = &r {
                        self.committed(&stream, p.len());
                    }
                    out.push(r);
                }
                out
            }
        }
    }

    /// Writes `rows` atomically; their positions in order.
    async fn write(&self, stream: &str, rows: &[&Row]) -> Result<Vec<Position>> {
        // The k-th event of its partition in this write (1-based).
        let mut per: BTreeMap<u32, u64> = BTreeMap::new();
        let ks: Vec<u64> = rows
            .iter()
            .map(|r| {
                let k = per.entry(r.partition).or_default();
                *k += 1;
                *k
            })
            .collect();
        let numbered = Numbered { stream, rows, ks: &ks, per: &per };
        let (base, now) = super::retry_tx!(self, "append", self.write_once(&numbered).await)?;
        // Every partition's events are base + 1 ..= base + n.
        rows.iter()
            .zip(&ks)
            .map(|(r, &k)| match (base.get(&r.partition), r.ts.or(now)) {
                (Some(b), Some(t)) => Ok(Position::new(r.partition, b + k, t)),
                _ => Err(Error::ambiguous(
                    "append",
                    format!(
                        "stream {stream:?}: the insert did not report where event {k} of partition {} went (it may be stored)",
                        r.partition
                    ),
                )),
            })
            .collect()
    }

    /// One attempt: each partition's base (its events are base + k) and
    /// the database's `now()` where the rows took it.
    async fn write_once(&self, w: &Numbered<'_>) -> TxResult<Written> {
        let Numbered { stream, rows, ks, per } = *w;
        match self.d {
            Dialect::Postgres => {
                let mut s = Stmt::new(self.d);
                let name = s.text(stream);
                let counts = s.text(json_pairs(per.iter().map(|(&p, &n)| (p, n))));
                let arr = s.text(json_rows(rows, ks.iter().copied()));
                // One row per partition back, not one per event: the
                // client knows every event's sequence from its base, and
                // its timestamp (given, or the statement's now()).
                s.push(&format!(
                    "WITH n AS (SELECT (e ->> 0)::int AS p, (e ->> 1)::bigint AS c FROM jsonb_array_elements({counts}::jsonb) AS e), \
                     q AS (INSERT INTO {seqs} AS q (stream, partition, next_sequence) \
                           SELECT {name}, n.p, n.c FROM n ORDER BY n.p \
                           ON CONFLICT (stream, partition) DO UPDATE SET next_sequence = q.next_sequence + excluded.next_sequence \
                           RETURNING q.partition, q.next_sequence), \
                     b AS (SELECT q.partition AS p, q.next_sequence - n.c AS base, n.c FROM q JOIN n ON n.p = q.partition), \
                     i AS (INSERT INTO {events} (id, stream, partition, sequence, \"timestamp\", \"key\", \"type\", metadata, payload) \
                           SELECT x.v ->> 2, {name}, b.p, b.base + (x.v ->> 1)::bigint, \
                                  COALESCE('epoch'::timestamptz + (x.v ->> 3)::bigint * interval '1 millisecond', now()), \
                                  x.v ->> 4, x.v ->> 5, x.v -> 6, x.v -> 7 \
                           FROM jsonb_array_elements({arr}::jsonb) AS x(v) JOIN b ON b.p = (x.v ->> 0)::int \
                           RETURNING 1){sched} \
                     SELECT b.p, b.base, b.c, (SELECT count(*) FROM i), {now} FROM b",
                    seqs = self.names.seqs(),
                    events = self.names.events(),
                    now = self.d.ts_out("now()"),
                    // Only a write with scheduled events has this part:
                    // the common statement keeps its shape.
                    sched = if rows.iter().any(|r| r.scheduled) {
                        format!(
                            ", sc AS (INSERT INTO {} (stream, partition, sequence, event_id, deliver_at) \
                             SELECT {name}, b.p, b.base + (x.v ->> 1)::bigint, x.v ->> 2, \
                                    'epoch'::timestamptz + (x.v ->> 8)::bigint * interval '1 millisecond' \
                             FROM jsonb_array_elements({arr}::jsonb) AS x(v) JOIN b ON b.p = (x.v ->> 0)::int \
                             WHERE x.v ->> 8 IS NOT NULL)",
                            self.names.scheduled()
                        )
                    } else {
                        String::new()
                    },
                ));
                // Autocommit: a connection lost while it runs leaves its
                // commit unknown.
                let out = self.pool.all(&s).await.map_err(|e| TxError::Sql(e, Phase::Commit))?;
                let mut base = BTreeMap::new();
                let mut now = None;
                for r in &out {
                    let inserted = r.u64(3)?;
                    if inserted != rows.len() as u64 {
                        return Err(TxError::Rheo(Error::ambiguous(
                            "append",
                            format!("stream {stream:?}: {inserted} of {} events were inserted", rows.len()),
                        )));
                    }
                    base.insert(r.u32(0)?, r.u64(1)?);
                    now = Some(r.ts(4)?);
                }
                Ok((base, now))
            }
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => self.write_lite(w).await,
            #[cfg(not(feature = "sqlite"))]
            Dialect::Sqlite => Err(TxError::Rheo(Error::failed("append", "built without the sqlite feature"))),
        }
    }

    /// The SQLite flush: one script in one round trip (`BEGIN IMMEDIATE`,
    /// each partition's counter row, the events numbered from it in SQL,
    /// `changes()`, `COMMIT`): one commit and one fsync for every call in
    /// the flush, one hand-off to sqlx's SQLite thread instead of a
    /// statement's each.
    #[cfg(feature = "sqlite")]
    async fn write_lite(&self, w: &Numbered<'_>) -> TxResult<Written> {
        let Numbered { stream, rows, ks, per } = *w;
        use super::db::lite_literal;
        let name = lite_literal(stream);
        let mut script = String::from("BEGIN IMMEDIATE;");
        for (&p, &n) in per {
            script.push_str(&format!(
                "INSERT INTO {seqs} AS q (stream, partition, next_sequence) VALUES ({name}, {p}, {n}) \
                 ON CONFLICT (stream, partition) DO UPDATE SET next_sequence = q.next_sequence + excluded.next_sequence \
                 RETURNING partition, next_sequence;",
                seqs = self.names.seqs(),
                n = super::streams::seq_arg(n),
            ));
        }
        // Each event's sequence: its partition's new counter, less the
        // partition's count in this flush, plus its own number k.
        let counts: Vec<String> =
            per.iter().map(|(p, n)| format!("WHEN {p} THEN {}", super::streams::seq_arg(*n))).collect();
        let arr = lite_literal(&json_rows(rows, ks.iter().copied()));
        if rows.iter().any(|r| r.scheduled) {
            // Before the events' insert, whose `changes()` the script
            // returns (and after the counters, which number both).
            script.push_str(&format!(
                "WITH b AS MATERIALIZED (SELECT q.partition AS p, q.next_sequence - (CASE q.partition {counts} END) AS base \
                   FROM {seqs} q WHERE q.stream = {name}) \
                 INSERT INTO {sched} (stream, partition, sequence, event_id, deliver_at) \
                 SELECT {name}, b.p, b.base + CAST(x.value ->> 1 AS INTEGER), x.value ->> 2, x.value ->> 8 \
                 FROM json_each({arr}) AS x CROSS JOIN b ON b.p = CAST(x.value ->> 0 AS INTEGER) \
                 WHERE x.value ->> 8 IS NOT NULL;",
                seqs = self.names.seqs(),
                sched = self.names.scheduled(),
                counts = counts.join(" "),
            ));
        }
        script.push_str(&format!(
            "WITH b AS MATERIALIZED (SELECT q.partition AS p, q.next_sequence - (CASE q.partition {counts} END) AS base \
               FROM {seqs} q WHERE q.stream = {name}) \
             INSERT INTO {events} (id, stream, partition, sequence, \"timestamp\", \"key\", \"type\", metadata, payload) \
             SELECT x.value ->> 2, {name}, b.p, b.base + CAST(x.value ->> 1 AS INTEGER), \
                    x.value ->> 3, x.value ->> 4, x.value ->> 5, x.value -> 6, x.value -> 7 \
             FROM json_each({arr}) AS x CROSS JOIN b ON b.p = CAST(x.value ->> 0 AS INTEGER); SELECT -1, changes();",
            events = self.names.events(),
            seqs = self.names.seqs(),
            counts = counts.join(" "),
        ));
        let out = self.pool.lite_script(script, per.len() + 1).await.map_err(|(e, phase)| TxError::Sql(e, phase))?;
        let mut base: BTreeMap<u32, u64> = BTreeMap::new();
        let mut inserted = None;
        for r in &out {
            match r.i64(0)? {
                -1 => inserted = Some(r.u64(1)?),
                p => {
                    let p = u32::try_from(p).map_err(|_| Error::failed("append", format!("partition {p}")))?;
                    let n = per.get(&p).copied().unwrap_or(0);
                    base.insert(p, r.u64(1)?.saturating_sub(n));
                }
            }
        }
        if inserted != Some(rows.len() as u64) || base.len() != per.len() {
            // The script ran to its end and COMMIT succeeded, so this is
            // a bug, not a failure: what was written is not what was sent.
            return Err(TxError::Rheo(Error::ambiguous(
                "append",
                format!("stream {stream:?}: {inserted:?} of {} events were inserted", rows.len()),
            )));
        }
        // SQLite rows always carry their timestamp (no database clock).
        Ok((base, None))
    }
}

/// `[[p, n], …]`.
fn json_pairs(pairs: impl Iterator<Item = (u32, u64)>) -> String {
    let mut out = String::from("[");
    for (i, (p, n)) in pairs.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!("[{p},{n}]"));
    }
    out.push(']');
    out
}

/// `[[partition, n, "id", ts, key, type, metadata, payload], …]` with each
/// row's `n` from `ns`.
fn json_rows(rows: &[&Row], ns: impl Iterator<Item = u64>) -> String {
    let mut out = String::with_capacity(rows.iter().map(|r| r.cols.len() + 24).sum::<usize>() + 2);
    out.push('[');
    for (i, (r, n)) in rows.iter().zip(ns).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('[');
        out.push_str(&r.partition.to_string());
        out.push(',');
        out.push_str(&n.to_string());
        out.push(',');
        out.push_str(&r.cols);
        out.push(']');
    }
    out.push(']');
    out
}
