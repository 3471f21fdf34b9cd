//! Settles are fenced by the lease id: `ack`, `renew`, `ack_many`, and the
//! window in which an expired lease may still settle.

use rheo::{Error, FetchOptions, GroupOptions, LeaseRef, RetryOutcome};

use crate::common::Fixture;
use crate::support::*;

/// `ack` settles a delivery: it is not delivered again and the frontier moves.
pub async fn ack_settles_the_delivery(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 2).await;
    let leases = fetch(&f, 10).await;
    f.rheo.ack(&leases[0]).await.expect("ack");
    assert_eq!(frontier(&f, 0).await, 1);
    f.clock.advance(secs(3600));
    assert_eq!(positions(&fetch(&f, 10).await), vec![(0, 2)], "the acked delivery is never redelivered");
}

/// A second ack of the same lease is `StaleLease`, naming stream, group, position and lease.
pub async fn second_ack_of_same_lease_is_stale_lease(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let lease = fetch(&f, 1).await.remove(0);
    f.rheo.ack(&lease).await.expect("first ack");
    let e = assert_err!(
        f.rheo.ack(&lease).await,
        Error::StaleLease { ref stream, ref group, partition: 0, sequence: 1, ref lease_id }
            if stream == S && group == G && *lease_id == lease.lease_id
    );
    assert!(e.is_stale_lease());
    assert_mentions(&e, &[S, G, &lease.lease_id.to_string()]);
    assert_eq!(lag_total(&f).await, 0);
}

/// A lease id nobody was given is `StaleLease` for a leased, an available and
/// an unknown delivery; the real lease still works.
pub async fn made_up_lease_id_is_stale_lease(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 2).await;
    let real = fetch(&f, 1).await.remove(0);
    for seq in [1, 2, 99] {
        let fake = made_up_lease(S, G, 0, seq);
        assert_err!(f.rheo.ack(&fake).await, Error::StaleLease { .. });
    }
    let wrong_sequence = LeaseRef { partition: 0, sequence: 2, ..real.to_ref() };
    assert_err!(f.rheo.ack(&wrong_sequence).await, Error::StaleLease { .. });
    f.rheo.ack(&real).await.expect("the real lease still holds");
    assert_eq!(positions(&fetch(&f, 10).await), vec![(0, 2)], "sequence 2 was never settled");
}

/// Every settle (ack, retry, reject, renew) with a wrong lease id is
/// `StaleLease` and changes nothing.
pub async fn every_settle_checks_the_lease_id(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let real = fetch(&f, 1).await.remove(0);
    let fake = LeaseRef { lease_id: rheo::LeaseId::from_u128(0xf0), ..real.to_ref() };
    assert_err!(f.rheo.ack(&fake).await, Error::StaleLease { .. });
    assert_err!(f.rheo.retry(&fake, "nope").await, Error::StaleLease { .. });
    assert_err!(f.rheo.reject(&fake, "nope").await, Error::StaleLease { .. });
    assert_err!(f.rheo.renew(&fake, secs(60)).await, Error::StaleLease { .. });
    let info = f.rheo.group_info(S, G).await.expect("info");
    assert_eq!((info.inflight, info.dead_letters, info.lag.total), (1, 0, 1));
    assert_eq!(f.rheo.renew(&real, secs(60)).await.expect("renew"), at(60));
}

/// A lease of one group cannot settle the same event in another group.
pub async fn lease_of_one_group_cannot_settle_another(f: Fixture) {
    stream(&f, 1).await;
    group_named(&f, G, GroupOptions::new()).await;
    group_named(&f, G2, GroupOptions::new()).await;
    append_to(&f, 0, 1).await;
    let a = fetch_from(&f, G, 1).await.remove(0);
    let crossed = LeaseRef { group: G2.into(), ..a.to_ref() };
    assert_err!(f.rheo.ack(&crossed).await, Error::StaleLease { ref group, .. } if group == G2);
    let b = fetch_from(&f, G2, 1).await.remove(0);
    let crossed = LeaseRef { group: G2.into(), ..a.to_ref() };
    assert_err!(f.rheo.ack(&crossed).await, Error::StaleLease { .. });
    f.rheo.ack(&b).await.expect("G2's own lease");
    assert_eq!(lag_total_of(&f, G).await, 1);
    f.rheo.ack(&a).await.expect("G's own lease");
}

/// An expired lease may still settle until another fetch reclaims it.
pub async fn expired_lease_can_still_settle_until_reclaimed(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 3).await;
    let leases = fetch_leased(&f, 3, 10).await;
    f.clock.advance(secs(3600));
    f.rheo.ack(&leases[0]).await.expect("ack after expiry, not reclaimed");
    let outcome = f.rheo.retry(&leases[1], "later").await.expect("retry after expiry");
    assert!(matches!(outcome, RetryOutcome::Scheduled { .. }));
    let renewed = f.rheo.renew(&leases[2], secs(10)).await.expect("renew after expiry");
    assert_eq!(renewed, at(3610));
    let next = fetch(&f, 10).await;
    assert_eq!(positions(&next), vec![(0, 2)], "1 acked, 3 renewed: only the retried one is claimable");
}

