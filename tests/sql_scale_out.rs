//! PostgreSQL scale-out and faults: several OS processes (this test binary
//! re-run as workers) compete on one group of one database; a consumer
//! process is SIGKILLed mid-batch; the server is restarted under a running
//! consumer; a statement timeout is never a wrong answer.
//!
//! Every case needs a PostgreSQL server (`RHEO_POSTGRES_URL`) and is
//! ignored by a plain `cargo test`; `.ci/run` starts one and runs them.
//! The restart case (`pgrestart_*`) also needs `PGBIN` and `PG_CTL_DATA`
//! (set by `.ci/services.sh`) and restarts the server, so .ci/run runs it
//! on its own, after the others.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rheo::{Error, FetchOptions, GroupOptions, Outcome, ResetOptions, Rheo, StreamOptions, handler_fn};
use serde_json::json;

const IGNORE: &str = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set";

fn now_ms() -> i64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    i64::try_from(t.as_millis()).expect("ms")
}

fn url_in(schema: &str, pool: u32) -> String {
    let base = common::postgres_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}rheo_schema={schema}&rheo_pool={pool}")
}

fn fresh_schema(tag: &str) -> String {
    format!("{tag}_{}", uuid::Uuid::new_v4().simple())
}

/// Appends `n` events of about 200 bytes to `stream` in batches of 1000.
async fn fill(rheo: &Rheo, stream: &str, n: usize) {
    let pad = "x".repeat(160);
    let mut i = 0;
    while i < n {
        let batch: Vec<serde_json::Value> =
            (i..(i + 1000).min(n)).map(|k| json!({"type": "tick", "n": k, "pad": pad})).collect();
        rheo.append_batch(stream, &batch).await.expect("append a batch");
        i += batch.len();
    }
}

// ---------------------------------------------------------------------------
// Worker: one consumer process (this binary, re-run by the parent)
// ---------------------------------------------------------------------------

/// The worker's entry point. Run by the parent with `RHEO_SQL_WORKER` set
/// to the URL (a plain run, without it, has nothing to do and says so).
/// It prints one line per delivery it handled,
/// `@@ H <partition> <sequence> <held_from_ms> <held_to_ms>` (an interval in
/// which it certainly held the lease: from when the fetch returned to
/// when the ack was sent), then `@@ done`. (The marker finds the record on a
/// line the test harness began with its own text.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of the scale-out cases (run by them)"]
async fn postgres_worker_process() {
    let Ok(url) = std::env::var("RHEO_SQL_WORKER") else {
        println!("postgres_worker_process: run by postgres_scale_out_* with RHEO_SQL_WORKER set; nothing to do");
        return;
    };
    let mode = std::env::var("RHEO_SQL_WORKER_MODE").unwrap_or_default();
    let rheo = Rheo::builder().consumer_id(format!("w{}", std::process::id())).open(&url).await.expect("worker opens");
    if mode == "hang" {
        // Fetch a batch, ack its first 10, say which, then hang holding the rest.
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

fn worker(url: &str, mode: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary");
    let mut c = Command::new(exe);
    c.args(["--exact", "postgres_worker_process", "--ignored", "--nocapture", "--test-threads=1"])
        .env("RHEO_SQL_WORKER", url)
        .env("RHEO_SQL_WORKER_MODE", mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    c
}

/// (partition, sequence) -> the intervals its holders certainly held it.
type Held = BTreeMap<(u32, u64), Vec<(i64, i64)>>;

/// The fields of a worker's record on a line (after its `@@` marker).
fn record(line: &str) -> Vec<&str> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_scale_out_processes_share_a_group_and_never_double_lease() {
    let _ = IGNORE;
    const EVENTS: usize = 20_000;
    let schema = fresh_schema("scale");
    let url = url_in(&schema, 4);
    let rheo = Rheo::open(&url).await.expect("open");
    rheo.create_stream("jobs", StreamOptions::new().partitions(4)).await.expect("stream");
    rheo.create_group("jobs", "workers", GroupOptions::new()).await.expect("group");
    let t0 = Instant::now();
    fill(&rheo, "jobs", EVENTS).await;
    println!("appended {EVENTS} events in {:?}", t0.elapsed());
    let mut figures = Vec::new();
    for procs in [1usize, 2, 4] {
        rheo.reset_group("jobs", "workers", ResetOptions::confirmed()).await.expect("reset");
        let started = Instant::now();
        let children: Vec<_> = (0..procs).map(|_| worker(&url, "run").spawn().expect("spawn a worker")).collect();
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
        assert_eq!(done, procs, "every worker finished");
        assert_eq!(held.len(), EVENTS, "{procs} processes: every event handled");
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
        let rate = EVENTS as f64 / elapsed.as_secs_f64();
        println!("scale-out: {procs} process(es): {EVENTS} events in {elapsed:?}: {rate:.0} events/s");
        figures.push((procs, rate));
    }
    println!("SCALE-OUT FIGURES (processes, events/s): {figures:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_consumer_killed_mid_batch_is_redelivered_but_not_what_it_acked() {
    let schema = fresh_schema("kill");
    let url = url_in(&schema, 4);
    let rheo = Rheo::builder().consumer_id("survivor").open(&url).await.expect("open");
    rheo.create_stream("jobs", StreamOptions::new().partitions(2)).await.expect("stream");
    rheo.create_group("jobs", "workers", GroupOptions::new()).await.expect("group");
    fill(&rheo, "jobs", 80).await;
    let mut child = worker(&url, "hang").spawn().expect("spawn");
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
    // Before its leases expire, the survivor gets only what nobody holds.
    let first = rheo.fetch("jobs", "workers", FetchOptions::new().limit(100)).await.expect("fetch");
    let first: HashSet<(u32, u64)> = first.iter().map(|l| (l.partition(), l.sequence())).collect();
    assert_eq!(first.len(), 30, "the 30 never fetched");
    assert!(first.is_disjoint(&leased) && first.is_disjoint(&acked));
    // After expiry (2 s, the database's clock), the dead consumer's 40 come back, never its 10 acked.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_statement_timeout_is_unavailable_or_ambiguous_never_a_wrong_answer() {
    let schema = fresh_schema("timeout");
    let rheo = Rheo::open(&format!("{}&rheo_statement_timeout_ms=300", url_in(&schema, 4))).await.expect("open");
    rheo.create_stream("jobs", StreamOptions::new()).await.expect("stream");
    rheo.create_group("jobs", "workers", GroupOptions::new()).await.expect("group");
    fill(&rheo, "jobs", 5).await;
    let leases = rheo.fetch("jobs", "workers", FetchOptions::new()).await.expect("fetch");
    // Another session holds the group row: an ack waits on it past the timeout.
    let admin =
        sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&common::postgres_url()).await.expect("admin");
    let mut blocker = admin.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT 1 FROM \"{schema}\".rheo_groups FOR UPDATE")))
        .execute(&mut *blocker)
        .await
        .expect("lock the group row");
    let err = rheo.ack(&leases[0]).await.expect_err("the ack times out");
    assert!(
        matches!(err, Error::BackendUnavailable { .. } | Error::Ambiguous { .. }),
        "a timeout is not a definite answer: {err:?}"
    );
    blocker.rollback().await.expect("release");
    // The timed-out ack changed nothing: the lease still holds and acks now.
    rheo.ack(&leases[0]).await.expect("the ack, again");
    assert!(rheo.ack(&leases[0]).await.is_err_and(|e| e.is_stale_lease()));
    let rest: Vec<_> = leases[1..].to_vec();
    assert!(rheo.ack_many(&rest).await.expect("acks").iter().all(Result::is_ok));
    assert_eq!(rheo.lag("jobs", "workers").await.expect("lag").total, 0);
}

