//! Idempotent appends beyond the conformance suite: the native dedupe
//! window across a restart and past its duration, and a producer that
//! retries every append after injected `Ambiguous` failures ending with each
//! event exactly once (memory and native).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use proptest::prelude::*;
use rheo::backends::Backend;
use rheo::backends::Subscription;
use rheo::backends::memory::MemoryBackend;
use rheo::backends::native::EngineOptions;
use rheo::backends::native::NativeBackend;
use rheo::*;
use serde_json::json;

const S: &str = "orders";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

#[tokio::test]
async fn a_retry_after_the_writer_restarted_is_still_a_duplicate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("native:{}", dir.path().display());
    let first = {
        let rheo = Rheo::open(&url).await.expect("open");
        rheo.create_stream(S, StreamOptions::new().partitions(3)).await.expect("stream");
        for n in 0..50 {
            rheo.append(S, &json!({"n": n}), AppendOptions::new().key(format!("k{n}"))).await.expect("filler");
        }
        rheo.append(S, &json!({"n": "the one"}), AppendOptions::new().id("order-7").key("x")).await.expect("append")
    };
    // A new process (here: a new handle) retries: the window is refilled from the log.
    let rheo = Rheo::open(&url).await.expect("reopen");
    let again = rheo.append(S, &json!({"n": "retry"}), AppendOptions::new().id("order-7")).await.expect("retry");
    assert!(again.is_duplicate());
    assert_eq!((again.partition(), again.sequence()), (first.partition(), first.sequence()));
    assert_eq!(again.payload().json().expect("json"), &json!({"n": "the one"}));
    let total: u64 = rheo.list_streams().await.expect("list")[0].high_watermarks.iter().sum();
    assert_eq!(total, 51);
}

#[tokio::test]
async fn the_native_window_forgets_an_id_after_its_duration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let url = format!("native:{}?dedupe_window_ms=60000", dir.path().display());
    let rheo = Rheo::builder().clock(Arc::new(clock.clone())).open(&url).await.expect("open");
    rheo.create_stream(S, StreamOptions::new()).await.expect("stream");
    let opts = || AppendOptions::new().id("late");
    rheo.append(S, &json!({"n": 1}), opts()).await.expect("append");
    clock.advance(Duration::from_secs(50));
    assert!(rheo.append(S, &json!({"n": 2}), opts()).await.expect("within").is_duplicate());
    clock.advance(Duration::from_secs(12));
    let late = rheo.append(S, &json!({"n": 3}), opts()).await.expect("after");
    assert!(!late.is_duplicate(), "62 s after it was appended, a 60 s window has forgotten the id");
    assert_eq!(late.sequence(), 2);
    // Off: every append writes.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let off = Rheo::open(&format!("native:{}?dedupe_window_ms=0", dir2.path().display())).await.expect("open");
    off.create_stream(S, StreamOptions::new()).await.expect("stream");
    off.append(S, &json!({}), opts()).await.expect("append");
    assert_eq!(off.append(S, &json!({}), opts()).await.expect("append").sequence(), 2);
}

/// A backend that fails appends with `Ambiguous`, before (nothing written)
/// or after (written) the real append, on a schedule.
#[derive(Debug)]
struct Flaky {
    inner: Arc<dyn Backend>,
    /// One entry per append call: 0 = pass, 1 = fail before, 2 = fail after.
    plan: Vec<u8>,
    calls: AtomicU64,
}

impl Flaky {
    fn next(&self) -> u8 {
        let n = usize::try_from(self.calls.fetch_add(1, Ordering::Relaxed)).unwrap_or(0);
        self.plan.get(n % self.plan.len().max(1)).copied().unwrap_or(0)
    }
}

fn ambiguous() -> Error {
    Error::ambiguous("append", "injected: the connection dropped")
}

