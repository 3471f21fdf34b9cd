//! The same workloads, through the public API, on `native:`, `sqlite:` and
//! `postgres://` in one run, so that their figures can be read side by side
//! (docs/benchmarks.md). Not criterion: each case is a fixed amount of work
//! timed once per round (events/s), a few rounds, the median reported.
//!
//! `cargo bench --bench sql_backends`. PostgreSQL is measured when
//! `RHEO_BENCH_POSTGRES_URL` (or `RHEO_POSTGRES_URL`) names a database; each
//! case gets a fresh schema. `RHEO_BENCH_ROUNDS` (default 3) and
//! `RHEO_BENCH_EVENTS` (default 20,000) size it; `RHEO_BENCH_ACKED` (default
//! 1,000,000; 0 skips) is how many acked deliveries the claim-latency case
//! puts in the table; `RHEO_BENCH_ONLY` (`native`, `sqlite`, `postgres`)
//! keeps one backend. 200-byte payloads, 4 partitions, a 2-worker runtime.
//! Compare durable figures with the raw fsync rate of the same disk
//! (`cargo run --release -- bench --workload fsync --fsync-dir target`).

#![allow(missing_docs)]

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rheo::{AppendOptions, FetchOptions, GroupOptions, Rheo, StreamOptions};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn payload(n: usize) -> serde_json::Value {
    json!({"type": "order_placed", "order": n, "customer": "customer-0042", "currency": "EUR",
           "total": 12_345, "note": "x".repeat(96)})
}

/// Options keying event `n` (so that events spread over the 4 partitions).
fn keyed(n: usize) -> AppendOptions {
    AppendOptions::new().key(format!("customer-{}", n % 64))
}

/// A backend under test: how to open a fresh, empty store.
struct Backend {
    name: &'static str,
    base: String,
}

impl Backend {
    /// A fresh store (and whatever keeps it alive).
    async fn open(&self) -> (Arc<Rheo>, Option<tempfile::TempDir>) {
        match self.name {
            "postgres" => {
                let schema = format!("bench_{}", uuid::Uuid::new_v4().simple());
                let sep = if self.base.contains('?') { '&' } else { '?' };
                let url = format!("{}{sep}rheo_schema={schema}&rheo_pool=16", self.base);
                (Arc::new(Rheo::open(&url).await.expect("open postgres")), None)
            }
            name => {
                let dir = tempfile::tempdir_in(support::bench_dir()).expect("temporary directory");
                let url = match name {
                    "sqlite" => format!("sqlite:{}?{}", dir.path().join("b.db").display(), self.base),
                    _ => format!("native:{}?{}", dir.path().display(), self.base),
                };
                (Arc::new(Rheo::open(&url).await.expect("open")), Some(dir))
            }
        }
    }
}

async fn stream_with_group(rheo: &Rheo) {
    rheo.create_stream("s", StreamOptions::new().partitions(4)).await.expect("stream");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
}

async fn fill(rheo: &Rheo, n: usize) {
    let mut i = 0;
    while i < n {
        let batch: Vec<_> = (i..(i + 1000).min(n)).map(|k| (payload(k), keyed(k))).collect();
        let n_batch = batch.len();
        rheo.append_batch_with("s", batch).await.expect("append");
        i += n_batch;
    }
}

/// `producers` tasks appending `per` batches of `batch` each.
async fn append_case(rheo: &Arc<Rheo>, producers: usize, per: usize, batch: usize) -> f64 {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..producers {
        let rheo = rheo.clone();
        tasks.push(tokio::spawn(async move {
            for b in 0..per {
                let items: Vec<_> = (0..batch).map(|i| (payload(i), keyed(p * 1_000_000 + b * batch + i))).collect();
                rheo.append_batch_with("s", items).await.expect("append");
            }
        }));
    }
    for t in tasks {
        t.await.expect("producer");
    }
    (producers * per * batch) as f64 / start.elapsed().as_secs_f64()
}

/// `consumers` tasks each looping fetch(100) + ack_many until `total` are acked.
async fn consume_case(rheo: &Arc<Rheo>, consumers: usize, total: usize) -> f64 {
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..consumers {
        let (rheo, acked) = (rheo.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let opts = FetchOptions::new().limit(100).consumer(format!("c{c}"));
            let (mut tf, mut ta, mut n) = (Duration::ZERO, Duration::ZERO, 0u32);
            while acked.load(std::sync::atomic::Ordering::Relaxed) < total {
                let t0 = Instant::now();
                let leases = rheo.fetch("s", "g", opts.clone()).await.expect("fetch");
                tf += t0.elapsed();
                n += 1;
                if leases.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let t1 = Instant::now();
                let results = rheo.ack_many(&leases).await.expect("ack_many");
                ta += t1.elapsed();
                let ok = results.iter().filter(|r| r.is_ok()).count();
                acked.fetch_add(ok, std::sync::atomic::Ordering::Relaxed);
            }
            // RHEO_BENCH_DEBUG=1: where a consumer's time went.
            if std::env::var("RHEO_BENCH_DEBUG").is_ok() {
                eprintln!("consumer {c}: {n} fetches, fetch avg {:?}, ack_many avg {:?}", tf / n.max(1), ta / n.max(1));
            }
        }));
    }
    for t in tasks {
        t.await.expect("consumer");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// One producer appending batches of 100 while 4 consumers drain them:
/// events/s from the first append to the last ack.
async fn end_to_end_case(rheo: &Arc<Rheo>, total: usize) -> f64 {
    let start = Instant::now();
    let producer = {
        let rheo = rheo.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while i < total {
                let items: Vec<_> = (i..(i + 100).min(total)).map(|k| (payload(k), keyed(k))).collect();
                let n_items = items.len();
                rheo.append_batch_with("s", items).await.expect("append");
                i += n_items;
            }
        })
    };
    let rate = consume_case(rheo, 4, total).await;
    producer.await.expect("producer");
    let _ = rate;
    total as f64 / start.elapsed().as_secs_f64()
}

