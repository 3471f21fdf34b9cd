//! Per-operation latencies of the MongoDB backend through the public API
//! (docs/benchmarks.md): each operation timed alone, `RHEO_BENCH_ROUNDS`
//! times (default 50), p50 / p99 / max printed as a Markdown table.
//!
//! `RHEO_MONGO_URL=mongodb://… cargo bench --features mongo --bench
//! mongo_ops` (.ci/services.sh `start_mongo` starts a SecantusDB). Each run
//! works in a fresh database, dropped at the end. 200-byte payloads, 4
//! partitions. The wakeup row is the time from an append by one handle to
//! the wakeup of a waiter on another handle (the change stream).

#![allow(missing_docs)]

use std::time::{Duration, Instant};

use rheo::{AppendOptions, FetchOptions, GroupOptions, Query, Rheo, StreamOptions};
use serde_json::json;

fn payload(n: usize) -> serde_json::Value {
    json!({"type": "order_placed", "order": n, "customer": "customer-0042", "currency": "EUR",
           "total": 12_345, "note": "x".repeat(96)})
}

fn url_for(base: &str, db: &str) -> String {
    let (head, query) = base.split_once('?').unwrap_or((base, ""));
    let head = head.trim_end_matches('/');
    if query.is_empty() { format!("{head}/{db}") } else { format!("{head}/{db}?{query}") }
}

/// p50, p99 and max of `samples`, in milliseconds.
fn summary(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort_unstable();
    let at = |percent: usize| {
        let i = ((samples.len() - 1) * percent).div_ceil(100);
        samples[i].as_secs_f64() * 1000.0
    };
    (at(50), at(99), at(100))
}

struct Table(Vec<(String, (f64, f64, f64))>);

impl Table {
    fn row(&mut self, name: &str, mut samples: Vec<Duration>) {
        let s = summary(&mut samples);
        eprintln!("{name}: p50 {:.1} ms", s.0);
        self.0.push((name.to_owned(), s));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(base) = std::env::var("RHEO_MONGO_URL") else {
        eprintln!(
            "mongo_ops: set RHEO_MONGO_URL to a MongoDB-wire server (.ci/services.sh start_mongo); nothing measured"
        );
        return;
    };
    let rounds: usize = std::env::var("RHEO_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let db = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let url = url_for(&base, &db);
    let rheo = Rheo::open(&url).await.expect("open");
    let other = Rheo::open(&url).await.expect("open a second handle");
    rheo.create_stream("s", StreamOptions::new().partitions(4)).await.expect("stream");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    let mut t = Table(Vec::new());
    let time = |started: Instant| started.elapsed();

    let mut v = Vec::new();
    for i in 0..rounds {
        let at = Instant::now();
        rheo.append("s", &payload(i), AppendOptions::new().key(format!("c{i}"))).await.expect("append");
        v.push(time(at));
    }
    t.row("append (1 event)", v);

    let mut v = Vec::new();
    for r in 0..rounds.min(20) {
        let batch: Vec<_> = (0..100).map(|i| payload(r * 100 + i)).collect();
        let at = Instant::now();
        rheo.append_batch("s", &batch).await.expect("append_batch");
        v.push(time(at));
    }
    t.row("append_batch (100 events)", v);

    let (mut fetch, mut ack_many, mut renew, mut ack, mut retry) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let at = Instant::now();
        let leases = rheo.fetch("s", "g", FetchOptions::new().limit(12)).await.expect("fetch");
        fetch.push(time(at));
        assert_eq!(leases.len(), 12, "enough events appended");
        let at = Instant::now();
        rheo.renew(&leases[0], Duration::from_secs(30)).await.expect("renew");
        renew.push(time(at));
        let at = Instant::now();
        rheo.ack(&leases[0]).await.expect("ack");
        ack.push(time(at));
        let at = Instant::now();
        rheo.retry(&leases[1], "bench").await.expect("retry");
        retry.push(time(at));
        let at = Instant::now();
        let results = rheo.ack_many(&leases[2..12]).await.expect("ack_many");
        ack_many.push(time(at));
        assert!(results.iter().all(Result::is_ok));
    }
    t.row("fetch (limit 12)", fetch);
    t.row("renew", renew);
    t.row("ack", ack);
    t.row("retry", retry);
    t.row("ack_many (10 leases)", ack_many);

    let (mut lag, mut info, mut query, mut read) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds {
        let at = Instant::now();
        rheo.lag("s", "g").await.expect("lag");
        lag.push(time(at));
        let at = Instant::now();
        rheo.group_info("s", "g").await.expect("group_info");
        info.push(time(at));
        let at = Instant::now();
        let page = rheo.query(&Query::new("s").eq("order", i as u64).limit(10)).await.expect("query");
        query.push(time(at));
        assert!(!page.is_empty());
        let at = Instant::now();
        rheo.read("s", u32::try_from(i % 4).expect("partition"), 0, 100).await.expect("read");
        read.push(time(at));
    }
    t.row("lag", lag);
    t.row("group_info", info);
    t.row("query (payload eq, limit 10)", query);
    t.row("read (100 events)", read);

    let mut wake = Vec::new();
    let mut sub = other.subscribe("s").await.expect("subscribe");
    for i in 0..rounds.min(20) {
        // Drain what earlier appends left, then time one append to the wakeup.
        while sub.wait(Duration::from_millis(200)).await {}
        let at = Instant::now();
        rheo.append("s", &payload(i), AppendOptions::new()).await.expect("append");
        assert!(sub.wait(Duration::from_secs(10)).await, "woken by the change stream");
        wake.push(time(at));
    }
    t.row("wakeup on another handle (append → wait returns)", wake);

    println!("| operation (MongoDB backend, {rounds} rounds) | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|");
    for (name, (p50, p99, max)) in &t.0 {
        println!("| {name} | {p50:.1} | {p99:.1} | {max:.1} |");
    }
    drop((rheo, other));
    if let Ok(c) = mongodb::Client::with_uri_str(&base).await {
        let _ = c.database(&db).drop().await;
    }
}
