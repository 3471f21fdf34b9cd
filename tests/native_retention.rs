//! Retention on the native engine: crash tests of segment deletion, the
//! background thread, reopen after a pass, and what a pass leaves on disk.
//!
//! The crash test runs one pass with a fault armed at each of its
//! file-system operations in turn (the count comes from a run without a
//! fault): a crash, a crash after part of the unsynced state was written
//! back, and a torn write (with a write-back), and checks after
//! reopening:
//!
//! - every event at or after the partition's log start is there, intact,
//!   and the log start is 1 or a segment base no later than the pass's;
//! - the segment files are a contiguous run from the log start, and no
//!   index file is left below it;
//! - a pass that returned Ok is durable: nothing it deleted comes back;
//! - the group is never behind the log start, and what it skipped is
//!   exactly the unsettled events below it;
//! - a second pass finishes the job.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rheo::backends::Backend;
use rheo::backends::native::NativeBackend;
use rheo::engine::vfs::{Fault, FaultyVfs, MemVfs, Vfs};
use rheo::engine::{Durability, Engine, EngineOptions};
use rheo::{
    AppendOptions, FetchOptions, GroupOptions, ManualClock, NewEvent, Retention, Rheo, StreamOptions, Timestamp,
};
use serde_json::json;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

#[path = "common/crash.rs"]
mod crash;

const S: &str = "s";
const G: &str = "g";
/// Events per partition.
const PER: u64 = 300;
const KEEP: u64 = 100;

fn opts(durability: Durability) -> EngineOptions {
    EngineOptions::default()
        .segment_bytes(4096)
        .preallocate_bytes(1024)
        .inline_io(true)
        .background_indexing(false)
        .retention_interval(Duration::ZERO)
        .durability(durability)
}

fn backend(vfs: Arc<dyn Vfs>, durability: Durability) -> NativeBackend {
    // Batched: a commit thread that syncs after max_delay (inline commits
    // would sync at once).
    let inline = !matches!(durability, Durability::Batched { .. });
    let engine = Engine::open(vfs, opts(durability).inline_io(inline)).expect("engine opens");
    NativeBackend::with_engine(engine, Arc::new(ManualClock::new(Timestamp::from_millis(1_767_225_600_000))))
}

/// Two partitions of `PER` events each (`{"p": p, "n": n}`), a group that
/// leased the first 100 of partition 0 and acked the first 50.
async fn setup(b: &NativeBackend) {
    b.create_stream(S, &StreamOptions::new().partitions(2).retention(Retention::new().max_events(KEEP)))
        .await
        .expect("stream");
    b.create_group(S, G, &GroupOptions::new()).await.expect("group");
    for p in 0..2u32 {
        for chunk in 0..PER / 50 {
            let events: Vec<NewEvent> = (0..50)
                .map(|i| {
                    let n = chunk * 50 + i + 1;
                    NewEvent::prepare(json!({"p": p, "n": n, "pad": "y".repeat(30)}), AppendOptions::new().partition(p))
                })
                .collect();
            b.append_batch(S, &events).await.expect("append");
        }
    }
    let leases = b.fetch(S, G, &FetchOptions::new().limit(100).partitions(vec![0])).await.expect("fetch").leases;
    assert_eq!(leases.len(), 100);
    for l in &leases[..50] {
        b.ack(&l.to_ref()).await.expect("ack");
    }
}

/// The segment bases of a partition, and whether an index file of a base
/// below the first is left.
fn files(mem: &MemVfs, p: u32) -> (Vec<u64>, Vec<String>) {
    let dir = format!("streams/0000000000000001/{p:05}");
    let names = mem.list(&dir).expect("list");
    let mut bases: Vec<u64> = names.iter().filter_map(|n| n.strip_suffix(".log")?.parse().ok()).collect();
    bases.sort_unstable();
    let first = bases.first().copied().unwrap_or(u64::MAX);
    let orphans = names
        .iter()
        .filter(|n| n.ends_with(".idx") || n.ends_with(".six"))
        .filter(|n| n.split('.').next().and_then(|b| b.parse::<u64>().ok()).is_some_and(|b| b < first))
        .cloned()
        .collect();
    (bases, orphans)
}

