//! Streams and events on MongoDB: the reference's `streams` and `events`
//! collections, appends in one multi-document transaction.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::options::{IndexOptions, ReturnDocument};
use serde_json::Value;

use super::{
    DELIVERIES, EVENTS, GROUPS, META, MongoBackend, Phase, SCHEMA_VERSION, SETTINGS, STREAM_INDEXES, STREAMS,
    TxFailure, is_duplicate, map_err, txe,
};
use crate::backends::dedupe::{Plan, dedupe_plan, resolve_plan};
use crate::error::{Error, ObjectKind, Result};
use crate::model::append::NewEvent;
use crate::model::event::{Event, EventParts, Position};
use crate::model::group::check_partitions;
use crate::model::payload::{Metadata, Payload};
use crate::model::query::check_index_field;
use crate::model::routing::route;
use crate::model::stream::{StreamInfo, StreamOptions};
use crate::model::time::Timestamp;

/// The reference's indexes, by collection: (name, keys, unique). The
/// reference's `events_stream_currency_curve` (a demo leftover) is left
/// out (ADR 0014).
fn indexes() -> Vec<(&'static str, &'static str, Document, bool)> {
    vec![
        (STREAMS, "streams_name", doc! { "name": 1 }, true),
        (EVENTS, "events_stream_partition_sequence", doc! { "stream": 1, "partition": 1, "sequence": 1 }, true),
        (EVENTS, "events_stream_timestamp", doc! { "stream": 1, "timestamp": 1 }, false),
        (EVENTS, "events_stream_type", doc! { "stream": 1, "type": 1 }, false),
        (EVENTS, "events_stream_key", doc! { "stream": 1, "key": 1 }, false),
        (EVENTS, "events_stream_correlation", doc! { "stream": 1, "metadata.correlation_id": 1 }, false),
        (EVENTS, "events_stream_schema", doc! { "stream": 1, "metadata.schema": 1 }, false),
        (GROUPS, "groups_stream_name", doc! { "stream": 1, "name": 1 }, true),
        (DELIVERIES, "deliveries_stream_group_event", doc! { "stream": 1, "group": 1, "event_id": 1 }, true),
        (DELIVERIES, "deliveries_frontier", doc! { "stream": 1, "group": 1, "partition": 1, "sequence": 1 }, false),
        (DELIVERIES, "deliveries_claim", doc! { "stream": 1, "group": 1, "status": 1, "expires_at": 1 }, false),
        // Per-key order: a keyed group's unsettled deliveries of a key in a
        // partition (not its settled history).
        (
            DELIVERIES,
            "rheo_rs_deliveries_partition_key",
            doc! { "stream": 1, "group": 1, "partition": 1, "key": 1, "status": 1 },
            false,
        ),
        (SETTINGS, "rheo_rs_group_settings_stream_name", doc! { "stream": 1, "name": 1 }, true),
        (STREAM_INDEXES, "rheo_rs_stream_indexes_stream_field", doc! { "stream": 1, "field": 1 }, true),
    ]
}

/// An integer field as the reference writes it (int32 when it fits) or
/// this crate does (int64): either is read.
pub(crate) fn get_u64(d: &Document, field: &str) -> Option<u64> {
    match d.get(field)? {
        Bson::Int32(n) => u64::try_from(*n).ok(),
        Bson::Int64(n) => u64::try_from(*n).ok(),
        // A whole double below 2^53 converts exactly.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Bson::Double(f) if f.fract() == 0.0 && *f >= 0.0 && *f < 9.0e15 => Some(*f as u64),
        _ => None,
    }
}

/// A partition-keyed map (`{"0": n, ...}`) of a stream or group document.
pub(crate) fn get_map(d: &Document, field: &str) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    if let Ok(m) = d.get_document(field) {
        for (k, _) in m {
            if let (Ok(p), Some(n)) = (k.parse::<u32>(), get_u64(m, k)) {
                out.insert(p, n);
            }
        }
    }
    out
}

