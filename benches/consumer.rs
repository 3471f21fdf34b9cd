//! The consumer runtime end to end: events/s through `Rheo::consumer` with a no-op
//! handler, at concurrency 1 and 8, on memory and on native (Durability::Sync,
//! in a temporary directory under target/).
//!
//! Each sample appends a fresh batch to its own stream and group (outside the
//! timing), then times a consumer from spawn until every event is acked.
//!
//! `consumer/latency` measures append→handler latency on an idle stream, with
//! the backend's wakeups and with polling (the same backend behind
//! [`Polling`], which hides its `subscribe`): events are appended one at
//! a time, a few milliseconds apart, to a consumer at concurrency 1 and the
//! default 200 ms poll. Criterion reports the mean latency per run; the
//! percentiles over every event of every run are printed to stderr.
//!
//! Run: `cargo bench --bench consumer` (only the latency part:
//! `cargo bench --bench consumer -- latency`).

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use rheo::backends::Backend;
use rheo::backends::memory::MemoryBackend;
use rheo::backends::native::Durability;
use rheo::backends::native::EngineOptions;
use rheo::backends::native::NativeBackend;
use rheo::{
    AppendOptions, Capabilities, DeadLetter, DeadLetterOptions, Error, Event, FetchOptions, GroupInfo, GroupOptions,
    GroupSummary, IndexStatus, Lag, LeaseRef, NewEvent, Outcome, Page, Query, Result, RetryOutcome, Rheo, StreamInfo,
    StreamOptions, SystemClock, Timestamp, handler_fn,
};
use serde_json::json;
use tokio::runtime::Runtime;

/// Events per timed run.
const EVENTS: u64 = 10_000;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

async fn open(backend: &str, dir: &std::path::Path) -> Rheo {
    match backend {
        "memory" => Rheo::open("memory:").await.expect("memory"),
        _ => Rheo::open(&format!("native:{}?durability=sync", dir.display())).await.expect("native"),
    }
}

/// A fresh stream of `EVENTS` events and a group at its start.
async fn prepare(rheo: &Rheo, run: u64) -> String {
    let stream = format!("bench-{run}");
    rheo.create_stream(&stream, StreamOptions::new().partitions(4)).await.expect("stream");
    rheo.create_group(&stream, "g", GroupOptions::new()).await.expect("group");
    let mut n = 0;
    while n < EVENTS {
        let batch = (n..(n + 1_000).min(EVENTS)).map(|i| json!({"type": "tick", "n": i}));
        n += rheo.append_batch(&stream, batch).await.expect("append").len() as u64;
    }
    stream
}

/// Time from spawn until the handler has seen every event and all are settled.
async fn consume(rheo: &Rheo, stream: &str, concurrency: usize) -> Duration {
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    let started = Instant::now();
    let handle = rheo
        .consumer(stream, "g")
        .concurrency(concurrency)
        .max_demand(256)
        .poll(Duration::from_millis(1))
        .spawn(handler_fn(move |_lease| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::Relaxed);
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    while seen.load(Ordering::Relaxed) < EVENTS {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(summary.acked, EVENTS, "{summary:?}");
    started.elapsed()
}

fn end_to_end(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("consumer/end_to_end");
    g.throughput(Throughput::Elements(EVENTS));
    g.sample_size(10);
    std::fs::create_dir_all("target").expect("target dir");
    for backend in ["memory", "native_sync"] {
        let dir = tempfile::tempdir_in("target").expect("temporary directory");
        let rheo = rt.block_on(open(backend, dir.path()));
        let mut run = 0u64;
        for concurrency in [1usize, 8] {
            g.bench_with_input(
                BenchmarkId::new(backend, format!("concurrency_{concurrency}")),
                &concurrency,
                |b, &c| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            run += 1;
                            let stream = rt.block_on(prepare(&rheo, run));
                            total += rt.block_on(consume(&rheo, &stream, c));
                        }
                        total
                    })
                },
            );
        }
    }
    g.finish();
}

/// Events appended, one at a time, per latency run.
const LATENCY_EVENTS: usize = 200;
/// Pause after each append returns (tokio rounds it up to the next ms).
const APPEND_GAP: Duration = Duration::from_millis(2);
/// A run that has not seen every event handled by then is a failure.
const LATENCY_RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// Forwards every call to the inner backend except `subscribe`, left to
/// the trait's default (a subscription whose waits sleep: polling), and reports
/// `wakeups: false`.
#[derive(Debug)]
struct Polling(Arc<dyn Backend>);