/// Once another fetch reclaims an expired delivery, the old lease is `StaleLease`
/// for every settle and the new lease works.
pub async fn expired_lease_is_stale_after_reclaim(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let old = f.rheo.fetch(S, G, FetchOptions::new().consumer("a").lease(secs(10))).await.expect("fetch").remove(0);
    f.clock.advance(secs(11));
    let new = f.rheo.fetch(S, G, FetchOptions::new().consumer("b")).await.expect("fetch").remove(0);
    assert_eq!(new.attempt, 2);
    let e = assert_err!(f.rheo.ack(&old).await, Error::StaleLease { sequence: 1, .. });
    assert_mentions(&e, &[&old.lease_id.to_string()]);
    assert_err!(f.rheo.renew(&old, secs(10)).await, Error::StaleLease { .. });
    assert_err!(f.rheo.retry(&old, "x").await, Error::StaleLease { .. });
    assert_err!(f.rheo.reject(&old, "x").await, Error::StaleLease { .. });
    f.rheo.ack(&new).await.expect("the new holder acks");
    assert_eq!(lag_total(&f).await, 0);
    assert!(f.rheo.dead_letters(S, G, Default::default()).await.expect("dlq").is_empty());
}

/// `renew` extends a lease past its old expiry: nobody can reclaim it meanwhile.
pub async fn renew_extends_lease_past_old_expiry(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let lease = fetch_leased(&f, 1, 10).await.remove(0);
    assert_eq!(lease.expires_at, at(10));
    f.clock.advance(secs(8));
    assert_eq!(f.rheo.renew(&lease, secs(10)).await.expect("renew"), at(18), "now + the new duration");
    f.clock.advance(secs(5)); // t13: past the old expiry
    assert!(fetch(&f, 10).await.is_empty(), "the renewed lease still holds");
    f.rheo.renew(&lease, secs(10)).await.expect("renew again");
    f.clock.advance(secs(11)); // t24: past the renewed expiry at t23
    let reclaimed = fetch(&f, 10).await;
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(reclaimed[0].attempt, 2, "renewing is not a new claim");
}

/// `renew` of a settled or reclaimed lease is `StaleLease`.
pub async fn renew_of_stale_lease_is_stale_lease(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 2).await;
    let leases = fetch_leased(&f, 2, 10).await;
    f.rheo.ack(&leases[0]).await.expect("ack");
    let e = assert_err!(f.rheo.renew(&leases[0], secs(10)).await, Error::StaleLease { sequence: 1, .. });
    assert_mentions(&e, &[S, G]);
    f.clock.advance(secs(11));
    let reclaimed = fetch(&f, 10).await;
    assert_eq!(positions(&reclaimed), vec![(0, 2)]);
    assert_err!(f.rheo.renew(&leases[1], secs(10)).await, Error::StaleLease { sequence: 2, .. });
}

/// `ack_many` returns one result per lease, in order; a stale lease fails alone.
pub async fn ack_many_returns_one_result_per_lease_and_a_stale_one_fails_alone(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 4).await;
    let leases = fetch(&f, 4).await;
    f.rheo.ack(&leases[1]).await.expect("ack the second one first");
    let results = f.rheo.ack_many(&leases).await.expect("the call itself succeeds");
    assert_eq!(results.len(), 4);
    assert!(results[0].is_ok() && results[2].is_ok() && results[3].is_ok(), "{results:?}");
    assert!(matches!(results[1], Err(Error::StaleLease { sequence: 2, .. })), "{:?}", results[1]);
    assert_eq!(lag_total(&f).await, 0);
    let again = f.rheo.ack_many(leases.iter().take(2)).await.expect("call");
    assert!(again.iter().all(|r| matches!(r, Err(Error::StaleLease { .. }))), "{again:?}");
    assert!(f.rheo.ack_many(Vec::<LeaseRef>::new()).await.expect("empty call").is_empty());
}

/// `renew_many` extends every live lease in one call, one result per lease
/// in order (the new expiry); a stale lease fails alone; a batch of
/// bad input fails as a whole before anything changes.
pub async fn renew_many_extends_each_lease_and_a_stale_one_fails_alone(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 3).await;
    let leases = fetch_leased(&f, 3, 10).await;
    f.rheo.ack(&leases[1]).await.expect("ack the second one");
    f.clock.advance(secs(8));
    let results = f.rheo.renew_many(&leases, secs(10)).await.expect("the call itself succeeds");
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].as_ref().ok(), Some(&at(18)), "{results:?}");
    assert!(matches!(results[1], Err(Error::StaleLease { sequence: 2, .. })), "{:?}", results[1]);
    assert_eq!(results[2].as_ref().ok(), Some(&at(18)), "{results:?}");
    f.clock.advance(secs(5)); // t13: past the old expiries
    assert!(fetch(&f, 10).await.is_empty(), "both renewed leases still hold");
    f.clock.advance(secs(6)); // t19: past the renewed ones
    assert_eq!(positions(&fetch(&f, 10).await), vec![(0, 1), (0, 3)]);
    assert!(f.rheo.renew_many(Vec::<LeaseRef>::new(), secs(10)).await.expect("empty call").is_empty());
    assert_err!(f.rheo.renew_many(&leases, std::time::Duration::ZERO).await, Error::InvalidArgument { .. });
}
