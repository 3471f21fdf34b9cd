//! Retention on MongoDB, as on SQL (`backends::sql::retention`): a
//! stream's retention in `rheo_rs_stream_settings`, passes that move the
//! groups behind each new log start (one transaction per group, under its
//! lock) and then delete the events below it in bounded batches. The log
//! start of a partition is its lowest stored sequence (the high watermark
//! + 1 when it holds none), found through the `(stream, partition,
//! sequence)` index.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Bson, DateTime, Document, doc};

use super::groups::{REJECTED, int, int_of};
use super::streams::get_u64;
use super::{EVENTS, MongoBackend, Phase, SETTINGS, STREAM_SETTINGS, in_group_tx, map_err};
use crate::backends::group_store::{self, GroupMove, RetentionStore};
use crate::error::{Error, Result};
use crate::model::retention::{PartitionInfo, Retention};
use crate::model::stream::StreamInfo;

/// Events one delete removes at most.
const DELETE_BATCH: i64 = 1000;

fn err(operation: &'static str) -> impl Fn(mongodb::error::Error) -> Error {
    move |e| map_err(operation, Phase::Safe, &e)
}

fn werr(operation: &'static str) -> impl Fn(mongodb::error::Error) -> Error {
    move |e| map_err(operation, Phase::Commit, &e)
}

/// The size an event counts for: its stored BSON document.
fn doc_bytes(d: &Document) -> u64 {
    mongodb::bson::to_vec(d).map_or(0, |b| b.len() as u64)
}

impl MongoBackend {
    pub(super) async fn store_retention(&self, stream: &str, retention: &Retention) -> Result<()> {
        let text = serde_json::to_string(retention).map_err(|e| Error::failed("set_retention", e.to_string()))?;
        self.collection(STREAM_SETTINGS)
            .update_one(doc! { "stream": stream }, doc! { "$set": { "settings": text } })
            .upsert(true)
            .await
            .map_err(werr("set_retention"))?;
        Ok(())
    }

    pub(super) async fn set_retention_impl(&self, stream: &str, retention: &Retention) -> Result<StreamInfo> {
        self.partition_count(stream).await?;
        self.store_retention(stream, retention).await?;
        self.stream_info_impl(stream).await
    }

    /// The log start of each partition: its lowest stored sequence, or the
    /// high watermark + 1 when it holds none.
    pub(super) async fn log_starts(&self, stream: &str, hws: &[u64]) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(hws.len());
        for (p, hw) in (0i64..).zip(hws) {
            let first = self
                .collection(EVENTS)
                .find_one(doc! { "stream": stream, "partition": p })
                .sort(doc! { "stream": 1, "partition": 1, "sequence": 1 })
                .projection(doc! { "sequence": 1 })
                .await
                .map_err(err("log start"))?;
            out.push(first.as_ref().and_then(|d| get_u64(d, "sequence")).unwrap_or(hw + 1));
        }
        Ok(out)
    }

    pub(super) async fn stream_info_impl(&self, stream: &str) -> Result<StreamInfo> {
        let info = self
            .list_streams_impl()
            .await?
            .into_iter()
            .find(|s| s.name == stream)
            .ok_or_else(|| Error::stream_not_found(stream))?;
        let starts = self.log_starts(stream, &info.high_watermarks).await?;
        // The size is read document by document (MongoDB has no cheap
        // per-stream size): stream_info scans the stream.
        let mut bytes = vec![0u64; starts.len()];
        let mut cursor = self.collection(EVENTS).find(doc! { "stream": stream }).await.map_err(err("stream_info"))?;
        while let Some(d) = cursor.try_next().await.map_err(err("stream_info"))? {
            let p = usize::try_from(int_of(&d, "partition")).unwrap_or(usize::MAX);
            if let Some(slot) = bytes.get_mut(p) {
                *slot += doc_bytes(&d);
            }
        }
        let parts = (0u32..)
            .zip(starts.iter().zip(&info.high_watermarks).zip(&bytes))
            .map(|(p, ((&first, &last), &b))| PartitionInfo::new(p, first, last, b))
            .collect();
        let retention = group_store::retention_of(self, stream).await?;
        Ok(info.with_partitions(parts).with_options(retention, None))
    }
}

impl RetentionStore for MongoBackend {
    async fn retention_text(&self, stream: &str) -> Result<Option<String>> {
        // StreamNotFound (the count is cached: no round trip after the first).
        self.partition_count(stream).await?;
        let found =
            self.collection(STREAM_SETTINGS).find_one(doc! { "stream": stream }).await.map_err(err("retention"))?;
        Ok(found.as_ref().and_then(|d| d.get_str("settings").ok()).map(str::to_owned))
    }

