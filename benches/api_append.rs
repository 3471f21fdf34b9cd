//! Appends through the public API, as a user calls them: `Rheo` on
//! `native:` in a 2-worker Tokio runtime, 200-byte payloads serialized from
//! a struct, 4 partitions, each producer appending under its own key.
//!
//! `cargo bench --bench api_append`. Cases: 1, 64 and 1,024 async producers
//! appending one event per call under `durability=sync`; one producer under
//! `durability=none`; `append_batch` of 1,000 under `sync` and `none`.
//!
//! The group `api_vs_engine` runs the same workloads twice in one run:
//! through `Rheo::append` (serializing the struct, as a user calls it), and
//! at the engine level (`Engine::append` of events prepared once, routed by
//! hand, then the ticket awaited). The first's throughput divided by the
//! second's is the facade's overhead as a ratio (issue 34's target is
//! at least 0.8).
//! Compare the `sync` figures with the raw fsync rate of the same disk
//! (`cargo run --release -- bench --workload fsync --fsync-dir target`).

#![allow(missing_docs)] // criterion_group! generates undocumented functions

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rheo::{AppendOptions, Rheo, StreamOptions};
use serde::Serialize;

/// The payload: about 200 bytes once encoded.
#[derive(Serialize)]
struct Order<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    order: u64,
    customer: &'a str,
    currency: &'a str,
    total: u64,
    note: &'a str,
}

const NOTE: &str = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

fn order(n: u64) -> Order<'static> {
    Order { kind: "order_placed", order: n, customer: "customer-0042", currency: "EUR", total: 12_345, note: NOTE }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// A fresh `native:` store with the stream "s" (4 partitions).
fn open(rt: &tokio::runtime::Runtime, durability: &str) -> (Arc<Rheo>, tempfile::TempDir) {
    let dir = tempfile::tempdir_in(support::bench_dir()).expect("temporary directory");
    let url = format!("native:{}?durability={durability}", dir.path().display());
    let rheo = rt.block_on(async {
        let rheo = Rheo::open(&url).await.expect("open");
        rheo.create_stream("s", StreamOptions::new().partitions(4)).await.expect("stream");
        rheo
    });
    (Arc::new(rheo), dir)
}

/// `producers` tasks each appending `per_producer` events one per call;
/// the time from the first append to the last one's return.
fn single_appends(rt: &tokio::runtime::Runtime, rheo: &Arc<Rheo>, producers: u64, per_producer: u64) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..producers)
            .map(|p| {
                let rheo = rheo.clone();
                tokio::spawn(async move {
                    let key = format!("producer-{p}");
                    for i in 0..per_producer {
                        let opts = AppendOptions::new().key(key.as_str());
                        rheo.append("s", &order(p * per_producer + i), opts).await.expect("append");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("producer");
        }
        start.elapsed()
    })
}

fn appends(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("api_append");
    for (name, durability, producers, per_producer) in [
        ("sync_1_producer", "sync", 1u64, 2_000u64),
        ("sync_64_producers", "sync", 64, 500),
        ("sync_1024_producers", "sync", 1024, 100),
        ("none_1_producer", "none", 1, 100_000),
    ] {
        let (rheo, _dir) = open(&rt, durability);
        g.throughput(Throughput::Elements(producers * per_producer));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| single_appends(&rt, &rheo, producers, per_producer)).sum())
        });
    }
    for durability in ["sync", "none"] {
        let (rheo, _dir) = open(&rt, durability);
        const BATCHES: u64 = 50;
        g.throughput(Throughput::Elements(BATCHES * 1000));
        g.bench_function(format!("{durability}_batch_1000"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    for k in 0..BATCHES {
                        let batch: Vec<_> = (0..1000).map(|i| order(k * 1000 + i)).collect();
                        rheo.append_batch("s", batch).await.expect("append");
                    }
                })
            })
        });
    }
    g.finish();
}

/// `producers` tasks each appending `per_producer` events one per call at
/// the engine level: events prepared once per task (one per partition key),
/// routed to the partition the facade would pick, the ticket awaited.
fn engine_appends(
    rt: &tokio::runtime::Runtime,
    engine: &Arc<rheo::engine::Engine>,
    producers: u64,
    per_producer: u64,
) -> Duration {
    rt.block_on(async {
        let stream = engine.stream("s").expect("stream");
        let start = Instant::now();
        let tasks: Vec<_> = (0..producers)
            .map(|p| {
                let (engine, stream) = (engine.clone(), stream.clone());
                tokio::spawn(async move {
                    let key = format!("producer-{p}");
                    let payload = rheo::Payload::encode(&order(p)).expect("payload");
                    let event = rheo::NewEvent::prepare(payload, AppendOptions::new().key(key.as_str()));
                    let partition = (p % 4) as u32;
                    for _ in 0..per_producer {
                        let routed = [rheo::engine::log::stream::Routed { partition, ts: 1, event: &event }];
                        let (_, ticket) = engine.append(&stream, &routed).expect("append");
                        ticket.resolved().await.expect("durable");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("producer");
        }
        start.elapsed()
    })
}

fn api_vs_engine(c: &mut Criterion) {
    use rheo::engine::{Durability, Engine, EngineOptions};
    let rt = runtime();
    let mut g = c.benchmark_group("api_vs_engine");
    for (name, durability, producers, per_producer) in
        [("sync_1024_producers", "sync", 1024u64, 100u64), ("none_1_producer", "none", 1, 100_000)]
    {
        g.throughput(Throughput::Elements(producers * per_producer));
        let (rheo, _dir) = open(&rt, durability);
        g.bench_function(format!("facade/{name}"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| single_appends(&rt, &rheo, producers, per_producer)).sum())
        });
        drop(rheo);
        let dir = tempfile::tempdir_in(support::bench_dir()).expect("temporary directory");
        let mode = if durability == "sync" { Durability::Sync } else { Durability::None };
        let engine = Arc::new(Engine::open_dir(dir.path(), EngineOptions::default().durability(mode)).expect("open"));
        engine.create_stream("s", 4, &[], 0).expect("stream");
        g.bench_function(format!("engine/{name}"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| engine_appends(&rt, &engine, producers, per_producer)).sum())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = appends, api_vs_engine
}
criterion_main!(benches);
