//! Scheduled delivery (docs/semantics.md, "Scheduled delivery"; ADR 0036):
//! an event appended with a `deliver_at` time is readable at once, counted
//! as unsettled, and claimed by no group before its time; due events behind
//! it are claimed in order; replays and resets keep its schedule.
//!
//! A backend without it ([`rheo::Capabilities::scheduled_delivery`] false)
//! must refuse a scheduled append with `Unsupported` and store nothing;
//! each case checks that instead.

use rheo::{AppendOptions, Error, FetchOptions, GroupOptions, Query, ReplayOptions, ResetOptions};
use serde_json::json;
use std::time::Duration;

use crate::common::Fixture;
use crate::support::*;

/// Creates `S` with `partitions` partitions and group `G`; false (after
/// checking that a scheduled append is refused and stores nothing) when
/// the backend does not schedule.
async fn scheduling(f: &Fixture, partitions: u32) -> bool {
    setup(f, partitions).await;
    if f.rheo.capabilities().scheduled_delivery {
        return true;
    }
    let e = f.rheo.append(S, &json!({"type": "later"}), AppendOptions::new().delay(secs(60))).await;
    let err = assert_err!(e, Error::Unsupported { .. });
    assert_mentions(&err, &["scheduled delivery"]);
    let metadata = json!({"type": "later", "metadata": {"deliver_at": at(60).as_millis()}});
    assert_err!(f.rheo.append(S, &metadata, AppendOptions::new()).await, Error::Unsupported { .. });
    assert!(f.rheo.read(S, 0, 0, 10).await.expect("read").is_empty(), "a refused append stores nothing");
    false
}

/// Appends one event `{"type": "tick", "n": n}` to partition 0 with `opts`.
async fn append_with(f: &Fixture, n: u64, opts: AppendOptions) -> rheo::Event {
    f.rheo.append(S, &json!({"type": "tick", "n": n}), opts.partition(0)).await.expect("append")
}

/// A scheduled event is stored and readable at once, with its time in the
/// metadata (`deliver_at`, milliseconds) and queryable there; no fetch
/// claims it before its time; the group counts it as unsettled (lag) and as
/// scheduled (group info, with the time); at its time it is claimed with
/// its first attempt.
pub async fn a_scheduled_event_is_readable_at_once_and_claimed_only_at_its_time(f: Fixture) {
    if !scheduling(&f, 1).await {
        return;
    }
    let e = append_with(&f, 0, AppendOptions::new().delay(secs(60))).await;
    assert_eq!(e.deliver_at(), Some(at(60)));
    assert_eq!(e.metadata()["deliver_at"], json!(at(60).as_millis()));
    let read = f.rheo.read(S, 0, 0, 10).await.expect("read");
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].deliver_at(), Some(at(60)), "the time is stored with the event");
    let q = Query::new(S).gt("metadata.deliver_at", at(30).as_millis());
    assert_eq!(f.rheo.query(&q).await.expect("query").len(), 1, "and queryable");

    let report = f.rheo.fetch_report(S, G, FetchOptions::new().limit(10)).await.expect("fetch");
    assert!(report.leases.is_empty(), "not before its time");
    assert_eq!(report.scheduled, 1, "the fetch set it aside");
    assert_eq!(lag_total(&f).await, 1, "unsettled: counted in the lag");
    let info = f.rheo.group_info(S, G).await.expect("group_info");
    assert_eq!((info.scheduled, info.next_due, info.retry_waiting), (1, Some(at(60)), 0));

    f.clock.advance(secs(59));
    assert!(fetch(&f, 10).await.is_empty(), "a millisecond early is still early");
    f.clock.advance(secs(1));
    let leases = fetch(&f, 10).await;
    assert_eq!(sequences(&leases), vec![1]);
    assert_eq!(leases[0].attempt, 1, "setting it aside used no attempt");
    assert_eq!(leases[0].event.deliver_at(), Some(at(60)));
    let info = f.rheo.group_info(S, G).await.expect("group_info");
    assert_eq!((info.scheduled, info.next_due, info.inflight), (0, None, 1));
    ack_all(&f, &leases).await;
    assert_eq!(lag_total(&f).await, 0);
}

