//! The memory backend's hot paths: append, and fetch(100) + ack_many.
//!
//! Run: `cargo bench --bench memory`. Figures go to docs/benchmarks.md.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rheo::{AppendOptions, FetchOptions, GroupOptions, Rheo, StreamOptions};
use serde_json::{Value, json};
use tokio::runtime::Runtime;

/// A payload of about 200 bytes as JSON.
fn payload(n: u64) -> Value {
    json!({"type": "order_placed", "order": n, "customer": "customer-0042", "currency": "EUR",
           "total": 12_345, "note": "x".repeat(96)})
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

async fn open(partitions: u32) -> Rheo {
    let rheo = Rheo::open("memory:").await.expect("open");
    rheo.create_stream("s", StreamOptions::new().partitions(partitions)).await.expect("stream");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    rheo
}

fn append(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("memory/append");
    g.throughput(Throughput::Elements(1));
    g.bench_function("one_event_per_call", |b| {
        let rheo = rt.block_on(open(4));
        let p = payload(1);
        b.to_async(&rt).iter(|| {
            let rheo = rheo.clone();
            let p = &p;
            async move { rheo.append("s", p, AppendOptions::new().key("k")).await.expect("append") }
        });
    });
    for batch in [100u64, 1000] {
        g.throughput(Throughput::Elements(batch));
        g.bench_with_input(BenchmarkId::new("append_batch", batch), &batch, |b, &batch| {
            let rheo = rt.block_on(open(4));
            let payloads: Vec<Value> = (0..batch).map(payload).collect();
            b.to_async(&rt).iter(|| {
                let rheo = rheo.clone();
                let payloads = payloads.clone();
                async move { rheo.append_batch("s", payloads).await.expect("batch") }
            });
        });
    }
    g.finish();
}

fn fetch_ack(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("memory/consume");
    g.throughput(Throughput::Elements(100));
    g.bench_function("fetch100_ack_many", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            // Fill outside the timed region, then time only the consumption.
            let rheo = open(4).await;
            let total = iters * 100;
            let mut left = total;
            while left > 0 {
                let n = left.min(10_000);
                rheo.append_batch("s", (0..n).map(payload)).await.expect("fill");
                left -= n;
            }
            let start = Instant::now();
            let mut done = 0;
            while done < total {
                let leases = rheo.fetch("s", "g", FetchOptions::new().limit(100)).await.expect("fetch");
                done += leases.len() as u64;
                for r in rheo.ack_many(&leases).await.expect("ack_many") {
                    r.expect("ack");
                }
            }
            start.elapsed()
        });
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = append, fetch_ack
}
criterion_main!(benches);
