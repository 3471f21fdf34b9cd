//! Streams and events on Redis: one Redis stream per partition with the
//! sequence as entry id, the meta hash, appends in one script, reads and
//! queries by `XRANGE`, retention passes.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::Arc;

use redis::{AsyncCommands, Value};

use super::{Core, Keys, bad_reply, map_err, v_arr, v_int, v_text, v_u64};
use crate::backends::combine::{Answers, Call, Combiner};
use crate::backends::dedupe::{Plan, resolve_plan};
use crate::backends::group_store::{RetentionPlan, gather_pass};
use crate::error::{Error, ObjectKind, Result};
use crate::model::append::NewEvent;
use crate::model::event::{Event, EventParts, Position};
use crate::model::group::check_partitions;
use crate::model::payload::{Metadata, Payload, PayloadFormat};
use crate::model::query::{Page, Query, check_index_field};
use crate::model::retention::{DroppedRange, GroupSkip, PartitionInfo, Retention, RetentionReport};
use crate::model::routing::route;
use crate::model::stream::{IndexStatus, MAX_INDEXES, StreamInfo, StreamOptions};
use crate::model::time::Timestamp;

/// Entries one `XRANGE` of a read, query or scan returns at most.
const PAGE: usize = 1000;
/// Entries one retention step deletes per partition at most.
const TRIM_BATCH: usize = 1000;
/// Steps of one retention pass at most (a million entries per partition);
/// the next pass goes on.
const TRIM_STEPS: usize = 1000;
/// The most events in one append flush (concurrent calls combined).
pub(super) const FLUSH_MAX_EVENTS: usize = 1000;
/// The most bytes (of arguments) in one append flush.
pub(super) const FLUSH_MAX_BYTES: usize = 4 << 20;
/// Append flushes of one stream in flight at once: while one waits for
/// the server's fsync, the next is already queued behind it (the server
/// runs them one after the other, each atomic).
pub(super) const FLUSH_DEPTH: usize = 4;

/// One event encoded for the append script (its 10 arguments) and the
/// timestamp it carries.
pub(crate) struct Encoded {
    args: [Vec<u8>; 10],
    stamp: Timestamp,
}

/// How often a retention step is tried again when groups appear while it
/// runs (on a cluster).
const RETAIN_ATTEMPTS: usize = 8;

/// The meta hash of a stream, as read.
#[derive(Debug, Clone)]
pub(super) struct Meta {
    pub count: u32,
    pub created: Timestamp,
    pub retention: Retention,
    pub indexes: Vec<String>,
    pub hws: Vec<u64>,
    pub bytes: Vec<u64>,
}

/// An entry's fields, decoded into an event.
pub(super) fn decode_entry(stream: &Arc<str>, p: u32, entry_id: &str, fields: &[Value]) -> Result<Event> {
    let sequence = entry_id
        .split_once('-')
        .and_then(|(s, _)| s.parse::<u64>().ok())
        .ok_or_else(|| bad_entry(stream, p, entry_id, "its id is not <sequence>-0"))?;
    let mut parts = EventParts::new(stream, p, sequence);
    let mut payload = None;
    let mut i = 0;
    while i + 1 < fields.len() {
        let name = v_text(&fields[i]).unwrap_or_default();
        let value = &fields[i + 1];
        let bytes = match value {
            Value::BulkString(b) => b.clone(),
            other => v_text(other).unwrap_or_default().into_bytes(),
        };
        let text = || String::from_utf8(bytes.clone()).map_err(|_| bad_entry(stream, p, entry_id, &name));
        match name.as_str() {
            "id" => parts.id = text()?,
            "timestamp" => {
                let ms: i64 = text()?.parse().map_err(|_| bad_entry(stream, p, entry_id, "timestamp"))?;
                parts.timestamp = Timestamp::from_millis(ms);
            }
            "key" => parts.key = Some(text()?),
            "type" => parts.event_type = Some(text()?),
            "metadata" => {
                parts.metadata = serde_json::from_slice::<Metadata>(&bytes)
                    .map_err(|_| bad_entry(stream, p, entry_id, "metadata"))?;
            }
            "mp" => {
                payload =
                    Some(Payload::from_msgpack(bytes).map_err(|_| bad_entry(stream, p, entry_id, "payload (mp)"))?)
            }
            "json" => {
                payload = Some(
                    Payload::from_stored_json(bytes).map_err(|_| bad_entry(stream, p, entry_id, "payload (json)"))?,
                )
            }
            _ => {}
        }
        i += 2;
    }
    parts.payload = payload.ok_or_else(|| bad_entry(stream, p, entry_id, "payload"))?;
    Ok(Event::from(parts))
}

