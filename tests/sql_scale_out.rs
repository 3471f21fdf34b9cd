//! PostgreSQL scale-out and faults: several OS processes (this test binary
//! re-run as workers) compete on one group of one database; a consumer
//! process is SIGKILLed mid-batch; the server is restarted under a running
//! consumer; a statement timeout is never a wrong answer.
//!
//! Every PostgreSQL case needs a server (`RHEO_POSTGRES_URL`) and is
//! ignored by a plain `cargo test`; `.ci/run` starts one and runs them.
//! The SQLite cases (4 and 8 processes on one database file) run in a
//! plain `cargo test`.
//! The restart case (`pgrestart_*`) also needs `PGBIN` and `PG_CTL_DATA`
//! (set by `.ci/services.sh`) and restarts the server, so .ci/run runs it
//! on its own, after the others.

mod common;
#[path = "common/proxy.rs"]
mod proxy;
#[path = "common/scale.rs"]
mod scale;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rheo::{Error, FetchOptions, GroupOptions, Outcome, Rheo, StreamOptions, handler_fn};

const IGNORE: &str = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set";

fn url_in(schema: &str, pool: u32) -> String {
    let base = common::postgres_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}rheo_schema={schema}&rheo_pool={pool}")
}

fn fresh_schema(tag: &str) -> String {
    format!("{tag}_{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of the scale-out cases (run by them)"]
async fn postgres_worker_process() {
    scale::worker_process("postgres_worker_process").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of the SQLite scale-out case (run by it)"]
async fn sqlite_worker_process() {
    scale::worker_process("sqlite_worker_process").await;
}

/// 4 and then 8 OS processes, 2 consumers' worth of calls each, compete on
/// one group of one SQLite file: SQLite's single write lock is contended
/// all the time, and no caller may see `database is locked` or a pool
/// timeout; no event is leased by two processes at once, each is acked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_processes_compete_on_one_file_and_never_see_a_lock_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A short busy timeout: writers wait past it all the time, and the
    // backend must run their transactions again rather than fail them.
    let url =
        format!("sqlite:{}?rheo_retention_interval_ms=0&busy_timeout_ms=20", dir.path().join("scale.db").display());
    scale::processes_share_a_group(&url, "sqlite_worker_process", 4_000, &[4, 8]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_scale_out_processes_share_a_group_and_never_double_lease() {
    let _ = IGNORE;
    let url = url_in(&fresh_schema("scale"), 4);
    scale::processes_share_a_group(&url, "postgres_worker_process", 20_000, &[1, 2, 4]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_consumer_killed_mid_batch_is_redelivered_but_not_what_it_acked() {
    let url = url_in(&fresh_schema("kill"), 4);
    scale::killed_mid_batch(&url, "postgres_worker_process").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_statement_timeout_is_unavailable_or_ambiguous_never_a_wrong_answer() {
    let schema = fresh_schema("timeout");
    let rheo = Rheo::open(&format!("{}&rheo_statement_timeout_ms=300", url_in(&schema, 4))).await.expect("open");
    rheo.create_stream("jobs", StreamOptions::new()).await.expect("stream");
    rheo.create_group("jobs", "workers", GroupOptions::new()).await.expect("group");
    scale::fill(&rheo, "jobs", 5).await;
    let leases = rheo.fetch("jobs", "workers", FetchOptions::new()).await.expect("fetch");
    // Another session holds the claim rows (an ack of claimed leases
    // writes nothing else): the ack waits on them past the timeout.
    let admin =
        sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&common::postgres_url()).await.expect("admin");
    let mut blocker = admin.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT 1 FROM \"{schema}\".rheo_rs_claims FOR UPDATE")))
        .execute(&mut *blocker)
        .await
        .expect("lock the claims");
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
    scale::fill(&rheo, "jobs", EVENTS).await;
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

/// The reference implementation's append, as ADAPTERS.md gives its
/// statements: in one transaction, reserve `n` sequences on the counter
/// row (`UPDATE … RETURNING next_sequence`, PostgreSQL's form; the row
/// lock serializes appenders), then one `INSERT` per event.
async fn reference_append(pool: &sqlx::PgPool, schema: &str, stream: &str, partition: i32, ids: &[String]) {
    let mut tx = pool.begin().await.expect("begin");
    let n = ids.len() as i64;
    let last: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{schema}\".rheo_stream_sequences SET next_sequence = next_sequence + $1 \
         WHERE stream = $2 AND partition = $3 RETURNING next_sequence"
    )))
    .bind(n)
    .bind(stream)
    .bind(partition)
    .fetch_one(&mut *tx)
    .await
    .expect("reserve");
    for (k, id) in ids.iter().enumerate() {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{schema}\".rheo_events (id, stream, partition, sequence, \"timestamp\", \"key\", \"type\", metadata, payload) \
             VALUES ($1, $2, $3, $4, now(), NULL, 'ref', '{{}}'::jsonb, '{{\"ref\": true}}'::jsonb)"
        )))
        .bind(id)
        .bind(stream)
        .bind(partition)
        .bind(last - n + 1 + k as i64)
        .execute(&mut *tx)
        .await
        .expect("insert");
    }
    tx.commit().await.expect("commit");
}

