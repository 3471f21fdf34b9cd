//! History queries on MongoDB, and payload indexes.
//!
//! A query becomes one `find` per batch: MongoDB compares values by type
//! (`1` never equals `"1"`, a range on numbers never matches a string), so
//! most filters narrow exactly on the server. Where MongoDB's reading of a
//! path differs from the crate's (it looks into arrays; objects compare in
//! field order; a float beside a large integer) the filter selects a
//! superset or nothing is sent for it, and every document is checked
//! again by [`Query::matches`] before it is paged: results and cursors are
//! those of every other backend. Paging is keyset on the query's order.

use std::sync::Arc;

use mongodb::IndexModel;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::IndexOptions;
use serde_json::Value;

use super::streams::decode_event;
use super::{EVENTS, MongoBackend, STREAM_INDEXES, is_duplicate, map_err};
use crate::error::{Error, Result};
use crate::model::path::LINEAGE_FIELDS;
use crate::model::query::{ALWAYS_INDEXED, Filter, Op, OrderBy, Page, Query, check_index_field};
use crate::model::stream::{IndexStatus, MAX_INDEXES};

/// The most values of an `in` filter sent to the server (beyond: checked
/// here).
const IN_MAX: usize = 256;
/// Integers beyond ±2^53 are compared as floats by the crate's rules
/// when the other side is a float: such values are not sent.
const EXACT_INT: i64 = 1 << 53;

/// A filter that matches nothing (every document has an `_id`).
fn nothing() -> Document {
    doc! { "_id": { "$exists": false } }
}

