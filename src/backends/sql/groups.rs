//! Consumer groups on SQL: the reference's `rheo_groups` (cursors and
//! frontiers as JSON maps keyed by decimal partition) and
//! `rheo_deliveries` (one row per materialized delivery), driven by the
//! crate's group rules (ADR 0013 lists where this differs from the
//! reference, compatibly).
//!
//! Invariants: per partition, every sequence of `[start, cursor)` has a
//! delivery row, except those the group settled by starting past them; a
//! missing row below the cursor is settled. The frontier F is the largest
//! n such that nothing in `(F, n]` is unsettled, so
//! `F' = min(first unsettled row above F, cursor) - 1`.
//!
//! Locks: a transaction that changes the group row (materialize, reject,
//! skip, replay, reset) locks it first (`FOR UPDATE`), then touches
//! deliveries; an ack locks its own delivery rows first and the group row
//! after, for the frontier move alone (a deadlock with a replay is
//! detected by the database and retried); claims and renewals lock only
//! delivery rows (claims skip locked ones).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::claims::{Candidate, Split, claim_base, claim_lease, partition_base, walk_candidates, walk_sql};
use super::db::{Phase, Row, Stmt, Tx};
use super::dialect::Dialect;
use super::streams::{EVENT_COLS, decode_event, event_cols, lease_rows, seq_arg};
use super::{ClaimsMode, GroupScope, Now, SqlBackend, TxResult, at_commit, safe};

/// Groups whose partitions a handle remembers for its fetches.
const GROUP_SCOPES_MAX: usize = 4096;
use crate::error::{Error, ObjectKind, Result};
use crate::groups::rules;
use crate::model::group::{DeadLetter, FetchOptions, GroupSummary, check_partitions};
use crate::model::lease::{FetchReport, Lease, LeaseId, LeaseRef};
use crate::model::time::Timestamp;

/// Spent deliveries one fetch dead-letters at most, beyond its limit.
const SPENT_PER_FETCH: usize = crate::groups::SPENT_PER_FETCH;

/// Rust-only group settings, kept in `rheo_rs_group_settings`.
type Settings = crate::backends::common::GroupSettings;

use crate::backends::common::{self, GroupRow, frontier_cursor as fc};
use crate::backends::group_store::{
    self, ClaimSpec, DeadLetterAt, DeliveryCounts, GroupStore, Held, MaterializedFetch, NewGroup, SettleStore, Taken,
};

use super::db::{map_text, parse_map, sg};
use super::frontier::TERMINAL;

/// A claimed lease of a settle call: its index in the call and
/// (partition, sequence, claim base).
type ClaimedLease = (usize, (u32, u64, i64));

/// The leases `idx` of `leases` by kind: claimed ones, and the indexes of
/// row leases.
fn split_by_kind(leases: &[LeaseRef], idx: &[usize]) -> (Vec<ClaimedLease>, Vec<usize>) {
    let mut claimed = Vec::new();
    let mut rows = Vec::new();
    for &i in idx {
        let l = &leases[i];
        match claim_base(l.lease_id, l.sequence) {
            Some(b) => claimed.push((i, (l.partition, l.sequence, b))),
            None => rows.push(i),
        }
    }
    (claimed, rows)
}

/// The partition/sequence/lease fence of a delivery row `d` against
/// `json_rows` alias `x` (`c0` partition, `c1` sequence, `c2` lease id).
fn fence(d: Dialect, a: &str) -> String {
    format!(
        "{a}.partition = {} AND {a}.sequence = {} AND {a}.lease_id = x.c2 AND {a}.status = 'leased'",
        d.as_int("x.c0"),
        d.as_int("x.c1")
    )
}

impl SqlBackend {
    /// `FROM … WHERE …` of an update of the delivery rows `d` that leases
    /// in the JSON rows `arr` (partition, sequence, lease id) still hold.
    ///
    /// On PostgreSQL each lease is looked up by its own probe of the
    /// frontier index and locked (the fence re-checked on the row's latest
    /// version), and the update joins on the locked rows' ctids. A plain
    /// join lets a planner without statistics (a table minutes old) hash
    /// the group's every row, and a probe without the `ORDER BY` may take
    /// the claim index and filter every leased row: both grow with the
    /// table. SQLite's planner probes the index per JSON row by itself.
    fn fenced(&self, st: &str, gr: &str, arr: &str) -> String {
        let rows = self.d.json_rows(arr, 3);
        match self.d {
            Dialect::Postgres => format!(
                "FROM (SELECT y.tid FROM {rows} AS x CROSS JOIN LATERAL (SELECT d0.ctid AS tid FROM {dl} d0 \
                 WHERE d0.stream = {st} AND d0.group_name = {gr} AND {fence} \
                 ORDER BY d0.partition, d0.sequence LIMIT 1 FOR UPDATE OF d0) y) AS k \
                 WHERE d.ctid = k.tid",
                dl = self.names.deliveries(),
                fence = fence(self.d, "d0"),
            ),
            Dialect::Sqlite => {
                format!("FROM {rows} AS x WHERE d.stream = {st} AND d.group_name = {gr} AND {}", fence(self.d, "d"))
            }
        }
    }
}

impl SqlBackend {
    pub(super) fn insert_ignore(&self) -> (&'static str, &'static str) {
        match self.d {
            Dialect::Postgres => ("INSERT INTO", "ON CONFLICT DO NOTHING"),
            Dialect::Sqlite => ("INSERT OR IGNORE INTO", ""),
        }
    }

    /// Writes a group's Rust-only settings (`rheo_rs_group_settings`).
    pub(super) async fn write_settings(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
        settings: &Settings,
        operation: &'static str,
    ) -> TxResult<()> {
        let js = serde_json::to_string(settings).map_err(|e| Error::failed(operation, e.to_string()))?;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let ph = s.text(js);
        s.push(&format!(
            "INSERT INTO {} (stream, name, settings) VALUES ({st}, {gr}, {}) \
             ON CONFLICT (stream, name) DO UPDATE SET settings = excluded.settings",
            self.names.settings(),
            self.d.json_in(&ph)
        ));
        tx.exec(&s).await.map_err(safe)?;
        Ok(())
    }

    /// Gives dead letters their order (`rheo_rs_dead_letter_order`),
    /// after every earlier one of the group, in the order given.
    async fn mark_dead(&self, tx: &mut Tx, stream: &str, group: &str, positions: &[(u32, u64)]) -> TxResult<()> {
        if positions.is_empty() {
            return Ok(());
        }
        let rows: Vec<Value> = positions
            .iter()
            .enumerate()
            .map(|(i, &(p, q))| Value::from(vec![Value::from(p), Value::from(q), Value::from(i + 1)]))
            .collect();
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let arr = s.text(Value::from(rows).to_string());
        s.push(&format!(
            "INSERT INTO {t} (stream, group_name, partition, sequence, mark) \
             SELECT {st}, {gr}, {p}, {q}, COALESCE((SELECT max(o.mark) FROM {t} o WHERE o.stream = {st} AND o.group_name = {gr}), 0) + {i} \
             FROM {rows} AS x WHERE true \
             ON CONFLICT (stream, group_name, partition, sequence) DO UPDATE SET mark = excluded.mark",
            t = self.names.dl_order(),
            p = self.d.as_int("x.c0"),
            q = self.d.as_int("x.c1"),
            i = self.d.as_int("x.c2"),
            rows = self.d.json_rows(&arr, 3)
        ));
        tx.exec(&s).await.map_err(safe)?;
        Ok(())
    }

