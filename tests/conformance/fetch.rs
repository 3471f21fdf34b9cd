//! `fetch`: what is claimable, in which order, and what a claim carries.

use rheo::{AppendOptions, Error, FetchOptions, GroupOptions};
use serde_json::json;

use crate::common::Fixture;
use crate::support::*;

/// Deliveries are claimed in (partition, sequence) order, however appends interleaved.
pub async fn fetch_claims_in_partition_sequence_order(f: Fixture) {
    setup(&f, 3).await;
    for p in [2, 0, 1, 2, 0, 2, 1, 0] {
        f.rheo.append(S, &json!({}), AppendOptions::new().partition(p)).await.expect("append");
    }
    let limited = fetch(&f, 4).await;
    assert_eq!(positions(&limited), vec![(0, 1), (0, 2), (0, 3), (1, 1)]);
    let rest = fetch(&f, 100).await;
    assert_eq!(positions(&rest), vec![(1, 2), (2, 1), (2, 2), (2, 3)]);
}

/// `fetch` claims at most `limit` (10 by default).
pub async fn fetch_claims_at_most_limit(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 15).await;
    let default = f.rheo.fetch(S, G, FetchOptions::new()).await.expect("fetch");
    assert_eq!(sequences(&default), (1..=10).collect::<Vec<_>>());
    assert_eq!(sequences(&fetch(&f, 3).await), vec![11, 12, 13]);
    assert_eq!(sequences(&fetch(&f, 100).await), vec![14, 15]);
    assert!(fetch(&f, 100).await.is_empty());
}

/// A fetch on a group with nothing to claim returns an empty list, not an error.
pub async fn fetch_with_nothing_claimable_is_empty(f: Fixture) {
    setup(&f, 2).await;
    assert!(fetch(&f, 10).await.is_empty());
    append_to(&f, 1, 1).await;
    assert_eq!(fetch(&f, 10).await.len(), 1);
    assert!(fetch(&f, 10).await.is_empty(), "the only delivery is leased");
}

/// Every claim gets a fresh, unique lease id, also when a delivery is reclaimed.
pub async fn every_claim_gets_a_fresh_unique_lease_id(f: Fixture) {
    setup(&f, 2).await;
    append_to(&f, 0, 10).await;
    append_to(&f, 1, 10).await;
    let first = fetch_leased(&f, 100, 10).await;
    assert_eq!(first.len(), 20);
    f.clock.advance(secs(11));
    let second = fetch_leased(&f, 100, 10).await;
    assert_eq!(positions(&second), positions(&first), "all expired and reclaimed");
    assert_unique(first.iter().chain(&second).map(|l| l.lease_id));
    assert!(first.iter().chain(&second).all(|l| l.lease_id.as_u128() != 0));
}

/// A lease records the group, the consumer id given (or the handle's own) and
/// expires `lease` after the fetch.
pub async fn lease_records_group_consumer_and_expiry(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 2).await;
    let named = f.rheo.fetch(S, G, FetchOptions::new().limit(1).consumer("worker-a")).await.expect("fetch");
    assert_eq!(&*named[0].consumer_id, "worker-a");
    assert_eq!(&*named[0].group, G);
    assert_eq!(named[0].expires_at, at(30), "the default lease is 30 s");
    f.clock.advance(secs(1));
    let default = f.rheo.fetch(S, G, FetchOptions::new().limit(1).lease(secs(90))).await.expect("fetch");
    assert_eq!(&*default[0].consumer_id, "test-consumer");
    assert_eq!(&*default[0].consumer_id, f.rheo.consumer_id());
    assert_eq!(default[0].expires_at, at(91));
    assert_eq!(default[0].attempt, 1);
}

/// A lease carries the event exactly as stored.
pub async fn lease_carries_the_stored_event(f: Fixture) {
    setup(&f, 2).await;
    let e = f
        .rheo
        .append(S, &json!({"type": "paid", "amount": 5}), AppendOptions::new().partition(1).metadata("m", 1))
        .await
        .expect("append");
    let leases = fetch(&f, 1).await;
    assert_eq!(leases[0].event, e);
    assert_eq!(leases[0].stream(), S);
}

