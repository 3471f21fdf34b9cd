//! Per-key order (docs/semantics.md, "Per-key order"; ADR 0037): in a
//! group created with `GroupOptions::ordered_by_key()`, at most one event
//! of a key is in flight, and the next event of a key in its partition is
//! claimable only once the one before it is settled; other keys, and
//! events without a key, go on in parallel.
//!
//! A backend without it ([`rheo::Capabilities::ordered_by_key`] false) must
//! refuse such a group with `Unsupported` and create nothing; each case
//! checks that instead.

use rheo::{AppendOptions, Error, FetchOptions, GroupOptions, ReplayOptions, RetryOutcome};
use serde_json::json;

use crate::common::Fixture;
use crate::support::*;

/// Creates `S` (one partition) and the keyed group `G`; false (after
/// checking that the group is refused and not created) when the backend
/// does not order by key.
async fn keyed(f: &Fixture) -> bool {
    keyed_with(f, GroupOptions::new()).await
}

async fn keyed_with(f: &Fixture, opts: GroupOptions) -> bool {
    stream(f, 1).await;
    if f.rheo.capabilities().ordered_by_key {
        group(f, opts.ordered_by_key()).await;
        return true;
    }
    let err = assert_err!(f.rheo.create_group(S, G, opts.ordered_by_key()).await, Error::Unsupported { .. });
    assert_mentions(&err, &["ordered_by_key"]);
    assert!(f.rheo.list_groups(S).await.expect("list groups").is_empty(), "a refused group is not created");
    false
}

/// Appends one event per key to partition 0 (`None`: no key), in order;
/// their sequences are 1, 2, ...
async fn append_keys(f: &Fixture, keys: &[Option<&str>]) {
    for (i, k) in keys.iter().enumerate() {
        let mut opts = AppendOptions::new().partition(0);
        if let Some(k) = k {
            opts = opts.key(k);
        }
        f.rheo.append(S, &json!({"type": "step", "i": i}), opts).await.expect("append");
    }
}

/// A fetch hands out the first event of each key and every event without
/// a key; the next of a key comes once the one before it is acked.
pub async fn one_event_per_key_is_in_flight_and_the_next_follows_the_ack(f: Fixture) {
    if !keyed(&f).await {
        return;
    }
    append_keys(&f, &[Some("a"), Some("b"), Some("a"), None, Some("b"), Some("a"), None, Some("c")]).await;
    let first = fetch(&f, 100).await;
    assert_eq!(sequences(&first), vec![1, 2, 4, 7, 8], "a, b, two without a key, c");
    assert!(fetch(&f, 100).await.is_empty(), "a2, b2 and a3 wait for their keys");
    assert_eq!(lag_total(&f).await, 8, "waiting events count as unsettled");
    f.rheo.ack(&first[0]).await.expect("ack a1");
    let next = fetch(&f, 100).await;
    assert_eq!(sequences(&next), vec![3], "a2 follows a1, and nothing else");
    ack_all(&f, &next).await;
    ack_all(&f, &first[1..]).await;
    assert_eq!(sequences(&fetch(&f, 100).await), vec![5, 6], "b2 after b1, a3 after a2");
}

/// A retry keeps the key: the retried event is redelivered before the
/// next of its key, which waits through the backoff too.
pub async fn a_retry_keeps_the_key_until_the_event_is_settled(f: Fixture) {
    if !keyed(&f).await {
        return;
    }
    append_keys(&f, &[Some("a"), Some("a"), Some("b")]).await;
    let leases = fetch(&f, 10).await;
    assert_eq!(sequences(&leases), vec![1, 3]);
    f.rheo.ack(&leases[1]).await.expect("ack b");
    let out = f.rheo.retry_after(&leases[0], "later", secs(30)).await.expect("retry");
    assert!(matches!(out, RetryOutcome::Scheduled { .. }), "{out:?}");
    assert!(fetch(&f, 10).await.is_empty(), "a2 waits while a1 waits out its backoff");
    f.clock.advance(secs(31));
    let again = fetch(&f, 10).await;
    assert_eq!(sequences(&again), vec![1], "a1 again, not a2");
    assert_eq!(again[0].attempt, 2);
    ack_all(&f, &again).await;
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2]);
}

