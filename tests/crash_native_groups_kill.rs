//! Crash tests of the native consumer groups with real processes: SIGKILL a
//! child running producers and competing consumers, after
//! `crash_native_kill.rs`. One appended event in four is scheduled up to
//! 400 ms ahead: no consumer may get it before its time, across kills.
//!
//! The test re-runs its own binary as a child (`--exact <this test>`, told
//! by `RHEO_GKILL_CHILD_URL` to be the child). The child opens
//! `Rheo::open("native:DIR")` (default `Durability::Sync`; in three rounds
//! of four with 4 KiB checkpoints and 16 KiB segments, so that kills land
//! in checkpoints and rolls), creates a 3-partition stream and two groups
//! (or finds them; `g2` orders by key), and runs on two worker threads: 8 producer tasks
//! (single and batch appends) and 4 competing consumers per group, each
//! fetching 1–7 deliveries under 500–900 ms leases, then acking (with
//! `ack_many` half the time, else one by one), retrying (with and without a
//! delay), rejecting, renewing, or letting a lease expire. It writes what it was told to a
//! side file (append-only, one `write` and `fsync` per step, one file per
//! round):
//!
//! - `A p seq id`: an append returned Ok;
//! - `F g p seq attempt lease-id expires-ms`: a fetch returned this delivery;
//! - `T g p seq` / `R g p seq`: an ack or reject / a retry of it is about
//!   to be called;
//! - `K g p seq attempt` / `D g p seq attempt`: that ack / reject returned Ok.
//!
//! The parent kills it with SIGKILL 30–200 ms after it is ready (one round
//! in five: 1–20 ms after spawning, so that some kills land while it opens
//! and recovers) and notes when it was certainly dead (reaped); no check
//! assumes how long the child really ran. Then it checks what the child
//! said and the reopened data directory:
//!
//! - no delivery is settled twice (two Ok acks or rejects), and no fetch
//!   returns a delivery after its settle returned Ok: not in a later round,
//!   and never at a higher attempt than the settled one (each claim adds
//!   one attempt, and a SIGKILL loses nothing the process wrote);
//! - every appended event is in the log, where it was appended;
//! - every lease the child took in that round, did not settle or retry, and
//!   that had not expired when the child was dead, still holds its delivery
//!   (renewing it returns Ok): a kill loses no claim (a lease that expired
//!   before the kill may have been reclaimed by a fetch the child did not
//!   get to log, so it is not checked);
//! - per group, the frontier is at least the contiguous prefix of settled
//!   (acked or rejected) sequences, and every sequence up to it had a settle
//!   called (`T`); `lag = high_watermark - frontier`; every rejected event
//!   is a dead letter, no acked one is, and every dead letter had a settle
//!   called.
//!
//! After the last round the parent waits until every lease recorded has
//! expired and drains both groups: no settled delivery comes back, no event is
//! delivered twice, every appended event was either delivered or had a
//! settle called, and the frontier reaches the high watermark (each event
//! ends acked or dead-lettered exactly once); in `g2`, reopened after every
//! kill, each key's events come one at a time and in sequence order.
//!
//! A SIGKILL loses the process, not the machine: everything the child wrote
//! survives; `crash_native_groups.rs` covers power loss.
//!
//! The random choices come from a seed printed at the start (the kill timing
//! is not reproducible): `RHEO_KILL_SEED=n` replays them, and
//! `RHEO_KILL_ROUNDS=n` changes the number of rounds (default 60;
//! `scripts/soak` runs 500).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rheo::backends::native::EngineOptions;
use rheo::backends::native::NativeBackend;
use rheo::{
    AppendOptions, DeadLetterOptions, Error, FetchOptions, GroupOptions, Lease, LeaseRef, Rheo, StreamOptions,
    SystemClock, Timestamp,
};
use serde_json::{Value, json};

#[path = "common/rng.rs"]
mod rng;
use rng::{Rng, env_u64};

#[path = "common/kill.rs"]
mod kill;
use kill::{child_command, killed_while_opening, say, seed_and_rounds, spawn_and_kill};

