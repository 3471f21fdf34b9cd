//! Backend fixtures shared by the conformance suite and the property tests.
//!
//! A fixture is a fresh, empty backend behind a `Rheo` handle, driven by a
//! manual clock so that expiry and backoff are tested without sleeping.
//! Adding a backend to every suite is one line in `backends!` below.

#![allow(dead_code)]

use std::any::Any;
use std::sync::Arc;

use futures::future::BoxFuture;
use rheo::{ManualClock, Rheo, Timestamp};

/// A fresh backend and the clock it reads.
pub struct Fixture {
    /// The handle under test.
    pub rheo: Rheo,
    /// The clock every backend call reads.
    pub clock: ManualClock,
    /// Keeps temporary directories, servers... alive for the test.
    pub guard: Option<Box<dyn Any + Send>>,
}

/// Builds a fresh fixture.
pub type Factory = fn() -> BoxFuture<'static, Fixture>;

/// The instant every fixture's clock starts at (2026-01-01T00:00:00Z).
pub const START: Timestamp = Timestamp::from_millis(1_767_225_600_000);

/// The memory backend.
pub fn memory() -> BoxFuture<'static, Fixture> {
    Box::pin(async {
        let clock = ManualClock::new(START);
        let rheo = Rheo::builder()
            .clock(Arc::new(clock.clone()))
            .consumer_id("test-consumer")
            .open("memory:")
            .await
            .expect("memory backend opens");
        Fixture { rheo, clock, guard: None }
    })
}

/// Expands `$callback!(name, factory)` once per backend under test.
/// Adding a backend = one line here.
#[macro_export]
macro_rules! backends {
    ($callback:ident) => {
        $callback!(memory, $crate::common::memory);
    };
}
