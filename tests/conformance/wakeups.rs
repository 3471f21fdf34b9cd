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
}
