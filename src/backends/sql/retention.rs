//! Retention on SQL: a stream's retention in `rheo_rs_stream_settings`,
//! passes that move the groups behind each new log start (one transaction
//! per group, under its row lock) and then delete the events below it in
//! bounded batches. The log start of a partition is its lowest stored
//! sequence (the high watermark + 1 when it holds none): found through the
//! `(stream, partition, sequence)` index, so it needs no column of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::db::Phase;
use super::db::sg;
use super::{Now, SqlBackend, TxResult, at_commit, safe};
use crate::backends::group_store::{self, GroupMove, RetentionStore};
use crate::error::{Error, Result};
use crate::model::retention::{PartitionInfo, Retention};
use crate::model::stream::StreamInfo;

/// Events one DELETE removes at most: a pass deletes in these steps, each
/// its own short statement, so that it never holds a long lock.
const DELETE_BATCH: u64 = 1000;

impl SqlBackend {
    /// The size an event counts for (`max_bytes`, `stream_info`): its
    /// payload, metadata and id as stored text, plus 32 bytes.
    fn bytes_expr(&self, alias: &str) -> String {
        format!(
            "(length(CAST({alias}.payload AS TEXT)) + length(CAST({alias}.metadata AS TEXT)) + length({alias}.id) + 32)"
        )
    }

    /// The statement that stores a stream's retention (in `tx` or alone).
    pub(super) fn store_retention_stmt(&self, stream: &str, retention: &Retention) -> Result<super::db::Stmt> {
        let mut s = self.stmt();
        let st = s.text(stream);
        let js = serde_json::to_string(retention).map_err(|e| Error::failed("set_retention", e.to_string()))?;
        let ph = s.text(js);
        s.push(&format!(
            "INSERT INTO {} (stream, settings) VALUES ({st}, {}) \
             ON CONFLICT (stream) DO UPDATE SET settings = excluded.settings",
            self.names.stream_settings(),
            self.d.json_in(&ph)
        ));
        Ok(s)
    }

    pub(super) async fn set_retention_impl(&self, stream: &str, retention: &Retention) -> Result<StreamInfo> {
        self.partition_count(stream).await?;
        let s = self.store_retention_stmt(stream, retention)?;
        self.pool.exec(&s).await.map_err(self.err("set_retention", Phase::Commit))?;
        self.stream_info_impl(stream).await
    }