const TEST_NAME: &str = "sigkill_during_producers_and_competing_consumers_keeps_every_settle";
const CHILD_URL: &str = "RHEO_GKILL_CHILD_URL";
const CHILD_SIDE: &str = "RHEO_GKILL_CHILD_SIDE";
const CHILD_ROUND: &str = "RHEO_GKILL_CHILD_ROUND";
const STREAM: &str = "gkill";
const PARTITIONS: u32 = 3;
const GROUPS: [&str; 2] = ["g1", "g2"];
/// The group created with per-key order.
const KEYED: &str = "g2";
/// High enough that no delivery runs out of attempts: every dead letter is
/// a reject the child logged.
const MAX_ATTEMPTS: u32 = 1000;
const ROUNDS: u64 = 60;
/// Producer tasks of a child.
const PRODUCERS: u64 = 8;
/// Competing consumers per group of a child.
const CONSUMERS: u64 = 4;
/// The shortest and longest lease a child takes; the shortest is longer
/// than a child lives after it is ready (see `parent`).
const MIN_LEASE_MS: u64 = 500;
const MAX_LEASE_MS: u64 = 900;
/// One event in four is scheduled up to this far ahead (`AppendOptions::delay`).
const MAX_DELAY_MS: u64 = 400;

#[test]
fn sigkill_during_producers_and_competing_consumers_keeps_every_settle() {
    match std::env::var(CHILD_URL) {
        Ok(url) => child(&url),
        Err(_) => parent(),
    }
}

// ------------------------------------------------------------------ child

/// The side file: every step's lines in one write, then fsync.
struct Side(Mutex<File>);

impl Side {
    fn log(&self, lines: &[String]) {
        if lines.is_empty() {
            return;
        }
        let mut text = lines.join("\n");
        text.push('\n');
        let f = self.0.lock().expect("side file");
        let mut w: &File = &f;
        w.write_all(text.as_bytes()).and_then(|()| f.sync_data()).expect("child: side file");
    }

    /// Logs the failure and exits: the parent fails the round.
    fn fail(&self, what: &str, e: &Error) -> ! {
        self.log(&[format!("E {what}: {e}")]);
        say(&format!("error {what}: {e}"));
        std::process::exit(3);
    }
}

fn child(url: &str) {
    let round = env_u64(CHILD_ROUND).expect("round");
    let seed = env_u64("RHEO_KILL_SEED").expect("seed");
    let side_path = std::env::var(CHILD_SIDE).expect("side file");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        // On a line of its own: the harness has printed `test <name> ... `.
        say("\nopening");
        let rheo = Rheo::open(url).await.expect("child: open");
        match rheo.create_stream(STREAM, StreamOptions::new().partitions(PARTITIONS)).await {
            Ok(_) | Err(Error::AlreadyExists { .. }) => {}
            Err(e) => panic!("child: create stream: {e}"),
        }
        for g in GROUPS {
            let mut opts = GroupOptions::new().max_attempts(MAX_ATTEMPTS);
            if g == KEYED {
                opts = opts.ordered_by_key();
            }
            match rheo.create_group(STREAM, g, opts).await {
                Ok(_) | Err(Error::AlreadyExists { .. }) => {}
                Err(e) => panic!("child: create group {g}: {e}"),
            }
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&side_path).expect("child: side file");
        let side = Arc::new(Side(Mutex::new(file)));
        say("ready");
        let mut tasks = Vec::new();
        for w in 0..PRODUCERS {
            let (rheo, side) = (rheo.clone(), side.clone());
            let rng = Rng::new(seed, (round + 1) * 64 + w);
            tasks.push(tokio::spawn(async move { producer(&rheo, &side, round, w, rng).await }));
        }
        for (gi, g) in GROUPS.iter().enumerate() {
            for c in 0..CONSUMERS {
                let (rheo, side) = (rheo.clone(), side.clone());
                let rng = Rng::new(seed, (round + 1) * 64 + 8 + gi as u64 * 8 + c);
                let id = format!("r{round}-{g}-c{c}");
                tasks.push(tokio::spawn(async move { consumer(&rheo, &side, g, &id, rng).await }));
            }
        }
        for t in tasks {
            t.await.expect("child task");
        }
    });
}

