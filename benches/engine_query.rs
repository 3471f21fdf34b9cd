//! Queries through the secondary indexes, and building them.
//!
//! `cargo bench --bench engine_query`. One data set: 1M events of ~250 bytes
//! over 4 partitions, 16 MiB segments (so each partition has sealed
//! segments with index files and an active one indexed in memory),
//! `Durability::None`, declared indexes `customer` and `currency`.
//! `customer` takes 10,000 values (100 events each); `shard` takes the same
//! values but is not indexed (the scan baseline).

#![allow(missing_docs)] // criterion_group! generates undocumented functions

#[path = "support/mod.rs"]
mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rheo::engine::log::stream::Routed;
use rheo::engine::stream::Stream;
use rheo::engine::{Durability, Engine, EngineOptions};
use rheo::{AppendOptions, NewEvent, Query};
use serde_json::json;

const EVENTS: u64 = 1_000_000;
const PARTITIONS: u32 = 4;
const CUSTOMERS: u64 = 10_000;

fn opts(background: bool) -> EngineOptions {
    EngineOptions::default().durability(Durability::None).segment_bytes(16 << 20).background_indexing(background)
}

fn event(n: u64) -> NewEvent {
    let customer = format!("c-{}", n % CUSTOMERS);
    let currency = ["EUR", "USD", "GBP"][usize::try_from(n % 3).expect("small")];
    NewEvent::prepare(
        json!({"type": format!("t-{}", n % 10), "customer": customer, "shard": customer,
               "currency": currency, "amount": n, "note": "x".repeat(96)}),
        AppendOptions::new().partition(u32::try_from(n % u64::from(PARTITIONS)).expect("small")),
    )
}

/// A new engine in `dir` with the stream "q" and its declared indexes.
fn create(dir: &Path, background: bool) -> (Engine, Arc<Stream>) {
    let engine = Engine::open_dir(dir, opts(background)).expect("open");
    engine.create_stream("q", PARTITIONS, &["customer".into(), "currency".into()], 0).expect("stream");
    let stream = engine.stream("q").expect("stream");
    (engine, stream)
}

/// Appends one batch (to the partitions its events name) and waits.
fn append(engine: &Engine, log: &Stream, batch: &[NewEvent]) {
    let routed: Vec<Routed<'_>> = batch
        .iter()
        .map(|e| Routed { partition: e.partition().unwrap_or(0), ts: 1_700_000_000_000, event: e })
        .collect();
    let (_, ticket) = engine.append(log, &routed).expect("append");
    ticket.wait().expect("durable");
}

/// The data set in `dir`, indexes built; returns the ids of every 1000th event.
fn fill(dir: &Path) -> Vec<String> {
    let (engine, log) = create(dir, false);
    let mut ids = Vec::new();
    let mut done = 0;
    while done < EVENTS {
        let batch: Vec<NewEvent> = (done..(done + 1000).min(EVENTS)).map(event).collect();
        ids.push(batch[0].id().to_owned());
        append(&engine, &log, &batch);
        done += batch.len() as u64;
    }
    engine.build_indexes().expect("build");
    ids
}

fn open(dir: &Path) -> (Engine, Arc<Stream>) {
    let engine = Engine::open_dir(dir, opts(false)).expect("open");
    engine.build_indexes().expect("build");
    let stream = engine.stream("q").expect("stream");
    (engine, stream)
}

fn six_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("list") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "six") {
                out.push(p);
            }
        }
    }
    out
}

