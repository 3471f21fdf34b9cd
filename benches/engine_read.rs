//! Read throughput and reopen time of the native engine.
//!
//! `cargo bench --bench engine_read`. Reopen at 10M events writes ~2.7 GB;
//! set `RHEO_BENCH_BIG=1` to include it.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rheo::engine::log::stream::Routed;
use rheo::engine::segment::scan::{Scanner, Step};
use rheo::engine::{Durability, Engine, EngineOptions};
use support::{engine, event};

const EVENTS: u64 = 200_000;

fn fill(engine: &Engine, log: &rheo::engine::stream::Stream, n: u64) {
    let mut done = 0;
    while done < n {
        let batch: Vec<_> = (done..(done + 1000).min(n)).map(event).collect();
        let routed: Vec<_> = batch.iter().map(|e| Routed { partition: 0, ts: 1, event: e }).collect();
        let (_, ticket) = engine.append(log, &routed).expect("append");
        ticket.wait().expect("durable");
        done += batch.len() as u64;
    }
}

/// The fields a consumer of the bench's events reads: decoded straight from
/// the stored payload.
#[derive(serde::Deserialize)]
struct Order {
    order: u64,
    total: u64,
    currency: String,
}

/// Sequential reads through the public API (`Rheo::read` on `native:`, pages
/// of 10,000), as a user calls it: touching each event's id and position
/// only, and decoding each payload into a struct.
fn api_read(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let dir = tempfile::tempdir_in(support::bench_dir()).expect("temporary directory");
    let rheo =
        rt.block_on(rheo::Rheo::open(&format!("native:{}?durability=none", dir.path().display()))).expect("open");
    rt.block_on(async {
        rheo.create_stream("s", rheo::StreamOptions::new().partitions(1)).await.expect("stream");
        let mut done = 0;
        while done < EVENTS {
            let batch: Vec<_> = (done..done + 1000).map(|n| event(n).payload().clone()).collect();
            rheo.append_batch("s", batch).await.expect("append");
            done += 1000;
        }
    });
    let read_all = |f: &mut dyn FnMut(&rheo::Event)| {
        rt.block_on(async {
            let mut after = 0;
            loop {
                let page = rheo.read("s", 0, after, 10_000).await.expect("read");
                let Some(last) = page.last() else { break };
                after = last.sequence();
                page.iter().for_each(&mut *f);
            }
        })
    };
    let mut g = c.benchmark_group("api_read");
    g.throughput(Throughput::Elements(EVENTS));
    g.bench_function("event_access", |b| {
        b.iter(|| {
            let (mut n, mut bytes) = (0u64, 0usize);
            read_all(&mut |e| {
                n += 1;
                bytes += e.id().len() + usize::from(e.sequence() > 0);
            });
            assert_eq!(n, EVENTS);
            bytes
        })
    });
    g.bench_function("decode_into_struct", |b| {
        b.iter(|| {
            let (mut n, mut sum) = (0u64, 0u64);
            read_all(&mut |e| {
                let o: Order = e.payload().decode().expect("an order");
                n += 1;
                sum = sum.wrapping_add(o.order + o.total + o.currency.len() as u64);
            });
            assert_eq!(n, EVENTS);
            sum
        })
    });
    g.finish();
}

fn none() -> EngineOptions {
    EngineOptions::default().durability(Durability::None)
}

fn sequential_read(c: &mut Criterion) {
    let (engine, log, _dir) = engine(none(), 1);
    fill(&engine, &log, EVENTS);
    let mut g = c.benchmark_group("engine_read");
    g.throughput(Throughput::Elements(EVENTS));
    g.bench_function("decoded_events", |b| {
        b.iter(|| {
            let mut n = 0u64;
            log.log
                .partition(0)
                .expect("p")
                .scan(0, u64::MAX, |_| {
                    n += 1;
                    true
                })
                .expect("scan");
            assert_eq!(n, EVENTS);
        })
    });
    g.bench_function("raw_crc_scan", |b| {
        let part = log.log.partition(0).expect("p");
        b.iter(|| {
            let mut n = 0u64;
            for seg in part.segments() {
                let file = rheo::engine::vfs::Vfs::open(&**engine.vfs(), seg.path(), false).expect("open");
                let len = file.len().expect("len");
                let mut scanner = Scanner::new(&*file, 64, len);
                while let Step::Record { .. } = scanner.next_step().expect("read") {
                    n += 1;
                }
            }
            assert_eq!(n, EVENTS);
        })
    });
    g.finish();
}

fn reopen(c: &mut Criterion) {
    let mut sizes = vec![1_000_000u64];
    if std::env::var_os("RHEO_BENCH_BIG").is_some() {
        sizes.push(10_000_000);
    }
    let mut g = c.benchmark_group("engine_reopen");
    g.sample_size(10);
    for n in sizes {
        let (engine, log, dir) = engine(none(), 1);
        fill(&engine, &log, n);
        drop(log);
        drop(engine);
        g.bench_function(format!("{n}_events"), |b| {
            b.iter(|| Engine::open_dir(dir.path(), EngineOptions::default()).expect("reopen"))
        });
        // `recovery=strict` reads every record of every sealed segment.
        let bytes: u64 = walk_bytes(dir.path());
        println!("engine_reopen/{n}_events: {:.1} MiB on disk", bytes as f64 / f64::from(1 << 20));
        let strict = EngineOptions::default().recovery(rheo::backends::native::RecoveryMode::Strict);
        g.bench_function(format!("{n}_events_strict"), |b| {
            b.iter(|| Engine::open_dir(dir.path(), strict.clone()).expect("strict reopen"))
        });
    }
    g.finish();
}

/// The bytes of every file under `dir`.
fn walk_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| {
            let path = e.path();
            if path.is_dir() { walk_bytes(&path) } else { e.metadata().map_or(0, |m| m.len()) }
        })
        .sum()
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = sequential_read, api_read, reopen
}
criterion_main!(benches);