/// A JSON value as BSON, exactly: integers stay integers, floats stay
/// doubles, and keys are kept as they are (no extended-JSON reading of
/// `$`-keys). An integer above `i64::MAX` has no BSON integer type.
pub(crate) fn to_bson(v: &Value, path: &mut Vec<String>) -> Result<Bson> {
    Ok(match v {
        Value::Null => Bson::Null,
        Value::Bool(b) => Bson::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Bson::Int64(i),
            (None, Some(_)) if n.is_u64() => {
                return Err(Error::invalid(
                    "payload",
                    format!("{n} at {:?} is above 2^63 - 1, which MongoDB cannot store as an integer", path.join(".")),
                ));
            }
            (None, Some(f)) => Bson::Double(f),
            (None, None) => {
                return Err(Error::invalid("payload", format!("{n} at {:?} is not a number", path.join("."))));
            }
        },
        Value::String(s) => Bson::String(s.clone()),
        Value::Array(a) => {
            let mut out = Vec::with_capacity(a.len());
            for (i, x) in a.iter().enumerate() {
                path.push(i.to_string());
                out.push(to_bson(x, path)?);
                path.pop();
            }
            Bson::Array(out)
        }
        Value::Object(m) => {
            let mut d = Document::new();
            for (k, x) in m {
                if k.contains('\0') {
                    return Err(Error::invalid("payload", format!("a key at {:?} holds a NUL byte", path.join("."))));
                }
                path.push(k.clone());
                d.insert(k.clone(), to_bson(x, path)?);
                path.pop();
            }
            Bson::Document(d)
        }
    })
}