/// Checks the reopened directory; returns each partition's log start.
async fn check(b: &NativeBackend, mem: &MemVfs, limit_starts: &[u64], what: &str) -> Vec<u64> {
    let info = b.stream_info(S).await.unwrap_or_else(|e| panic!("{what}: stream_info: {e}"));
    let mut starts = Vec::new();
    for p in 0..2u32 {
        let part = info.partitions[p as usize];
        let first = part.first_sequence;
        assert_eq!(part.last_sequence, PER, "{what}: partition {p} keeps its end");
        assert!(first <= limit_starts[p as usize], "{what}: partition {p} starts at {first}, past the pass's start");
        let (bases, orphans) = files(mem, p);
        assert_eq!(bases.first().copied(), Some(first), "{what}: partition {p}: the first segment is the log start");
        assert!(orphans.is_empty(), "{what}: partition {p}: index files below the log start: {orphans:?}");
        // Every retained event, intact and in order.
        let mut seen = Vec::new();
        let mut after = 0;
        loop {
            let page = b.read(S, p, after, 500).await.unwrap_or_else(|e| panic!("{what}: read: {e}"));
            let Some(last) = page.last() else { break };
            after = last.sequence();
            for e in &page {
                let v = e.payload().json().expect("json").clone();
                assert_eq!((v["p"].as_u64(), v["n"].as_u64()), (Some(u64::from(p)), Some(e.sequence())), "{what}");
                seen.push(e.sequence());
            }
        }
        assert_eq!(seen, (first..=PER).collect::<Vec<_>>(), "{what}: partition {p}: every retained event");
        // The group: never behind the start.
        let lag = b.lag(S, G, Some(&[p])).await.expect("lag");
        assert!(lag.partitions[0].frontier + 1 >= first, "{what}: partition {p}: frontier behind the log start");
        starts.push(first);
    }
    // The group was moved by the pass (one WAL record for every
    // partition) or not at all: it skipped the unsettled events below the
    // log starts, or below the pass's starts (whose events a crash left
    // in place; the next pass drops them).
    let unsettled = |starts: &[u64]| -> u64 {
        (0..2).map(|p| (starts[p] - 1) - if p == 0 { 50.min(starts[p] - 1) } else { 0 }).sum()
    };
    let gi = b.group_info(S, G).await.expect("group_info");
    let (here, pass) = (unsettled(&starts), unsettled(limit_starts));
    assert!(
        gi.retention_skipped == here || gi.retention_skipped == pass,
        "{what}: skipped {} is neither {here} (below the log starts) nor {pass} (below the pass's starts)",
        gi.retention_skipped
    );
    starts
}

/// The log starts of a pass run without a fault, and its count of
/// file-system operations.
async fn dry_run() -> (Vec<u64>, u64) {
    let faulty = FaultyVfs::new(MemVfs::new(), Fault::Crash, 0, 1);
    let b = backend(Arc::new(faulty.clone()), Durability::Sync);
    setup(&b).await;
    let before = faulty.op_count();
    let report = b.enforce_retention(S).await.expect("pass");
    let ops = faulty.op_count() - before;
    let starts: Vec<u64> =
        (0..2).map(|p| report.dropped.iter().find(|d| d.partition == p).map_or(1, |d| d.last + 1)).collect();
    assert!(starts.iter().all(|&s| s > 1 && PER - s + 1 >= KEEP), "the pass drops segments: {starts:?}");
    (starts, ops)
}

