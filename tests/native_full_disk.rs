//! A full disk fails calls cleanly, under every durability and with
//! preallocation off: the error is `Error::NoSpace`, the directory is not
//! poisoned, everything acknowledged is kept, a call that failed changed
//! nothing (no event of a failed append exists, a lease whose ack failed is
//! still held and acks later, a failed fetch claimed nothing), and
//! everything works again once space is freed. (`FaultyVfs::set_capacity` simulates the disk: a
//! write past it stores what fits and fails, as `write(2)` does.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rheo::backends::native::NativeBackend;
use rheo::engine::vfs::{Fault, FaultyVfs, MemVfs};
use rheo::engine::{Durability, Engine, EngineOptions};
use rheo::{AppendOptions, Error, FetchOptions, GroupOptions, ManualClock, Rheo, StreamOptions, Timestamp};
use serde_json::json;

const S: &str = "s";
const G: &str = "g";

fn open(faulty: &FaultyVfs, opts: &EngineOptions, clock: &ManualClock) -> (Engine, Rheo) {
    let engine = Engine::open(Arc::new(faulty.clone()), opts.clone()).expect("open");
    let backend = NativeBackend::with_engine(engine.clone(), Arc::new(clock.clone()));
    let rheo = Rheo::builder().clock(Arc::new(clock.clone())).with_backend(Arc::new(backend)).expect("rheo");
    (engine, rheo)
}

/// What the scenario saw acknowledged: per partition, the sequences of
/// appends that returned Ok, and the acks that returned Ok.
#[derive(Default, Debug)]
struct Acknowledged {
    appended: BTreeMap<u32, Vec<u64>>,
    acked: BTreeMap<u32, Vec<u64>>,
    /// Leases whose ack failed: still held.
    failed_acks: Vec<rheo::Lease>,
    no_space: usize,
}

async fn work(rheo: &Rheo, engine: &Engine, seen: &mut Acknowledged, rounds: usize, round: &mut u64) {
    for _ in 0..rounds {
        *round += 1;
        let pad = "x".repeat(60 + usize::try_from(*round % 150).expect("small"));
        // A single append, then a batch over both partitions.
        let one = rheo.append(S, &json!({"r": *round, "pad": pad}), AppendOptions::new().partition(0)).await;
        let batch = rheo
            .append_batch_with(
                S,
                (0..4u32).map(|i| (json!({"r": *round, "i": i, "pad": pad}), AppendOptions::new().partition(i % 2))),
            )
            .await;
        for r in [one.map(|e| vec![e]), batch] {
            match r {
                Ok(events) => {
                    events.iter().for_each(|e| seen.appended.entry(e.partition()).or_default().push(e.sequence()))
                }
                Err(e @ Error::NoSpace { .. }) => {
                    // The cause is recognisable down to the system's error.
                    assert_eq!(e.io_error_kind(), Some(std::io::ErrorKind::StorageFull), "round {round}: {e}");
                    seen.no_space += 1;
                }
                Err(e) => panic!("round {round}: an append failed with {e:?}, not NoSpace"),
            }
        }
        match rheo.fetch(S, G, FetchOptions::new().limit(3).lease(Duration::from_secs(600))).await {
            Ok(leases) => {
                for l in leases {
                    match rheo.ack(&l).await {
                        Ok(()) => seen.acked.entry(l.partition()).or_default().push(l.sequence()),
                        Err(Error::NoSpace { .. }) => {
                            seen.no_space += 1;
                            seen.failed_acks.push(l);
                        }
                        Err(e) => panic!("round {round}: an ack failed with {e:?}, not NoSpace"),
                    }
                }
            }
            Err(Error::NoSpace { .. }) => seen.no_space += 1,
            Err(e) => panic!("round {round}: a fetch failed with {e:?}, not NoSpace"),
        }
        assert_eq!(engine.poisoned(), None, "round {round}: a full disk never poisons");
    }
}

/// Every acknowledged append and ack is there, and nothing else: the
/// events are exactly the acknowledged appends (contiguous), and the
/// deliveries in flight exactly the leases whose ack failed.
async fn check(rheo: &Rheo, seen: &Acknowledged, what: &str) {
    for p in 0..2u32 {
        let events = rheo.read(S, p, 0, 10_000).await.expect("read");
        let seqs: Vec<u64> = events.iter().map(|e| e.sequence()).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{what}: partition {p} is contiguous");
        let acknowledged = seen.appended.get(&p).cloned().unwrap_or_default();
        assert_eq!(seqs, acknowledged, "{what}: partition {p} holds exactly the acknowledged appends");
    }
    let info = rheo.group_info(S, G).await.expect("group info");
    assert_eq!(info.inflight, seen.failed_acks.len() as u64, "{what}: in flight: the leases whose ack failed");
    let lag = rheo.lag(S, G).await.expect("lag");
    for p in 0..2u32 {
        let frontier = lag.partitions.iter().find(|l| l.partition == p).map_or(0, |l| l.frontier);
        // Nothing is dead-lettered here: the frontier is the end of the
        // acknowledged acks' prefix, exactly.
        let acked: std::collections::BTreeSet<u64> = seen.acked.get(&p).into_iter().flatten().copied().collect();
        let want = (1..).find(|s| !acked.contains(s)).map_or(0, |s| s - 1);
        assert_eq!(frontier, want, "{what}: acks of partition {p} kept, and only they (acked {acked:?})");
    }
}

