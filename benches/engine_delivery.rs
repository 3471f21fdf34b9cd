//! Consumer groups on the native engine: fetch(100) + ack_many with one and
//! eight competing consumers under Sync and Batched, reopen time with 1M
//! unsettled deliveries, and memory per in-flight lease and per acked
//! sequence above a hole.
//!
//! `cargo bench --bench engine_delivery`. The memory figures are printed
//! (they come from a counting allocator in this binary, which also counts
//! every allocation of the throughput runs: a few ns each).

#![allow(missing_docs)] // criterion_group! generates undocumented functions
#![allow(unsafe_code)] // the counting allocator below

#[path = "support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rheo::engine::{Durability, EngineOptions};
use rheo::{AppendOptions, FetchOptions, GroupOptions, Rheo, StreamOptions};
use support::{bench_dir, event};

/// Counts live heap bytes.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as for `realloc` itself.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const BATCH: usize = 100;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

async fn open(dir: &std::path::Path, durability: Durability) -> Rheo {
    let query = match durability {
        Durability::Sync => "durability=sync".to_owned(),
        Durability::Batched { max_delay } => format!("durability=batched&max_delay_ms={}", max_delay.as_millis()),
        Durability::None => "durability=none".to_owned(),
    };
    Rheo::open(&format!("native:{}?{query}", dir.display())).await.expect("open")
}

/// Appends `n` events in batches of 1,000.
async fn fill(rheo: &Rheo, n: u64) {
    let mut done = 0;
    while done < n {
        let k = (n - done).min(1000);
        let batch: Vec<_> = (done..done + k).map(|i| event(i).payload().clone()).collect();
        rheo.append_batch("s", batch).await.expect("append");
        done += k;
    }
}

fn fetch_ack(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("delivery_fetch100_ack_many");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for (mode, durability) in
        [("sync", Durability::Sync), ("batched", Durability::Batched { max_delay: Duration::from_millis(5) })]
    {
        for consumers in [1usize, 8] {
            let dir = tempfile::tempdir_in(bench_dir()).expect("temporary directory");
            let rheo = rt.block_on(async {
                let rheo = open(dir.path(), durability).await;
                rheo.create_stream("s", StreamOptions::new().partitions(8)).await.expect("stream");
                rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
                rheo
            });
            g.throughput(Throughput::Elements((BATCH * consumers) as u64));
            g.bench_function(format!("{mode}/{consumers}_consumers"), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let rheo = rheo.clone();
                    async move { fill_and_consume(&rheo, iters * (BATCH * consumers) as u64, consumers).await }
                })
            });
        }
    }
    g.finish();
}

/// Appends `total` events, then times `consumers` competing consumers
/// draining them with `fetch(BATCH)` + `ack_many`.
async fn fill_and_consume(rheo: &Rheo, total: u64, consumers: usize) -> Duration {
    fill(rheo, total).await;
    // Let a Batched background sync of the fill finish outside the
    // measured time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = Arc::new(AtomicU64::new(total));
    let start = Instant::now();
    let tasks: Vec<_> = (0..consumers)
        .map(|i| {
            let (rheo, left) = (rheo.clone(), left.clone());
            tokio::spawn(async move {
                let opts = FetchOptions::new().limit(BATCH).consumer(format!("c{i}"));
                while left.load(Ordering::Relaxed) > 0 {
                    let leases = rheo.fetch("s", "g", opts.clone()).await.expect("fetch");
                    if leases.is_empty() {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    let n = leases.len() as u64;
                    for r in rheo.ack_many(&leases).await.expect("ack_many") {
                        r.expect("ack");
                    }
                    left.fetch_sub(n, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("consumer");
    }
    start.elapsed()
}

/// Issue 35's target: `delivery_fetch100_ack_many/sync/1_consumers` of due
/// events, on a stream without scheduled events and on one holding 1M
/// events scheduled a day ahead (appended, and met once by the group's
/// fetches, before the measured runs: they wait as set-aside deliveries).
fn fetch_ack_with_scheduled_ahead(c: &mut Criterion) {
    const AHEAD: u64 = 1_000_000;
    let rt = runtime();
    let mut g = c.benchmark_group("delivery_scheduled_ahead");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for ahead in [0, AHEAD] {
        let dir = tempfile::tempdir_in(bench_dir()).expect("temporary directory");
        let rheo = rt.block_on(async {
            let rheo = open(dir.path(), Durability::Sync).await;
            rheo.create_stream("s", StreamOptions::new().partitions(8)).await.expect("stream");
            rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
            let later = rheo::Timestamp::now().saturating_add(Duration::from_secs(86_400));
            let mut done = 0;
            while done < ahead {
                let batch: Vec<_> = (done..done + 1000)
                    .map(|i| {
                        (event(i).payload().clone(), AppendOptions::new().partition((i % 8) as u32).deliver_at(later))
                    })
                    .collect();
                rheo.append_batch_with("s", batch).await.expect("append");
                done += 1000;
            }
            let mut set_aside = 0;
            loop {
                let report = rheo.fetch_report("s", "g", FetchOptions::new().limit(BATCH)).await.expect("fetch");
                assert!(report.leases.is_empty(), "nothing is due");
                if report.scheduled == 0 {
                    break;
                }
                set_aside += report.scheduled;
            }
            assert_eq!(set_aside, ahead);
            // Let the background work of the fill finish before the
            // measured runs: the index builder, and the writeback of what it
            // wrote (index files are not synced; the kernel would write
            // them out during the measured runs, beside their syncs).
            tokio::time::sleep(Duration::from_secs(5)).await;
            let _ = std::process::Command::new("sync").status();
            rheo
        });
        g.throughput(Throughput::Elements(BATCH as u64));
        let name = if ahead == 0 { "sync/none_ahead".to_owned() } else { format!("sync/{}M_ahead", ahead / 1_000_000) };
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let rheo = rheo.clone();
                async move { fill_and_consume(&rheo, iters * BATCH as u64, 1).await }
            })
        });
    }
    g.finish();
}

/// The fetch and the ack of `delivery_fetch100_ack_many` timed apart (one
/// consumer, `Sync`): `fetch(100)` is the time of the fetches only (each
/// batch is acked outside the timed span), `ack_many(100)` the time of
/// the acks only (each batch fetched outside it). Per element: one lease.
fn fetch_and_ack_apart(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("delivery_apart");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    g.throughput(Throughput::Elements(BATCH as u64));
    let dir = tempfile::tempdir_in(bench_dir()).expect("temporary directory");
    let rheo = rt.block_on(async {
        let rheo = open(dir.path(), Durability::Sync).await;
        rheo.create_stream("s", StreamOptions::new().partitions(8)).await.expect("stream");
        rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
        rheo
    });
    for timed in ["fetch(100)", "ack_many(100)"] {
        g.bench_function(format!("sync/{timed}"), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let rheo = rheo.clone();
                async move {
                    fill(&rheo, iters * BATCH as u64).await;
                    let opts = FetchOptions::new().limit(BATCH);
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        let leases = rheo.fetch("s", "g", opts.clone()).await.expect("fetch");
                        let fetched = Instant::now();
                        assert_eq!(leases.len(), BATCH, "each fetch finds a full batch");
                        for r in rheo.ack_many(&leases).await.expect("ack_many") {
                            r.expect("ack");
                        }
                        spent += if timed.starts_with("fetch") { fetched - start } else { fetched.elapsed() };
                    }
                    spent
                }
            })
        });
    }
    g.finish();
}

