//! Damage stays where it is: a record that fails its checksum blocks only
//! its own position. Fetches claim what they can read and report the rest
//! (nothing claimed, no attempt counted), other partitions and positions
//! keep flowing, the consumer runtime goes on, an operator skips the
//! position, and the dead-letter listing shows it with its damage. Reads
//! and queries that meet damage fail with the file and offset and change
//! nothing.

use std::sync::Arc;
use std::time::Duration;

use rheo::backends::native::NativeBackend;
use rheo::engine::segment::format::{FRAME_LEN, HDR_BASE_SEQ, HEADER_LEN};
use rheo::engine::segment::record::{Decoded, decode_record};
use rheo::engine::vfs::{Fault, FaultyVfs, MemVfs, Vfs};
use rheo::engine::{Engine, EngineOptions, RecoveryMode};
use rheo::{
    AppendOptions, DeadLetterOptions, Error, FetchOptions, GroupOptions, Lease, ManualClock, Outcome, Query,
    ReplayOptions, Rheo, StreamOptions, Timestamp, handler_fn,
};
use serde_json::json;

const S: &str = "orders";
const G: &str = "billing";
const START: Timestamp = Timestamp::from_millis(1_767_225_600_000);

/// A native data directory in memory, reopened at will.
struct Dir {
    mem: MemVfs,
    clock: ManualClock,
}

impl Dir {
    fn new() -> Dir {
        Dir { mem: MemVfs::new(), clock: ManualClock::new(START) }
    }

    /// Small segments (4 KiB, about 25 of these events) so that most
    /// records are in sealed segments.
    fn opts() -> EngineOptions {
        EngineOptions::default().segment_bytes(4096).background_indexing(false)
    }

    fn open_with(&self, vfs: Arc<dyn Vfs>, opts: EngineOptions) -> rheo::Result<(Engine, Rheo)> {
        let engine = Engine::open(vfs, opts)?;
        let backend = NativeBackend::with_engine(engine.clone(), Arc::new(self.clock.clone()));
        let rheo = Rheo::builder().clock(Arc::new(self.clock.clone())).with_backend(Arc::new(backend))?;
        Ok((engine, rheo))
    }

    fn open(&self) -> (Engine, Rheo) {
        self.open_with(Arc::new(self.mem.clone()), Dir::opts()).expect("open")
    }

    /// A stream of `partitions` partitions with `n` events in each, and a
    /// group of `max_attempts`.
    async fn fill(&self, rheo: &Rheo, partitions: u32, n: u64, max_attempts: u32) {
        rheo.create_stream(S, StreamOptions::new().partitions(partitions)).await.expect("stream");
        rheo.create_group(S, G, GroupOptions::new().max_attempts(max_attempts)).await.expect("group");
        for p in 0..partitions {
            for i in 1..=n {
                let event = json!({"p": p, "i": i, "pad": "x".repeat(100)});
                rheo.append(S, &event, AppendOptions::new().partition(p)).await.expect("append");
            }
        }
    }

    /// The segment file and byte offset of the record `seq` of partition `p`.
    fn locate(&self, engine: &Engine, p: u32, seq: u64) -> (String, usize) {
        let stream = engine.stream(S).expect("stream");
        let log = &stream.log;
        for seg in log.partition(p).expect("partition").segments() {
            let bytes = self.mem.read_file(seg.path()).expect("segment");
            let mut at = HEADER_LEN;
            while let Decoded::Record { header, size, .. } = decode_record(&bytes[at..]) {
                if header.seq == seq {
                    return (seg.path().to_owned(), at);
                }
                at += size;
            }
        }
        panic!("no record {seq} in partition {p}");
    }

    /// Flips one byte of the body of record `seq` of partition `p` (its
    /// checksum then fails); returns the file and the record's offset.
    fn damage(&self, engine: &Engine, p: u32, seq: u64) -> (String, u64) {
        self.damage_at(engine, p, seq, FRAME_LEN + 30)
    }

    /// Flips the byte `within` bytes into record `seq` of partition `p`.
    fn damage_at(&self, engine: &Engine, p: u32, seq: u64, within: usize) -> (String, u64) {
        let (path, at) = self.locate(engine, p, seq);
        let mut bytes = self.mem.read_file(&path).expect("segment");
        bytes[at + within] ^= 0x5a;
        self.mem.write_file(&path, &bytes).expect("write");
        (path, at as u64)
    }
}