    /// Forgets the dead-letter order of positions reopened or reset.
    async fn unmark(&self, tx: &mut Tx, stream: &str, group: &str, partition: u32, above: u64) -> TxResult<()> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let p = s.int(i64::from(partition));
        let a = s.int(seq_arg(above));
        s.push(&format!(
            "DELETE FROM {} WHERE stream = {st} AND group_name = {gr} AND partition = {p} AND sequence > {a}",
            self.names.dl_order()
        ));
        tx.exec(&s).await.map_err(safe)?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn create_group_tx(
        &self,
        stream: &str,
        group: &str,
        max_attempts: u32,
        frontiers: &BTreeMap<u32, u64>,
        cursors: &BTreeMap<u32, u64>,
        settings: &Settings,
        now: Now,
    ) -> TxResult<Timestamp> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let c = s.text(map_text(cursors));
        let f = s.text(map_text(frontiers));
        let m = s.int(i64::from(max_attempts));
        let at = self.now_sql(&mut s, now);
        s.push(&format!(
            "INSERT INTO {} (stream, name, cursors, frontiers, max_attempts, created_at) \
             VALUES ({st}, {gr}, {}, {}, {m}, {at}) ON CONFLICT (stream, name) DO NOTHING RETURNING {}",
            self.names.groups(),
            self.d.json_in(&c),
            self.d.json_in(&f),
            self.d.ts_out("created_at")
        ));
        let rows = tx.all(&s).await.map_err(safe)?;
        let Some(r) = rows.first() else {
            return Err(Error::AlreadyExists { kind: ObjectKind::Group, name: format!("{stream}/{group}") }.into());
        };
        let created = r.ts(0)?;
        self.write_settings(&mut tx, stream, group, settings, "create_group").await?;
        // Deliveries of an earlier group of that name (deleted by hand) would
        // be taken for this one's.
        for t in [self.names.deliveries(), self.names.dl_order(), self.names.claims()] {
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            s.push(&format!("DELETE FROM {t} WHERE stream = {st} AND group_name = {gr}"));
            tx.exec(&s).await.map_err(safe)?;
        }
        tx.commit().await.map_err(at_commit)?;
        Ok(created)
    }

    pub(super) async fn list_groups_impl(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        self.partition_count(stream).await?;
        let mut s = self.stmt();
        let st = s.text(stream);
        s.push(&format!(
            "SELECT g.name, g.max_attempts, {}, {} FROM {} g LEFT JOIN {} x ON x.stream = g.stream AND x.name = g.name \
             WHERE g.stream = {st}",
            self.d.ts_out("g.created_at"),
            self.d.json_out("x.settings"),
            self.names.groups(),
            self.names.settings()
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("list_groups", Phase::Safe))?;
        let mut out = rows
            .iter()
            .map(|r| {
                let settings: Settings = match r.opt_text(3)? {
                    Some(t) => serde_json::from_str(&t).unwrap_or_default(),
                    None => Settings::default(),
                };
                Ok(GroupSummary {
                    name: r.text(0)?,
                    max_attempts: r.u32(1)?,
                    created_at: r.ts(2)?,
                    ordered_by_key: settings.ordered_by_key,
                    partitions: settings.partitions,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    // ---- fetch ----

    pub(super) async fn fetch_impl(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<FetchReport> {
        if self.claims_mode == ClaimsMode::Rows {
            return group_store::fetch_materialized(self, stream, group, opts).await;
        }
        let scope = self.fetch_scope(stream, group, opts.partitions.as_deref()).await?;
        if scope.is_empty() {
            return Ok(FetchReport::default());
        }
        let consumer = opts.consumer_id.as_deref().unwrap_or_default();
        // max_attempts: the claim reads the group's own.
        let spec = ClaimSpec {
            stream,
            group,
            scope: &scope,
            max_attempts: 0,
            consumer,
            lease: opts.lease,
            ordered_by_key: false,
        };
        let limit = opts.limit;
        // Lease ids of delivery rows, made only when a claim meets rows.
        let lease_ids =
            || -> Vec<LeaseId> { (0..limit).map(|_| LeaseId::from_u128(crate::ids::new_lease_id())).collect() };
        let tx = || async { self.claim_ranges_tx(&spec, limit, &lease_ids()).await };
        let claimed = match self.d {
            Dialect::Postgres => {
                let mut one = super::retry_tx!(self, "fetch", self.claim_fresh_pg(&spec, limit).await)?;
                if one.flags.found && one.flags.rows && !one.flags.slow {
                    let ids = lease_ids();
                    one = super::retry_tx!(self, "fetch", self.claim_ranges_pg(&spec, limit, &ids).await)?;
                }
                if one.flags.found && one.flags.slow { super::retry_tx!(self, "fetch", tx().await)? } else { one }
            }
            Dialect::Sqlite => super::retry_tx!(self, "fetch", tx().await)?,
        };
        if !claimed.flags.found {
            self.group_scopes.write().remove(&(stream.to_owned(), group.to_owned()));
            self.load_group(stream, group).await?;
            return Err(Error::group_not_found(stream, group));
        }
        let (mut leases, spent) = self.leases_of(stream, group, consumer, &claimed.rows, claimed.base)?;
        leases.sort_by_key(|l| (l.event.partition(), l.event.sequence()));
        group_store::order_spent(self, stream, group, spent).await;
        Ok(FetchReport { leases, scheduled: claimed.parked, ..FetchReport::default() })
    }

    /// The partitions a fetch claims from: the group's (cached: a group's
    /// partitions never change) within those asked for.
    async fn fetch_scope(&self, stream: &str, group: &str, requested: Option<&[u32]>) -> Result<Vec<u32>> {
        let key = (stream.to_owned(), group.to_owned());
        let cached = self.group_scopes.read().get(&key).cloned();
        let gs = match cached {
            Some(gs) => gs,
            None => {
                let g = self.load_group(stream, group).await?;
                let gs = GroupScope { count: g.count, partitions: g.settings.partitions.clone() };
                let mut scopes = self.group_scopes.write();
                // Bounded: a handle that fetched from more groups forgets them all.
                if scopes.len() >= GROUP_SCOPES_MAX {
                    scopes.clear();
                }
                scopes.insert(key, gs.clone());
                gs
            }
        };
        if let Some(r) = requested {
            check_partitions(stream, r, gs.count)?;
        }
        let all: Vec<u32> = gs.partitions.clone().unwrap_or_else(|| (0..gs.count).collect());
        Ok(all.into_iter().filter(|p| requested.is_none_or(|r| r.contains(p))).collect())
    }

    /// The leases and spent positions of a claim's rows (`base`: the claim
    /// base of the range claims among them).
    fn leases_of(&self, stream: &str, group: &str, consumer: &str, rows: &[Row], base: i64) -> Result<Taken> {
        let name: Arc<str> = Arc::from(stream);
        let group_name: Arc<str> = Arc::from(group);
        let consumer: Arc<str> = Arc::from(consumer);
        let mut leases = Vec::with_capacity(rows.len());
        let mut spent = Vec::new();
        for r in rows {
            let (p, q) = (r.u32(1)?, r.u64(2)?);
            let kind = r.i64(0)?;
            if kind == 1 {
                spent.push((p, q));
                continue;
            }
            if r.opt_text(6)?.is_none() {
                tracing::warn!(stream, group, partition = p, sequence = q, "a claimed delivery has no event row");
                continue;
            }
            let lease_id = if kind == 2 { claim_lease(partition_base(base, p), q) } else { r.text(3)?.parse()? };
            leases.push(Lease {
                lease_id,
                receipt: None,
                group: group_name.clone(),
                consumer_id: consumer.clone(),
                attempt: r.u32(4)?,
                expires_at: r.ts(5)?,
                event: decode_event(&name, r, 6)?,
            });
        }
        Ok((leases, spent))
    }

    /// Adds delivery rows for the next `chunk` events of each partition of
    /// `parts` at or after its cursor, and moves the cursors past them.
    /// Events scheduled after now get parked rows (`schedule.rs`), at most
    /// `budget` shared by the partitions (an even share of what is left,
    /// at least one each); past its share a partition's chunk ends before
    /// the next one. Returns how many it parked.
    async fn materialize_tx(
        &self,
        stream: &str,
        group: &str,
        parts: &[u32],
        chunk: u64,
        budget: usize,
    ) -> TxResult<u64> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let now = self.now();
        let (frontiers, mut cursors) = self.frontier.lock_group(&mut tx, stream, group).await?;
        let mut s = self.stmt();
        let st = s.text(stream);
        s.push(&format!("SELECT partition, next_sequence FROM {} WHERE stream = {st}", self.names.seqs()));
        let hws: HashMap<u32, u64> =
            tx.all(&s).await.map_err(safe)?.iter().map(|r| Ok((r.u32(0)?, r.u64(1)?))).collect::<Result<_>>()?;
        let mut ranges = Vec::new();
        let mut spans = Vec::new();
        let mut park_left = budget;
        for (i, &p) in parts.iter().enumerate() {
            let (f, c) = fc(&frontiers, &cursors, p);
            let hw = hws.get(&p).copied().unwrap_or(0);
            if c <= hw {
                let mut hi = hw.min(c.saturating_add(chunk - 1));
                let share = crate::groups::park_share(park_left, parts.len() - i);
                let later = self.scheduled_ahead(&mut tx, stream, p, (c, hi), now, share + 1).await?;
                if later.len() > share {
                    hi = later[share].saturating_sub(1);
                }
                park_left = park_left.saturating_sub(later.len().min(share));
                ranges.push(Value::from(vec![Value::from(p), Value::from(c), Value::from(hi)]));
                spans.push((p, c, hi));
                cursors.insert(p, hi.saturating_add(1));
            } else {
                cursors.entry(p).or_insert_with(|| f.saturating_add(1));
            }
        }
        if ranges.is_empty() {
            return Ok(0);
        }
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let arr = s.text(Value::from(ranges).to_string());
        let at = self.now_sql(&mut s, now);
        let (ins, ignore) = self.insert_ignore();
        // A range scan of the events index per partition: LATERAL on
        // PostgreSQL, whose planner would otherwise hash-join the whole
        // table when it misjudges the JSON rows; SQLite only loops.
        let cond = format!(
            "e.stream = {st} AND e.partition = {} AND e.sequence >= {} AND e.sequence <= {}",
            self.d.as_int("x.c0"),
            self.d.as_int("x.c1"),
            self.d.as_int("x.c2")
        );
        let join = match self.d {
            Dialect::Postgres => {
                format!(
                    "CROSS JOIN LATERAL (SELECT e.id, e.partition, e.sequence FROM {} e WHERE {cond} OFFSET 0) e",
                    self.names.events()
                )
            }
            Dialect::Sqlite => format!("CROSS JOIN {} e ON {cond}", self.names.events()),
        };
        s.push(&format!(
            "{ins} {} (stream, group_name, event_id, partition, sequence, status, attempt, created_at) \
             SELECT {st}, {gr}, e.id, e.partition, e.sequence, 'available', 0, {at} FROM {} AS x {join} {ignore}",
            self.names.deliveries(),
            self.d.json_rows(&arr, 3),
        ));
        tx.exec(&s).await.map_err(safe)?;
        let parked = self.park_available(&mut tx, (stream, group), &spans, now).await?;
        self.frontier.write_maps(&mut tx, stream, group, None, Some(&cursors)).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(parked)
    }

    /// The SET clause of a claim, given the SQL of "this row is spent" and
    /// of its new lease id.
    pub(super) fn claim_set(
        &self,
        s: &mut Stmt,
        spent: &str,
        lease: &str,
        consumer: &str,
        lease_for: Duration,
    ) -> String {
        let now = self.now();
        let at = self.now_sql(s, now);
        let exp = self.later_sql(s, now, lease_for);
        let cons = s.text(consumer);
        let why = s.text(rules::EXPIRED_ON_LAST_ATTEMPT);
        format!(
            "status = CASE WHEN {spent} THEN 'rejected' ELSE 'leased' END, \
             lease_id = CASE WHEN {spent} THEN NULL ELSE {lease} END, \
             consumer_id = CASE WHEN {spent} THEN d.consumer_id ELSE {cons} END, \
             leased_at = CASE WHEN {spent} THEN d.leased_at ELSE {at} END, \
             expires_at = CASE WHEN {spent} THEN NULL ELSE {exp} END, \
             attempt = CASE WHEN {spent} THEN d.attempt ELSE d.attempt + 1 END, \
             reason = CASE WHEN {spent} THEN {why} ELSE d.reason END, \
             dead_lettered_at = CASE WHEN {spent} THEN {at} ELSE d.dead_lettered_at END"
        )
    }

    /// The claimable predicate on delivery rows `d` at `now`.
    pub(super) fn claimable(&self, s: &mut Stmt) -> String {
        let now = self.now();
        let at = self.now_sql(s, now);
        format!(
            "(d.status = 'available' OR (d.status = 'leased' AND d.expires_at IS NOT NULL AND d.expires_at <= {at}))"
        )
    }

    /// The one-statement claim: candidates per partition bounded below by
    /// the frontier, locked with `SKIP LOCKED`, leased (or dead-lettered
    /// when spent) and returned with their events.
    async fn claim_pg(&self, spec: &ClaimSpec<'_>, limit: usize, lease_ids: &[LeaseId]) -> TxResult<Vec<Row>> {
        let ClaimSpec { stream, group, scope, consumer, lease: lease_for, .. } = *spec;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let parts = s.text(Value::from(scope.to_vec()).to_string());
        let per = s.int(i64::try_from(limit + SPENT_PER_FETCH).unwrap_or(i64::MAX));
        let lim = s.int(i64::try_from(limit).unwrap_or(i64::MAX));
        let ids = s.text(Value::from(lease_ids.iter().map(ToString::to_string).collect::<Vec<_>>()).to_string());
        let claimable = self.claimable(&mut s);
        let set =
            self.claim_set(&mut s, "pick.spent", &format!("({ids}::jsonb ->> pick.rn::int)"), consumer, lease_for);
        s.push(&format!(
            "WITH f AS (SELECT x.p, COALESCE((g.frontiers ->> x.p::text)::bigint, 0) AS fr, g.max_attempts AS ma \
               FROM {groups} g, (SELECT jsonb_array_elements_text({parts}::jsonb)::int AS p) x \
               WHERE g.stream = {st} AND g.name = {gr}), \
             c AS (SELECT y.tid, y.partition, y.sequence, y.event_id, \
                 (y.status = 'leased' AND y.lease_id IS NOT NULL AND y.attempt >= f.ma) AS spent \
               FROM f CROSS JOIN LATERAL (SELECT d.ctid AS tid, d.partition, d.sequence, d.event_id, d.status, \
                   d.lease_id, d.attempt FROM {dl} d \
                 WHERE d.stream = {st} AND d.group_name = {gr} AND d.partition = f.p AND d.sequence > f.fr \
                   AND {claimable} ORDER BY d.sequence LIMIT {per} FOR UPDATE SKIP LOCKED) y), \
             {walk}, \
             pick AS (SELECT * FROM w2 WHERE w2.rn < {lim} AND (NOT w2.spent OR w2.spent_n <= {spent_max}) \
               AND (w2.stop IS NULL OR w2.sequence < w2.stop) LIMIT {lim} + {spent_max}) \
             UPDATE {dl} d SET {set} FROM pick LEFT JOIN LATERAL \
               (SELECT * FROM {ev} e1 WHERE e1.id = pick.event_id LIMIT 1) e ON true \
             WHERE d.ctid = pick.tid \
             RETURNING pick.spent::int, d.partition, d.sequence, d.lease_id, d.attempt, {exp}, {cols}",
            groups = self.names.groups(),
            dl = self.names.deliveries(),
            ev = self.names.events(),
            spent_max = limit + SPENT_PER_FETCH,
            walk = walk_sql("c", "partition", "sequence", limit + SPENT_PER_FETCH),
            exp = self.d.ts_out("d.expires_at"),
            cols = event_cols(self.d, "e"),
        ));
        debug_assert_eq!(EVENT_COLS, 8);
        // One statement, so no transaction around it: a connection lost
        // while it runs leaves the outcome unknown (Ambiguous).
        self.pool.all(&s).await.map_err(at_commit)
    }

    /// The SQLite claim, inside one `BEGIN IMMEDIATE`: candidates per
    /// partition, then one update and one read of their events.
    async fn claim_lite(&self, spec: &ClaimSpec<'_>, limit: usize, lease_ids: &[LeaseId]) -> TxResult<Vec<Row>> {
        let ClaimSpec { stream, group, scope, consumer, lease: lease_for, .. } = *spec;
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        s.push(&format!(
            "SELECT {}, max_attempts FROM {} WHERE stream = {st} AND name = {gr}",
            self.d.json_out("frontiers"),
            self.names.groups()
        ));
        let rows = tx.all(&s).await.map_err(safe)?;
        let row = rows.first().ok_or_else(|| Error::group_not_found(stream, group))?;
        let frontiers = parse_map(stream, group, "frontiers", &row.text(0)?)?;
        let max_attempts = row.i64(1)?;
        let mut cands: Vec<Candidate> = Vec::new();
        for &p in scope {
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let part = s.int(i64::from(p));
            let f = s.int(seq_arg(frontiers.get(&p).copied().unwrap_or(0)));
            let ma = s.int(max_attempts);
            let per = s.int(i64::try_from(limit + SPENT_PER_FETCH).unwrap_or(i64::MAX));
            let claimable = self.claimable(&mut s);
            s.push(&format!(
                "SELECT d.rowid, d.partition, d.sequence, \
                 (d.status = 'leased' AND d.lease_id IS NOT NULL AND d.attempt >= {ma}) FROM {} d \
                 WHERE d.stream = {st} AND d.group_name = {gr} AND d.partition = {part} AND d.sequence > {f} \
                 AND {claimable} ORDER BY d.sequence LIMIT {per}",
                self.names.deliveries()
            ));
            for r in tx.all(&s).await.map_err(safe)? {
                cands.push((r.u32(1)?, r.u64(2)?, Some(r.i64(0)?.to_string()), r.i64(3)? == 1));
            }
        }
        cands.sort_by_key(|c| (c.0, c.1));
        let (picks, _) = walk_candidates(cands, limit, limit + SPENT_PER_FETCH, lease_ids);
        if picks.is_empty() {
            return Ok(Vec::new());
        }
        let mut s = self.stmt();
        let arr = s.text(Value::from(picks).to_string());
        let set = self.claim_set(&mut s, "(x.c2 = '1')", "x.c1", consumer, lease_for);
        s.push(&format!(
            "UPDATE {dl} AS d SET {set} FROM {rows} AS x WHERE d.rowid = {rid} \
             RETURNING status = 'rejected', partition, sequence, lease_id, attempt, expires_at, event_id",
            dl = self.names.deliveries(),
            rows = self.d.json_rows(&arr, 3),
            rid = self.d.as_int("x.c0"),
        ));
        let updated = tx.all(&s).await.map_err(safe)?;
        // Their events, in one read, returned in the claim's column layout.
        let keys: Vec<Value> = updated.iter().map(|r| self.claimed_key(r)).collect::<Result<_>>()?;
        let mut s = self.stmt();
        let arr = s.text(Value::from(keys).to_string());
        s.push(&format!(
            "SELECT CAST(x.c0 AS INTEGER), CAST(x.c1 AS INTEGER), CAST(x.c2 AS INTEGER), x.c3, CAST(x.c4 AS INTEGER), x.c5, {cols} \
             FROM {rows} AS x LEFT JOIN {ev} e ON e.id = x.c6",
            cols = event_cols(self.d, "e"),
            rows = self.d.json_rows(&arr, 7),
            ev = self.names.events(),
        ));
        let out = tx.all(&s).await.map_err(safe)?;
        tx.commit().await.map_err(at_commit)?;
        Ok(out)
    }

    /// After positions were dead-lettered outside a group lock (spent
    /// leases met by a claim): orders them and moves the frontier.
    async fn settled_tx(&self, stream: &str, group: &str, dead: &[(u32, u64)]) -> TxResult<()> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let (mut frontiers, cursors) = self.frontier.lock_group(&mut tx, stream, group).await?;
        self.mark_dead(&mut tx, stream, group, dead).await?;
        let parts: BTreeSet<u32> = dead.iter().map(|d| d.0).collect();
        self.frontier.advance(&mut tx, stream, group, &mut frontiers, &cursors, &parts).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(())
    }

    // ---- settles ----

    pub(super) async fn renew_many_impl(&self, leases: &[LeaseRef], d: Duration) -> Result<Vec<Result<Timestamp>>> {
        group_store::per_group(self, leases, |stream, group, idx| async move {
            let (claimed, mut row_idx) = split_by_kind(leases, &idx);
            let triples: Vec<(u32, u64, i64)> = claimed.iter().map(|&(_, t)| t).collect();
            let mut renewed = self.renew_claimed(&stream, &group, &triples, d).await?;
            // Claimed leases their claims no longer hold may be rows now
            // (a split handed them over): tried as row leases.
            row_idx.extend(claimed.iter().filter(|(_, (p, q, _))| !renewed.contains_key(&(*p, *q))).map(|c| c.0));
            if !row_idx.is_empty() {
                renewed.extend(self.renew_rows(&stream, &group, leases, &row_idx, d).await?);
            }
            Ok(renewed)
        })
        .await
    }

    /// Renews the row leases `idx` of `leases`: the new expiry of each renewed.
    async fn renew_rows(
        &self,
        stream: &str,
        group: &str,
        leases: &[LeaseRef],
        idx: &[usize],
        d: Duration,
    ) -> Result<HashMap<(u32, u64), Timestamp>> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let arr = s.arg(lease_rows(idx.iter().map(|&i| {
            let l = &leases[i];
            (l.partition, l.sequence, l.lease_id.to_string())
        })));
        let now = self.now();
        let at = self.now_sql(&mut s, now);
        let exp = self.later_sql(&mut s, now, d);
        s.push(&format!(
            "UPDATE {dl} AS d SET expires_at = {exp}, renewed_at = {at} \
             {fenced} \
             RETURNING partition, sequence, {out}",
            dl = self.names.deliveries(),
            fenced = self.fenced(&st, &gr, &arr),
            out = self.d.ts_out("expires_at"),
        ));
        let rows = super::retry_tx!(self, "renew", self.pool.all(&s).await.map_err(super::at_commit))?;
        let mut renewed = HashMap::new();
        for r in &rows {
            renewed.insert((r.u32(0)?, r.u64(1)?), r.ts(2)?);
        }
        Ok(renewed)
    }

    pub(super) async fn ack_many_impl(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        group_store::per_group(self, leases, |stream, group, idx| async move {
            let (claimed, mut row_idx) = split_by_kind(leases, &idx);
            let triples: Vec<(u32, u64, i64)> = claimed.iter().map(|&(_, t)| t).collect();
            let mut acked: HashMap<(u32, u64), ()> =
                self.ack_claimed(&stream, &group, &triples).await?.into_iter().map(|k| (k, ())).collect();
            row_idx.extend(claimed.iter().filter(|(_, (p, q, _))| !acked.contains_key(&(*p, *q))).map(|c| c.0));
            if !row_idx.is_empty() {
                let rows: Vec<&LeaseRef> = row_idx.iter().map(|&i| &leases[i]).collect();
                acked.extend(self.ack_rows(&stream, &group, &rows).await?.into_iter().map(|k| (k, ())));
            }
            if !acked.is_empty() {
                self.frontier.note(&stream, &group, acked.keys().map(|a| a.0));
            }
            Ok(acked)
        })
        .await
    }

    /// Acks row leases in one statement; the positions acked. The frontier
    /// moves later (the flusher): an ack never waits for the group row.
    async fn ack_rows(&self, stream: &str, group: &str, leases: &[&LeaseRef]) -> Result<Vec<(u32, u64)>> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let mut rows: Vec<&LeaseRef> = leases.to_vec();
        rows.sort_by_key(|l| (l.partition, l.sequence));
        let arr = s.arg(lease_rows(rows.iter().map(|l| (l.partition, l.sequence, l.lease_id.to_string()))));
        let now = self.now();
        let at = self.now_sql(&mut s, now);
        s.push(&format!(
            "UPDATE {dl} AS d SET status = 'acked', acked_at = {at}, lease_id = NULL, expires_at = NULL \
             {fenced} \
             RETURNING partition, sequence",
            dl = self.names.deliveries(),
            fenced = self.fenced(&st, &gr, &arr),
        ));
        let rows = super::retry_tx!(self, "ack", self.pool.all(&s).await.map_err(super::at_commit))?;
        rows.iter().map(|r| Ok((r.u32(0)?, r.u64(1)?))).collect()
    }

    /// Dead-letters the delivery a lease holds, with `reason`; false when
    /// the lease is stale.
    async fn dead_letter_tx(&self, lease: &LeaseRef, reason: &str, now: Now) -> TxResult<bool> {
        let (stream, group) = (&*lease.stream, &*lease.group);
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let (mut frontiers, cursors) = self.frontier.lock_group(&mut tx, stream, group).await?;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let arr = s.arg(lease_rows(std::iter::once((lease.partition, lease.sequence, lease.lease_id.to_string()))));
        let at = self.now_sql(&mut s, now);
        let why = s.text(reason);
        s.push(&format!(
            "UPDATE {dl} AS d SET status = 'rejected', dead_lettered_at = {at}, reason = {why}, lease_id = NULL, \
             expires_at = NULL {fenced} \
             RETURNING partition",
            dl = self.names.deliveries(),
            fenced = self.fenced(&st, &gr, &arr),
        ));
        if tx.all(&s).await.map_err(safe)?.is_empty() {
            return Ok(false);
        }
        self.mark_dead(&mut tx, stream, group, &[(lease.partition, lease.sequence)]).await?;
        let parts = BTreeSet::from([lease.partition]);
        self.frontier.advance(&mut tx, stream, group, &mut frontiers, &cursors, &parts).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(true)
    }

    async fn skip_tx(&self, stream: &str, group: &str, at: (u32, u64), reason: &str, now: Now) -> TxResult<bool> {
        let (partition, sequence) = at;
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let (mut frontiers, cursors) = self.frontier.lock_group(&mut tx, stream, group).await?;
        // A claimed position becomes an ordinary leased row first.
        self.split_claims(&mut tx, stream, group, &Split::Positions(&[(partition, sequence)])).await?;
        let (f, c) = fc(&frontiers, &cursors, partition);
        let mut s = self.stmt();
        let st = s.text(stream);
        let gr = s.text(group);
        let p = s.int(i64::from(partition));
        let q = s.int(seq_arg(sequence));
        s.push(&format!(
            "SELECT e.id, d.status FROM {ev} e LEFT JOIN {dl} d ON d.stream = e.stream AND d.group_name = {gr} \
             AND d.event_id = e.id WHERE e.stream = {st} AND e.partition = {p} AND e.sequence = {q}",
            ev = self.names.events(),
            dl = self.names.deliveries(),
        ));
        let rows = tx.all(&s).await.map_err(safe)?;
        let r = rows.first().ok_or_else(|| {
            Error::failed(
                "skip",
                format!("stream {stream:?} partition {partition} has no event at sequence {sequence}"),
            )
        })?;
        let event_id = r.text(0)?;
        let status = r.opt_text(1)?;
        if status.as_deref() == Some("rejected") {
            return Ok(false);
        }
        if sequence <= f || status.as_deref() == Some("acked") || (status.is_none() && sequence < c) {
            return Err(common::already_settled(group, partition, sequence).into());
        }
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let id = s.text(event_id);
        let p = s.int(i64::from(partition));
        let q = s.int(seq_arg(sequence));
        let at = self.now_sql(&mut s, now);
        let why = s.text(reason);
        s.push(&format!(
            "INSERT INTO {t} (stream, group_name, event_id, partition, sequence, status, attempt, reason, dead_lettered_at, created_at) \
             VALUES ({st}, {gr}, {id}, {p}, {q}, 'rejected', 0, {why}, {at}, {at}) \
             ON CONFLICT (stream, group_name, event_id) DO UPDATE SET status = 'rejected', lease_id = NULL, \
             expires_at = NULL, reason = excluded.reason, dead_lettered_at = excluded.dead_lettered_at \
             WHERE {t}.status <> 'acked'",
            t = self.names.deliveries()
        ));
        // An ack that committed since the status was read (acks take no
        // group lock) wins: the position is settled.
        if tx.exec(&s).await.map_err(safe)? == 0 {
            return Err(common::already_settled(group, partition, sequence).into());
        }
        self.mark_dead(&mut tx, stream, group, &[(partition, sequence)]).await?;
        self.frontier.advance(&mut tx, stream, group, &mut frontiers, &cursors, &BTreeSet::from([partition])).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(true)
    }

    // ---- replay and reset ----

    async fn replay_after_tx(
        &self,
        stream: &str,
        group: &str,
        starts: &[(u32, u64)],
        hws: &[u64],
        now: Now,
    ) -> TxResult<u64> {
        // The high watermarks were read before: events appended since are
        // above them, never settled, so nothing they change is counted.
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let (mut frontiers, mut cursors) = self.frontier.lock_group(&mut tx, stream, group).await?;
        // Claims give their open positions above the start to rows and end
        // there: what they acked above it has no row and is reopened as
        // the cursor moves back.
        self.split_claims(&mut tx, stream, group, &Split::After(starts)).await?;
        let mut reopened = 0u64;
        for &(p, from) in starts {
            let (f, c) = fc(&frontiers, &cursors, p);
            let hw = hws.get(p as usize).copied().unwrap_or(0);
            let upper = hw.min(c.saturating_sub(1));
            // Reopened: the settled rows above `from` (counted from the
            // UPDATE itself, which sees an ack that commits meanwhile: acks
            // take no group lock), and the positions without a row in
            // (from, upper], which are settled (acked in a claim, or before
            // the group's start). Rows appear only under this lock.
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let part = s.int(i64::from(p));
            let lo = s.int(seq_arg(from));
            let hi = s.int(seq_arg(upper));
            s.push(&format!(
                "SELECT count(*) FROM {} WHERE stream = {st} AND group_name = {gr} AND partition = {part} \
                 AND sequence > {lo} AND sequence <= {hi}",
                self.names.deliveries()
            ));
            let rows_below = tx.all(&s).await.map_err(safe)?.first().map(|r| r.u64(0)).transpose()?.unwrap_or(0);
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let part = s.int(i64::from(p));
            let lo = s.int(seq_arg(from));
            let at = self.now_sql(&mut s, now);
            s.push(&format!(
                "UPDATE {} SET status = 'available', attempt = 0, lease_id = NULL, consumer_id = NULL, expires_at = NULL, \
                 reason = 'replay', retried_at = {at} WHERE stream = {st} AND group_name = {gr} AND partition = {part} \
                 AND sequence > {lo} AND status IN {TERMINAL} RETURNING sequence",
                self.names.deliveries()
            ));
            let reopened_rows = tx.all(&s).await.map_err(safe)?.len() as u64;
            reopened += reopened_rows + upper.saturating_sub(from).saturating_sub(rows_below);
            self.unmark(&mut tx, stream, group, p, from).await?;
            frontiers.insert(p, f.min(from));
            cursors.insert(p, c.min(from.saturating_add(1)));
        }
        // Reopened rows of events whose time has not come wait again.
        let spans: Vec<(u32, u64, u64)> =
            starts.iter().map(|&(p, from)| (p, from.saturating_add(1), u64::MAX)).collect();
        self.park_available(&mut tx, (stream, group), &spans, now).await?;
        self.frontier.write_maps(&mut tx, stream, group, Some(&frontiers), Some(&cursors)).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(reopened)
    }

    async fn replay_matches_tx(
        &self,
        stream: &str,
        group: &str,
        matched: &[(u32, u64, String)],
        now: Now,
    ) -> TxResult<u64> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let (mut frontiers, cursors) = self.frontier.lock_group(&mut tx, stream, group).await?;
        // Matched positions in flight under a claim become leased rows (not
        // settled, so not reopened); those a claim acked have no row and
        // are reopened like any settled one.
        let positions: Vec<(u32, u64)> = matched.iter().map(|(p, q, _)| (*p, *q)).collect();
        self.split_claims(&mut tx, stream, group, &Split::Positions(&positions)).await?;
        let mut reopened = 0u64;
        let mut reopened_at: Vec<(u32, u64, u64)> = Vec::new();
        for chunk in matched.chunks(1000) {
            let keys: Vec<Value> = chunk
                .iter()
                .map(|(p, q, id)| Value::from(vec![Value::from(*p), Value::from(*q), Value::from(id.as_str())]))
                .collect();
            let mut s = self.stmt();
            let gr = s.text(group);
            let st = s.text(stream);
            let arr = s.text(Value::from(keys).to_string());
            s.push(&format!(
                "SELECT {p}, {q}, x.c2, d.status FROM {rows} AS x LEFT JOIN {dl} d ON d.stream = {st} \
                 AND d.group_name = {gr} AND d.event_id = x.c2",
                p = self.d.as_int("x.c0"),
                q = self.d.as_int("x.c1"),
                rows = self.d.json_rows(&arr, 3),
                dl = self.names.deliveries(),
            ));
            let mut settled: Vec<Value> = Vec::new();
            for r in tx.all(&s).await.map_err(safe)? {
                let (p, q, status) = (r.u32(0)?, r.u64(1)?, r.opt_text(3)?);
                let (f, c) = fc(&frontiers, &cursors, p);
                let is_settled =
                    q <= f || matches!(status.as_deref(), Some("acked" | "rejected")) || (status.is_none() && q < c);
                if is_settled {
                    reopened_at.push((p, q, q));
                    settled.push(Value::from(vec![Value::from(p), Value::from(q), Value::from(r.text(2)?)]));
                    frontiers.insert(p, f.min(q.saturating_sub(1)));
                    reopened += 1;
                }
            }
            if settled.is_empty() {
                continue;
            }
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let arr = s.text(Value::from(settled.clone()).to_string());
            let at = self.now_sql(&mut s, now);
            s.push(&format!(
                "INSERT INTO {dl} (stream, group_name, event_id, partition, sequence, status, attempt, reason, retried_at, created_at) \
                 SELECT {st}, {gr}, x.c2, {p}, {q}, 'available', 0, 'replay', {at}, {at} FROM {rows} AS x WHERE true \
                 ON CONFLICT (stream, group_name, event_id) DO UPDATE SET status = 'available', attempt = 0, \
                 lease_id = NULL, consumer_id = NULL, expires_at = NULL, reason = 'replay', retried_at = excluded.retried_at",
                dl = self.names.deliveries(),
                p = self.d.as_int("x.c0"),
                q = self.d.as_int("x.c1"),
                rows = self.d.json_rows(&arr, 3),
            ));
            tx.exec(&s).await.map_err(safe)?;
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let arr = s.text(Value::from(settled).to_string());
            s.push(&format!(
                "DELETE FROM {t} WHERE stream = {st} AND group_name = {gr} AND EXISTS (SELECT 1 FROM {rows} AS x \
                 WHERE {p} = {t}.partition AND {q} = {t}.sequence)",
                t = self.names.dl_order(),
                p = self.d.as_int("x.c0"),
                q = self.d.as_int("x.c1"),
                rows = self.d.json_rows(&arr, 3),
            ));
            tx.exec(&s).await.map_err(safe)?;
        }
        // Reopened rows of events whose time has not come wait again.
        self.park_available(&mut tx, (stream, group), &reopened_at, now).await?;
        self.frontier.write_maps(&mut tx, stream, group, Some(&frontiers), None).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(reopened)
    }

    async fn reset_tx(&self, stream: &str, group: &str, starts: &BTreeMap<u32, u64>) -> TxResult<()> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let (mut frontiers, mut cursors) = self.frontier.lock_group(&mut tx, stream, group).await?;
        let parts: Vec<u32> = starts.keys().copied().collect();
        self.delete_claims(&mut tx, stream, group, Some(&parts)).await?;
        for t in [self.names.deliveries(), self.names.dl_order()] {
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let arr = s.text(Value::from(parts.clone()).to_string());
            let list = match self.d {
                Dialect::Postgres => format!("(SELECT jsonb_array_elements_text({arr}::jsonb)::int)"),
                Dialect::Sqlite => format!("(SELECT CAST(value AS INTEGER) FROM json_each({arr}))"),
            };
            s.push(&format!("DELETE FROM {t} WHERE stream = {st} AND group_name = {gr} AND partition IN {list}"));
            tx.exec(&s).await.map_err(safe)?;
        }
        for (&p, &f) in starts {
            frontiers.insert(p, f);
            cursors.insert(p, f.saturating_add(1));
        }
        self.frontier.write_maps(&mut tx, stream, group, Some(&frontiers), Some(&cursors)).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(())
    }

    // ---- inspecting ----

    /// Derives the frontiers of `scope` (the stored ones may trail what
    /// is settled by a flush), and has a stored one that trails written.
    pub(super) async fn derive_frontiers(
        &self,
        stream: &str,
        group: &str,
        g: &mut GroupRow,
        scope: &[u32],
    ) -> Result<()> {
        let stored = g.frontiers.clone();
        let parts: BTreeSet<u32> = scope.iter().copied().collect();
        self.frontier.derive(stream, group, &mut g.frontiers, &g.cursors, &parts).await?;
        let behind: Vec<u32> = parts.iter().copied().filter(|p| stored.get(p) != g.frontiers.get(p)).collect();
        if !behind.is_empty() {
            self.frontier.note(stream, group, behind);
        }
        Ok(())
    }
}