const UNSETTLED: u64 = 1_000_000;

/// Reopen with 1M claimed, unsettled deliveries (WAL of claims, with the
/// checkpoints the default 16 MiB threshold triggers), and memory figures.
fn reopen_and_memory(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir_in(bench_dir()).expect("temporary directory");
    rt.block_on(async {
        let rheo = open(dir.path(), Durability::None).await;
        rheo.create_stream("s", StreamOptions::new()).await.expect("stream");
        rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
        rheo.create_group("s", "holes", GroupOptions::new()).await.expect("group");
        fill(&rheo, UNSETTLED).await;

        let lease = Duration::from_secs(3600);
        let before = LIVE.load(Ordering::Relaxed);
        let mut claimed = 0;
        while claimed < UNSETTLED {
            let leases = rheo.fetch("s", "g", FetchOptions::new().limit(10_000).lease(lease)).await.expect("fetch");
            claimed += leases.len() as u64;
        }
        let per_lease = (LIVE.load(Ordering::Relaxed) - before) as f64 / UNSETTLED as f64;

        // Every other sequence acked (the rest stay in flight): the acked
        // ones sit above holes, as ranges.
        let mut holes_leases = 0u64;
        let mut acked = 0u64;
        let before_holes = LIVE.load(Ordering::Relaxed);
        while holes_leases < UNSETTLED {
            let leases = rheo.fetch("s", "holes", FetchOptions::new().limit(10_000).lease(lease)).await.expect("fetch");
            holes_leases += leases.len() as u64;
            let odd: Vec<_> = leases.iter().filter(|l| l.event.sequence() % 2 == 0).collect();
            for r in rheo.ack_many(odd.iter().copied()).await.expect("ack_many") {
                r.expect("ack");
            }
            acked += odd.len() as u64;
        }
        let info = rheo.group_info("s", "holes").await.expect("info");
        // The group's growth minus its in-flight leases, per acked sequence.
        let grown = (LIVE.load(Ordering::Relaxed) - before_holes) as f64;
        let per_acked = (grown - per_lease * info.inflight as f64) / acked as f64;
        eprintln!(
            "memory: {per_lease:.0} bytes per in-flight lease (1M leases); {per_acked:.0} bytes per acked sequence above a hole ({acked} acked between {} in-flight leases)",
            info.inflight
        );
    });

    let mut g = c.benchmark_group("delivery_reopen");
    g.sample_size(10);
    g.bench_function("1M_unsettled_deliveries", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let opts = EngineOptions::default().durability(Durability::None);
                let start = Instant::now();
                let engine = rheo::engine::Engine::open_dir(dir.path(), opts).expect("reopen");
                total += start.elapsed();
                let r = engine.delivery_recovery();
                assert_eq!(r.len(), 1);
                drop(engine);
            }
            total
        })
    });
    // A checkpoint of that state: the pause it imposes on the stream's
    // group calls (it runs under the stream's table lock).
    g.bench_function("checkpoint_1M_unsettled_deliveries", |b| {
        let opts = EngineOptions::default().durability(Durability::Sync);
        let engine = rheo::engine::Engine::open_dir(dir.path(), opts).expect("reopen");
        b.iter(|| engine.checkpoint("s").expect("checkpoint"));
    });
    g.finish();
}

criterion_group!(benches, fetch_ack, fetch_and_ack_apart, reopen_and_memory, fetch_ack_with_scheduled_ahead);
criterion_main!(benches);