fn positions(leases: &[Lease]) -> Vec<(u32, u64)> {
    leases.iter().map(|l| (l.partition(), l.sequence())).collect()
}

fn range(p: u32, seqs: impl IntoIterator<Item = u64>) -> Vec<(u32, u64)> {
    seqs.into_iter().map(|s| (p, s)).collect()
}

/// The case of issue 11: two partitions of 40 events, one flipped byte in
/// partition 0's record 6 (a sealed segment), `max_attempts` 2, lease 1 s.
/// No healthy event is dead-lettered, partition 1 is consumed whole,
/// nothing is claimed for the damaged position, and it can be skipped and
/// is then listed with its damage.
#[tokio::test]
async fn a_damaged_record_blocks_only_its_own_position() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 2, 40, 2).await;
    let (path, offset) = dir.damage(&engine, 0, 6);
    let seg = engine.stream(S).expect("stream").log.partition(0).expect("p0").segments()[0].clone();
    assert!(seg.footer().is_some(), "record 6 is in a sealed segment");

    let lease = Duration::from_secs(1);
    let report = rheo.fetch_report(S, G, FetchOptions::new().limit(100).lease(lease)).await.expect("fetch");
    let mut want = range(0, (1..=5).chain(7..=40));
    want.extend(range(1, 1..=40));
    assert_eq!(positions(&report.leases), want, "every readable position, in order");
    assert_eq!(report.damaged.len(), 1);
    let d = &report.damaged[0];
    assert_eq!((d.stream.as_ref(), d.partition, d.sequence, d.offset), (S, 0, 6, offset));
    assert!(d.file.to_string_lossy().ends_with(&path), "{d}");
    assert!(d.reason.contains("checksum"), "{d}");
    let info = rheo.group_info(S, G).await.expect("info");
    assert_eq!(info.inflight, 79, "nothing claimed for the damaged position");

    // Two lease expiries later, with every healthy delivery acked, nothing
    // was dead-lettered: the damaged position was never handed out.
    for l in &report.leases {
        rheo.ack(l).await.expect("ack");
    }
    for _ in 0..3 {
        dir.clock.advance(Duration::from_secs(2));
        let again = rheo.fetch_report(S, G, FetchOptions::new().limit(100).lease(lease)).await.expect("fetch");
        assert!(again.leases.is_empty());
        assert_eq!(again.damaged.iter().map(|d| (d.partition, d.sequence)).collect::<Vec<_>>(), vec![(0, 6)]);
    }
    assert!(rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dead letters").is_empty());
    let lag = rheo.lag(S, G).await.expect("lag");
    assert_eq!(
        lag.partitions.iter().map(|p| (p.partition, p.frontier, p.lag)).collect::<Vec<_>>(),
        vec![(0, 5, 35), (1, 40, 0)],
        "the hole at 6 holds partition 0's frontier; partition 1 is done"
    );
    assert_eq!(rheo.fetch(S, G, FetchOptions::new()).await.expect("the plain fetch too").len(), 0);

    // The state survives a reopen (the passed-over position is in the WAL).
    drop((engine, rheo));
    let (engine, rheo) = dir.open();
    let info = rheo.group_info(S, G).await.expect("info");
    assert_eq!((info.inflight, info.dead_letters, info.lag.total), (0, 0, 35));

    // The operator skips it: the frontier passes, the listing shows it.
    assert!(rheo.skip(S, G, 0, 6, "checksum mismatch, event restored by hand").await.expect("skip"));
    assert_eq!(rheo.lag(S, G).await.expect("lag").total, 0);
    let dead = rheo.dead_letters(S, G, DeadLetterOptions::new()).await.expect("dead letters");
    assert_eq!(dead.len(), 1);
    let dl = &dead[0];
    assert_eq!((dl.partition, dl.sequence, dl.attempts, dl.event.is_none()), (0, 6, 0, true));
    assert_eq!(dl.reason, "skipped: checksum mismatch, event restored by hand");
    let damage = dl.damage.as_ref().expect("the damage is listed");
    assert_eq!((damage.sequence, damage.offset), (6, offset));
    assert!(rheo.fetch_report(S, G, FetchOptions::new()).await.expect("fetch").damaged.is_empty());
    drop(engine);
}