impl GroupStore for SqlBackend {
    async fn stream_marks(&self, stream: &str) -> Result<(u32, Vec<u64>)> {
        let count = self.partition_count(stream).await?;
        Ok((count, self.high_watermarks(stream, count).await?))
    }

    async fn load_group(&self, stream: &str, group: &str) -> Result<GroupRow> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let hws = match self.d {
            Dialect::Postgres => "json_object_agg(q.partition, q.next_sequence)::text",
            Dialect::Sqlite => "json_group_object(q.partition, q.next_sequence)",
        };
        s.push(&format!(
            "SELECT s.partition_count, g.name, g.max_attempts, {}, {}, {}, {}, \
             (SELECT {hws} FROM {} q WHERE q.stream = s.name) FROM {} s \
             LEFT JOIN {} g ON g.stream = s.name AND g.name = {gr} \
             LEFT JOIN {} x ON x.stream = s.name AND x.name = {gr} WHERE s.name = {st}",
            self.d.json_out("g.cursors"),
            self.d.json_out("g.frontiers"),
            self.d.ts_out("g.created_at"),
            self.d.json_out("x.settings"),
            self.names.seqs(),
            self.names.streams(),
            self.names.groups(),
            self.names.settings()
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("load group", Phase::Safe))?;
        let r = rows.first().ok_or_else(|| Error::stream_not_found(stream))?;
        if r.opt_text(1)?.is_none() {
            return Err(Error::group_not_found(stream, group));
        }
        let settings = match r.opt_text(6)? {
            Some(t) => serde_json::from_str(&t)
                .map_err(|e| Error::failed("reading a group", format!("group {stream:?}/{group:?}: settings: {e}")))?,
            None => Settings::default(),
        };
        let count = r.u32(0)?;
        let seqs = match r.opt_text(7)? {
            Some(t) => parse_map(stream, group, "high watermarks", &t)?,
            None => BTreeMap::new(),
        };
        Ok(GroupRow {
            count,
            max_attempts: r.u32(2)?,
            settings,
            cursors: parse_map(stream, group, "cursors", &r.text(3)?)?,
            frontiers: parse_map(stream, group, "frontiers", &r.text(4)?)?,
            created_at: r.ts(5)?,
            hws: (0..count).map(|p| seqs.get(&p).copied().unwrap_or(0)).collect(),
        })
    }

