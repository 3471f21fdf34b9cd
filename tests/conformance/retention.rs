//! Retention (docs/semantics.md, "Retention"): what a pass drops, what the
//! groups see afterwards, and reads before the log start.
//!
//! The native backend drops whole sealed segments (4 KiB in the test
//! fixtures) and keeps its active segment, the database backends drop event
//! by event: every case asserts what holds for both (a limit is reached and
//! never undershot by more than a segment), and exact figures where the
//! rule is exact whatever the granularity (lag, skipped counts, reads).
//!
//! A backend without retention ([`rheo::Capabilities::retention`] false)
//! must refuse it with `Unsupported`; each case checks that instead.

use std::time::Duration;

use rheo::{
    AppendOptions, DeadLetterOptions, Error, FetchOptions, GroupOptions, Query, ReplayOptions, ResetOptions, Retention,
    RetentionPolicy, StartPosition, StreamInfo, StreamOptions,
};
use serde_json::json;

use crate::common::Fixture;
use crate::support::*;

/// Events most cases append to partition 0: about 12 native segments.
const N: u64 = 400;

/// Creates `S` (one partition) with `retention`; false (after checking the
/// refusal) when the backend has no retention.
async fn retained_stream(f: &Fixture, retention: Retention) -> bool {
    if !f.rheo.capabilities().retention {
        f.rheo.create_stream(S, StreamOptions::new()).await.expect("create");
        let e = f.rheo.set_retention(S, Retention::new().max_events(1)).await;
        assert_err!(e, Error::Unsupported { .. });
        assert_err!(f.rheo.enforce_retention(S).await, Error::Unsupported { .. });
        return false;
    }
    f.rheo.create_stream(S, StreamOptions::new().retention(retention)).await.expect("create");
    true
}

/// Appends `n` events `{"n": i}` to partition 0 of `S`, in batches.
async fn fill(f: &Fixture, n: u64) {
    let mut left = n;
    while left > 0 {
        let k = left.min(100);
        let batch: Vec<(serde_json::Value, AppendOptions)> =
            (0..k).map(|i| (json!({"n": n - left + i, "pad": "x".repeat(40)}), AppendOptions::new())).collect();
        f.rheo.append_batch_with(S, batch).await.expect("append");
        left -= k;
    }
}

async fn info(f: &Fixture) -> StreamInfo {
    f.rheo.stream_info(S).await.expect("stream_info")
}

/// The first and last sequence of partition 0.
async fn bounds(f: &Fixture) -> (u64, u64) {
    let i = info(f).await;
    (i.partitions[0].first_sequence, i.partitions[0].last_sequence)
}

/// Every retained event of partition 0 is readable, in order, from the
/// log start to the end; returns the sequences.
async fn retained(f: &Fixture) -> Vec<u64> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = f.rheo.read(S, 0, after, 100).await.expect("read");
        let Some(last) = page.last() else { break };
        after = last.sequence();
        out.extend(page.iter().map(|e| e.sequence()));
    }
    out
}

/// A stream keeps everything by default; `stream_info` reports each
/// partition's first and last sequence, size and the retention; a pass
/// drops nothing.
pub async fn a_stream_keeps_everything_by_default_and_reports_its_bounds(f: Fixture) {
    f.rheo.create_stream(S, StreamOptions::new().partitions(2)).await.expect("create");
    fill(&f, 20).await;
    let i = info(&f).await;
    assert_eq!(i.partitions.len(), 2);
    assert_eq!((i.partitions[0].first_sequence, i.partitions[0].last_sequence), (1, 20));
    assert_eq!((i.partitions[1].first_sequence, i.partitions[1].last_sequence, i.partitions[1].events()), (1, 0, 0));
    assert!(i.partitions[0].bytes > 0 && i.partitions[1].bytes == 0, "{:?}", i.partitions);
    assert!(i.retention.is_unlimited(), "{:?}", i.retention);
    assert_eq!(i.high_watermarks, vec![20, 0]);
    if f.rheo.capabilities().retention {
        let report = f.rheo.enforce_retention(S).await.expect("pass");
        assert!(report.dropped.is_empty() && report.skipped.is_empty(), "{report:?}");
    }
    assert_eq!(retained(&f).await.len(), 20);
}

