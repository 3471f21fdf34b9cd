//! Frontiers on SQL: derived from the delivery rows, the claims and the
//! cursor (F = the first unsettled position, minus one), and kept in the
//! reference's `rheo_groups.frontiers` by a flusher, never ahead of what
//! is settled (ADR 0021).
//!
//! An ack writes its delivery rows or claim characters and nothing else:
//! it never takes the group row's lock, so consumers of different
//! partitions (and of one) never wait for each other's commits to settle.
//! It notes the partitions it settled; a flush task per (stream, group)
//! moves their frontiers in one transaction at most every
//! [`FLUSH_EVERY`], under the group row's lock (so a replay or reset, which
//! take it too, never interleaves), and deletes claims with nothing left
//! open. What reads the frontier for a user (`lag`, `group_info`) derives
//! it afresh, so it is exact however late the flush; what reads it as a
//! lower bound (a claim's scan, an Elixir process, retention's `interest`)
//! is right with an older value.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;

use super::db::{Pool, Stmt, Tx, map_text, parse_map, sg};
use super::dialect::Dialect;
use super::schema::Names;
use super::{TxResult, at_commit, safe};
use crate::backends::common::frontier_cursor as fc;
use crate::error::{Error, Result};

/// How often the frontiers of one group are written at most, per handle.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// How long a flush that failed waits before the next try.
const FLUSH_RETRY: Duration = Duration::from_millis(200);

/// Partitions waiting for a flush, per (stream, group).
#[derive(Debug, Default)]
struct Pending {
    parts: BTreeSet<u32>,
    /// A flush task runs for the group.
    running: bool,
}

/// The frontier SQL and the flusher (shared with its tasks).
#[derive(Debug)]
pub(crate) struct Frontiers {
    d: Dialect,
    pool: Pool,
    names: Names,
    busy_budget: Option<Duration>,
    pending: Mutex<HashMap<(String, String), Pending>>,
}

/// The statuses of a settled delivery row.
pub(super) const TERMINAL: &str = "('acked', 'rejected')";

impl Frontiers {
    pub(crate) fn new(d: Dialect, pool: Pool, names: Names, busy_budget: Option<Duration>) -> Self {
        Frontiers { d, pool, names, busy_budget, pending: Mutex::new(HashMap::new()) }
    }

