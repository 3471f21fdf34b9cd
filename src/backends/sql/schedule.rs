//! Scheduled delivery on SQL (ADR 0036).
//!
//! An append with a delivery time writes a row of `rheo_rs_scheduled`
//! beside its event (`append.rs`). A group meets a scheduled event in one
//! of two ways, and both turn it into a *parked* delivery row: status
//! `leased` with no holder, attempt 0, `expires_at` its delivery time. That
//! is the shape of a retry waiting out its backoff, so every claim of both
//! implementations takes it once its time has come (the reference's claim
//! index, `(stream, group_name, status, expires_at)`, is the index by due
//! time), and it uses no attempt; `group_info` counts rows of attempt 0 as
//! scheduled, the others as waiting retries.
//!
//! - A fetch that takes fresh positions skips those scheduled after now
//!   and parks them as its cursor passes them (`claims.rs`), at most its
//!   scheduled budget ([`crate::groups::scheduled_budget`]) shared by its
//!   partitions; past its share a partition's window ends before the next
//!   one, so the next fetch goes on from there. With `rheo_claims=rows`
//!   the materialization parks them the same way.
//! - A delivery row made claimable again (a replay) is parked again when
//!   its event's time has not come.
//!
//! The PostgreSQL one-statement claims leave a fetch to the transactional
//! claim when a scheduled event that is not due lies between a cursor and
//! the high watermark; once the cursor passed it, it costs them one index
//! probe.

use serde_json::Value;

use super::db::{Tx, sg};
use super::dialect::Dialect;
use super::streams::seq_arg;
use super::{Now, SqlBackend, TxResult, safe};
use crate::model::time::Timestamp;

