//! Bit rot in sealed data, in seeded scenarios: a data directory with two
//! partitions of events in small (sealed) segments, their index files, and
//! two consumer groups (one with acks, checkpointed); then one to three bits
//! flipped in one file: a sealed segment's records, header or footer, its
//! sparse index (`.idx`), its secondary index (`.six`), or the groups'
//! checkpoint. What must hold, in every scenario:
//!
//! - nothing panics; an open that fails says `Error::Corrupt` (or
//!   `UnsupportedVersion`) naming the damaged file;
//! - damage in records is never skipped: when the records of a sealed
//!   segment were hit, at least one position reads as `Error::Corrupt`
//!   naming that file and an offset inside it; every other position reads
//!   exactly the event appended there (never a wrong one);
//! - derived files (`.idx`, `.six`) never lose a position: they are
//!   rebuilt or bypassed;
//! - a fetch claims exactly the readable due positions and reports the
//!   damaged ones (nothing claimed for them); a query over the damage fails
//!   naming the file, or returns exactly the events;
//! - `recovery=strict` refuses at open any damage in a sealed segment.
//!
//! `RHEO_ROT_SCENARIOS` sets how many (default 150), `RHEO_ROT_FIRST_SEED`
//! the first seed (default 0); `RHEO_ROT_SEED`
//! replays one.

use std::collections::BTreeMap;
use std::sync::Arc;

use rheo::backends::native::NativeBackend;
use rheo::engine::vfs::{MemVfs, Vfs};
use rheo::engine::{Engine, EngineOptions, RecoveryMode};
use rheo::{AppendOptions, Error, FetchOptions, GroupOptions, ManualClock, Query, Rheo, StreamOptions, Timestamp};
use serde_json::{Value, json};

#[path = "common/rng.rs"]
mod rng;
use rng::{Rng, env_u64};

const S: &str = "rot";
const PARTS: u32 = 2;

/// The file a scenario damages, and where.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    Records,
    Header,
    Footer,
    SparseIndex,
    SecondaryIndex,
    Checkpoint,
}

const TARGETS: [Target; 6] =
    [Target::Records, Target::Header, Target::Footer, Target::SparseIndex, Target::SecondaryIndex, Target::Checkpoint];

fn opts(recovery: RecoveryMode) -> EngineOptions {
    EngineOptions::default()
        .segment_bytes(2048)
        .preallocate_bytes(1024)
        .background_indexing(false)
        .inline_io(true)
        .recovery(recovery)
}

fn open(mem: &MemVfs, recovery: RecoveryMode) -> rheo::Result<(Engine, Rheo)> {
    let engine = Engine::open(Arc::new(mem.clone()), opts(recovery))?;
    let clock = ManualClock::new(Timestamp::from_millis(1_767_225_600_000));
    let backend = NativeBackend::with_engine(engine.clone(), Arc::new(clock.clone()));
    let rheo = Rheo::builder().clock(Arc::new(clock)).with_backend(Arc::new(backend))?;
    Ok((engine, rheo))
}

/// Per partition, the events appended: sequence -> (id, payload).
type Log = Vec<BTreeMap<u64, (String, Value)>>;

/// Builds the directory; returns what was appended.
async fn build(mem: &MemVfs, rng: &mut Rng) -> Log {
    let (engine, rheo) = open(mem, RecoveryMode::TolerateTornTail).expect("open");
    rheo.create_stream(S, StreamOptions::new().partitions(PARTS).indexes(["n"])).await.expect("stream");
    rheo.create_group(S, "acked", GroupOptions::new()).await.expect("group");
    rheo.create_group(S, "fresh", GroupOptions::new()).await.expect("group");
    let mut log: Log = vec![BTreeMap::new(); PARTS as usize];
    for i in 0..rng.range(60, 140) {
        let p = u32::try_from(rng.range(0, u64::from(PARTS) - 1)).expect("partition");
        let pad = "x".repeat(usize::try_from(rng.range(0, 120)).expect("pad"));
        let payload = json!({"n": i % 7, "i": i, "pad": pad});
        let e = rheo.append(S, &payload, AppendOptions::new().partition(p).id(format!("e{i}"))).await.expect("append");
        log[p as usize].insert(e.sequence(), (e.id().to_owned(), payload));
    }
    let leases = rheo.fetch(S, "acked", FetchOptions::new().limit(40)).await.expect("fetch");
    for l in leases.iter().filter(|_| rng.chance(2, 3)) {
        rheo.ack(l).await.expect("ack");
    }
    engine.checkpoint(S).expect("checkpoint");
    engine.build_indexes().expect("indexes");
    log
}