#[async_trait]
impl Backend for Polling {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.0.capabilities();
        capabilities.wakeups = false;
        capabilities
    }
    async fn ping(&self) -> Result<()> {
        self.0.ping().await
    }
    async fn ensure_schema(&self) -> Result<()> {
        self.0.ensure_schema().await
    }
    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        self.0.create_stream(stream, opts).await
    }
    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> Result<GroupSummary> {
        self.0.create_group(stream, group, opts).await
    }
    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<rheo::Position>> {
        self.0.append_batch(stream, events).await
    }
    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.0.read(stream, partition, after, limit).await
    }
    async fn query(&self, query: &Query) -> Result<Page> {
        self.0.query(query).await
    }
    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<rheo::FetchReport> {
        self.0.fetch(stream, group, opts).await
    }
    async fn renew(&self, lease: &LeaseRef, lease_duration: Duration) -> Result<Timestamp> {
        self.0.renew(lease, lease_duration).await
    }
    async fn ack(&self, lease: &LeaseRef) -> Result<()> {
        self.0.ack(lease).await
    }
    async fn ack_many(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        self.0.ack_many(leases).await
    }
    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> Result<RetryOutcome> {
        self.0.retry(lease, reason, delay).await
    }
    async fn reject(&self, lease: &LeaseRef, reason: &str) -> Result<()> {
        self.0.reject(lease, reason).await
    }
    async fn replay(&self, stream: &str, group: &str, opts: &rheo::Replay) -> Result<u64> {
        self.0.replay(stream, group, opts).await
    }
    async fn reset_group(&self, stream: &str, group: &str, opts: &rheo::Reset) -> Result<()> {
        self.0.reset_group(stream, group, opts).await
    }
    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag> {
        self.0.lag(stream, group, partitions).await
    }
    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        self.0.list_streams().await
    }
    async fn list_groups(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        self.0.list_groups(stream).await
    }
    async fn dead_letters(&self, stream: &str, group: &str, opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        self.0.dead_letters(stream, group, opts).await
    }
    async fn group_info(&self, stream: &str, group: &str) -> Result<GroupInfo> {
        self.0.group_info(stream, group).await
    }
    async fn create_index(&self, stream: &str, field: &str) -> Result<()> {
        self.0.create_index(stream, field).await
    }
    async fn index_status(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        self.0.index_status(stream).await
    }
    fn unsupported(&self, operation: &'static str) -> Error {
        self.0.unsupported(operation)
    }
}

/// A `Rheo` on `backend` ("memory" or "native_sync" in `dir`), with its own
/// wakeups or, when `polling`, behind [`Polling`].
async fn open_for_latency(backend: &str, dir: &std::path::Path, polling: bool) -> Rheo {
    let inner: Arc<dyn Backend> = match backend {
        "memory" => Arc::new(MemoryBackend::new()),
        _ => {
            let opts = EngineOptions::default().durability(Durability::Sync);
            let path = dir.to_str().expect("utf-8 bench directory");
            Arc::new(NativeBackend::open(path, opts, Arc::new(SystemClock)).await.expect("native"))
        }
    };
    let wrapped: Arc<dyn Backend> = if polling { Arc::new(Polling(inner)) } else { inner };
    wrapped.ensure_schema().await.expect("schema");
    let rheo = Rheo::builder().with_backend(wrapped).expect("rheo");
    assert_eq!(rheo.capabilities().wakeups, !polling, "{backend}: wakeups as configured");
    rheo
}

/// When each event's append started and returned, and when its handler
/// first started.
struct Timings {
    append_started: Vec<Instant>,
    append_returned: Vec<Instant>,
    handled: Vec<OnceLock<Instant>>,
}