    /// The log start of each partition: its lowest stored sequence, or the
    /// high watermark + 1 when it holds none.
    pub(super) async fn log_starts(&self, stream: &str, hws: &[u64]) -> Result<Vec<u64>> {
        let mut s = self.stmt();
        let st = s.text(stream);
        let parts: Vec<Value> = (0..hws.len()).map(|p| Value::from(vec![p])).collect();
        let arr = s.text(Value::from(parts).to_string());
        let p = self.d.as_int("x.c0");
        s.push(&format!(
            "SELECT {p}, (SELECT min(e.sequence) FROM {} e WHERE e.stream = {st} AND e.partition = {p}) FROM {} AS x",
            self.names.events(),
            self.d.json_rows(&arr, 1)
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("log start", Phase::Safe))?;
        let mut out: Vec<u64> = hws.iter().map(|h| h + 1).collect();
        for r in rows {
            let p = r.u32(0)? as usize;
            if let (Some(slot), Some(min)) = (out.get_mut(p), r.opt_i64(1)?) {
                *slot = u64::try_from(min).unwrap_or(*slot);
            }
        }
        Ok(out)
    }

    pub(super) async fn stream_info_impl(&self, stream: &str) -> Result<StreamInfo> {
        let mut info =
            self.list_streams_impl(Some(stream)).await?.pop().ok_or_else(|| Error::stream_not_found(stream))?;
        let starts = self.log_starts(stream, &info.high_watermarks).await?;
        let mut s = self.stmt();
        let st = s.text(stream);
        s.push(&format!(
            "SELECT e.partition, COALESCE(sum({}), 0) FROM {} e WHERE e.stream = {st} GROUP BY e.partition",
            self.bytes_expr("e"),
            self.names.events()
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("stream_info", Phase::Safe))?;
        let mut bytes = vec![0u64; starts.len()];
        for r in rows {
            if let Some(slot) = bytes.get_mut(r.u32(0)? as usize) {
                *slot = r.u64(1)?;
            }
        }
        let parts = (0u32..)
            .zip(starts.iter().zip(&info.high_watermarks).zip(&bytes))
            .map(|(p, ((&first, &last), &b))| PartitionInfo::new(p, first, last, b))
            .collect();
        let retention = group_store::retention_of(self, stream).await?;
        info = info.with_partitions(parts).with_options(retention, None);
        Ok(info)
    }

    /// Moves one group past every partition's new start (`plan`), under
    /// its row lock: the unsettled positions below a start are counted as
    /// skipped, the deliveries below it go (dead letters stay), the
    /// frontier and cursor move up. Returns (partition, skipped) for each
    /// partition that skipped any.
    async fn move_group_tx(&self, stream: &str, group: &str, plan: &BTreeMap<u32, u64>) -> TxResult<Vec<(u32, u64)>> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let (frontiers, cursors) = self.frontier.lock_group(&mut tx, stream, group).await?;
        let mut mv = GroupMove::new(frontiers, cursors);
        let steps = mv.steps(plan);
        // Claims of the partitions that move give every open position to
        // a row first (counted below as unsettled, deleted with the rest).
        let cut: Vec<(u32, u64)> = steps.iter().map(|m| (m.partition, 0)).collect();
        self.split_claims(&mut tx, stream, group, &super::claims::Split::After(&cut)).await?;
        for m in &steps {
            // Unsettled: rows not acked nor rejected, and positions from the
            // cursor on (never materialized) without a row. The rows below
            // the start go (dead letters stay), and what they held is
            // counted from what the DELETE removed: an ack that commits
            // meanwhile (acks take no group lock) is seen by it, so a
            // position is never both acknowledged and counted as skipped.
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let part = s.int(i64::from(m.partition));
            let st_ = s.int(super::streams::seq_arg(m.start));
            s.push(&format!(
                "DELETE FROM {} WHERE stream = {st} AND group_name = {gr} AND partition = {part} \
                 AND sequence < {st_} AND status <> 'rejected' RETURNING sequence, status",
                self.names.deliveries()
            ));
            let gone = tx.all(&s).await.map_err(safe)?;
            let (mut open, mut rows_fresh) = (0u64, 0u64);
            for r in &gone {
                let (q, status) = (r.u64(0)?, r.text(1)?);
                if q <= m.frontier {
                    continue;
                }
                if status != "acked" {
                    open += 1;
                }
                if q >= m.fresh_from {
                    rows_fresh += 1;
                }
            }
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let part = s.int(i64::from(m.partition));
            let ff = s.int(super::streams::seq_arg(m.fresh_from));
            let hi = s.int(super::streams::seq_arg(m.below()));
            s.push(&format!(
                "SELECT count(*) FROM {} WHERE stream = {st} AND group_name = {gr} AND partition = {part} \
                 AND status = 'rejected' AND sequence >= {ff} AND sequence <= {hi}",
                self.names.deliveries()
            ));
            let rows = tx.all(&s).await.map_err(safe)?;
            rows_fresh += rows.first().map(|r| r.u64(0)).transpose()?.unwrap_or(0);
            mv.record(m, open + m.fresh().saturating_sub(rows_fresh));
        }
        if mv.moved.is_empty() {
            return Ok(mv.skipped);
        }
        self.frontier.write_maps(&mut tx, stream, group, Some(&mv.frontiers), Some(&mv.cursors)).await?;
        self.frontier.advance(&mut tx, stream, group, &mut mv.frontiers, &mv.cursors, &mv.moved).await?;
        if mv.total() > 0 {
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            s.push(&format!(
                "SELECT {} FROM {} WHERE stream = {st} AND name = {gr}",
                self.d.json_out("settings"),
                self.names.settings()
            ));
            let rows = tx.all(&s).await.map_err(safe)?;
            let stored = rows.first().map(|r| r.text(0)).transpose()?;
            let settings = mv.counted(stream, group, stored.as_deref())?;
            self.write_settings(&mut tx, stream, group, &settings, "enforce_retention").await?;
        }
        tx.commit().await.map_err(at_commit)?;
        Ok(mv.skipped)
    }
}

impl SqlBackend {
    /// The one sequence (or NULL) a retention statement selects.
    async fn one_sequence(&self, s: &super::db::Stmt) -> Result<Option<u64>> {
        let rows = self.pool.all(s).await.map_err(self.err("retention", Phase::Safe))?;
        let n = rows.first().map(|r| r.opt_i64(0)).transpose()?.flatten();
        Ok(n.and_then(|n| u64::try_from(n).ok()))
    }
}

impl RetentionStore for SqlBackend {
    async fn retention_text(&self, stream: &str) -> Result<Option<String>> {
        // StreamNotFound (the count is cached: no round trip after the first).
        self.partition_count(stream).await?;
        let mut s = self.stmt();
        let st = s.text(stream);
        s.push(&format!(
            "SELECT {} FROM {} WHERE stream = {st}",
            self.d.json_out("settings"),
            self.names.stream_settings()
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("retention", Phase::Safe))?;
        rows.first().map(|r| r.text(0)).transpose()
    }

    async fn first_younger_than(&self, stream: &str, p: u32, age: Duration) -> Result<Option<u64>> {
        let ms = -i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        let mut s = self.stmt();
        let st = s.text(stream);
        let part = s.int(i64::from(p));
        let cutoff = match self.now() {
            Now::Db => {
                let ph = s.int(ms);
                self.d.ts_plus("now()", &ph)
            }
            Now::At(t) => s.ts(crate::model::time::Timestamp::from_millis(t.as_millis().saturating_add(ms))),
        };
        s.push(&format!(
            "SELECT min(sequence) FROM {} WHERE stream = {st} AND partition = {part} AND \"timestamp\" >= {cutoff}",
            self.names.events()
        ));
        self.one_sequence(&s).await
    }

    async fn newest_past_bytes(&self, stream: &str, p: u32, max: u64) -> Result<Option<u64>> {
        let mut s = self.stmt();
        let st = s.text(stream);
        let part = s.int(i64::from(p));
        let lim = s.int(i64::try_from(max).unwrap_or(i64::MAX));
        s.push(&format!(
            "SELECT max(sequence) FROM (SELECT e.sequence, sum({}) OVER (ORDER BY e.sequence DESC) AS total \
             FROM {} e WHERE e.stream = {st} AND e.partition = {part}) w WHERE w.total > {lim}",
            self.bytes_expr("e"),
            self.names.events()
        ));
        self.one_sequence(&s).await
    }

    async fn group_names(&self, stream: &str) -> Result<Vec<String>> {
        Ok(self.list_groups_impl(stream).await?.into_iter().map(|g| g.name).collect())
    }

    async fn move_group(&self, stream: &str, group: &str, starts: &BTreeMap<u32, u64>) -> Result<Vec<(u32, u64)>> {
        super::retry_tx!(self, "enforce_retention", self.move_group_tx(stream, group, starts).await)
    }

    /// Deletes the events of partition `p` below `start`, [`DELETE_BATCH`]
    /// at a time; returns the bytes freed.
    async fn delete_below(&self, stream: &str, p: u32, start: u64) -> Result<u64> {
        let mut freed = 0;
        loop {
            let mut s = self.stmt();
            let st = s.text(stream);
            let part = s.int(i64::from(p));
            let below = s.int(super::streams::seq_arg(start));
            s.push(&format!(
                "SELECT COALESCE(sum(b), 0), count(*) FROM (SELECT {} AS b FROM {} e WHERE e.stream = {st} \
                 AND e.partition = {part} AND e.sequence < {below} ORDER BY e.sequence LIMIT {DELETE_BATCH}) x",
                self.bytes_expr("e"),
                self.names.events()
            ));
            let rows = self.pool.all(&s).await.map_err(self.err("enforce_retention", Phase::Safe))?;
            let (bytes, n) = match rows.first() {
                Some(r) => (r.u64(0)?, r.u64(1)?),
                None => (0, 0),
            };
            if n == 0 {
                // The schedule goes after its events: an event below the
                // start never lacks its schedule while it exists.
                self.drop_schedule_below(stream, p, start).await?;
                return Ok(freed);
            }
            let mut s = self.stmt();
            let st = s.text(stream);
            let part = s.int(i64::from(p));
            let below = s.int(super::streams::seq_arg(start));
            s.push(&format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE stream = {st} AND partition = {part} \
                 AND sequence < {below} ORDER BY sequence LIMIT {DELETE_BATCH})",
                t = self.names.events()
            ));
            self.pool.exec(&s).await.map_err(self.err("enforce_retention", Phase::Commit))?;
            freed += bytes;
            if n < DELETE_BATCH {
                // The schedule goes after its events: an event below the
                // start never lacks its schedule while it exists.
                self.drop_schedule_below(stream, p, start).await?;
                return Ok(freed);
            }
        }
    }

    async fn retained_streams(&self) -> Result<Vec<String>> {
        let mut s = self.stmt();
        s.push(&format!("SELECT stream FROM {}", self.names.stream_settings()));
        let rows = self.pool.all(&s).await.map_err(self.err("retention", Phase::Safe))?;
        rows.iter().map(|r| r.text(0)).collect()
    }
}
