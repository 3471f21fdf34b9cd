//! The consumer runtime (`Rheo::consumer`, `LeaseStream`) on each backend: bounds,
//! renewal, drain, panics, fetch backoff, settle outcomes and batching.
//!
//! Lease expiry reads the fixture's manual clock; the runtime's own timers
//! (renewal, poll, backoff) run on Tokio's paused clock, so nothing sleeps.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use parking_lot::Mutex;
use rheo::Clock;
use rheo::backends::Backend;
use rheo::{
    AppendOptions, Capabilities, DeadLetterOptions, Event, FetchOptions, GroupOptions, Lag, Lease, LeaseRef,
    LeaseStreamOptions, NewEvent, Outcome, Result, RetryOutcome, Rheo, Settled, StreamOptions, Timestamp, handler_fn,
};
use tokio::time::Instant;

use common::Fixture;

const S: &str = "orders";
const G: &str = "billing";

/// A backend that delegates to another, counts calls and fails chosen fetches.
#[derive(Debug)]
struct Spy {
    inner: Arc<dyn Backend>,
    /// Fetch calls with these indexes (0-based) fail with `BackendUnavailable`.
    failing_fetches: Vec<usize>,
    fetch_times: Mutex<Vec<Instant>>,
    /// The limit of each fetch call.
    fetch_limits: Mutex<Vec<usize>>,
    /// `ack_many` calls made outside the runtime's
    /// `keeping_the_worker_free` scope (a native commit would then sync on
    /// the worker other tasks wait behind).
    acks_holding_the_worker: AtomicUsize,
    /// The same for `renew_many`.
    renewals_holding_the_worker: AtomicUsize,
    ack_calls: AtomicUsize,
    ack_many_calls: AtomicUsize,
    ack_many_leases: AtomicUsize,
    renew_calls: AtomicUsize,
    renew_many_sizes: Mutex<Vec<usize>>,
    /// The next this many `renew_many` calls fail with `BackendUnavailable`.
    failing_renews: AtomicUsize,
    /// When set, every `ack_many` call fails with this error.
    failing_acks: Mutex<Option<rheo::Error>>,
}

impl Spy {
    fn new(inner: Arc<dyn Backend>, failing_fetches: Vec<usize>) -> Arc<Spy> {
        Arc::new(Spy {
            inner,
            failing_fetches,
            fetch_times: Mutex::new(Vec::new()),
            fetch_limits: Mutex::new(Vec::new()),
            acks_holding_the_worker: AtomicUsize::new(0),
            renewals_holding_the_worker: AtomicUsize::new(0),
            ack_calls: AtomicUsize::new(0),
            ack_many_calls: AtomicUsize::new(0),
            ack_many_leases: AtomicUsize::new(0),
            renew_calls: AtomicUsize::new(0),
            renew_many_sizes: Mutex::new(Vec::new()),
            failing_renews: AtomicUsize::new(0),
            failing_acks: Mutex::new(None),
        })
    }
}

#[async_trait]
impl Backend for Spy {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }
    async fn ensure_schema(&self) -> Result<()> {
        self.inner.ensure_schema().await
    }
    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> Result<rheo::StreamInfo> {
        self.inner.create_stream(stream, opts).await
    }
    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> Result<rheo::GroupSummary> {
        self.inner.create_group(stream, group, opts).await
    }
    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<rheo::Position>> {
        self.inner.append_batch(stream, events).await
    }
    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.inner.read(stream, partition, after, limit).await
    }
    async fn query(&self, query: &rheo::Query) -> Result<rheo::Page> {
        self.inner.query(query).await
    }
    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<rheo::FetchReport> {
        let call = {
            let mut times = self.fetch_times.lock();
            times.push(Instant::now());
            self.fetch_limits.lock().push(opts.limit);
            times.len() - 1
        };
        if self.failing_fetches.contains(&call) {
            return Err(rheo::Error::unavailable("spy", "fetch", format!("injected failure of fetch #{call}")));
        }
        self.inner.fetch(stream, group, opts).await
    }
    async fn renew(&self, lease: &LeaseRef, d: Duration) -> Result<Timestamp> {
        self.renew_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(lease, d).await
    }
    async fn renew_many(&self, leases: &[LeaseRef], d: Duration) -> Result<Vec<Result<Timestamp>>> {
        self.renew_many_sizes.lock().push(leases.len());
        if !rheo::engine::worker_kept_free() {
            self.renewals_holding_the_worker.fetch_add(1, Ordering::SeqCst);
        }
        if self.failing_renews.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(rheo::Error::unavailable("spy", "renew_many", "injected failure"));
        }
        self.inner.renew_many(leases, d).await
    }
    async fn ack(&self, lease: &LeaseRef) -> Result<()> {
        self.ack_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.ack(lease).await
    }
    async fn ack_many(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        self.ack_many_calls.fetch_add(1, Ordering::SeqCst);
        self.ack_many_leases.fetch_add(leases.len(), Ordering::SeqCst);
        if !rheo::engine::worker_kept_free() {
            self.acks_holding_the_worker.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(e) = self.failing_acks.lock().clone() {
            return Err(e);
        }
        self.inner.ack_many(leases).await
    }
    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> Result<RetryOutcome> {
        self.inner.retry(lease, reason, delay).await
    }
    async fn reject(&self, lease: &LeaseRef, reason: &str) -> Result<()> {
        self.inner.reject(lease, reason).await
    }
    async fn replay(&self, stream: &str, group: &str, opts: &rheo::Replay) -> Result<u64> {
        self.inner.replay(stream, group, opts).await
    }
    async fn reset_group(&self, stream: &str, group: &str, opts: &rheo::Reset) -> Result<()> {
        self.inner.reset_group(stream, group, opts).await
    }
    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag> {
        self.inner.lag(stream, group, partitions).await
    }
    async fn dead_letters(&self, stream: &str, group: &str, opts: &DeadLetterOptions) -> Result<Vec<rheo::DeadLetter>> {
        self.inner.dead_letters(stream, group, opts).await
    }
    async fn subscribe(&self, stream: &str) -> Result<rheo::backends::Subscription> {
        self.inner.subscribe(stream).await
    }
}