    async fn log_starts(&self, stream: &str, hws: &[u64]) -> Result<Vec<u64>> {
        SqlBackend::log_starts(self, stream, hws).await
    }

    async fn first_at_or_after(&self, stream: &str, _count: u32, t: Timestamp) -> Result<BTreeMap<u32, u64>> {
        let mut s = self.stmt();
        let st = s.text(stream);
        let at = s.ts(t);
        s.push(&format!(
            "SELECT partition, min(sequence) FROM {} WHERE stream = {st} AND \"timestamp\" >= {at} GROUP BY partition",
            self.names.events()
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("start_at", Phase::Safe))?;
        rows.iter().map(|r| Ok((r.u32(0)?, r.u64(1)?))).collect()
    }

    async fn insert_group(&self, stream: &str, group: &str, new: &NewGroup<'_>) -> Result<Timestamp> {
        let NewGroup { max_attempts, frontiers, settings } = *new;
        let cursors: BTreeMap<u32, u64> = frontiers.iter().map(|(&p, &f)| (p, f.saturating_add(1))).collect();
        let now = self.now();
        super::retry_tx!(
            self,
            "create_group",
            self.create_group_tx(stream, group, max_attempts, frontiers, &cursors, settings, now).await
        )
    }

    async fn skip_position(&self, stream: &str, group: &str, at: (u32, u64), reason: &str) -> Result<bool> {
        let now = self.now();
        super::retry_tx!(self, "skip", self.skip_tx(stream, group, at, reason, now).await)
    }

    async fn reopen_after(&self, stream: &str, group: &str, starts: &[(u32, u64)], hws: &[u64]) -> Result<u64> {
        let now = self.now();
        super::retry_tx!(self, "replay", self.replay_after_tx(stream, group, starts, hws, now).await)
    }

    async fn reopen_matches(&self, stream: &str, group: &str, matched: &[(u32, u64, String)]) -> Result<u64> {
        let now = self.now();
        super::retry_tx!(self, "replay", self.replay_matches_tx(stream, group, matched, now).await)
    }

    async fn restart(&self, stream: &str, group: &str, starts: &BTreeMap<u32, u64>) -> Result<()> {
        super::retry_tx!(self, "reset_group", self.reset_tx(stream, group, starts).await)
    }

    async fn settled_frontiers(&self, stream: &str, group: &str, g: &mut GroupRow, scope: &[u32]) -> Result<()> {
        self.derive_frontiers(stream, group, g, scope).await
    }

    async fn delivery_counts(&self, stream: &str, group: &str, _scope: &[u32]) -> Result<DeliveryCounts> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let now = self.now();
        let at = self.now_sql(&mut s, now);
        s.push(&format!(
            "SELECT COALESCE(sum(CASE WHEN status = 'leased' AND lease_id IS NOT NULL THEN 1 ELSE 0 END), 0), \
             COALESCE(sum(CASE WHEN {waiting} AND attempt > 0 THEN 1 ELSE 0 END), 0), \
             COALESCE(sum(CASE WHEN status = 'rejected' THEN 1 ELSE 0 END), 0), \
             COALESCE(sum(CASE WHEN {waiting} AND attempt = 0 THEN 1 ELSE 0 END), 0), \
             {due} \
             FROM {} WHERE stream = {st} AND group_name = {gr} AND status IN ('leased', 'rejected')",
            self.names.deliveries(),
            // A row waiting with attempt 0 is a scheduled event set aside
            // (schedule.rs); with more, a retry's backoff.
            waiting = format!("status = 'leased' AND lease_id IS NULL AND expires_at > {at}"),
            due = self.d.ts_out(&format!(
                "min(CASE WHEN status = 'leased' AND lease_id IS NULL AND expires_at > {at} AND attempt = 0 \
                 THEN expires_at END)"
            )),
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("group_info", Phase::Safe))?;
        let Some(r) = rows.first() else { return Ok(DeliveryCounts::default()) };
        Ok(DeliveryCounts {
            inflight: r.u64(0)? + self.claimed_inflight(stream, group).await?,
            retry_waiting: r.u64(1)?,
            dead_letters: r.u64(2)?,
            scheduled: r.u64(3)?,
            next_due: r.opt_ts(4)?,
        })
    }

    async fn held_attempt(&self, lease: &LeaseRef) -> Result<Option<Held>> {
        self.split_lease(lease).await?;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, &lease.stream, &lease.group);
        let (part, seq) = (s.int(i64::from(lease.partition)), s.int(seq_arg(lease.sequence)));
        let lid = s.text(lease.lease_id.to_string());
        let now_col = match self.now() {
            Now::Db => self.d.ts_out("now()"),
            Now::At(t) => {
                let ph = s.ts(t);
                self.d.ts_out(&ph)
            }
        };
        s.push(&format!(
            "SELECT d.attempt, {now_col} FROM {dl} AS d WHERE d.stream = {st} AND d.group_name = {gr} \
             AND d.partition = {part} AND d.sequence = {seq} AND d.lease_id = {lid} AND d.status = 'leased'",
            dl = self.names.deliveries(),
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("retry", Phase::Safe))?;
        rows.first().map(|r| Ok(Held { attempt: r.u32(0)?, now: r.ts(1)? })).transpose()
    }

    async fn dead_letter(&self, lease: &LeaseRef, held: Held, reason: &str) -> Result<bool> {
        let now = held.now;
        super::retry_tx!(self, "retry", self.dead_letter_tx(lease, reason, Now::At(now)).await)
    }

    async fn reschedule(&self, lease: &LeaseRef, held: Held, reason: &str, available_at: Timestamp) -> Result<bool> {
        let Held { attempt, now } = held;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, &lease.stream, &lease.group);
        let arr = s.arg(lease_rows(std::iter::once((lease.partition, lease.sequence, lease.lease_id.to_string()))));
        let at = s.ts(now);
        let why = s.text(reason);
        let att = s.int(i64::from(attempt));
        // Claimable at once: the reference's 'available'. Later: a lease
        // with no holder that expires when the backoff ends, which both
        // implementations' claims take once it passes.
        let (status, exp) =
            if available_at > now { ("leased", s.ts(available_at)) } else { ("available", "NULL".to_owned()) };
        s.push(&format!(
            "UPDATE {dl} AS d SET status = '{status}', lease_id = NULL, consumer_id = NULL, expires_at = {exp}, \
             reason = {why}, retried_at = {at} \
             {fenced} AND d.attempt = {att}",
            dl = self.names.deliveries(),
            fenced = self.fenced(&st, &gr, &arr),
        ));
        Ok(self.pool.exec(&s).await.map_err(self.err("retry", Phase::Commit))? > 0)
    }
}

