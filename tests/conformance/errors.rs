//! Arguments outside their bounds are `InvalidArgument`, and do nothing.

use std::time::Duration;

use rheo::{
    AppendOptions, DeadLetterOptions, Error, FetchOptions, MAX_LEASE, MAX_LIMIT, MAX_NAME_BYTES, MAX_QUERY_TERMS,
    MAX_REASON_BYTES, Query,
};
use serde_json::json;

use crate::common::Fixture;
use crate::support::*;

/// A limit of 0 or above `MAX_LIMIT` is `InvalidArgument` for fetch, read and
/// dead_letters; `MAX_LIMIT` itself is fine.
pub async fn zero_or_too_large_limit_is_invalid_argument(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    for limit in [0, MAX_LIMIT + 1] {
        let e = assert_err!(
            f.rheo.fetch(S, G, FetchOptions::new().limit(limit)).await,
            Error::InvalidArgument { argument: "limit", .. }
        );
        assert_mentions(&e, &["limit", &limit.to_string()]);
        assert_err!(f.rheo.read(S, 0, 0, limit).await, Error::InvalidArgument { argument: "limit", .. });
        assert_err!(
            f.rheo.dead_letters(S, G, DeadLetterOptions::new().limit(limit)).await,
            Error::InvalidArgument { argument: "limit", .. }
        );
    }
    let leases = f.rheo.fetch(S, G, FetchOptions::new().limit(MAX_LIMIT)).await.expect("MAX_LIMIT is accepted");
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].attempt, 1, "the rejected fetches claimed nothing");
    assert_eq!(f.rheo.read(S, 0, 0, MAX_LIMIT).await.expect("read").len(), 1);
}

/// A zero lease, or one above `MAX_LEASE`, is `InvalidArgument` for fetch and renew.
pub async fn zero_or_too_long_lease_is_invalid_argument(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    for lease in [Duration::ZERO, MAX_LEASE + secs(1)] {
        let e = assert_err!(
            f.rheo.fetch(S, G, FetchOptions::new().lease(lease)).await,
            Error::InvalidArgument { argument: "lease", .. }
        );
        assert_mentions(&e, &["lease"]);
    }
    let held = fetch(&f, 1).await.remove(0);
    assert_eq!(held.attempt, 1, "the rejected fetches claimed nothing");
    for lease in [Duration::ZERO, MAX_LEASE + secs(1)] {
        assert_err!(f.rheo.renew(&held, lease).await, Error::InvalidArgument { .. });
    }
    assert_eq!(held.expires_at, at(30));
    f.clock.advance(secs(31));
    assert_eq!(fetch(&f, 1).await.len(), 1, "the rejected renewals did not extend the lease");
}

/// A `retry_after` delay above `MAX_LEASE` is `InvalidArgument` and leaves the lease held.
pub async fn too_long_retry_delay_is_invalid_argument(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let held = fetch(&f, 1).await.remove(0);
    assert_err!(f.rheo.retry_after(&held, "later", MAX_LEASE + secs(1)).await, Error::InvalidArgument { .. });
    f.rheo.ack(&held).await.expect("still held");
}

/// A retry or reject reason above `MAX_REASON_BYTES` is `InvalidArgument` and
/// leaves the lease held; a reason of exactly the maximum is kept whole.
pub async fn too_long_reason_is_invalid_argument(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    let held = fetch(&f, 1).await.remove(0);
    let too_long = "r".repeat(MAX_REASON_BYTES + 1);
    assert_err!(f.rheo.retry(&held, &too_long).await, Error::InvalidArgument { argument: "reason", .. });
    assert_err!(f.rheo.reject(&held, &too_long).await, Error::InvalidArgument { argument: "reason", .. });
    let longest = "r".repeat(MAX_REASON_BYTES);
    f.rheo.reject(&held, &longest).await.expect("a reason of the maximum length");
    let dead = f.rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dlq");
    assert_eq!(dead[0].reason, longest);
}

/// An explicit event id must be 1 to `MAX_NAME_BYTES` bytes; nothing is written otherwise.
pub async fn explicit_event_id_out_of_bounds_is_invalid_argument(f: Fixture) {
    stream(&f, 1).await;
    for id in [String::new(), "i".repeat(MAX_NAME_BYTES + 1)] {
        let e = assert_err!(
            f.rheo.append(S, &json!({}), AppendOptions::new().id(id)).await,
            Error::InvalidArgument { argument: "id", .. }
        );
        assert_mentions(&e, &["id"]);
    }
    assert!(f.rheo.read(S, 0, 0, 10).await.expect("read").is_empty());
    let longest = "i".repeat(MAX_NAME_BYTES);
    assert_eq!(
        f.rheo.append(S, &json!({}), AppendOptions::new().id(longest.clone())).await.expect("append").id(),
        longest
    );
}

/// A query with more than `MAX_QUERY_TERMS` filter terms is `InvalidArgument`.
pub async fn query_with_too_many_terms_is_invalid_argument(f: Fixture) {
    stream(&f, 1).await;
    append_to(&f, 0, 1).await;
    let too_many = Query::new(S).is_in("n", 0..u64::try_from(MAX_QUERY_TERMS + 1).expect("small"));
    assert_err!(f.rheo.query(&too_many).await, Error::InvalidArgument { .. });
    let most = Query::new(S).is_in("n", 0..u64::try_from(MAX_QUERY_TERMS).expect("small"));
    assert_eq!(f.rheo.query(&most).await.expect("the maximum is accepted").len(), 1);
}