/// The consumer runtime serves every healthy position of every partition,
/// counts the damaged one, and does not stop or back off because of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_runtime_keeps_serving_healthy_partitions() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 2, 40, 2).await;
    dir.damage(&engine, 0, 6);
    let handled = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = handled.clone();
    let handle = rheo
        .consumer(S, G)
        .concurrency(4)
        .max_demand(16)
        .poll(Duration::from_millis(10))
        .spawn(handler_fn(move |_lease| {
            let count = count.clone();
            async move {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while rheo.lag(S, G).await.expect("lag").total > 35 || handled.load(std::sync::atomic::Ordering::SeqCst) < 79 {
        assert!(std::time::Instant::now() < deadline, "the healthy events are consumed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A new event in the damaged partition, after the damage, flows too.
    rheo.append(S, &json!({"late": true}), AppendOptions::new().partition(0)).await.expect("append");
    while handled.load(std::sync::atomic::Ordering::SeqCst) < 80 {
        assert!(std::time::Instant::now() < deadline, "a later event is consumed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let summary = handle.shutdown().await.expect("shutdown");
    assert_eq!((summary.acked, summary.fetch_errors, summary.dead_lettered), (80, 0, 0), "{summary:?}");
    assert!(summary.damaged >= 1, "{summary:?}");
    assert_eq!(rheo.group_info(S, G).await.expect("info").dead_letters, 0);
}

/// Damage to a record's length field (the record's end is lost too): the
/// read resynchronises at the next record it can trust, so only the
/// damaged position is withheld.
#[tokio::test]
async fn damage_to_a_length_field_is_stepped_over() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 1, 60, 5).await;
    // A length in range but wrong: the record's frame claims 3 bytes more.
    let (path, at) = dir.locate(&engine, 0, 9);
    let mut bytes = dir.mem.read_file(&path).expect("segment");
    let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    bytes[at..at + 4].copy_from_slice(&(len + 3).to_le_bytes());
    dir.mem.write_file(&path, &bytes).expect("write");
    // And a length of garbage in another segment's record.
    let (path2, at2) = dir.locate(&engine, 0, 40);
    let mut bytes2 = dir.mem.read_file(&path2).expect("segment");
    bytes2[at2 + 3] = 0x7f;
    dir.mem.write_file(&path2, &bytes2).expect("write");

    let report = rheo.fetch_report(S, G, FetchOptions::new().limit(100)).await.expect("fetch");
    let damaged: Vec<u64> = report.damaged.iter().map(|d| d.sequence).collect();
    assert_eq!(damaged, vec![9, 40]);
    let want: Vec<u64> = (1..=60).filter(|s| ![9, 40].contains(s)).collect();
    assert_eq!(report.leases.iter().map(Lease::sequence).collect::<Vec<_>>(), want);
    // Reading from after the damage works; reading over it fails, naming it.
    let after = rheo.read(S, 0, 9, 5).await.expect("read after the damage");
    assert_eq!(after.iter().map(|e| e.sequence()).collect::<Vec<_>>(), vec![10, 11, 12, 13, 14]);
    match rheo.read(S, 0, 5, 10).await {
        Err(Error::Corrupt { file, offset, .. }) => {
            assert!(file.to_string_lossy().ends_with(&path));
            assert_eq!(offset, at as u64);
        }
        other => panic!("a read over the damage: {other:?}"),
    }
}

/// A record damaged in the active segment while the engine runs (after its
/// recovery scan) is contained the same way.
#[tokio::test]
async fn damage_in_the_active_segment_is_contained() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 1, 10, 5).await;
    let seg = engine.stream(S).expect("stream").log.partition(0).expect("p0").segments();
    let (path, _) = dir.locate(&engine, 0, 10);
    assert!(seg.last().is_some_and(|s| s.path() == path && s.footer().is_none()), "10 is in the active segment");
    let (_, at) = dir.locate(&engine, 0, 9);
    let mut bytes = dir.mem.read_file(&path).expect("segment");
    bytes[at + FRAME_LEN + 30] ^= 1;
    // Written under the running engine (its handle sees the same bytes).
    let f = dir.mem.open(&path, false).expect("open");
    f.write_all_at(&bytes[at..at + 64], at as u64).expect("write");
    let report = rheo.fetch_report(S, G, FetchOptions::new().limit(100)).await.expect("fetch");
    assert_eq!(report.damaged.iter().map(|d| d.sequence).collect::<Vec<_>>(), vec![9]);
    assert_eq!(
        report.leases.iter().map(Lease::sequence).collect::<Vec<_>>(),
        (1..=10).filter(|&s| s != 9).collect::<Vec<_>>()
    );
}

/// Reads that meet damage change nothing: a query fails naming the file
/// and offset; a replay by query over the damage fails and reopens nothing;
/// the group's state is as before.
#[tokio::test]
async fn a_failing_query_or_replay_changes_nothing() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 1, 40, 5).await;
    let leases = rheo.fetch(S, G, FetchOptions::new().limit(40)).await.expect("fetch");
    for l in &leases {
        rheo.ack(l).await.expect("ack");
    }
    let (_, offset) = dir.damage(&engine, 0, 20);
    let before = rheo.group_info(S, G).await.expect("info");
    let wal_before = wal_bytes(&dir.mem);
    match rheo.query(&Query::new(S).eq("p", json!(0))).await {
        Err(Error::Corrupt { offset: o, .. }) => assert_eq!(o, offset),
        other => panic!("a query over the damage: {other:?}"),
    }
    match rheo.replay(S, G, ReplayOptions::query(Query::new(S).eq("p", json!(0)))).await {
        Err(Error::Corrupt { offset: o, .. }) => assert_eq!(o, offset),
        other => panic!("a replay by query over the damage: {other:?}"),
    }
    assert_eq!(rheo.group_info(S, G).await.expect("info"), before, "the group is as it was");
    assert_eq!(wal_bytes(&dir.mem), wal_before, "nothing was logged");
    // A replay by sequence reads nothing: it reopens, and the damaged
    // position is then reported by fetches, never claimed.
    assert_eq!(rheo.replay(S, G, ReplayOptions::from_sequence(0)).await.expect("replay"), 40);
    let report = rheo.fetch_report(S, G, FetchOptions::new().limit(100)).await.expect("fetch");
    assert_eq!(report.leases.len(), 39);
    assert_eq!(report.damaged.iter().map(|d| d.sequence).collect::<Vec<_>>(), vec![20]);
}

/// A read that fails (an I/O error, not damage) fails the fetch with
/// nothing claimed, no attempt counted and nothing logged.
#[tokio::test]
async fn a_failed_read_fails_the_fetch_and_claims_nothing() {
    let dir = Dir::new();
    let faulty = FaultyVfs::new(dir.mem.clone(), Fault::Crash, 0, 1);
    let (_engine, rheo) = dir.open_with(Arc::new(faulty.clone()), Dir::opts()).expect("open");
    dir.fill(&rheo, 1, 40, 5).await;
    let wal_before = wal_bytes(&dir.mem);
    faulty.fail_read_after(1);
    match rheo.fetch(S, G, FetchOptions::new().limit(40)).await {
        Err(Error::Failed { .. }) => {}
        other => panic!("a fetch whose read fails: {other:?}"),
    }
    assert_eq!(rheo.group_info(S, G).await.expect("info").inflight, 0);
    assert_eq!(wal_bytes(&dir.mem), wal_before, "nothing was logged");
    let leases = rheo.fetch(S, G, FetchOptions::new().limit(40)).await.expect("the next fetch");
    assert_eq!(leases.len(), 40);
    assert!(leases.iter().all(|l| l.attempt == 1), "no attempt was counted");
}

/// The delivery WAL's bytes (every generation), to show nothing was logged.
fn wal_bytes(mem: &MemVfs) -> Vec<u8> {
    let dir = "streams/0000000000000001/groups";
    let mut out = Vec::new();
    for name in mem.list(dir).expect("list") {
        if name.starts_with("wal-") {
            let bytes = mem.read_file(&format!("{dir}/{name}")).expect("wal");
            let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            out.extend_from_slice(&bytes[..end]);
        }
    }
    out
}

/// `recovery=strict` checks every record of every segment at open: a
/// flipped byte in a sealed segment fails the open, naming the file and
/// offset; the default mode opens and checks on read.
#[tokio::test]
async fn strict_recovery_refuses_a_damaged_sealed_segment_at_open() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 1, 40, 5).await;
    let (path, offset) = dir.damage(&engine, 0, 6);
    drop((engine, rheo));
    let strict = Dir::opts().recovery(RecoveryMode::Strict);
    match dir.open_with(Arc::new(dir.mem.clone()), strict) {
        Err(Error::Corrupt { file, offset: o, reason, .. }) => {
            assert!(file.to_string_lossy().ends_with(&path), "{file:?}");
            assert_eq!(o, offset, "{reason}");
        }
        other => panic!("strict open of a damaged segment: {:?}", other.map(|_| ())),
    }
    dir.open_with(Arc::new(dir.mem.clone()), Dir::opts()).expect("the default mode opens");
}