/// Due events behind a scheduled one are claimed at once, in sequence
/// order; the frontier waits at the scheduled one until it is settled.
pub async fn due_events_behind_a_scheduled_one_are_claimed_in_order(f: Fixture) {
    if !scheduling(&f, 2).await {
        return;
    }
    append_with(&f, 0, AppendOptions::new()).await;
    append_with(&f, 1, AppendOptions::new().deliver_at(at(120))).await;
    append_with(&f, 2, AppendOptions::new()).await;
    append_with(&f, 3, AppendOptions::new().delay(secs(30))).await;
    append_with(&f, 4, AppendOptions::new()).await;
    f.rheo.append(S, &json!({"type": "tick"}), AppendOptions::new().partition(1)).await.expect("append");
    let leases = fetch(&f, 10).await;
    assert_eq!(positions(&leases), vec![(0, 1), (0, 3), (0, 5), (1, 1)]);
    ack_all(&f, &leases).await;
    assert_eq!(frontier(&f, 0).await, 1, "the frontier waits at the scheduled event");
    assert_eq!(partition_lag(&f, 0).await.lag, 4);

    f.clock.advance(secs(30));
    let four = fetch_leased(&f, 10, 600).await;
    assert_eq!(sequences(&four), vec![4], "the earlier time comes due first");
    f.clock.advance(secs(90));
    let leases = fetch(&f, 10).await;
    assert_eq!(sequences(&leases), vec![2]);
    ack_all(&f, &leases).await;
    assert_eq!(frontier(&f, 0).await, 3, "the lease on 4 is still out");
}

/// A time at or before now is due at once: the event is an ordinary one.
pub async fn a_time_already_past_is_due_at_once(f: Fixture) {
    if !scheduling(&f, 1).await {
        return;
    }
    append_with(&f, 0, AppendOptions::new().deliver_at(at(-10))).await;
    append_with(&f, 1, AppendOptions::new().deliver_at(at(0))).await;
    let report = f.rheo.fetch_report(S, G, FetchOptions::new().limit(10)).await.expect("fetch");
    assert_eq!(sequences(&report.leases), vec![1, 2]);
    assert_eq!(report.scheduled, 0);
}

/// `append_batch_with` schedules each event by its own options, and the
/// batch stays atomic.
pub async fn append_batch_schedules_each_event_by_its_options(f: Fixture) {
    if !scheduling(&f, 1).await {
        return;
    }
    let batch = vec![
        (json!({"n": 0}), AppendOptions::new().partition(0).delay(secs(10))),
        (json!({"n": 1}), AppendOptions::new().partition(0)),
        (json!({"n": 2}), AppendOptions::new().partition(0).deliver_at(at(5))),
    ];
    let events = f.rheo.append_batch_with(S, batch).await.expect("append_batch");
    let times: Vec<_> = events.iter().map(rheo::Event::deliver_at).collect();
    assert_eq!(times, vec![Some(at(10)), None, Some(at(5))]);
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2]);
    f.clock.advance(secs(5));
    assert_eq!(sequences(&fetch(&f, 10).await), vec![3]);
    f.clock.advance(secs(5));
    assert_eq!(sequences(&fetch(&f, 10).await), vec![1]);

    // Events with producer-given ids (an idempotent append, which some
    // backends write on a path of its own) keep their schedule too, and a
    // retry of the same id stores nothing new.
    let with_ids = || {
        vec![
            (json!({"n": 3}), AppendOptions::new().partition(0).id("reminder-3").delay(secs(10))),
            (json!({"n": 4}), AppendOptions::new().partition(0).id("reminder-4")),
        ]
    };
    let events = f.rheo.append_batch_with(S, with_ids()).await.expect("append_batch with ids");
    assert_eq!(events.iter().map(rheo::Event::deliver_at).collect::<Vec<_>>(), vec![Some(at(20)), None]);
    f.rheo.append_batch_with(S, with_ids()).await.expect("the same ids again");
    assert_eq!(sequences(&fetch(&f, 10).await), vec![5], "the id'd event with a time waits for it");
    f.clock.advance(secs(10));
    assert_eq!(sequences(&fetch(&f, 10).await), vec![4]);
}