/// A sealed segment's path and, for the target, the byte range to damage
/// in the file the target names (which may be another file of it).
fn pick(
    mem: &MemVfs,
    engine: &Engine,
    target: Target,
    rng: &mut Rng,
) -> Option<(String, std::ops::Range<usize>, bool)> {
    let stream = engine.stream(S).ok()?;
    let log = &stream.log;
    if target == Target::Checkpoint {
        let dir = format!("{}/groups", log.dir());
        let name = mem.list(&dir).ok()?.into_iter().find(|n| n.ends_with(".ckpt"))?;
        let path = format!("{dir}/{name}");
        let len = mem.read_file(&path)?.len();
        return Some((path, 0..len, false));
    }
    let mut sealed = Vec::new();
    for p in 0..PARTS {
        sealed.extend(log.partition(p).ok()?.segments().into_iter().filter(|s| s.footer().is_some()));
    }
    if sealed.is_empty() {
        return None;
    }
    let seg = &sealed[usize::try_from(rng.range(0, sealed.len() as u64 - 1)).ok()?];
    let footer = seg.footer()?;
    let end = usize::try_from(footer.records_end).ok()?;
    let log_path = seg.path().to_owned();
    let len = mem.read_file(&log_path)?.len();
    Some(match target {
        Target::Records => (log_path, 64..end, true),
        Target::Header => (log_path, 0..64, true),
        Target::Footer => (log_path, end..len, true),
        Target::SparseIndex => {
            let idx = log_path.replace(".log", ".idx");
            let n = mem.read_file(&idx)?.len();
            (idx, 0..n, false)
        }
        Target::SecondaryIndex => {
            let six = seg.six_path();
            let n = mem.read_file(&six)?.len();
            (six, 0..n, false)
        }
        Target::Checkpoint => unreachable!("above"),
    })
}

fn names_file(e: &Error, path: &str) -> bool {
    match e {
        Error::Corrupt { file, .. } | Error::UnsupportedVersion { file, .. } => file.to_string_lossy().ends_with(path),
        _ => false,
    }
}

