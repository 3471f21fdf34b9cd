//! `create_group`, where a group starts, and `StreamNotFound` before `GroupNotFound`.

use std::collections::BTreeMap;
use std::fmt::Debug;

use rheo::{
    DeadLetterOptions, Error, FetchOptions, GroupOptions, ObjectKind, ReplayOptions, ResetOptions, Result,
    StartPosition,
};

use crate::common::{Fixture, START};
use crate::support::*;

fn expect_stream_not_found<T: Debug>(op: &str, result: Result<T>) {
    match result {
        Err(ref e @ Error::StreamNotFound { ref stream }) => {
            assert_eq!(stream, "nope", "{op}");
            assert_mentions(e, &["nope"]);
        }
        other => panic!("{op} on a missing stream: expected StreamNotFound, got {other:?}"),
    }
}

fn expect_group_not_found<T: Debug>(op: &str, result: Result<T>) {
    match result {
        Err(ref e @ Error::GroupNotFound { ref stream, ref group }) => {
            assert_eq!((stream.as_str(), group.as_str()), (S, "ghost"), "{op}");
            assert_mentions(e, &[S, "ghost"]);
        }
        other => panic!("{op} on a missing group: expected GroupNotFound, got {other:?}"),
    }
}

/// Every group operation on a missing stream is `StreamNotFound` (checked
/// before the group, which is missing too).
pub async fn group_ops_on_missing_stream_are_stream_not_found_first(f: Fixture) {
    stream(&f, 1).await; // another stream exists; "nope" does not
    let r = &f.rheo;
    let lease = made_up_lease("nope", "ghost", 0, 1);
    expect_stream_not_found("create_group", r.create_group("nope", "ghost", GroupOptions::new()).await);
    expect_stream_not_found("fetch", r.fetch("nope", "ghost", FetchOptions::new()).await);
    expect_stream_not_found("ack", r.ack(&lease).await);
    expect_stream_not_found("retry", r.retry(&lease, "why").await);
    expect_stream_not_found("retry_after", r.retry_after(&lease, "why", secs(1)).await);
    expect_stream_not_found("reject", r.reject(&lease, "why").await);
    expect_stream_not_found("renew", r.renew(&lease, secs(1)).await);
    expect_stream_not_found("lag", r.lag("nope", "ghost").await);
    expect_stream_not_found("lag_of", r.lag_of("nope", "ghost", &[0]).await);
    expect_stream_not_found("replay", r.replay("nope", "ghost", ReplayOptions::from_sequence(0)).await);
    expect_stream_not_found("reset_group", r.reset_group("nope", "ghost", ResetOptions::confirmed()).await);
    expect_stream_not_found("dead_letters", r.dead_letters("nope", "ghost", DeadLetterOptions::new()).await);
    expect_stream_not_found("group_info", r.group_info("nope", "ghost").await);
    expect_stream_not_found("list_groups", r.list_groups("nope").await);
    assert_eq!(f.rheo.list_streams().await.expect("list").len(), 1, "nothing was created");
}

/// Every group operation on a missing group of an existing stream is
/// `GroupNotFound` naming stream and group.
pub async fn group_ops_on_missing_group_are_group_not_found(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let r = &f.rheo;
    let lease = made_up_lease(S, "ghost", 0, 1);
    expect_group_not_found("fetch", r.fetch(S, "ghost", FetchOptions::new()).await);
    expect_group_not_found("ack", r.ack(&lease).await);
    expect_group_not_found("retry", r.retry(&lease, "why").await);
    expect_group_not_found("reject", r.reject(&lease, "why").await);
    expect_group_not_found("renew", r.renew(&lease, secs(1)).await);
    expect_group_not_found("lag", r.lag(S, "ghost").await);
    expect_group_not_found("replay", r.replay(S, "ghost", ReplayOptions::from_sequence(0)).await);
    expect_group_not_found("reset_group", r.reset_group(S, "ghost", ResetOptions::confirmed()).await);
    expect_group_not_found("dead_letters", r.dead_letters(S, "ghost", DeadLetterOptions::new()).await);
    expect_group_not_found("group_info", r.group_info(S, "ghost").await);
    let groups: Vec<String> = r.list_groups(S).await.expect("list").into_iter().map(|g| g.name).collect();
    assert_eq!(groups, vec![G.to_owned()], "no group was created by accident");
}

/// A second group of the same name is `AlreadyExists` and does not change the first.
pub async fn create_group_twice_is_already_exists(f: Fixture) {
    stream(&f, 2).await;
    group(&f, GroupOptions::new().max_attempts(3)).await;
    let e = assert_err!(
        f.rheo.create_group(S, G, GroupOptions::new().max_attempts(9).partitions([1])).await,
        Error::AlreadyExists { kind: ObjectKind::Group, ref name } if name.contains(G)
    );
    assert_mentions(&e, &[G, "already exists"]);
    let groups = f.rheo.list_groups(S).await.expect("list");
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].max_attempts, 3);
    assert_eq!(groups[0].partitions, None);
}

