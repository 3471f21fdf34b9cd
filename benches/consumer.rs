//! The consumer runtime end to end: events/s through a `Group` with a no-op
//! handler, at concurrency 1 and 8, on memory and on native (Durability::Sync,
//! in a temporary directory under target/).
//!
//! Each sample appends a fresh batch to its own stream and group (outside the
//! timing), then times a `Group` from spawn until every event is acked.
//!
//! Run: `cargo bench --bench consumer`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rheo::{Durability, EngineOptions, Group, GroupOptions, Outcome, Rheo, StreamOptions, handler_fn};
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
        _ => Rheo::builder()
            .engine_options(EngineOptions { durability: Durability::Sync, ..EngineOptions::default() })
            .open(&format!("native:{}", dir.display()))
            .await
            .expect("native"),
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
    let handle = Group::builder(rheo, stream, "g")
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

criterion_group!(benches, end_to_end);
criterion_main!(benches);