async fn producer(rheo: &Rheo, side: &Side, round: u64, w: u64, mut rng: Rng) {
    for n in 0..u64::MAX {
        let size = if rng.chance(1, 2) { 1 } else { rng.range(2, 4) };
        let items: Vec<(Value, AppendOptions)> = (0..size)
            .map(|i| {
                let key = format!("k{}", rng.range(0, 9));
                let pad = "p".repeat(usize::try_from(rng.range(0, 200)).expect("pad"));
                let mut opts = AppendOptions::new().id(format!("r{round}w{w}n{n}i{i}")).key(key);
                if rng.chance(1, 4) {
                    opts = opts.delay(Duration::from_millis(rng.range(1, MAX_DELAY_MS)));
                }
                (json!({"n": n, "pad": pad}), opts)
            })
            .collect();
        match rheo.append_batch_with(STREAM, items).await {
            Ok(events) => {
                let lines: Vec<String> =
                    events.iter().map(|e| format!("A {} {} {}", e.partition(), e.sequence(), e.id())).collect();
                side.log(&lines);
            }
            Err(e) => side.fail("append", &e),
        }
        tokio::time::sleep(Duration::from_millis(rng.range(1, 6))).await;
    }
}

fn key_of(l: &Lease) -> String {
    format!("{} {}", l.event.partition(), l.event.sequence())
}

async fn consumer(rheo: &Rheo, side: &Side, g: &str, id: &str, mut rng: Rng) {
    loop {
        let lease = Duration::from_millis(rng.range(MIN_LEASE_MS, MAX_LEASE_MS));
        let limit = usize::try_from(rng.range(1, 7)).expect("limit");
        let opts = FetchOptions::new().limit(limit).consumer(id).lease(lease);
        let leases = match rheo.fetch(STREAM, g, opts).await {
            Ok(leases) => leases,
            Err(e) => side.fail("fetch", &e),
        };
        if leases.is_empty() {
            tokio::time::sleep(Duration::from_millis(rng.range(2, 8))).await;
            continue;
        }
        let now = Timestamp::now();
        if let Some(early) = leases.iter().find(|l| l.event.deliver_at().is_some_and(|t| t > now)) {
            let at = early.event.deliver_at().map(|t| t.to_string()).unwrap_or_default();
            side.fail(
                "fetch",
                &Error::failed("fetch", format!("{} delivered at {now}, before its time {at}", key_of(early))),
            );
        }
        side.log(
            &leases
                .iter()
                .map(|l| format!("F {g} {} {} {} {}", key_of(l), l.attempt, l.lease_id, l.expires_at.as_millis()))
                .collect::<Vec<_>>(),
        );
        if rng.chance(1, 2) {
            // All at once.
            side.log(&leases.iter().map(|l| format!("T {g} {}", key_of(l))).collect::<Vec<_>>());
            let results = match rheo.ack_many(leases.iter()).await {
                Ok(results) => results,
                Err(e) => side.fail("ack_many", &e),
            };
            let mut lines = Vec::new();
            for (l, r) in leases.iter().zip(results) {
                match r {
                    Ok(()) => lines.push(format!("K {g} {} {}", key_of(l), l.attempt)),
                    Err(Error::StaleLease { .. }) => {}
                    Err(e) => side.fail("ack_many", &e),
                }
            }
            side.log(&lines);
            continue;
        }
        for l in &leases {
            if rng.chance(1, 10) {
                match rheo.renew(l, lease).await {
                    Ok(_) | Err(Error::StaleLease { .. }) => {}
                    Err(e) => side.fail("renew", &e),
                }
            }
            match rng.range(0, 19) {
                0..=13 => {
                    side.log(&[format!("T {g} {}", key_of(l))]);
                    match rheo.ack(l).await {
                        Ok(()) => side.log(&[format!("K {g} {} {}", key_of(l), l.attempt)]),
                        Err(Error::StaleLease { .. }) => {}
                        Err(e) => side.fail("ack", &e),
                    }
                }
                14 | 15 => {
                    side.log(&[format!("R {g} {}", key_of(l))]);
                    let r = if rng.chance(1, 2) {
                        rheo.retry(l, "again").await
                    } else {
                        rheo.retry_after(l, "later", Duration::from_millis(rng.range(1, 40))).await
                    };
                    match r {
                        Ok(_) | Err(Error::StaleLease { .. }) => {}
                        Err(e) => side.fail("retry", &e),
                    }
                }
                16 => {
                    side.log(&[format!("T {g} {}", key_of(l))]);
                    match rheo.reject(l, "bad").await {
                        Ok(()) => side.log(&[format!("D {g} {} {}", key_of(l), l.attempt)]),
                        Err(Error::StaleLease { .. }) => {}
                        Err(e) => side.fail("reject", &e),
                    }
                }
                // Let it expire: a competitor (or the next child) reclaims it.
                _ => {}
            }
        }
    }
}

