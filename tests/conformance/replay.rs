//! `replay`: reopen deliveries from a sequence, from a time, or by query.

use rheo::{AppendOptions, DeadLetterOptions, Error, Query, ReplayOptions};
use serde_json::json;

use crate::common::Fixture;
use crate::support::*;

/// `replay(from_sequence: s)` reopens acked deliveries above s; they are
/// claimable again and the count of reopened events is returned.
pub async fn replay_from_sequence_reopens_acked_deliveries(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 5).await;
    drain(&f, G).await;
    assert_eq!(lag_total(&f).await, 0);
    let reopened = f.rheo.replay(S, G, ReplayOptions::from_sequence(2)).await.expect("replay");
    assert_eq!(reopened, 3);
    assert_eq!(lag_total(&f).await, 3);
    assert_eq!(sequences(&fetch(&f, 10).await), vec![3, 4, 5]);
}

/// After `replay(from_sequence: s)` the frontier is min(F, s).
pub async fn replay_from_sequence_sets_frontier_to_min_of_frontier_and_s(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 6).await;
    drain(&f, G).await;
    f.rheo.replay(S, G, ReplayOptions::from_sequence(3)).await.expect("replay");
    assert_eq!(frontier(&f, 0).await, 3, "F = 6 > s = 3");
    let reopened = f.rheo.replay(S, G, ReplayOptions::from_sequence(5)).await.expect("replay");
    assert_eq!(reopened, 0, "4..6 are already open");
    assert_eq!(frontier(&f, 0).await, 3, "F = 3 < s = 5");
    let leases = fetch(&f, 10).await;
    assert_eq!(sequences(&leases), vec![4, 5, 6]);
    ack_all(&f, &leases).await;
    assert_eq!(frontier(&f, 0).await, 6);
}

/// Leases in flight when a replay runs stay valid and are not handed out twice.
pub async fn replay_keeps_in_flight_leases_valid(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 5).await;
    let leases = fetch(&f, 5).await;
    for i in [0, 1, 4] {
        f.rheo.ack(&leases[i]).await.expect("ack");
    }
    let reopened = f.rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay");
    assert_eq!(reopened, 3, "only the acked ones are reopened");
    assert_eq!(sequences(&fetch(&f, 10).await), vec![1, 2, 5], "3 and 4 are still leased");
    f.rheo.ack(&leases[2]).await.expect("an in-flight lease survives the replay");
    f.rheo.renew(&leases[3], secs(30)).await.expect("renew survives too");
    f.rheo.ack(&leases[3]).await.expect("ack");
}

/// `replay(from: t)` reopens, per partition, from the first event at or after
/// t; partitions with no such event are untouched.
pub async fn replay_from_time_reopens_per_partition(f: Fixture) {
    setup(&f, 3).await;
    append_then_wait(&f, 2, 5).await; // p2 #1 t0
    append_then_wait(&f, 0, 5).await; // p0 #1 t5
    append_then_wait(&f, 1, 5).await; // p1 #1 t10
    append_then_wait(&f, 0, 10).await; // p0 #2 t15
    append_then_wait(&f, 0, 5).await; // p0 #3 t25
    append_then_wait(&f, 1, 0).await; // p1 #2 t30
    drain(&f, G).await;
    let reopened = f.rheo.replay(S, G, ReplayOptions::from_time(at(15))).await.expect("replay");
    assert_eq!(reopened, 3);
    assert_eq!(positions(&fetch(&f, 10).await), vec![(0, 2), (0, 3), (1, 2)]);
    let lag = f.rheo.lag(S, G).await.expect("lag");
    let frontiers: Vec<u64> = lag.partitions.iter().map(|p| p.frontier).collect();
    assert_eq!(frontiers, vec![1, 1, 1]);
}

/// `replay(from: t)` with no event at or after t in any partition is `NoEventsInRange`.
pub async fn replay_from_time_without_events_is_no_events_in_range(f: Fixture) {
    setup(&f, 2).await;
    append_to(&f, 0, 2).await;
    drain(&f, G).await;
    let e = assert_err!(
        f.rheo.replay(S, G, ReplayOptions::from_time(at(60))).await,
        Error::NoEventsInRange { ref stream, ref group, .. } if stream == S && group == G
    );
    assert_mentions(&e, &[S, G]);
    assert_eq!(lag_total(&f).await, 0, "nothing was reopened");
}

