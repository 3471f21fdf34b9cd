//! `create_stream`: defaults, duplicates and the partition count range.

use rheo::{AppendOptions, Error, MAX_PARTITIONS, ObjectKind, StreamOptions};
use serde_json::json;

use crate::common::{Fixture, START};
use crate::support::*;

/// A stream is created with one partition and no indexes by default.
pub async fn create_stream_defaults_to_one_partition(f: Fixture) {
    let info = f.rheo.create_stream(S, StreamOptions::new()).await.expect("create");
    assert_eq!(info.name, S);
    assert_eq!(info.partition_count, 1);
    assert!(info.indexes.is_empty());
    assert_eq!(info.high_watermarks, vec![0]);
    assert_eq!(info.created_at, START, "created_at comes from the backend clock");
    assert_eq!(f.rheo.list_streams().await.expect("list"), vec![info]);
}

/// The partition count and declared indexes are kept.
pub async fn create_stream_keeps_partitions_and_indexes(f: Fixture) {
    let opts = StreamOptions::new().partitions(4).indexes(["customer.id", "total"]);
    let info = f.rheo.create_stream(S, opts).await.expect("create");
    assert_eq!(info.partition_count, 4);
    assert_eq!(info.indexes, vec!["customer.id".to_owned(), "total".to_owned()]);
    assert_eq!(info.high_watermarks, vec![0, 0, 0, 0]);
    let listed = f.rheo.list_streams().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].partition_count, 4);
    assert_eq!(listed[0].indexes, info.indexes);
}

/// A second `create_stream` of the same name is `AlreadyExists`, whatever its
/// options, and leaves the first stream as it was.
pub async fn create_stream_twice_is_already_exists(f: Fixture) {
    stream(&f, 2).await;
    f.rheo.append(S, &json!({"n": 1}), AppendOptions::new()).await.expect("append");
    for opts in [StreamOptions::new().partitions(2), StreamOptions::new().partitions(8)] {
        let e = assert_err!(
            f.rheo.create_stream(S, opts).await,
            Error::AlreadyExists { kind: ObjectKind::Stream, ref name } if name == S
        );
        assert_mentions(&e, &[S, "already exists"]);
    }
    let listed = f.rheo.list_streams().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].partition_count, 2);
    assert_eq!(listed[0].high_watermarks, vec![1, 0], "the existing events are kept");
}

/// Zero partitions is `InvalidPartitionCount` and creates nothing.
pub async fn zero_partitions_is_invalid_partition_count(f: Fixture) {
    let e = assert_err!(
        f.rheo.create_stream(S, StreamOptions::new().partitions(0)).await,
        Error::InvalidPartitionCount { count: 0, ref stream, .. } if stream == S
    );
    assert_mentions(&e, &[S, "0"]);
    assert!(f.rheo.list_streams().await.expect("list").is_empty());
    assert_err!(f.rheo.append(S, &json!({}), AppendOptions::new()).await, Error::StreamNotFound { .. });
}

/// Above `MAX_PARTITIONS` is `InvalidPartitionCount`; exactly the maximum is fine.
pub async fn partitions_above_maximum_is_invalid_partition_count(f: Fixture) {
    for count in [MAX_PARTITIONS + 1, u32::MAX] {
        let e = assert_err!(
            f.rheo.create_stream(S, StreamOptions::new().partitions(count)).await,
            Error::InvalidPartitionCount { count: c, max, .. } if c == count && max == MAX_PARTITIONS
        );
        assert_mentions(&e, &[S, &count.to_string()]);
    }
    assert!(f.rheo.list_streams().await.expect("list").is_empty());
    let info = f.rheo.create_stream(S, StreamOptions::new().partitions(MAX_PARTITIONS)).await.expect("maximum");
    assert_eq!(info.partition_count, MAX_PARTITIONS);
    let last = f.rheo.append(S, &json!({}), AppendOptions::new().partition(MAX_PARTITIONS - 1)).await.expect("append");
    assert_eq!((last.partition(), last.sequence()), (MAX_PARTITIONS - 1, 1));
}

/// `ensure_stream` creates a missing stream, returns an existing one as it
/// is (events kept), and refuses another partition count.
pub async fn ensure_stream_creates_once_and_checks_partitions(f: Fixture) {
    let first = f.rheo.ensure_stream(S, StreamOptions::new().partitions(2)).await.expect("create");
    assert_eq!(first.partition_count, 2);
    f.rheo.append(S, &json!({"n": 1}), AppendOptions::new().partition(1)).await.expect("append");
    let again = f.rheo.ensure_stream(S, StreamOptions::new().partitions(2)).await.expect("existing");
    assert_eq!(again.high_watermarks, vec![0, 1], "the existing stream, events kept");
    let e =
        assert_err!(f.rheo.ensure_stream(S, StreamOptions::new().partitions(3)).await, Error::InvalidArgument { .. });
    assert!(e.to_string().contains("2 partitions"), "{e}");
}