// ------------------------------------------------------------------ parent

type Key = (u32, u64);

/// What the children said, over every round, and what it implies.
#[derive(Debug, Default)]
struct Ledger {
    appended: BTreeMap<Key, String>,
    groups: BTreeMap<String, GroupLedger>,
    /// The latest lease expiry any child was given (ms).
    latest_expiry: i64,
    /// When the last child was certainly dead (ms).
    dead_at_ms: i64,
}

#[derive(Debug, Default)]
struct GroupLedger {
    /// Settles that returned Ok: key → (attempt, round, dead-lettered).
    settled: BTreeMap<Key, (u32, u64, bool)>,
    /// Keys whose ack or reject was called.
    tried: BTreeSet<Key>,
    /// Deliveries: key → [(attempt, round)].
    fetched: BTreeMap<Key, Vec<(u32, u64)>>,
    /// This round's leases not settled or retried since: key → (lease id,
    /// attempt, expiry in ms).
    held: BTreeMap<Key, (String, u32, i64)>,
}

#[derive(Debug, Default)]
struct Stats {
    rounds: u64,
    early_kills: u64,
    killed_while_opening: u64,
    appended: usize,
    acked: usize,
    rejected: usize,
    deliveries: usize,
    /// Deliveries fetched again in a later round (unsettled when killed).
    redelivered_after_kill: usize,
    checkpoints_loaded: u64,
    /// Leases of a killed child checked to still hold after the reopen.
    held_after_kill: u64,
    drained: usize,
    max_round_ms: u128,
}

