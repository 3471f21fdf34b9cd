//! The facade combines concurrent calls for a backend that asks for it
//! (`Backend::combines_calls`): single acks into `ack_many` calls (a
//! consumer that acks one lease at a time from many tasks still settles in
//! batches), and fetches of one group with the same consumer, lease and
//! partitions into one claim; each caller gets its own answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rheo::backends::Backend;
use rheo::backends::Subscription;
use rheo::backends::memory::MemoryBackend;
use rheo::{
    Capabilities, Error, Event, FetchOptions, FetchReport, GroupOptions, GroupSummary, Lag, LeaseRef, NewEvent, Page,
    Position, Query, Replay, Reset, RetryOutcome, Rheo, StreamInfo, StreamOptions, Timestamp,
};
use serde_json::json;

/// The memory backend, counting settle calls, with a slow `ack_many` (as a
/// database's round trip would be) so that acks have time to queue.
#[derive(Debug)]
struct Counting {
    inner: MemoryBackend,
    ack_many_calls: AtomicUsize,
    ack_calls: AtomicUsize,
    fetch_calls: AtomicUsize,
}

#[async_trait]
impl Backend for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn combines_calls(&self) -> bool {
        true
    }
    async fn ping(&self) -> rheo::Result<()> {
        self.inner.ping().await
    }
    async fn ensure_schema(&self) -> rheo::Result<()> {
        self.inner.ensure_schema().await
    }
    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> rheo::Result<StreamInfo> {
        self.inner.create_stream(stream, opts).await
    }
    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> rheo::Result<GroupSummary> {
        self.inner.create_group(stream, group, opts).await
    }
    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> rheo::Result<Vec<Position>> {
        self.inner.append_batch(stream, events).await
    }
    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> rheo::Result<Vec<Event>> {
        self.inner.read(stream, partition, after, limit).await
    }
    async fn query(&self, query: &Query) -> rheo::Result<Page> {
        self.inner.query(query).await
    }
    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> rheo::Result<FetchReport> {
        self.fetch_calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(3)).await;
        self.inner.fetch(stream, group, opts).await
    }
    async fn renew(&self, lease: &LeaseRef, d: Duration) -> rheo::Result<Timestamp> {
        self.inner.renew(lease, d).await
    }
    async fn ack(&self, lease: &LeaseRef) -> rheo::Result<()> {
        self.ack_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.ack(lease).await
    }
    async fn ack_many(&self, leases: &[LeaseRef]) -> rheo::Result<Vec<rheo::Result<()>>> {
        self.ack_many_calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(3)).await;
        self.inner.ack_many(leases).await
    }
    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> rheo::Result<RetryOutcome> {
        self.inner.retry(lease, reason, delay).await
    }
    async fn reject(&self, lease: &LeaseRef, reason: &str) -> rheo::Result<()> {
        self.inner.reject(lease, reason).await
    }
    async fn replay(&self, stream: &str, group: &str, replay: &Replay) -> rheo::Result<u64> {
        self.inner.replay(stream, group, replay).await
    }
    async fn reset_group(&self, stream: &str, group: &str, reset: &Reset) -> rheo::Result<()> {
        self.inner.reset_group(stream, group, reset).await
    }
    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> rheo::Result<Lag> {
        self.inner.lag(stream, group, partitions).await
    }
    async fn subscribe(&self, stream: &str) -> rheo::Result<Subscription> {
        self.inner.subscribe(stream).await
    }
}

fn counting() -> Arc<Counting> {
    Arc::new(Counting {
        inner: MemoryBackend::new(),
        ack_many_calls: AtomicUsize::new(0),
        ack_calls: AtomicUsize::new(0),
        fetch_calls: AtomicUsize::new(0),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_acks_become_few_ack_many_calls_each_with_its_own_answer() {
    let backend = counting();
    let rheo = Rheo::builder().with_backend(backend.clone()).expect("handle");
    rheo.create_stream("s", StreamOptions::new().partitions(2)).await.expect("stream");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    let events: Vec<serde_json::Value> = (0..300).map(|n| json!({"n": n})).collect();
    rheo.append_batch("s", &events).await.expect("append");
    let leases = rheo.fetch("s", "g", FetchOptions::new().limit(300)).await.expect("fetch");
    assert_eq!(leases.len(), 300);
    // One lease is acked before: its second ack must fail alone.
    let stale = leases[7].to_ref();
    rheo.ack(&stale).await.expect("first ack");
    let before = backend.ack_many_calls.load(Ordering::SeqCst);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, lease) in leases.iter().enumerate() {
        let (rheo, lease) = (rheo.clone(), lease.to_ref());
        tasks.spawn(async move { (i, rheo.ack(&lease).await) });
    }
    let mut ok = 0;
    while let Some(joined) = tasks.join_next().await {
        let (i, r) = joined.expect("task");
        if i == 7 {
            assert!(matches!(r, Err(Error::StaleLease { sequence, .. }) if sequence == stale.sequence), "{r:?}");
        } else {
            r.expect("ack");
            ok += 1;
        }
    }
    assert_eq!(ok, 299);
    let calls = backend.ack_many_calls.load(Ordering::SeqCst) - before;
    assert!(calls <= 60, "300 concurrent acks took {calls} ack_many calls: they were not combined");
    assert_eq!(backend.ack_calls.load(Ordering::SeqCst), 0, "single acks go through ack_many");
    assert_eq!(rheo.lag("s", "g").await.expect("lag").total, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fetches_of_a_group_share_claims_and_each_gets_its_share() {
    let backend = counting();
    let rheo = Rheo::builder().consumer_id("c1").with_backend(backend.clone()).expect("handle");
    rheo.create_stream("s", StreamOptions::new().partitions(3)).await.expect("stream");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    let events: Vec<serde_json::Value> = (0..300).map(|n| json!({"n": n})).collect();
    rheo.append_batch("s", &events).await.expect("append");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16usize {
        let rheo = rheo.clone();
        // Two shapes: 12 fetches as the handle's consumer, 4 as another one.
        let opts = if i % 4 == 3 { FetchOptions::new().consumer("c2") } else { FetchOptions::new() };
        tasks.spawn(async move { (i, rheo.fetch("s", "g", opts.limit(5 + i % 3)).await) });
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut total = 0;
    while let Some(joined) = tasks.join_next().await {
        let (i, r) = joined.expect("task");
        let leases = r.expect("fetch");
        assert_eq!(leases.len(), 5 + i % 3, "fetch {i} gets exactly its limit (300 are due)");
        let want = if i % 4 == 3 { "c2" } else { "c1" };
        assert!(leases.iter().all(|l| &*l.consumer_id == want), "fetch {i}: leases of {want}");
        assert!(
            leases.windows(2).all(|w| (w[0].partition(), w[0].sequence()) < (w[1].partition(), w[1].sequence())),
            "fetch {i}: in (partition, sequence) order"
        );
        for l in &leases {
            assert!(seen.insert((l.partition(), l.sequence())), "a position went to two fetches");
        }
        total += leases.len();
    }
    assert_eq!(total, (0..16usize).map(|i| 5 + i % 3).sum::<usize>());
    let calls = backend.fetch_calls.load(Ordering::SeqCst);
    assert!(calls < 16, "16 concurrent fetches took {calls} backend fetches: none were combined");
    assert!(calls >= 2, "fetches of two consumers are never combined ({calls} calls)");
}