/// `max_events` drops the oldest events; the partition keeps at least the
/// limit, reports its new first sequence, and reads, queries and sizes
/// follow it.
pub async fn max_events_drops_the_oldest_and_reads_begin_at_the_log_start(f: Fixture) {
    if !retained_stream(&f, Retention::new().max_events(50)).await {
        return;
    }
    fill(&f, N).await;
    let before = info(&f).await.partitions[0].bytes;
    let report = f.rheo.enforce_retention(S).await.expect("pass");
    let (first, last) = bounds(&f).await;
    assert_eq!(last, N);
    assert!(first > 1 && N - first + 1 >= 50, "kept {first}..={last}");
    assert_eq!(report.dropped.len(), 1, "{report:?}");
    assert_eq!((report.dropped[0].first, report.dropped[0].last), (1, first - 1), "{report:?}");
    assert_eq!(report.events_dropped(), first - 1);
    assert!(info(&f).await.partitions[0].bytes < before, "the size shrinks");
    let seqs = retained(&f).await;
    assert_eq!(seqs, (first..=N).collect::<Vec<_>>(), "read from 0 begins at the log start");
    let page = f.rheo.query(&Query::new(S).after_sequence(0).limit(1000)).await.expect("query");
    assert_eq!(page.first().map(|e| e.sequence()), Some(first), "a query before the start begins at it");
    assert_eq!(page.len() as u64, N - first + 1);
    // A second pass drops nothing more.
    let again = f.rheo.enforce_retention(S).await.expect("pass");
    assert!(again.dropped.is_empty(), "{again:?}");
}

/// `max_age` drops the events older than it (by append time), and keeps
/// the newer ones.
pub async fn max_age_drops_events_older_than_it(f: Fixture) {
    if !retained_stream(&f, Retention::new().max_age(Duration::from_secs(3600))).await {
        return;
    }
    fill(&f, N).await;
    f.clock.advance(secs(2 * 3600));
    fill(&f, N).await;
    f.rheo.enforce_retention(S).await.expect("pass");
    let (first, last) = bounds(&f).await;
    assert!(first > 1 && first <= N + 1, "dropped the old ones (and nothing new): first {first}");
    assert_eq!(last, 2 * N);
    assert!(retained(&f).await.len() as u64 >= N, "every new event stays");
}

/// `max_bytes` drops the oldest events until the partition holds about the
/// limit (at most one native segment more).
pub async fn max_bytes_drops_the_oldest_until_the_size_fits(f: Fixture) {
    if !retained_stream(&f, Retention::new()).await {
        return;
    }
    fill(&f, N).await;
    let before = info(&f).await.partitions[0].bytes;
    let limit = before / 4;
    f.rheo.set_retention(S, Retention::new().max_bytes(limit)).await.expect("set");
    f.rheo.enforce_retention(S).await.expect("pass");
    let after = info(&f).await.partitions[0];
    assert!(after.first_sequence > 1, "{after:?}");
    assert!(after.bytes < before / 2, "{} of {before} bytes kept for a limit of {limit}", after.bytes);
    assert!(after.bytes + 8192 >= limit, "never far below the limit: {} for {limit}", after.bytes);
}

/// `set_retention` replaces the retention and `stream_info` shows it;
/// nothing is dropped until a pass. A missing stream is `StreamNotFound`,
/// a zero limit `InvalidArgument`.
pub async fn set_retention_changes_the_stream_and_a_pass_applies_it(f: Fixture) {
    if !retained_stream(&f, Retention::new()).await {
        return;
    }
    fill(&f, N).await;
    let r = Retention::new().max_events(10).policy(RetentionPolicy::Limits);
    let i = f.rheo.set_retention(S, r).await.expect("set");
    assert_eq!(i.retention, r);
    assert_eq!(info(&f).await.retention, r);
    assert_eq!(bounds(&f).await, (1, N), "nothing dropped before a pass");
    f.rheo.enforce_retention(S).await.expect("pass");
    assert!(bounds(&f).await.0 > 1);
    assert_err!(f.rheo.set_retention("nope", r).await, Error::StreamNotFound { .. });
    let e = assert_err!(f.rheo.set_retention(S, Retention::new().max_events(0)).await, Error::InvalidArgument { .. });
    assert_mentions(&e, &["max_events"]);
    assert_err!(f.rheo.enforce_retention("nope").await, Error::StreamNotFound { .. });
}

