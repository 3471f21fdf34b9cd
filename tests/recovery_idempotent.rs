//! Opening a recovered directory again changes nothing. For every seed: a
//! data directory written by a random workload (appends to one or several
//! partitions, group calls, checkpoints, a second stream; `Sync`, `Batched`
//! or `None`), then a power cut (the OS having written back a random part of
//! what was not synced) and perhaps damage to the newest files' tails (a
//! torn write: a cut, zeros, a flipped byte). The first open recovers (or
//! refuses); then:
//!
//! - a directory the first open recovered opens again with the same events,
//!   the same group state (lag, in flight, waiting, dead letters) and the
//!   same bytes in every file: recovery is idempotent;
//! - a directory the first open refused is refused again with the same
//!   error (file and offset).
//!
//! `RHEO_REOPEN_SCENARIOS` sets how many (default 120),
//! `RHEO_REOPEN_FIRST_SEED` the first seed (default 0); `RHEO_REOPEN_SEED`
//! replays one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rheo::backends::native::NativeBackend;
use rheo::engine::vfs::MemVfs;
use rheo::engine::{Durability, Engine, EngineOptions, RecoveryMode};
use rheo::{
    AppendOptions, DeadLetterOptions, Error, FetchOptions, GroupOptions, ManualClock, Rheo, StreamOptions, Timestamp,
};
use serde_json::json;

#[path = "common/rng.rs"]
mod rng;
use rng::{Rng, env_u64};

#[path = "common/crash.rs"]
mod crash;

const STREAMS: [&str; 2] = ["a", "b"];

fn options(durability: Durability, recovery: RecoveryMode, inline_io: bool) -> EngineOptions {
    EngineOptions::default()
        .durability(durability)
        .recovery(recovery)
        .segment_bytes(4096)
        .preallocate_bytes(2048)
        .checkpoint_bytes(8192)
        .background_indexing(false)
        .inline_io(inline_io)
}

fn open(mem: &MemVfs, opts: &EngineOptions) -> rheo::Result<(Engine, Rheo)> {
    let engine = Engine::open(Arc::new(mem.clone()), opts.clone())?;
    let clock = ManualClock::new(Timestamp::from_millis(1_767_225_600_000));
    let backend = NativeBackend::with_engine(engine.clone(), Arc::new(clock.clone()));
    let rheo = Rheo::builder().clock(Arc::new(clock)).with_backend(Arc::new(backend))?;
    Ok((engine, rheo))
}

async fn workload(rheo: &Rheo, engine: &Engine, rng: &mut Rng) {
    for (i, s) in STREAMS.iter().enumerate() {
        if i == 0 || rng.chance(1, 2) {
            let _ = rheo.create_stream(s, StreamOptions::new().partitions(3)).await;
            let _ = rheo.create_group(s, "g", GroupOptions::new().max_attempts(2)).await;
        }
    }
    let mut leases = Vec::new();
    for n in 0..rng.range(10, 60) {
        let s = STREAMS[usize::try_from(rng.range(0, 1)).expect("stream")];
        match rng.range(0, 9) {
            0..=3 => {
                let pad = "p".repeat(usize::try_from(rng.range(0, 300)).expect("pad"));
                let p = u32::try_from(rng.range(0, 2)).expect("partition");
                let _ = rheo.append(s, &json!({"n": n, "pad": pad}), AppendOptions::new().partition(p)).await;
            }
            4 | 5 => {
                let items: Vec<_> = (0..rng.range(2, 6))
                    .map(|i| {
                        let p = u32::try_from(rng.range(0, 2)).expect("partition");
                        (json!({"n": n, "i": i}), AppendOptions::new().partition(p))
                    })
                    .collect();
                let _ = rheo.append_batch_with(s, items).await;
            }
            6 => {
                let limit = usize::try_from(rng.range(1, 8)).expect("limit");
                if let Ok(l) = rheo.fetch(s, "g", FetchOptions::new().limit(limit).lease(Duration::from_secs(60))).await
                {
                    leases.extend(l);
                }
            }
            7 => {
                if let Some(l) = leases.pop() {
                    let _ = match rng.range(0, 2) {
                        0 => rheo.ack(&l).await,
                        1 => rheo.reject(&l, "bad").await,
                        _ => rheo.retry(&l, "again").await.map(|_| ()),
                    };
                }
            }
            8 => {
                let _ = engine.checkpoint(s);
            }
            _ => {
                let _ = rheo.replay(s, "g", rheo::ReplayOptions::from_sequence(rng.range(0, 5))).await;
            }
        }
    }
}

/// Damages the tail of one of the newest files: a cut, zeros, or a byte
/// flipped near its end.
fn damage_a_tail(mem: &MemVfs, rng: &mut Rng) -> String {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    crash::walk(mem, "", &mut files, &mut dirs);
    let candidates: Vec<String> = files
        .into_iter()
        .filter(|f| (f.ends_with(".log") || f.ends_with("/txn")) && mem.read_file(f).is_some_and(|b| b.len() > 80))
        .collect();
    if candidates.is_empty() {
        return "nothing to damage".into();
    }
    let path = candidates[usize::try_from(rng.range(0, candidates.len() as u64 - 1)).expect("file")].clone();
    let mut bytes = mem.read_file(&path).expect("file");
    let end = bytes.iter().rposition(|&b| b != 0).map_or(bytes.len(), |i| i + 1).max(64);
    let at = usize::try_from(rng.range(end.saturating_sub(200).max(33) as u64, end as u64 - 1)).expect("offset");
    let what = match rng.range(0, 2) {
        0 => {
            bytes.truncate(at);
            format!("{path} cut at {at}")
        }
        1 => {
            let to = (at + usize::try_from(rng.range(1, 100)).expect("len")).min(bytes.len());
            bytes[at..to].fill(0);
            format!("{path} zeroed {at}..{to}")
        }
        _ => {
            bytes[at] ^= 0x20;
            format!("{path} byte {at} flipped")
        }
    };
    mem.write_file(&path, &bytes).expect("write");
    what
}