/// A sealed segment's header or footer (bit rot) does not make the
/// partition unreadable: the default mode opens, reads every event (a time
/// bound does not skip the segment whose largest timestamp is lost),
/// delivers them all and appends after them; strict refuses, naming the
/// file.
#[tokio::test]
async fn a_damaged_header_or_footer_of_a_sealed_segment_loses_nothing() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 1, 80, 5).await;
    let segs = engine.stream(S).expect("stream").log.partition(0).expect("p0").segments();
    assert!(segs.len() >= 3 && segs[1].footer().is_some(), "two sealed segments: {}", segs.len());
    let (head, foot) = (segs[0].path().to_owned(), segs[1].path().to_owned());
    drop((segs, engine, rheo));
    let mut bytes = dir.mem.read_file(&head).expect("segment");
    bytes[HDR_BASE_SEQ] ^= 0x10; // the header's base sequence
    dir.mem.write_file(&head, &bytes).expect("write");
    let mut bytes = dir.mem.read_file(&foot).expect("segment");
    let n = bytes.len();
    bytes[n - 64] ^= 0x01; // the footer's magic
    bytes[n - 30] ^= 0x01;
    dir.mem.write_file(&foot, &bytes).expect("write");

    let strict = Dir::opts().recovery(RecoveryMode::Strict);
    match dir.open_with(Arc::new(dir.mem.clone()), strict) {
        Err(Error::Corrupt { file, .. }) => assert!(file.to_string_lossy().ends_with(&head), "{file:?}"),
        other => panic!("strict open: {:?}", other.map(|_| ())),
    }
    let (_engine, rheo) = dir.open();
    let all = rheo.query(&Query::new(S).from(START).limit(1000)).await.expect("query");
    assert_eq!(all.iter().map(|e| e.sequence()).collect::<Vec<_>>(), (1..=80).collect::<Vec<_>>());
    let report = rheo.fetch_report(S, G, FetchOptions::new().limit(1000)).await.expect("fetch");
    assert_eq!(positions(&report.leases), range(0, 1..=80));
    assert!(report.damaged.is_empty(), "{:?}", report.damaged);
    let next = rheo.append(S, &json!({"after": true}), AppendOptions::new()).await.expect("append");
    assert_eq!(next.sequence(), 81);
}

