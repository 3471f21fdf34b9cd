//! Crash tests of the native backend with real processes (STYLE.md item 7,
//! after sled's `tests/test_crash_recovery.rs`).
//!
//! The test re-runs its own binary as a child (`--exact <this test>`, told
//! by `RHEO_KILL_CHILD_URL` to be the child). The child opens
//! `Rheo::open("native:DIR")` (a third of the rounds each under `Sync`,
//! `None` and `Batched`: the last two copy records into a mapping of the
//! segment, ADR 0035) and appends in a
//! loop to a 3-partition stream — single keyed appends and keyed batches of
//! 2–4 events — printing `ack <partition> <sequence> <id> <batch>` for every
//! acknowledged event (flushed before the next append). The parent kills it
//! with SIGKILL after a random 20–200 ms of appending (one round in five:
//! 1–20 ms after spawning, so that some kills land while it opens and
//! recovers), reopens the directory in process and checks:
//!
//! - every acknowledged (partition, sequence, id), of this and every
//!   earlier round, is present;
//! - each partition holds sequences 1..=n;
//! - no batch is partly visible: each event's payload names its batch and
//!   the batch size, and every batch present is complete;
//! - appending works: one more event lands at n+1 and is acknowledged.
//!
//! One data directory serves every round, so the log grows and every reopen
//! recovers a longer one; a quarter of the rounds use the default segment
//! size, the others 16 KiB segments that roll often.
//!
//! A SIGKILL loses the process, not the machine: unsynced writes survive in
//! the page cache, so this checks recovery from writes the process started
//! but did not finish or commit; `crash_native_log.rs` covers power loss.
//!
//! The random choices come from a seed printed at the start (the kill timing
//! is not reproducible): `RHEO_KILL_SEED=n` replays them, and
//! `RHEO_KILL_ROUNDS=n` changes the number of rounds (default 60).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rheo::{AppendOptions, Error, Rheo, StreamOptions};
use serde_json::{Value, json};

#[path = "common/rng.rs"]
mod rng;
use rng::{Rng, env_u64};

#[path = "common/kill.rs"]
mod kill;
use kill::{child_command, killed_while_opening, say, seed_and_rounds, spawn_and_kill};

const TEST_NAME: &str = "sigkill_during_appends_keeps_every_acknowledged_event";
const CHILD_URL: &str = "RHEO_KILL_CHILD_URL";
const CHILD_ROUND: &str = "RHEO_KILL_CHILD_ROUND";
const STREAM: &str = "kill";
const PARTITIONS: u32 = 3;
const ROUNDS: u64 = 60;
/// Batch ids of the parent's own appends (the child never gets this far).
const PARENT_BATCH: u64 = 999_999;