fn parent() {
    let (seed, rounds) = seed_and_rounds(TEST_NAME, ROUNDS);
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let sides = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut rng = Rng::new(seed, 0);
    let mut ledger = Ledger::default();
    let mut stats = Stats::default();
    let mut url = String::new();
    for round in 0..rounds {
        let round_started = Instant::now();
        let fail = |msg: String| -> ! { panic!("seed {seed} round {round}: {msg}\n  replay: RHEO_KILL_SEED={seed}") };
        let query =
            if rng.chance(1, 4) { "" } else { "?checkpoint_bytes=4096&segment_bytes=16384&preallocate_bytes=4096" };
        url = format!("native:{}{query}", dir.path().display());
        let side_path = sides.path().join(format!("round-{round}.log"));
        let early = rng.chance(1, 5);
        // At most 200 ms after ready: no lease of this child (>= 500 ms) expires.
        let delay = Duration::from_millis(if early { rng.range(1, 20) } else { rng.range(30, 200) });

        let mut command = child_command(&exe, TEST_NAME);
        command
            .env(CHILD_URL, &url)
            .env(CHILD_ROUND, round.to_string())
            .env(CHILD_SIDE, &side_path)
            .env("RHEO_KILL_SEED", seed.to_string());
        stats.early_kills += u64::from(early);
        let killed = spawn_and_kill(&mut command, early, delay).unwrap_or_else(|msg| fail(msg));
        stats.killed_while_opening += u64::from(killed_while_opening(&killed.lines));
        ledger.dead_at_ms = killed.dead_at_ms;
        if let Err(msg) = read_side(&side_path, round, &mut ledger) {
            fail(msg);
        }
        let what = format!("seed {seed} round {round}");
        match rt.block_on(guarded(&what, verify(&url, &ledger))) {
            Ok((ckpt, held)) => {
                stats.checkpoints_loaded += ckpt;
                stats.held_after_kill += held;
            }
            Err(msg) => fail(msg),
        }
        stats.rounds += 1;
        stats.max_round_ms = stats.max_round_ms.max(round_started.elapsed().as_millis());
    }
    // Wait until every lease a child took has expired, and every
    // scheduled event is due.
    let due = ledger.latest_expiry.max(ledger.dead_at_ms + i64::try_from(MAX_DELAY_MS).expect("ms"));
    while kill::now_ms() <= due {
        std::thread::sleep(Duration::from_millis(50));
    }
    match rt.block_on(guarded(&format!("seed {seed} final drain"), drain(&url, &ledger))) {
        Ok(n) => stats.drained = n,
        Err(msg) => panic!("seed {seed} final drain: {msg}\n  replay: RHEO_KILL_SEED={seed}"),
    }
    stats.appended = ledger.appended.len();
    for g in ledger.groups.values() {
        stats.acked += g.settled.values().filter(|s| !s.2).count();
        stats.rejected += g.settled.values().filter(|s| s.2).count();
        stats.deliveries += g.fetched.values().map(Vec::len).sum::<usize>();
        stats.redelivered_after_kill += g.fetched.values().filter(|v| v.iter().any(|f| f.1 != v[0].1)).count();
    }
    println!("{TEST_NAME}: seed {seed}: {stats:?} in {:.1?}", started.elapsed());
    let rounds = usize::try_from(rounds).expect("rounds");
    assert!(stats.acked > rounds * 2, "the children acked too little: {stats:?}");
    if rounds >= 20 {
        assert!(stats.redelivered_after_kill > 0, "nothing unsettled at a kill was delivered again: {stats:?}");
        assert!(stats.rejected > 0, "no reject returned Ok: {stats:?}");
        assert!(stats.held_after_kill > 0, "no lease of a killed child was checked: {stats:?}");
    }
}

/// Runs a reopen-and-check with a time limit (it takes well under a
/// second). A torn delivery-WAL record (a SIGKILL can cut a write) followed
/// by the WAL's zero-filled preallocation makes recovery quadratic (see
/// `a_torn_wal_tail_is_recovered_quickly` in `crash_native_groups.rs`):
/// say so and exit instead of hanging for minutes (dropping the runtime
/// would wait for the blocking reopen). Written to the stderr handle, which
/// the test harness does not capture.
async fn guarded<T>(what: &str, f: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    match tokio::time::timeout(Duration::from_secs(30), f).await {
        Ok(r) => r,
        Err(_) => {
            let _ = writeln!(
                std::io::stderr(),
                "\n{TEST_NAME}: {what}: reopening and checking took over 30 s: a torn WAL tail recovered in \
                 quadratic time? (see a_torn_wal_tail_is_recovered_quickly in crash_native_groups.rs)"
            );
            std::process::exit(101);
        }
    }
}