/// One run: a fresh stream and a running idle group, then `LATENCY_EVENTS`
/// appends `APPEND_GAP` apart.
async fn latency_run(rheo: &Rheo, run: u64) -> Timings {
    let stream = format!("latency-{run}");
    rheo.create_stream(&stream, StreamOptions::new()).await.expect("stream");
    rheo.create_group(&stream, "g", GroupOptions::new()).await.expect("group");
    let handled: Arc<Vec<OnceLock<Instant>>> = Arc::new((0..LATENCY_EVENTS).map(|_| OnceLock::new()).collect());
    let h = handled.clone();
    let handle = rheo
        .consumer(&stream, "g")
        .concurrency(1)
        .spawn(handler_fn(move |lease| {
            let now = Instant::now();
            let n = lease.event.payload().json().expect("json")["n"]
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .expect("n");
            // A redelivery keeps the first start.
            let _ = h[n].set(now);
            async { Outcome::Ack }
        }))
        .await
        .expect("spawn");
    // Let the group find the stream empty and go idle.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut append_started = Vec::with_capacity(LATENCY_EVENTS);
    let mut append_returned = Vec::with_capacity(LATENCY_EVENTS);
    for n in 0..LATENCY_EVENTS {
        append_started.push(Instant::now());
        rheo.append(&stream, &json!({"type": "tick", "n": n}), AppendOptions::new()).await.expect("append");
        append_returned.push(Instant::now());
        tokio::time::sleep(APPEND_GAP).await;
    }
    let deadline = Instant::now() + LATENCY_RUN_TIMEOUT;
    while handled.iter().any(|t| t.get().is_none()) {
        assert!(Instant::now() < deadline, "{stream}: not every event handled within {LATENCY_RUN_TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!(summary.acked, LATENCY_EVENTS as u64, "{summary:?}");
    let handled = Arc::try_unwrap(handled).expect("handler dropped with the group");
    Timings { append_started, append_returned, handled }
}

/// Handler start minus `from` per event; zero when the handler started
/// first (counted as `early`).
fn latencies(from: &[Instant], handled: &[OnceLock<Instant>], early: &mut usize) -> Vec<Duration> {
    let pairs = from.iter().zip(handled);
    pairs
        .map(|(from, handled)| {
            let handled = *handled.get().expect("handled");
            if handled < *from {
                *early += 1;
            }
            handled.saturating_duration_since(*from)
        })
        .collect()
}

/// The `percent` percentile (nearest rank) of sorted, non-empty `d`.
fn percentile(d: &[Duration], percent: usize) -> Duration {
    let rank = (percent * d.len()).div_ceil(100);
    d[rank.clamp(1, d.len()) - 1]
}

fn summary(d: &mut [Duration]) -> String {
    d.sort_unstable();
    let max = d.last().copied().unwrap_or_default();
    format!("p50 {:.2?}, p99 {:.2?}, max {:.2?}", percentile(d, 50), percentile(d, 99), max)
}

fn latency(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("consumer/latency");
    // One iteration is a whole run (about a second of wall time): flat
    // sampling with the smallest targets gives exactly one warm-up run and
    // `sample_size` measured runs; criterion warns that it cannot fit them
    // in the target, which is intended.
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.warm_up_time(Duration::from_nanos(1));
    g.measurement_time(Duration::from_nanos(1));
    std::fs::create_dir_all("target").expect("target dir");
    for backend in ["memory", "native_sync"] {
        for (mode, polling) in [("wakeups", false), ("polling", true)] {
            let dir = tempfile::tempdir_in("target").expect("temporary directory");
            let rheo = rt.block_on(open_for_latency(backend, dir.path(), polling));
            let mut run = 0u64;
            let mut from_return = Vec::new();
            let mut from_start = Vec::new();
            let mut early = 0usize;
            g.bench_function(BenchmarkId::new(backend, mode), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        run += 1;
                        let t = rt.block_on(latency_run(&rheo, run));
                        let d = latencies(&t.append_returned, &t.handled, &mut early);
                        total += d.iter().sum::<Duration>() / u32::try_from(d.len()).expect("run size");
                        from_return.extend(d);
                        from_start.extend(latencies(&t.append_started, &t.handled, &mut 0));
                    }
                    total
                })
            });
            eprintln!(
                "consumer/latency/{backend}/{mode}: {} events over {run} runs (1 partition, concurrency 1, poll 200 ms, \
                 append every {APPEND_GAP:?}+)\n  from append return: {} ({early} handled before append returned)\n  \
                 from append start:  {}",
                from_return.len(),
                summary(&mut from_return),
                summary(&mut from_start),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, end_to_end, latency);
criterion_main!(benches);