fn bad_entry(stream: &str, p: u32, entry_id: &str, what: &str) -> Error {
    Error::failed(
        "reading an event",
        format!("redis: stream {stream:?} partition {p} entry {entry_id}: {what} is missing or not valid"),
    )
}

/// The entries of an `XRANGE` reply: (entry id, fields).
pub(super) fn entries(v: &Value) -> Vec<(String, &[Value])> {
    v_arr(v)
        .iter()
        .filter_map(|e| {
            let e = v_arr(e);
            Some((v_text(e.first()?)?, v_arr(e.get(1)?)))
        })
        .collect()
}

impl Core {
    /// A stream's meta hash: `StreamNotFound` when there is none.
    pub(super) async fn meta(&self, stream: &str) -> Result<Meta> {
        let mut conn = self.conn();
        let m: HashMap<String, String> =
            conn.hgetall(self.meta_key(stream)).await.map_err(|e| map_err("read", false, &e))?;
        if m.is_empty() {
            return Err(Error::stream_not_found(stream));
        }
        let bad = |what: &str| {
            Error::failed("read", format!("redis: stream {stream:?}: the meta hash's {what} is missing or not valid"))
        };
        let count: u32 =
            m.get("partitions").and_then(|v| v.parse().ok()).filter(|&n| n > 0).ok_or_else(|| bad("partitions"))?;
        let created = Timestamp::from_millis(m.get("created").and_then(|v| v.parse().ok()).unwrap_or(0));
        let retention = match m.get("retention") {
            Some(t) => serde_json::from_str(t).map_err(|_| bad("retention"))?,
            None => Retention::default(),
        };
        let indexes = match m.get("indexes") {
            Some(t) => serde_json::from_str(t).map_err(|_| bad("indexes"))?,
            None => Vec::new(),
        };
        let per = |prefix: &str| -> Vec<u64> {
            (0..count).map(|p| m.get(&format!("{prefix}:{p}")).and_then(|v| v.parse().ok()).unwrap_or(0)).collect()
        };
        self.partition_counts.write().insert(stream.to_owned(), count);
        Ok(Meta { count, created, retention, indexes, hws: per("hw"), bytes: per("bytes") })
    }

    /// A stream's partition count: `StreamNotFound` when there is none.
    pub(super) async fn partition_count(&self, stream: &str) -> Result<u32> {
        if let Some(&n) = self.partition_counts.read().get(stream) {
            return Ok(n);
        }
        Ok(self.meta(stream).await?.count)
    }

    pub(super) async fn create_stream_impl(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        opts.validate(stream)?;
        for f in &opts.indexes {
            check_index_field(stream, f)?;
        }
        let created = self.now();
        let retention =
            serde_json::to_string(&opts.retention).map_err(|e| Error::failed("create_stream", e.to_string()))?;
        let indexes =
            serde_json::to_string(&opts.indexes).map_err(|e| Error::failed("create_stream", e.to_string()))?;
        // The name first: a stream whose script then fails is a name
        // without a meta hash, which listings skip.
        let mut conn = self.conn();
        let _: i64 = conn.sadd(self.streams_key(), stream).await.map_err(|e| map_err("create_stream", true, &e))?;
        let r = self
            .run(
                &self.scripts.create_stream,
                stream,
                Keys::NewStream(opts.partition_count),
                &[opts.partition_count.to_string(), created.as_millis().to_string(), retention, indexes],
                "create_stream",
                true,
            )
            .await?;
        if v_int(&r) == Some(-3) {
            return Err(Error::AlreadyExists { kind: ObjectKind::Stream, name: stream.to_owned() });
        }
        self.partition_counts.write().insert(stream.to_owned(), opts.partition_count);
        let n = opts.partition_count as usize;
        Ok(StreamInfo::new(stream, opts.partition_count, opts.indexes.clone(), vec![0; n], created)
            .with_partitions((0..opts.partition_count).map(|p| PartitionInfo::new(p, 1, 0, 0)).collect())
            .with_options(opts.retention, None))
    }

