//! Helpers shared by the conformance cases: one stream, one group, a few
//! events, and short ways to look at what a group sees.

use std::collections::HashSet;
use std::fmt::Debug;
use std::time::Duration;

use rheo::{
    AppendOptions, Error, Event, FetchOptions, GroupOptions, Lease, LeaseRef, PartitionLag, StreamOptions, Timestamp,
};
use serde_json::json;

use crate::common::{Fixture, START};

/// The stream most cases use.
pub const S: &str = "orders";
/// The group most cases use.
pub const G: &str = "billing";
/// A second group on the same stream.
pub const G2: &str = "shipping";

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The instant `offset` seconds after the fixture clock's start.
pub fn at(offset: i64) -> Timestamp {
    Timestamp::from_millis(START.as_millis() + offset * 1000)
}

/// Creates stream `S` with `partitions` partitions.
pub async fn stream(f: &Fixture, partitions: u32) {
    f.rheo.create_stream(S, StreamOptions::new().partitions(partitions)).await.expect("create the test stream");
}

/// Creates group `name` on `S`.
pub async fn group_named(f: &Fixture, name: &str, opts: GroupOptions) {
    f.rheo.create_group(S, name, opts).await.expect("create the test group");
}

/// Creates group `G` on `S`.
pub async fn group(f: &Fixture, opts: GroupOptions) {
    group_named(f, G, opts).await;
}

/// Creates stream `S` with `partitions` partitions and group `G` with default options.
pub async fn setup(f: &Fixture, partitions: u32) {
    stream(f, partitions).await;
    group(f, GroupOptions::new()).await;
}

/// Appends `n` events `{"type": "tick", "n": i}` to `partition` of `S`.
pub async fn append_to(f: &Fixture, partition: u32, n: u64) -> Vec<Event> {
    let mut out = Vec::new();
    for i in 0..n {
        let payload = json!({"type": "tick", "n": i});
        out.push(f.rheo.append(S, &payload, AppendOptions::new().partition(partition)).await.expect("append"));
    }
    out
}

/// Appends one event to `partition` of `S` and advances the clock by `step` seconds afterwards.
pub async fn append_then_wait(f: &Fixture, partition: u32, step: u64) -> Event {
    let e =
        f.rheo.append(S, &json!({"type": "tick"}), AppendOptions::new().partition(partition)).await.expect("append");
    f.clock.advance(secs(step));
    e
}

/// Fetches up to `limit` deliveries of group `group` with default options otherwise.
pub async fn fetch_from(f: &Fixture, group: &str, limit: usize) -> Vec<Lease> {
    f.rheo.fetch(S, group, FetchOptions::new().limit(limit)).await.expect("fetch")
}

/// Fetches up to `limit` deliveries of group `G`.
pub async fn fetch(f: &Fixture, limit: usize) -> Vec<Lease> {
    fetch_from(f, G, limit).await
}

/// Fetches up to `limit` deliveries of `G` under a lease of `lease` seconds.
pub async fn fetch_leased(f: &Fixture, limit: usize, lease: u64) -> Vec<Lease> {
    f.rheo.fetch(S, G, FetchOptions::new().limit(limit).lease(secs(lease))).await.expect("fetch")
}

/// Acknowledges every lease, expecting success.
pub async fn ack_all(f: &Fixture, leases: &[Lease]) {
    for lease in leases {
        f.rheo.ack(lease).await.expect("ack a held lease");
    }
}

/// Fetches everything claimable of group `group` and acknowledges it.
pub async fn drain(f: &Fixture, group: &str) -> Vec<(u32, u64)> {
    let leases = fetch_from(f, group, 1000).await;
    ack_all(f, &leases).await;
    positions(&leases)
}

/// (partition, sequence) of each lease.
pub fn positions(leases: &[Lease]) -> Vec<(u32, u64)> {
    leases.iter().map(|l| (l.partition(), l.sequence())).collect()
}

/// (partition, sequence) of each event.
pub fn event_positions(events: &[Event]) -> Vec<(u32, u64)> {
    events.iter().map(|e| (e.partition(), e.sequence())).collect()
}

/// Sequences of each lease.
pub fn sequences(leases: &[Lease]) -> Vec<u64> {
    leases.iter().map(Lease::sequence).collect()
}

/// The total lag of group `group`.
pub async fn lag_total_of(f: &Fixture, group: &str) -> u64 {
    f.rheo.lag(S, group).await.expect("lag").total
}

/// The total lag of group `G`.
pub async fn lag_total(f: &Fixture) -> u64 {
    lag_total_of(f, G).await
}

/// The lag entry of one partition of group `G`.
pub async fn partition_lag(f: &Fixture, partition: u32) -> PartitionLag {
    let lag = f.rheo.lag(S, G).await.expect("lag");
    lag.partitions
        .into_iter()
        .find(|p| p.partition == partition)
        .unwrap_or_else(|| panic!("no lag entry for partition {partition}"))
}

/// The frontier of group `G` in `partition`.
pub async fn frontier(f: &Fixture, partition: u32) -> u64 {
    partition_lag(f, partition).await.frontier
}

/// A lease reference for a delivery that names a lease id nobody was given.
pub fn made_up_lease(stream: &str, group: &str, partition: u32, sequence: u64) -> LeaseRef {
    LeaseRef {
        stream: stream.into(),
        group: group.into(),
        partition,
        sequence,
        lease_id: rheo::LeaseId::from_u128(0x0bad),
        receipt: None,
    }
}

/// Panics unless the error's message names every one of `parts`.
pub fn assert_mentions(err: &Error, parts: &[&str]) {
    let msg = err.to_string();
    for part in parts {
        assert!(msg.contains(part), "error message {msg:?} should mention {part:?}");
    }
}

/// Panics unless the items are pairwise distinct.
pub fn assert_unique<T: std::hash::Hash + Eq + Debug>(items: impl IntoIterator<Item = T>) {
    let mut seen = HashSet::new();
    for item in items {
        assert!(!seen.contains(&item), "{item:?} appears twice");
        seen.insert(item);
    }
}