#[async_trait]
impl Backend for Flaky {
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
    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        self.inner.create_stream(stream, opts).await
    }
    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> Result<GroupSummary> {
        self.inner.create_group(stream, group, opts).await
    }
    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
        match self.next() {
            1 => Err(ambiguous()),
            2 => {
                self.inner.append_batch(stream, events).await?;
                Err(ambiguous())
            }
            _ => self.inner.append_batch(stream, events).await,
        }
    }
    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.inner.read(stream, partition, after, limit).await
    }
    async fn query(&self, query: &Query) -> Result<Page> {
        self.inner.query(query).await
    }
    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<FetchReport> {
        self.inner.fetch(stream, group, opts).await
    }
    async fn renew(&self, lease: &LeaseRef, d: Duration) -> Result<Timestamp> {
        self.inner.renew(lease, d).await
    }
    async fn ack(&self, lease: &LeaseRef) -> Result<()> {
        self.inner.ack(lease).await
    }
    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> Result<RetryOutcome> {
        self.inner.retry(lease, reason, delay).await
    }
    async fn reject(&self, lease: &LeaseRef, reason: &str) -> Result<()> {
        self.inner.reject(lease, reason).await
    }
    async fn replay(&self, stream: &str, group: &str, replay: &Replay) -> Result<u64> {
        self.inner.replay(stream, group, replay).await
    }
    async fn reset_group(&self, stream: &str, group: &str, reset: &Reset) -> Result<()> {
        self.inner.reset_group(stream, group, reset).await
    }
    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag> {
        self.inner.lag(stream, group, partitions).await
    }
    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        self.inner.list_streams().await
    }
    async fn subscribe(&self, stream: &str) -> Result<Subscription> {
        self.inner.subscribe(stream).await
    }
}

/// Appends `events` (each with its id, in batches of `batch`) through a
/// flaky backend, retrying each call until it succeeds; then checks each
/// id is in the stream exactly once, and that every answer names it.
async fn retrying_producer(url: &str, plan: Vec<u8>, events: usize, batch: usize) {
    let inner: Arc<dyn Backend> = match url.strip_prefix("native:") {
        Some(path) => {
            Arc::new(NativeBackend::open(path, EngineOptions::default(), Arc::new(SystemClock)).await.expect("open"))
        }
        None => Arc::new(MemoryBackend::new()),
    };
    let flaky = Arc::new(Flaky { inner, plan, calls: AtomicU64::new(0) });
    let rheo = Rheo::builder().with_backend(flaky).expect("rheo");
    rheo.create_stream(S, StreamOptions::new().partitions(3)).await.expect("stream");
    let ids: Vec<String> = (0..events).map(|n| format!("ev-{n}")).collect();
    for chunk in ids.chunks(batch.max(1)) {
        let items: Vec<_> =
            chunk.iter().map(|id| (json!({"id": id}), AppendOptions::new().id(id.clone()).key(id.clone()))).collect();
        let mut attempts = 0;
        let answered = loop {
            match rheo.append_batch_with(S, items.clone()).await {
                Ok(out) => break out,
                Err(e) if e.is_transient() && attempts < 50 => attempts += 1,
                Err(e) => panic!("append failed for good: {e}"),
            }
        };
        let got: Vec<&str> = answered.iter().map(Event::id).collect();
        assert_eq!(got, chunk.iter().map(String::as_str).collect::<Vec<_>>(), "each answer is its own id");
    }
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    for p in 0..3 {
        for e in rheo.read(S, p, 0, 10_000).await.expect("read") {
            *seen.entry(e.id().to_owned()).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), events, "every event is there");
    assert!(seen.values().all(|&n| n == 1), "no event twice: {seen:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_producer_retrying_after_ambiguous_failures_stores_each_event_once(
        plan in proptest::collection::vec(0u8..3, 1..12),
        events in 1usize..60,
        batch in 1usize..8,
        native in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = if native { format!("native:{}", dir.path().display()) } else { "memory:".to_owned() };
        // Always pass eventually: a plan of only failures would never end.
        let mut plan = plan;
        plan.push(0);
        runtime().block_on(retrying_producer(&url, plan, events, batch));
    }
}
