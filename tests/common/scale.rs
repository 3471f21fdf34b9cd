//! Scale-out and kill cases shared by the database backends: several OS
//! processes (the test binary re-run as workers) compete on one group of
//! one database, and a consumer process is SIGKILLed mid-batch.
//!
//! A test binary that uses them has a test named `entry` (ignored) whose
//! body is [`worker_process`]`(entry)`; the parent re-runs the binary with
//! `--exact entry` and the database URL in `RHEO_SQL_WORKER`.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rheo::{FetchOptions, GroupOptions, ResetOptions, Rheo, StreamOptions};
use serde_json::json;

pub fn now_ms() -> i64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    i64::try_from(t.as_millis()).expect("ms")
}

/// Appends `n` events of about 200 bytes to `stream` in batches of 1000.
pub async fn fill(rheo: &Rheo, stream: &str, n: usize) {
    let pad = "x".repeat(160);
    let mut i = 0;
    while i < n {
        let batch: Vec<serde_json::Value> =
            (i..(i + 1000).min(n)).map(|k| json!({"type": "tick", "n": k, "pad": pad})).collect();
        rheo.append_batch(stream, &batch).await.expect("append a batch");
        i += batch.len();
    }
}

/// The worker's body. Run by the parent with `RHEO_SQL_WORKER` set to the
/// URL (a plain run, without it, has nothing to do and says so). It prints
/// one line per delivery it handled, `@@ H <partition> <sequence>
/// <held_from_ms> <held_to_ms>` (an interval in which it certainly held
/// the lease: from when the fetch returned to when the ack was sent), then
/// `@@ done`. (The marker finds the record on a line the test harness
/// began with its own text.) In mode `hang` it fetches 50, acks the first
/// 10 (`@@ A p s`), lists the rest (`@@ L p s`), says `@@ ready` and hangs.
pub async fn worker_process(entry: &str) {
    let Ok(url) = std::env::var("RHEO_SQL_WORKER") else {
        println!("{entry}: run by the scale-out cases with RHEO_SQL_WORKER set; nothing to do");
        return;
    };
    let mode = std::env::var("RHEO_SQL_WORKER_MODE").unwrap_or_default();
    let rheo = Rheo::builder().consumer_id(format!("w{}", std::process::id())).open(&url).await.expect("worker opens");
    if mode == "hang" {
        let leases = rheo
            .fetch("jobs", "workers", FetchOptions::new().limit(50).lease(Duration::from_secs(2)))
            .await
            .expect("fetch");
        let acked: Vec<_> = leases.iter().take(10).collect();
        let results = rheo.ack_many(acked.iter().copied()).await.expect("ack_many");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        for l in &acked {
            println!("@@ A {} {}", l.partition(), l.sequence());
        }
        for l in leases.iter().skip(10) {
            println!("@@ L {} {}", l.partition(), l.sequence());
        }
        println!("@@ ready");
        tokio::time::sleep(Duration::from_secs(600)).await;
        return;
    }
    let mut empty = 0;
    let mut out = String::new();
    loop {
        let leases = rheo
            .fetch("jobs", "workers", FetchOptions::new().limit(100).lease(Duration::from_secs(30)))
            .await
            .expect("fetch");
        let from = now_ms();
        if leases.is_empty() {
            empty += 1;
            if empty >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        empty = 0;
        let to = now_ms();
        let results = rheo.ack_many(&leases).await.expect("ack_many");
        for (l, r) in leases.iter().zip(results) {
            r.expect("an ack of a lease held");
            out.push_str(&format!("@@ H {} {} {from} {to}\n", l.partition(), l.sequence()));
        }
    }
    print!("{out}");
    println!("@@ done");
}

/// A worker process of this test binary.
pub fn worker(entry: &str, url: &str, mode: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary");
    let mut c = Command::new(exe);
    c.args(["--exact", entry, "--ignored", "--nocapture", "--test-threads=1"])
        .env("RHEO_SQL_WORKER", url)
        .env("RHEO_SQL_WORKER_MODE", mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    c
}

/// (partition, sequence) -> the intervals its holders certainly held it.
pub type Held = BTreeMap<(u32, u64), Vec<(i64, i64)>>;

/// The fields of a worker's record on a line (after its `@@` marker).
pub fn record(line: &str) -> Vec<&str> {
    line.find("@@ ").map(|i| line[i + 3..].split_whitespace().collect()).unwrap_or_default()
}

fn read_worker(lines: impl Iterator<Item = String>, held: &mut Held) -> bool {
    let mut done = false;
    for line in lines {
        let f = record(&line);
        match f.as_slice() {
            ["H", p, s, a, b] => held
                .entry((p.parse().expect("p"), s.parse().expect("s")))
                .or_default()
                .push((a.parse().expect("from"), b.parse().expect("to"))),
            ["done"] => done = true,
            _ => {}
        }
    }
    done
}

/// `events` events in 4 partitions, consumed by each count of worker
/// processes in `procs` in turn (the group reset between): every event is
/// handled exactly once and no two processes ever hold one lease at once.
/// Prints the events/s of each count.
pub async fn processes_share_a_group(url: &str, entry: &str, events: usize, procs: &[usize]) {
    let rheo = Rheo::open(url).await.expect("open");
    rheo.create_stream("jobs", StreamOptions::new().partitions(4)).await.expect("stream");
    rheo.create_group("jobs", "workers", GroupOptions::new()).await.expect("group");
    let t0 = Instant::now();
    fill(&rheo, "jobs", events).await;
    println!("appended {events} events in {:?}", t0.elapsed());
    let mut figures = Vec::new();
    for &n in procs {
        rheo.reset_group("jobs", "workers", ResetOptions::confirmed()).await.expect("reset");
        let started = Instant::now();
        let children: Vec<_> = (0..n).map(|_| worker(entry, url, "run").spawn().expect("spawn a worker")).collect();
        let mut held: Held = BTreeMap::new();
        let mut done = 0;
        for mut child in children {
            let out = child.stdout.take().expect("stdout");
            if read_worker(BufReader::new(out).lines().map_while(Result::ok), &mut held) {
                done += 1;
            }
            assert!(child.wait().expect("wait").success(), "a worker failed");
        }
        let elapsed = started.elapsed();
        assert_eq!(done, n, "every worker finished");
        assert_eq!(held.len(), events, "{n} processes: every event handled");
        let mut per_worker_dupes = 0;
        for (pos, intervals) in &held {
            per_worker_dupes += intervals.len() - 1;
            let mut iv = intervals.clone();
            iv.sort_unstable();
            for w in iv.windows(2) {
                assert!(w[0].1 < w[1].0, "{pos:?} held by two consumers at once: {:?} and {:?}", w[0], w[1]);
            }
        }
        assert_eq!(per_worker_dupes, 0, "no faults, no lease expiry: each event handled once");
        assert_eq!(rheo.lag("jobs", "workers").await.expect("lag").total, 0);
        let rate = events as f64 / elapsed.as_secs_f64();
        println!("scale-out: {n} process(es): {events} events in {elapsed:?}: {rate:.0} events/s");
        figures.push((n, rate));
    }
    println!("SCALE-OUT FIGURES (processes, events/s): {figures:?}");
}

/// A consumer process acks 10 of a batch of 50 and is SIGKILLed: before
/// its leases expire a survivor gets only the 30 never fetched; after
/// expiry exactly the dead consumer's 40 come back (second attempt), never
/// its 10 acked.
pub async fn killed_mid_batch(url: &str, entry: &str) {
    let rheo = Rheo::builder().consumer_id("survivor").open(url).await.expect("open");
    rheo.create_stream("jobs", StreamOptions::new().partitions(2)).await.expect("stream");
    rheo.create_group("jobs", "workers", GroupOptions::new()).await.expect("group");
    fill(&rheo, "jobs", 80).await;
    let mut child = worker(entry, url, "hang").spawn().expect("spawn");
    let out = child.stdout.take().expect("stdout");
    let mut acked = HashSet::new();
    let mut leased = HashSet::new();
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        let f = record(&line);
        match f.as_slice() {
            ["A", p, s] => {
                acked.insert((p.parse::<u32>().expect("p"), s.parse::<u64>().expect("s")));
            }
            ["L", p, s] => {
                leased.insert((p.parse::<u32>().expect("p"), s.parse::<u64>().expect("s")));
            }
            ["ready"] => break,
            _ => {}
        }
    }
    assert_eq!((acked.len(), leased.len()), (10, 40), "the child acked 10 of a batch of 50");
    // SIGKILL mid-batch.
    child.kill().expect("kill");
    child.wait().expect("reap");
    let first = rheo.fetch("jobs", "workers", FetchOptions::new().limit(100)).await.expect("fetch");
    let first: HashSet<(u32, u64)> = first.iter().map(|l| (l.partition(), l.sequence())).collect();
    assert_eq!(first.len(), 30, "the 30 never fetched");
    assert!(first.is_disjoint(&leased) && first.is_disjoint(&acked));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut again = HashSet::new();
    while again.len() < 40 && Instant::now() < deadline {
        for l in rheo.fetch("jobs", "workers", FetchOptions::new().limit(100)).await.expect("fetch") {
            assert_eq!(l.attempt, 2, "{:?}: its second claim", (l.partition(), l.sequence()));
            again.insert((l.partition(), l.sequence()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(again, leased, "exactly the leases the killed consumer held are redelivered");
    assert!(again.is_disjoint(&acked), "nothing acked is redelivered");
}