/// A `deliver_at` that is not an integer (milliseconds) is refused, from
/// the options' metadata or the payload's, and nothing is stored.
pub async fn a_deliver_at_that_is_not_a_time_is_invalid_argument(f: Fixture) {
    setup(&f, 1).await;
    let opts = AppendOptions::new().metadata("deliver_at", "tomorrow");
    let err = assert_err!(f.rheo.append(S, &json!({}), opts).await, Error::InvalidArgument { .. });
    assert_mentions(&err, &["deliver_at", "orders", "milliseconds"]);
    let payload = json!({"metadata": {"deliver_at": 1.5}});
    assert_err!(f.rheo.append(S, &payload, AppendOptions::new()).await, Error::InvalidArgument { .. });
    assert!(f.rheo.read(S, 0, 0, 10).await.expect("read").is_empty());
}

/// A time outside four-digit years (before the epoch, after 9999) is
/// refused on every backend, so no backend holds an event another would
/// hand out at once; a batch holding one stores nothing.
pub async fn a_deliver_at_outside_four_digit_years_is_invalid_argument(f: Fixture) {
    setup(&f, 1).await;
    let year_10000 = 253_402_300_800_000_i64;
    for (what, opts) in [
        ("year 10000", AppendOptions::new().metadata("deliver_at", year_10000)),
        ("before the epoch", AppendOptions::new().metadata("deliver_at", -1)),
        ("a delay past year 9999", AppendOptions::new().delay(Duration::MAX)),
    ] {
        let err = f.rheo.append(S, &json!({}), opts).await.expect_err(what);
        assert!(matches!(err, Error::InvalidArgument { .. }), "{what}: {err:?}");
        assert_mentions(&err, &["deliver_at", "orders", "9999"]);
    }
    let last = AppendOptions::new().metadata("deliver_at", year_10000 - 1);
    let batch = vec![
        (json!({"n": 1}), AppendOptions::new()),
        (json!({"n": 2}), AppendOptions::new().metadata("deliver_at", year_10000)),
    ];
    assert_err!(f.rheo.append_batch_with(S, batch).await, Error::InvalidArgument { .. });
    assert!(f.rheo.read(S, 0, 0, 10).await.expect("read").is_empty(), "nothing of the batch is stored");
    if f.rheo.capabilities().scheduled_delivery {
        f.rheo.append(S, &json!({}), last).await.expect("the last millisecond of 9999 is a time");
    }
}

/// A replay reopens a settled scheduled event claimable only at its time;
/// a reset does the same for one set aside.
pub async fn replay_and_reset_keep_the_schedule(f: Fixture) {
    if !scheduling(&f, 1).await {
        return;
    }
    append_with(&f, 0, AppendOptions::new().delay(secs(600))).await;
    append_with(&f, 1, AppendOptions::new()).await;
    ack_all(&f, &fetch(&f, 10).await).await;
    // Settled without being delivered: skipped by an operator.
    assert!(f.rheo.skip(S, G, 0, 1, "not needed").await.expect("skip"));
    assert_eq!(lag_total(&f).await, 0);
    assert_eq!(f.rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay"), 2);
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2], "the replayed scheduled event waits for its time");
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").scheduled, 1);

    f.rheo.reset_group(S, G, ResetOptions::confirmed()).await.expect("reset");
    let report = f.rheo.fetch_report(S, G, FetchOptions::new().limit(10)).await.expect("fetch");
    assert_eq!(sequences(&report.leases), vec![2]);
    assert_eq!(report.scheduled, 1, "set aside again after the reset");
    ack_all(&f, &report.leases).await;
    f.clock.advance(secs(600));
    assert_eq!(sequences(&fetch(&f, 10).await), vec![1]);
}

/// Every group keeps the schedule on its own, and a retried scheduled
/// event follows the group's backoff once its time has passed.
pub async fn each_group_keeps_the_schedule_and_retries_follow_the_backoff(f: Fixture) {
    if !scheduling(&f, 1).await {
        return;
    }
    group_named(&f, G2, GroupOptions::new().retry_backoff(rheo::Backoff::Fixed(secs(5)))).await;
    append_with(&f, 0, AppendOptions::new().delay(secs(10))).await;
    assert!(fetch(&f, 10).await.is_empty());
    assert!(fetch_from(&f, G2, 10).await.is_empty());
    f.clock.advance(secs(10));
    let lease = fetch_from(&f, G2, 10).await.remove(0);
    f.rheo.retry(&lease, "later").await.expect("retry");
    assert!(fetch_from(&f, G2, 10).await.is_empty(), "the backoff holds it");
    let info = f.rheo.group_info(S, G2).await.expect("info");
    assert_eq!((info.retry_waiting, info.scheduled), (1, 0), "a retry is not a schedule");
    f.clock.advance(secs(5));
    assert_eq!(fetch_from(&f, G2, 10).await[0].attempt, 2);
    assert_eq!(sequences(&fetch(&f, 10).await), vec![1], "the first group on its own");
}