/// Damage has its own budget per partition, not the fetch's limit: small
/// fetches deliver every readable position exactly once and report every
/// damaged one, whatever their pattern; more damage than one fetch's budget
/// in a partition stops that partition, not the others (not even one with
/// damage of its own).
#[tokio::test]
async fn small_fetches_deliver_every_readable_position_and_report_every_damaged_one() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 2, 120, 5).await;
    let damaged: Vec<u64> = [1, 2, 3, 5, 6].into_iter().chain(40..110).collect();
    // Located before any is damaged (the helper walks the records).
    let mut places: Vec<(String, usize)> = damaged.iter().map(|&seq| dir.locate(&engine, 0, seq)).collect();
    places.push(dir.locate(&engine, 1, 10));
    for (path, at) in places {
        let mut bytes = dir.mem.read_file(&path).expect("segment");
        bytes[at + FRAME_LEN + 30] ^= 0x5a;
        dir.mem.write_file(&path, &bytes).expect("write");
    }
    let mut delivered = std::collections::BTreeSet::new();
    let mut reported = std::collections::BTreeSet::new();
    let mut first = None;
    for round in 0..400 {
        let limit = [1, 4, 2, 7][round % 4];
        let report = rheo.fetch_report(S, G, FetchOptions::new().limit(limit)).await.expect("fetch");
        if round == 0 {
            first = Some(report.clone());
        }
        for l in &report.leases {
            assert!(delivered.insert((l.partition(), l.sequence())), "{l:?} delivered twice");
            rheo.ack(l).await.expect("ack");
        }
        reported.extend(report.damaged.iter().map(|d| (d.partition, d.sequence)));
        if report.leases.is_empty() {
            break;
        }
    }
    let first = first.expect("a first fetch");
    assert_eq!(positions(&first.leases), vec![(0, 4)], "limit 1: the first readable position");
    assert_eq!(first.damaged.iter().map(|d| d.sequence).collect::<Vec<_>>(), vec![1, 2, 3]);
    // Partition 0 stops at its 65th damaged position in one fetch (the 70
    // from 40 on stay due, and a fetch reads at most 64 of them): what is
    // after them waits; partition 1 flows all the same.
    let mut want: std::collections::BTreeSet<(u32, u64)> =
        (1..=120u64).filter(|s| *s < 40 && !damaged.contains(s)).map(|s| (0, s)).collect();
    want.extend((1..=120).filter(|s| *s != 10).map(|s| (1, s)));
    assert_eq!(delivered, want, "every readable position before the long damage, exactly once");
    let mut first_64: std::collections::BTreeSet<(u32, u64)> = damaged.iter().take(64).map(|&s| (0, s)).collect();
    first_64.insert((1, 10));
    assert_eq!(reported, first_64, "every damaged position a fetch reached is reported");
    let big = rheo.fetch_report(S, G, FetchOptions::new().limit(100)).await.expect("fetch");
    let per_part = |p: u32| big.damaged.iter().filter(|d| d.partition == p).count();
    assert_eq!((per_part(0), per_part(1)), (64, 1), "at most 64 damaged positions per partition per fetch");
    assert!(big.leases.is_empty());
    // Skipped, they let the rest through.
    for &seq in &damaged {
        rheo.skip(S, G, 0, seq, "restored elsewhere").await.expect("skip");
    }
    rheo.skip(S, G, 1, 10, "restored elsewhere").await.expect("skip");
    let rest = rheo.fetch_report(S, G, FetchOptions::new().limit(100)).await.expect("fetch");
    assert_eq!(positions(&rest.leases), range(0, 110..=120));
    assert!(rest.damaged.is_empty());
    for l in &rest.leases {
        rheo.ack(l).await.expect("ack");
    }
    assert_eq!(rheo.lag(S, G).await.expect("lag").total, 0);
}

/// Damage in a sealed segment whose sparse index is gone: the index is
/// rebuilt over the damage (in memory), and reads and fetches still reach
/// the positions after it.
#[tokio::test]
async fn damage_in_a_segment_whose_index_is_lost_is_still_contained() {
    let dir = Dir::new();
    let (engine, rheo) = dir.open();
    dir.fill(&rheo, 1, 60, 5).await;
    let (path, _) = dir.damage(&engine, 0, 5);
    drop((engine, rheo));
    let idx = path.replace(".log", ".idx");
    dir.mem.remove_file(&idx).expect("remove the index");
    let (_engine, rheo) = dir.open();
    let report = rheo.fetch_report(S, G, FetchOptions::new().limit(100)).await.expect("fetch");
    assert_eq!(report.damaged.iter().map(|d| d.sequence).collect::<Vec<_>>(), vec![5]);
    assert_eq!(report.leases.len(), 59);
    assert!(dir.mem.read_file(&idx).is_none(), "an index built over damage is not written");
    let after = rheo.read(S, 0, 5, 3).await.expect("read after the damage");
    assert_eq!(after.iter().map(|e| e.sequence()).collect::<Vec<_>>(), vec![6, 7, 8]);
}
