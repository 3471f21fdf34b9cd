//! `wait_for_events`: a backend with wakeups returns as soon as events are
//! appended; every backend returns by the timeout and knows its streams.

use std::time::Duration;

use rheo::Error;

use crate::common::Fixture;
use crate::support::*;

/// A waiter is woken by an append long before its timeout.
pub async fn wait_for_events_wakes_on_append(f: Fixture) {
    setup(&f, 2).await;
    let waiter = {
        let rheo = f.rheo.clone();
        tokio::spawn(async move { rheo.wait_for_events(S, secs(600)).await })
    };
    // Let the waiter start waiting (this runtime runs it while we sleep).
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "nothing was appended yet");
    append_to(&f, 1, 1).await;
    if f.rheo.capabilities().wakeups {
        let woke = tokio::time::timeout(secs(30), waiter).await;
        woke.expect("woken by the append, not by its 600 s timeout").expect("the task").expect("no error");
    } else {
        waiter.abort();
    }
    // Without appends it returns at its timeout.
    f.rheo.wait_for_events(S, Duration::from_millis(20)).await.expect("times out quietly");
    assert_err!(f.rheo.wait_for_events("nope", Duration::from_millis(1)).await, Error::StreamNotFound { .. });
    assert_err!(f.rheo.subscribe("nope").await, Error::StreamNotFound { .. });
}

/// A subscription misses no append: one made before it waits is seen at
/// once, and each append wakes one wait, not every later one.
pub async fn a_subscription_sees_appends_made_between_its_waits(f: Fixture) {
    setup(&f, 2).await;
    let mut appends = f.rheo.subscribe(S).await.expect("subscribe");
    assert_eq!(appends.wakes(), f.rheo.capabilities().wakeups, "a subscription wakes where the backend says so");
    append_to(&f, 0, 2).await;
    if appends.wakes() {
        let woke = tokio::time::timeout(secs(30), appends.wait(secs(600))).await;
        assert_eq!(woke, Ok(true), "the appends before the wait wake it at once");
    }
    // Nothing appended since: the next wait runs to its timeout.
    assert!(!appends.wait(Duration::from_millis(20)).await, "no append since the last wait");
}
