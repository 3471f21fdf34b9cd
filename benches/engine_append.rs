//! Append throughput of the native engine under each durability.
//!
//! `cargo bench --bench engine_append`. Data goes to `target/` (a real disk)
//! unless `RHEO_BENCH_DIR` says otherwise. Compare with the raw fsync rate
//! of the same disk: `cargo run --release -- bench --workload fsync --fsync-dir target`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rheo::engine::{Durability, EngineOptions};
use support::{append, engine, event};

fn opts(durability: Durability) -> EngineOptions {
    EngineOptions::default().durability(durability)
}

const DURABILITIES: [(&str, Durability); 3] = [
    ("sync", Durability::Sync),
    ("batched_5ms", Durability::Batched { max_delay: Duration::from_millis(5) }),
    ("none", Durability::None),
];

fn one_producer_one_event(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_append/one_event_per_call");
    g.throughput(Throughput::Elements(1));
    for (name, durability) in DURABILITIES {
        let (engine, log, _dir) = engine(opts(durability), 1);
        let events: Vec<_> = (0..1).map(event).collect();
        g.bench_function(name, |b| b.iter(|| append(&engine, &log, &events)));
    }
    g.finish();
}

fn batch_1000(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_append/batch_1000");
    g.throughput(Throughput::Elements(1000));
    for (name, durability) in [DURABILITIES[0], DURABILITIES[2]] {
        let (engine, log, _dir) = engine(opts(durability), 1);
        let events: Vec<_> = (0..1000).map(event).collect();
        g.bench_function(name, |b| b.iter(|| append(&engine, &log, &events)));
    }
    g.finish();
}

/// `producers` threads each append one event per call under Sync; the
/// commit thread batches their syncs. Reports p50/p99 commit latency on
/// stderr beside criterion's throughput.
fn concurrent_producers(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_append/concurrent_sync");
    for producers in [8u64, 64] {
        g.throughput(Throughput::Elements(producers * 200));
        let (engine, log, _dir) = engine(opts(Durability::Sync), 1);
        let engine = Arc::new(engine);
        let mut latencies = Vec::new();
        g.bench_with_input(BenchmarkId::from_parameter(producers), &producers, |b, &producers| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let handles: Vec<_> = (0..producers)
                        .map(|t| {
                            let (engine, log) = (engine.clone(), log.clone());
                            std::thread::spawn(move || {
                                let events = vec![event(t)];
                                let mut lat = Vec::with_capacity(200);
                                for _ in 0..200 {
                                    let s = Instant::now();
                                    append(&engine, &log, &events);
                                    lat.push(s.elapsed());
                                }
                                lat
                            })
                        })
                        .collect();
                    for h in handles {
                        latencies.extend(h.join().expect("producer"));
                    }
                    total += start.elapsed();
                }
                total
            });
        });
        latencies.sort();
        if !latencies.is_empty() {
            let pct = |per_mille: usize| latencies[(latencies.len() - 1) * per_mille / 1000];
            eprintln!("  {producers} producers: commit latency p50 {:?} p99 {:?}", pct(500), pct(990));
        }
    }
    g.finish();
}

/// `tasks` tokio tasks on a 2-worker runtime each append one event per call
/// under Sync and await the commit without blocking a thread.
fn concurrent_async_producers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut g = c.benchmark_group("engine_append/concurrent_async_sync");
    for tasks in [64u64, 1024] {
        let per_task = 50u64;
        g.throughput(Throughput::Elements(tasks * per_task));
        let (engine, log, _dir) = engine(opts(Durability::Sync), 1);
        let engine = Arc::new(engine);
        g.bench_with_input(BenchmarkId::from_parameter(tasks), &tasks, |b, &tasks| {
            b.to_async(&rt).iter(|| {
                let (engine, log) = (engine.clone(), log.clone());
                async move {
                    let handles: Vec<_> = (0..tasks)
                        .map(|t| {
                            let (engine, log) = (engine.clone(), log.clone());
                            tokio::spawn(async move {
                                let events = [event(t)];
                                for _ in 0..per_task {
                                    let routed: Vec<_> = events
                                        .iter()
                                        .map(|e| rheo::engine::log::stream::Routed { partition: 0, ts: 1, event: e })
                                        .collect();
                                    let (_, ticket) = engine.append(&log, &routed).expect("append");
                                    ticket.resolved().await.expect("durable");
                                }
                            })
                        })
                        .collect();
                    for h in handles {
                        h.await.expect("task");
                    }
                }
            });
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = one_producer_one_event, batch_1000, concurrent_producers, concurrent_async_producers
}
criterion_main!(benches);
