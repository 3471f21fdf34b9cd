//! Ops inspect: list streams and groups, group info, capabilities.

use rheo::{Backoff, GroupOptions, StreamOptions};

use crate::common::{Fixture, START};
use crate::support::*;

/// `list_streams` lists every stream by name, with partitions and high watermarks.
pub async fn list_streams_lists_every_stream_by_name(f: Fixture) {
    assert!(f.rheo.list_streams().await.expect("list").is_empty());
    f.rheo.create_stream("b-stream", StreamOptions::new().partitions(2).indexes(["total"])).await.expect("create");
    f.clock.advance(secs(1));
    f.rheo.create_stream("a-stream", StreamOptions::new()).await.expect("create");
    f.rheo.append("b-stream", &serde_json::json!({}), rheo::AppendOptions::new().partition(1)).await.expect("append");
    let listed = f.rheo.list_streams().await.expect("list");
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a-stream", "b-stream"]);
    assert_eq!((listed[0].partition_count, listed[0].created_at), (1, at(1)));
    assert_eq!(listed[1].high_watermarks, vec![0, 1]);
    assert_eq!(listed[1].indexes, vec!["total".to_owned()]);
}

/// `list_groups` lists a stream's groups by name, with their settings.
pub async fn list_groups_lists_the_groups_of_a_stream(f: Fixture) {
    stream(&f, 2).await;
    f.rheo.create_stream("other", StreamOptions::new()).await.expect("create");
    f.rheo.create_group(S, "zeta", GroupOptions::new().max_attempts(2)).await.expect("create");
    f.rheo.create_group(S, "alpha", GroupOptions::new().partitions([1])).await.expect("create");
    f.rheo.create_group("other", "beta", GroupOptions::new()).await.expect("create");
    let groups = f.rheo.list_groups(S).await.expect("list");
    let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["alpha", "zeta"]);
    assert_eq!(groups[0].partitions, Some(vec![1]));
    assert_eq!(groups[1].max_attempts, 2);
    assert!(groups.iter().all(|g| g.created_at == START));
    assert_eq!(f.rheo.list_groups("other").await.expect("list").len(), 1);
}

/// `group_info` = the group's settings, lag, in-flight, retry-waiting and dead-letter counts.
pub async fn group_info_reports_lag_inflight_and_dead_letters(f: Fixture) {
    stream(&f, 1).await;
    group(&f, GroupOptions::new().retry_backoff(Backoff::Fixed(secs(60)))).await;
    append_to(&f, 0, 6).await;
    let leases = fetch(&f, 4).await;
    f.rheo.ack(&leases[0]).await.expect("ack");
    f.rheo.reject(&leases[1], "bad").await.expect("reject");
    f.rheo.retry(&leases[2], "later").await.expect("retry");
    let info = f.rheo.group_info(S, G).await.expect("info");
    assert_eq!(info.summary.name, G);
    assert_eq!(info.inflight, 1, "sequence 4 is leased");
    assert_eq!(info.retry_waiting, 1, "sequence 3 waits out its backoff");
    assert_eq!(info.dead_letters, 1);
    assert_eq!(info.lag, f.rheo.lag(S, G).await.expect("lag"));
    assert_eq!(info.lag.total, 4, "frontier 2 of 6");
    f.clock.advance(secs(120));
    let info = f.rheo.group_info(S, G).await.expect("info");
    assert_eq!(info.inflight, 1, "an expired lease not yet reclaimed still counts as in flight");
}

/// Every backend promises at-least-once delivery and lease fencing, and answers ping.
pub async fn capabilities_promise_at_least_once_and_lease_fencing(f: Fixture) {
    let caps = f.rheo.capabilities();
    assert!(caps.at_least_once());
    assert!(caps.lease_fencing());
    assert!(!caps.backend.is_empty());
    f.rheo.ping().await.expect("ping");
}

/// A backend with consumer groups answers the ops-inspect calls and says so.
pub async fn capabilities_announce_ops_inspect(f: Fixture) {
    assert!(f.rheo.capabilities().ops_inspect, "this suite lists streams and groups, so the backend must answer them");
    f.rheo.list_streams().await.expect("list_streams");
}
