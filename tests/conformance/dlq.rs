//! `reject` and dead letters: terminal for one group, never a deletion.

use rheo::{DeadLetterOptions, Error, GroupOptions, Query, ResetOptions};

use crate::common::Fixture;
use crate::support::*;

/// `reject` dead-letters the delivery for that group only: it is never
/// redelivered there, while another group still gets it.
pub async fn reject_dead_letters_for_that_group_only(f: Fixture) {
    stream(&f, 1).await;
    group_named(&f, G, GroupOptions::new()).await;
    group_named(&f, G2, GroupOptions::new()).await;
    append_to(&f, 0, 1).await;
    let lease = fetch_from(&f, G, 1).await.remove(0);
    f.rheo.reject(&lease, "bad payload").await.expect("reject");
    f.clock.advance(secs(3600));
    assert!(fetch_from(&f, G, 10).await.is_empty(), "terminal for the group");
    assert_eq!(lag_total_of(&f, G).await, 0);
    let dead = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "bad payload");

    let other = fetch_from(&f, G2, 10).await;
    assert_eq!(positions(&other), vec![(0, 1)]);
    assert_eq!(other[0].attempt, 1);
    assert!(f.rheo.dead_letters(S, G2, DeadLetterOptions::new()).await.expect("dlq").is_empty());
    assert_err!(f.rheo.ack(&lease).await, Error::StaleLease { .. });
}

/// A dead letter keeps the event, the reason, the attempts and when it happened.
pub async fn dead_letter_records_event_reason_attempts_and_time(f: Fixture) {
    setup(&f, 2).await;
    let event = append_to(&f, 1, 1).await.remove(0);
    let first = fetch(&f, 1).await.remove(0);
    f.rheo.retry(&first, "again").await.expect("retry");
    let second = fetch(&f, 1).await.remove(0);
    f.clock.advance(secs(42));
    f.rheo.reject(&second, "schema mismatch: field total").await.expect("reject");
    let dead = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq").remove(0);
    assert_eq!(dead.event.as_ref(), Some(&event));
    assert_eq!((dead.partition, dead.sequence, dead.damage.as_ref()), (event.partition(), event.sequence(), None));
    assert_eq!(dead.reason, "schema mismatch: field total");
    assert_eq!(dead.attempts, 2);
    assert_eq!(dead.dead_lettered_at, at(42));
}

/// No group operation deletes an event: after ack, reject, dead-lettering
/// retries and a reset, the log is unchanged.
pub async fn events_are_never_deleted_by_group_operations(f: Fixture) {
    stream(&f, 1).await;
    group(&f, GroupOptions::new().max_attempts(1)).await;
    let appended = append_to(&f, 0, 4).await;
    let leases = fetch(&f, 4).await;
    f.rheo.ack(&leases[0]).await.expect("ack");
    f.rheo.reject(&leases[1], "bad").await.expect("reject");
    f.rheo.retry(&leases[2], "spent").await.expect("retry to the dead letters");
    f.rheo.reset_group(S, G, ResetOptions::confirmed().start_after(4)).await.expect("reset");
    assert_eq!(f.rheo.read(S, 0, 0, 100).await.expect("read"), appended);
    assert_eq!(f.rheo.query(&Query::new(S)).await.expect("query"), appended);
    assert_eq!(f.rheo.list_streams().await.expect("list")[0].high_watermarks, vec![4]);
}

/// Dead letters are listed oldest first, at most `limit`.
pub async fn dead_letters_are_oldest_first_and_limited(f: Fixture) {
    setup(&f, 2).await;
    append_to(&f, 0, 3).await;
    append_to(&f, 1, 1).await;
    let leases = fetch(&f, 4).await;
    for i in [3, 0, 2, 1] {
        f.rheo.reject(&leases[i], &format!("reason {i}")).await.expect("reject");
        f.clock.advance(secs(1));
    }
    let all = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq");
    let order: Vec<(u32, u64)> = all.iter().map(|d| (d.partition, d.sequence)).collect();
    assert_eq!(order, vec![(1, 1), (0, 1), (0, 3), (0, 2)], "in the order they were dead-lettered");
    assert!(all.windows(2).all(|w| w[0].dead_lettered_at <= w[1].dead_lettered_at));
    let two = f.rheo.dead_letters(S, G, DeadLetterOptions::new().limit(2)).await.expect("dlq");
    assert_eq!(two, all[..2].to_vec());
}

/// `after: event_id` pages through the dead letters from after that one.
pub async fn dead_letters_page_after_event_id(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 5).await;
    for lease in fetch(&f, 5).await {
        f.rheo.reject(&lease, "bad").await.expect("reject");
    }
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut opts = DeadLetterOptions::new().limit(2);
        if let Some(id) = &after {
            opts = opts.after(id.clone());
        }
        let page = f.rheo.dead_letters(S, G, opts).await.expect("page");
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = Some(last.event.as_ref().expect("an undamaged dead letter").id().to_owned());
        paged.extend(page.iter().map(|d| d.sequence));
        assert!(paged.len() <= 5, "paging does not loop: {paged:?}");
    }
    assert_eq!(paged, vec![1, 2, 3, 4, 5]);
}

/// An `after` cursor that names no dead letter of the group is `CursorNotFound` naming it.
pub async fn dead_letters_unknown_cursor_is_cursor_not_found(f: Fixture) {
    setup(&f, 1).await;
    let events = append_to(&f, 0, 2).await;
    let lease = fetch(&f, 1).await.remove(0);
    f.rheo.reject(&lease, "bad").await.expect("reject");
    let e = assert_err!(
        f.rheo.dead_letters(S, G, DeadLetterOptions::new().after("no-such-event")).await,
        Error::CursorNotFound { ref cursor, .. } if cursor == "no-such-event"
    );
    assert_mentions(&e, &["no-such-event"]);
    // an event that exists but is not a dead letter of the group is no cursor either
    assert_err!(
        f.rheo.dead_letters(S, G, DeadLetterOptions::new().after(events[1].id().to_owned())).await,
        Error::CursorNotFound { .. }
    );
    let after_last = f.rheo.dead_letters(S, G, DeadLetterOptions::new().after(events[0].id().to_owned())).await;
    assert!(after_last.expect("a real cursor").is_empty());
}
