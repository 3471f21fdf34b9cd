//! `read`: one partition's events in order; it never touches group state.

use rheo::{Error, Query};

use crate::common::Fixture;
use crate::support::*;

/// `read(partition, after, limit)` returns the partition's events with
/// sequence > after, ascending, at most `limit`.
pub async fn read_returns_events_after_sequence_up_to_limit(f: Fixture) {
    stream(&f, 2).await;
    append_to(&f, 0, 2).await;
    let p1 = append_to(&f, 1, 10).await;
    let page = f.rheo.read(S, 1, 3, 4).await.expect("read");
    assert_eq!(page, p1[3..7].to_vec());
    assert_eq!(f.rheo.read(S, 1, 0, 100).await.expect("read"), p1);
    assert!(f.rheo.read(S, 1, 10, 5).await.expect("read").is_empty(), "nothing after the high watermark");
    assert!(f.rheo.read(S, 1, 1000, 5).await.expect("read").is_empty());
    assert_eq!(f.rheo.read(S, 0, 0, 100).await.expect("read").len(), 2, "partitions are separate");
}

/// `read` on a partition out of range is `InvalidPartition`; on a missing stream `StreamNotFound`.
pub async fn read_out_of_range_partition_is_invalid_partition(f: Fixture) {
    stream(&f, 2).await;
    let e = assert_err!(f.rheo.read(S, 2, 0, 10).await, Error::InvalidPartition { partition: 2, .. });
    assert_mentions(&e, &[S, "2"]);
    assert_err!(f.rheo.read("nope", 0, 0, 10).await, Error::StreamNotFound { .. });
}

/// Reading and querying never touch group state: lag, leases and what a fetch
/// claims next are unchanged.
pub async fn read_and_query_never_touch_group_state(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 5).await;
    let leases = fetch(&f, 2).await;
    f.rheo.ack(&leases[0]).await.expect("ack");
    let before = f.rheo.group_info(S, G).await.expect("info");
    assert_eq!(f.rheo.read(S, 0, 0, 100).await.expect("read").len(), 5);
    assert_eq!(f.rheo.query(&Query::new(S)).await.expect("query").len(), 5);
    let after = f.rheo.group_info(S, G).await.expect("info");
    assert_eq!(after, before);
    assert_eq!(after.lag.total, 4);
    assert_eq!(sequences(&fetch(&f, 10).await), vec![3, 4, 5], "reads claimed nothing");
    f.rheo.ack(&leases[1]).await.expect("the lease is intact");
}