fn queries(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(support::bench_dir()).expect("temporary directory");
    let ids = fill(dir.path());
    let (_engine, log) = open(dir.path());
    let mut g = c.benchmark_group("engine_query");
    let mut n = 0u64;
    let mut next_customer = || {
        n = (n + 7919) % CUSTOMERS;
        format!("c-{n}")
    };
    g.bench_function("eq_100_of_1M_indexed", |b| {
        b.iter(|| {
            let q = Query::new("q").eq("customer", next_customer()).limit(100);
            let page = log.query_page(&q).expect("query");
            assert_eq!(page.events.len(), 100);
        })
    });
    g.bench_function("in_3_values_indexed", |b| {
        b.iter(|| {
            let vals = [next_customer(), next_customer(), next_customer()];
            let q = Query::new("q").is_in("customer", vals).limit(300);
            let page = log.query_page(&q).expect("query");
            assert_eq!(page.events.len(), 300);
        })
    });
    g.bench_function("eq_and_range_indexed", |b| {
        b.iter(|| {
            let q = Query::new("q").eq("customer", next_customer()).gte("amount", 500_000).limit(100);
            let page = log.query_page(&q).expect("query");
            assert_eq!(page.events.len(), 50);
        })
    });
    let mut i = 0usize;
    g.bench_function("id_lookup", |b| {
        b.iter(|| {
            i = (i + 17) % ids.len();
            let found = log.position_of(&ids[i]).expect("lookup");
            assert!(found.is_some());
        })
    });
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.bench_function("eq_100_of_1M_scan", |b| {
        b.iter(|| {
            let q = Query::new("q").eq("shard", next_customer()).limit(100);
            let page = log.query_page(&q).expect("query");
            assert_eq!(page.events.len(), 100);
        })
    });
    g.finish();
}

fn building(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(support::bench_dir()).expect("temporary directory");
    fill(dir.path());
    let (mut six, mut log) = (0u64, 0u64);
    for f in six_files(dir.path()) {
        six += std::fs::metadata(&f).expect("stat").len();
        log += std::fs::metadata(f.with_extension("log")).expect("stat").len();
    }
    eprintln!("index files: {six} bytes for {log} bytes of sealed segments ({:.1} %)", 100.0 * six as f64 / log as f64);
    let mut g = c.benchmark_group("engine_index_build");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(30));
    g.throughput(Throughput::Elements(EVENTS));
    // Every segment's index from the log: delete the files, reopen, build.
    g.bench_function("build_1M", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                for f in six_files(dir.path()) {
                    std::fs::remove_file(f).expect("remove");
                }
                let engine = Engine::open_dir(dir.path(), opts(false)).expect("open");
                let t = Instant::now();
                engine.build_indexes().expect("build");
                total += t.elapsed();
            }
            total
        })
    });
    // Adding a field to a stream of 1M events, with the background builder:
    // from create_index until every segment covers it (each iteration from
    // the same saved manifest and index files).
    let saved = tempfile::tempdir_in(support::bench_dir()).expect("temporary directory");
    let manifest = dir.path().join("MANIFEST");
    std::fs::copy(&manifest, saved.path().join("MANIFEST")).expect("save");
    let sixes: Vec<(std::path::PathBuf, Vec<u8>)> =
        six_files(dir.path()).into_iter().map(|p| (p.clone(), std::fs::read(&p).expect("read"))).collect();
    g.bench_function("backfill_create_index_1M", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                std::fs::copy(saved.path().join("MANIFEST"), &manifest).expect("restore");
                for (p, bytes) in &sixes {
                    std::fs::write(p, bytes).expect("restore");
                }
                let engine = Engine::open_dir(dir.path(), opts(true)).expect("open");
                let t = Instant::now();
                engine.create_index("q", "amount").expect("create_index");
                loop {
                    let status = engine.index_status("q").expect("status");
                    if status.iter().all(|s| s.ready()) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
}

/// Appends of 1M events (batches of 1000 over 4 partitions) with the
/// background builder on, until every segment's index is built, against
/// the same appends with indexing off: the difference is what indexing
/// costs an appending workload on this machine's two cores.
fn appending(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_index_append");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(30));
    g.throughput(Throughput::Elements(EVENTS));
    let batches: Vec<Vec<NewEvent>> =
        (0..EVENTS / 1000).map(|b| (b * 1000..(b + 1) * 1000).map(event).collect()).collect();
    for background in [false, true] {
        let name = if background { "append_1M_then_indexed" } else { "append_1M_no_indexing" };
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let dir = tempfile::tempdir_in(support::bench_dir()).expect("temporary directory");
                    let (engine, log) = create(dir.path(), background);
                    let t = Instant::now();
                    for batch in &batches {
                        append(&engine, &log, batch);
                    }
                    while background && !engine.index_status("q").expect("status").iter().all(|s| s.ready()) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    total += t.elapsed();
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, queries, building, appending);
criterion_main!(benches);