/// Under `limits`, a group behind the new log start moves to it: its lag
/// never counts dropped events, the events it had not settled are counted
/// in `group_info`, its leases on dropped events are stale, and its next
/// fetch begins at the log start.
pub async fn limits_move_groups_past_dropped_events_and_count_what_they_skipped(f: Fixture) {
    if !retained_stream(&f, Retention::new().max_events(50)).await {
        return;
    }
    group(&f, GroupOptions::new()).await;
    fill(&f, N).await;
    let leases = fetch(&f, 5).await;
    ack_all(&f, &leases[..2]).await;
    let report = f.rheo.enforce_retention(S).await.expect("pass");
    let (first, _) = bounds(&f).await;
    let skipped = first - 1 - 2;
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert_eq!((report.skipped[0].group.as_str(), report.skipped[0].skipped), (G, skipped), "{report:?}");
    let gi = f.rheo.group_info(S, G).await.expect("group_info");
    assert_eq!(gi.retention_skipped, skipped);
    assert_eq!(gi.inflight, 0, "the leases on dropped events are gone");
    assert_eq!(gi.lag.total, N - first + 1, "lag counts the retained events only");
    assert_eq!(frontier(&f, 0).await, first - 1);
    assert_err!(f.rheo.ack(&leases[3]).await, Error::StaleLease { .. });
    assert_eq!(sequences(&fetch(&f, 1).await), vec![first]);
}

/// Under `interest`, only what every group consuming the partition has
/// settled goes: one group that has settled nothing holds everything.
pub async fn interest_drops_only_what_every_group_settled(f: Fixture) {
    if !retained_stream(&f, Retention::new().policy(RetentionPolicy::Interest)).await {
        return;
    }
    group(&f, GroupOptions::new()).await;
    group_named(&f, G2, GroupOptions::new()).await;
    fill(&f, N).await;
    let report = f.rheo.enforce_retention(S).await.expect("pass");
    assert!(report.dropped.is_empty(), "nothing settled, nothing dropped: {report:?}");
    // G settles the first 300; G2 nothing: still nothing goes.
    for _ in 0..3 {
        let l = fetch(&f, 100).await;
        ack_all(&f, &l).await;
    }
    assert!(f.rheo.enforce_retention(S).await.expect("pass").dropped.is_empty());
    // G2 settles the first 300 too: what both settled may go, nothing more.
    for _ in 0..3 {
        let l = fetch_from(&f, G2, 100).await;
        let refs: Vec<_> = l.iter().map(|l| l.to_ref()).collect();
        for r in f.rheo.ack_many(refs).await.expect("ack") {
            r.expect("ack");
        }
    }
    let report = f.rheo.enforce_retention(S).await.expect("pass");
    let (first, _) = bounds(&f).await;
    assert!(first > 1 && first <= 301, "first {first}: only settled events go");
    assert!(report.skipped.is_empty() && !report.ceiling_hit, "{report:?}");
    for g in [G, G2] {
        assert_eq!(f.rheo.group_info(S, g).await.expect("info").retention_skipped, 0);
        assert_eq!(lag_total_of(&f, g).await, 100);
    }
}

/// Under `interest` the limits stay a ceiling: past them, events go even
/// unsettled, the groups are moved and counted, and the pass says so.
pub async fn interest_limits_are_a_ceiling_that_says_when_it_is_hit(f: Fixture) {
    if !retained_stream(&f, Retention::new().policy(RetentionPolicy::Interest).max_events(50)).await {
        return;
    }
    group(&f, GroupOptions::new()).await;
    fill(&f, N).await;
    let report = f.rheo.enforce_retention(S).await.expect("pass");
    let (first, _) = bounds(&f).await;
    assert!(first > 1 && N - first + 1 >= 50);
    assert!(report.ceiling_hit, "{report:?}");
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").retention_skipped, first - 1);
}

/// A dead letter whose event retention dropped stays listed, with no event
/// and marked `dropped`.
pub async fn dead_letters_of_dropped_events_stay_listed_marked_dropped(f: Fixture) {
    if !retained_stream(&f, Retention::new().max_events(50)).await {
        return;
    }
    group(&f, GroupOptions::new()).await;
    fill(&f, N).await;
    let l = fetch(&f, 1).await;
    f.rheo.reject(&l[0], "bad").await.expect("reject");
    f.rheo.enforce_retention(S).await.expect("pass");
    let dl = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dead letters");
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].sequence, 1);
    assert!(dl[0].dropped && dl[0].event.is_none() && dl[0].damage.is_none(), "{:?}", dl[0]);
    assert_eq!(dl[0].reason, "bad");
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").dead_letters, 1);
}

