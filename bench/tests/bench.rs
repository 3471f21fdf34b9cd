//! The `rheo-bench` binary: every workload's counts against the store it
//! wrote (on the embedded backends and SQLite here, on the database servers
//! in `.ci/run`), its table, its saved runs and report, and bad arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rheo-bench")).args(args).output().expect("run rheo-bench")
}

/// The lag of the `bench` group on `stream` at `url`, opened by this process
/// once the bench has exited: (events stored, events unsettled).
fn stored_and_unsettled(url: &str, stream: &str) -> (u64, u64) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let rheo = rheo::Rheo::open(url).await.unwrap();
        let lag = rheo.lag(stream, "bench").await.unwrap();
        (lag.partitions.iter().map(|p| p.high_watermark).sum(), lag.total)
    })
}

/// Runs every bench workload for a few hundred events on `url` (with 2
/// processes too where the backend is shared) and checks that each case
/// reports the events it processed: the counts against the workload's
/// arithmetic, and the stream and group it left behind against the store
/// (durable backends, which this process can open once the bench exits).
fn bench_counts(url: &str, shared: bool) {
    let processes = if shared { "1,2" } else { "1" };
    let out = bench(&[
        "--backend",
        url,
        "--json",
        "--events",
        "300",
        "--batch",
        "10",
        "--producers",
        "1,3",
        "--consumers",
        "1,2",
        "--processes",
        processes,
        "--fsync-seconds",
        "0.05",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cases = run["cases"].as_array().unwrap();
    let procs = if shared { 2 } else { 1 };
    // append and append-batch: 2 producer counts; consume and query: 2
    // consumer counts; end to end: both; each per process count.
    assert_eq!(cases.len(), procs * (2 + 2 + 2 + 4 + 2), "{run}");
    assert_eq!(run["machine"]["cpus"].as_u64(), Some(std::thread::available_parallelism().unwrap().get() as u64));
    for c in cases {
        let w = c["workload"].as_str().unwrap();
        let events = c["events"].as_u64().unwrap();
        let ops = c["ops"].as_u64().unwrap();
        match w {
            "append" => assert_eq!((events, ops), (300, 300), "{c}"),
            "append-batch" => assert_eq!(events, 300, "{c}"),
            "consume" | "end-to-end" => assert_eq!(events, 300, "{c}"),
            // 30 queries (300 / batch 10) per process share, each for a value
            // of `k` that 3 of the 300 events hold.
            "query" => assert_eq!((events, ops), (90, 30), "{c}"),
            other => panic!("unexpected workload {other}"),
        }
        assert!(c["events_per_sec"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["latency"]["p50_us"].as_u64().unwrap() <= c["latency"]["p99_us"].as_u64().unwrap(), "{c}");
        if c["durable"] == true {
            assert!(c["fsync_per_sec"].as_f64().unwrap() > 0.0, "{c}");
            let (stored, unsettled) = stored_and_unsettled(url, c["stream"].as_str().unwrap());
            assert_eq!(stored, 300, "{c}");
            let expected = if matches!(w, "consume" | "end-to-end") { 0 } else { 300 };
            assert_eq!(unsettled, expected, "{c}");
        }
    }
}

#[test]
fn bench_counts_are_the_events_processed() {
    let dir = tempfile::tempdir().unwrap();
    bench_counts(&format!("native:{}", dir.path().join("n").display()), false);
    bench_counts("memory:", false);
    bench_counts(&format!("sqlite:{}", dir.path().join("s.db").display()), true);
}

/// The engine level beside the facade in one run: `engine:` runs the
/// append workloads (and says it does not run the others), stores every
/// event it counts, and its rows sit beside native's with a "vs native".
#[test]
fn the_engine_level_runs_beside_native_and_stores_what_it_counts() {
    let dir = tempfile::tempdir().unwrap();
    let native = format!("native:{}", dir.path().join("n").display());
    let engine_dir = dir.path().join("e");
    let engine = format!("engine:{}?durability=none", engine_dir.display());
    let args = ["--json", "--events", "300", "--batch", "10", "--producers", "1,3", "--fsync-seconds", "0.05"];
    let out = bench(&[&["--backend", &native, "--backend", &engine][..], &args[..]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cases = run["cases"].as_array().unwrap();
    let on_engine: Vec<&Value> = cases.iter().filter(|c| c["backend"] == "engine (durability=none)").collect();
    // append and append-batch, 1 and 3 producers each.
    assert_eq!(on_engine.len(), 4, "{run}");
    assert!(
        run["skipped"].as_array().unwrap().iter().any(|s| s == "consume on engine (durability=none): not supported"),
        "{run}"
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for c in on_engine {
        assert_eq!(c["events"].as_u64(), Some(300), "{c}");
        assert!(c["events_per_sec"].as_f64().unwrap() > 0.0, "{c}");
        // The directory is a native one: every event counted is stored.
        let stream = c["stream"].as_str().unwrap().to_owned();
        let url = format!("native:{}", engine_dir.display());
        let stored: u64 = rt.block_on(async {
            let rheo = rheo::Rheo::open(&url).await.unwrap();
            let info = rheo.stream_info(&stream).await.unwrap();
            let mut n = 0;
            for p in 0..info.partition_count {
                n += rheo.read(&stream, p, 0, 1000).await.unwrap().len() as u64;
            }
            n
        });
        assert_eq!(stored, 300, "{c}");
    }
    // The table names both, with a ratio to native.
    let out = bench(&["--backend", &native, "--backend", &engine, "--events", "50", "--workload", "append"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("engine (durability=none)") && text.contains("native"), "{text}");
}

#[test]
#[ignore = "needs PostgreSQL: RHEO_POSTGRES_URL (.ci/run starts one)"]
fn bench_counts_on_postgres() {
    bench_counts(&std::env::var("RHEO_POSTGRES_URL").expect("RHEO_POSTGRES_URL"), true);
}

#[test]
#[ignore = "needs a MongoDB replica set: RHEO_MONGO_URL (.ci/run starts one)"]
fn bench_counts_on_mongo() {
    bench_counts(&std::env::var("RHEO_MONGO_URL").expect("RHEO_MONGO_URL"), true);
}

#[test]
#[ignore = "needs a Redis server: RHEO_REDIS_URL (.ci/run starts one)"]
fn bench_counts_on_redis() {
    let base = std::env::var("RHEO_REDIS_URL").expect("RHEO_REDIS_URL");
    let sep = if base.contains('?') { '&' } else { '?' };
    bench_counts(&format!("{base}{sep}rheo_namespace=t_bench_{}", std::process::id()), true);
}

#[test]
fn bench_output_report_and_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let native = format!("native:{}", dir.path().join("n").display());
    // The table on stdout names every case.
    let out = bench(&["--backend", &native, "--events", "50", "--workload", "append", "--workload", "consume"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("| native") && text.contains("append") && text.contains("consume"), "{text}");
    // A run saved as JSON comes back into a report with a new run beside it.
    let saved = dir.path().join("run.json");
    let out = bench(&["--backend", &native, "--json", "--events", "50", "--workload", "append"]);
    assert!(out.status.success());
    std::fs::write(&saved, &out.stdout).unwrap();
    let report = dir.path().join("report");
    let out = bench(&[
        "--backend",
        "memory:",
        "--json",
        "--events",
        "50",
        "--workload",
        "append",
        "--producers",
        "1,4",
        "--from",
        saved.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let backends: Vec<&str> = run["cases"].as_array().unwrap().iter().map(|c| c["backend"].as_str().unwrap()).collect();
    assert_eq!(backends, ["native", "memory", "memory"]);
    let md = std::fs::read_to_string(report.join("backends.md")).unwrap();
    assert!(md.contains("| native | rheo-bench |") && md.contains("| memory | rheo-bench |"), "{md}");
    for chart in ["throughput.svg", "latency.svg", "scale-append-producers.svg"] {
        assert!(std::fs::read_to_string(report.join(chart)).unwrap().starts_with("<svg"), "{chart}");
    }
    // No progress bar off a terminal: stderr holds one line per case.
    let out = bench(&["--backend", "memory:", "--events", "50", "--workload", "consume"]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    assert!(!stderr.contains('\r'), "{stderr:?}");
    // Bad values exit 2 and say which.
    for (args, says) in [
        (&["--events", "0"][..], "--events"),
        (&["--batch", "20000"][..], "--batch"),
        (&["--producers", "1,0"][..], "--producers"),
        (&["--processes", "100"][..], "--processes"),
    ] {
        let out = bench(&[&["--backend", "memory:"][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{args:?}");
    }
    // A peer needs the `peers` build.
    let out = bench(&["--backend", "redis-streams://127.0.0.1:1/", "--events", "10"]);
    assert!(!out.status.success());
}
