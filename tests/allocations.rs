//! Heap allocations per event on the hot paths, through `Rheo` as a user
//! calls it (issue 34): `append` of one event, `append_batch`, `fetch` and
//! `ack_many` on `native:`.
//!
//! A counting allocator counts the allocations made on the calling thread
//! (a current-thread runtime under `durability=none`, so the whole call
//! runs there; the index builder's and the commit thread's own work is
//! not counted). A read runs on the blocking pool: it is counted on every
//! thread, once the background threads are idle. The bounds are the figures reached, so that a change that
//! adds allocations to a hot path fails here and says by how many; lower
//! them as the paths get leaner. They count allocations, never time.

#![allow(unsafe_code)] // the counting allocator below

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rheo::{FetchOptions, GroupOptions, Rheo, StreamOptions};

struct Counting;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// Allocations on every thread.
static TOTAL: AtomicU64 = AtomicU64::new(0);

fn bump() {
    TOTAL.fetch_add(1, Ordering::Relaxed);
    // `try_with`: a thread being torn down allocates after its locals are gone.
    let _ = COUNT.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: as for `realloc` itself.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn allocations() -> u64 {
    COUNT.with(Cell::get)
}

/// Waits until the threads together allocate at most 100 times in 200 ms
/// (the index builder has caught up; timers tick on, ~60 times in 200 ms
/// here: about one allocation in the few milliseconds a measured read
/// takes), at most 20 s.
fn quiesce() {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = TOTAL.load(Ordering::Relaxed);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = TOTAL.load(Ordering::Relaxed);
        if now - last <= 100 {
            return;
        }
        last = now;
    }
    panic!("the background threads kept allocating for 20 s");
}

#[derive(serde::Serialize)]
struct Order<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    order: u64,
    customer: &'a str,
    note: &'a str,
}

fn order(n: u64) -> Order<'static> {
    Order { kind: "order_placed", order: n, customer: "customer-0042", note: "x" }
}

/// Allocations per event of `rounds` calls of `f`, each handling `per_call` events.
async fn per_event<F, Fut>(rounds: u64, per_call: u64, mut f: F) -> f64
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // Warm up: the first calls fill caches, windows and segment state.
    for i in 0..rounds {
        f(i).await;
    }
    let before = allocations();
    for i in rounds..2 * rounds {
        f(i).await;
    }
    (allocations() - before) as f64 / (rounds * per_call) as f64
}

async fn open() -> (Rheo, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let rheo = Rheo::open(&format!("native:{}?durability=none", dir.path().display())).await.expect("open");
    rheo.create_stream("s", StreamOptions::new().partitions(4)).await.expect("stream");
    (rheo, dir)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// Prints and checks one path's figure.
fn report(path: &str, got: f64, bound: f64) {
    println!("{path}: {got:.3} allocations per event (bound {bound})");
    assert!(got <= bound, "{path}: {got:.2} allocations per event, more than the {bound} reached before");
}

#[test]
fn allocations_per_event_on_the_hot_paths() {
    runtime().block_on(async {
        let (rheo, _dir) = open().await;
        let one = per_event(2_000, 1, |i| {
            let rheo = &rheo;
            async move {
                let opts = rheo::AppendOptions::new().key("k");
                rheo.append("s", &order(i), opts).await.expect("append");
            }
        })
        .await;
        report("append (one event per call)", one, APPEND_ONE);

        let batch = per_event(20, 1_000, |k| {
            let rheo = &rheo;
            async move {
                rheo.append_batch("s", (0..1_000).map(|i| order(k * 1_000 + i))).await.expect("append_batch");
            }
        })
        .await;
        report("append_batch(1000)", batch, APPEND_BATCH);

        rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
        let consume = per_event(200, 100, |_| {
            let rheo = &rheo;
            async move {
                let leases = rheo.fetch("s", "g", FetchOptions::new().limit(100)).await.expect("fetch");
                assert_eq!(leases.len(), 100, "the stream holds enough events for every fetch");
                for r in rheo.ack_many(&leases).await.expect("ack_many") {
                    r.expect("ack");
                }
            }
        })
        .await;
        report("fetch(100) + ack_many", consume, FETCH_ACK);

        rheo.create_stream("r", StreamOptions::new().partitions(1)).await.expect("stream");
        for k in 0..10 {
            rheo.append_batch("r", (0..1_000).map(|i| order(k * 1_000 + i))).await.expect("append_batch");
        }
        let read = |k: u64| {
            let rheo = &rheo;
            async move {
                let page = rheo.read("r", 0, k * 1_000, 1_000).await.expect("read");
                assert_eq!(page.len(), 1_000, "the stream holds enough events for every read");
            }
        };
        // Warm up (the blocking pool's thread), then count on every thread.
        for k in 0..5 {
            read(k).await;
        }
        quiesce();
        let before = TOTAL.load(Ordering::Relaxed);
        for k in 5..10 {
            read(k).await;
        }
        let got = (TOTAL.load(Ordering::Relaxed) - before) as f64 / 5_000.0;
        report("read(1000), every thread", got, READ);
    });
}

/// The bounds: what each path reached (issue 34's aim is at most 1 on
/// the append and fetch paths). One event's append: the positions the
/// backend answers, the backend call's future and the returned event (its
/// key, id, type and payload are cut from the thread's shared chunk, its
/// record encoded into the thread's record buffer). Per event of a batch:
/// the event, and a share of a chunk. Per fetched and acked event: the
/// event, the lease's entries in the group's delivery and timer trees
/// (a node now and then), and a share of each batch's lists. Per
/// event read: the event (its document shares the read buffer).
const APPEND_ONE: f64 = 3.1;
const APPEND_BATCH: f64 = 1.1;
const FETCH_ACK: f64 = 1.75;
const READ: f64 = 1.1;