/// The same group name on two streams is two groups.
pub async fn group_names_are_per_stream(f: Fixture) {
    setup(&f, 1).await;
    f.rheo.create_stream("payments", rheo::StreamOptions::new()).await.expect("create");
    f.rheo.create_group("payments", G, GroupOptions::new()).await.expect("same group name on another stream");
    append_to(&f, 0, 2).await;
    assert_eq!(lag_total(&f).await, 2);
    assert_eq!(f.rheo.lag("payments", G).await.expect("lag").total, 0);
}

/// A group is created with `max_attempts` 5, every partition, at the clock's time.
pub async fn create_group_defaults(f: Fixture) {
    stream(&f, 3).await;
    let summary = f.rheo.create_group(S, G, GroupOptions::new()).await.expect("create");
    assert_eq!(summary.name, G);
    assert_eq!(summary.max_attempts, 5);
    assert_eq!(summary.partitions, None);
    assert_eq!(summary.created_at, START);
    assert_eq!(f.rheo.list_groups(S).await.expect("list"), vec![summary]);
    let lag = f.rheo.lag(S, G).await.expect("lag");
    assert_eq!(lag.partitions.iter().map(|p| p.partition).collect::<Vec<_>>(), vec![0, 1, 2]);
}

/// A partition out of range in the group's options is `InvalidPartition`; no group is made.
pub async fn create_group_with_partition_out_of_range_is_invalid_partition(f: Fixture) {
    stream(&f, 2).await;
    let e = assert_err!(
        f.rheo.create_group(S, G, GroupOptions::new().partitions([0, 2])).await,
        Error::InvalidPartition { partition: 2, .. }
    );
    assert_mentions(&e, &[S, "2"]);
    let map = BTreeMap::from([(5, 1)]);
    assert_err!(
        f.rheo.create_group(S, G, GroupOptions::new().start_after_partitions(map)).await,
        Error::InvalidPartition { partition: 5, .. }
    );
    assert!(f.rheo.list_groups(S).await.expect("list").is_empty());
}

/// `max_attempts` 0 is `InvalidArgument`.
pub async fn create_group_with_zero_max_attempts_is_invalid_argument(f: Fixture) {
    stream(&f, 1).await;
    let e = assert_err!(
        f.rheo.create_group(S, G, GroupOptions::new().max_attempts(0)).await,
        Error::InvalidArgument { argument: "max_attempts", .. }
    );
    assert_mentions(&e, &["max_attempts"]);
    assert!(f.rheo.list_groups(S).await.expect("list").is_empty());
}

/// `start_after: n` delivers only sequences > n.
pub async fn start_after_delivers_only_later_sequences(f: Fixture) {
    stream(&f, 2).await;
    append_to(&f, 0, 5).await;
    append_to(&f, 1, 2).await;
    group(&f, GroupOptions::new().start_after(3)).await;
    assert_eq!(positions(&fetch(&f, 100).await), vec![(0, 4), (0, 5)]);
    append_to(&f, 1, 2).await;
    assert_eq!(positions(&fetch(&f, 100).await), vec![(1, 4)], "later appends past n are delivered");
}

/// `start_after` a per-partition map: each named partition from its own
/// position; unnamed partitions from the beginning.
pub async fn start_after_per_partition_map(f: Fixture) {
    stream(&f, 3).await;
    for p in 0..3 {
        append_to(&f, p, 4).await;
    }
    let map = BTreeMap::from([(0, 2), (1, 4)]);
    group(&f, GroupOptions::new().start_after_partitions(map)).await;
    assert_eq!(positions(&fetch(&f, 100).await), vec![(0, 3), (0, 4), (2, 1), (2, 2), (2, 3), (2, 4)]);
    let lag = f.rheo.lag(S, G).await.expect("lag");
    let frontiers: Vec<u64> = lag.partitions.iter().map(|p| p.frontier).collect();
    assert_eq!(frontiers, vec![2, 4, 0]);
}

/// `start_at: t` delivers, per partition, from the first event with timestamp >= t.
pub async fn start_at_delivers_from_first_event_at_or_after_time(f: Fixture) {
    stream(&f, 2).await;
    // partition 0 at t0, t10, t20, t30; partition 1 at t5, t25 (interleaved in time)
    append_then_wait(&f, 0, 5).await; // t0
    append_then_wait(&f, 1, 5).await; // t5
    append_then_wait(&f, 0, 10).await; // t10
    append_then_wait(&f, 0, 5).await; // t20
    append_then_wait(&f, 1, 5).await; // t25
    append_then_wait(&f, 0, 0).await; // t30
    group(&f, GroupOptions::new().start_at(at(20))).await;
    assert_eq!(positions(&fetch(&f, 100).await), vec![(0, 3), (0, 4), (1, 2)]);
    assert_eq!(frontier(&f, 0).await, 2);
    assert_eq!(frontier(&f, 1).await, 1);
}