/// `replay(query: q)` reopens exactly the matching events.
pub async fn replay_query_reopens_exactly_matching_events(f: Fixture) {
    setup(&f, 2).await;
    for i in 0..8u32 {
        let kind = if i % 3 == 0 { "refund" } else { "sale" };
        f.rheo.append(S, &json!({"type": kind, "i": i}), AppendOptions::new().partition(i % 2)).await.expect("append");
    }
    drain(&f, G).await;
    let q = Query::new(S).eq("type", "refund");
    let expected = event_positions(&f.rheo.query(&q).await.expect("query"));
    assert_eq!(expected, vec![(0, 1), (1, 2), (0, 4)]);
    let reopened = f.rheo.replay(S, G, ReplayOptions::query(q)).await.expect("replay");
    assert_eq!(reopened, 3);
    let leases = fetch(&f, 100).await;
    let mut got = positions(&leases);
    got.sort_unstable();
    assert_eq!(got, vec![(0, 1), (0, 4), (1, 2)]);
    assert_eq!(lag_total(&f).await, 7, "frontiers fall back to the first reopened event");
    for r in f.rheo.ack_many(&leases).await.expect("ack") {
        r.expect("acked");
    }
    assert_eq!(lag_total(&f).await, 0, "acked again, the frontiers pass the events settled before the replay");
}

/// `replay` with none of from_sequence / from / query is `InvalidReplayOpts`.
pub async fn replay_without_options_is_invalid_replay_opts(f: Fixture) {
    setup(&f, 1).await;
    let e = assert_err!(
        f.rheo.replay(S, G, ReplayOptions::new()).await,
        Error::InvalidReplayOpts { ref stream, ref group, .. } if stream == S && group == G
    );
    assert_mentions(&e, &[S, G]);
}

/// `replay` with several of from_sequence / from / query is `InvalidReplayOpts`,
/// as is a query on another stream; nothing is reopened.
pub async fn replay_with_several_options_is_invalid_replay_opts(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 2).await;
    drain(&f, G).await;
    let several = [
        replay_of(Some(0), Some(at(0)), None),
        replay_of(Some(0), None, Some(Query::new(S))),
        replay_of(None, Some(at(0)), Some(Query::new(S))),
        replay_of(Some(0), Some(at(0)), Some(Query::new(S))),
        ReplayOptions::query(Query::new("another-stream")),
    ];
    for opts in several {
        assert_err!(f.rheo.replay(S, G, opts).await, Error::InvalidReplayOpts { .. });
    }
    assert_eq!(lag_total(&f).await, 0);
}

/// Replay reopens dead letters: they leave the dead-letter list and are delivered again.
pub async fn replay_reopens_dead_letters(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 3).await;
    let leases = fetch(&f, 3).await;
    f.rheo.ack(&leases[0]).await.expect("ack");
    f.rheo.reject(&leases[1], "bad").await.expect("reject");
    f.rheo.reject(&leases[2], "bad").await.expect("reject");
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").dead_letters, 2);
    let reopened = f.rheo.replay(S, G, ReplayOptions::from_sequence(2)).await.expect("replay");
    assert_eq!(reopened, 1);
    let dead = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq");
    assert_eq!(dead.iter().map(|d| d.sequence).collect::<Vec<_>>(), vec![2]);
    let q = Query::new(S).eq("sequence", 2);
    assert_eq!(f.rheo.replay(S, G, ReplayOptions::query(q)).await.expect("replay by query"), 1);
    assert!(f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq").is_empty());
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").dead_letters, 0);
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2, 3]);
}

/// A partition-scoped replay leaves the other partitions alone.
pub async fn replay_partition_scope_leaves_other_partitions(f: Fixture) {
    setup(&f, 2).await;
    append_to(&f, 0, 2).await;
    append_to(&f, 1, 2).await;
    drain(&f, G).await;
    let reopened = f.rheo.replay(S, G, ReplayOptions::from_sequence(0).partitions([1])).await.expect("replay");
    assert_eq!(reopened, 2);
    assert_eq!(positions(&fetch(&f, 10).await), vec![(1, 1), (1, 2)]);
    assert_eq!(frontier(&f, 0).await, 2);
}

/// A replay counts only events that exist: positions settled ahead of the
/// log (a start after a sequence not yet appended) are not "reopened".
pub async fn replay_counts_only_events_that_exist(f: Fixture) {
    stream(&f, 1).await;
    group(&f, rheo::GroupOptions::new().start(rheo::StartPosition::After(10))).await;
    let events = append_to(&f, 0, 3).await;
    let by_id = Query::new(S).is_in("id", vec![serde_json::json!(events[1].id())]);
    assert_eq!(f.rheo.replay(S, G, ReplayOptions::query(by_id)).await.expect("replay by query"), 1);
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2], "only the replayed event is due");
    assert_eq!(f.rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay"), 2, "events 1 and 3");
}

/// Replay options with these starts set, valid or not.
fn replay_of(from_sequence: Option<u64>, from: Option<rheo::Timestamp>, query: Option<Query>) -> ReplayOptions {
    let mut opts = ReplayOptions::new();
    opts.from_sequence = from_sequence;
    opts.from = from;
    opts.query = query;
    opts
}