    /// Appends a call's events through the combiner: concurrent calls on
    /// one stream go to the server in one script (one round trip and one
    /// AOF write for all of them), each call answered on its own. Every
    /// event is routed and encoded here first, so a call with bad input
    /// fails alone and writes nothing.
    pub(super) async fn append_combined(
        &self,
        appends: &Combiner<Arc<str>, Encoded, Position>,
        stream: &str,
        events: &[NewEvent],
    ) -> Result<Vec<Position>> {
        let count = self.partition_count(stream).await?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let at = self.now();
        let mut encoded = Vec::with_capacity(events.len());
        let mut bytes = 0;
        for e in events {
            let p = route(stream, e, count)?;
            let ts = e.timestamp.unwrap_or(at);
            let has =
                format!("{}{}", if e.key.is_some() { "k" } else { "" }, if e.event_type.is_some() { "t" } else { "" });
            let metadata = if e.metadata.is_empty() {
                Vec::new()
            } else {
                serde_json::to_vec(&e.metadata).map_err(|err| Error::failed("append", err.to_string()))?
            };
            let (field, payload) = match e.payload.format() {
                PayloadFormat::Json => ("json", e.payload.as_bytes().to_vec()),
                _ => ("mp", e.payload.as_bytes().to_vec()),
            };
            let args = [
                p.to_string().into_bytes(),
                e.id().as_bytes().to_vec(),
                if e.id_given { b"1".to_vec() } else { b"0".to_vec() },
                ts.as_millis().to_string().into_bytes(),
                e.key().unwrap_or_default().as_bytes().to_vec(),
                e.event_type().unwrap_or_default().as_bytes().to_vec(),
                has.into_bytes(),
                metadata,
                field.as_bytes().to_vec(),
                payload,
            ];
            bytes += args.iter().map(|a| a.len() + 16).sum::<usize>();
            encoded.push(Encoded { args, stamp: ts });
        }
        appends.submit(Arc::from(stream), encoded, bytes).await
    }

    /// One flush of the append combiner: every call's events in one
    /// script, all or nothing; each call gets its own positions, or the
    /// flush's error (nothing written, or unknown, for all alike: no error
    /// of the script is one call's, their input was checked before).
    pub(super) async fn flush_appends(&self, stream: &str, calls: Vec<Call<Encoded>>) -> Answers<Position> {
        let all: Vec<&Encoded> = calls.iter().flat_map(|c| c.items.iter()).collect();
        match self.write_appends(stream, &all).await {
            Ok(positions) => {
                let mut rest = positions.into_iter();
                calls.iter().map(|c| Ok(rest.by_ref().take(c.items.len()).collect())).collect()
            }
            Err(e) => calls.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// Appends encoded events in one script: all or nothing; one position
    /// per event, in order (a duplicate id's is the stored event's).
    async fn write_appends(&self, stream: &str, events: &[&Encoded]) -> Result<Vec<Position>> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + events.len() * 10);
        let n = events.len().to_string();
        args.push(n.as_bytes());
        for e in events {
            args.extend(e.args.iter().map(Vec::as_slice));
        }
        let r = self.run(&self.scripts.append, stream, Keys::Stream, &args, "append", true).await?;
        if v_int(&r) == Some(-1) {
            return Err(Error::stream_not_found(stream));
        }
        let answers = v_arr(&r);
        if answers.len() != events.len() {
            return Err(bad_reply("append", "one answer per event"));
        }
        let mut plan = Vec::with_capacity(events.len());
        let mut stored = Vec::new();
        for (i, a) in answers.iter().enumerate() {
            let text = v_text(a).ok_or_else(|| bad_reply("append", "a text answer"))?;
            let mut it = text.split(':');
            let kind = it.next().unwrap_or_default();
            let nums: Vec<i64> = it.filter_map(|x| x.parse().ok()).collect();
            let num = |k: usize| nums.get(k).copied().ok_or_else(|| bad_reply("append", &text));
            match kind {
                "s" => {
                    let p = u32::try_from(num(0)?).map_err(|_| bad_reply("append", &text))?;
                    let q = u64::try_from(num(1)?).map_err(|_| bad_reply("append", &text))?;
                    stored.push(Position::new(p, q, events[i].stamp));
                    plan.push(Plan::Store);
                }
                "d" => {
                    let p = u32::try_from(num(0)?).map_err(|_| bad_reply("append", &text))?;
                    let q = u64::try_from(num(1)?).map_err(|_| bad_reply("append", &text))?;
                    plan.push(Plan::Original(Position::duplicate_of(p, q, Timestamp::from_millis(num(2)?))));
                }
                "k" => {
                    let k = usize::try_from(num(0)?).map_err(|_| bad_reply("append", &text))?;
                    plan.push(Plan::SameAs(k.saturating_sub(1)));
                }
                _ => return Err(bad_reply("append", &text)),
            }
        }
        resolve_plan(plan, &stored)
    }

