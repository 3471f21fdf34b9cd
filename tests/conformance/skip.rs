//! `skip`: an operator dead-letters one position without reading its event
//! (the way past a damaged record), whatever its state.

use rheo::{DeadLetterOptions, Error, GroupOptions, StartPosition};

use crate::common::Fixture;
use crate::support::*;

/// A position never claimed is dead-lettered with the reason `skipped:
/// <reason>` and 0 attempts; the frontier passes it and no fetch delivers it.
pub async fn skip_dead_letters_a_position_never_claimed(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 3).await;
    assert!(f.rheo.skip(S, G, 0, 2, "record damaged").await.expect("skip"));
    assert_eq!(sequences(&drain_leases(&f).await), vec![1, 3], "the skipped position is not delivered");
    assert_eq!(lag_total(&f).await, 0);
    let dead = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq");
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].partition, dead[0].sequence, dead[0].attempts), (0, 2, 0));
    assert_eq!(dead[0].reason, "skipped: record damaged");
    assert_eq!(dead[0].event.as_ref().map(|e| e.sequence()), Some(2), "a readable event is listed with it");
}

/// A leased position is dead-lettered too: the holder's settles become stale.
pub async fn skip_of_a_leased_position_makes_its_lease_stale(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 2).await;
    let leases = fetch(&f, 2).await;
    assert!(f.rheo.skip(S, G, 0, 1, "operator").await.expect("skip"));
    assert_err!(f.rheo.ack(&leases[0]).await, Error::StaleLease { .. });
    f.rheo.ack(&leases[1]).await.expect("the other lease still holds");
    assert_eq!(lag_total(&f).await, 0);
    let dead = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq");
    assert_eq!((dead[0].sequence, dead[0].attempts), (1, 1), "the attempts made so far");
}

/// Skipping a dead letter again changes nothing and says so (false).
pub async fn skip_of_a_dead_letter_is_a_no_op(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let lease = fetch(&f, 1).await.remove(0);
    f.rheo.reject(&lease, "bad").await.expect("reject");
    assert!(!f.rheo.skip(S, G, 0, 1, "again").await.expect("skip"));
    let dead = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "bad", "the first reason stays");
}

/// An acknowledged position, one before the group's start, a sequence
/// outside the partition and a partition the group does not consume are
/// refused, changing nothing.
pub async fn skip_refuses_settled_and_unknown_positions(f: Fixture) {
    stream(&f, 2).await;
    group(&f, GroupOptions::new().start(StartPosition::AfterPerPartition([(0, 1)].into()))).await;
    group_named(&f, G2, GroupOptions::new().partitions(vec![1])).await;
    append_to(&f, 0, 3).await;
    let lease = fetch(&f, 1).await.remove(0);
    assert_eq!(lease.sequence(), 2);
    f.rheo.ack(&lease).await.expect("ack");
    for (seq, why) in [(2, "already settled"), (1, "already settled"), (0, "not in partition"), (4, "not in partition")]
    {
        let e = assert_err!(f.rheo.skip(S, G, 0, seq, "x").await, Error::InvalidArgument { .. });
        assert_mentions(&e, &[&seq.to_string(), why]);
    }
    let e = assert_err!(f.rheo.skip(S, G2, 0, 1, "x").await, Error::InvalidArgument { .. });
    assert_mentions(&e, &["does not consume partition 0"]);
    assert_err!(f.rheo.skip(S, G, 9, 1, "x").await, Error::InvalidPartition { .. });
    assert_err!(f.rheo.skip(S, "nope", 0, 1, "x").await, Error::GroupNotFound { .. });
    assert_err!(f.rheo.skip("nope", G, 0, 1, "x").await, Error::StreamNotFound { .. });
    assert_err!(f.rheo.skip(S, G, 0, 3, &"r".repeat(rheo::MAX_REASON_BYTES + 1)).await, Error::InvalidArgument { .. });
    assert!(f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq").is_empty());
    assert_eq!(lag_total(&f).await, 1, "position 3 is still due");
}

/// `after_position` pages the dead letters by position, no event id needed.
pub async fn dead_letters_page_after_position(f: Fixture) {
    setup(&f, 2).await;
    append_to(&f, 0, 2).await;
    append_to(&f, 1, 2).await;
    f.rheo.skip(S, G, 1, 2, "a").await.expect("skip");
    f.rheo.skip(S, G, 0, 1, "b").await.expect("skip");
    f.rheo.skip(S, G, 1, 1, "c").await.expect("skip");
    let mut paged = Vec::new();
    let mut opts = DeadLetterOptions::new().limit(1);
    loop {
        let page = f.rheo.dead_letters(S, G, opts.clone()).await.expect("page");
        let Some(last) = page.last() else { break };
        paged.push((last.partition, last.sequence));
        opts = DeadLetterOptions::new().limit(1).after_position(last.partition, last.sequence);
        assert!(paged.len() <= 3, "paging does not loop: {paged:?}");
    }
    assert_eq!(paged, vec![(1, 2), (0, 1), (1, 1)], "in dead-letter order");
    assert_err!(
        f.rheo.dead_letters(S, G, DeadLetterOptions::new().after_position(0, 2)).await,
        Error::CursorNotFound { ref cursor, .. } if cursor == "0:2"
    );
}

async fn drain_leases(f: &Fixture) -> Vec<rheo::Lease> {
    let mut all = Vec::new();
    loop {
        let leases = fetch(f, 10).await;
        if leases.is_empty() {
            return all;
        }
        ack_all(f, &leases).await;
        all.extend(leases);
    }
}