/// A fetch sets aside at most a bounded number of scheduled events (its
/// limit, at least 64, at most 1,024, shared by the partitions it looks
/// at) and says so; the next fetches go on from where it stopped, and the
/// due event behind a long run of scheduled ones is claimed once they are
/// all set aside, without any being claimed early. Another partition's
/// due events are claimed by the first fetch.
pub async fn a_fetch_sets_aside_a_bounded_number_and_the_next_goes_on(f: Fixture) {
    const AHEAD: u64 = 300;
    if !scheduling(&f, 2).await {
        return;
    }
    let batch: Vec<_> =
        (0..AHEAD).map(|n| (json!({"n": n}), AppendOptions::new().partition(0).deliver_at(at(3600)))).collect();
    f.rheo.append_batch_with(S, batch).await.expect("append");
    append_with(&f, AHEAD, AppendOptions::new()).await;
    f.rheo.append(S, &json!({"type": "tick"}), AppendOptions::new().partition(1)).await.expect("append");
    let opts = FetchOptions::new().limit(10).lease(secs(7200));
    let first = f.rheo.fetch_report(S, G, opts.clone()).await.expect("fetch");
    assert_eq!(positions(&first.leases), vec![(1, 1)], "partition 1's due event at once");
    assert!(first.scheduled > 0 && first.scheduled <= 64, "a fetch of 10 sets aside at most 64: {}", first.scheduled);
    let (mut set_aside, mut fetches) = (first.scheduled, 1);
    let due = loop {
        let report = f.rheo.fetch_report(S, G, opts.clone()).await.expect("fetch");
        fetches += 1;
        assert!(report.scheduled <= 64, "{}", report.scheduled);
        set_aside += report.scheduled;
        if !report.leases.is_empty() {
            break report.leases;
        }
        assert!(report.scheduled > 0, "a fetch that set nothing aside and claimed nothing, with {set_aside} set aside");
        assert!(fetches < 100, "no progress");
    };
    assert_eq!(positions(&due), vec![(0, AHEAD + 1)], "only the due event, after the run");
    assert_eq!(set_aside, AHEAD, "each scheduled event set aside once");
    let info = f.rheo.group_info(S, G).await.expect("info");
    assert_eq!((info.scheduled, info.next_due), (AHEAD, Some(at(3600))));
    assert_eq!(partition_lag(&f, 0).await.lag, AHEAD + 1);
    f.clock.advance(secs(3600));
    let mut late = Vec::new();
    while (late.len() as u64) < AHEAD {
        let leases = fetch(&f, 100).await;
        assert!(!leases.is_empty(), "the scheduled events come due");
        late.extend(sequences(&leases));
        ack_all(&f, &leases).await;
    }
    assert_eq!(late, (1..=AHEAD).collect::<Vec<_>>(), "in sequence order once due");
}

/// After a fetch sets events aside it looks further ahead, but never claims
/// more than its limit: a run of scheduled events followed by many due
/// ones is drained `limit` at a time, in order, each due event once.
pub async fn a_fetch_past_scheduled_events_claims_at_most_its_limit(f: Fixture) {
    if !scheduling(&f, 1).await {
        return;
    }
    let mut batch: Vec<_> =
        (0..20).map(|n| (json!({"n": n}), AppendOptions::new().partition(0).deliver_at(at(3600)))).collect();
    batch.extend((20..70).map(|n| (json!({"n": n}), AppendOptions::new().partition(0))));
    f.rheo.append_batch_with(S, batch).await.expect("append");
    let mut due = Vec::new();
    for _ in 0..20 {
        let leases = fetch(&f, 10).await;
        assert!(leases.len() <= 10, "{} leases for a limit of 10", leases.len());
        if leases.is_empty() && due.len() == 50 {
            break;
        }
        due.extend(sequences(&leases));
        ack_all(&f, &leases).await;
    }
    assert_eq!(due, (21..=70).collect::<Vec<_>>(), "every due event once, in order");
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").scheduled, 20);
    assert_eq!(frontier(&f, 0).await, 0, "the scheduled ones hold the frontier");
}