/// An Elixir Rheo and this crate append to one stream at once through the
/// same counter rows: the reference's statements (4 tasks, 3 events a
/// transaction) beside combined appends (32 tasks, single events and
/// batches spanning both partitions). Every partition ends gapless, each
/// sequence holds exactly one event, and every position a Rust append
/// answered holds the event it appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_reference_appends_interleave_with_combined_appends() {
    use std::collections::BTreeMap;
    let schema = fresh_schema("mixed");
    let rheo = Arc::new(Rheo::open(&url_in(&schema, 8)).await.expect("open"));
    rheo.create_stream("mix", StreamOptions::new().partitions(2)).await.expect("stream");
    let admin =
        sqlx::postgres::PgPoolOptions::new().max_connections(4).connect(&common::postgres_url()).await.expect("admin");
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..4 {
        let (pool, schema) = (admin.clone(), schema.clone());
        tasks.spawn(async move {
            let mut answered = Vec::new();
            for i in 0..40i32 {
                let ids: Vec<String> = (0..3).map(|k| format!("ref-{t}-{i}-{k}")).collect();
                reference_append(&pool, &schema, "mix", i % 2, &ids).await;
                answered.extend(ids.into_iter().map(|id| (id, None)));
            }
            answered
        });
    }
    for t in 0..32u32 {
        let rheo = rheo.clone();
        tasks.spawn(async move {
            let mut answered = Vec::new();
            for i in 0..25u32 {
                if i % 5 == 4 {
                    // A batch across both partitions: atomic, combined apart.
                    let batch: Vec<serde_json::Value> =
                        (0..4).map(|k| serde_json::json!({"t": t, "i": i, "k": k, "key": format!("k{k}")})).collect();
                    for e in rheo.append_batch("mix", &batch).await.expect("append_batch") {
                        answered.push((e.id().to_owned(), Some((e.partition(), e.sequence()))));
                    }
                } else {
                    let e = rheo
                        .append(
                            "mix",
                            &serde_json::json!({"t": t, "i": i}),
                            rheo::AppendOptions::new().partition(i % 2),
                        )
                        .await
                        .expect("append");
                    answered.push((e.id().to_owned(), Some((e.partition(), e.sequence()))));
                }
            }
            answered
        });
    }
    let mut expected: BTreeMap<String, Option<(u32, u64)>> = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        expected.extend(done.expect("task"));
    }
    assert_eq!(expected.len(), 4 * 40 * 3 + 32 * (20 + 5 * 4), "every id is distinct");
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, partition, sequence FROM \"{schema}\".rheo_events WHERE stream = 'mix' ORDER BY partition, sequence"
    )))
    .fetch_all(&admin)
    .await
    .expect("read back");
    assert_eq!(rows.len(), expected.len(), "every event stored once");
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for (id, p, seq) in &rows {
        let n = next.entry(*p).or_insert(1);
        assert_eq!(*seq, *n, "partition {p}: gapless and each sequence once");
        *n += 1;
        match expected.get(id) {
            Some(Some(pos)) => assert_eq!(*pos, (*p as u32, *seq as u64), "event {id}: where its append said"),
            Some(None) => {}
            None => panic!("event {id} was not appended by anyone"),
        }
    }
    let hw: Vec<(i32, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT partition, next_sequence FROM \"{schema}\".rheo_stream_sequences WHERE stream = 'mix' ORDER BY partition"
    )))
    .fetch_all(&admin)
    .await
    .expect("counters");
    for (p, last) in hw {
        assert_eq!(
            next.get(&p).copied().unwrap_or(1) - 1,
            last,
            "partition {p}: the counter row names the last sequence"
        );
    }
}