#[test]
fn sigkill_during_appends_keeps_every_acknowledged_event() {
    match std::env::var(CHILD_URL) {
        Ok(url) => child(&url),
        Err(_) => parent(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

// ------------------------------------------------------------------ child

/// Appends until killed, from 1–3 concurrent writers (so that the group
/// commit carries several appends per sync); prints every acknowledged event.
fn child(url: &str) {
    let round = env_u64(CHILD_ROUND).expect("round");
    let seed = env_u64("RHEO_KILL_SEED").expect("seed");
    runtime().block_on(async {
        // On lines of their own: the harness has printed `test <name> ... ` without a newline.
        say("\nopening");
        let rheo = Rheo::open(url).await.expect("child: open");
        match rheo.create_stream(STREAM, StreamOptions::new().partitions(PARTITIONS)).await {
            Ok(_) | Err(Error::AlreadyExists { .. }) => {}
            Err(e) => panic!("child: create stream: {e}"),
        }
        say("ready");
        let writers = Rng::new(seed, round + 1).range(1, 3);
        futures::future::join_all((0..writers).map(|w| writer(&rheo, round, w, Rng::new(seed, (round + 1) * 16 + w))))
            .await;
    });
}

/// One writer's loop. Batch ids: `round * 1_000_000 + writer * 100_000 + n`.
async fn writer(rheo: &Rheo, round: u64, w: u64, mut rng: Rng) {
    for b in 0..100_000 {
        let batch = round * 1_000_000 + w * 100_000 + b;
        let size = if rng.chance(1, 2) { 1 } else { rng.range(2, 4) };
        let items: Vec<(Value, AppendOptions)> = (0..size)
            .map(|i| {
                let pad = "z".repeat(usize::try_from(rng.range(0, 300)).expect("pad"));
                let payload = json!({"batch": batch, "size": size, "i": i, "pad": pad});
                let key = format!("k{}", rng.range(0, 9));
                (payload, AppendOptions::new().id(format!("b{batch}-{i}")).key(key))
            })
            .collect();
        let result = if size == 1 {
            let (payload, opts) = items.into_iter().next().expect("one");
            rheo.append(STREAM, &payload, opts).await.map(|e| vec![e])
        } else {
            rheo.append_batch_with(STREAM, items).await
        };
        match result {
            Ok(events) => {
                let lines: Vec<String> = events
                    .iter()
                    .map(|e| format!("ack {} {} {} {batch}", e.partition(), e.sequence(), e.id()))
                    .collect();
                say(&lines.join("\n"));
            }
            Err(e) => {
                say(&format!("error {e}"));
                std::process::exit(3);
            }
        }
    }
}

// ------------------------------------------------------------------ parent

/// An acknowledged event: its id and batch.
type Acked = BTreeMap<(u32, u64), (String, u64)>;

#[derive(Debug, Default)]
struct Stats {
    rounds: u64,
    early_kills: u64,
    killed_while_opening: u64,
    acked_events: usize,
    events_at_end: usize,
    /// Batches in the log at the end that were never acknowledged.
    unacked_but_present_batches: usize,
    max_round_ms: u128,
    /// Rounds under `Sync`, `None` and `Batched`.
    rounds_by_durability: [u64; 3],
}

fn parent() {
    let (seed, rounds) = seed_and_rounds(TEST_NAME, ROUNDS);
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let rt = runtime();
    let mut rng = Rng::new(seed, 0);
    let mut acked = Acked::new();
    let mut stats = Stats::default();
    for round in 0..rounds {
        let started = Instant::now();
        let fail = |msg: String| -> ! { panic!("seed {seed} round {round}: {msg}\n  replay: RHEO_KILL_SEED={seed}") };
        let segments = if rng.chance(1, 4) { "" } else { "segment_bytes=16384&preallocate_bytes=4096" };
        // A third of the rounds each under `None` and `Batched`, whose
        // appends are copied into a mapping of the segment (ADR 0035): what
        // they acknowledged is in the page cache, so it survives the kill.
        let durability =
            ["", "durability=none", "durability=batched"][usize::try_from(rng.range(0, 2)).expect("index")];
        let query: Vec<&str> = [segments, durability].into_iter().filter(|q| !q.is_empty()).collect();
        let url = format!("native:{}?{}", dir.path().display(), query.join("&"));
        stats.rounds_by_durability[if durability.is_empty() {
            0
        } else if durability.ends_with("none") {
            1
        } else {
            2
        }] += 1;
        let early = rng.chance(1, 5);
        let delay = Duration::from_millis(if early { rng.range(1, 20) } else { rng.range(20, 200) });

        let mut command = child_command(&exe, TEST_NAME);
        command.env(CHILD_URL, &url).env(CHILD_ROUND, round.to_string()).env("RHEO_KILL_SEED", seed.to_string());
        stats.early_kills += u64::from(early);
        let lines = spawn_and_kill(&mut command, early, delay).unwrap_or_else(|msg| fail(msg)).lines;
        stats.killed_while_opening += u64::from(killed_while_opening(&lines));
        for line in &lines {
            if let Err(msg) = record_ack(line, &mut acked) {
                fail(msg);
            }
        }
        match rt.block_on(verify(&url, &mut acked, round)) {
            Ok(s) => {
                stats.events_at_end = s.0;
                stats.unacked_but_present_batches = s.1;
            }
            Err(msg) => fail(msg),
        }
        stats.rounds += 1;
        stats.max_round_ms = stats.max_round_ms.max(started.elapsed().as_millis());
    }
    stats.acked_events = acked.len();
    println!("{TEST_NAME}: seed {seed}: {stats:?}");
    assert!(
        stats.acked_events > usize::try_from(rounds).expect("rounds") * 2,
        "the children acknowledged too little: {stats:?}"
    );
    assert!(rounds < 10 || stats.rounds_by_durability.iter().all(|&n| n > 0), "every durability had rounds: {stats:?}");
}

/// Notes one `ack <partition> <sequence> <id> <batch>` line.
fn record_ack(line: &str, acked: &mut Acked) -> Result<(), String> {
    let line = line.trim_end();
    if let Some(e) = line.strip_prefix("error ") {
        return Err(format!("the child's append failed: {e}"));
    }
    let Some(rest) = line.strip_prefix("ack ") else { return Ok(()) };
    let f: Vec<&str> = rest.split(' ').collect();
    let parse = |s: &str| s.parse::<u64>().map_err(|_| format!("bad line {line:?}"));
    let [p, seq, id, batch] = f[..] else { return Err(format!("bad line {line:?}")) };
    let p = u32::try_from(parse(p)?).map_err(|_| format!("bad line {line:?}"))?;
    let (seq, batch) = (parse(seq)?, parse(batch)?);
    match acked.insert((p, seq), (id.to_owned(), batch)) {
        Some((old, _)) if old != id => Err(format!(
            "{p}/{seq} was acknowledged twice: for {old} and now for {id} (an acknowledged event was lost)"
        )),
        _ => Ok(()),
    }
}

/// Reopens the directory, checks it against what was acknowledged, appends
/// one more event. Returns (events stored, batches present that were never
/// acknowledged).
async fn verify(url: &str, acked: &mut Acked, round: u64) -> Result<(usize, usize), String> {
    let rheo = Rheo::open(url).await.map_err(|e| format!("reopen failed: {e}"))?;
    if let Err(Error::StreamNotFound { .. }) = rheo.read(STREAM, 0, 0, 1).await {
        if !acked.is_empty() {
            return Err("the stream is gone".into());
        }
        rheo.create_stream(STREAM, StreamOptions::new().partitions(PARTITIONS)).await.map_err(|e| e.to_string())?;
    }
    // batch → (size, ids present)
    let mut batches: HashMap<u64, (u64, Vec<String>)> = HashMap::new();
    let mut stored: BTreeMap<(u32, u64), String> = BTreeMap::new();
    let mut high = [0u64; PARTITIONS as usize];
    for p in 0..PARTITIONS {
        loop {
            let after = high[p as usize];
            let page = rheo.read(STREAM, p, after, 10_000).await.map_err(|e| format!("reading partition {p}: {e}"))?;
            if page.is_empty() {
                break;
            }
            for e in page {
                let want = high[p as usize] + 1;
                if e.sequence() != want {
                    return Err(format!("partition {p}: sequence {} where {want} was expected", e.sequence()));
                }
                high[p as usize] = want;
                let batch = e.payload().json().expect("json")["batch"]
                    .as_u64()
                    .ok_or_else(|| format!("{}: no batch", e.id()))?;
                let size =
                    e.payload().json().expect("json")["size"].as_u64().ok_or_else(|| format!("{}: no size", e.id()))?;
                let entry = batches.entry(batch).or_insert((size, Vec::new()));
                entry.1.push(e.id().to_owned());
                stored.insert((p, e.sequence()), e.id().to_owned());
            }
        }
    }
    for ((p, seq), (id, _)) in acked.iter() {
        match stored.get(&(*p, *seq)) {
            Some(found) if found == id => {}
            other => return Err(format!("acknowledged {id} at {p}/{seq} is missing (found {other:?})")),
        }
    }
    let acked_batches: std::collections::HashSet<u64> = acked.values().map(|(_, b)| *b).collect();
    let mut unacked_present = 0;
    for (batch, (size, ids)) in &batches {
        let mut ids = ids.clone();
        ids.sort();
        let mut want: Vec<String> = (0..*size).map(|i| format!("b{batch}-{i}")).collect();
        if *batch % 1_000_000 == PARENT_BATCH {
            want = vec![format!("p{}", batch / 1_000_000)];
        }
        want.sort();
        if ids != want {
            return Err(format!("batch {batch} of {size} is partly visible: {ids:?}"));
        }
        unacked_present += usize::from(!acked_batches.contains(batch));
    }
    // One more append, after everything recovered.
    let batch = round * 1_000_000 + PARENT_BATCH;
    let e = rheo
        .append(STREAM, &json!({"batch": batch, "size": 1}), AppendOptions::new().id(format!("p{round}")).key("parent"))
        .await
        .map_err(|e| format!("appending after recovery failed: {e}"))?;
    if e.sequence() != high[e.partition() as usize] + 1 {
        return Err(format!(
            "the append after recovery got {}/{}, expected sequence {}",
            e.partition(),
            e.sequence(),
            high[e.partition() as usize] + 1
        ));
    }
    acked.insert((e.partition(), e.sequence()), (e.id().to_owned(), batch));
    drop(rheo);
    Ok((stored.len() + 1, unacked_present))
}