/// Reads a round's side file (complete lines: a line cut by the kill was
/// never fully written) and checks each line against what came before.
fn read_side(path: &Path, round: u64, ledger: &mut Ledger) -> Result<(), String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        // Killed before it opened the side file.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    for g in ledger.groups.values_mut() {
        g.held.clear();
    }
    for line in complete.lines() {
        let bad = || format!("bad side-file line {line:?}");
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).ok_or_else(bad);
        match f[0] {
            "E" => return Err(format!("the child failed: {line}")),
            "A" => {
                let key = (u32::try_from(num(1)?).map_err(|_| bad())?, num(2)?);
                let id = f.get(3).ok_or_else(bad)?.to_string();
                if let Some(old) = ledger.appended.insert(key, id.clone())
                    && old != id
                {
                    return Err(format!("{key:?} was appended (Ok) as {old} and again as {id}: an append was lost"));
                }
            }
            "F" | "T" | "R" | "K" | "D" => {
                let g = ledger.groups.entry(f.get(1).ok_or_else(bad)?.to_string()).or_default();
                let key = (u32::try_from(num(2)?).map_err(|_| bad())?, num(3)?);
                let name = f[1];
                match f[0] {
                    "T" => {
                        g.tried.insert(key);
                        g.held.remove(&key);
                    }
                    "R" => {
                        g.held.remove(&key);
                    }
                    "F" => {
                        let attempt = u32::try_from(num(4)?).map_err(|_| bad())?;
                        if let Some(&(a, r, dead)) = g.settled.get(&key)
                            && (attempt > a || round > r)
                        {
                            let how = if dead { "rejected" } else { "acked" };
                            return Err(format!(
                                "{name}: {key:?} was {how} (Ok) at attempt {a} in round {r}, then delivered again at attempt {attempt} in round {round}"
                            ));
                        }
                        g.fetched.entry(key).or_default().push((attempt, round));
                        let expires = f.get(6).and_then(|s| s.parse::<i64>().ok()).ok_or_else(bad)?;
                        ledger.latest_expiry = ledger.latest_expiry.max(expires);
                        let g = ledger.groups.get_mut(name).ok_or_else(bad)?;
                        g.held.insert(key, (f.get(5).ok_or_else(bad)?.to_string(), attempt, expires));
                    }
                    kind => {
                        let attempt = u32::try_from(num(4)?).map_err(|_| bad())?;
                        if let Some(old) = g.settled.get(&key) {
                            return Err(format!("{name}: {key:?} was settled (Ok) twice: {old:?}, now {line:?}"));
                        }
                        if let Some(later) = g.fetched.get(&key).and_then(|v| v.iter().find(|f| f.0 > attempt)) {
                            return Err(format!(
                                "{name}: {key:?} settled (Ok) at attempt {attempt}, but it was claimed again at attempt {} (round {}) before",
                                later.0, later.1
                            ));
                        }
                        g.settled.insert(key, (attempt, round, kind == "D"));
                    }
                }
            }
            _ => return Err(bad()),
        }
    }
    Ok(())
}

async fn read_log(rheo: &Rheo) -> Result<BTreeMap<Key, String>, String> {
    let mut log = BTreeMap::new();
    for p in 0..PARTITIONS {
        let mut after = 0;
        loop {
            let page = rheo.read(STREAM, p, after, 5_000).await.map_err(|e| format!("reading partition {p}: {e}"))?;
            if page.is_empty() {
                break;
            }
            for e in page {
                if e.sequence() != after + 1 {
                    return Err(format!("partition {p}: sequence {} after {after}", e.sequence()));
                }
                after = e.sequence();
                log.insert((p, e.sequence()), e.id().to_owned());
            }
        }
    }
    Ok(log)
}