impl MaterializedFetch for SqlBackend {
    const MATERIALIZE_MIN: u64 = 512;

    async fn materialize(
        &self,
        stream: &str,
        group: &str,
        parts: &[u32],
        chunk: u64,
        budget: usize,
        _only_near: bool,
    ) -> Result<u64> {
        super::retry_tx!(self, "fetch", self.materialize_tx(stream, group, parts, chunk, budget).await)
    }

    async fn claim(&self, spec: &ClaimSpec<'_>, limit: usize) -> Result<Taken> {
        let lease_ids: Vec<LeaseId> = (0..limit).map(|_| LeaseId::from_u128(crate::ids::new_lease_id())).collect();
        let rows = match self.d {
            Dialect::Postgres => super::retry_tx!(self, "fetch", self.claim_pg(spec, limit, &lease_ids).await)?,
            Dialect::Sqlite => super::retry_tx!(self, "fetch", self.claim_lite(spec, limit, &lease_ids).await)?,
        };
        self.leases_of(spec.stream, spec.group, spec.consumer, &rows, 0)
    }

    async fn settled(&self, stream: &str, group: &str, dead: &[(u32, u64)]) -> Result<()> {
        super::retry_tx!(self, "fetch", self.settled_tx(stream, group, dead).await)
    }
}

