//! `retry`: claimable again (after a backoff), or dead-lettered once the
//! attempts are spent; and leases that expire on their last attempt.

use rheo::{Backoff, Clock, Error, GroupOptions, RetryOutcome};

use crate::common::Fixture;
use crate::support::*;

/// `retry` makes a delivery claimable again at once (no backoff by default),
/// with the next attempt; the retried lease is stale.
pub async fn retry_makes_delivery_claimable_again_with_next_attempt(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let first = fetch(&f, 1).await.remove(0);
    let outcome = f.rheo.retry(&first, "flaky downstream").await.expect("retry");
    assert_eq!(outcome, RetryOutcome::Scheduled { available_at: at(0) });
    let second = fetch(&f, 1).await.remove(0);
    assert_eq!(second.sequence(), 1);
    assert_eq!(second.attempt, 2);
    assert_ne!(second.lease_id, first.lease_id);
    assert_err!(f.rheo.ack(&first).await, Error::StaleLease { .. });
    assert_eq!(frontier(&f, 0).await, 0, "a retry does not settle");
    f.rheo.ack(&second).await.expect("ack");
    assert_eq!(frontier(&f, 0).await, 1);
}

/// `retry` when `attempt >= max_attempts` dead-letters with reason
/// `max_attempts: <reason>` and says so.
pub async fn retry_at_max_attempts_dead_letters_with_reason(f: Fixture) {
    stream(&f, 1).await;
    group(&f, GroupOptions::new().max_attempts(2)).await;
    append_to(&f, 0, 1).await;
    let first = fetch(&f, 1).await.remove(0);
    assert!(matches!(f.rheo.retry(&first, "boom").await.expect("retry"), RetryOutcome::Scheduled { .. }));
    let second = fetch(&f, 1).await.remove(0);
    assert_eq!(second.attempt, 2);
    assert_eq!(f.rheo.retry(&second, "boom").await.expect("retry"), RetryOutcome::DeadLettered);
    let dead = f.rheo.dead_letters(S, G, Default::default()).await.expect("dlq");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "max_attempts: boom");
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(dead[0].event.as_ref(), Some(&second.event));
    f.clock.advance(secs(3600));
    assert!(fetch(&f, 10).await.is_empty(), "a dead letter is not redelivered");
    assert_err!(f.rheo.ack(&second).await, Error::StaleLease { .. });
}

/// With `max_attempts` 1 the first retry dead-letters.
pub async fn retry_with_max_attempts_one_dead_letters_at_once(f: Fixture) {
    stream(&f, 1).await;
    group(&f, GroupOptions::new().max_attempts(1)).await;
    append_to(&f, 0, 2).await;
    let leases = fetch(&f, 2).await;
    assert_eq!(f.rheo.retry(&leases[0], "bad").await.expect("retry"), RetryOutcome::DeadLettered);
    f.rheo.ack(&leases[1]).await.expect("ack");
    assert_eq!(lag_total(&f).await, 0);
    assert_eq!(f.rheo.dead_letters(S, G, Default::default()).await.expect("dlq")[0].reason, "max_attempts: bad");
}

/// The group's `retry_backoff` keeps a retried delivery unclaimable until the clock passes it.
pub async fn retry_backoff_delays_reclaim_until_clock_passes(f: Fixture) {
    stream(&f, 1).await;
    group(&f, GroupOptions::new().retry_backoff(Backoff::Fixed(secs(10)))).await;
    append_to(&f, 0, 1).await;
    let lease = fetch(&f, 1).await.remove(0);
    f.clock.advance(secs(2));
    assert_eq!(f.rheo.retry(&lease, "later").await.expect("retry"), RetryOutcome::Scheduled { available_at: at(12) });
    assert!(fetch(&f, 10).await.is_empty());
    assert_eq!(f.rheo.group_info(S, G).await.expect("info").retry_waiting, 1);
    f.clock.advance(secs(9)); // t11
    assert!(fetch(&f, 10).await.is_empty(), "backoff not over");
    f.clock.advance(secs(2)); // t13
    let again = fetch(&f, 10).await;
    assert_eq!(positions(&again), vec![(0, 1)]);
    assert_eq!(again[0].attempt, 2);
}