/// `start_at: t` with no event at or after t yet starts after the high
/// watermark: only new events are delivered.
pub async fn start_at_after_every_event_delivers_only_new_events(f: Fixture) {
    stream(&f, 2).await;
    append_to(&f, 0, 3).await;
    append_to(&f, 1, 1).await;
    group(&f, GroupOptions::new().start_at(at(3600))).await;
    assert!(fetch(&f, 100).await.is_empty(), "nothing before t is delivered");
    assert_eq!(lag_total(&f).await, 0);
    assert_eq!((frontier(&f, 0).await, frontier(&f, 1).await), (3, 1));
    f.clock.advance(secs(7200));
    append_to(&f, 0, 1).await;
    assert_eq!(positions(&fetch(&f, 100).await), vec![(0, 4)]);
}

/// The frontier starts at the start position minus one, so lag counts only
/// what the group is meant to consume.
pub async fn frontier_starts_before_start_position_so_lag_counts_only_what_to_consume(f: Fixture) {
    stream(&f, 1).await;
    for _ in 0..5 {
        append_then_wait(&f, 0, 10).await; // t0, t10, ..., t40
    }
    group_named(&f, "all", GroupOptions::new()).await;
    group_named(&f, "after", GroupOptions::new().start_after(3)).await;
    group_named(&f, "at", GroupOptions::new().start_at(at(30))).await;
    group_named(&f, "latest", GroupOptions::new().start(StartPosition::Latest)).await;
    for (name, frontier, lag) in [("all", 0, 5), ("after", 3, 2), ("at", 3, 2), ("latest", 5, 0)] {
        let l = f.rheo.lag(S, name).await.expect("lag");
        assert_eq!((l.partitions[0].frontier, l.total), (frontier, lag), "group {name}");
        assert_eq!(l.partitions[0].high_watermark, 5);
    }
}

/// A start beyond the high watermark: nothing now, and only sequences past it later.
pub async fn start_after_beyond_high_watermark_waits_for_later_sequences(f: Fixture) {
    stream(&f, 1).await;
    append_to(&f, 0, 3).await;
    group(&f, GroupOptions::new().start_after(10)).await;
    assert!(fetch(&f, 10).await.is_empty());
    assert_eq!(lag_total(&f).await, 0, "lag is never negative");
    append_to(&f, 0, 8).await;
    assert_eq!(positions(&fetch(&f, 10).await), vec![(0, 11)]);
    assert_eq!(lag_total(&f).await, 1);
}

/// A group limited to some partitions never gets the others, and its lag counts only its own.
pub async fn group_partitions_scope_deliveries_and_lag(f: Fixture) {
    stream(&f, 3).await;
    group(&f, GroupOptions::new().partitions([2, 1])).await;
    for p in 0..3 {
        append_to(&f, p, 2).await;
    }
    assert_eq!(positions(&fetch(&f, 100).await), vec![(1, 1), (1, 2), (2, 1), (2, 2)]);
    let lag = f.rheo.lag(S, G).await.expect("lag");
    assert_eq!(lag.partitions.iter().map(|p| p.partition).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(lag.total, 4);
    let summary = &f.rheo.list_groups(S).await.expect("list")[0];
    let mut parts = summary.partitions.clone().expect("the group's partitions are listed");
    parts.sort_unstable();
    assert_eq!(parts, vec![1, 2]);
}

/// `ensure_group` creates a missing group, returns an existing one with its
/// position kept, and refuses other options.
pub async fn ensure_group_creates_once_keeps_position_and_checks_options(f: Fixture) {
    f.rheo.create_stream(S, rheo::StreamOptions::new().partitions(2)).await.expect("stream");
    f.rheo.append(S, &serde_json::json!({"n": 1}), rheo::AppendOptions::new().partition(0)).await.expect("append");
    let opts = || rheo::GroupOptions::new().max_attempts(2).partitions(vec![0]);
    f.rheo.ensure_group(S, G, opts()).await.expect("create");
    let leases = f.rheo.fetch(S, G, rheo::FetchOptions::new()).await.expect("fetch");
    f.rheo.ack(&leases[0]).await.expect("ack");
    let again = f.rheo.ensure_group(S, G, opts()).await.expect("existing");
    assert_eq!((again.max_attempts, again.partitions), (2, Some(vec![0])));
    assert_eq!(f.rheo.lag(S, G).await.expect("lag").total, 0, "its position is kept");
    let e = f.rheo.ensure_group(S, G, rheo::GroupOptions::new().max_attempts(3).partitions(vec![0])).await;
    assert!(matches!(e, Err(rheo::Error::InvalidArgument { .. })), "{e:?}");
}

/// A group may start after the largest sequence there can be: its fetches
/// find nothing and nothing overflows.
pub async fn start_after_the_largest_sequence_fetches_nothing(f: Fixture) {
    f.rheo.create_stream(S, rheo::StreamOptions::new()).await.expect("stream");
    f.rheo.append(S, &serde_json::json!({"n": 1}), rheo::AppendOptions::new()).await.expect("append");
    f.rheo.create_group(S, G, GroupOptions::new().start_after(u64::MAX)).await.expect("group");
    assert!(f.rheo.fetch(S, G, FetchOptions::new()).await.expect("fetch").is_empty());
    f.rheo.replay(S, G, ReplayOptions::from_sequence(u64::MAX)).await.expect("replay past the end");
    assert!(f.rheo.fetch(S, G, FetchOptions::new()).await.expect("fetch").is_empty());
}