/// The fixture's backend behind a spy, on the fixture's clock.
fn spied(f: &Fixture, failing_fetches: Vec<usize>) -> (Rheo, Arc<Spy>) {
    let spy = Spy::new(f.rheo.backend().clone(), failing_fetches);
    let rheo = Rheo::builder()
        .clock(Arc::new(f.clock.clone()))
        .consumer_id("runtime-test")
        .with_backend(spy.clone())
        .expect("spied backend");
    (rheo, spy)
}

async fn setup(f: &Fixture, events: usize, group: GroupOptions) {
    f.rheo.create_stream(S, StreamOptions::new().partitions(2)).await.expect("stream");
    f.rheo.create_group(S, G, group).await.expect("group");
    append(&f.rheo, events).await;
}

async fn append(rheo: &Rheo, events: usize) {
    for n in 0..events {
        rheo.append(S, &serde_json::json!({"n": n}), AppendOptions::new()).await.expect("append");
    }
}

/// Waits (on Tokio's clock) until the group's lag is zero.
async fn until_consumed(rheo: &Rheo) {
    for _ in 0..10_000 {
        if rheo.lag(S, G).await.expect("lag").total == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the group never caught up");
}

/// Waits until the runtime has settled `n` deliveries. Needed before a
/// shutdown on paused time: while a native commit waits on its writer thread,
/// Tokio would otherwise jump straight to the drain deadline.
async fn until_settled(handle: &rheo::ConsumerHandle, n: u64) {
    until("settles", || {
        let s = handle.summary();
        s.acked + s.retried + s.dead_lettered >= n
    })
    .await;
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Counts handlers running at once and remembers the most.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    started: AtomicUsize,
}

impl Gauge {
    fn enter(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
    }
    fn exit(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn in_flight_bound(f: Fixture, concurrency: usize, max_demand: usize, expected_max: usize) {
    setup(&f, 40, GroupOptions::new()).await;
    let gauge = Arc::new(Gauge::default());
    let g = gauge.clone();
    let handle = f
        .rheo
        .consumer(S, G)
        .concurrency(concurrency)
        .max_demand(max_demand)
        .spawn(handler_fn(move |_lease| {
            let g = g.clone();
            async move {
                g.enter();
                tokio::time::sleep(Duration::from_millis(20)).await;
                g.exit();
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    until_consumed(&f.rheo).await;
    until_settled(&handle, 40).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(summary.acked, 40);
    // Never above the bound, and the bound is actually reached (so the test
    // fails if handlers were serialized by mistake too).
    assert_eq!(gauge.max.load(Ordering::SeqCst), expected_max);
}

async fn concurrency_is_never_exceeded(f: Fixture) {
    in_flight_bound(f, 4, 10, 4).await;
}

async fn max_demand_is_never_exceeded(f: Fixture) {
    in_flight_bound(f, 8, 3, 3).await;
}

/// One event, and a consumer (1 s leases) whose handler has started on it
/// and waits for `release`.
async fn one_blocked_handler(f: &Fixture) -> (rheo::ConsumerHandle, Arc<tokio::sync::Notify>) {
    setup(f, 1, GroupOptions::new()).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let gauge = Arc::new(Gauge::default());
    let (r, g) = (release.clone(), gauge.clone());
    let handle = f
        .rheo
        .consumer(S, G)
        .lease(Duration::from_secs(1))
        .spawn(handler_fn(move |_lease| {
            let (r, g) = (r.clone(), g.clone());
            async move {
                g.enter();
                r.notified().await;
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    until("the handler to start", || gauge.started.load(Ordering::SeqCst) == 1).await;
    (handle, release)
}

async fn renewal_keeps_a_lease_past_its_first_expiry(f: Fixture) {
    let (handle, release) = one_blocked_handler(&f).await;
    // 2.4 s of backend time pass while the handler runs; renewals every 500 ms
    // of Tokio time keep the 1 s lease alive.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        f.clock.advance(Duration::from_millis(600));
    }
    let stolen = f.rheo.fetch(S, G, FetchOptions::new().consumer("intruder")).await.expect("fetch");
    assert!(stolen.is_empty(), "the lease expired: redelivered to another consumer");
    release.notify_one();
    until_consumed(&f.rheo).await;
    until_settled(&handle, 1).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!((summary.acked, summary.lost), (1, 0));
}

async fn shutdown_drains_in_flight_handlers(f: Fixture) {
    setup(&f, 5, GroupOptions::new()).await;
    let gauge = Arc::new(Gauge::default());
    let g = gauge.clone();
    let handle = f
        .rheo
        .consumer(S, G)
        .concurrency(5)
        .spawn(handler_fn(move |_lease| {
            let g = g.clone();
            async move {
                g.enter();
                tokio::time::sleep(Duration::from_millis(200)).await;
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    until("five handlers", || gauge.started.load(Ordering::SeqCst) == 5).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(summary.acked, 5);
    assert_eq!(f.rheo.lag(S, G).await.expect("lag").total, 0);
}

async fn drain_timeout_leaves_stuck_handlers_to_expiry(f: Fixture) {
    setup(&f, 2, GroupOptions::new()).await;
    let gauge = Arc::new(Gauge::default());
    let g = gauge.clone();
    let handle = f
        .rheo
        .consumer(S, G)
        .concurrency(2)
        .drain_timeout(Duration::from_secs(1))
        .spawn(handler_fn(move |_lease| {
            let g = g.clone();
            async move {
                g.enter();
                futures::future::pending::<()>().await;
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    until("two handlers", || gauge.started.load(Ordering::SeqCst) == 2).await;
    let started = Instant::now();
    let summary = handle.shutdown().await.expect("shutdown");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!((summary.acked, summary.left_to_expiry), (0, 2));
    assert_eq!(f.rheo.lag(S, G).await.expect("lag").total, 2);
}

async fn a_lease_lost_to_another_consumer_is_dropped(f: Fixture) {
    let (handle, release) = one_blocked_handler(&f).await;
    // The lease expires before the first renewal and another consumer takes it.
    f.clock.advance(Duration::from_secs(2));
    let stolen = f.rheo.fetch(S, G, FetchOptions::new().consumer("intruder")).await.expect("fetch");
    assert_eq!(stolen.len(), 1);
    until("the renewal to find the lease lost", || handle.summary().lost == 1).await;
    release.notify_one();
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!((summary.acked, summary.lost), (0, 1));
    // The runtime settled nothing: the intruder's lease still holds.
    f.rheo.ack(&stolen[0]).await.expect("the intruder acks");
}

/// Leases queued for a handler (never started) that another consumer took
/// meanwhile are counted lost at shutdown, not released or left to expiry.
async fn a_queued_lease_lost_to_another_consumer_is_counted_lost_at_shutdown(f: Fixture) {
    setup(&f, 3, GroupOptions::new()).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(AtomicUsize::new(0));
    let (r, s) = (release.clone(), started.clone());
    let handle = f
        .rheo
        .consumer(S, G)
        .concurrency(1)
        .max_demand(6)
        .lease(Duration::from_secs(1))
        .spawn(handler_fn(move |_lease| {
            let (r, s) = (r.clone(), s.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                r.notified().await;
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    until("the first handler to start", || started.load(Ordering::SeqCst) == 1).await;
    // All three leases expire before a renewal, and another consumer takes them.
    f.clock.advance(Duration::from_secs(2));
    let stolen = f.rheo.fetch(S, G, FetchOptions::new().limit(10).consumer("intruder")).await.expect("fetch");
    assert_eq!(stolen.len(), 3, "the running lease and the two queued ones");
    // One renewal round finds all three lost; the running one is counted now.
    until("the renewal to find the running lease lost", || handle.summary().lost == 1).await;
    release.notify_one();
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(started.load(Ordering::SeqCst), 1, "no queued lease starts after it was lost or after the stop");
    assert_eq!((summary.acked, summary.lost, summary.left_to_expiry), (0, 3, 0), "{summary:?}");
    // Nothing of the runtime's touched the intruder's leases.
    for r in f.rheo.ack_many(&stolen).await.expect("the intruder acks") {
        r.expect("ack");
    }
}

async fn a_definite_ack_failure_is_a_nack_and_an_ambiguous_one_is_left_to_expiry(f: Fixture) {
    setup(&f, 1, GroupOptions::new().max_attempts(2)).await;
    let (rheo, spy) = spied(&f, vec![]);
    *spy.failing_acks.lock() = Some(rheo::Error::failed("ack_many", "disk full"));
    let handle = rheo.consumer(S, G).spawn(handler_fn(|_lease| async { Outcome::Ack })).await.expect("spawn");
    // Attempt 1: ack fails, nacked; attempt 2: the same, and the nack dead-letters.
    until_consumed(&f.rheo).await;
    until_settled(&handle, 2).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!((summary.acked, summary.retried, summary.dead_lettered), (0, 1, 1));
    let reasons = dead_letter_reasons(&f.rheo).await;
    assert!(reasons[0].starts_with("max_attempts: ack_failed: "), "{reasons:?}");

    append(&f.rheo, 1).await;
    *spy.failing_acks.lock() = Some(rheo::Error::ambiguous("ack_many", "connection lost after commit"));
    let handle = rheo.consumer(S, G).spawn(handler_fn(|_lease| async { Outcome::Ack })).await.expect("spawn");
    until("the ambiguous ack", || handle.summary().left_to_expiry == 1).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!((summary.acked, summary.retried, summary.left_to_expiry), (0, 0, 1));
    // Still leased (left to expiry), so not claimable yet.
    assert!(f.rheo.fetch(S, G, FetchOptions::new().consumer("other")).await.expect("fetch").is_empty());
}

async fn dead_letter_reasons(rheo: &Rheo) -> Vec<String> {
    let dl = rheo.dead_letters(S, G, DeadLetterOptions::default()).await.expect("dead letters");
    dl.into_iter().map(|d| d.reason).collect()
}

async fn a_panicking_handler_is_a_retry_with_the_reason(f: Fixture) {
    setup(&f, 1, GroupOptions::new().max_attempts(1)).await;
    let handle = f.rheo.consumer(S, G).spawn(handler_fn(|_lease| async { panic!("boom") })).await.expect("spawn");
    until_consumed(&f.rheo).await;
    until_settled(&handle, 1).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!((summary.panicked, summary.dead_lettered), (1, 1));
    // One attempt allowed: the retry dead-letters, keeping the reason.
    assert_eq!(dead_letter_reasons(&f.rheo).await, ["max_attempts: handler_panic: boom"]);
}

async fn reject_dead_letters_and_retry_redelivers(f: Fixture) {
    setup(&f, 2, GroupOptions::new()).await;
    let handle = f
        .rheo
        .consumer(S, G)
        .spawn(handler_fn(|lease: Lease| async move {
            match (lease.event.payload().json().expect("json")["n"].as_u64(), lease.attempt) {
                (Some(0), _) => Outcome::reject("bad order"),
                (_, 1) => Outcome::retry("try again"),
                _ => Outcome::Ack,
            }
        }))
        .await
        .expect("spawn");
    until_consumed(&f.rheo).await;
    until_settled(&handle, 3).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!((summary.acked, summary.retried, summary.dead_lettered), (1, 1, 1));
    assert_eq!(dead_letter_reasons(&f.rheo).await, ["bad order"]);
}

async fn fetch_errors_back_off_doubling_and_reset_on_success(f: Fixture) {
    setup(&f, 0, GroupOptions::new()).await;
    // Fetches 0-3 fail, 4 succeeds (nothing to do: idle wait), 5 fails, 6 succeeds.
    let (rheo, spy) = spied(&f, vec![0, 1, 2, 3, 5]);
    let handle = rheo.consumer(S, G).spawn(handler_fn(|_lease| async { Outcome::Ack })).await.expect("spawn");
    until("seven fetches", || spy.fetch_times.lock().len() >= 7).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(summary.fetch_errors, 5);
    let t = spy.fetch_times.lock().clone();
    let gap = |i: usize| t[i + 1] - t[i];
    for (i, ms) in [(0, 100), (1, 200), (2, 400), (3, 800)] {
        let want = Duration::from_millis(ms);
        assert!(gap(i) >= want && gap(i) < want * 2, "gap after fetch {i}: {:?}, want {want:?}", gap(i));
    }
    // After the success the backoff starts again at 100 ms.
    let want = Duration::from_millis(100);
    assert!(gap(5) >= want && gap(5) < want * 2, "gap after fetch 5: {:?}, want {want:?}", gap(5));
}

async fn settles_are_batched_into_ack_many(f: Fixture) {
    setup(&f, 200, GroupOptions::new()).await;
    let (rheo, spy) = spied(&f, vec![]);
    let handle = rheo
        .consumer(S, G)
        .concurrency(8)
        .max_demand(64)
        .spawn(handler_fn(|_lease| async { Outcome::Ack }))
        .await
        .expect("spawn");
    until_consumed(&f.rheo).await;
    until_settled(&handle, 200).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(summary.acked, 200);
    assert_eq!(spy.ack_calls.load(Ordering::SeqCst), 0, "single acks used");
    assert_eq!(spy.ack_many_leases.load(Ordering::SeqCst), 200);
    let calls = spy.ack_many_calls.load(Ordering::SeqCst);
    assert_eq!(summary.ack_batches, calls as u64);
    assert!(calls < 100, "{calls} ack_many calls for 200 acks: not coalesced");
    assert_eq!(spy.acks_holding_the_worker.load(Ordering::SeqCst), 0, "the settler keeps its worker free");
    // A caller of its own is not marked (and the spy sees it).
    append(&f.rheo, 1).await;
    let leases = rheo.fetch(S, G, FetchOptions::new()).await.expect("fetch");
    rheo.ack_many(&leases).await.expect("ack_many");
    assert_eq!(spy.acks_holding_the_worker.load(Ordering::SeqCst), 1);
}

async fn lease_stream_bounds_outstanding_and_settles_through_the_item(f: Fixture) {
    setup(&f, 10, GroupOptions::new()).await;
    let mut leases = f.rheo.lease_stream(S, G, LeaseStreamOptions::new().max_demand(3)).expect("lease stream");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(leases.next().await.expect("item").expect("lease"));
    }
    assert_eq!(leases.outstanding(), 3);
    let blocked = tokio::time::timeout(Duration::from_secs(5), leases.next()).await;
    assert!(blocked.is_err(), "a fourth lease was yielded with three outstanding");
    // Settling one frees its slot.
    held.pop().expect("lease").ack().await.expect("ack");
    held.push(leases.next().await.expect("item").expect("lease"));
    // Dropping one unsettled frees its slot too (the delivery is left to expiry).
    drop(held.pop());
    assert_eq!(leases.outstanding(), 2);
    held.push(leases.next().await.expect("item").expect("lease"));
    let rejected = held.pop().expect("lease");
    let rejected_seq = (rejected.partition(), rejected.sequence());
    rejected.reject("unwanted").await.expect("reject");
    for l in held.drain(..) {
        assert!(matches!(l.retry("later").await.expect("retry"), RetryOutcome::Scheduled { .. }));
    }
    assert_eq!(leases.outstanding(), 0);
    let dl = f.rheo.dead_letters(S, G, DeadLetterOptions::default()).await.expect("dead letters");
    assert_eq!(dl.len(), 1);
    assert_eq!((dl[0].partition, dl[0].sequence), rejected_seq);
}

/// One settle call takes an outcome and says what it did; reasons are cut
/// to the limit.
async fn stream_lease_settle_takes_an_outcome(f: Fixture) {
    setup(&f, 3, GroupOptions::new().max_attempts(2)).await;
    let mut leases = f.rheo.lease_stream(S, G, LeaseStreamOptions::new().max_demand(3)).expect("lease stream");
    let mut next = async || leases.next().await.expect("item").expect("lease");
    let (acked, retried, rejected) = (next().await, next().await, next().await);
    assert_eq!(acked.settle(Outcome::Ack).await.expect("ack"), Settled::Acked);
    let now = rheo::Clock::now(&f.clock);
    let again = (retried.partition(), retried.sequence());
    assert_eq!(
        retried.settle(Outcome::retry_after("later", Duration::from_secs(7))).await.expect("retry"),
        Settled::Retried { available_at: now.saturating_add(Duration::from_secs(7)) }
    );
    let long = "r".repeat(rheo::MAX_REASON_BYTES + 10);
    let rejected_at = (rejected.partition(), rejected.sequence());
    assert_eq!(rejected.settle(Outcome::reject(long)).await.expect("reject"), Settled::DeadLettered);
    // The retried delivery's second attempt is its last: a retry dead-letters it.
    f.clock.advance(Duration::from_secs(7));
    let last = next().await;
    assert_eq!(((last.partition(), last.sequence()), last.attempt), (again, 2));
    assert_eq!(last.settle(Outcome::retry("still failing")).await.expect("retry"), Settled::DeadLettered);
    let dl = f.rheo.dead_letters(S, G, DeadLetterOptions::default()).await.expect("dead letters");
    let reasons: Vec<_> = dl.iter().map(|d| ((d.partition, d.sequence), d.reason.len())).collect();
    assert!(reasons.contains(&(rejected_at, rheo::MAX_REASON_BYTES)), "{reasons:?}");
    assert!(reasons.iter().any(|(at, _)| *at == again), "{reasons:?}");
    assert_eq!(f.rheo.lag(S, G).await.expect("lag").total, 0);
}

async fn lease_stream_composes_with_buffer_unordered_and_ready_chunks(f: Fixture) {
    setup(&f, 60, GroupOptions::new()).await;
    let peak = Arc::new(AtomicUsize::new(0));
    let leases = f.rheo.lease_stream(S, G, LeaseStreamOptions::new().max_demand(8)).expect("lease stream");
    let p = peak.clone();
    let outcomes: Vec<Result<()>> = leases
        .take(30)
        .map(|lease| {
            let p = p.clone();
            async move {
                let lease = lease?;
                p.fetch_max(lease.attempt as usize, Ordering::SeqCst);
                lease.ack().await
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    assert_eq!(outcomes.len(), 30);
    assert!(outcomes.iter().all(|r| r.is_ok()), "{outcomes:?}");
    assert_eq!(f.rheo.lag(S, G).await.expect("lag").total, 30);

    let (rheo, spy) = spied(&f, vec![]);
    let mut chunks =
        rheo.lease_stream(S, G, LeaseStreamOptions::new().max_demand(16)).expect("stream").ready_chunks(16);
    let mut acked = 0;
    while acked < 30 {
        let chunk = chunks.next().await.expect("chunk");
        let chunk: Vec<_> = chunk.into_iter().collect::<Result<_>>().expect("leases");
        assert!(chunk.len() <= 16);
        acked += chunk.len();
        for r in rheo.ack_many(chunk).await.expect("ack_many") {
            r.expect("ack");
        }
    }
    assert_eq!(acked, 30);
    assert!(spy.ack_many_calls.load(Ordering::SeqCst) >= 2);
    assert_eq!(f.rheo.lag(S, G).await.expect("lag").total, 0);
}

async fn lease_stream_retries_transient_errors_and_yields_definite_ones(f: Fixture) {
    setup(&f, 1, GroupOptions::new()).await;
    let (rheo, spy) = spied(&f, vec![0, 1]);
    let mut leases = rheo.lease_stream(S, G, LeaseStreamOptions::new()).expect("lease stream");
    let started = Instant::now();
    let lease = leases.next().await.expect("item").expect("transient errors are retried, not yielded");
    assert_eq!(spy.fetch_times.lock().len(), 3);
    assert!(started.elapsed() >= Duration::from_millis(300), "backoff 100 + 200 ms");
    lease.ack().await.expect("ack");

    let mut missing = f.rheo.lease_stream(S, "nobody", LeaseStreamOptions::new()).expect("lease stream");
    let err = missing.next().await.expect("item").expect_err("no such group");
    assert!(matches!(err, rheo::Error::GroupNotFound { .. }), "{err}");
}

async fn lease_stream_renews_held_leases(f: Fixture) {
    setup(&f, 1, GroupOptions::new()).await;
    let mut leases =
        f.rheo.lease_stream(S, G, LeaseStreamOptions::new().lease(Duration::from_secs(1))).expect("lease stream");
    let lease = leases.next().await.expect("item").expect("lease");
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        f.clock.advance(Duration::from_millis(600));
    }
    let stolen = f.rheo.fetch(S, G, FetchOptions::new().consumer("intruder")).await.expect("fetch");
    assert!(stolen.is_empty(), "the held lease expired");
    lease.ack().await.expect("ack after renewals");
}

/// A renewal that fails is tried again well before the lease runs out
/// (an eighth of it later), not a whole tick later: the lease stream and
/// the consumer share one renewer.
async fn lease_stream_retries_a_failed_renewal_soon(f: Fixture) {
    setup(&f, 1, GroupOptions::new()).await;
    let (rheo, spy) = spied(&f, vec![]);
    spy.failing_renews.store(1, Ordering::SeqCst);
    let opts = LeaseStreamOptions::new().lease(Duration::from_secs(1));
    let mut leases = rheo.lease_stream(S, G, opts).expect("lease stream");
    let lease = leases.next().await.expect("item").expect("lease");
    // The tick at 500 ms fails; the retry comes at about 625 ms, long
    // before the next tick (1,000 ms).
    tokio::time::sleep(Duration::from_millis(850)).await;
    let sizes = spy.renew_many_sizes.lock().clone();
    assert_eq!(sizes, vec![1, 1], "the failed renewal and its early retry");
    assert_eq!(spy.failing_renews.load(Ordering::SeqCst), 0, "the injected failure was used");
    lease.ack().await.expect("ack");
}

/// Leases fetched ahead and not yet yielded are renewed too: taken late,
/// they are still ours. All held leases are renewed in one `renew_many`.
async fn lease_stream_renews_leases_it_has_not_yielded_yet(f: Fixture) {
    setup(&f, 3, GroupOptions::new()).await;
    let (rheo, spy) = spied(&f, vec![]);
    // A fetch asks for at most half the demand: 3 of 6.
    let opts = LeaseStreamOptions::new().max_demand(6).lease(Duration::from_secs(1));
    let mut leases = rheo.lease_stream(S, G, opts).expect("lease stream");
    let first = leases.next().await.expect("item").expect("lease");
    assert_eq!(leases.outstanding(), 3, "all three fetched at once");
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        f.clock.advance(Duration::from_millis(600));
    }
    let stolen = f.rheo.fetch(S, G, FetchOptions::new().limit(10).consumer("intruder")).await.expect("fetch");
    assert!(stolen.is_empty(), "a buffered lease expired: {stolen:?}");
    first.ack().await.expect("ack");
    for _ in 0..2 {
        leases.next().await.expect("item").expect("lease").ack().await.expect("ack after renewals");
    }
    let sizes = spy.renew_many_sizes.lock().clone();
    // While all three were held (the ticks before the acks), each tick
    // renewed them together.
    assert!(sizes.len() >= 3 && sizes[..3].iter().all(|&n| n == 3), "one renew_many of all 3 per tick: {sizes:?}");
    assert_eq!(spy.renew_calls.load(Ordering::SeqCst), 0, "no single renews");
    assert_eq!(spy.renewals_holding_the_worker.load(Ordering::SeqCst), 0, "the renewer keeps its worker free");
}

/// A fetch asks for at most half of `max_demand`, so that one batch is
/// handled while the other's settles are being made; the stream still
/// holds up to `max_demand`.
async fn lease_stream_keeps_two_batches_in_flight(f: Fixture) {
    setup(&f, 20, GroupOptions::new()).await;
    let (rheo, spy) = spied(&f, vec![]);
    let mut leases = rheo.lease_stream(S, G, LeaseStreamOptions::new().max_demand(8)).expect("lease stream");
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(leases.next().await.expect("item").expect("lease"));
    }
    assert_eq!(*spy.fetch_limits.lock(), vec![4, 4], "two fetches of half the demand");
    assert_eq!(leases.outstanding(), 8);
    // Settling the first batch frees room for the next half at once.
    for lease in held.drain(..4) {
        lease.ack().await.expect("ack");
    }
    held.push(leases.next().await.expect("item").expect("lease"));
    assert_eq!(*spy.fetch_limits.lock(), vec![4, 4, 4]);
    for lease in held {
        lease.ack().await.expect("ack");
    }
}

/// A consumer renews every lease its handlers hold with one `renew_many`
/// per tick, not one renew per lease.
async fn consumer_renews_its_leases_together(f: Fixture) {
    setup(&f, 3, GroupOptions::new()).await;
    let (rheo, spy) = spied(&f, vec![]);
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let gate = release.clone();
    let handle = rheo
        .consumer(S, G)
        .concurrency(3)
        .max_demand(3)
        .lease(Duration::from_secs(1))
        .spawn(handler_fn(move |_lease| {
            let gate = gate.clone();
            async move {
                let _ = gate.acquire().await.map(|p| p.forget());
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        f.clock.advance(Duration::from_millis(600));
    }
    let stolen = f.rheo.fetch(S, G, FetchOptions::new().limit(10).consumer("intruder")).await.expect("fetch");
    assert!(stolen.is_empty(), "a held lease expired: {stolen:?}");
    release.add_permits(3);
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(summary.acked, 3, "{summary:?}");
    let sizes = spy.renew_many_sizes.lock().clone();
    assert!(sizes.len() >= 3 && sizes[..3].iter().all(|&n| n == 3), "one renew_many of all 3 per tick: {sizes:?}");
    assert_eq!(spy.renew_calls.load(Ordering::SeqCst), 0, "no single renews");
    assert_eq!(spy.renewals_holding_the_worker.load(Ordering::SeqCst), 0, "the renewer keeps its worker free");
}

/// A shutdown lets go of leases fetched ahead whose handler never started
/// (they do not wait out their lease), and runs no handler after it.
async fn shutdown_releases_leases_fetched_ahead(f: Fixture) {
    setup(&f, 6, GroupOptions::new()).await;
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let handle = f
        .rheo
        .consumer(S, G)
        .concurrency(1)
        .max_demand(6)
        .spawn(handler_fn(move |_lease| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    until("a handler", || started.load(Ordering::SeqCst) == 1).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(started.load(Ordering::SeqCst), 1, "no handler starts after the shutdown");
    assert_eq!((summary.acked, summary.left_to_expiry), (1, 5), "{summary:?}");
    // Released at once: another consumer can take them without waiting 30 s.
    f.clock.advance(Duration::from_millis(10));
    let others = f.rheo.fetch(S, G, FetchOptions::new().limit(10).consumer("next")).await.expect("fetch");
    assert_eq!(others.len(), 5);
}

async fn spawn_checks_the_group_exists(f: Fixture) {
    f.rheo.create_stream(S, StreamOptions::new()).await.expect("stream");
    let err = f
        .rheo
        .consumer(S, "nobody")
        .spawn(handler_fn(|_lease| async { Outcome::Ack }))
        .await
        .expect_err("no such group");
    assert!(err.to_string().contains("nobody"), "{err}");
    let err = f.rheo.consumer(S, G).concurrency(0).spawn(handler_fn(|_l| async { Outcome::Ack })).await;
    assert!(matches!(err, Err(rheo::Error::InvalidArgument { argument: "concurrency", .. })));
}

/// The consumer and the lease stream check their fetch settings alike: a
/// poll of zero (a busy loop) or a lease renewals can't keep is refused by
/// both, with the setting's name.
async fn consumer_and_lease_stream_refuse_the_same_settings(f: Fixture) {
    setup(&f, 1, GroupOptions::new()).await;
    let ms = Duration::from_millis;
    let bad: [(&str, LeaseStreamOptions); 4] = [
        ("poll", LeaseStreamOptions::new().poll(Duration::ZERO)),
        ("poll", LeaseStreamOptions::new().poll(Duration::from_secs(86_401))),
        ("lease", LeaseStreamOptions::new().lease(ms(60))),
        ("max_demand", LeaseStreamOptions::new().max_demand(0)),
    ];
    for (name, opts) in bad {
        let err = f.rheo.lease_stream(S, G, opts.clone()).expect_err(name);
        assert!(matches!(err, rheo::Error::InvalidArgument { argument, .. } if argument == name), "{name}: {err}");
        let consumer = f.rheo.consumer(S, G).poll(opts.poll).lease(opts.lease).max_demand(opts.max_demand);
        let err = consumer.spawn(handler_fn(|_l| async { Outcome::Ack })).await.expect_err(name);
        assert!(matches!(err, rheo::Error::InvalidArgument { argument, .. } if argument == name), "{name}: {err}");
    }
    assert!(f.rheo.lease_stream(S, G, LeaseStreamOptions::new().lease(ms(100))).is_ok(), "twice the floor is enough");
}

/// A handler whose setup fails stops the spawn.
struct FailingSetup(AtomicBool);

#[async_trait]
impl rheo::Handler for FailingSetup {
    async fn handle(&self, _lease: &Lease) -> Outcome {
        self.0.store(true, Ordering::SeqCst);
        Outcome::Ack
    }
    async fn setup(&self) -> Result<()> {
        Err(rheo::Error::failed("setup", "no database"))
    }
}

async fn a_failing_setup_stops_the_spawn(f: Fixture) {
    setup(&f, 1, GroupOptions::new()).await;
    let err = f.rheo.consumer(S, G).spawn(FailingSetup(AtomicBool::new(false))).await.expect_err("setup fails");
    assert!(err.to_string().contains("no database"), "{err}");
    assert_eq!(f.rheo.lag(S, G).await.expect("lag").total, 1);
}

/// An idle consumer handles a new event at once, woken by the append, not
/// at its next poll (a minute away here). Real time: the point is a wakeup.
async fn an_idle_consumer_is_woken_by_an_append(f: Fixture) {
    setup(&f, 0, GroupOptions::new()).await;
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let handle = f
        .rheo
        .consumer(S, G)
        .poll(Duration::from_secs(60))
        .spawn(handler_fn(move |_lease| {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    // Let it find the stream empty and go idle.
    tokio::time::sleep(Duration::from_millis(100)).await;
    append(&f.rheo, 1).await;
    let woken =
        tokio::time::timeout(Duration::from_secs(20), until("the handler", || handled.load(Ordering::SeqCst) == 1));
    woken.await.expect("handled long before the 60 s poll: woken by the append");
    until_settled(&handle, 1).await;
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(summary.acked, 1);
}

/// Scheduled events: the consumer hands out the due event behind more
/// scheduled ones than a fetch sets aside (1,024) without
/// waiting for its poll (a minute away: a fetch that set events aside and
/// claimed nothing is followed by another at once), and hands out each
/// scheduled event only once the clock reaches its time. Real time: the
/// point is that no idle wait happens.
async fn a_consumer_passes_scheduled_events_at_once_and_handles_them_at_their_time(f: Fixture) {
    const AHEAD: u64 = 2_000;
    setup(&f, 0, GroupOptions::new()).await;
    if !f.rheo.capabilities().scheduled_delivery {
        return;
    }
    let later = f.clock.now().saturating_add(Duration::from_secs(60));
    let mut done = 0;
    while done < AHEAD {
        let batch: Vec<_> = (done..(done + 1000).min(AHEAD))
            .map(|n| (serde_json::json!({"n": n}), AppendOptions::new().partition(0).deliver_at(later)))
            .collect();
        done += batch.len() as u64;
        f.rheo.append_batch_with(S, batch).await.expect("append");
    }
    f.rheo.append(S, &serde_json::json!({"due": true}), AppendOptions::new().partition(0)).await.expect("append");
    // (sequence, the clock when handled, the event's time)
    let handled = Arc::new(Mutex::new(Vec::new()));
    let (h, clock) = (handled.clone(), f.clock.clone());
    let handle = f
        .rheo
        .consumer(S, G)
        .poll(Duration::from_secs(60))
        .spawn(handler_fn(move |lease| {
            let (h, clock) = (h.clone(), clock.clone());
            async move {
                h.lock().push((lease.event.sequence(), clock.now(), lease.event.deliver_at()));
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    let due = tokio::time::timeout(Duration::from_secs(20), until("the due event", || handled.lock().len() == 1));
    due.await.expect("handled long before the 60 s poll: no idle wait after a fetch that set events aside");
    assert_eq!(handled.lock()[0].0, AHEAD + 1);
    f.clock.advance(Duration::from_secs(60));
    let total = usize::try_from(AHEAD + 1).expect("count");
    // The next poll (a minute away) or an append wakes it: append one more.
    append(&f.rheo, 1).await;
    until("every scheduled event", || handled.lock().len() == total + 1).await;
    let handled = handled.lock().clone();
    assert!(handled.iter().all(|(_, at, time)| time.is_none_or(|t| *at >= t)), "one handled before its time");
    until_settled(&handle, u64::try_from(total + 1).expect("count")).await;
    handle.shutdown().await.expect("shutdown");
}

/// A keyed group under a managed consumer with 4 workers: handlers run
/// concurrently across keys (4 at once are seen), never two of one key at
/// once, and each key's events are handled in order. Skipped where the
/// backend does not order by key.
async fn a_keyed_group_runs_keys_concurrently_and_each_key_in_order(f: Fixture) {
    if !f.rheo.capabilities().ordered_by_key {
        return;
    }
    f.rheo.create_stream(S, StreamOptions::new().partitions(1)).await.expect("stream");
    f.rheo.create_group(S, G, GroupOptions::new().ordered_by_key()).await.expect("group");
    const KEYS: usize = 4;
    const PER_KEY: usize = 10;
    for n in 0..KEYS * PER_KEY {
        let opts = AppendOptions::new().partition(0).key(format!("k{}", n % KEYS));
        f.rheo.append(S, &serde_json::json!({"n": n}), opts).await.expect("append");
    }
    let gauge = Arc::new(Gauge::default());
    let handled: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    let overlaps = Arc::new(AtomicUsize::new(0));
    let (g, h, b, o) = (gauge.clone(), handled.clone(), busy.clone(), overlaps.clone());
    let handle = f
        .rheo
        .consumer(S, G)
        .concurrency(KEYS)
        .max_demand(KEYS * 2)
        .spawn(handler_fn(move |lease| {
            let (g, h, b, o) = (g.clone(), h.clone(), b.clone(), o.clone());
            async move {
                let key = lease.event.key().expect("a key").to_owned();
                if !b.lock().insert(key.clone()) {
                    // Counted, not asserted: a panic here would be a retry.
                    o.fetch_add(1, Ordering::SeqCst);
                }
                g.enter();
                tokio::time::sleep(Duration::from_millis(20)).await;
                g.exit();
                h.lock().push((key.clone(), lease.event.sequence()));
                b.lock().remove(&key);
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    until_consumed(&f.rheo).await;
    until_settled(&handle, (KEYS * PER_KEY) as u64).await;
    handle.shutdown().await.expect("shutdown");
    let handled = handled.lock().clone();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two events of one key handled at once");
    assert_eq!(handled.len(), KEYS * PER_KEY, "every event once");
    for k in 0..KEYS {
        let key = format!("k{k}");
        let seqs: Vec<u64> = handled.iter().filter(|(hk, _)| *hk == key).map(|(_, s)| *s).collect();
        let want: Vec<u64> = (0..PER_KEY).map(|i| (i * KEYS + k + 1) as u64).collect();
        assert_eq!(seqs, want, "{key} in order");
    }
    assert_eq!(gauge.max.load(Ordering::SeqCst), KEYS, "the keys ran concurrently");
}

macro_rules! cases {
    ($backend:ident, $factory:path) => {
        mod $backend {
            use super::*;
            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test(start_paused = true)]
                    async fn $name() {
                        super::$name($factory().await).await;
                    }
                };
            }
            case!(concurrency_is_never_exceeded);
            case!(max_demand_is_never_exceeded);
            case!(renewal_keeps_a_lease_past_its_first_expiry);
            // Real time: on paused time, Tokio would jump to the drain
            // deadline while a native commit waits on its writer thread.
            #[tokio::test]
            async fn shutdown_drains_in_flight_handlers() {
                super::shutdown_drains_in_flight_handlers($factory().await).await;
            }
            #[tokio::test]
            async fn an_idle_consumer_is_woken_by_an_append() {
                super::an_idle_consumer_is_woken_by_an_append($factory().await).await;
            }
            case!(drain_timeout_leaves_stuck_handlers_to_expiry);
            case!(a_panicking_handler_is_a_retry_with_the_reason);
            case!(a_lease_lost_to_another_consumer_is_dropped);
            case!(a_queued_lease_lost_to_another_consumer_is_counted_lost_at_shutdown);
            case!(a_definite_ack_failure_is_a_nack_and_an_ambiguous_one_is_left_to_expiry);
            case!(reject_dead_letters_and_retry_redelivers);
            case!(fetch_errors_back_off_doubling_and_reset_on_success);
            case!(settles_are_batched_into_ack_many);
            case!(lease_stream_bounds_outstanding_and_settles_through_the_item);
            case!(lease_stream_composes_with_buffer_unordered_and_ready_chunks);
            case!(stream_lease_settle_takes_an_outcome);
            case!(lease_stream_renews_held_leases);
            case!(lease_stream_retries_a_failed_renewal_soon);
            case!(lease_stream_retries_transient_errors_and_yields_definite_ones);
            case!(spawn_checks_the_group_exists);
            case!(consumer_and_lease_stream_refuse_the_same_settings);
            case!(lease_stream_renews_leases_it_has_not_yielded_yet);
            case!(lease_stream_keeps_two_batches_in_flight);
            case!(consumer_renews_its_leases_together);
            #[tokio::test]
            async fn shutdown_releases_leases_fetched_ahead() {
                super::shutdown_releases_leases_fetched_ahead($factory().await).await;
            }
            case!(a_failing_setup_stops_the_spawn);
            case!(a_keyed_group_runs_keys_concurrently_and_each_key_in_order);
            #[tokio::test]
            async fn a_consumer_passes_scheduled_events_at_once_and_handles_them_at_their_time() {
                super::a_consumer_passes_scheduled_events_at_once_and_handles_them_at_their_time($factory().await)
                    .await;
            }
        }
    };
}

cases!(memory, common::memory);
cases!(native_mem, common::native_mem);
