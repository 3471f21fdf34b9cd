//! The committed frontier (contiguous settled prefix) and lag = HW - F.

use rheo::{Error, PartitionLag};

use crate::common::Fixture;
use crate::support::*;

/// A hole blocks the frontier: it moves only over a contiguous settled prefix.
pub async fn hole_blocks_the_frontier(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 5).await;
    let leases = fetch(&f, 5).await;
    for i in [1, 2, 4] {
        f.rheo.ack(&leases[i]).await.expect("ack");
    }
    assert_eq!(lag_of(partition_lag(&f, 0).await), (0, 5, 0, 5));
    f.rheo.ack(&leases[0]).await.expect("ack the hole");
    assert_eq!(lag_of(partition_lag(&f, 0).await), (0, 5, 3, 2));
    f.rheo.ack(&leases[3]).await.expect("ack");
    assert_eq!(lag_of(partition_lag(&f, 0).await), (0, 5, 5, 0));
}

/// Lag is HW - F per partition, in partition order, and the total is the sum;
/// new appends raise it.
pub async fn lag_is_high_watermark_minus_frontier_summed(f: Fixture) {
    setup(&f, 3).await;
    append_to(&f, 0, 4).await;
    append_to(&f, 2, 2).await;
    let leases = fetch(&f, 2).await;
    ack_all(&f, &leases).await;
    let lag = f.rheo.lag(S, G).await.expect("lag");
    assert_eq!((lag.stream.as_ref(), lag.group.as_ref()), (S, G));
    assert_eq!(
        lag.partitions,
        vec![PartitionLag::new(0, 4, 2), PartitionLag::new(1, 0, 0), PartitionLag::new(2, 2, 0)]
    );
    assert_eq!(lag.total, 4);
    append_to(&f, 1, 3).await;
    assert_eq!(lag_total(&f).await, 7);
}

/// `lag_of` reports only the named partitions; an unknown one is `InvalidPartition`.
pub async fn lag_of_scopes_to_partitions(f: Fixture) {
    setup(&f, 3).await;
    for p in 0..3 {
        append_to(&f, p, u64::from(p) + 1).await;
    }
    let lag = f.rheo.lag_of(S, G, &[2, 0]).await.expect("lag_of");
    let parts: Vec<(u32, u64)> = lag.partitions.iter().map(|p| (p.partition, p.lag)).collect();
    assert_eq!(parts, vec![(0, 1), (2, 3)]);
    assert_eq!(lag.total, 4);
    assert_eq!(f.rheo.lag_of(S, G, &[1]).await.expect("lag_of").total, 2);
    let e = assert_err!(f.rheo.lag_of(S, G, &[3]).await, Error::InvalidPartition { partition: 3, .. });
    assert_mentions(&e, &[S]);
}

/// Dead letters count as settled: they advance the frontier.
pub async fn dead_letters_advance_the_frontier(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 3).await;
    let leases = fetch(&f, 3).await;
    f.rheo.reject(&leases[0], "bad").await.expect("reject");
    assert_eq!(frontier(&f, 0).await, 1);
    f.rheo.ack(&leases[2]).await.expect("ack");
    assert_eq!(frontier(&f, 0).await, 1, "sequence 2 is still a hole");
    f.rheo.reject(&leases[1], "bad").await.expect("reject");
    assert_eq!(frontier(&f, 0).await, 3);
    assert_eq!(lag_total(&f).await, 0);
}

/// Leased, retried and waiting deliveries do not move the frontier.
pub async fn unsettled_deliveries_do_not_move_the_frontier(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 2).await;
    let leases = fetch(&f, 2).await;
    assert_eq!(lag_total(&f).await, 2, "claimed is not settled");
    f.rheo.retry(&leases[0], "later").await.expect("retry");
    f.rheo.renew(&leases[1], secs(60)).await.expect("renew");
    assert_eq!(frontier(&f, 0).await, 0);
    assert_eq!(lag_total(&f).await, 2);
}

/// A partition's lag as (partition, high watermark, frontier, lag).
fn lag_of(l: PartitionLag) -> (u32, u64, u64, u64) {
    (l.partition, l.high_watermark, l.frontier, l.lag)
}