/// Restarts the server `RHEO_POSTGRES_URL` names (`pg_ctl restart -m fast`
/// as the postgres user).
fn restart_postgres() {
    let bin = std::env::var("PGBIN").expect("PGBIN (set by .ci/services.sh)");
    let data = std::env::var("PG_CTL_DATA").expect("PG_CTL_DATA (set by .ci/services.sh)");
    let status = Command::new("runuser")
        .args(["-u", "postgres", "--", &format!("{bin}/pg_ctl"), "-D", &data, "-m", "fast", "-w", "restart"])
        .stdout(Stdio::null())
        .status()
        .expect("run pg_ctl");
    assert!(status.success(), "pg_ctl restart failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts PostgreSQL: .ci/run runs it alone with PGBIN and PG_CTL_DATA set"]
async fn pgrestart_runtime_survives_a_server_restart_and_loses_nothing() {
    const EVENTS: usize = 3_000;
    let schema = fresh_schema("restart");
    let url = format!("{}&rheo_connect_timeout_ms=1000", url_in(&schema, 4));
    let rheo = Rheo::open(&url).await.expect("open");
    rheo.create_stream("jobs", StreamOptions::new().partitions(2)).await.expect("stream");
    rheo.create_group("jobs", "workers", GroupOptions::new()).await.expect("group");
    fill(&rheo, "jobs", EVENTS).await;
    let seen: Arc<Mutex<HashMap<(u32, u64), u32>>> = Arc::default();
    let handled = seen.clone();
    let handle = rheo
        .consumer("jobs", "workers")
        .max_demand(50)
        .concurrency(4)
        .lease(Duration::from_secs(5))
        .poll(Duration::from_millis(50))
        .spawn(handler_fn(move |lease| {
            let handled = handled.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                *handled.lock().expect("lock").entry((lease.partition(), lease.sequence())).or_default() += 1;
                Outcome::Ack
            }
        }))
        .await
        .expect("spawn the consumer");
    // Restart once a third is handled.
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.lock().expect("lock").len() < EVENTS / 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = seen.lock().expect("lock").len();
    assert!(before < EVENTS, "the restart comes mid-run");
    restart_postgres();
    println!("restarted postgres with {before} of {EVENTS} handled");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let lag = rheo.lag("jobs", "workers").await.map(|l| l.total).unwrap_or(u64::MAX);
        if lag == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let summary = handle.shutdown().await.expect("shutdown");
    let seen = std::mem::take(&mut *seen.lock().expect("lock"));
    assert_eq!(seen.len(), EVENTS, "every event handled after the restart: {summary:?}");
    assert_eq!(rheo.lag("jobs", "workers").await.expect("lag").total, 0, "{summary:?}");
    let again = seen.values().filter(|&&n| n > 1).count();
    println!("restart: {summary:?}; {again} events handled twice (at least once: allowed)");
}