/// What a query path reads in an event document.
enum Target {
    /// A text field of the document (`_id`, `key`, `type`).
    Text(&'static str),
    /// An integer field (`partition`, `sequence`).
    Int(&'static str),
    /// The BSON date `timestamp`.
    Time,
    /// A path into `payload` or `metadata` (None: not expressible).
    Json(Option<String>),
    /// Matches every document of the stream (`stream`).
    Anything,
}

/// A dotted path MongoDB reads as the crate does (no empty segment, none
/// starting with `$`).
fn mongo_path(prefix: &str, rest: &str) -> Option<String> {
    // MongoDB reads a segment as an array position only when it is the
    // plain number; the crate also reads `01` or `+1` as one.
    let plain = |s: &str| s.parse::<usize>().is_err() || s.parse::<usize>().is_ok_and(|n| n.to_string() == s);
    let ok = rest.split('.').all(|s| !s.is_empty() && !s.starts_with('$') && !s.contains('\0') && plain(s));
    ok.then(|| format!("{prefix}.{rest}"))
}

fn target(path: &str) -> Target {
    match path {
        "id" => Target::Text("_id"),
        "key" => Target::Text("key"),
        "type" => Target::Text("type"),
        "partition" => Target::Int("partition"),
        "sequence" => Target::Int("sequence"),
        "timestamp" => Target::Time,
        "stream" => Target::Anything,
        p if LINEAGE_FIELDS.contains(&p) => Target::Json(mongo_path("metadata", p)),
        p => match p.strip_prefix("metadata.") {
            Some(rest) => Target::Json(mongo_path("metadata", rest)),
            None => Target::Json(mongo_path("payload", p.strip_prefix("payload.").unwrap_or(p))),
        },
    }
}

/// A scalar as BSON, when MongoDB compares it as the crate does.
fn scalar(v: &Value) -> Option<Bson> {
    match v {
        Value::Null => Some(Bson::Null),
        Value::Bool(b) => Some(Bson::Boolean(*b)),
        Value::String(s) => Some(Bson::String(s.clone())),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) if (-EXACT_INT..=EXACT_INT).contains(&i) => Some(Bson::Int64(i)),
            (None, Some(f)) if n.is_f64() && f.abs() <= 9.0e15 => Some(Bson::Double(f)),
            _ => None,
        },
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// The server-side part of one filter (None: checked here only).
fn filter_doc(f: &Filter) -> Option<Document> {
    let t = target(&f.path);
    let cmp = |op: &str, v: &Value| compare(&t, op, v);
    match &f.op {
        Op::Eq(v) => cmp("$eq", v),
        Op::Gt(v) => cmp("$gt", v),
        Op::Gte(v) => cmp("$gte", v),
        Op::Lt(v) => cmp("$lt", v),
        Op::Lte(v) => cmp("$lte", v),
        Op::In(vs) if vs.is_empty() => Some(nothing()),
        Op::In(vs) if vs.len() > IN_MAX => None,
        Op::In(vs) => {
            let parts: Option<Vec<Document>> = vs.iter().map(|v| cmp("$eq", v)).collect();
            parts.map(|p| doc! { "$or": p })
        }
        // MongoDB's `$exists` looks into arrays, where the crate's paths
        // do not: only "present" narrows (to a superset).
        Op::Exists(true) => match t {
            Target::Text(field) => Some(doc! { field: { "$ne": Bson::Null } }),
            Target::Json(Some(path)) => Some(doc! { path: { "$exists": true } }),
            _ => None,
        },
        Op::Exists(false) => match t {
            Target::Text(field) => Some(doc! { field: Bson::Null }),
            Target::Int(_) | Target::Time => Some(nothing()),
            _ => None,
        },
    }
}

/// One comparison `op` (`$eq`, `$gt`...) of a target with a value.
fn compare(t: &Target, op: &str, v: &Value) -> Option<Document> {
    match t {
        Target::Anything => None,
        Target::Text(field) => match v {
            // Strings compare bytewise on the server too (binary collation).
            Value::String(s) => Some(doc! { *field: { op: s.as_str() } }),
            _ => Some(nothing()),
        },
        Target::Int(field) => match v {
            Value::Number(_) => scalar(v).map(|b| doc! { *field: { op: b } }),
            _ => Some(nothing()),
        },
        Target::Time => match v {
            Value::Number(n) => {
                let ms = n.as_i64()?;
                let at = Bson::DateTime(mongodb::bson::DateTime::from_millis(ms));
                let next = Bson::DateTime(mongodb::bson::DateTime::from_millis(ms.saturating_add(1)));
                Some(match op {
                    "$eq" => doc! { "timestamp": { "$gte": at, "$lt": next } },
                    "$gt" => doc! { "timestamp": { "$gte": next } },
                    "$gte" => doc! { "timestamp": { "$gte": at } },
                    "$lt" => doc! { "timestamp": { "$lt": at } },
                    _ => doc! { "timestamp": { "$lt": next } },
                })
            }
            _ => Some(nothing()),
        },
        Target::Json(path) => {
            let path = path.as_ref()?;
            match (op, v) {
                // `{f: null}` also matches a missing field: a superset.
                ("$eq" | "$gte" | "$lte", Value::Null) => Some(doc! { path: Bson::Null }),
                (_, Value::Null) => Some(nothing()),
                _ => scalar(v).map(|b| doc! { path: { op: b } }),
            }
        }
    }
}

/// The sort fields of an order.
fn order_fields(order: OrderBy) -> [&'static str; 3] {
    match order {
        OrderBy::Sequence => ["sequence", "partition", "_id"],
        OrderBy::Timestamp => ["timestamp", "partition", "sequence"],
        OrderBy::Partition => ["partition", "sequence", "_id"],
    }
}

/// The keyset condition "after `key`" in the query's direction.
fn after(order: OrderBy, descending: bool, key: (i64, u64, u64)) -> Document {
    let int = |n: u64| Bson::Int64(i64::try_from(n).unwrap_or(i64::MAX));
    let values: Vec<(&str, Bson)> = match order {
        OrderBy::Sequence => vec![("sequence", int(key.1)), ("partition", int(key.2))],
        OrderBy::Timestamp => vec![
            ("timestamp", Bson::DateTime(mongodb::bson::DateTime::from_millis(key.0))),
            ("partition", int(key.1)),
            ("sequence", int(key.2)),
        ],
        OrderBy::Partition => vec![("partition", int(key.1)), ("sequence", int(key.2))],
    };
    let op = if descending { "$lt" } else { "$gt" };
    let mut ors = Vec::new();
    let mut equal = Document::new();
    for (field, v) in values {
        let mut d = equal.clone();
        d.insert(field, doc! { op: v.clone() });
        ors.push(d);
        equal.insert(field, v);
    }
    doc! { "$or": ors }
}

/// The name of the MongoDB index of a canonical field.
fn index_name(canonical: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("rheo_events_ix_{h:016x}")
}

/// The MongoDB path a canonical field is indexed under (None: a path
/// MongoDB can't name, which queries check here).
fn index_path(canonical: &str) -> Option<String> {
    match target(canonical) {
        Target::Json(p) => p,
        _ => None,
    }
}

impl MongoBackend {
    pub(super) async fn query_impl(&self, q: &Query) -> Result<Page> {
        let name: Arc<str> = Arc::from(q.stream.as_str());
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let dir = if q.descending { -1 } else { 1 };
        let sort: Document = order_fields(q.order_by).iter().map(|f| ((*f).to_owned(), Bson::Int32(dir))).collect();
        let sort = &sort;
        let count = self.partition_count(&q.stream);
        crate::backends::common::keyset_query(q, count, |b| {
            let mut all = vec![doc! { "stream": q.stream.as_str() }];
            let floor = q.after_sequence.unwrap_or(0);
            if q.after_sequences.is_empty() {
                if !b.every_partition {
                    let ps: Vec<i64> = b.parts.iter().map(|&p| i64::from(p)).collect();
                    all.push(doc! { "partition": { "$in": ps } });
                }
                if floor > 0 {
                    all.push(doc! { "sequence": { "$gt": int(floor) } });
                }
            } else {
                let per: Vec<Document> = b
                    .parts
                    .iter()
                    .map(|&p| {
                        let lo = q.after_sequences.get(&p).copied().unwrap_or(0).max(floor);
                        doc! { "partition": i64::from(p), "sequence": { "$gt": int(lo) } }
                    })
                    .collect();
                all.push(doc! { "$or": per });
            }
            if let Some(u) = q.until_sequence {
                all.push(doc! { "sequence": { "$lte": int(u) } });
            }
            if let Some(t) = q.from {
                all.push(doc! { "timestamp": { "$gte": mongodb::bson::DateTime::from_millis(t.as_millis()) } });
            }
            if let Some(t) = q.to {
                let next = mongodb::bson::DateTime::from_millis(t.as_millis().saturating_add(1));
                all.push(doc! { "timestamp": { "$lt": next } });
            }
            all.extend(q.filters.iter().filter_map(filter_doc));
            if let Some(key) = b.after {
                all.push(after(q.order_by, q.descending, key));
            }
            let (name, limit) = (name.clone(), int(b.limit as u64));
            async move {
                let docs = self
                    .find_docs(EVENTS, doc! { "$and": all }, sort.clone(), limit)
                    .await
                    .map_err(|e| map_err("query", super::Phase::Safe, &e))?;
                docs.into_iter().map(|d| decode_event(&name, d)).collect()
            }
        })
        .await
    }

    async fn find_docs(
        &self,
        coll: &str,
        filter: Document,
        sort: Document,
        limit: i64,
    ) -> std::result::Result<Vec<Document>, mongodb::error::Error> {
        use futures::TryStreamExt;
        self.collection(coll).find(filter).sort(sort).limit(limit).await?.try_collect().await
    }

    /// The fields declared for indexing on `stream`: (canonical, as first
    /// spelled), in the order they were declared.
    pub(super) async fn declared_indexes(&self, stream: &str) -> Result<Vec<(String, String)>> {
        use futures::TryStreamExt;
        let docs: Vec<Document> = self
            .collection(STREAM_INDEXES)
            .find(doc! { "stream": stream })
            .sort(doc! { "created_at": 1, "field": 1 })
            .await
            .map_err(|e| map_err("index_status", super::Phase::Safe, &e))?
            .try_collect()
            .await
            .map_err(|e| map_err("index_status", super::Phase::Safe, &e))?;
        Ok(docs
            .iter()
            .filter_map(|d| {
                let field = d.get_str("field").ok()?.to_owned();
                let spelling = d.get_str("spelling").map_or_else(|_| field.clone(), str::to_owned);
                Some((field, spelling))
            })
            .collect())
    }

    /// Declares `field` for indexing on `stream` and builds its MongoDB
    /// index (`{stream: 1, <path>: 1}`, one per field for every stream
    /// that declares it). MongoDB builds it before it answers, so it is
    /// ready when this returns.
    pub(super) async fn create_index_impl(&self, stream: &str, field: &str) -> Result<()> {
        let canonical = check_index_field(stream, field)?;
        self.partition_count(stream).await?;
        self.declare_index(stream, &canonical, field, self.now()).await
    }

    /// Declares one canonical field (idempotent; `spelling` is how it was
    /// asked for, which `list_streams` gives back) and builds its index.
    pub(super) async fn declare_index(
        &self,
        stream: &str,
        canonical: &str,
        spelling: &str,
        at: crate::model::time::Timestamp,
    ) -> Result<()> {
        if ALWAYS_INDEXED.contains(&canonical) {
            return Ok(());
        }
        let declared = self.declared_indexes(stream).await?;
        if !declared.iter().any(|(f, _)| f == canonical) {
            if declared.len() >= MAX_INDEXES {
                return Err(Error::invalid(
                    "indexes",
                    format!("stream {stream:?} has {MAX_INDEXES} indexes, the maximum"),
                ));
            }
            let d = doc! {
                "stream": stream,
                "field": canonical,
                "spelling": spelling,
                "created_at": mongodb::bson::DateTime::from_millis(at.as_millis()),
            };
            match self.collection(STREAM_INDEXES).insert_one(d).await {
                Ok(_) => {}
                Err(e) if is_duplicate(&e) => {}
                Err(e) => return Err(map_err("create_index", super::Phase::Commit, &e)),
            }
        }
        let Some(path) = index_path(canonical) else { return Ok(()) };
        let model = IndexModel::builder()
            .keys(doc! { "stream": 1, path: 1 })
            .options(IndexOptions::builder().name(index_name(canonical)).build())
            .build();
        self.collection(EVENTS).create_index(model).await.map_err(|e| {
            Error::failed(
                "create_index",
                format!("mongo: stream {stream:?}: cannot build the index of {canonical:?}: {}", super::describe(&e)),
            )
        })?;
        Ok(())
    }

    pub(super) async fn index_status_impl(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        self.partition_count(stream).await?;
        let declared: Vec<String> = self.declared_indexes(stream).await?.into_iter().map(|(f, _)| f).collect();
        let built: std::collections::BTreeSet<String> = self
            .collection(EVENTS)
            .list_index_names()
            .await
            .map_err(|e| map_err("index_status", super::Phase::Safe, &e))?
            .into_iter()
            .collect();
        let mut fields: Vec<String> = ALWAYS_INDEXED.iter().map(|f| (*f).to_owned()).collect();
        fields.extend(declared.iter().cloned());
        fields.sort();
        fields.dedup();
        Ok(fields
            .into_iter()
            .map(|field| {
                let ready = ALWAYS_INDEXED.contains(&field.as_str())
                    || index_path(&field).is_none()
                    || built.contains(&index_name(&field));
                IndexStatus { field, segments_ready: u64::from(ready), segments_total: 1, segments_failed: 0 }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::mongo::streams::to_bson;
    use serde_json::json;

    #[test]
    fn filters_narrow_by_type_and_leave_the_rest_to_the_crate() {
        let f = |path: &str, op: Op| filter_doc(&Filter { path: path.into(), op });
        assert_eq!(f("amount", Op::Eq(json!(1))), Some(doc! { "payload.amount": { "$eq": 1_i64 } }));
        assert_eq!(f("amount", Op::Gt(json!("1"))), Some(doc! { "payload.amount": { "$gt": "1" } }));
        assert_eq!(f("metadata.x.y", Op::Lt(json!(2.5))), Some(doc! { "metadata.x.y": { "$lt": 2.5 } }));
        // Objects and arrays compare in field order on the server; large
        // integers beside floats differ: left to the crate.
        assert_eq!(f("a", Op::Eq(json!({"b": 1}))), None);
        assert_eq!(f("a", Op::Eq(json!(9_007_199_254_740_993_i64))), None);
        assert_eq!(f("a.$b", Op::Eq(json!(1))), None);
        assert_eq!(f("a.01", Op::Eq(json!(1))), None, "MongoDB reads 01 as a key, the crate as position 1");
        assert_eq!(f("a.1", Op::Eq(json!(1))), Some(doc! { "payload.a.1": { "$eq": 1_i64 } }));
        assert_eq!(f("a", Op::Exists(false)), None);
        assert_eq!(f("key", Op::Eq(json!(1))), Some(nothing()), "a key is text");
        assert_eq!(f("partition", Op::Eq(json!("0"))), Some(nothing()));
        assert_eq!(f("a", Op::In(vec![])), Some(nothing()));
        assert_eq!(f("stream", Op::Eq(json!("x"))), None);
    }

    #[test]
    fn keyset_after_is_lexicographic() {
        let d = after(OrderBy::Partition, false, (0, 2, 7));
        assert_eq!(
            d,
            doc! { "$or": [{ "partition": { "$gt": 2_i64 } }, { "partition": 2_i64, "sequence": { "$gt": 7_i64 } }] }
        );
        let d = after(OrderBy::Sequence, true, (0, 5, 1));
        assert_eq!(
            d,
            doc! { "$or": [{ "sequence": { "$lt": 5_i64 } }, { "sequence": 5_i64, "partition": { "$lt": 1_i64 } }] }
        );
    }

    #[test]
    fn values_as_bson_keep_their_type() {
        assert!(matches!(to_bson(&json!(1), &mut Vec::new()), Ok(Bson::Int64(1))));
        assert_eq!(scalar(&json!("1")), Some(Bson::String("1".into())));
        assert_eq!(index_path("amount"), Some("payload.amount".into()));
        assert_eq!(index_path("metadata.tenant"), Some("metadata.tenant".into()));
        assert_eq!(index_name("amount"), index_name("amount"));
        assert_ne!(index_name("amount"), index_name("amounts"));
    }
}