/// A dead letter unblocks its key: a reject, the last attempt running
/// out, and a skip each let the next event of the key go.
pub async fn a_dead_letter_unblocks_its_key(f: Fixture) {
    if !keyed_with(&f, GroupOptions::new().max_attempts(1)).await {
        return;
    }
    append_keys(&f, &[Some("a"), Some("a"), Some("a"), Some("a")]).await;
    let l = fetch(&f, 10).await;
    assert_eq!(sequences(&l), vec![1]);
    f.rheo.reject(&l[0], "bad").await.expect("reject");
    let l = fetch_leased(&f, 10, 5).await;
    assert_eq!(sequences(&l), vec![2], "a rejected event unblocks its key");
    // The lease runs out on its last attempt: the next fetch dead-letters
    // it (and may return before the next of its key), not redelivered.
    f.clock.advance(secs(6));
    let mut l = fetch(&f, 10).await;
    if l.is_empty() {
        l = fetch(&f, 10).await;
    }
    assert_eq!(sequences(&l), vec![3], "a dead letter out of attempts unblocks its key");
    assert!(f.rheo.skip(S, G, 0, 3, "operator").await.expect("skip"));
    let l = fetch(&f, 10).await;
    assert_eq!(sequences(&l), vec![4], "a skipped event unblocks its key");
    assert_eq!(f.rheo.dead_letters(S, G, Default::default()).await.expect("dead letters").len(), 3);
}

/// An expired lease releases its key to the same event, redelivered with
/// its next attempt; the next of the key still waits.
pub async fn an_expired_lease_is_redelivered_before_the_next_of_its_key(f: Fixture) {
    if !keyed(&f).await {
        return;
    }
    append_keys(&f, &[Some("a"), Some("a")]).await;
    let l = fetch_leased(&f, 10, 5).await;
    assert_eq!(sequences(&l), vec![1]);
    f.clock.advance(secs(6));
    let l = fetch(&f, 10).await;
    assert_eq!(sequences(&l), vec![1]);
    assert_eq!(l[0].attempt, 2);
    ack_all(&f, &l).await;
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2]);
}

/// Competing consumers never hold two events of one key at once, and
/// together see every event of each key in order.
pub async fn competing_consumers_never_share_a_key(f: Fixture) {
    if !keyed(&f).await {
        return;
    }
    let keys = ["a", "b", "c"];
    let all: Vec<Option<&str>> = (0..30).map(|i| Some(keys[i % 3])).collect();
    append_keys(&f, &all).await;
    let mut seen: Vec<Vec<u64>> = vec![Vec::new(); 3];
    for round in 0..20 {
        let mut held = Vec::new();
        for c in ["c1", "c2"] {
            let opts = FetchOptions::new().limit(2).consumer(c);
            held.extend(f.rheo.fetch(S, G, opts).await.expect("fetch"));
        }
        let mut held_keys: Vec<&str> = held.iter().filter_map(|l| l.event.key()).collect();
        let n = held_keys.len();
        held_keys.sort_unstable();
        held_keys.dedup();
        assert_eq!(held_keys.len(), n, "round {round}: one event per key in flight");
        for l in &held {
            let k = keys.iter().position(|k| Some(*k) == l.event.key()).expect("a known key");
            seen[k].push(l.event.sequence());
        }
        ack_all(&f, &held).await;
    }
    for (k, seqs) in seen.iter().enumerate() {
        let want: Vec<u64> = (1..=30).filter(|s| (s - 1) % 3 == k as u64).collect();
        assert_eq!(seqs, &want, "key {}: every event once, in order", keys[k]);
    }
}