/// Median latency of `n` fetch(100) + ack_many rounds, in ms.
async fn claim_latency(rheo: &Arc<Rheo>, n: usize) -> f64 {
    let mut lat = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let leases = rheo.fetch("s", "g", FetchOptions::new().limit(100)).await.expect("fetch");
        assert!(!leases.is_empty(), "events left to claim");
        rheo.ack_many(&leases).await.expect("ack");
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    lat[lat.len() / 2]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (cargo test's listing) does nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rounds = env_usize("RHEO_BENCH_ROUNDS", 3);
    let events = env_usize("RHEO_BENCH_EVENTS", 20_000);
    let acked_rows = env_usize("RHEO_BENCH_ACKED", 1_000_000);
    let only = std::env::var("RHEO_BENCH_ONLY").ok();
    let mut backends = vec![
        Backend { name: "native", base: "durability=sync".into() },
        Backend { name: "sqlite", base: "synchronous=full".into() },
    ];
    if let Some(url) = std::env::var("RHEO_BENCH_POSTGRES_URL").ok().or_else(|| std::env::var("RHEO_POSTGRES_URL").ok())
    {
        backends.push(Backend { name: "postgres", base: url });
    } else {
        println!("postgres: not measured (set RHEO_BENCH_POSTGRES_URL)");
    }
    backends.retain(|b| only.as_deref().is_none_or(|o| o == b.name));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    println!("rounds {rounds}, {events} events per case, 200-byte payloads, 4 partitions; median events/s");
    for b in &backends {
        let mut table: Vec<(String, f64)> = Vec::new();
        let cases: [(&str, usize); 6] = [
            ("append_batch(1000), 1 producer", 0),
            ("append_batch(1000), 64 producers", 1),
            ("fetch(100)+ack_many, 1 consumer", 2),
            ("fetch(100)+ack_many, 4 consumers", 3),
            ("end to end, 1 producer (batches of 100) + 4 consumers", 4),
            ("append_batch(100), 1 producer", 5),
        ];
        for (label, case) in cases {
            let mut figures = Vec::new();
            for _ in 0..rounds {
                let f = rt.block_on(async {
                    let (rheo, _guard) = b.open().await;
                    stream_with_group(&rheo).await;
                    match case {
                        0 => append_case(&rheo, 1, events / 1000, 1000).await,
                        1 => append_case(&rheo, 64, (events / 64_000).max(1), 1000).await,
                        2 | 3 => {
                            fill(&rheo, events).await;
                            consume_case(&rheo, if case == 2 { 1 } else { 4 }, events).await
                        }
                        4 => end_to_end_case(&rheo, events).await,
                        _ => append_case(&rheo, 1, events / 100, 100).await,
                    }
                });
                figures.push(f);
            }
            let m = median(figures.clone());
            println!(
                "{:>8} | {label:<55} | {m:>9.0} events/s  (rounds: {:?})",
                b.name,
                figures.iter().map(|f| f.round()).collect::<Vec<_>>()
            );
            table.push((label.to_owned(), m));
        }
        if acked_rows > 0 {
            let (empty, full) = rt.block_on(async {
                let (rheo, _guard) = b.open().await;
                stream_with_group(&rheo).await;
                fill(&rheo, 20_000).await;
                let empty = claim_latency(&rheo, 50).await;
                let (rheo2, _guard2) = b.open().await;
                stream_with_group(&rheo2).await;
                let t = Instant::now();
                fill(&rheo2, acked_rows + 20_000).await;
                consume_case(&rheo2, 4, acked_rows).await;
                println!("{:>8} | (put {acked_rows} acked deliveries in the table in {:?})", b.name, t.elapsed());
                let full = claim_latency(&rheo2, 50).await;
                (empty, full)
            });
            println!(
                "{:>8} | fetch(100)+ack_many latency p50: empty table {empty:.2} ms, {acked_rows} acked deliveries {full:.2} ms ({:.2}x)",
                b.name,
                full / empty
            );
        }
    }
}
