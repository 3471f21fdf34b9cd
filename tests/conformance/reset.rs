//! `reset_group`: destructive, so it needs `confirm: true`; clears the
//! group's state in scope and restarts it.

use rheo::{DeadLetterOptions, Error, ResetOptions};

use crate::common::Fixture;
use crate::support::*;

/// Without `confirm: true` a reset is `ConfirmRequired` and changes nothing.
pub async fn reset_without_confirm_is_confirm_required(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 2).await;
    let leases = fetch(&f, 2).await;
    f.rheo.ack(&leases[0]).await.expect("ack");
    let unconfirmed = ResetOptions::default();
    assert!(!unconfirmed.confirm, "not confirmed by default");
    let e = assert_err!(
        f.rheo.reset_group(S, G, unconfirmed).await,
        Error::ConfirmRequired { ref stream, ref group, .. } if stream == S && group == G
    );
    assert_mentions(&e, &["reset_group", S, G, "confirm"]);
    assert_err!(f.rheo.reset_group(S, G, ResetOptions::default()).await, Error::ConfirmRequired { .. });
    assert_eq!(frontier(&f, 0).await, 1);
    f.rheo.ack(&leases[1]).await.expect("the lease survived");
}

/// A confirmed reset clears leases (an old lease is then `StaleLease`) and
/// redelivers from the start with fresh attempts.
pub async fn reset_clears_leases_and_restarts_from_the_beginning(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 3).await;
    let leases = fetch(&f, 3).await;
    f.rheo.ack(&leases[0]).await.expect("ack");
    f.rheo.retry(&leases[1], "later").await.expect("retry");
    f.rheo.reset_group(S, G, ResetOptions::confirmed()).await.expect("reset");
    assert_err!(f.rheo.ack(&leases[2]).await, Error::StaleLease { .. });
    let info = f.rheo.group_info(S, G).await.expect("info");
    assert_eq!((info.inflight, info.retry_waiting, info.lag.total), (0, 0, 3));
    let again = fetch(&f, 10).await;
    assert_eq!(sequences(&again), vec![1, 2, 3]);
    assert!(again.iter().all(|l| l.attempt == 1), "attempts start over: {again:?}");
}

/// A reset restarts at the given start: after a sequence, or at a time.
pub async fn reset_restarts_at_the_given_start(f: Fixture) {
    setup(&f, 1).await;
    for _ in 0..5 {
        append_then_wait(&f, 0, 10).await; // t0 .. t40
    }
    drain(&f, G).await;
    f.rheo.reset_group(S, G, ResetOptions::confirmed().start_after(3)).await.expect("reset");
    assert_eq!((frontier(&f, 0).await, lag_total(&f).await), (3, 2));
    assert_eq!(sequences(&fetch(&f, 10).await), vec![4, 5]);
    f.rheo.reset_group(S, G, ResetOptions::confirmed().start_at(at(15))).await.expect("reset");
    assert_eq!(frontier(&f, 0).await, 2);
    assert_eq!(sequences(&fetch(&f, 10).await), vec![3, 4, 5]);
}

/// A partition-scoped reset leaves the other partitions' state, leases included.
pub async fn reset_of_some_partitions_leaves_the_others(f: Fixture) {
    setup(&f, 2).await;
    append_to(&f, 0, 2).await;
    append_to(&f, 1, 2).await;
    let leases = fetch(&f, 4).await;
    ack_all(&f, &leases[..3]).await;
    f.rheo.reset_group(S, G, ResetOptions::confirmed().partitions([0])).await.expect("reset");
    f.rheo.ack(&leases[3]).await.expect("partition 1's lease is untouched");
    assert_eq!(frontier(&f, 1).await, 2);
    assert_eq!(frontier(&f, 0).await, 0);
    assert_eq!(positions(&fetch(&f, 10).await), vec![(0, 1), (0, 2)]);
}

/// A reset clears the dead letters in its scope.
pub async fn reset_clears_dead_letters_in_scope(f: Fixture) {
    setup(&f, 2).await;
    append_to(&f, 0, 1).await;
    append_to(&f, 1, 1).await;
    for lease in fetch(&f, 2).await {
        f.rheo.reject(&lease, "bad").await.expect("reject");
    }
    f.rheo.reset_group(S, G, ResetOptions::confirmed().partitions([1])).await.expect("reset");
    let dead = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq");
    assert_eq!(dead.iter().map(|d| d.partition).collect::<Vec<_>>(), vec![0]);
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").dead_letters, 1);
    assert_eq!(positions(&fetch(&f, 10).await), vec![(1, 1)]);
}