    pub(crate) fn be(&self) -> &'static str {
        self.d.name()
    }

    pub(crate) fn busy_budget(&self) -> Option<Duration> {
        self.busy_budget
    }

    fn stmt(&self) -> Stmt {
        Stmt::new(self.d)
    }

    /// Notes that `parts` of a group have newly settled positions: a flush
    /// task writes their frontiers within [`FLUSH_EVERY`] (one is started
    /// when none runs for the group).
    pub(crate) fn note(self: &Arc<Self>, stream: &str, group: &str, parts: impl IntoIterator<Item = u32>) {
        let start = {
            let mut pending = self.pending.lock();
            let p = pending.entry((stream.to_owned(), group.to_owned())).or_default();
            p.parts.extend(parts);
            let start = !p.running && !p.parts.is_empty();
            p.running |= start;
            start
        };
        if start {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(self.clone().run(stream.to_owned(), group.to_owned()));
                }
                // No runtime (a handle used after its runtime ended): the
                // next derivation still finds the frontier.
                Err(_) => {
                    self.pending.lock().remove(&(stream.to_owned(), group.to_owned()));
                }
            }
        }
    }

    /// The flush task of one group: flushes what was noted, every
    /// [`FLUSH_EVERY`], until nothing is.
    async fn run(self: Arc<Self>, stream: String, group: String) {
        let key = (stream, group);
        let mut wait = FLUSH_EVERY;
        loop {
            tokio::time::sleep(wait).await;
            let parts = {
                let mut pending = self.pending.lock();
                let Some(p) = pending.get_mut(&key) else { return };
                if p.parts.is_empty() {
                    pending.remove(&key);
                    return;
                }
                std::mem::take(&mut p.parts)
            };
            wait = FLUSH_EVERY;
            match self.flush(&key.0, &key.1, &parts).await {
                Ok(()) => {}
                Err(Error::GroupNotFound { .. } | Error::StreamNotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(stream = %key.0, group = %key.1, error = %e, "writing frontiers failed; retrying");
                    self.pending.lock().entry(key.clone()).or_default().parts.extend(parts);
                    wait = FLUSH_RETRY;
                }
            }
        }
    }

    /// Moves and writes the frontiers of `parts` now, and deletes claims
    /// of them with nothing open.
    pub(crate) async fn flush(&self, stream: &str, group: &str, parts: &BTreeSet<u32>) -> Result<()> {
        super::retry_tx!(self, "frontier", self.flush_tx(stream, group, parts).await)
    }

    async fn flush_tx(&self, stream: &str, group: &str, parts: &BTreeSet<u32>) -> TxResult<()> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let (mut frontiers, cursors) = self.lock_group(&mut tx, stream, group).await?;
        self.advance(&mut tx, stream, group, &mut frontiers, &cursors, parts).await?;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let arr = s.text(Value::from(parts.iter().copied().collect::<Vec<_>>()).to_string());
        let list = match self.d {
            Dialect::Postgres => format!("(SELECT jsonb_array_elements_text({arr}::jsonb)::int)"),
            Dialect::Sqlite => format!("(SELECT CAST(value AS INTEGER) FROM json_each({arr}))"),
        };
        s.push(&format!(
            "DELETE FROM {} AS k WHERE k.stream = {st} AND k.group_name = {gr} AND k.partition IN {list} AND {}",
            self.names.claims(),
            super::claims::all_set("k")
        ));
        tx.exec(&s).await.map_err(safe)?;
        tx.commit().await.map_err(at_commit)?;
        Ok(())
    }

    /// Locks the group row in a transaction; returns (frontiers, cursors).
    pub(super) async fn lock_group(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
    ) -> TxResult<(BTreeMap<u32, u64>, BTreeMap<u32, u64>)> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        s.push(&format!(
            "SELECT {}, {} FROM {} WHERE stream = {st} AND name = {gr}{}",
            self.d.json_out("frontiers"),
            self.d.json_out("cursors"),
            self.names.groups(),
            if self.d == Dialect::Postgres { " FOR UPDATE" } else { "" }
        ));
        let rows = tx.all(&s).await.map_err(safe)?;
        let r = rows.first().ok_or_else(|| Error::group_not_found(stream, group))?;
        Ok((parse_map(stream, group, "frontiers", &r.text(0)?)?, parse_map(stream, group, "cursors", &r.text(1)?)?))
    }

    pub(super) async fn write_maps(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
        frontiers: Option<&BTreeMap<u32, u64>>,
        cursors: Option<&BTreeMap<u32, u64>>,
    ) -> TxResult<()> {
        let mut s = self.stmt();
        let mut sets = Vec::new();
        if let Some(f) = frontiers {
            let ph = s.text(map_text(f));
            sets.push(format!("frontiers = {}", self.d.json_in(&ph)));
        }
        if let Some(c) = cursors {
            let ph = s.text(map_text(c));
            sets.push(format!("cursors = {}", self.d.json_in(&ph)));
        }
        if sets.is_empty() {
            return Ok(());
        }
        let (st, gr) = sg(&mut s, stream, group);
        s.push(&format!("UPDATE {} SET {} WHERE stream = {st} AND name = {gr}", self.names.groups(), sets.join(", ")));
        tx.exec(&s).await.map_err(safe)?;
        Ok(())
    }

    /// Moves the frontier of `parts` as far as what is settled allows
    /// (under the group lock the caller holds), and writes it when it moved.
    pub(super) async fn advance(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
        frontiers: &mut BTreeMap<u32, u64>,
        cursors: &BTreeMap<u32, u64>,
        parts: &BTreeSet<u32>,
    ) -> TxResult<()> {
        if parts.is_empty() {
            return Ok(());
        }
        let mut s = self.stmt();
        let select = self.advance_select(&mut s, stream, group, frontiers, cursors, parts);
        s.push(&select);
        let rows = tx.all(&s).await.map_err(safe)?;
        let moved = apply_advance(&rows, frontiers, cursors)?;
        if moved {
            self.write_maps(tx, stream, group, Some(frontiers), None).await?;
        }
        Ok(())
    }

    /// The frontiers of `parts` derived now, without a lock or a write
    /// (`lag`, `group_info`): the stored ones moved as far as what is
    /// settled allows.
    pub(super) async fn derive(
        &self,
        stream: &str,
        group: &str,
        frontiers: &mut BTreeMap<u32, u64>,
        cursors: &BTreeMap<u32, u64>,
        parts: &BTreeSet<u32>,
    ) -> Result<()> {
        if parts.is_empty() {
            return Ok(());
        }
        let mut s = self.stmt();
        let select = self.advance_select(&mut s, stream, group, frontiers, cursors, parts);
        s.push(&select);
        let rows =
            self.pool.all(&s).await.map_err(|e| super::db::map_err(self.be(), "lag", super::db::Phase::Safe, e))?;
        apply_advance(&rows, frontiers, cursors)?;
        Ok(())
    }

    /// The SELECT of a frontier advance over `parts`: per partition, the
    /// first unsettled row above F, the first position at or after the
    /// cursor without a row (rows there exist only after a replay moved
    /// the cursor back, or a skip ahead of it), and the first open
    /// position of a claim. Positions without a row or an open claim below
    /// the cursor are settled (acked in a claim, or before the group's
    /// start). Each subquery walks an index in order and stops early. (Row
    /// tests are scalar subqueries, not `EXISTS`: PostgreSQL may run an
    /// `EXISTS` as one hashed pass over the group's every row.)
    fn advance_select(
        &self,
        s: &mut Stmt,
        stream: &str,
        group: &str,
        frontiers: &BTreeMap<u32, u64>,
        cursors: &BTreeMap<u32, u64>,
        parts: &BTreeSet<u32>,
    ) -> String {
        let (st, gr) = sg(s, stream, group);
        let rows: Vec<Value> = parts
            .iter()
            .map(|&p| {
                let (f, c) = fc(frontiers, cursors, p);
                Value::from(vec![
                    Value::from(p),
                    Value::from(f.min(i64::MAX as u64)),
                    Value::from(c.min(i64::MAX as u64)),
                ])
            })
            .collect();
        let arr = s.text(Value::from(rows).to_string());
        let (p, f, c) = (self.d.as_int("x.c0"), self.d.as_int("x.c1"), self.d.as_int("x.c2"));
        let same = |a: &str| format!("{a}.stream = {st} AND {a}.group_name = {gr} AND {a}.partition = {p}");
        format!(
            "SELECT {p}, (SELECT min(d.sequence) FROM {t} d WHERE {sd} AND d.sequence > {f} \
             AND d.status NOT IN {TERMINAL}), \
             CASE WHEN (SELECT d.sequence FROM {t} d WHERE {sd} AND d.sequence = {c} LIMIT 1) IS NULL THEN {c} \
             ELSE (SELECT d.sequence + 1 FROM {t} d WHERE {sd} AND d.sequence >= {c} AND \
               (SELECT n.sequence FROM {t} n WHERE n.stream = d.stream AND n.group_name = d.group_name \
                AND n.partition = d.partition AND n.sequence = d.sequence + 1 LIMIT 1) IS NULL \
               ORDER BY d.partition, d.sequence LIMIT 1) END, \
             (SELECT {words} FROM {k} k WHERE {sk} AND NOT ({full}) ORDER BY k.first_seq LIMIT 1) \
             FROM {rows} AS x",
            sd = same("d"),
            sk = same("k"),
            t = self.names.deliveries(),
            k = self.names.claims(),
            full = super::claims::all_set("k"),
            words =
                (0..super::claims::WORDS).fold("k.first_seq".to_owned(), |acc, i| format!("{acc} || ':' || k.w{i}")),
            rows = self.d.json_rows(&arr, 3)
        )
    }
}