/// A replay reopens settled events of a key ahead of the one in flight:
/// they wait for it, then go in order.
pub async fn a_replay_reopens_a_key_in_order(f: Fixture) {
    if !keyed(&f).await {
        return;
    }
    append_keys(&f, &[Some("a"), Some("a"), Some("a")]).await;
    for want in [1, 2] {
        let l = fetch(&f, 10).await;
        assert_eq!(sequences(&l), vec![want]);
        ack_all(&f, &l).await;
    }
    let held = fetch(&f, 10).await;
    assert_eq!(sequences(&held), vec![3]);
    assert_eq!(f.rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay"), 2);
    assert!(fetch(&f, 10).await.is_empty(), "a1 and a2 wait while a3 is in flight");
    ack_all(&f, &held).await;
    for want in [1, 2] {
        let l = fetch(&f, 10).await;
        assert_eq!(sequences(&l), vec![want], "replayed in order");
        ack_all(&f, &l).await;
    }
    assert_eq!(lag_total(&f).await, 0);
}

/// A scheduled event holds its key until it is delivered and settled:
/// the next of its key waits for it even when due.
pub async fn a_scheduled_event_holds_its_key_until_settled(f: Fixture) {
    if !keyed(&f).await || !f.rheo.capabilities().scheduled_delivery {
        return;
    }
    let later = AppendOptions::new().partition(0).key("a").delay(secs(60));
    f.rheo.append(S, &json!({"i": 0}), later).await.expect("append");
    append_keys(&f, &[Some("a"), Some("b")]).await;
    let b = fetch(&f, 10).await;
    assert_eq!(sequences(&b), vec![3], "a2 waits for the scheduled a1; b goes");
    ack_all(&f, &b).await;
    f.clock.advance(secs(61));
    let l = fetch(&f, 10).await;
    assert_eq!(sequences(&l), vec![1]);
    ack_all(&f, &l).await;
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2]);
}

/// An expired lease whose key went to an earlier event (one a replay
/// reopened) cannot be renewed: that would put two of the key in flight.
pub async fn an_expired_lease_whose_key_moved_on_cannot_be_renewed(f: Fixture) {
    if !keyed(&f).await {
        return;
    }
    append_keys(&f, &[Some("a"), Some("a")]).await;
    ack_all(&f, &fetch(&f, 10).await).await;
    let e2 = fetch_leased(&f, 10, 5).await;
    assert_eq!(sequences(&e2), vec![2]);
    assert_eq!(f.rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay"), 1);
    f.clock.advance(secs(6));
    let e1 = fetch(&f, 10).await;
    assert_eq!(sequences(&e1), vec![1], "the reopened earlier event goes first once e2's lease expired");
    let err = assert_err!(f.rheo.renew(&e2[0], secs(30)).await, Error::StaleLease { .. });
    assert_mentions(&err, &["orders", "billing"]);
    ack_all(&f, &e1).await;
    let again = fetch(&f, 10).await;
    assert_eq!(sequences(&again), vec![2], "e2 comes back once e1 is settled");
    assert_eq!(again[0].attempt, 2);
}

/// An event behind its key and scheduled later is counted as scheduled
/// (with its time) and waits for both its key and its time.
pub async fn an_event_behind_its_key_and_its_time_waits_for_both(f: Fixture) {
    if !keyed(&f).await || !f.rheo.capabilities().scheduled_delivery {
        return;
    }
    append_keys(&f, &[Some("a")]).await;
    let later = AppendOptions::new().partition(0).key("a").delay(secs(60));
    f.rheo.append(S, &json!({"i": 1}), later).await.expect("append");
    let a1 = fetch(&f, 10).await;
    assert_eq!(sequences(&a1), vec![1]);
    let info = f.rheo.group_info(S, G).await.expect("info");
    assert_eq!((info.scheduled, info.next_due), (1, Some(at(60))), "a2 is counted as scheduled");
    ack_all(&f, &a1).await;
    assert!(fetch(&f, 10).await.is_empty(), "a2's key is free, its time is not");
    f.clock.advance(secs(61));
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2]);
}

/// `ensure_group` keeps a keyed group keyed and refuses to take an
/// unkeyed group for a keyed one (or the reverse): another order is
/// `InvalidArgument`, naming the option, and changes nothing.
pub async fn ensure_group_checks_the_order(f: Fixture) {
    if !keyed(&f).await {
        return;
    }
    let kept = f.rheo.ensure_group(S, G, GroupOptions::new().ordered_by_key()).await.expect("ensure the keyed group");
    assert!(kept.ordered_by_key);
    let err = assert_err!(f.rheo.ensure_group(S, G, GroupOptions::new()).await, Error::InvalidArgument { .. });
    assert_mentions(&err, &["ordered_by_key", G]);
    f.rheo.create_group(S, "plain", GroupOptions::new()).await.expect("an unkeyed group");
    let err = assert_err!(
        f.rheo.ensure_group(S, "plain", GroupOptions::new().ordered_by_key()).await,
        Error::InvalidArgument { .. }
    );
    assert_mentions(&err, &["ordered_by_key", "plain"]);
    let groups = f.rheo.list_groups(S).await.expect("list groups");
    let order: Vec<(&str, bool)> = groups.iter().map(|g| (g.name.as_str(), g.ordered_by_key)).collect();
    assert!(order.contains(&(G, true)) && order.contains(&("plain", false)), "{order:?}");
}