#[tokio::test]
async fn a_crash_at_every_operation_of_a_pass_loses_no_retained_event_and_resurrects_no_segment() {
    let (limit_starts, ops) = dry_run().await;
    assert!(ops > 10, "a pass deletes several segments: {ops} operations");
    let mut scenarios = 0;
    for (n, fault, write_back) in
        (1..=ops + 1).flat_map(|n| [(n, Fault::Crash, false), (n, Fault::Crash, true), (n, Fault::TornWrite, true)])
    {
        {
            let mem = MemVfs::new();
            let faulty = FaultyVfs::new(mem.clone(), fault, 0, n);
            let b = backend(Arc::new(faulty.clone()), Durability::Sync);
            setup(&b).await;
            faulty.arm(n);
            let result = b.enforce_retention(S).await;
            drop(b);
            if write_back {
                let mut rng = Rng::new(n, 7);
                let mut trace = crash::Trace { lines: Vec::new(), print: false };
                crash::write_back_some(&mem, &mut rng, &mut trace, 2);
            }
            faulty.restart();
            let what =
                format!("{fault:?} at operation {n} of {ops} (write-back {write_back}, pass {:?})", result.is_ok());
            let b = backend(Arc::new(faulty.clone()), Durability::Sync);
            let starts = check(&b, &mem, &limit_starts, &what).await;
            if result.is_ok() {
                assert_eq!(starts, limit_starts, "{what}: a pass that returned is durable");
            }
            // A second pass finishes the job.
            b.enforce_retention(S).await.unwrap_or_else(|e| panic!("{what}: second pass: {e}"));
            let again = check(&b, &mem, &limit_starts, &format!("{what}, second pass")).await;
            assert_eq!(again, limit_starts, "{what}: the second pass reaches the limits");
            scenarios += 1;
        }
    }
    eprintln!("{scenarios} crash scenarios over {ops} operations");
}

/// Under `Batched` durability the group's `Drop` record may be lost while
/// the segments are gone: reopening moves the group again.
#[tokio::test]
async fn a_lost_drop_record_is_redone_at_reopen() {
    let mem = MemVfs::new();
    let faulty = FaultyVfs::new(mem.clone(), Fault::Crash, 0, 1);
    // Everything durable (Sync), then reopened under Batched for the pass.
    let b = backend(Arc::new(faulty.clone()), Durability::Sync);
    setup(&b).await;
    drop(b);
    let b = backend(Arc::new(faulty.clone()), Durability::Batched { max_delay: Duration::from_secs(3600) });
    let report = b.enforce_retention(S).await.expect("pass");
    let starts: Vec<u64> =
        (0..2).map(|p| report.dropped.iter().find(|d| d.partition == p).map_or(1, |d| d.last + 1)).collect();
    assert!(!report.skipped.is_empty(), "{report:?}");
    // The process dies before closing (whose last group commit would sync
    // the WAL record).
    faulty.arm(1);
    drop(b);
    faulty.restart();
    let b = backend(Arc::new(faulty.clone()), Durability::Sync);
    let recovery = b.engine().delivery_recovery();
    assert!(recovery.iter().any(|(_, r)| r.clamped > 0), "the group was moved at open: {recovery:?}");
    let got = check(&b, &mem, &starts, "after a lost Drop record").await;
    assert_eq!(got, starts);
}

/// A pass keeps the active segment: a partition with one segment drops
/// nothing, whatever the limits.
#[tokio::test]
async fn the_active_segment_is_never_dropped() {
    let b = backend(Arc::new(MemVfs::new()), Durability::Sync);
    b.create_stream(
        S,
        &StreamOptions::new().retention(Retention::new().max_events(1).max_age(Duration::from_millis(1))),
    )
    .await
    .expect("stream");
    let events: Vec<NewEvent> = (0..5).map(|n| NewEvent::prepare(json!({"n": n}), AppendOptions::new())).collect();
    b.append_batch(S, &events).await.expect("append");
    let report = b.enforce_retention(S).await.expect("pass");
    assert!(report.dropped.is_empty(), "{report:?}");
    assert_eq!(b.read(S, 0, 0, 10).await.expect("read").len(), 5);
}

/// The background thread applies a stream's retention by itself (on the
/// system clock), and a handle dropped while it runs releases the
/// directory at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_thread_applies_retention_and_never_holds_the_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url =
        format!("native:{}?segment_bytes=4096&preallocate_bytes=1024&retention_interval_ms=20", dir.path().display());
    let rheo = Rheo::open(&url).await.expect("open");
    rheo.create_stream(S, StreamOptions::new().retention(Retention::new().max_events(50))).await.expect("stream");
    for chunk in 0..8 {
        let batch = (0..50).map(|i| (json!({"n": chunk * 50 + i, "pad": "z".repeat(40)}), AppendOptions::new()));
        rheo.append_batch_with(S, batch).await.expect("append");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let first = rheo.stream_info(S).await.expect("info").partitions[0].first_sequence;
        if first > 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the background thread dropped nothing in 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Drop and reopen at once, many times, while the thread runs passes.
    drop(rheo);
    for _ in 0..20 {
        let again = Rheo::open(&url).await.expect("reopen right after a drop");
        drop(again);
    }
}