impl SqlBackend {
    /// The sequences of partition `p` in `from..=to` whose events are
    /// scheduled after `now`, in order, at most `max`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn scheduled_ahead(
        &self,
        tx: &mut Tx,
        stream: &str,
        p: u32,
        (from, to): (u64, u64),
        now: Now,
        max: usize,
    ) -> TxResult<Vec<u64>> {
        let mut s = self.stmt();
        let st = s.text(stream);
        let part = s.int(i64::from(p));
        let lo = s.int(seq_arg(from));
        let hi = s.int(seq_arg(to));
        let at = self.now_sql(&mut s, now);
        let lim = s.int(i64::try_from(max).unwrap_or(i64::MAX));
        s.push(&format!(
            "SELECT sequence FROM {} WHERE stream = {st} AND partition = {part} AND sequence >= {lo} \
             AND sequence <= {hi} AND deliver_at > {at} ORDER BY sequence LIMIT {lim}",
            self.names.scheduled()
        ));
        Ok(tx.all(&s).await.map_err(safe)?.iter().map(|r| r.u64(0)).collect::<crate::error::Result<_>>()?)
    }

    /// Records the schedule of events an append stores in `tx` (partition,
    /// sequence, id, time): the path of appends with producer-given ids
    /// (the group-commit path writes it in its own statement).
    pub(super) async fn record_schedule(
        &self,
        tx: &mut Tx,
        stream: &str,
        events: &[(u32, u64, &str, Timestamp)],
    ) -> TxResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut s = self.stmt();
        let st = s.text(stream);
        let rows: Vec<Value> = events
            .iter()
            .map(|&(p, q, id, t)| {
                let at = match self.d {
                    Dialect::Postgres => Value::from(t.as_millis()),
                    Dialect::Sqlite => Value::from(super::dialect::format_ts(t)),
                };
                Value::from(vec![Value::from(p), Value::from(seq_arg(q)), Value::from(id), at])
            })
            .collect();
        let arr = s.text(Value::from(rows).to_string());
        let at = match self.d {
            Dialect::Postgres => format!("'epoch'::timestamptz + {} * interval '1 millisecond'", self.d.as_int("x.c3")),
            Dialect::Sqlite => "x.c3".to_owned(),
        };
        s.push(&format!(
            "INSERT INTO {} (stream, partition, sequence, event_id, deliver_at) \
             SELECT {st}, {}, {}, x.c2, {at} FROM {} AS x",
            self.names.scheduled(),
            self.d.as_int("x.c0"),
            self.d.as_int("x.c1"),
            self.d.json_rows(&arr, 4),
        ));
        tx.exec(&s).await.map_err(safe)?;
        Ok(())
    }

    /// Adds the parked delivery rows of `positions` (each scheduled, none
    /// with a row yet): waiting until their time, attempt 0. Returns how
    /// many it added.
    pub(super) async fn park_positions(
        &self,
        tx: &mut Tx,
        (stream, group): (&str, &str),
        positions: &[(u32, u64)],
        now: Now,
    ) -> TxResult<u64> {
        if positions.is_empty() {
            return Ok(0);
        }
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let rows: Vec<Value> =
            positions.iter().map(|&(p, q)| Value::from(vec![Value::from(p), Value::from(seq_arg(q))])).collect();
        let arr = s.text(Value::from(rows).to_string());
        let at = self.now_sql(&mut s, now);
        let (ins, ignore) = self.insert_ignore();
        let cond = format!(
            "sc.stream = {st} AND sc.partition = {} AND sc.sequence = {}",
            self.d.as_int("x.c0"),
            self.d.as_int("x.c1")
        );
        // A primary-key probe of the schedule per position (it holds the
        // event id): the only index there, so a planner that misjudges a
        // new stream (no statistics yet) has no other index to pick, as it
        // would among the events' (it picked `(stream, "key")` and
        // filtered the whole stream per position). LATERAL on PostgreSQL,
        // which would otherwise hash-join the table.
        let join = match self.d {
            Dialect::Postgres => format!(
                "CROSS JOIN LATERAL (SELECT sc.event_id, sc.partition, sc.sequence, sc.deliver_at FROM {} sc \
                 WHERE {cond} OFFSET 0) sc",
                self.names.scheduled()
            ),
            // CROSS JOIN keeps the positions the outer loop on SQLite.
            Dialect::Sqlite => format!("CROSS JOIN {} sc ON {cond}", self.names.scheduled()),
        };
        s.push(&format!(
            "{ins} {dl} (stream, group_name, event_id, partition, sequence, status, attempt, expires_at, created_at) \
             SELECT {st}, {gr}, sc.event_id, sc.partition, sc.sequence, 'leased', 0, sc.deliver_at, {at} \
             FROM {xs} AS x {join} WHERE true {ignore}",
            dl = self.names.deliveries(),
            xs = self.d.json_rows(&arr, 2),
        ));
        tx.exec(&s).await.map_err(safe)
    }

    /// Parks again the rows of `ranges` (partition, first, last) that are
    /// claimable as new (`available`, attempt 0: a replay's, or a
    /// materialization's) while their event's time has not come. Returns
    /// how many it parked.
    pub(super) async fn park_available(
        &self,
        tx: &mut Tx,
        (stream, group): (&str, &str),
        ranges: &[(u32, u64, u64)],
        now: Now,
    ) -> TxResult<u64> {
        if ranges.is_empty() {
            return Ok(0);
        }
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let rows: Vec<Value> = ranges
            .iter()
            .map(|&(p, a, b)| Value::from(vec![Value::from(p), Value::from(seq_arg(a)), Value::from(seq_arg(b))]))
            .collect();
        let arr = s.text(Value::from(rows).to_string());
        let at = self.now_sql(&mut s, now);
        let of = |alias: &str| {
            format!("{alias}.stream = d.stream AND {alias}.partition = d.partition AND {alias}.sequence = d.sequence")
        };
        s.push(&format!(
            "UPDATE {dl} AS d SET status = 'leased', \
             expires_at = (SELECT sc.deliver_at FROM {sched} sc WHERE {of_sc}) \
             WHERE d.stream = {st} AND d.group_name = {gr} AND d.status = 'available' AND d.attempt = 0 \
             AND EXISTS (SELECT 1 FROM {xs} AS x WHERE {p} = d.partition AND d.sequence >= {a} AND d.sequence <= {b}) \
             AND EXISTS (SELECT 1 FROM {sched} s2 WHERE {of_s2} AND s2.deliver_at > {at})",
            dl = self.names.deliveries(),
            sched = self.names.scheduled(),
            of_sc = of("sc"),
            of_s2 = of("s2"),
            xs = self.d.json_rows(&arr, 3),
            p = self.d.as_int("x.c0"),
            a = self.d.as_int("x.c1"),
            b = self.d.as_int("x.c2"),
        ));
        tx.exec(&s).await.map_err(safe)
    }

    /// Deletes the schedule of partition `p`'s events below `start`
    /// (retention drops them).
    pub(super) async fn drop_schedule_below(&self, stream: &str, p: u32, start: u64) -> crate::error::Result<()> {
        let mut s = self.stmt();
        let st = s.text(stream);
        let part = s.int(i64::from(p));
        let below = s.int(seq_arg(start));
        s.push(&format!(
            "DELETE FROM {} WHERE stream = {st} AND partition = {part} AND sequence < {below}",
            self.names.scheduled()
        ));
        self.pool.exec(&s).await.map_err(self.err("enforce_retention", super::db::Phase::Commit))?;
        Ok(())
    }
}