/// BSON as JSON: what `to_bson` wrote comes back as it was; what other
/// writers may store (dates, object ids, decimals) reads as relaxed
/// extended JSON.
pub(crate) fn to_json(b: Bson) -> Value {
    match b {
        Bson::Null | Bson::Undefined => Value::Null,
        Bson::Boolean(x) => Value::Bool(x),
        Bson::Int32(n) => Value::from(n),
        Bson::Int64(n) => Value::from(n),
        Bson::Double(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        Bson::String(s) => Value::String(s),
        Bson::Array(a) => Value::Array(a.into_iter().map(to_json).collect()),
        Bson::Document(d) => Value::Object(d.into_iter().map(|(k, v)| (k, to_json(v))).collect()),
        other => other.into_relaxed_extjson(),
    }
}

/// An event document, as the reference stores it.
fn event_doc(stream: &str, e: &NewEvent, partition: u32, sequence: u64, at: Timestamp) -> Result<Document> {
    let payload = to_bson(e.payload.json()?, &mut Vec::new())?;
    let metadata = to_bson(&Value::Object(e.metadata.clone()), &mut vec!["metadata".to_owned()])?;
    Ok(doc! {
        "_id": e.id.as_str(),
        "stream": stream,
        "partition": i64::from(partition),
        "sequence": i64::try_from(sequence).unwrap_or(i64::MAX),
        "timestamp": DateTime::from_millis(e.timestamp.unwrap_or(at).as_millis()),
        "key": e.key.as_deref().map_or(Bson::Null, |k| Bson::String(k.to_owned())),
        "type": e.event_type.as_deref().map_or(Bson::Null, |t| Bson::String(t.to_owned())),
        "metadata": metadata,
        "payload": payload,
    })
}

/// An event read back; a document that is not one names what is wrong.
pub(crate) fn decode_event(stream: &Arc<str>, mut d: Document) -> Result<Event> {
    let id = match d.get("_id") {
        Some(Bson::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let bad = |what: &str| {
        Error::failed(
            "reading an event",
            format!("mongo: stream {stream:?} event {id:?}: {what} is missing or not valid"),
        )
    };
    let partition = get_u64(&d, "partition").and_then(|p| u32::try_from(p).ok()).ok_or_else(|| bad("partition"))?;
    let sequence = get_u64(&d, "sequence").ok_or_else(|| bad("sequence"))?;
    let timestamp = match d.get("timestamp") {
        Some(Bson::DateTime(t)) => Timestamp::from_millis(t.timestamp_millis()),
        _ => return Err(bad("timestamp")),
    };
    let text = |d: &Document, f: &str| d.get_str(f).ok().map(str::to_owned);
    let (key, event_type) = (text(&d, "key"), text(&d, "type"));
    let metadata: Metadata = match d.remove("metadata").map(to_json) {
        Some(Value::Object(m)) => m,
        None | Some(Value::Null) => Metadata::new(),
        Some(_) => return Err(bad("metadata")),
    };
    let payload = to_json(d.remove("payload").unwrap_or(Bson::Null));
    let bytes = serde_json::to_vec(&payload).map_err(|_| bad("payload"))?;
    let payload = Payload::from_stored_json(bytes).map_err(|_| bad("payload"))?;
    Ok(Event::from(EventParts {
        id: id.clone(),
        stream: stream.clone(),
        partition,
        sequence,
        timestamp,
        key,
        event_type,
        metadata,
        payload,
    }))
}

impl MongoBackend {
    /// Creates the reference's indexes (idempotent: an index of the same
    /// name and keys is left as it is) and records this crate's schema
    /// version, refusing a newer one.
    pub(super) async fn ensure_schema_impl(&self) -> Result<()> {
        for (coll, name, keys, unique) in indexes() {
            let model = IndexModel::builder()
                .keys(keys)
                .options(IndexOptions::builder().name(name.to_owned()).unique(unique.then_some(true)).build())
                .build();
            self.collection(coll).create_index(model).await.map_err(|e| {
                match map_err("ensure_schema", Phase::Safe, &e) {
                    unavailable @ Error::BackendUnavailable { .. } => unavailable,
                    _ => Error::failed(
                        "ensure_schema",
                        format!(
                            "mongo: cannot create index {name} on {}.{coll}: {e} \
                         (an index of that name with other keys, or a read-only user?)",
                            self.db.name()
                        ),
                    ),
                }
            })?;
        }
        let meta = self.collection(META);
        let found = meta
            .find_one_and_update(
                doc! { "_id": "schema_version" },
                doc! { "$setOnInsert": { "value": i64::from(SCHEMA_VERSION) } },
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await
            .map_err(|e| map_err("ensure_schema", Phase::Safe, &e))?;
        let version = found.as_ref().and_then(|d| get_u64(d, "value"));
        match version {
            Some(v) if v <= u64::from(SCHEMA_VERSION) => Ok(()),
            Some(v) => Err(Error::UnsupportedVersion {
                file: format!("mongo collection {}.{META}", self.db.name()).into(),
                found: u16::try_from(v).unwrap_or(u16::MAX),
                supported: SCHEMA_VERSION,
            }),
            None => Err(Error::failed(
                "ensure_schema",
                format!("mongo: {}.{META} holds a schema_version that is not a number", self.db.name()),
            )),
        }
    }

    /// A stream's partition count: `StreamNotFound` when there is none.
    pub(super) async fn partition_count(&self, stream: &str) -> Result<u32> {
        if let Some(&n) = self.partition_counts.read().get(stream) {
            return Ok(n);
        }
        let d = self
            .collection(STREAMS)
            .find_one(doc! { "name": stream })
            .await
            .map_err(|e| map_err("read", Phase::Safe, &e))?
            .ok_or_else(|| Error::stream_not_found(stream))?;
        let n =
            get_u64(&d, "partition_count").and_then(|n| u32::try_from(n).ok()).filter(|&n| n > 0).ok_or_else(|| {
                Error::failed("read", format!("mongo: stream {stream:?}: partition_count is missing or not valid"))
            })?;
        self.partition_counts.write().insert(stream.to_owned(), n);
        Ok(n)
    }

    pub(super) async fn create_stream_impl(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        opts.validate(stream)?;
        let fields: Vec<(String, &str)> =
            opts.indexes.iter().map(|f| Ok((check_index_field(stream, f)?, f.as_str()))).collect::<Result<Vec<_>>>()?;
        let created = self.now();
        let next: Document = (0..opts.partition_count).map(|p| (p.to_string(), Bson::Int64(0))).collect();
        let d = doc! {
            "name": stream,
            "partition_count": i64::from(opts.partition_count),
            "next_sequences": next,
            "created_at": DateTime::from_millis(created.as_millis()),
        };
        match self.collection(STREAMS).insert_one(d).await {
            Ok(_) => {}
            Err(e) if is_duplicate(&e) => {
                return Err(Error::AlreadyExists { kind: ObjectKind::Stream, name: stream.to_owned() });
            }
            Err(e) => return Err(map_err("create_stream", Phase::Commit, &e)),
        }
        self.partition_counts.write().insert(stream.to_owned(), opts.partition_count);
        if !opts.retention.is_unlimited() {
            self.store_retention(stream, &opts.retention).await?;
        }
        // Declared a millisecond apart, so they list in the order given.
        for (i, (canonical, spelling)) in fields.iter().enumerate() {
            let at = created.saturating_add(std::time::Duration::from_millis(i as u64));
            self.declare_index(stream, canonical, spelling, at).await?;
        }
        let indexes = self.declared_indexes(stream).await?.into_iter().map(|(_, s)| s).collect();
        Ok(StreamInfo::new(stream, opts.partition_count, indexes, vec![0; opts.partition_count as usize], created))
    }

    /// Appends a batch atomically: sequences and events in one transaction,
    /// run again when the server calls its failure transient.
    pub(super) async fn append_impl(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
        let count = self.partition_count(stream).await?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // Route and encode everything first: bad input writes nothing.
        let routed: Vec<u32> = events.iter().map(|e| route(stream, e, count)).collect::<Result<_>>()?;
        let mut per: BTreeMap<u32, u64> = BTreeMap::new();
        for &p in &routed {
            *per.entry(p).or_default() += 1;
        }
        let at = self.now();
        let batch = Batch { stream, events, routed: &routed, per: &per, at };
        // Every append writes the stream's document: appends of this handle
        // take the stream's turn (no group is named "") instead of aborting
        // each other.
        let _turn = self.turns.take(stream, "", "append").await?;
        super::in_tx!(self, "append", |s| self.append_in(s, &batch).await)
    }

    /// An append, inside its transaction.
    async fn append_in(
        &self,
        session: &mut mongodb::ClientSession,
        batch: &Batch<'_>,
    ) -> std::result::Result<Vec<Position>, TxFailure> {
        let Batch { stream, events, routed, per, at } = *batch;
        // Producer-given ids already stored (`_id` keeps every id forever):
        // those events write nothing and answer their original.
        let known = if events.iter().any(|e| e.id_given) {
            self.stored_ids(session, stream, events).await?
        } else {
            BTreeMap::new()
        };
        let plan = dedupe_plan(events, &known);
        let store = |p: &Plan| matches!(p, Plan::Store);
        if !plan.iter().all(store) {
            let (kept, kept_routes): (Vec<NewEvent>, Vec<u32>) = plan
                .iter()
                .zip(events.iter().zip(routed))
                .filter(|(p, _)| store(p))
                .map(|(_, (e, &r))| (e.clone(), r))
                .unzip();
            if kept.is_empty() {
                return resolve_plan(plan, &[]).map_err(TxFailure::Rheo);
            }
            let mut kept_per: BTreeMap<u32, u64> = BTreeMap::new();
            for &p in &kept_routes {
                *kept_per.entry(p).or_default() += 1;
            }
            let fresh = Batch { stream, events: &kept, routed: &kept_routes, per: &kept_per, at };
            let stored = Box::pin(self.append_in(session, &fresh)).await?;
            return resolve_plan(plan, &stored).map_err(TxFailure::Rheo);
        }
        // One update allocates every partition's range; the document's
        // write lock orders concurrent appenders.
        let inc: Document = per
            .iter()
            .map(|(p, n)| (format!("next_sequences.{p}"), Bson::Int64(i64::try_from(*n).unwrap_or(i64::MAX))))
            .collect();
        let after = self
            .collection(STREAMS)
            .find_one_and_update(doc! { "name": stream }, doc! { "$inc": inc })
            .return_document(ReturnDocument::After)
            .session(&mut *session)
            .await
            .map_err(txe("append"))?
            .ok_or_else(|| TxFailure::Rheo(Error::stream_not_found(stream)))?;
        let last = get_map(&after, "next_sequences");
        let mut next: BTreeMap<u32, u64> = BTreeMap::new();
        for (&p, &n) in per {
            let hi = last.get(&p).copied().ok_or_else(|| {
                TxFailure::Rheo(Error::failed(
                    "append",
                    format!("mongo: stream {stream:?}: no sequence for partition {p}"),
                ))
            })?;
            next.insert(p, hi + 1 - n);
        }
        let mut docs = Vec::with_capacity(events.len());
        let mut positions = Vec::with_capacity(events.len());
        for (e, &p) in events.iter().zip(routed) {
            let slot = next.entry(p).or_insert(1);
            let seq = *slot;
            *slot += 1;
            docs.push(event_doc(stream, e, p, seq, at).map_err(TxFailure::Rheo)?);
            positions.push(Position::new(p, seq, e.timestamp.unwrap_or(at)));
        }
        match self.collection(EVENTS).insert_many(docs).session(&mut *session).await {
            Ok(_) => {}
            // An id stored by a concurrent append since the check: run the
            // transaction again, and it is answered as a duplicate.
            Err(e) if is_duplicate(&e) => return Err(TxFailure::Raced("append: an event id was stored concurrently")),
            Err(e) => return Err(txe("append")(e)),
        }
        Ok(positions)
    }

    /// The stored position of each producer-given id of `events` already
    /// stored, read in the append's transaction. An id stored in another
    /// stream is an error (ids are unique across the database).
    async fn stored_ids(
        &self,
        session: &mut mongodb::ClientSession,
        stream: &str,
        events: &[NewEvent],
    ) -> std::result::Result<BTreeMap<String, Position>, TxFailure> {
        let ids: Vec<&str> = events.iter().filter(|e| e.id_given).map(|e| e.id.as_str()).collect();
        let mut cursor = self
            .collection(EVENTS)
            .find(doc! { "_id": { "$in": ids } })
            .projection(doc! { "stream": 1, "partition": 1, "sequence": 1, "timestamp": 1 })
            .session(&mut *session)
            .await
            .map_err(txe("append"))?;
        let mut out = BTreeMap::new();
        while let Some(d) = cursor.next(&mut *session).await {
            let d = d.map_err(txe("append"))?;
            let id = d.get_str("_id").unwrap_or_default().to_owned();
            let owner = d.get_str("stream").unwrap_or_default();
            if owner != stream {
                return Err(TxFailure::Rheo(Error::invalid(
                    "id",
                    format!(
                        "stream {stream:?}: id {id:?} is already used by an event of stream {owner:?} (ids are unique across the database)"
                    ),
                )));
            }
            let bad = |what: &str| {
                TxFailure::Rheo(Error::failed(
                    "append",
                    format!("mongo: stream {stream:?}: stored event {id:?} has no valid {what}"),
                ))
            };
            let int = |k: &str| d.get_i64(k).ok().or_else(|| d.get_i32(k).ok().map(i64::from));
            let partition = int("partition").and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad("partition"))?;
            let sequence = int("sequence").and_then(|n| u64::try_from(n).ok()).ok_or_else(|| bad("sequence"))?;
            let ts = d.get_datetime("timestamp").map_err(|_| bad("timestamp"))?;
            out.insert(id, Position::duplicate_of(partition, sequence, Timestamp::from_millis(ts.timestamp_millis())));
        }
        Ok(out)
    }

    pub(super) async fn read_impl(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        let count = self.partition_count(stream).await?;
        check_partitions(stream, &[partition], count)?;
        let filter = doc! {
            "stream": stream,
            "partition": i64::from(partition),
            "sequence": { "$gt": i64::try_from(after).unwrap_or(i64::MAX) },
        };
        let docs: Vec<Document> = self
            .collection(EVENTS)
            .find(filter)
            .sort(doc! { "sequence": 1 })
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .await
            .map_err(|e| map_err("read", Phase::Safe, &e))?
            .try_collect()
            .await
            .map_err(|e| map_err("read", Phase::Safe, &e))?;
        let name: Arc<str> = Arc::from(stream);
        docs.into_iter().map(|d| decode_event(&name, d)).collect()
    }

    /// Every stream, by name in byte order.
    pub(super) async fn list_streams_impl(&self) -> Result<Vec<StreamInfo>> {
        let docs: Vec<Document> = self
            .collection(STREAMS)
            .find(doc! {})
            .await
            .map_err(|e| map_err("list_streams", Phase::Safe, &e))?
            .try_collect()
            .await
            .map_err(|e| map_err("list_streams", Phase::Safe, &e))?;
        let mut out = Vec::with_capacity(docs.len());
        for d in docs {
            let Ok(name) = d.get_str("name") else { continue };
            let count = get_u64(&d, "partition_count").and_then(|n| u32::try_from(n).ok()).unwrap_or(1);
            let hws = get_map(&d, "next_sequences");
            let created_at = match d.get("created_at") {
                Some(Bson::DateTime(t)) => Timestamp::from_millis(t.timestamp_millis()),
                _ => Timestamp::from_millis(0),
            };
            out.push(StreamInfo::new(
                name,
                count,
                self.declared_indexes(name).await?.into_iter().map(|(_, s)| s).collect(),
                (0..count).map(|p| hws.get(&p).copied().unwrap_or(0)).collect(),
                created_at,
            ));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// A batch to append, routed.
#[derive(Clone, Copy)]
struct Batch<'a> {
    stream: &'a str,
    events: &'a [NewEvent],
    routed: &'a [u32],
    per: &'a BTreeMap<u32, u64>,
    at: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_survives_bson_exactly() {
        let v = json!({"n": 1, "big": 9_007_199_254_740_993_i64, "f": 1.5, "whole_float": 2.0, "s": "x",
                       "a": [1, "1", null, {"$date": "not an extended-json date"}], "t": true, "neg": -3});
        let b = to_bson(&v, &mut Vec::new()).expect("to bson");
        assert_eq!(to_json(b), v);
        assert!(matches!(to_bson(&json!(1), &mut Vec::new()), Ok(Bson::Int64(1))));
        assert!(matches!(to_bson(&json!(2.0), &mut Vec::new()), Ok(Bson::Double(_))));
    }

    #[test]
    fn integers_bson_cannot_hold_are_refused_by_path() {
        let e = to_bson(&json!({"a": {"b": [0, u64::MAX]}}), &mut Vec::new()).expect_err("u64::MAX");
        assert!(e.to_string().contains("\"a.b.1\"") && e.to_string().contains("2^63"), "{e}");
    }

    #[test]
    fn reference_integers_read_as_int32_or_int64() {
        let d = doc! {"a": 7_i32, "b": 8_i64, "c": -1_i32, "m": {"0": 3_i32, "1": 4_i64, "x": 1}};
        assert_eq!((get_u64(&d, "a"), get_u64(&d, "b"), get_u64(&d, "c")), (Some(7), Some(8), None));
        assert_eq!(get_map(&d, "m"), BTreeMap::from([(0, 3), (1, 4)]));
    }
}