/// Retention and the dedupe window are stream settings kept in the
/// manifest: they survive a reopen.
#[tokio::test]
async fn stream_settings_survive_a_reopen() {
    let mem = MemVfs::new();
    let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
    let b = backend(vfs.clone(), Durability::Sync);
    let r = Retention::new().max_bytes(1 << 20).policy(rheo::RetentionPolicy::Interest);
    b.create_stream(S, &StreamOptions::new().retention(r).dedupe_window(Duration::from_secs(5))).await.expect("stream");
    let r2 = r.max_age(Duration::from_secs(60));
    b.set_retention(S, &r2).await.expect("set");
    drop(b);
    let b = backend(vfs, Durability::Sync);
    let info = b.stream_info(S).await.expect("info");
    assert_eq!(info.retention, r2);
    assert_eq!(info.dedupe_window, Some(Duration::from_secs(5)));
    let entries: BTreeMap<String, _> = b.engine().stream_entries().into_iter().map(|e| (e.name.clone(), e)).collect();
    assert_eq!(entries[S].settings.dedupe_window_ms, Some(5000));
}

/// A stream's own dedupe window wins over the backend's: zero turns the
/// check off for that stream alone.
#[tokio::test]
async fn a_stream_dedupe_window_of_zero_turns_the_check_off_for_that_stream() {
    let b = backend(Arc::new(MemVfs::new()), Durability::Sync);
    b.create_stream("off", &StreamOptions::new().dedupe_window(Duration::ZERO)).await.expect("stream");
    b.create_stream("on", &StreamOptions::new()).await.expect("stream");
    for stream in ["off", "on"] {
        let e = NewEvent::prepare(json!({"n": 1}), AppendOptions::new().id("order-1"));
        let first = b.append_batch(stream, std::slice::from_ref(&e)).await.expect("append");
        let again = b.append_batch(stream, &[e]).await.expect("append again");
        let stored = b.read(stream, 0, 0, 10).await.expect("read").len();
        match stream {
            "off" => assert_eq!((stored, again[0].sequence), (2, 2), "the window is off: stored twice"),
            _ => assert_eq!((stored, again[0].sequence, again[0].duplicate), (1, first[0].sequence, true)),
        }
    }
}

/// A segment also rolls at an append once it is older than
/// `segment_max_age`, so `max_age` drops the events of a stream that
/// appends too slowly to fill segments (on the system clock, with wide
/// margins).
#[tokio::test]
async fn a_segment_rolls_by_age_so_max_age_acts_on_a_slow_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("native:{}?segment_max_age_ms=200&retention_interval_ms=0", dir.path().display());
    let rheo = Rheo::open(&url).await.expect("open");
    rheo.create_stream(S, StreamOptions::new().retention(Retention::new().max_age(Duration::from_millis(1500))))
        .await
        .expect("stream");
    rheo.append(S, &json!({"n": 1}), AppendOptions::new()).await.expect("append");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Older than 200 ms: the segment holding 1 rolls before 2 is written.
    rheo.append(S, &json!({"n": 2}), AppendOptions::new()).await.expect("append");
    let segments = |dir: &std::path::Path| {
        std::fs::read_dir(dir.join("streams/0000000000000001/00000"))
            .expect("list")
            .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log")))
            .count()
    };
    assert_eq!(segments(dir.path()), 2, "the old segment rolled");
    assert!(rheo.enforce_retention(S).await.expect("pass").dropped.is_empty(), "1 is younger than max_age");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let report = rheo.enforce_retention(S).await.expect("pass");
    assert_eq!(report.events_dropped(), 1, "{report:?}");
    let kept: Vec<u64> = rheo.read(S, 0, 0, 10).await.expect("read").iter().map(|e| e.sequence()).collect();
    assert_eq!(kept, vec![2], "the active segment stays, whatever its age");
}