/// The `partitions` option restricts a fetch; a partition out of range is `InvalidPartition`.
pub async fn fetch_partitions_option_restricts_claims(f: Fixture) {
    setup(&f, 3).await;
    for p in 0..3 {
        append_to(&f, p, 2).await;
    }
    let only_2 = f.rheo.fetch(S, G, FetchOptions::new().partitions([2])).await.expect("fetch");
    assert_eq!(positions(&only_2), vec![(2, 1), (2, 2)]);
    let some = f.rheo.fetch(S, G, FetchOptions::new().partitions([0, 2])).await.expect("fetch");
    assert_eq!(positions(&some), vec![(0, 1), (0, 2)]);
    let e = assert_err!(
        f.rheo.fetch(S, G, FetchOptions::new().partitions([3])).await,
        Error::InvalidPartition { partition: 3, .. }
    );
    assert_mentions(&e, &[S, "3"]);
    assert_eq!(positions(&fetch(&f, 100).await), vec![(1, 1), (1, 2)]);
}

/// Competing consumers of one group never get the same delivery while it is leased.
pub async fn competing_consumers_never_share_a_leased_delivery(f: Fixture) {
    setup(&f, 2).await;
    append_to(&f, 0, 3).await;
    append_to(&f, 1, 2).await;
    let a = f.rheo.fetch(S, G, FetchOptions::new().limit(3).consumer("a")).await.expect("fetch a");
    let b = f.rheo.fetch(S, G, FetchOptions::new().limit(3).consumer("b")).await.expect("fetch b");
    let c = f.rheo.fetch(S, G, FetchOptions::new().limit(3).consumer("c")).await.expect("fetch c");
    assert_eq!(a.len(), 3);
    assert_eq!(b.len(), 2);
    assert!(c.is_empty(), "everything is leased");
    let mut all = positions(&a);
    all.extend(positions(&b));
    assert_unique(all.iter().copied());
    all.sort_unstable();
    assert_eq!(all, vec![(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]);
    f.clock.advance(secs(29));
    assert!(f.rheo.fetch(S, G, FetchOptions::new().consumer("c")).await.expect("fetch").is_empty());
}

/// Independent groups each get every event, and settling in one leaves the other alone.
pub async fn independent_groups_each_get_every_event(f: Fixture) {
    stream(&f, 2).await;
    group_named(&f, G, GroupOptions::new()).await;
    group_named(&f, G2, GroupOptions::new()).await;
    append_to(&f, 0, 3).await;
    append_to(&f, 1, 3).await;
    let a = drain(&f, G).await;
    assert_eq!(a.len(), 6);
    assert_eq!(lag_total_of(&f, G).await, 0);
    assert_eq!(lag_total_of(&f, G2).await, 6, "the other group is untouched");
    let b = fetch_from(&f, G2, 100).await;
    assert_eq!(positions(&b), a);
    assert!(b.iter().all(|l| l.attempt == 1 && &*l.group == G2));
}

/// A lease that has expired is claimable again, with the next attempt and a new lease id.
pub async fn expired_lease_is_reclaimable_with_next_attempt(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let first = f.rheo.fetch(S, G, FetchOptions::new().consumer("a").lease(secs(10))).await.expect("fetch");
    assert_eq!(first[0].attempt, 1);
    f.clock.advance(secs(9));
    assert!(fetch(&f, 10).await.is_empty(), "not expired yet");
    f.clock.advance(secs(2));
    let second = f.rheo.fetch(S, G, FetchOptions::new().consumer("b")).await.expect("fetch");
    assert_eq!(positions(&second), vec![(0, 1)]);
    assert_eq!(second[0].attempt, 2);
    assert_eq!(&*second[0].consumer_id, "b");
    assert_ne!(second[0].lease_id, first[0].lease_id);
    f.clock.advance(secs(31));
    assert_eq!(fetch(&f, 10).await[0].attempt, 3, "attempt increments on every claim");
}