/// Everything the API shows of the directory.
async fn observe(rheo: &Rheo) -> String {
    let mut out = String::new();
    let streams = rheo.list_streams().await.expect("streams");
    for s in &streams {
        out += &format!("{} {:?}\n", s.name, s.high_watermarks);
        for p in 0..s.partition_count {
            let events = rheo.read(&s.name, p, 0, 10_000).await.expect("read");
            let ids: Vec<&str> = events.iter().map(|e| e.id()).collect();
            out += &format!("  {p}: {ids:?}\n");
        }
        for g in rheo.list_groups(&s.name).await.expect("groups") {
            let info = rheo.group_info(&s.name, &g.name).await.expect("info");
            let dead = rheo.dead_letters(&s.name, &g.name, DeadLetterOptions::new().limit(10_000)).await.expect("dlq");
            let dead: Vec<(u32, u64, &str)> =
                dead.iter().map(|d| (d.partition, d.sequence, d.reason.as_str())).collect();
            out +=
                &format!("  {}: {:?} {} {} {dead:?}\n", g.name, info.lag.partitions, info.inflight, info.retry_waiting);
        }
    }
    out
}

/// Every file's bytes (the lock aside).
fn files(mem: &MemVfs) -> BTreeMap<String, Vec<u8>> {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    crash::walk(mem, "", &mut files, &mut dirs);
    files.into_iter().filter(|f| f != "LOCK").filter_map(|f| Some((f.clone(), mem.read_file(&f)?))).collect()
}

fn error_key(e: &Error) -> String {
    match e {
        Error::Corrupt { file, offset, .. } => format!("Corrupt {} {offset}", file.display()),
        e => format!("{e}"),
    }
}

async fn scenario(seed: u64) -> Result<&'static str, String> {
    let mut rng = Rng::new(seed, 0);
    let durability = match rng.range(0, 2) {
        0 => Durability::Sync,
        1 => Durability::Batched { max_delay: Duration::from_millis(1) },
        _ => Durability::None,
    };
    let inline_io = rng.chance(1, 2);
    let mem = MemVfs::new();
    {
        let opts = options(durability, RecoveryMode::TolerateTornTail, inline_io);
        let (engine, rheo) = open(&mem, &opts).map_err(|e| format!("a new directory: {e}"))?;
        workload(&rheo, &engine, &mut rng).await;
    }
    if rng.chance(3, 4) {
        crash::write_back_some(&mem, &mut rng, &mut crash::Trace { lines: Vec::new(), print: false }, 3);
    }
    mem.crash();
    let damage = if rng.chance(1, 2) { damage_a_tail(&mem, &mut rng) } else { "none".into() };
    let recovery = if rng.chance(1, 4) { RecoveryMode::TruncateAtFirstDamage } else { RecoveryMode::TolerateTornTail };
    let opts = options(Durability::Sync, recovery, inline_io);
    let what = format!("{durability:?}, damage: {damage}, {recovery:?}");
    let first = match open(&mem, &opts) {
        Ok((_engine, rheo)) => Ok(observe(&rheo).await),
        Err(e) => Err(error_key(&e)),
    };
    let after_first = files(&mem);
    let second = match open(&mem, &opts) {
        Ok((_engine, rheo)) => Ok(observe(&rheo).await),
        Err(e) => Err(error_key(&e)),
    };
    if first != second {
        return Err(format!("{what}: the second open differs from the first:\n{first:?}\n{second:?}"));
    }
    if first.is_err() {
        return Ok("refused twice, the same way");
    }
    let after_second = files(&mem);
    if after_first != after_second {
        let changed: Vec<&String> = after_first
            .keys()
            .chain(after_second.keys())
            .filter(|f| after_first.get(*f) != after_second.get(*f))
            .collect();
        return Err(format!("{what}: the second open changed files: {changed:?}"));
    }
    Ok("recovered, then reopened unchanged")
}

#[test]
fn opening_a_recovered_directory_again_changes_nothing() {
    let seeds: Vec<u64> = match env_u64("RHEO_REOPEN_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("RHEO_REOPEN_FIRST_SEED").unwrap_or(0);
            (first..first + env_u64("RHEO_REOPEN_SCENARIOS").unwrap_or(120)).collect()
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut outcomes: BTreeMap<&str, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    for &seed in &seeds {
        match rt.block_on(scenario(seed)) {
            Ok(kind) => *outcomes.entry(kind).or_default() += 1,
            Err(msg) => failures.push(format!("seed {seed}: {msg}")),
        }
    }
    println!("reopen: {} scenarios: {outcomes:?}", seeds.len());
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}\nreplay one: RHEO_REOPEN_SEED=<seed> cargo test --test recovery_idempotent -- --nocapture",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
    if seeds.len() >= 60 {
        assert!(
            outcomes.get("recovered, then reopened unchanged").copied().unwrap_or(0) > seeds.len() as u64 / 2,
            "{outcomes:?}"
        );
    }
}