/// Reopens the directory and checks it against the ledger. Returns (1 when
/// the reopen loaded a delivery checkpoint, leases checked to still hold).
async fn verify(url: &str, ledger: &Ledger) -> Result<(u64, u64), String> {
    let rest = url.strip_prefix("native:").expect("native url");
    let (path, opts) = rheo::backends::native::parse_url(rest, EngineOptions::default()).map_err(|e| e.to_string())?;
    let backend =
        NativeBackend::open(&path, opts, Arc::new(SystemClock)).await.map_err(|e| format!("reopen failed: {e}"))?;
    let report = backend.engine().delivery_recovery().iter().find(|(s, _)| s == STREAM).map(|(_, r)| r.clone());
    if let Some(r) = &report
        && r.clamped > 0
    {
        return Err(format!("under Sync no group state lies above the log's end, but the reopen clamped: {r:?}"));
    }
    let rheo = Rheo::builder().with_backend(Arc::new(backend)).map_err(|e| e.to_string())?;
    let streams = rheo.list_streams().await.map_err(|e| e.to_string())?;
    if !streams.iter().any(|s| s.name == STREAM) {
        if !ledger.appended.is_empty() || !ledger.groups.is_empty() {
            return Err("the stream is gone".into());
        }
        return Ok((0, 0));
    }
    let log = read_log(&rheo).await?;
    for (key, id) in &ledger.appended {
        if log.get(key) != Some(id) {
            return Err(format!("appended (Ok) {id} at {key:?} is missing (found {:?})", log.get(key)));
        }
    }
    let groups = rheo.list_groups(STREAM).await.map_err(|e| e.to_string())?;
    let mut held = 0;
    for name in GROUPS {
        if !groups.iter().any(|g| g.name == name) {
            if ledger.groups.contains_key(name) {
                return Err(format!("group {name} is gone"));
            }
            continue;
        }
        let empty = GroupLedger::default();
        let g = ledger.groups.get(name).unwrap_or(&empty);
        check_group(&rheo, name, g, &log).await?;
        // The child's untouched leases of this round that had not expired
        // when it died still hold; renewing them for 1 ms lets the next
        // child reclaim them at once.
        for (key, (lease_id, attempt, expires)) in &g.held {
            if *expires <= ledger.dead_at_ms {
                continue;
            }
            let lease = LeaseRef {
                stream: STREAM.into(),
                group: name.into(),
                partition: key.0,
                sequence: key.1,
                lease_id: lease_id.parse().expect("a lease id the child printed"),
                receipt: None,
            };
            if let Err(e) = rheo.renew(lease, Duration::from_millis(1)).await {
                return Err(format!(
                    "{name}: the child's lease of {key:?} (attempt {attempt}, expiring at {expires} ms, after the child died at {} ms), never settled or retried, does not hold after the kill: {e}",
                    ledger.dead_at_ms
                ));
            }
            held += 1;
        }
    }
    Ok((u64::from(report.is_some_and(|r| r.checkpoint.is_some())), held))
}

/// Frontier, lag and dead letters of one group against the ledger.
async fn check_group(rheo: &Rheo, name: &str, g: &GroupLedger, log: &BTreeMap<Key, String>) -> Result<(), String> {
    let lag = rheo.lag(STREAM, name).await.map_err(|e| format!("lag of {name}: {e}"))?;
    let mut total = 0;
    for pl in &lag.partitions {
        let p = pl.partition;
        let hw = log.keys().filter(|k| k.0 == p).count() as u64;
        if pl.high_watermark != hw || pl.frontier > hw || pl.lag != hw - pl.frontier {
            return Err(format!("{name}/{p}: {pl:?}, but the log holds {hw} events"));
        }
        total += pl.lag;
        if let Some(seq) = (1..=pl.frontier).find(|&s| !g.tried.contains(&(p, s))) {
            return Err(format!(
                "{name}/{p}: frontier {} passes {seq}, which no consumer ever acked or rejected",
                pl.frontier
            ));
        }
        let mut prefix = 0;
        while g.settled.contains_key(&(p, prefix + 1)) {
            prefix += 1;
        }
        if pl.frontier < prefix {
            return Err(format!(
                "{name}/{p}: frontier {} below {prefix}, though 1..={prefix} were all settled (Ok): a settle was lost",
                pl.frontier
            ));
        }
    }
    if lag.total != total {
        return Err(format!("{name}: lag total {} but the partitions add up to {total}", lag.total));
    }
    let dead = rheo
        .dead_letters(STREAM, name, DeadLetterOptions::new().limit(10_000))
        .await
        .map_err(|e| format!("dead letters of {name}: {e}"))?;
    let dead: BTreeSet<Key> = dead.iter().map(|d| (d.partition, d.sequence)).collect();
    for (key, (_, _, rejected)) in &g.settled {
        if *rejected != dead.contains(key) {
            let how = if *rejected { "rejected (Ok) but is not" } else { "acked (Ok) but is" };
            return Err(format!("{name}: {key:?} was {how} a dead letter"));
        }
    }
    if let Some(key) = dead.iter().find(|k| !g.tried.contains(k)) {
        return Err(format!("{name}: {key:?} is a dead letter, but no consumer rejected it"));
    }
    Ok(())
}