/// The first open position of a claim written `first:w0:…:w7`.
fn first_open_of(text: &str) -> Result<Option<u64>> {
    let bad = || Error::failed("reading a claim", format!("{text:?} is not first_seq:w0:…:w7"));
    let mut parts = text.split(':');
    let first: u64 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let mut words = [super::claims::FULL; super::claims::WORDS];
    for w in &mut words {
        *w = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    }
    Ok(super::claims::first_open(first, &words))
}

/// Applies the rows of `advance_select`; true when a frontier moved.
fn apply_advance(
    rows: &[super::db::Row],
    frontiers: &mut BTreeMap<u32, u64>,
    cursors: &BTreeMap<u32, u64>,
) -> Result<bool> {
    let mut moved = false;
    for r in rows {
        let p = r.u32(0)?;
        let (f, c) = fc(frontiers, cursors, p);
        let gap = r.opt_i64(2)?.and_then(|n| u64::try_from(n).ok()).unwrap_or(c);
        let row = r.opt_i64(1)?.and_then(|n| u64::try_from(n).ok()).unwrap_or(u64::MAX);
        let claim = match r.opt_text(3)? {
            Some(t) => first_open_of(&t)?.unwrap_or(u64::MAX),
            None => u64::MAX,
        };
        let first = gap.min(row).min(claim);
        let new = f.max(first.saturating_sub(1));
        if new != f {
            frontiers.insert(p, new);
            moved = true;
        }
    }
    Ok(moved)
}