/// What an append under faults was answered.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Stored(u32, u64),
    Unavailable,
    Ambiguous,
}

/// Cuts, cuts mid-reply and delays, at random moments, for `run`.
async fn chaos(p: &proxy::Proxy, run: Duration) -> usize {
    let started = Instant::now();
    let mut faults = 0;
    while started.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(40 + (faults as u64 * 37) % 80)).await;
        match faults % 3 {
            0 => p.cut_all(),
            1 => {
                p.cut_mid_reply(true);
                tokio::time::sleep(Duration::from_millis(30)).await;
                p.cut_mid_reply(false);
            }
            _ => {
                p.delay(Duration::from_millis(15));
                tokio::time::sleep(Duration::from_millis(100)).await;
                p.delay(Duration::ZERO);
            }
        }
        faults += 1;
    }
    faults
}

/// A fault-injecting proxy between the backend and PostgreSQL drops
/// connections, cuts them mid-reply and delays them, under the append and
/// ack combiners. Then: every acknowledged append is stored once where it
/// was answered; an append refused as unavailable is not stored; an
/// ambiguous one at most once; an ambiguous append retried with its id is
/// stored once; no delivery is handed to two fetches while its 5 s lease
/// runs; an acknowledged ack is never delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_faults_between_backend_and_server_lose_nothing_acknowledged() {
    use std::collections::{BTreeMap, BTreeSet};
    let schema = fresh_schema("faults");
    let base = common::postgres_url();
    let hostport = base
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("RHEO_POSTGRES_URL names host:port")
        .to_owned();
    let upstream: std::net::SocketAddr = hostport.parse().expect("a loopback address with a port");
    let px = proxy::Proxy::start(upstream).await;
    let direct = Rheo::open(&url_in(&schema, 2)).await.expect("open directly");
    direct.create_stream("jobs", StreamOptions::new().partitions(2)).await.expect("stream");
    direct.create_group("jobs", "workers", GroupOptions::new()).await.expect("group");
    let via = format!(
        "{}&rheo_connect_timeout_ms=2000&rheo_statement_timeout_ms=3000",
        url_in(&schema, 4).replacen(&hostport, &px.addr.to_string(), 1)
    );
    let rheo = Arc::new(Rheo::open(&via).await.expect("open through the proxy"));

    // Appends under faults: generated ids (combined) and producer ids (retried).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut producers = tokio::task::JoinSet::new();
    for t in 0..8 {
        let (rheo, stop) = (rheo.clone(), stop.clone());
        producers.spawn(async move {
            let mut answers: Vec<(String, Answer)> = Vec::new();
            let mut retried: Vec<String> = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let tag = format!("t{t}-{i}");
                if i % 3 == 0 {
                    let id = format!("id-{tag}");
                    let mut tries = 0;
                    loop {
                        let r = rheo
                            .append("jobs", &serde_json::json!({"tag": tag}), rheo::AppendOptions::new().id(id.clone()))
                            .await;
                        match r {
                            Ok(_) => break,
                            Err(e) if e.is_transient() && tries < 100 => {
                                tries += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(e) => panic!("append {tag} with its id: {e:?}"),
                        }
                    }
                    retried.push(tag);
                } else {
                    let a =
                        match rheo.append("jobs", &serde_json::json!({"tag": tag}), rheo::AppendOptions::new()).await {
                            Ok(e) => Answer::Stored(e.partition(), e.sequence()),
                            Err(Error::BackendUnavailable { .. }) => Answer::Unavailable,
                            Err(Error::Ambiguous { .. }) => Answer::Ambiguous,
                            Err(e) => panic!("append {tag}: neither stored nor a transient error: {e:?}"),
                        };
                    answers.push((tag, a));
                }
                i += 1;
            }
            (answers, retried)
        });
    }
    let faults = chaos(&px, Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut answers: BTreeMap<String, Answer> = BTreeMap::new();
    let mut retried = Vec::new();
    while let Some(done) = producers.join_next().await {
        let (a, r) = done.expect("producer");
        answers.extend(a);
        retried.extend(r);
    }
    let mut stored: BTreeMap<String, Vec<(u32, u64)>> = BTreeMap::new();
    for p in 0..2 {
        let mut after = 0;
        loop {
            let page = direct.read("jobs", p, after, 1000).await.expect("read");
            let Some(last) = page.last() else { break };
            after = last.sequence();
            for e in &page {
                let tag = e.field("tag").and_then(|v| v.as_str().map(str::to_owned)).expect("a tag");
                stored.entry(tag).or_default().push((e.partition(), e.sequence()));
            }
        }
    }
    let (mut ok, mut unavailable, mut ambiguous) = (0, 0, 0);
    for (tag, a) in &answers {
        let found = stored.get(tag).cloned().unwrap_or_default();
        match a {
            Answer::Stored(p, s) => {
                ok += 1;
                assert_eq!(found, vec![(*p, *s)], "{tag}: acknowledged, stored once where it was answered");
            }
            Answer::Unavailable => {
                unavailable += 1;
                assert!(found.is_empty(), "{tag}: answered unavailable, yet stored at {found:?}");
            }
            Answer::Ambiguous => {
                ambiguous += 1;
                assert!(found.len() <= 1, "{tag}: ambiguous, stored {} times", found.len());
            }
        }
    }
    for tag in &retried {
        assert_eq!(stored.get(tag).map(Vec::len), Some(1), "{tag}: retried with its id, stored once");
    }
    println!(
        "FAULTS appends: {faults} faults; {ok} stored, {unavailable} unavailable, {ambiguous} ambiguous, {} retried by id",
        retried.len()
    );
    assert!(ok > 0 && faults > 10, "the run appended through the faults");

    // Consumers under faults.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut consumers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (rheo, stop) = (rheo.clone(), stop.clone());
        consumers.spawn(async move {
            let mut leased: Vec<(u32, u64)> = Vec::new();
            let mut acked: Vec<(u32, u64)> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let opts = FetchOptions::new().limit(20).lease(Duration::from_secs(5));
                let Ok(leases) = rheo.fetch("jobs", "workers", opts).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if leases.is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                leased.extend(leases.iter().map(|l| (l.partition(), l.sequence())));
                if let Ok(results) = rheo.ack_many(leases.iter()).await {
                    for (l, r) in leases.iter().zip(results) {
                        if r.is_ok() {
                            acked.push((l.partition(), l.sequence()));
                        }
                    }
                }
            }
            (leased, acked)
        });
    }
    let faults = chaos(&px, Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut leased_once: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut acked: BTreeSet<(u32, u64)> = BTreeSet::new();
    while let Some(done) = consumers.join_next().await {
        let (l, a) = done.expect("consumer");
        for pos in l {
            assert!(leased_once.insert(pos), "{pos:?} handed to two fetches while its lease ran");
        }
        acked.extend(a);
    }
    // What is left: never an acknowledged position again.
    let mut rest = 0;
    loop {
        let leases = direct
            .fetch("jobs", "workers", FetchOptions::new().limit(500).lease(Duration::from_millis(200)))
            .await
            .expect("fetch the rest");
        if leases.is_empty() {
            let lag = direct.lag("jobs", "workers").await.expect("lag");
            if lag.total == 0 {
                break;
            }
            // Leases the chaos phase held (or lost with a reply): they expire.
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        for l in &leases {
            let pos = (l.partition(), l.sequence());
            assert!(!acked.contains(&pos), "{pos:?} was acknowledged, yet delivered again");
        }
        rest += leases.len();
        for r in direct.ack_many(leases.iter()).await.expect("ack the rest") {
            r.expect("ack");
        }
    }
    println!("FAULTS consume: {faults} faults; {} acked through them, {rest} after", acked.len());
    assert!(!acked.is_empty(), "the consumers acked through the faults");
}
