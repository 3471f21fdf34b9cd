//! The consumer runtime: a managed consumer of a group ([`Rheo::consumer`](crate::Rheo::consumer)) and its
//! composable form ([`LeaseStream`]).
//!
//! There is one consumer core. A [`LeaseStream`] is the fetch loop: it
//! fetches up to `max_demand` leases ahead, renews every lease it has handed
//! out until that lease is settled or dropped (one renewer, every `lease /
//! 2`), backs off on backend errors and waits for appends when idle. A
//! managed consumer ([`Rheo::consumer`](crate::Rheo::consumer)) is that
//! stream plus a [`Handler`] run on each lease by `concurrency` worker
//! tasks (at most `max_demand`) (a lease goes to a free worker; no task is spawned per lease), the handler's [`Outcome`] settled in batches
//! (`ack_many`), and a graceful drain on [`ConsumerHandle::shutdown`]. Both
//! settle through one call taking an outcome ([`StreamLease::settle`]).
//! Defaults follow `docs/semantics.md` ("Consumer runtime").
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
//! use rheo::{AppendOptions, GroupOptions, Outcome, Rheo, StreamOptions, handler_fn};
//! use serde_json::json;
//!
//! let rheo = Rheo::open("memory:").await?;
//! rheo.create_stream("orders", StreamOptions::new()).await?;
//! rheo.create_group("orders", "billing", GroupOptions::new()).await?;
//! rheo.append("orders", &json!({"total": 42}), AppendOptions::new()).await?;
//!
//! let handle = rheo.consumer("orders", "billing")
//!     .concurrency(4)
//!     .spawn(handler_fn(|lease| async move {
//!         println!("#{}: {}", lease.sequence(), lease.event.payload());
//!         Outcome::Ack
//!     }))
//!     .await?;
//! while rheo.lag("orders", "billing").await?.total > 0 {
//!     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
//! }
//! let summary = handle.shutdown().await?;
//! assert_eq!(summary.acked, 1);
//! # Ok::<(), rheo::Error>(()) }).expect("example");
//! ```

mod consumer;
mod renew;
mod settle;
mod stream;

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::model::lease::{Lease, RetryOutcome};
use crate::model::limits::MAX_REASON_BYTES;
use crate::model::time::Timestamp;

pub use consumer::{ConsumerBuilder, ConsumerHandle, RunSummary};

/// The old name of [`ConsumerBuilder`].
#[deprecated(note = "renamed ConsumerBuilder: it builds a consumer, not a group")]
pub type GroupBuilder = ConsumerBuilder;
/// The old name of [`ConsumerHandle`].
#[deprecated(note = "renamed ConsumerHandle: it is a running consumer, not a group")]
pub type GroupHandle = ConsumerHandle;
pub use stream::{LeaseStream, LeaseStreamOptions, StreamLease};

/// Default number of handlers running at once.
pub const DEFAULT_CONCURRENCY: usize = 1;
/// Default number of leases held (fetched, not yet settled) at once.
pub const DEFAULT_MAX_DEMAND: usize = 10;
/// Default lease duration.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default idle poll interval (the safety net behind wakeups).
pub const DEFAULT_POLL: Duration = Duration::from_millis(200);
/// Default time [`ConsumerHandle::shutdown`] waits for in-flight work.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest renewal interval.
pub const MIN_RENEW_INTERVAL: Duration = Duration::from_millis(50);
/// First delay after a backend error in fetch.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Longest delay after repeated backend errors in fetch.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Most settles coalesced into one `ack_many` call.
pub const SETTLE_BATCH_MAX: usize = 256;

/// What a handler decided about a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: acknowledge it.
    Ack,
    /// Give it back with a reason; the runtime's retry backoff (else the
    /// group's) applies. Dead-lettered once its attempts are used up.
    Retry(String),
    /// Give it back, claimable again after the delay (see [`Outcome::retry_after`]).
    RetryAfter(String, Duration),
    /// Dead-letter it for this group with a reason.
    Reject(String),
}

impl Outcome {
    /// A retry with a reason.
    pub fn retry(reason: impl Into<String>) -> Self {
        Outcome::Retry(reason.into())
    }

    /// A retry claimable again after `delay`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = rheo::Outcome::retry_after("rate limited", Duration::from_secs(2));
    /// assert!(matches!(o, rheo::Outcome::RetryAfter(_, _)));
    /// ```
    pub fn retry_after(reason: impl Into<String>, delay: Duration) -> Self {
        Outcome::RetryAfter(reason.into(), delay)
    }