    /// Entries of partition `p` with `after < sequence <= until`, at most
    /// `limit`.
    pub(super) async fn range(&self, stream: &str, p: u32, after: u64, until: u64, limit: usize) -> Result<Value> {
        let mut conn = self.conn();
        let until = if until >= i64::MAX as u64 { "+".to_owned() } else { format!("{until}-0") };
        crate::observe::round_trip(super::NAME);
        redis::cmd("XRANGE")
            .arg(self.part_key(stream, p))
            .arg(format!("({after}-0"))
            .arg(until)
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(|e| map_err("read", false, &e))
    }

    pub(super) async fn read_impl(&self, stream: &str, p: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        let count = self.partition_count(stream).await?;
        check_partitions(stream, &[p], count)?;
        let v = self.range(stream, p, after, u64::MAX, limit).await?;
        let name: Arc<str> = Arc::from(stream);
        entries(&v).iter().map(|(id, f)| decode_entry(&name, p, id, f)).collect()
    }

    /// Scans partition `p` in sequence order from after `after` to `until`,
    /// a page of entries per `XRANGE`, handing each decoded event and its
    /// stored size to `visit` until it answers `Break`.
    async fn scan(
        &self,
        stream: &str,
        p: u32,
        mut after: u64,
        until: u64,
        mut visit: impl FnMut(Event, u64) -> ControlFlow<()>,
    ) -> Result<()> {
        let name: Arc<str> = Arc::from(stream);
        while after < until {
            let v = self.range(stream, p, after, until, PAGE).await?;
            let got = entries(&v);
            for (id, f) in &got {
                let e = decode_entry(&name, p, id, f)?;
                after = e.sequence();
                if visit(e, entry_size(f)).is_break() {
                    return Ok(());
                }
            }
            if got.len() < PAGE {
                break;
            }
        }
        Ok(())
    }

    /// One page of a query: the partitions in scope are scanned within the
    /// query's sequence bounds, a page's worth kept.
    pub(super) async fn query_impl(&self, q: &Query) -> Result<Page> {
        let count = self.partition_count(&q.stream).await?;
        let mut page = q.page_builder();
        for p in q.partitions(count) {
            let (after, until) = q.narrowed_bounds(p);
            self.scan(&q.stream, p, after, until, |e, _| {
                if q.scan_is_ordered() && page.past_end_at(p, e.sequence()) {
                    return ControlFlow::Break(());
                }
                page.offer(e);
                ControlFlow::Continue(())
            })
            .await?;
        }
        Ok(page.finish())
    }

    /// The log start of each partition: its first entry's sequence (the
    /// high watermark + 1 when it holds none).
    pub(super) async fn log_starts(&self, stream: &str, hws: &[u64]) -> Result<Vec<u64>> {
        let mut pipe = redis::pipe();
        for p in (0u32..).take(hws.len()) {
            pipe.cmd("XRANGE").arg(self.part_key(stream, p)).arg("-").arg("+").arg("COUNT").arg(1);
        }
        crate::observe::round_trip(super::NAME);
        let mut conn = self.conn();
        let firsts: Vec<Value> = pipe.query_async(&mut conn).await.map_err(|e| map_err("log start", false, &e))?;
        Ok(hws
            .iter()
            .zip(firsts.iter().chain(std::iter::repeat(&Value::Nil)))
            .map(|(&hw, v)| {
                entries(v)
                    .first()
                    .and_then(|(id, _)| id.split_once('-').and_then(|(s, _)| s.parse().ok()))
                    .unwrap_or(hw + 1)
            })
            .collect())
    }

    /// Per partition, the first sequence whose timestamp is at or after
    /// `t` (a scan: timestamps are the producers').
    pub(super) async fn first_at_or_after(&self, stream: &str, count: u32, t: Timestamp) -> Result<BTreeMap<u32, u64>> {
        let mut out = BTreeMap::new();
        for p in 0..count {
            self.scan(stream, p, 0, u64::MAX, |e, _| {
                if e.timestamp() < t {
                    return ControlFlow::Continue(());
                }
                out.insert(p, e.sequence());
                ControlFlow::Break(())
            })
            .await?;
        }
        Ok(out)
    }