    async fn first_younger_than(&self, stream: &str, p: u32, age: Duration) -> Result<Option<u64>> {
        let cutoff = self.now().as_millis().saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX));
        let kept = self
            .collection(EVENTS)
            .find_one(doc! { "stream": stream, "partition": i64::from(p), "timestamp": { "$gte": DateTime::from_millis(cutoff) } })
            .sort(doc! { "stream": 1, "partition": 1, "sequence": 1 })
            .projection(doc! { "sequence": 1 })
            .await
            .map_err(err("retention"))?;
        Ok(kept.as_ref().and_then(|d| get_u64(d, "sequence")))
    }

    async fn newest_past_bytes(&self, stream: &str, p: u32, max: u64) -> Result<Option<u64>> {
        // Newest first, until the running total passes the limit. Reads at
        // most the limit's worth.
        let mut total = 0u64;
        let mut cursor = self
            .collection(EVENTS)
            .find(doc! { "stream": stream, "partition": i64::from(p) })
            .sort(doc! { "stream": 1, "partition": 1, "sequence": -1 })
            .await
            .map_err(err("retention"))?;
        while let Some(d) = cursor.try_next().await.map_err(err("retention"))? {
            total += doc_bytes(&d);
            if total > max {
                return Ok(Some(int_of(&d, "sequence")));
            }
        }
        Ok(None)
    }

    async fn group_names(&self, stream: &str) -> Result<Vec<String>> {
        Ok(self.list_groups_impl(stream).await?.into_iter().map(|g| g.name).collect())
    }

    async fn move_group(&self, stream: &str, group: &str, plan: &BTreeMap<u32, u64>) -> Result<Vec<(u32, u64)>> {
        const OP: &str = "enforce_retention";
        in_group_tx!(self, stream, group, OP, |s| {
            let (frontiers, cursors) = self.lock_group(s, stream, group, OP).await?;
            let mut mv = GroupMove::new(frontiers, cursors);
            for m in mv.steps(plan) {
                let (p, f) = (i64::from(m.partition), m.frontier);
                let range = doc! { "stream": stream, "group": group, "partition": p,
                "sequence": { "$gt": int(f), "$lte": int(m.below()) } };
                let mut open = 0u64;
                let mut rows_fresh = 0u64;
                let mut cur = self
                    .deliveries()
                    .find(range)
                    .projection(doc! { "sequence": 1, "status": 1 })
                    .session(&mut *s)
                    .await
                    .map_err(txe(OP))?;
                while let Some(d) = cur.next(&mut *s).await {
                    let d = d.map_err(txe(OP))?;
                    let settled = matches!(d.get_str("status"), Ok(st) if st == "acked" || st == REJECTED);
                    if !settled {
                        open += 1;
                    }
                    if int_of(&d, "sequence") >= m.fresh_from {
                        rows_fresh += 1;
                    }
                }
                self.deliveries()
                    .delete_many(doc! { "stream": stream, "group": group, "partition": p,
                    "sequence": { "$lt": int(m.start) }, "status": { "$ne": REJECTED } })
                    .session(&mut *s)
                    .await
                    .map_err(txe(OP))?;
                mv.record(&m, open + m.fresh().saturating_sub(rows_fresh));
            }
            if mv.moved.is_empty() {
                return Ok(mv.skipped);
            }
            self.write_maps(s, stream, group, Some(&mv.frontiers), Some(&mv.cursors), OP).await?;
            self.advance(s, stream, group, &mut mv.frontiers, &mv.cursors, &mv.moved, OP).await?;
            if mv.total() > 0 {
                let found = self
                    .collection(SETTINGS)
                    .find_one(doc! { "stream": stream, "name": group })
                    .session(&mut *s)
                    .await
                    .map_err(txe(OP))?;
                let stored = found.as_ref().and_then(|d| d.get_str("settings").ok());
                let settings = mv.counted(stream, group, stored)?;
                let text = serde_json::to_string(&settings).map_err(|e| Error::failed(OP, e.to_string()))?;
                self.collection(SETTINGS)
                    .update_one(doc! { "stream": stream, "name": group }, doc! { "$set": { "settings": text } })
                    .upsert(true)
                    .session(&mut *s)
                    .await
                    .map_err(txe(OP))?;
            }
            Ok(mv.skipped)
        })
    }

    /// Deletes the events of partition `p` below `start`, [`DELETE_BATCH`]
    /// at a time; returns the bytes freed.
    async fn delete_below(&self, stream: &str, p: u32, start: u64) -> Result<u64> {
        let mut freed = 0;
        loop {
            let docs: Vec<Document> = self
                .collection(EVENTS)
                .find(doc! { "stream": stream, "partition": i64::from(p), "sequence": { "$lt": int(start) } })
                .sort(doc! { "stream": 1, "partition": 1, "sequence": 1 })
                .limit(DELETE_BATCH)
                .await
                .map_err(err("enforce_retention"))?
                .try_collect()
                .await
                .map_err(err("enforce_retention"))?;
            if docs.is_empty() {
                return Ok(freed);
            }
            let ids: Vec<Bson> = docs.iter().filter_map(|d| d.get("_id").cloned()).collect();
            self.collection(EVENTS)
                .delete_many(doc! { "_id": { "$in": ids } })
                .await
                .map_err(werr("enforce_retention"))?;
            freed += docs.iter().map(doc_bytes).sum::<u64>();
            if (docs.len() as i64) < DELETE_BATCH {
                return Ok(freed);
            }
        }
    }

    async fn retained_streams(&self) -> Result<Vec<String>> {
        let docs: Vec<Document> = self
            .collection(STREAM_SETTINGS)
            .find(doc! {})
            .await
            .map_err(err("retention"))?
            .try_collect()
            .await
            .map_err(err("retention"))?;
        Ok(docs.iter().filter_map(|d| d.get_str("stream").ok().map(str::to_owned)).collect())
    }
}
