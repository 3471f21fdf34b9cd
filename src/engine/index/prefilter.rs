//! A query's filters checked on a record's undecoded MessagePack document,
//! so that a scan builds events only for the records that can match.
//!
//! The check is one-sided: it turns a record down only when the full check
//! ([`Query::matches`]) would turn it down too, and says "maybe" whenever it
//! cannot tell (a filter on `partition`/`sequence`/`timestamp`/`stream`, an
//! array or object on either side of a comparison). Records it lets through
//! are decoded and checked in full, so the page is exactly what it would be
//! without it; `prefilter_agrees_with_the_full_check` holds it to that.

use std::cmp::Ordering;

use serde_json::Value;

use super::extract::{DocParts, FieldPath};
use super::term::canonical;
use crate::model::query::{Op, Query};
use crate::msgpack::Scalar;

/// The filters of a query that can be checked on raw documents.
#[derive(Debug)]
pub struct Prefilter<'q> {
    checks: Vec<(FieldPath, &'q Op)>,
}

impl<'q> Prefilter<'q> {
    /// The checkable filters of `q`; `None` when there are none.
    pub fn new(q: &'q Query) -> Option<Prefilter<'q>> {
        let checks: Vec<(FieldPath, &Op)> =
            q.filters.iter().filter_map(|f| canonical(&f.path).map(|c| (FieldPath::parse(&c), &f.op))).collect();
        (!checks.is_empty()).then_some(Prefilter { checks })
    }

    /// False when the document certainly fails a filter; true when it may
    /// pass them all (or is not a document this module can read).
    pub fn may_match(&self, doc: &[u8]) -> bool {
        let Some(parts) = DocParts::split(doc) else { return true };
        self.checks.iter().all(|(field, op)| verdict(parts.get(field), op) != Some(false))
    }
}

/// What a filter says of a field's raw value: `None` when only the decoded
/// value can tell.
fn verdict(field: Option<Scalar<'_>>, op: &Op) -> Option<bool> {
    let Some(field) = field else {
        // Absent: only `exists: false` matches (every comparison fails).
        return Some(matches!(op, Op::Exists(false)));
    };
    let is = |v: &Value, want: fn(Ordering) -> bool| Some(compare(&field, v)?.is_some_and(want));
    match op {
        Op::Exists(want) => Some(*want),
        Op::Eq(v) => is(v, Ordering::is_eq),
        Op::Gt(v) => is(v, Ordering::is_gt),
        Op::Gte(v) => is(v, Ordering::is_ge),
        Op::Lt(v) => is(v, Ordering::is_lt),
        Op::Lte(v) => is(v, Ordering::is_le),
        Op::In(vs) => {
            let mut any_unknown = false;
            for v in vs {
                match is(v, Ordering::is_eq) {
                    Some(true) => return Some(true),
                    Some(false) => {}
                    None => any_unknown = true,
                }
            }
            if any_unknown { None } else { Some(false) }
        }
    }
}

/// [`compare_values`](crate::model::query::compare_values) of a raw scalar
/// with a query value: `None` when undecidable here (an array or object),
/// `Some(None)` when the types do not compare.
fn compare(a: &Scalar<'_>, b: &Value) -> Option<Option<Ordering>> {
    Some(match (a, b) {
        (Scalar::Other, _) | (_, Value::Array(_) | Value::Object(_)) => return None,
        (Scalar::Int(i), Value::Number(n)) => match n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from)) {
            Some(j) => Some(i.cmp(&j)),
            #[allow(clippy::cast_precision_loss)] // compare_values compares through f64 the same way
            None => (*i as f64).partial_cmp(&n.as_f64()?),
        },
        (Scalar::Float(f), Value::Number(n)) => f.partial_cmp(&n.as_f64()?),
        (Scalar::Str(s), Value::String(t)) => Some((*s).cmp(t.as_bytes())),
        (Scalar::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Scalar::Null, Value::Null) => Some(Ordering::Equal),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::segment::record::DocRef;
    use crate::model::append::{AppendOptions, NewEvent};
    use crate::model::payload::Payload;
    use crate::model::time::Timestamp;
    use serde_json::json;
    use std::sync::Arc;

    #[test]
    fn prefilter_agrees_with_the_full_check() {
        let payloads = [
            json!({"n": 1, "f": 1.5, "s": "b", "t": true, "z": null, "o": {"a": 1}, "arr": [1, 2], "big": u64::MAX}),
            json!({"n": 1.0, "f": -2, "s": "a", "t": false, "o": [1], "arr": {"0": 1}, "big": -1}),
            json!({"n": "1", "s": 2, "z": 0}),
            json!([{"n": 3}, "x"]),
            json!("scalar payload"),
        ];
        let values = [
            json!(1),
            json!(1.0),
            json!(1.5),
            json!(-2),
            json!("a"),
            json!("b"),
            json!("1"),
            json!(true),
            json!(null),
            json!(u64::MAX),
            json!(i64::MIN),
            json!({"a": 1}),
            json!([1, 2]),
            json!(1e300),
        ];
        let paths = ["n", "f", "s", "t", "z", "o", "o.a", "arr", "arr.0", "big", "0.n", "1", "missing", "key", "type"];
        let paths = paths.iter().copied().chain(["id", "correlation_id", "metadata.x", "sequence", "partition"]);
        let mut queries = Vec::new();
        for p in paths {
            for v in &values {
                for op in [
                    Op::Eq(v.clone()),
                    Op::Gt(v.clone()),
                    Op::Gte(v.clone()),
                    Op::Lt(v.clone()),
                    Op::Lte(v.clone()),
                    Op::In(vec![v.clone(), json!("b")]),
                ] {
                    queries.push(Query::new("s").filter(p, op));
                }
            }
            queries.push(Query::new("s").exists(p));
            queries.push(Query::new("s").missing(p));
        }
        let stream: Arc<str> = Arc::from("s");
        let (mut turned_down, mut checked) = (0, 0);
        for (i, payload) in payloads.iter().enumerate() {
            let opts =
                if i % 2 == 0 { AppendOptions::new().key("k").correlation_id("c") } else { AppendOptions::new() };
            let mut e = NewEvent::prepare(Payload::from_value(payload), opts);
            if i == 0 {
                e.event_type = Some("b".into());
            }
            let mut doc = Vec::new();
            DocRef(&e.id, e.key.as_deref(), e.event_type.as_deref(), &e.metadata, e.payload.as_bytes())
                .write(&mut doc)
                .expect("encode");
            let event = e.into_event(&stream, 0, 1, Timestamp::from_millis(0));
            for q in &queries {
                let full = q.matches(&event);
                let pre = Prefilter::new(q).is_none_or(|f| f.may_match(&doc));
                assert!(pre || !full, "the prefilter turned down a match: {:?} on {payload}", q.filters);
                turned_down += usize::from(!pre);
                checked += usize::from(!full);
            }
        }
        // It must decide most non-matches, or it saves nothing. What it leaves
        // to the full check here: the `sequence`/`partition` paths and the
        // array and object values (4 of 20 paths' and 2 of 14 values' cases).
        assert!(turned_down * 4 >= checked * 3, "turned down {turned_down} of {checked} non-matches");
    }
}