/// After the last round: deliver and ack everything left, check the end
/// state. Returns how many deliveries the drain made.
async fn drain(url: &str, ledger: &Ledger) -> Result<usize, String> {
    let rheo = Rheo::open(url).await.map_err(|e| format!("reopen failed: {e}"))?;
    if !rheo.list_streams().await.map_err(|e| e.to_string())?.iter().any(|s| s.name == STREAM) {
        return Err("no stream at the end".into());
    }
    let log = read_log(&rheo).await?;
    let empty = GroupLedger::default();
    let mut total = 0;
    for name in GROUPS {
        if !rheo.list_groups(STREAM).await.map_err(|e| e.to_string())?.iter().any(|g| g.name == name) {
            if ledger.groups.contains_key(name) {
                return Err(format!("group {name} is gone"));
            }
            continue;
        }
        let g = ledger.groups.get(name).unwrap_or(&empty);
        let mut drained = BTreeSet::new();
        // The keyed group: (partition, key) -> the last sequence drained.
        let mut last_of_key: BTreeMap<(u32, String), u64> = BTreeMap::new();
        loop {
            let opts = FetchOptions::new().limit(500).consumer("drain").lease(Duration::from_secs(600));
            let leases = rheo.fetch(STREAM, name, opts).await.map_err(|e| format!("drain fetch: {e}"))?;
            if leases.is_empty() {
                break;
            }
            for l in &leases {
                let key = (l.event.partition(), l.event.sequence());
                if let Some((a, r, dead)) = g.settled.get(&key) {
                    let how = if *dead { "rejected" } else { "acked" };
                    return Err(format!(
                        "{name}: {key:?} was {how} (Ok) at attempt {a} in round {r}, and the drain got it again (attempt {})",
                        l.attempt
                    ));
                }
                if !drained.insert(key) {
                    return Err(format!("{name}: the drain got {key:?} twice"));
                }
            }
            if name == KEYED {
                // Per-key order after the kills: one event of a key per
                // fetch (the one before is acked only after it), and each
                // key's events in sequence order.
                let mut in_fetch = BTreeSet::new();
                for l in &leases {
                    let k = (l.partition(), l.event.key().unwrap_or_default().to_owned());
                    if !in_fetch.insert(k.clone()) {
                        return Err(format!("{name}: one drain fetch got two events of key {k:?}"));
                    }
                    if let Some(&before) = last_of_key.get(&k).filter(|&&b| b > l.sequence()) {
                        return Err(format!(
                            "{name}: key {k:?}: the drain got sequence {} after {before}",
                            l.sequence()
                        ));
                    }
                    last_of_key.insert(k, l.sequence());
                }
            }
            for (l, r) in leases.iter().zip(rheo.ack_many(leases.iter()).await.map_err(|e| e.to_string())?) {
                r.map_err(|e| format!("{name}: the drain's ack of {:?} failed: {e}", key_of(l)))?;
            }
        }
        total += drained.len();
        let lag = rheo.lag(STREAM, name).await.map_err(|e| e.to_string())?;
        if let Some(pl) = lag.partitions.iter().find(|pl| pl.frontier != pl.high_watermark) {
            return Err(format!("{name}: after the drain, {pl:?}"));
        }
        for key in log.keys() {
            if !drained.contains(key) && !g.tried.contains(key) {
                return Err(format!(
                    "{name}: {key:?} was never acked or rejected by a consumer, and the drain did not deliver it"
                ));
            }
        }
        let dead =
            rheo.dead_letters(STREAM, name, DeadLetterOptions::new().limit(10_000)).await.map_err(|e| e.to_string())?;
        if let Some(d) = dead.iter().find(|d| drained.contains(&(d.partition, d.sequence))) {
            return Err(format!(
                "{name}: {} was acked by the drain but is a dead letter",
                d.event.as_ref().map_or("-", |e| e.id())
            ));
        }
    }
    Ok(total)
}