async fn scenario(seed: u64) -> Result<(&'static str, u64), String> {
    let mut rng = Rng::new(seed, 0);
    let mem = MemVfs::new();
    let log = build(&mem, &mut rng).await;
    let target = TARGETS[usize::try_from(seed % TARGETS.len() as u64).expect("target")];
    let (engine, _) = open(&mem, RecoveryMode::TolerateTornTail).map_err(|e| format!("the healthy directory: {e}"))?;
    let Some((path, range, in_segment)) = pick(&mem, &engine, target, &mut rng) else {
        return Ok(("nothing sealed to damage", 0));
    };
    drop(engine);
    let mut bytes = mem.read_file(&path).ok_or("the file")?;
    let flips = rng.range(1, 3);
    let mut flipped = Vec::new();
    for _ in 0..flips {
        let at = usize::try_from(rng.range(range.start as u64, range.end as u64 - 1)).expect("offset");
        bytes[at] ^= 1 << rng.range(0, 7);
        flipped.push(at);
    }
    mem.write_file(&path, &bytes).map_err(|e| e.to_string())?;
    let what = format!("{target:?} of {path} at {flipped:?}");

    // Strict: any damage in a sealed segment is refused at open.
    match (open(&mem, RecoveryMode::Strict), in_segment) {
        (Err(e), true) if names_file(&e, &path) => {}
        (Err(e), _) if target == Target::Checkpoint && names_file(&e, &path) => {}
        (Ok(_), false) if target != Target::Checkpoint => {}
        (r, _) => return Err(format!("{what}: a strict open gave {:?}", r.map(|_| ()))),
    }

    let (engine, rheo) = match open(&mem, RecoveryMode::TolerateTornTail) {
        Ok(opened) => opened,
        // The checkpoint is checked at open; so are a checkpoint's and a
        // segment header's format version (a flip there reads as another
        // format). A sealed
        // segment's damaged header or footer otherwise opens: its bounds
        // come from its name and the next segment.
        Err(e @ Error::Corrupt { .. }) if target == Target::Checkpoint && names_file(&e, &path) => {
            return Ok(("refused at open, naming the file", 0));
        }
        Err(e @ Error::UnsupportedVersion { .. })
            if matches!(target, Target::Header | Target::Checkpoint) && names_file(&e, &path) =>
        {
            return Ok(("refused at open: the version field", 0));
        }
        Err(e) => return Err(format!("{what}: the open failed: {e}")),
    };
    if target == Target::Checkpoint {
        return Err(format!("{what}: a damaged checkpoint opened"));
    }
    // Every position: the exact event, or damage naming the file.
    let mut damaged = BTreeMap::new();
    for p in 0..PARTS {
        let part = engine.stream(S).map_err(|e| e.to_string())?;
        let seqs: Vec<u64> = log[p as usize].keys().copied().collect();
        let read =
            part.log.partition(p).map_err(|e| e.to_string())?.read_each(&seqs).map_err(|e| format!("{what}: {e}"))?;
        for (seq, r) in seqs.iter().zip(read) {
            let (id, payload) = &log[p as usize][seq];
            match r {
                Ok(rec) => {
                    let e = rec.into_event(&S.into(), p);
                    if e.id() != id || e.payload() != payload {
                        return Err(format!("{what}: {p}/{seq} reads as {:?}, not {id}", e.id()));
                    }
                }
                Err(e @ Error::Corrupt { .. }) if names_file(&e, &path) => {
                    let Error::Corrupt { offset, .. } = &e else { unreachable!() };
                    if *offset >= bytes.len() as u64 {
                        return Err(format!("{what}: {p}/{seq}: an offset past the file: {e}"));
                    }
                    damaged.insert((p, *seq), e);
                }
                Err(e) => return Err(format!("{what}: {p}/{seq} fails with {e}, which does not name the file")),
            }
        }
    }
    if target == Target::Records && damaged.is_empty() {
        return Err(format!("{what}: damage in records went unnoticed"));
    }
    if target != Target::Records && !damaged.is_empty() {
        return Err(format!("{what}: damage outside the records lost positions: {:?}", damaged.keys()));
    }
    // A fetch claims exactly the readable positions and reports the others.
    let report = rheo.fetch_report(S, "fresh", FetchOptions::new().limit(10_000)).await.map_err(|e| e.to_string())?;
    let claimed: Vec<(u32, u64)> = report.leases.iter().map(|l| (l.partition(), l.sequence())).collect();
    let mut want: Vec<(u32, u64)> = Vec::new();
    for p in 0..PARTS {
        want.extend(log[p as usize].keys().map(|&s| (p, s)).filter(|k| !damaged.contains_key(k)));
    }
    if claimed != want {
        return Err(format!("{what}: the fetch claimed {claimed:?}, not the readable {want:?}"));
    }
    let reported: Vec<(u32, u64)> = report.damaged.iter().map(|d| (d.partition, d.sequence)).collect();
    if reported != damaged.keys().copied().collect::<Vec<_>>() {
        return Err(format!("{what}: the fetch reported {reported:?} as damaged, not {:?}", damaged.keys()));
    }
    // A query over everything: every event, or the damage.
    match rheo.query(&Query::new(S).limit(rheo::MAX_LIMIT)).await {
        Ok(events) if damaged.is_empty() && events.len() == log.iter().map(BTreeMap::len).sum::<usize>() => {}
        Err(e) if !damaged.is_empty() && names_file(&e, &path) => {}
        other => return Err(format!("{what}: a query answered {:?}", other.map(|v| v.len()))),
    }
    let kind = if damaged.is_empty() { "opened, nothing lost" } else { "opened, damage contained" };
    Ok((kind, damaged.len() as u64))
}

#[test]
fn bit_rot_in_sealed_data_is_reported_with_its_file_never_skipped() {
    let seeds: Vec<u64> = match env_u64("RHEO_ROT_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("RHEO_ROT_FIRST_SEED").unwrap_or(0);
            (first..first + env_u64("RHEO_ROT_SCENARIOS").unwrap_or(150)).collect()
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut outcomes: BTreeMap<&str, u64> = BTreeMap::new();
    let mut positions = 0;
    let mut failures = Vec::new();
    for &seed in &seeds {
        match rt.block_on(scenario(seed)) {
            Ok((kind, n)) => {
                *outcomes.entry(kind).or_default() += 1;
                positions += n;
            }
            Err(msg) => failures.push(format!("seed {seed}: {msg}")),
        }
    }
    println!("bit rot: {} scenarios: {outcomes:?}, {positions} damaged positions contained", seeds.len());
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}\nreplay one: RHEO_ROT_SEED=<seed> cargo test --test crash_bit_rot -- --nocapture",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
    if seeds.len() >= 60 {
        assert!(outcomes.get("opened, damage contained").copied().unwrap_or(0) > 0, "{outcomes:?}");
        assert!(outcomes.get("refused at open, naming the file").copied().unwrap_or(0) > 0, "{outcomes:?}");
        assert!(outcomes.get("opened, nothing lost").copied().unwrap_or(0) > 0, "{outcomes:?}");
    }
}