/// An exponential backoff doubles per attempt up to its maximum.
pub async fn exponential_retry_backoff_doubles_up_to_max(f: Fixture) {
    stream(&f, 1).await;
    let backoff = Backoff::Exponential { base: secs(1), max: secs(4) };
    group(&f, GroupOptions::new().max_attempts(10).retry_backoff(backoff)).await;
    append_to(&f, 0, 1).await;
    for (attempt, delay) in [(1, 1), (2, 2), (3, 4), (4, 4)] {
        let lease = fetch(&f, 1).await.remove(0);
        assert_eq!(lease.attempt, attempt);
        let now = f.clock.now();
        let outcome = f.rheo.retry(&lease, "again").await.expect("retry");
        assert_eq!(outcome, RetryOutcome::Scheduled { available_at: now.saturating_add(secs(delay)) });
        f.clock.advance(secs(delay - 1));
        if delay > 1 {
            assert!(fetch(&f, 1).await.is_empty(), "attempt {attempt}: still backing off");
        }
        f.clock.advance(secs(1));
    }
}

/// `retry_after` uses its explicit delay instead of the group's backoff.
pub async fn retry_after_uses_explicit_delay(f: Fixture) {
    stream(&f, 1).await;
    group(&f, GroupOptions::new().retry_backoff(Backoff::Fixed(secs(60)))).await;
    append_to(&f, 0, 2).await;
    let leases = fetch(&f, 2).await;
    let outcome = f.rheo.retry_after(&leases[0], "rate limited", secs(5)).await.expect("retry_after");
    assert_eq!(outcome, RetryOutcome::Scheduled { available_at: at(5) });
    assert_eq!(
        f.rheo.retry_after(&leases[1], "now", std::time::Duration::ZERO).await.expect("retry_after 0"),
        RetryOutcome::Scheduled { available_at: at(0) }
    );
    assert_eq!(positions(&fetch(&f, 10).await), vec![(0, 2)], "a zero delay is claimable at once");
    f.clock.advance(secs(6));
    assert_eq!(positions(&fetch(&f, 10).await), vec![(0, 1)], "claimable after 5 s, not the group's 60 s");
}

/// A lease that expires on its last attempt is dead-lettered by the next fetch
/// (reason `max_attempts: ...`) instead of being delivered again.
pub async fn lease_expired_on_last_attempt_is_dead_lettered_not_redelivered(f: Fixture) {
    stream(&f, 1).await;
    group(&f, GroupOptions::new().max_attempts(2)).await;
    append_to(&f, 0, 2).await;
    let first = fetch_leased(&f, 1, 10).await.remove(0);
    assert_eq!(first.sequence(), 1);
    f.clock.advance(secs(11));
    let second = fetch_leased(&f, 1, 10).await.remove(0);
    assert_eq!((second.sequence(), second.attempt), (1, 2));
    f.clock.advance(secs(11));
    let next = fetch_leased(&f, 10, 10).await;
    assert_eq!(positions(&next), vec![(0, 2)], "sequence 1 is not redelivered");
    let dead = f.rheo.dead_letters(S, G, Default::default()).await.expect("dlq");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].sequence, 1);
    assert!(dead[0].reason.starts_with("max_attempts:"), "reason {:?}", dead[0].reason);
    assert_eq!(dead[0].attempts, 2);
    assert_err!(f.rheo.ack(&second).await, Error::StaleLease { .. });
    f.rheo.ack(&next[0]).await.expect("ack");
    assert_eq!(lag_total(&f).await, 0, "the dead letter counts as settled");
}

/// `retry` and `reject` of a settled lease are `StaleLease` and change nothing.
pub async fn retry_or_reject_of_settled_lease_is_stale_lease(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let lease = fetch(&f, 1).await.remove(0);
    f.rheo.ack(&lease).await.expect("ack");
    assert_err!(f.rheo.retry(&lease, "x").await, Error::StaleLease { .. });
    assert_err!(f.rheo.retry_after(&lease, "x", secs(1)).await, Error::StaleLease { .. });
    assert_err!(f.rheo.reject(&lease, "x").await, Error::StaleLease { .. });
    assert!(fetch(&f, 10).await.is_empty());
    assert!(f.rheo.dead_letters(S, G, Default::default()).await.expect("dlq").is_empty());
}
