//! Appends through the public API, as a user calls them: `Rheo` on
//! `native:` in a 2-worker Tokio runtime, 200-byte payloads serialized from
//! a struct, 4 partitions, each producer appending under its own key.
//!
//! `cargo bench --bench api_append`. Cases: 1, 64 and 1,024 async producers
//! appending one event per call under `durability=sync`; one producer under
//! `durability=none`; `append_batch` of 1,000 under `sync` and `none`.
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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = appends
}
criterion_main!(benches);