/// After a drop, a start, a replay or a reset before the log start begins
/// at it; skipping a dropped position is refused naming the start.
pub async fn starts_replays_and_resets_before_the_log_start_begin_at_it(f: Fixture) {
    if !retained_stream(&f, Retention::new().max_events(50)).await {
        return;
    }
    group(&f, GroupOptions::new()).await;
    fill(&f, N).await;
    f.rheo.enforce_retention(S).await.expect("pass");
    let (first, _) = bounds(&f).await;
    // A new group from the beginning.
    group_named(&f, G2, GroupOptions::new().start(StartPosition::Beginning)).await;
    assert_eq!(sequences(&fetch_from(&f, G2, 1).await), vec![first]);
    assert_eq!(lag_total_of(&f, G2).await, N - first + 1);
    // A group starting after a dropped sequence.
    group_named(&f, "late", GroupOptions::new().start(StartPosition::After(1))).await;
    assert_eq!(sequences(&fetch_from(&f, "late", 1).await), vec![first]);
    // G settles everything, then replays from 0: only retained events reopen.
    drain(&f, G).await;
    let reopened = f.rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay");
    assert_eq!(reopened, N - first + 1);
    assert_eq!(sequences(&fetch(&f, 1).await), vec![first]);
    // A reset to the beginning.
    f.rheo.reset_group(S, G, ResetOptions::confirmed()).await.expect("reset");
    assert_eq!(sequences(&fetch(&f, 1).await), vec![first]);
    // Skipping a dropped position.
    let e = assert_err!(f.rheo.skip(S, G2, 0, 1, "gone").await, Error::InvalidArgument { .. });
    assert_mentions(&e, &["retention", &first.to_string()]);
}

/// A pass moves every group consuming a partition, fetches keep working
/// beside it, and no delivery is handed out twice or lost among the
/// retained events.
pub async fn consumers_keep_working_across_passes(f: Fixture) {
    if !retained_stream(&f, Retention::new().max_events(120)).await {
        return;
    }
    group(&f, GroupOptions::new()).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        fill(&f, 100).await;
        let l = f.rheo.fetch(S, G, FetchOptions::new().limit(60)).await.expect("fetch");
        seen.extend(sequences(&l));
        ack_all(&f, &l).await;
        f.rheo.enforce_retention(S).await.expect("pass");
    }
    assert_unique(seen.iter().copied());
    let (first, last) = bounds(&f).await;
    let rest = drain(&f, G).await;
    assert!(rest.iter().all(|&(_, s)| s >= first), "nothing dropped is delivered: {rest:?}");
    let skipped = f.rheo.group_info(S, G).await.expect("info").retention_skipped;
    assert_eq!(seen.len() as u64 + rest.len() as u64 + skipped, last, "every event delivered or counted as skipped");
}

/// Passes running while producers append and consumers fetch and ack:
/// every event ends up acknowledged exactly once or counted as skipped,
/// and nothing fails but acks of leases a pass made stale.
pub async fn passes_beside_producers_and_consumers_lose_nothing_uncounted(f: Fixture) {
    if !retained_stream(&f, Retention::new().max_events(40)).await {
        return;
    }
    group(&f, GroupOptions::new()).await;
    let total: u64 = if f.small { 200 } else { 600 };
    let producer = {
        let rheo = f.rheo.clone();
        tokio::spawn(async move {
            for chunk in 0..total / 10 {
                let batch =
                    (0..10).map(|i| (json!({"n": chunk * 10 + i, "pad": "x".repeat(60)}), AppendOptions::new()));
                rheo.append_batch_with(S, batch).await.expect("append");
            }
        })
    };
    let passes = {
        let rheo = f.rheo.clone();
        let done = producer.abort_handle();
        tokio::spawn(async move {
            let mut n = 0u32;
            while !done.is_finished() {
                rheo.enforce_retention(S).await.expect("a pass beside appends and acks");
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            n
        })
    };
    let mut acked = std::collections::BTreeSet::new();
    let mut stale = 0u64;
    loop {
        let leases = f.rheo.fetch(S, G, FetchOptions::new().limit(20)).await.expect("fetch beside passes");
        for l in &leases {
            match f.rheo.ack(l).await {
                Ok(()) => assert!(acked.insert(l.sequence()), "sequence {} acked twice", l.sequence()),
                Err(Error::StaleLease { .. }) => stale += 1,
                Err(e) => panic!("ack: {e}"),
            }
        }
        if leases.is_empty() && producer.is_finished() && f.rheo.lag(S, G).await.expect("lag").total == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let passes_run = passes.await.expect("passes");
    producer.await.expect("producer");
    f.rheo.enforce_retention(S).await.expect("last pass");
    let skipped = f.rheo.group_info(S, G).await.expect("info").retention_skipped;
    assert_eq!(
        acked.len() as u64 + skipped,
        total,
        "acked {} + skipped {skipped} ({stale} stale acks, {passes_run} passes)",
        acked.len()
    );
    let (first, last) = bounds(&f).await;
    assert_eq!(last, total);
    assert!(total - first + 1 >= 40, "the limit holds: first {first}");
}
