//! Partition routing, sequences, and atomic batches.

use std::collections::{BTreeMap, BTreeSet};

use rheo::{AppendOptions, Error, partition_for_key};
use serde_json::json;

use crate::common::Fixture;
use crate::support::*;

/// An explicit partition is used as given.
pub async fn explicit_partition_is_used(f: Fixture) {
    stream(&f, 4).await;
    for p in [3, 0, 2, 1] {
        let e = f.rheo.append(S, &json!({"n": p}), AppendOptions::new().partition(p)).await.expect("append");
        assert_eq!(e.partition(), p);
        assert_eq!(f.rheo.read(S, p, 0, 10).await.expect("read"), vec![e]);
    }
}

/// An explicit partition out of range is `InvalidPartition` naming stream and
/// partition; nothing is written.
pub async fn explicit_partition_out_of_range_is_invalid_partition(f: Fixture) {
    stream(&f, 2).await;
    let e = assert_err!(
        f.rheo.append(S, &json!({}), AppendOptions::new().partition(2)).await,
        Error::InvalidPartition { partition: 2, partition_count: 2, ref stream } if stream == S
    );
    assert_mentions(&e, &[S, "2"]);
    assert_err!(
        f.rheo.append(S, &json!({}), AppendOptions::new().partition(u32::MAX)).await,
        Error::InvalidPartition { .. }
    );
    assert_eq!(f.rheo.list_streams().await.expect("list")[0].high_watermarks, vec![0, 0]);
}

/// A keyed event goes to `partition_for_key(key, partition_count)`, whether
/// the key comes from the option or from the payload.
pub async fn key_routes_to_partition_for_key(f: Fixture) {
    stream(&f, 8).await;
    let mut used = BTreeSet::new();
    let keys: Vec<String> = (0..64).map(|i| format!("customer-{i}")).chain(["EUR".into(), "ключ".into()]).collect();
    for key in &keys {
        let expected = partition_for_key(key, 8);
        let by_option = f.rheo.append(S, &json!({}), AppendOptions::new().key(key.clone())).await.expect("append");
        let by_payload = f.rheo.append(S, &json!({"key": key}), AppendOptions::new()).await.expect("append");
        assert_eq!(by_option.partition(), expected, "key {key:?} (option)");
        assert_eq!(by_payload.partition(), expected, "key {key:?} (payload)");
        used.insert(expected);
    }
    assert!(used.len() > 4, "64 keys should spread over the partitions, used {used:?}");
}

/// An explicit partition wins over key routing.
pub async fn explicit_partition_wins_over_key(f: Fixture) {
    stream(&f, 8).await;
    let key = (0..100).map(|i| format!("k{i}")).find(|k| partition_for_key(k, 8) != 5).expect("a key not routed to 5");
    let e = f.rheo.append(S, &json!({"key": key}), AppendOptions::new().partition(5)).await.expect("append");
    assert_eq!(e.partition(), 5);
    assert_eq!(e.key(), Some(key.as_str()), "the key is still recorded");
}

/// With neither key nor partition an event goes to partition 0.
pub async fn unkeyed_event_goes_to_partition_zero(f: Fixture) {
    stream(&f, 4).await;
    for i in 0..10 {
        let e = f.rheo.append(S, &json!({"n": i}), AppendOptions::new()).await.expect("append");
        assert_eq!(e.partition(), 0);
    }
    assert_eq!(f.rheo.list_streams().await.expect("list")[0].high_watermarks, vec![10, 0, 0, 0]);
}

/// Sequences start at 1 in every partition and have no gaps, however appends interleave.
pub async fn sequences_start_at_one_and_are_contiguous_per_partition(f: Fixture) {
    stream(&f, 3).await;
    let order = [0, 1, 0, 2, 0, 1, 2, 2, 0, 1];
    let mut seen: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for p in order {
        let e = f.rheo.append(S, &json!({}), AppendOptions::new().partition(p)).await.expect("append");
        seen.entry(p).or_default().push(e.sequence());
    }
    assert_eq!(seen[&0], vec![1, 2, 3, 4]);
    assert_eq!(seen[&1], vec![1, 2, 3]);
    assert_eq!(seen[&2], vec![1, 2, 3]);
    assert_eq!(f.rheo.list_streams().await.expect("list")[0].high_watermarks, vec![4, 3, 3]);
}

/// A batch gets contiguous sequences per partition, in input order, and is
/// returned in input order.
pub async fn append_batch_is_contiguous_per_partition_in_input_order(f: Fixture) {
    stream(&f, 2).await;
    append_to(&f, 0, 1).await;
    let items =
        [0u32, 1, 0, 1, 0].iter().enumerate().map(|(i, &p)| (json!({"i": i}), AppendOptions::new().partition(p)));
    let events = f.rheo.append_batch_with(S, items).await.expect("batch");
    assert_eq!(event_positions(&events), vec![(0, 2), (1, 1), (0, 3), (1, 2), (0, 4)]);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.payload().json().expect("json")["i"], json!(i), "returned in input order");
    }
    let p0: Vec<u64> = f.rheo.read(S, 0, 0, 10).await.expect("read").iter().map(|e| e.sequence()).collect();
    assert_eq!(p0, vec![1, 2, 3, 4]);
}

/// A batch is all or none: one event with a bad partition writes nothing at all.
pub async fn append_batch_is_atomic_when_one_partition_is_invalid(f: Fixture) {
    stream(&f, 2).await;
    let items = vec![
        (json!({"n": 1}), AppendOptions::new().partition(0)),
        (json!({"n": 2}), AppendOptions::new().key("k")),
        (json!({"n": 3}), AppendOptions::new().partition(1)),
        (json!({"n": 4}), AppendOptions::new().partition(7)),
        (json!({"n": 5}), AppendOptions::new().partition(0)),
    ];
    assert_err!(
        f.rheo.append_batch_with(S, items).await,
        Error::InvalidPartition { partition: 7, partition_count: 2, .. }
    );
    assert_eq!(f.rheo.list_streams().await.expect("list")[0].high_watermarks, vec![0, 0]);
    assert!(f.rheo.read(S, 0, 0, 10).await.expect("read").is_empty());
    assert!(f.rheo.read(S, 1, 0, 10).await.expect("read").is_empty());
    let next = f.rheo.append(S, &json!({}), AppendOptions::new().partition(1)).await.expect("append");
    assert_eq!(next.sequence(), 1, "the failed batch used no sequences");
}

/// Appending to a stream that does not exist is `StreamNotFound` naming it.
pub async fn append_to_missing_stream_is_stream_not_found(f: Fixture) {
    let e = assert_err!(
        f.rheo.append("nope", &json!({}), AppendOptions::new()).await,
        Error::StreamNotFound { ref stream } if stream == "nope"
    );
    assert_mentions(&e, &["nope"]);
    assert_err!(f.rheo.append_batch("nope", vec![json!({})]).await, Error::StreamNotFound { .. });
    assert!(f.rheo.list_streams().await.expect("list").is_empty(), "append never creates a stream");
}