    /// A rejection (dead letter) with a reason.
    pub fn reject(reason: impl Into<String>) -> Self {
        Outcome::Reject(reason.into())
    }
}

/// What a settle did (see [`StreamLease::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// Acknowledged.
    Acked,
    /// Given back; claimable again at this time.
    Retried {
        /// When it becomes claimable.
        available_at: Timestamp,
    },
    /// Dead-lettered: rejected, or a retry past the group's `max_attempts`.
    DeadLettered,
}

impl Settled {
    /// A retry's result (an ack reads as dead-lettered: no caller asks).
    fn into_retry(self) -> RetryOutcome {
        match self {
            Settled::Retried { available_at } => RetryOutcome::Scheduled { available_at },
            Settled::Acked | Settled::DeadLettered => RetryOutcome::DeadLettered,
        }
    }
}

/// The code a consumer ([`Rheo::consumer`](crate::Rheo::consumer)) runs for each delivery.
///
/// ```
/// use rheo::{Handler, Lease, Outcome};
///
/// struct Billing;
///
/// #[async_trait::async_trait]
/// impl Handler for Billing {
///     async fn handle(&self, lease: &Lease) -> Outcome {
///         match lease.event.payload().json() {
///             Ok(order) if order.get("total").is_some() => Outcome::Ack,
///             _ => Outcome::reject("no total"),
///         }
///     }
/// }
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles one delivery. A panic counts as
    /// `Outcome::Retry("handler_panic: <message>")`.
    async fn handle(&self, lease: &Lease) -> Outcome;

    /// Runs once before the first fetch; an error stops the spawn.
    async fn setup(&self) -> Result<()> {
        Ok(())
    }
}

/// A [`Handler`] made of a closure (see [`handler_fn`]).
#[derive(Debug, Clone)]
pub struct HandlerFn<F> {
    f: F,
}

/// Makes a [`Handler`] of a closure taking the lease (a clone) by value.
///
/// ```
/// let handler = rheo::handler_fn(|_lease| async { rheo::Outcome::Ack });
/// ```
pub fn handler_fn<F, Fut>(f: F) -> HandlerFn<F>
where
    F: Fn(Lease) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    HandlerFn { f }
}

#[async_trait]
impl<F, Fut> Handler for HandlerFn<F>
where
    F: Fn(Lease) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    async fn handle(&self, lease: &Lease) -> Outcome {
        (self.f)(lease.clone()).await
    }
}

/// How often a lease of `lease` is renewed: half of it, at least
/// [`MIN_RENEW_INTERVAL`].
pub(crate) fn renew_interval(lease: Duration) -> Duration {
    (lease / 2).max(MIN_RENEW_INTERVAL)
}

/// A reason cut to [`MAX_REASON_BYTES`] on a character boundary.
pub(crate) fn clip_reason(reason: &str) -> &str {
    if reason.len() <= MAX_REASON_BYTES {
        return reason;
    }
    let mut end = MAX_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// The doubling backoff used after backend errors.
#[derive(Debug, Clone)]
pub(crate) struct ErrorBackoff {
    next: Duration,
}

impl ErrorBackoff {
    pub(crate) fn new() -> Self {
        ErrorBackoff { next: BACKOFF_INITIAL }
    }

    /// The delay to wait now; doubles the next one up to [`BACKOFF_MAX`].
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        d
    }

    pub(crate) fn reset(&mut self) {
        self.next = BACKOFF_INITIAL;
    }
}

/// The message of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = ErrorBackoff::new();
        let seen: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(seen, [ms(100), ms(200), ms(400), ms(800), ms(1600), ms(3200), ms(5000), ms(5000)]);
        b.reset();
        assert_eq!(b.next_delay(), BACKOFF_INITIAL);
    }

    #[test]
    fn renew_interval_is_half_the_lease_with_a_floor() {
        assert_eq!(renew_interval(Duration::from_secs(30)), Duration::from_secs(15));
        assert_eq!(renew_interval(Duration::from_millis(20)), MIN_RENEW_INTERVAL);
    }

    #[test]
    fn reasons_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(MAX_REASON_BYTES);
        let clipped = clip_reason(&long);
        assert!(clipped.len() <= MAX_REASON_BYTES);
        assert!(clipped.chars().all(|c| c == 'é'));
    }
}