fn scenario(name: &str, opts: EngineOptions) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let clock = ManualClock::new(Timestamp::from_millis(1_767_225_600_000));
    let mem = MemVfs::new();
    let faulty = FaultyVfs::new(mem.clone(), Fault::Crash, 0, 1);
    let mut seen = Acknowledged::default();
    let mut round = 0;
    rt.block_on(async {
        let (engine, rheo) = open(&faulty, &opts, &clock);
        rheo.create_stream(S, StreamOptions::new().partitions(2)).await.expect("stream");
        rheo.create_group(S, G, GroupOptions::new()).await.expect("group");
        work(&rheo, &engine, &mut seen, 20, &mut round).await;
        assert_eq!(seen.no_space, 0, "{name}: room enough at first");
        // Leases held while the disk fills, acked in between.
        let mut held =
            rheo.fetch(S, G, FetchOptions::new().limit(60).lease(Duration::from_secs(600))).await.expect("fetch");
        // The disk fills up: a little room left, then none.
        for slack in [8 << 10, 2 << 10, 0] {
            faulty.set_capacity(Some(mem.live_bytes() + slack));
            work(&rheo, &engine, &mut seen, 60, &mut round).await;
            for l in held.drain(..20.min(held.len())) {
                match rheo.ack(&l).await {
                    Ok(()) => seen.acked.entry(l.partition()).or_default().push(l.sequence()),
                    Err(Error::NoSpace { .. }) => {
                        seen.no_space += 1;
                        seen.failed_acks.push(l);
                    }
                    Err(e) => panic!("{name}: an ack failed with {e:?}, not NoSpace"),
                }
            }
            let _ = engine.checkpoint(S); // may fail for space; never poisons
            assert_eq!(engine.poisoned(), None, "{name}: a checkpoint on a full disk does not poison");
        }
        assert!(seen.no_space > 0, "{name}: the disk did fill up");
        check(&rheo, &seen, &format!("{name}, disk full")).await;
        // Space is freed: everything works again, and a lease whose ack
        // failed is still held (a second ack would be stale).
        faulty.set_capacity(None);
        eprintln!("{name}: {} acks met the full disk", seen.failed_acks.len());
        // (Under Sync with preallocation, the held leases' acks all fit in
        // space the WAL had reserved before the disk filled.)
        let reserved = opts.durability == Durability::Sync && opts.preallocate_bytes > 0;
        assert!(reserved || !seen.failed_acks.is_empty(), "{name}: some ack met the full disk");
        for l in std::mem::take(&mut seen.failed_acks) {
            rheo.ack(&l).await.unwrap_or_else(|e| panic!("{name}: the ack that failed works now: {e}"));
            seen.acked.entry(l.partition()).or_default().push(l.sequence());
        }
        let before = seen.no_space;
        work(&rheo, &engine, &mut seen, 30, &mut round).await;
        assert_eq!(seen.no_space, before, "{name}: no more NoSpace once space is freed");
        engine.checkpoint(S).expect("a checkpoint works again");
        check(&rheo, &seen, &format!("{name}, space freed")).await;
        drop((engine, rheo));
        // A process crash loses nothing acknowledged, in every mode.
        let (_engine, rheo) = open(&faulty, &opts, &clock);
        check(&rheo, &seen, &format!("{name}, reopened")).await;
    });
    if opts.durability == Durability::Sync {
        // And under Sync a power cut loses nothing acknowledged either.
        mem.crash();
        let faulty = FaultyVfs::new(mem.clone(), Fault::Crash, 0, 1);
        rt.block_on(async {
            let (_engine, rheo) = open(&faulty, &opts, &clock);
            check(&rheo, &seen, &format!("{name}, after a power cut")).await;
        });
    }
}

fn opts(durability: Durability, preallocate_bytes: u64) -> EngineOptions {
    EngineOptions::default()
        .durability(durability)
        .preallocate_bytes(preallocate_bytes)
        .segment_bytes(8 << 10)
        .checkpoint_bytes(16 << 10)
        .background_indexing(false)
}

#[test]
fn a_full_disk_under_sync_with_preallocation_fails_calls_cleanly() {
    scenario("sync, preallocated", opts(Durability::Sync, 16 << 10));
}

#[test]
fn a_full_disk_under_sync_without_preallocation_fails_calls_cleanly() {
    scenario("sync, no preallocation", opts(Durability::Sync, 0));
}

#[test]
fn a_full_disk_under_batched_fails_calls_cleanly() {
    scenario("batched", opts(Durability::Batched { max_delay: Duration::from_millis(2) }, 16 << 10));
}

#[test]
fn a_full_disk_under_none_fails_calls_cleanly() {
    scenario("none", opts(Durability::None, 16 << 10));
}