impl SqlBackend {
    /// The order of dead letters: the dead-letter mark (rows the reference
    /// wrote have none and come first), then time, partition and sequence;
    /// and the rows it is read from.
    fn dead_letter_order(&self) -> (String, String) {
        let key = format!(
            "COALESCE(o.mark, -1), {}, d.partition, d.sequence",
            self.d.ts_key("COALESCE(d.dead_lettered_at, d.created_at)")
        );
        let from = format!(
            "FROM {dl} d LEFT JOIN {o} o ON o.stream = d.stream AND o.group_name = d.group_name \
             AND o.partition = d.partition AND o.sequence = d.sequence",
            dl = self.names.deliveries(),
            o = self.names.dl_order()
        );
        (key, from)
    }
}

impl SettleStore for SqlBackend {
    /// The order key's values: (mark, time, partition, sequence).
    type DeadLetterKey = Row;

    async fn dead_letter_key(&self, stream: &str, group: &str, at: DeadLetterAt<'_>) -> Result<Option<Row>> {
        let (key, from) = self.dead_letter_order();
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let cond = match at {
            DeadLetterAt::Position(p, q) => {
                format!("d.partition = {} AND d.sequence = {}", s.int(i64::from(p)), s.int(seq_arg(q)))
            }
            DeadLetterAt::Event(id) => format!("d.event_id = {}", s.text(id)),
        };
        s.push(&format!(
            "SELECT {key} {from} WHERE d.stream = {st} AND d.group_name = {gr} AND d.status = 'rejected' AND {cond}"
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("dead_letters", Phase::Safe))?;
        Ok(rows.into_iter().next())
    }

    async fn dead_letter_page(
        &self,
        stream: &str,
        group: &str,
        after: Option<&Row>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let (key, from) = self.dead_letter_order();
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let mut cond = String::new();
        if let Some(a) = after {
            let mark = s.int(a.i64(0)?);
            let t = match self.d {
                Dialect::Postgres => s.int(a.i64(1)?),
                Dialect::Sqlite => s.text(a.text(1)?),
            };
            let p = s.int(a.i64(2)?);
            let q = s.int(a.i64(3)?);
            cond = format!(" AND ({key}) > ({mark}, {t}, {p}, {q})");
        }
        let lim = s.int(i64::try_from(limit).unwrap_or(i64::MAX));
        s.push(&format!(
            "SELECT d.partition, d.sequence, d.reason, d.attempt, {dla}, {cols} {from} LEFT JOIN {ev} e ON e.id = d.event_id \
             WHERE d.stream = {st} AND d.group_name = {gr} AND d.status = 'rejected'{cond} ORDER BY {key} LIMIT {lim}",
            dla = self.d.ts_out("d.dead_lettered_at"),
            cols = event_cols(self.d, "e"),
            ev = self.names.events(),
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("dead_letters", Phase::Safe))?;
        let name: Arc<str> = Arc::from(stream);
        rows.iter()
            .map(|r| {
                let event = if r.opt_text(5)?.is_some() { Some(decode_event(&name, r, 5)?) } else { None };
                Ok(DeadLetter {
                    partition: r.u32(0)?,
                    sequence: r.u64(1)?,
                    // An event row is missing only when retention dropped it.
                    dropped: event.is_none(),
                    event,
                    damage: None,
                    reason: r.opt_text(2)?.unwrap_or_default(),
                    attempts: r.u32(3)?,
                    dead_lettered_at: r.opt_ts(4)?.unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn reject_held(&self, lease: &LeaseRef, reason: &str) -> Result<bool> {
        self.split_lease(lease).await?;
        let now = self.now();
        super::retry_tx!(self, "reject", self.dead_letter_tx(lease, reason, now).await)
    }

    async fn missing(&self, stream: &str, group: &str) -> Result<Option<Error>> {
        match self.partition_count(stream).await {
            Err(e @ Error::StreamNotFound { .. }) => return Ok(Some(e)),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        s.push(&format!("SELECT 1 FROM {} WHERE stream = {st} AND name = {gr}", self.names.groups()));
        let rows = self.pool.all(&s).await.map_err(self.err("settle", Phase::Safe))?;
        Ok(rows.is_empty().then(|| Error::group_not_found(stream, group)))
    }
}