    pub(super) async fn list_streams_impl(&self) -> Result<Vec<StreamInfo>> {
        let mut conn = self.conn();
        let mut names: Vec<String> =
            conn.smembers(self.streams_key()).await.map_err(|e| map_err("list_streams", false, &e))?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            match self.stream_info_impl(&n).await {
                Ok(i) => out.push(i),
                Err(Error::StreamNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    pub(super) async fn stream_info_impl(&self, stream: &str) -> Result<StreamInfo> {
        let m = self.meta(stream).await?;
        let starts = self.log_starts(stream, &m.hws).await?;
        let parts = (0u32..)
            .zip(starts.iter().zip(&m.hws).zip(&m.bytes))
            .map(|(p, ((&first, &last), &b))| PartitionInfo::new(p, first, last, b))
            .collect();
        Ok(StreamInfo::new(stream, m.count, m.indexes.clone(), m.hws.clone(), m.created)
            .with_partitions(parts)
            .with_options(m.retention, None))
    }

    pub(super) async fn set_retention_impl(&self, stream: &str, retention: &Retention) -> Result<StreamInfo> {
        self.partition_count(stream).await?;
        let text = serde_json::to_string(retention).map_err(|e| Error::failed("set_retention", e.to_string()))?;
        let mut conn = self.conn();
        let _: i64 = conn
            .hset(self.meta_key(stream), "retention", text)
            .await
            .map_err(|e| map_err("set_retention", true, &e))?;
        self.stream_info_impl(stream).await
    }

    pub(super) async fn create_index_impl(&self, stream: &str, field: &str) -> Result<()> {
        let canonical = check_index_field(stream, field)?;
        let m = self.meta(stream).await?;
        if crate::backends::index_declared(&m.indexes, &canonical) {
            return Ok(());
        }
        if m.indexes.len() >= MAX_INDEXES {
            return Err(Error::invalid("indexes", format!("stream {stream:?} has {MAX_INDEXES} indexes, the maximum")));
        }
        let mut indexes = m.indexes;
        indexes.push(field.to_owned());
        let text = serde_json::to_string(&indexes).map_err(|e| Error::failed("create_index", e.to_string()))?;
        let mut conn = self.conn();
        let _: i64 =
            conn.hset(self.meta_key(stream), "indexes", text).await.map_err(|e| map_err("create_index", true, &e))?;
        Ok(())
    }

    /// Queries scan the partition streams: a declared field is recorded
    /// (and listed) but builds nothing, so it is "ready" at once.
    pub(super) async fn index_status_impl(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        Ok(crate::backends::scanned_index_status(&self.meta(stream).await?.indexes))
    }

    // ---- retention ----

    /// The first sequence of partition `p` the limits keep, at least `start`.
    async fn limits_start(&self, stream: &str, p: u32, r: &Retention, start: u64, hw: u64, bytes: u64) -> Result<u64> {
        let mut first = start;
        if let Some(n) = r.max_events {
            first = first.max((hw + 1).saturating_sub(n));
        }
        let cutoff = r.age_cutoff_ms(self.now().as_millis());
        let over = r.max_bytes.map(|max| bytes.saturating_sub(max)).filter(|&o| o > 0);
        if cutoff.is_none() && over.is_none() {
            return Ok(first);
        }
        // From the oldest: past the age limit, and until what is left fits.
        let (mut age_done, mut bytes_done) = (cutoff.is_none(), over.is_none());
        let mut freed = 0u64;
        self.scan(stream, p, start.saturating_sub(1), u64::MAX, |e, size| {
            let q = e.sequence();
            if !age_done {
                if cutoff.is_some_and(|c| e.timestamp().as_millis() < c) {
                    first = first.max(q + 1);
                } else {
                    age_done = true;
                }
            }
            if !bytes_done {
                freed += size;
                first = first.max(q + 1);
                bytes_done = over.is_some_and(|o| freed >= o);
            }
            if age_done && bytes_done { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .await?;
        Ok(first.min(hw + 1))
    }

    pub(super) async fn enforce_retention_impl(&self, stream: &str) -> Result<RetentionReport> {
        let m = self.meta(stream).await?;
        let mut report = RetentionReport::new(stream);
        if m.retention.is_unlimited() {
            return Ok(report);
        }
        let starts = self.log_starts(stream, &m.hws).await?;
        let groups = self.all_groups(stream).await?;
        let mut limits = Vec::with_capacity(m.count as usize);
        for p in 0..m.count {
            let (start, hw) = (starts[p as usize], m.hws[p as usize]);
            limits.push(self.limits_start(stream, p, &m.retention, start, hw, m.bytes[p as usize]).await?);
        }
        let planned =
            RetentionPlan::new(m.retention.policy, &starts, &m.hws, &limits, &groups.iter().collect::<Vec<_>>());
        report.ceiling_hit = planned.ceiling_hit;
        // The script moves the groups behind a new start itself.
        let plan: Vec<(u32, u64)> = planned.drops.iter().map(|&(p, _, new)| (p, new)).collect();
        if plan.is_empty() {
            return Ok(report);
        }
        let mut dropped: BTreeMap<u32, DroppedRange> = BTreeMap::new();
        for _ in 0..TRIM_STEPS {
            let mut args: Vec<String> = vec![TRIM_BATCH.to_string()];
            for (p, s) in &plan {
                args.extend([p.to_string(), s.to_string()]);
            }
            // On a cluster the script declares the keys of every group it
            // will find, so it gets their names first; it answers -4 when
            // a group was created meanwhile (nothing done), and the step
            // runs again with it.
            let mut r = Value::Nil;
            for _ in 0..RETAIN_ATTEMPTS {
                let groups = if self.is_cluster() { self.group_names(stream).await? } else { Vec::new() };
                r = self
                    .run(&self.scripts.retain, stream, Keys::Groups(&groups), &args, "enforce_retention", true)
                    .await?;
                if v_int(&r) != Some(-4) {
                    break;
                }
            }
            match v_int(&r) {
                Some(-1) => return Err(Error::stream_not_found(stream)),
                Some(-4) => {
                    return Err(Error::failed(
                        "enforce_retention",
                        format!("redis: stream {stream:?}: groups kept being created while retention ran; try again"),
                    ));
                }
                _ => {}
            }
            let parts = v_arr(&r);
            for s in parts.first().map(v_arr).unwrap_or_default() {
                let s = v_arr(s);
                let (Some(group), Some(p), Some(n)) =
                    (s.first().and_then(v_text), s.get(1).and_then(v_u64), s.get(2).and_then(v_u64))
                else {
                    return Err(bad_reply("enforce_retention", "a skip"));
                };
                report.skipped.push(GroupSkip { group, partition: u32::try_from(p).unwrap_or(u32::MAX), skipped: n });
            }
            let mut more = false;
            for d in parts.get(1).map(v_arr).unwrap_or_default() {
                let d: Vec<u64> = v_arr(d).iter().filter_map(v_u64).collect();
                let [p, first, last, bytes, again] = d[..] else {
                    return Err(bad_reply("enforce_retention", "a dropped range"));
                };
                let p = u32::try_from(p).unwrap_or(u32::MAX);
                let range = dropped.entry(p).or_insert(DroppedRange { partition: p, first, last, bytes: 0 });
                range.last = last;
                range.bytes += bytes;
                more |= again == 1;
            }
            if !more {
                break;
            }
        }
        report.dropped = dropped.into_values().collect();
        Ok(report)
    }

    pub(super) async fn retention_round_impl(&self) -> Result<Vec<RetentionReport>> {
        let mut conn = self.conn();
        let names: Vec<String> =
            conn.smembers(self.streams_key()).await.map_err(|e| map_err("retention", false, &e))?;
        let mut out = Vec::new();
        for stream in names {
            gather_pass(&mut out, &stream, self.enforce_retention_impl(&stream).await);
        }
        Ok(out)
    }
}

/// The size an entry counts for (as the append and retention scripts
/// count it): its fields' names and values, plus 32 bytes.
fn entry_size(fields: &[Value]) -> u64 {
    32 + fields
        .iter()
        .map(|v| match v {
            Value::BulkString(b) => b.len() as u64,
            other => v_text(other).map_or(0, |t| t.len() as u64),
        })
        .sum::<u64>()
}

impl crate::backends::common::QueryPages for Core {
    fn query_page<'a>(&'a self, q: &'a Query) -> futures::future::BoxFuture<'a, Result<Page>> {
        Box::pin(self.query_impl(q))
    }
}