/// A position skipped before any fetch and then replayed keeps its key:
/// the replayed pair of one key goes one at a time, in order.
pub async fn a_skipped_then_replayed_event_keeps_its_key(f: Fixture) {
    if !keyed(&f).await {
        return;
    }
    append_keys(&f, &[Some("a"), Some("a")]).await;
    assert!(f.rheo.skip(S, G, 0, 2, "not needed").await.expect("skip"));
    let a1 = fetch(&f, 10).await;
    assert_eq!(sequences(&a1), vec![1]);
    ack_all(&f, &a1).await;
    assert_eq!(f.rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay"), 2);
    let first = fetch(&f, 10).await;
    assert_eq!(sequences(&first), vec![1], "a2 waits for the replayed a1");
    ack_all(&f, &first).await;
    assert_eq!(sequences(&fetch(&f, 10).await), vec![2]);
}

/// A replay that reaches back before the group's start reopens the
/// positions it never delivered: a key's event there goes before the
/// key's later event the group had already settled, however far back, and
/// even while every position before it is held by consumers (so the later
/// one is the only claimable delivery a backend has in store).
pub async fn a_replay_before_the_start_keeps_each_key_in_order(f: Fixture) {
    const BEFORE: u64 = 1000;
    if !f.rheo.capabilities().ordered_by_key {
        keyed(&f).await;
        return;
    }
    stream(&f, 1).await;
    let filler: Vec<_> =
        (1..BEFORE).map(|i| (json!({"type": "filler", "i": i}), AppendOptions::new().partition(0))).collect();
    f.rheo.append_batch_with(S, filler).await.expect("append");
    append_keys(&f, &[Some("a")]).await;
    group(&f, GroupOptions::new().start_after(BEFORE).ordered_by_key()).await;
    append_keys(&f, &[Some("a")]).await;
    let late = fetch(&f, 10).await;
    assert_eq!(sequences(&late), vec![BEFORE + 1]);
    ack_all(&f, &late).await;
    f.rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay");
    // Held, not settled: fetches go on past what is in flight.
    let mut held = Vec::new();
    let mut keyed_order = Vec::new();
    for _ in 0..20 {
        let leases = fetch_leased(&f, 100, 3600).await;
        keyed_order.extend(sequences(&leases).into_iter().filter(|&q| q >= BEFORE));
        held.extend(leases);
        if !keyed_order.is_empty() {
            break;
        }
    }
    assert_eq!(keyed_order, vec![BEFORE], "the key's earlier event first, alone");
    for chunk in held.chunks(500) {
        let acks = f.rheo.ack_many(chunk.iter()).await.expect("ack_many");
        assert!(acks.iter().all(Result::is_ok), "every held lease acks");
    }
    assert_eq!(sequences(&fetch(&f, 10).await), vec![BEFORE + 1]);
}

/// A key with a long backlog behind an event in flight does not hold up
/// the other keys nor the events without a key: each is claimed within a
/// few fetches, and nothing of the busy key is.
pub async fn a_busy_key_does_not_hold_up_the_others(f: Fixture) {
    const BACKLOG: u64 = 600;
    if !keyed(&f).await {
        return;
    }
    append_keys(&f, &[Some("a")]).await;
    let a1 = fetch_leased(&f, 1, 3600).await;
    assert_eq!(sequences(&a1), vec![1]);
    let backlog: Vec<_> =
        (0..BACKLOG).map(|i| (json!({"type": "step", "i": i}), AppendOptions::new().partition(0).key("a"))).collect();
    f.rheo.append_batch_with(S, backlog).await.expect("append");
    append_keys(&f, &[Some("b"), None]).await;
    let mut got = Vec::new();
    for _ in 0..40 {
        got.extend(sequences(&fetch_leased(&f, 1, 3600).await));
        if got.len() >= 2 {
            break;
        }
    }
    assert_eq!(got, vec![BACKLOG + 2, BACKLOG + 3], "b, then the event without a key, past a's backlog");
}
