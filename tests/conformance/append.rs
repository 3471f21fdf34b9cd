//! Append: how an event is built from its payload and options, ids,
//! timestamps, the size limit and typed payloads.

use std::sync::Arc;

use rheo::{AppendOptions, DEFAULT_MAX_EVENT_BYTES, Error, Lineage, Rheo, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::common::{Fixture, START};
use crate::support::*;

/// `type` is taken from the payload's `"type"` field; no field, no type.
pub async fn append_takes_type_from_payload_type_field(f: Fixture) {
    stream(&f, 1).await;
    let typed = f.rheo.append(S, &json!({"type": "order_placed", "n": 1}), AppendOptions::new()).await.expect("append");
    assert_eq!(typed.event_type(), Some("order_placed"));
    let untyped = f.rheo.append(S, &json!({"kind": "order_placed"}), AppendOptions::new()).await.expect("append");
    assert_eq!(untyped.event_type(), None);
    let stored = f.rheo.read(S, 0, 0, 10).await.expect("read");
    assert_eq!(stored[0].event_type(), Some("order_placed"));
    assert_eq!(stored[1].event_type(), None);
}

/// `key` comes from the option when given, and the option wins over the payload's `"key"`.
pub async fn append_key_option_wins_over_payload_key(f: Fixture) {
    stream(&f, 1).await;
    let e = f
        .rheo
        .append(S, &json!({"key": "from-payload"}), AppendOptions::new().key("from-option"))
        .await
        .expect("append");
    assert_eq!(e.key(), Some("from-option"));
    assert_eq!(e.payload().json().expect("json")["key"], json!("from-payload"), "the payload is not rewritten");
    let stored = f.rheo.read(S, 0, 0, 1).await.expect("read");
    assert_eq!(stored[0].key(), Some("from-option"));
}

/// Without a key option, `key` is the payload's `"key"`; with neither, there is no key.
pub async fn append_key_falls_back_to_payload_key(f: Fixture) {
    stream(&f, 1).await;
    let e = f.rheo.append(S, &json!({"key": "customer-7"}), AppendOptions::new()).await.expect("append");
    assert_eq!(e.key(), Some("customer-7"));
    let none = f.rheo.append(S, &json!({"n": 1}), AppendOptions::new()).await.expect("append");
    assert_eq!(none.key(), None);
}

/// Metadata = option metadata merged with the payload's `"metadata"`; the payload wins.
pub async fn append_metadata_merges_option_and_payload_payload_wins(f: Fixture) {
    stream(&f, 1).await;
    let payload = json!({"type": "t", "metadata": {"region": "eu", "source": "payload"}});
    let opts = AppendOptions::new().metadata("source", "option").metadata("tenant", "acme");
    let e = f.rheo.append(S, &payload, opts).await.expect("append");
    assert_eq!(e.metadata().get("region"), Some(&json!("eu")));
    assert_eq!(e.metadata().get("tenant"), Some(&json!("acme")));
    assert_eq!(e.metadata().get("source"), Some(&json!("payload")), "the payload's metadata wins");
    assert_eq!(e.metadata().len(), 3);
    let stored = f.rheo.read(S, 0, 0, 1).await.expect("read");
    assert_eq!(stored[0].metadata(), e.metadata());
}

/// The payload is stored with all its fields, including `type`, `key` and `metadata`.
pub async fn append_payload_keeps_all_fields(f: Fixture) {
    stream(&f, 1).await;
    let payload = json!({
        "type": "order_placed", "key": "c-1", "metadata": {"a": 1},
        "total": 12.5, "lines": [{"sku": "x", "qty": 2}], "paid": false, "note": null,
    });
    let e = f.rheo.append(S, &payload, AppendOptions::new().metadata("b", 2)).await.expect("append");
    assert_eq!(e.payload(), payload);
    assert_eq!(f.rheo.read(S, 0, 0, 1).await.expect("read")[0].payload(), payload);
}

/// Generated ids are unique, time-ordered UUIDv7s.
pub async fn generated_ids_are_unique_time_ordered_uuid_v7(f: Fixture) {
    stream(&f, 2).await;
    let mut events = Vec::new();
    for i in 0..20 {
        events.push(f.rheo.append(S, &json!({"n": i}), AppendOptions::new()).await.expect("append"));
    }
    events.extend(f.rheo.append_batch(S, (0..20).map(|i| json!({"n": i}))).await.expect("batch"));
    for e in &events {
        let id = uuid::Uuid::parse_str(e.id()).unwrap_or_else(|err| panic!("id {:?} is not a UUID: {err}", e.id()));
        assert_eq!(id.get_version_num(), 7, "id {} is not a UUIDv7", e.id());
    }
    assert_unique(events.iter().map(|e| e.id().to_owned()));
    let ids: Vec<&str> = events.iter().map(|e| e.id()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted, "ids generated one after another sort in generation order");
}

/// An explicit id and timestamp are kept as given, to the millisecond.
pub async fn explicit_id_and_timestamp_are_kept(f: Fixture) {
    stream(&f, 1).await;
    let when = Timestamp::from_millis(START.as_millis() - 3_600_123);
    let e = f
        .rheo
        .append(S, &json!({"n": 1}), AppendOptions::new().id("order-42-placed").timestamp(when))
        .await
        .expect("append");
    assert_eq!(e.id(), "order-42-placed");
    assert_eq!(e.timestamp(), when);
    let stored = f.rheo.read(S, 0, 0, 1).await.expect("read");
    assert_eq!((stored[0].id(), stored[0].timestamp()), ("order-42-placed", when));
}

/// Without an explicit timestamp an event is stamped with the backend clock.
pub async fn default_timestamp_is_the_backend_clock(f: Fixture) {
    stream(&f, 1).await;
    let first = append_then_wait(&f, 0, 5).await;
    let second = append_then_wait(&f, 0, 0).await;
    assert_eq!(first.timestamp(), START);
    assert_eq!(second.timestamp(), at(5));
}

/// An event over the 1 MiB default is `EventTooLarge` and nothing is written.
pub async fn event_over_max_size_is_event_too_large_and_nothing_written(f: Fixture) {
    stream(&f, 1).await;
    let huge = json!({"blob": "x".repeat(DEFAULT_MAX_EVENT_BYTES)});
    let e = assert_err!(
        f.rheo.append(S, &huge, AppendOptions::new()).await,
        Error::EventTooLarge { ref stream, size_bytes, max_bytes }
            if stream == S && max_bytes == DEFAULT_MAX_EVENT_BYTES && size_bytes > max_bytes
    );
    assert_mentions(&e, &[S, &DEFAULT_MAX_EVENT_BYTES.to_string()]);
    assert!(f.rheo.read(S, 0, 0, 10).await.expect("read").is_empty());
    assert_eq!(f.rheo.list_streams().await.expect("list")[0].high_watermarks, vec![0]);
    let next = f.rheo.append(S, &json!({"n": 1}), AppendOptions::new()).await.expect("append");
    assert_eq!(next.sequence(), 1, "the rejected event used no sequence");
}

/// One oversized event makes the whole batch `EventTooLarge`; none of it is written.
pub async fn batch_with_an_oversized_event_writes_nothing(f: Fixture) {
    stream(&f, 1).await;
    let batch = vec![json!({"n": 1}), json!({"blob": "x".repeat(DEFAULT_MAX_EVENT_BYTES)}), json!({"n": 3})];
    assert_err!(f.rheo.append_batch(S, batch).await, Error::EventTooLarge { .. });
    assert!(f.rheo.read(S, 0, 0, 10).await.expect("read").is_empty());
}

/// The size limit is configurable per handle (`max_event_bytes`).
pub async fn max_event_bytes_is_configurable(f: Fixture) {
    stream(&f, 1).await;
    let small = Rheo::builder()
        .clock(Arc::new(f.clock.clone()))
        .max_event_bytes(64)
        .with_backend(f.rheo.backend().clone())
        .expect("a handle with a 64-byte limit");
    let payload = json!({"note": "y".repeat(100)});
    assert_err!(small.append(S, &payload, AppendOptions::new()).await, Error::EventTooLarge { max_bytes: 64, .. });
    assert!(f.rheo.read(S, 0, 0, 10).await.expect("read").is_empty());
    let e = f.rheo.append(S, &payload, AppendOptions::new()).await.expect("the default limit accepts it");
    assert_eq!(e.sequence(), 1);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderPlaced {
    #[serde(rename = "type")]
    kind: String,
    key: String,
    total: u64,
    lines: Vec<String>,
}

/// A `Serialize` struct appends like its JSON form and reads back with `payload_as`.
pub async fn typed_append_round_trips_through_payload_as(f: Fixture) {
    stream(&f, 1).await;
    let order = OrderPlaced { kind: "order_placed".into(), key: "c-9".into(), total: 42, lines: vec!["a".into()] };
    let e = f.rheo.append(S, &order, AppendOptions::new()).await.expect("typed append");
    assert_eq!(e.event_type(), Some("order_placed"));
    assert_eq!(e.key(), Some("c-9"));
    assert_eq!(e.decode::<OrderPlaced>().expect("decode"), order);
    let stored = f.rheo.read(S, 0, 0, 1).await.expect("read");
    assert_eq!(stored[0].payload().decode::<OrderPlaced>().expect("decode stored"), order);
    let batch = f.rheo.append_batch(S, vec![order.clone(), order.clone()]).await.expect("typed batch");
    assert_eq!(batch.len(), 2);
    assert_eq!(batch[1].payload().decode::<OrderPlaced>().expect("decode"), order);
}

/// Decoding a payload as the wrong type is a `Payload` error naming the event.
pub async fn payload_as_wrong_type_is_payload_error(f: Fixture) {
    stream(&f, 1).await;
    let e =
        f.rheo.append(S, &json!({"type": "t", "total": "not a number"}), AppendOptions::new()).await.expect("append");
    let err = assert_err!(e.decode::<OrderPlaced>(), Error::Payload { ref context, .. } if context.contains(e.id()));
    assert_mentions(&err, &[e.id()]);
}

/// A payload nested deeper than `MAX_PAYLOAD_DEPTH` is refused before
/// anything is stored (it could not be read back as JSON), naming the
/// stream; one at the limit is stored and reads back. Payloads JSON can't
/// hold as MessagePack would (maps keyed by numbers) are stored in their
/// JSON form.
pub async fn payload_depth_and_json_form_are_checked_at_append(f: Fixture) {
    stream(&f, 1).await;
    let mut deep = json!(1);
    for _ in 0..rheo::MAX_PAYLOAD_DEPTH {
        deep = json!([deep]);
    }
    let e = f.rheo.append(S, &deep, AppendOptions::new()).await.expect("append at the limit");
    assert_eq!(f.rheo.read(S, 0, 0, 1).await.expect("read")[0].payload(), deep);
    let too_deep = json!([deep]);
    let err = assert_err!(f.rheo.append(S, &too_deep, AppendOptions::new()).await, Error::Payload { .. });
    assert_mentions(&err, &[S]);
    let err = assert_err!(
        f.rheo.append_encoded(S, rheo::Payload::from_value(&too_deep), AppendOptions::new()).await,
        Error::Payload { .. }
    );
    assert_mentions(&err, &[S]);
    let by_number: std::collections::BTreeMap<u32, &str> = [(7, "x")].into();
    let n = f.rheo.append(S, &by_number, AppendOptions::new()).await.expect("append a number-keyed map");
    assert_eq!(n.payload(), json!({"7": "x"}));
    let stored = f.rheo.read(S, 0, e.sequence(), 10).await.expect("read");
    assert_eq!(stored.len(), 1, "the refused appends stored nothing");
    assert_eq!(stored[0].payload(), json!({"7": "x"}));
}

/// Lineage set on append reads back through `Event::lineage`.
pub async fn lineage_options_read_back_through_event_lineage(f: Fixture) {
    stream(&f, 1).await;
    let opts = AppendOptions::new().correlation_id("tx-1").producer("checkout").schema("order_placed", 3);
    let e = f.rheo.append(S, &json!({"n": 1}), opts).await.expect("append");
    let stored = f.rheo.read(S, 0, 0, 1).await.expect("read").remove(0);
    let lineage = stored.lineage();
    assert_eq!(lineage.correlation_id.as_deref(), Some("tx-1"));
    assert_eq!(lineage.producer.as_deref(), Some("checkout"));
    assert_eq!(lineage.schema.as_deref(), Some("order_placed"));
    assert_eq!(lineage.schema_version, Some(3));
    assert_eq!(lineage.causation_id, None);
    assert_eq!(stored.metadata().get("correlation_id"), Some(&json!("tx-1")), "lineage lives in the metadata");
    assert_eq!(e.lineage(), lineage);
}

/// `caused_by` links a child to its parent: causation = parent id, correlation
/// = the parent's correlation (or the parent's id when it has none).
pub async fn caused_by_links_correlation_and_causation(f: Fixture) {
    stream(&f, 1).await;
    let root = f.rheo.append(S, &json!({"step": 1}), AppendOptions::new()).await.expect("append root");
    let child = f.rheo.append(S, &json!({"step": 2}), AppendOptions::new().caused_by(&root)).await.expect("append");
    let grandchild =
        f.rheo.append(S, &json!({"step": 3}), AppendOptions::new().caused_by(&child)).await.expect("append");
    assert_eq!(child.lineage().correlation_id.as_deref(), Some(root.id()));
    assert_eq!(child.lineage().causation_id.as_deref(), Some(root.id()));
    assert_eq!(grandchild.lineage().correlation_id.as_deref(), Some(root.id()), "correlation is inherited");
    assert_eq!(grandchild.lineage().causation_id.as_deref(), Some(child.id()));

    let tagged = f.rheo.append(S, &json!({}), AppendOptions::new().correlation_id("tx-7")).await.expect("append");
    assert_eq!(Lineage::caused_by(&tagged).correlation_id.as_deref(), Some("tx-7"));
    let stored = f.rheo.read(S, 0, 1, 1).await.expect("read").remove(0);
    assert_eq!(stored.lineage(), child.lineage(), "lineage survives storage");
}

/// An append retried with the id it was given writes nothing and answers
/// the stored original, marked as a duplicate (the retry after `Ambiguous`).
pub async fn an_append_retried_with_its_id_writes_nothing_and_answers_the_original(f: Fixture) {
    stream(&f, 2).await;
    let first = f.rheo.append(S, &json!({"n": 1}), AppendOptions::new().id("order-1").key("k")).await.expect("append");
    assert!(!first.is_duplicate());
    // The retry's payload and key differ: the original is what comes back.
    let again = f.rheo.append(S, &json!({"n": 2}), AppendOptions::new().id("order-1")).await.expect("retry");
    assert!(again.is_duplicate(), "{again:?}");
    assert_eq!((again.partition(), again.sequence(), again.id()), (first.partition(), first.sequence(), "order-1"));
    assert_eq!(again.payload().json().expect("json"), &json!({"n": 1}));
    assert_eq!(again.key(), Some("k"));
    let hw = high_watermarks(&f).await;
    assert_eq!(hw.iter().sum::<u64>(), 1, "nothing written by the retry: {hw:?}");
    // A new id appends as usual.
    let other = f.rheo.append(S, &json!({"n": 3}), AppendOptions::new().id("order-2").key("k")).await.expect("append");
    assert!(!other.is_duplicate());
    assert_eq!(other.sequence(), first.sequence() + 1);
}

/// In a batch, events whose id is stored (or earlier in the batch) answer
/// their original, marked; the others are appended, gapless, in order.
pub async fn a_batch_appends_new_ids_and_answers_known_ones(f: Fixture) {
    stream(&f, 1).await;
    let stored = f.rheo.append(S, &json!({"n": 0}), AppendOptions::new().id("a")).await.expect("append");
    let batch = vec![
        (json!({"n": 1}), AppendOptions::new().id("a")),
        (json!({"n": 2}), AppendOptions::new().id("b")),
        (json!({"n": 3}), AppendOptions::new().id("b")),
        (json!({"n": 4}), AppendOptions::new()),
        (json!({"n": 5}), AppendOptions::new().id("c")),
    ];
    let out = f.rheo.append_batch_with(S, batch).await.expect("batch");
    let shape: Vec<(u64, bool, i64)> = out
        .iter()
        .map(|e| (e.sequence(), e.is_duplicate(), e.payload().json().expect("json")["n"].as_i64().expect("n")))
        .collect();
    assert_eq!(shape, vec![(1, true, 0), (2, false, 2), (2, true, 2), (3, false, 4), (4, false, 5)]);
    assert_eq!(stored.sequence(), 1);
    let all = f.rheo.read(S, 0, 0, 100).await.expect("read");
    let ids: Vec<&str> = all.iter().map(|e| e.id()).collect();
    assert_eq!(ids.len(), 4);
    assert_eq!((ids[0], ids[1], ids[3]), ("a", "b", "c"));
    // A batch of known ids only writes nothing at all.
    let again = f
        .rheo
        .append_batch_with(
            S,
            vec![(json!({}), AppendOptions::new().id("c")), (json!({}), AppendOptions::new().id("a"))],
        )
        .await
        .expect("batch");
    assert_eq!(again.iter().map(|e| (e.sequence(), e.is_duplicate())).collect::<Vec<_>>(), vec![(4, true), (1, true)]);
    assert_eq!(high_watermarks(&f).await, vec![4]);
}

async fn high_watermarks(f: &Fixture) -> Vec<u64> {
    f.rheo.list_streams().await.expect("list").into_iter().find(|s| s.name == S).expect("stream").high_watermarks
}
