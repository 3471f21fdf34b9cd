//! The `rheo` binary, run against a native data directory in a temp dir:
//! every command, the shape of its `--json` output, bad input (one stderr
//! line, non-zero exit), and `verify` finding injected corruption.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// A data directory and the binary pointed at it.
struct Cli {
    dir: tempfile::TempDir,
    /// Extra URL options (`?segment_bytes=4096`).
    options: String,
}

impl Cli {
    fn new() -> Self {
        Cli { dir: tempfile::tempdir().expect("temp dir"), options: String::new() }
    }

    fn with_options(options: &str) -> Self {
        Cli { options: options.to_owned(), ..Cli::new() }
    }

    fn data(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rheo"));
        c.arg("--backend").arg(format!("native:{}{}", self.data().display(), self.options)).args(args);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().expect("run rheo")
    }

    fn run_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rheo");
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
        child.wait_with_output().expect("wait rheo")
    }

    /// Runs and expects success; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "rheo {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    /// Runs with `--json`, expects success, parses the one document.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let text = self.ok(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("rheo {args:?}: not one JSON document ({e}): {text}"))
    }

    /// Runs with `--json`, expects success, parses JSON lines.
    fn json_lines(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        self.ok(&all)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
            .collect()
    }

    /// Runs and expects failure with exactly one `error: ...` line on
    /// stderr; returns that line.
    fn fails(&self, args: &[&str]) -> String {
        fails_with(self.run(args), args)
    }
}

fn fails_with(out: Output, args: &[&str]) -> String {
    assert!(!out.status.success(), "rheo {args:?} should fail; stdout: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8(out.stderr).expect("utf-8 stderr");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "rheo {args:?}: expected one stderr line, got {err:?}");
    assert!(lines[0].starts_with("error: "), "rheo {args:?}: {err:?}");
    lines[0].to_owned()
}

/// Runs the binary on this backend URL.
fn rheo_at(backend: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rheo")).arg("--backend").arg(backend).args(args).output().expect("run rheo")
}

fn payloads(events: &[Value]) -> Vec<Value> {
    events.iter().map(|e| e["payload"].clone()).collect()
}

#[test]
fn stream_create_and_list() {
    let cli = Cli::new();
    let s = cli.json(&["stream", "create", "orders", "--partitions", "3", "--index", "customer"]);
    assert_eq!(s["name"], "orders");
    assert_eq!(s["partition_count"], 3);
    assert!(s["indexes"].as_array().unwrap().iter().any(|i| i.as_str().unwrap().contains("customer")), "{s}");
    let list = cli.json(&["stream", "list"]);
    let list = list.as_array().expect("an array");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], "orders");
    assert_eq!(list[0]["high_watermarks"], serde_json::json!([0, 0, 0]));
    let table = cli.ok(&["stream", "list"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.lines().nth(1).unwrap().starts_with("orders "), "{table}");
    assert!(cli.fails(&["stream", "create", "orders"]).contains("orders"));
}

#[test]
fn stream_info_and_retention() {
    let cli = Cli::with_options("?segment_bytes=4096&preallocate_bytes=1024&retention_interval_ms=0");
    let s = cli.json(&["stream", "create", "audit", "--max-events", "100", "--dedupe-window", "30s"]);
    assert_eq!(s["retention"], serde_json::json!({"max_events": 100, "policy": "limits"}));
    assert_eq!(s["dedupe_window"], 30_000);
    cli.ok(&["group", "create", "audit", "billing"]);
    // In runs of 20 (a batch is written in one segment): many segments.
    for run in 0..20 {
        let lines: String =
            (0..20).map(|n| format!("{{\"n\": {}, \"pad\": \"{}\"}}\n", run * 20 + n, "x".repeat(40))).collect();
        let out = cli.run_stdin(&["append", "audit"], &lines);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let info = cli.json(&["stream", "info", "audit"]);
    assert_eq!(
        (info["partitions"][0]["first_sequence"].as_u64(), info["partitions"][0]["last_sequence"].as_u64()),
        (Some(1), Some(400))
    );
    // A pass now: the limit holds, the group skipped what it never settled.
    let done = cli.json(&["stream", "retention", "audit", "--apply"]);
    let first = done["stream"]["partitions"][0]["first_sequence"].as_u64().expect("first");
    assert!(first > 1 && 400 - first + 1 >= 100, "{done}");
    assert_eq!(done["pass"]["skipped"][0]["skipped"].as_u64(), Some(first - 1), "{done}");
    let g = cli.json(&["group", "info", "audit", "billing"]);
    assert_eq!(g["retention_skipped"].as_u64(), Some(first - 1));
    assert!(cli.ok(&["group", "info", "audit", "billing"]).contains(&format!("skipped by retention {}", first - 1)));
    // Changing one limit keeps the others; --forever clears them.
    let changed = cli.json(&["stream", "retention", "audit", "--max-age", "7d", "--policy", "interest"]);
    assert_eq!(
        changed["retention"],
        serde_json::json!({"max_age": 604_800_000u64, "max_events": 100, "policy": "interest"})
    );
    let text = cli.ok(&["stream", "info", "audit"]);
    assert!(text.contains("max_age 7d, max_events 100 (interest)") && text.contains("dedupe ids   30s"), "{text}");
    assert!(text.contains("PARTITION") && text.contains(&format!("{first}")), "{text}");
    let cleared = cli.json(&["stream", "retention", "audit", "--forever"]);
    assert_eq!(cleared["retention"], serde_json::json!({"policy": "limits"}));
    // Bad values exit 2 with the flag named.
    for (args, flag) in [
        (vec!["stream", "retention", "audit", "--max-age", "7 days"], "--max-age"),
        (vec!["stream", "retention", "audit", "--max-bytes", "lots"], "--max-bytes"),
        (vec!["stream", "retention", "audit", "--max-events", "0"], "--max-events"),
        (vec!["stream", "retention", "audit", "--policy", "both"], "--policy"),
        (vec!["stream", "retention", "audit"], "--max-age"),
    ] {
        let out = cli.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(fails_with(out, &args).contains(flag), "{args:?}");
    }
    assert!(cli.fails(&["stream", "info", "nope"]).contains("nope"));
}

#[test]
fn append_from_arguments_and_stdin_then_read() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s"]);
    let appended = cli.json(&["append", "s", r#"{"n":1}"#, r#"{"n":2}"#, "--key", "k", "--type", "t"]);
    let appended = appended.as_array().expect("an array of events");
    assert_eq!(appended.len(), 2);
    assert_eq!(appended[0]["key"], "k");
    assert_eq!(appended[0]["type"], "t");
    assert_eq!(appended[1]["sequence"], 2);
    assert_eq!(appended[1]["payload"], serde_json::json!({"n": 2, "type": "t"}));

    // From stdin, under --json: each event as a JSON line once appended.
    let out = cli.run_stdin(&["--json", "append", "s"], "{\"n\":3}\n\n{\"n\":4}\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(lines.iter().map(|e| e["sequence"].as_u64().unwrap()).collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(lines[1]["payload"], serde_json::json!({"n": 4}));

    let events = cli.json_lines(&["read", "s", "--partition", "0"]);
    assert_eq!(events.iter().map(|e| e["sequence"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    assert_eq!(events[3]["payload"], serde_json::json!({"n": 4}));
    let after = cli.json_lines(&["read", "s", "--after", "2", "--limit", "1"]);
    assert_eq!(after.len(), 1);
    assert_eq!(after[0]["sequence"], 3);
    assert!(cli.ok(&["read", "s"]).contains("PAYLOAD"));

    // Stdin is appended in batches; a long run prints only its count, and
    // off a terminal no progress at all on stderr.
    let many: String = (0..3200).map(|n| format!("{{\"m\":{n}}}\n")).collect();
    let out = cli.run_stdin(&["append", "s"], &many);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "appended 3200 event(s) to s\n");
    assert_eq!(String::from_utf8(out.stderr).unwrap(), "", "no progress output off a terminal");
    assert_eq!(cli.json(&["stream", "list"])[0]["high_watermarks"], serde_json::json!([3204]));
}

#[test]
fn query_where_values_are_typed() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s", "--partitions", "2"]);
    cli.ok(&["append", "s", r#"{"n":1}"#, r#"{"n":"1"}"#, r#"{"n":2,"s":"1"}"#, r#"{"s":1}"#]);
    let q = |args: &[&str]| {
        let mut all = vec!["query", "s"];
        all.extend_from_slice(args);
        let page = cli.json(&all);
        assert!(page.get("next_cursor").is_some(), "{page}");
        payloads(page["events"].as_array().expect("events"))
    };
    assert_eq!(q(&["--where", "n=1"]), vec![serde_json::json!({"n": 1})]);
    assert_eq!(q(&["--where", "n=\"1\""]), vec![serde_json::json!({"n": "1"})]);
    assert_eq!(q(&["--where", "s=\"1\""]), vec![serde_json::json!({"n": 2, "s": "1"})]);
    assert_eq!(q(&["--where", "s=1"]), vec![serde_json::json!({"s": 1})]);
    assert_eq!(q(&["--where", "n>=1"]).len(), 2);
    assert_eq!(q(&["--where", "n>1"]), vec![serde_json::json!({"n": 2, "s": "1"})]);
    assert_eq!(q(&["--where", "n<2", "--where", "n<=1"]), vec![serde_json::json!({"n": 1})]);
    assert_eq!(q(&["--where", "n in 1,2"]).len(), 2);
    assert_eq!(q(&["--where", "s exists"]).len(), 2);
    assert_eq!(q(&["--where", "s missing"]).len(), 2);
    assert_eq!(q(&["--from", "2999-01-01T00:00:00Z"]).len(), 0);
    assert_eq!(q(&["--to", "0"]).len(), 0);
    assert_eq!(q(&["--after-sequence", "1", "--until-sequence", "3"]).len(), 2);
    assert_eq!(q(&["--order", "timestamp", "--desc"]).len(), 4);

    // Pages follow each other by cursor.
    let first = cli.json(&["query", "s", "--limit", "3", "--order", "partition"]);
    assert_eq!(first["events"].as_array().unwrap().len(), 3);
    let cursor = first["next_cursor"].as_str().expect("a cursor string").to_owned();
    let second = cli.json(&["query", "s", "--limit", "3", "--order", "partition", "--cursor", &cursor]);
    assert_eq!(second["events"].as_array().unwrap().len(), 1);
    assert!(second["next_cursor"].is_null());

    let explained = cli.json(&["query", "s", "--where", "n=1", "--explain"]);
    let explain = explained["explain"].as_array().expect("explain");
    assert!(!explain.is_empty());
    assert!(explain[0]["text"].as_str().unwrap().starts_with("partition "), "{explained}");
    assert!(cli.ok(&["query", "s", "--explain"]).contains("explain:"));
}

#[test]
fn index_create_and_status() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s"]);
    cli.ok(&["append", "s", r#"{"customer":"ada"}"#]);
    let built = cli.json(&["index", "create", "s", "customer"]);
    assert_eq!(built["field"], "payload.customer");
    assert_eq!(built["segments_ready"], built["segments_total"]);
    let status = cli.json(&["index", "status", "s"]);
    let mine = status.as_array().unwrap().iter().find(|s| s["field"] == "payload.customer").expect("listed");
    assert!(mine.get("segments_failed").is_some());
    assert!(cli.ok(&["index", "status", "s"]).contains("payload.customer"));
}

#[test]
fn groups_fetch_ack_reset_replay_and_dead_letters() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s", "--partitions", "2"]);
    cli.ok(&["append", "s", r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#, "--partition", "1"]);
    let g = cli.json(&["group", "create", "s", "g", "--max-attempts", "5"]);
    assert_eq!(g["name"], "g");
    assert_eq!(g["max_attempts"], 5);
    // A keyed group: created with its order, which list and info show.
    let k = cli.json(&["group", "create", "s", "keyed", "--ordered-by-key"]);
    assert_eq!(k["ordered_by_key"], true);
    assert!(cli.ok(&["group", "info", "s", "keyed"]).contains("order        by key"));
    assert!(cli.ok(&["group", "info", "s", "g"]).contains("order        by partition"));
    let list = cli.json(&["group", "list", "s"]);
    assert_eq!(list[0]["name"], "g");
    assert_eq!(list[0].get("ordered_by_key"), None, "not written when false");
    assert_eq!(list[1]["ordered_by_key"], true);
    let lag = cli.json(&["group", "lag", "s", "g"]);
    assert_eq!(lag["total"], 3);
    assert_eq!(lag["partitions"][1]["lag"], 3);
    assert_eq!(lag["partitions"][1]["high_watermark"], 3);

    let leases = cli.json(&["fetch", "s", "g", "--limit", "2", "--lease", "60"]);
    let leases = leases.as_array().unwrap();
    assert_eq!(leases.len(), 2);
    assert_eq!(leases[0]["event"]["sequence"], 1);
    assert_eq!(leases[0]["attempt"], 1);
    let refs: Vec<String> = leases.iter().map(|l| l["ref"].as_str().expect("ref").to_owned()).collect();
    assert!(refs[0].starts_with("lr1:s:g:1:1:"), "{}", refs[0]);
    let info = cli.json(&["group", "info", "s", "g"]);
    assert_eq!(info["inflight"], 2);
    assert_eq!(info["summary"]["name"], "g");
    assert_eq!(info["dead_letters"], 0);

    let acked = cli.json(&["ack", "s", "g", &refs[0], &refs[1]]);
    assert_eq!(acked[0]["ok"], true);
    assert_eq!(acked[1]["ok"], true);
    assert_eq!(cli.json(&["group", "lag", "s", "g"])["total"], 1);
    // A second ack of the same lease is stale: reported, exit non-zero.
    let again = cli.run(&["--json", "ack", "s", "g", &refs[0]]);
    assert!(!again.status.success());
    let again: Value = serde_json::from_slice(&again.stdout).expect("json");
    assert_eq!(again[0]["ok"], false);
    assert!(again[0]["error"].as_str().unwrap().contains("stale"), "{again}");

    let replay = cli.json(&["group", "replay", "s", "g", "--from-sequence", "0"]);
    assert_eq!(replay["replayed"], 2);
    let replay = cli.json(&["group", "replay", "s", "g", "--where", "n=1"]);
    assert_eq!(replay["replayed"], 0, "already reopened");
    assert!(cli.fails(&["group", "reset", "s", "g"]).contains("--confirm"));
    assert_eq!(cli.json(&["group", "reset", "s", "g", "--confirm", "--start-after", "3"])["reset"], true);
    assert_eq!(cli.json(&["group", "lag", "s", "g"])["total"], 0);

    // An expired lease with max_attempts 1 is dead-lettered on the next fetch.
    cli.ok(&["group", "create", "s", "once", "--max-attempts", "1"]);
    cli.ok(&["fetch", "s", "once", "--limit", "1", "--lease", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    cli.ok(&["fetch", "s", "once", "--limit", "1"]);
    let dead = cli.json(&["dlq", "list", "s", "once"]);
    let dead = dead.as_array().unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["event"]["sequence"], 1);
    assert_eq!(dead[0]["attempts"], 1);
    assert!(dead[0]["reason"].as_str().unwrap().starts_with("max_attempts"));
    let id = dead[0]["event"]["id"].as_str().unwrap();
    assert_eq!(cli.json(&["dlq", "list", "s", "once", "--after", id]), serde_json::json!([]));
    assert!(cli.ok(&["dlq", "list", "s", "once"]).contains("REASON"));
}

#[test]
fn tail_prints_events_until_count() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s", "--partitions", "2"]);
    cli.ok(&["append", "s", r#"{"n":1}"#, r#"{"n":2}"#, "--partition", "0"]);
    cli.ok(&["append", "s", r#"{"n":3}"#, "--partition", "1"]);
    let lines = cli.json_lines(&["tail", "s", "--count", "3"]);
    assert_eq!(lines.len(), 3);
    let mut ns: Vec<i64> = lines.iter().map(|e| e["payload"]["n"].as_i64().unwrap()).collect();
    ns.sort();
    assert_eq!(ns, vec![1, 2, 3]);
    let one = cli.json_lines(&["tail", "s", "--partition", "1", "--count", "1"]);
    assert_eq!(one[0]["partition"], 1);
    assert!(cli.fails(&["tail", "s", "--partition", "7"]).contains("--partition 7"));
}

fn files_named(dir: &Path, pred: &dyn Fn(&str) -> bool, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_named(&p, pred, out);
        } else if pred(p.file_name().unwrap().to_str().unwrap()) {
            out.push(p);
        }
    }
}

fn find(dir: &Path, pred: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    files_named(dir, pred, &mut out);
    out
}

fn flip(path: &Path, offset: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[usize::try_from(offset).unwrap()] ^= 0x40;
    std::fs::write(path, b).unwrap();
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A data directory with sealed segments (4 KiB each) and a group's WAL.
fn populated() -> Cli {
    let cli = Cli::with_options("?segment_bytes=4096");
    cli.ok(&["stream", "create", "s"]);
    // A batch goes to one segment whatever its size: separate appends roll.
    for batch in 0..6 {
        let events: Vec<String> =
            (0..10).map(|n| format!(r#"{{"n":{},"pad":"{}"}}"#, batch * 10 + n, "x".repeat(40))).collect();
        let mut args = vec!["append", "s"];
        args.extend(events.iter().map(String::as_str));
        cli.ok(&args);
    }
    cli.ok(&["group", "create", "s", "g"]);
    let leases = cli.json(&["fetch", "s", "g", "--limit", "3"]);
    cli.ok(&["ack", "s", "g", leases[0]["ref"].as_str().unwrap()]);
    cli
}

#[test]
fn inspect_dumps_segments_indexes_and_wal() {
    let cli = populated();
    let segments = find(cli.data(), &|n| n.ends_with(".log") && !n.starts_with("wal-"));
    assert!(segments.len() >= 2, "expected sealed segments: {segments:?}");
    let sealed = cli.json(&["inspect", segments[0].to_str().unwrap()]);
    assert_eq!(sealed["kind"], "segment");
    assert_eq!(sealed["header"]["base_seq"], 1);
    assert_eq!(sealed["records"][0]["seq"], 1);
    assert_eq!(sealed["records"][0]["offset"], 64);
    assert_eq!(sealed["records"][0]["payload"]["n"], 0);
    assert_eq!(sealed["trailer"]["count"], sealed["record_count"]);
    assert_eq!(sealed["problems"], serde_json::json!([]));

    let wal = find(cli.data(), &|n| n.starts_with("wal-"));
    let wal = cli.json(&["inspect", wal[0].to_str().unwrap()]);
    assert_eq!(wal["kind"], "delivery_wal");
    assert_eq!(wal["records"][0]["offset"], 32);
    assert_eq!(wal["records"][0]["kind"], "create");
    assert_eq!(wal["records"][0]["group"], "g");
    assert!(wal["records"].as_array().unwrap().iter().any(|r| r["kind"] == "ops"));

    let idx = find(cli.data(), &|n| n.ends_with(".idx"));
    let idx = cli.json(&["inspect", idx[0].to_str().unwrap()]);
    assert_eq!(idx["kind"], "sparse_index");
    assert_eq!(idx["records"][0]["record_offset"], 64);

    // The background builder writes a sealed segment's .six; `index create`
    // waits for every segment, and each run gives the builder another turn.
    cli.ok(&["index", "create", "s", "n"]);
    let mut six = find(cli.data(), &|n| n.ends_with(".six"));
    for _ in 0..50 {
        if !six.is_empty() {
            break;
        }
        cli.ok(&["index", "status", "s"]);
        six = find(cli.data(), &|n| n.ends_with(".six"));
    }
    let six = cli.json(&["inspect", six[0].to_str().unwrap()]);
    assert_eq!(six["kind"], "secondary_index");
    assert_eq!(six["header"]["base_seq"], 1);
    assert!(six["records"].as_array().unwrap().iter().any(|t| t["field"] == "id"), "{six}");
    assert!(six["records"].as_array().unwrap().iter().any(|t| t["field"] == "payload.n"), "{six}");

    let text = cli.ok(&["inspect", segments[0].to_str().unwrap(), "--limit", "1"]);
    assert!(text.contains("more (use --limit)"), "{text}");
    let missing = cli.fails(&["inspect", "/nonexistent/00000000000000000001.log"]);
    assert_eq!(missing, "error: /nonexistent/00000000000000000001.log: no such file");
    assert!(cli.fails(&["inspect", "Cargo.toml"]).contains("not a data file"));
}

#[test]
fn verify_passes_then_reports_each_corruption_with_file_and_offset() {
    let cli = populated();
    let dir = cli.data().to_str().unwrap().to_owned();
    let healthy = cli.json(&["verify", &dir]);
    assert_eq!(healthy["ok"], true, "{healthy}");
    assert_eq!(healthy["problems"], serde_json::json!([]));
    assert!(healthy["records"].as_u64().unwrap() >= 60);
    // Without DIR, verify reads the --backend directory.
    assert!(cli.ok(&["verify"]).contains(": ok"));

    let segments = find(cli.data(), &|n| n.ends_with(".log") && !n.starts_with("wal-"));
    let sealed = &segments[0];
    let active = segments.last().unwrap();
    // The second record of the sealed segment: its offset from inspect.
    let second = cli.json(&["inspect", sealed.to_str().unwrap()])["records"][1]["offset"].as_u64().unwrap();
    flip(sealed, second + 20);
    let out = cli.run(&["verify", &dir]);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = format!("{} {second} record checksum mismatch; sequence 2 is unreadable", sealed.display());
    assert!(text.lines().any(|l| l.starts_with(&expected)), "expected {expected:?} in:\n{text}");

    flip(active, 64 + 30);
    let wal = find(cli.data(), &|n| n.starts_with("wal-")).remove(0);
    flip(&wal, 32 + 8 + 2);
    let report = cli.run(&["--json", "verify", &dir]);
    assert!(!report.status.success());
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let problems = report["problems"].as_array().unwrap();
    let has = |file: &Path, offset: u64| {
        problems.iter().any(|p| p["file"] == file.to_str().unwrap() && p["offset"] == offset && p["reason"].is_string())
    };
    assert!(has(sealed, second), "{report}");
    assert!(has(active, 64), "{report}");
    assert!(has(&wal, 32), "{report}");
    assert_eq!(problems.len(), 3, "{report}");

    assert_eq!(cli.fails(&["verify", "/nonexistent-dir"]), "error: /nonexistent-dir: no such directory");
}

#[test]
fn bad_input_is_one_error_line_and_a_non_zero_exit() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s"]);
    assert!(cli.fails(&["no-such-command"]).contains("no-such-command"));
    assert!(cli.fails(&["append", "s", "{not json"]).contains("argument 1 is not valid JSON"));
    assert!(cli.fails(&["append", "s", "[1]", "--type", "t"]).contains("--type"));
    assert!(cli.fails(&["append", "missing", "{}"]).contains("missing"));
    assert!(cli.fails(&["read", "missing"]).contains("missing"));
    assert!(cli.fails(&["query", "s", "--where", "just words"]).contains("--where"));
    assert!(cli.fails(&["query", "s", "--from", "yesterday"]).contains("yesterday"));
    assert!(cli.fails(&["query", "s", "--cursor", "nope"]).contains("cursor"));
    assert!(cli.fails(&["query", "s", "--order", "sideways"]).contains("sideways"));
    assert!(cli.fails(&["ack", "s", "g", "garbage"]).contains("lease"));
    assert!(cli.fails(&["group", "replay", "s", "g"]).contains("required"));
    assert!(cli.fails(&["group", "info", "s", "nobody"]).contains("nobody"));
    assert!(cli.fails(&["read", "s", "--limit", "lots"]).contains("lots"));
    let out = cli.run_stdin(&["append", "s"], "");
    assert!(fails_with(out, &["append", "s"]).contains("nothing to append"));
    let out = cli.run_stdin(&["append", "s"], "{\"ok\":1}\nnot json\n");
    let line = fails_with(out, &["append", "s"]);
    assert!(
        line.contains("stdin line 2 is not valid JSON")
            && line.contains("stopped after appending the 1 event(s) before it"),
        "{line}"
    );
    // Arguments are all checked first: nothing was appended by the bad run.
    assert!(cli.fails(&["append", "s", "{}", "oops"]).contains("argument 2"));
    // From stdin, the lines before the bad one are appended, as the error says.
    assert_eq!(cli.json(&["stream", "list"])[0]["high_watermarks"], serde_json::json!([1]));
    // verify needs a directory: a memory backend has none.
    let out = Command::new(env!("CARGO_BIN_EXE_rheo")).args(["--backend", "memory:", "verify"]).output().unwrap();
    assert!(fails_with(out, &["verify"]).contains("native"));
}

#[test]
fn one_backend_per_command() {
    // Several backends are for `rheo-bench` only.
    let out = Command::new(env!("CARGO_BIN_EXE_rheo"))
        .args(["--backend", "memory:", "--backend", "memory:", "stream", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--backend"));
    // The benchmark harness is its own tool now.
    let out = Command::new(env!("CARGO_BIN_EXE_rheo")).args(["--backend", "memory:", "bench"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn demo_runs() {
    let cli = Cli::new();
    let demo = cli.json(&["demo"]);
    assert!(demo["lines"].as_array().unwrap().len() > 10);
    assert!(demo["lines"][0].as_str().unwrap().starts_with("Rheo demo"));
}

#[test]
fn checkpoint_is_inspected_and_its_corruption_found() {
    let cli = Cli::with_options("?checkpoint_bytes=4096");
    cli.ok(&["stream", "create", "s"]);
    let events: Vec<String> = (0..200).map(|n| format!(r#"{{"n":{n}}}"#)).collect();
    let mut args = vec!["append", "s"];
    args.extend(events.iter().map(String::as_str));
    cli.ok(&args);
    cli.ok(&["group", "create", "s", "g"]);
    // Enough WAL traffic to pass 4 KiB and start a new generation.
    for _ in 0..4 {
        let leases = cli.json(&["fetch", "s", "g", "--limit", "50"]);
        let refs: Vec<String> = leases.as_array().unwrap().iter().map(|l| l["ref"].as_str().unwrap().into()).collect();
        let mut ack = vec!["ack", "s", "g"];
        ack.extend(refs.iter().map(String::as_str));
        cli.ok(&ack);
    }
    let ckpt = find(cli.data(), &|n| n.ends_with(".ckpt"));
    assert_eq!(ckpt.len(), 1, "expected one checkpoint");
    let ckpt = &ckpt[0];
    let dump = cli.json(&["inspect", ckpt.to_str().unwrap()]);
    assert_eq!(dump["kind"], "checkpoint");
    assert_eq!(dump["header"]["groups"], 1);
    assert!(dump["header"]["generation"].as_u64().unwrap() >= 2);
    assert!(dump["trailer"]["groups"].is_array());
    let dir = cli.data().to_str().unwrap().to_owned();
    assert_eq!(cli.json(&["verify", &dir])["ok"], true);

    flip(ckpt, 48 + 10);
    let out = cli.run(&["verify", &dir]);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = format!("{} 48 checkpoint body checksum mismatch", ckpt.display());
    assert!(text.lines().any(|l| l == expected), "expected {expected:?} in:\n{text}");
}

#[test]
fn verify_reports_every_problem_warns_of_torn_tails_and_refuses_a_foreign_dir() {
    let cli = populated();
    cli.ok(&["index", "create", "s", "n"]);
    let dir = cli.data().to_str().unwrap().to_owned();
    assert_eq!(cli.json(&["verify", &dir])["ok"], true);
    let segments = find(cli.data(), &|n| n.ends_with(".log") && !n.starts_with("wal-"));
    let sealed = &segments[0];
    let records = cli.json(&["inspect", sealed.to_str().unwrap()])["records"].clone();
    let offset = |i: usize| records[i]["offset"].as_u64().unwrap();
    // Two damaged records in one file: both are reported, each where it is.
    flip(sealed, offset(1) + 20);
    flip(sealed, offset(4) + 20);
    // A damaged block of the secondary index: at the block's offset.
    let six = find(cli.data(), &|n| n.ends_with(".six")).remove(0);
    let six_dump = cli.json(&["inspect", six.to_str().unwrap()]);
    assert_eq!(six_dump["header"]["blocks"], 1, "{six_dump}");
    flip(&six, 64 + 3);
    // A torn tail of the active segment: half a record after the last one.
    let active = segments.last().unwrap();
    let last = cli.json(&["inspect", active.to_str().unwrap()])["records"].as_array().unwrap().last().cloned().unwrap();
    let end = last["offset"].as_u64().unwrap() + last["size"].as_u64().unwrap();
    let mut bytes = std::fs::read(active).unwrap();
    let torn =
        &bytes[usize::try_from(last["offset"].as_u64().unwrap()).unwrap()..usize::try_from(end).unwrap()].to_vec();
    let at = usize::try_from(end).unwrap();
    if bytes.len() < at + torn.len() {
        bytes.resize(at + torn.len(), 0);
    }
    bytes[at..at + torn.len() / 2].copy_from_slice(&torn[..torn.len() / 2]);
    std::fs::write(active, &bytes).unwrap();

    let out = cli.run(&["--json", "verify", &dir]);
    assert!(!out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let problems = report["problems"].as_array().unwrap();
    let at = |file: &Path| -> Vec<u64> {
        problems.iter().filter(|p| p["file"] == file.to_str().unwrap()).map(|p| p["offset"].as_u64().unwrap()).collect()
    };
    assert_eq!(at(sealed), vec![offset(1), offset(4)], "{report}");
    assert_eq!(at(&six), vec![64], "{report}");
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{report}");
    assert_eq!((warnings[0]["file"].as_str(), warnings[0]["offset"].as_u64()), (active.to_str(), Some(end)));
    assert!(warnings[0]["reason"].as_str().unwrap().contains("torn tail"), "{report}");
    assert_eq!(problems.len(), 3, "the torn tail is not a problem: {report}");

    // Repaired (the flips undone), the torn tail alone is a warning: exit 0.
    flip(sealed, offset(1) + 20);
    flip(sealed, offset(4) + 20);
    flip(&six, 64 + 3);
    let text = cli.ok(&["verify", &dir]);
    assert!(text.contains("warning: torn tail"), "{text}");
    assert!(text.contains("ok, 1 warning(s)"), "{text}");

    // A directory without data files is not "ok".
    let foreign = tempfile::tempdir().unwrap();
    std::fs::write(foreign.path().join("notes.txt"), "hello").unwrap();
    let err = cli.fails(&["verify", foreign.path().to_str().unwrap()]);
    assert!(err.contains("holds no Rheo data file"), "{err}");
}

#[test]
fn fetch_reports_damage_and_group_skip_gets_past_it() {
    let cli = populated();
    let segments = find(cli.data(), &|n| n.ends_with(".log") && !n.starts_with("wal-"));
    let sealed = &segments[0];
    let second = cli.json(&["inspect", sealed.to_str().unwrap()])["records"][1]["offset"].as_u64().unwrap();
    flip(sealed, second + 20);
    cli.ok(&["group", "create", "s", "h"]);
    let out = cli.run(&["--json", "fetch", "s", "h", "--limit", "100"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let leases: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(leases.as_array().unwrap().len(), 59, "every readable event is leased");
    let stderr = String::from_utf8(out.stderr).unwrap();
    let warning: Value = serde_json::from_str(stderr.lines().next().unwrap()).unwrap();
    assert_eq!(warning["damage"]["sequence"], 2, "{stderr}");
    assert_eq!(warning["damage"]["offset"], second, "{stderr}");
    let plain = cli.run(&["fetch", "s", "h"]);
    assert!(String::from_utf8_lossy(&plain.stderr).contains("rheo group skip s h --partition 0 --sequence 2"));

    let skipped = cli.json(&["group", "skip", "s", "h", "--partition", "0", "--sequence", "2", "--reason", "restored"]);
    assert_eq!(skipped["skipped"], true);
    let text = cli.ok(&["group", "skip", "s", "h", "--partition", "0", "--sequence", "2", "--reason", "again"]);
    assert!(text.contains("already is a dead letter"), "{text}");
    let table = cli.ok(&["dlq", "list", "s", "h"]);
    assert!(table.contains("DAMAGED") && table.contains("skipped: restored"), "{table}");
    let dead = cli.json(&["dlq", "list", "s", "h"]);
    assert_eq!(dead[0]["sequence"], 2);
    assert_eq!(dead[0]["event"], Value::Null);
    assert_eq!(dead[0]["damage"]["offset"], second);
    assert_eq!(cli.json(&["dlq", "list", "s", "h", "--after-position", "0:2"]), serde_json::json!([]));
    assert!(cli.fails(&["dlq", "list", "s", "h", "--after-position", "zero"]).contains("PARTITION:SEQ"));
    assert!(
        cli.fails(&["group", "skip", "s", "h", "--partition", "0", "--sequence", "999", "--reason", "x"])
            .contains("999")
    );

    // A stretch: one already is a dead letter; the count says so.
    let stretch = |first: &str, through: &str| -> Vec<String> {
        ["group", "skip", "s", "h", "--partition", "0", "--sequence", first, "--through", through, "--reason", "x"]
            .map(str::to_owned)
            .to_vec()
    };
    let range = cli.json(&args(&stretch("1", "4")));
    assert_eq!((range["skipped"].as_u64(), range["already"].as_u64()), (Some(3), Some(1)), "{range}");
    let dead = cli.json(&["dlq", "list", "s", "h"]);
    let mut seqs: Vec<u64> = dead.as_array().unwrap().iter().map(|d| d["sequence"].as_u64().unwrap()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [1, 2, 3, 4]);
    // A stretch past the high watermark is refused before anything is done.
    let err = cli.fails(&args(&stretch("59", "62")));
    assert!(err.contains("high watermark (60)") && err.contains("nothing was skipped"), "{err}");
    assert_eq!(cli.json(&["dlq", "list", "s", "h", "--limit", "100"]).as_array().unwrap().len(), 4);
    assert!(cli.fails(&args(&stretch("5", "4"))).contains("--through"));
    // Positions the group settled (below its frontier, or acknowledged
    // above it) are counted, not skipped, and do not stop the stretch.
    // A reference is `lr1:stream:group:partition:sequence:lease_id`.
    let lease = |seq: u64| -> String {
        let refs = leases.as_array().unwrap().iter().map(|l| l["ref"].as_str().unwrap().to_owned());
        refs.into_iter().find(|r| r.split(':').nth(4) == Some(&seq.to_string())).unwrap()
    };
    cli.ok(&["ack", "s", "h", &lease(5), &lease(6), &lease(8)]);
    let range = cli.json(&args(&stretch("3", "9")));
    assert_eq!((range["skipped"].as_u64(), range["already"].as_u64()), (Some(2), Some(5)), "{range}");
    assert_eq!(cli.json(&["dlq", "list", "s", "h", "--limit", "100"]).as_array().unwrap().len(), 6);
}

#[test]
fn a_damaged_header_or_footer_of_a_sealed_segment_is_reported_and_its_records_still_read() {
    let cli = populated();
    let dir = cli.data().to_str().unwrap().to_owned();
    let segments = find(cli.data(), &|n| n.ends_with(".log") && !n.starts_with("wal-"));
    assert!(segments.len() >= 2, "{segments:?}");
    let sealed = &segments[0];
    let count = cli.json(&["inspect", sealed.to_str().unwrap()])["record_count"].as_u64().unwrap();
    flip(sealed, 24); // the header's base sequence
    let footer_at = std::fs::metadata(sealed).unwrap().len() - 64;
    flip(sealed, footer_at + 30);

    let out = cli.run(&["--json", "verify", &dir]);
    assert!(!out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let problems = report["problems"].as_array().unwrap();
    let of = |file: &Path| -> Vec<(u64, String)> {
        problems
            .iter()
            .filter(|p| p["file"] == file.to_str().unwrap())
            .map(|p| (p["offset"].as_u64().unwrap(), p["reason"].as_str().unwrap().to_owned()))
            .collect()
    };
    let found = of(sealed);
    assert!(found.iter().any(|(at, why)| *at == 0 && why.contains("header checksum")), "{report}");
    assert!(found.iter().any(|(at, why)| *at == footer_at && why.contains("footer is damaged")), "{report}");
    assert_eq!(problems.len(), found.len(), "{report}");
    // The records were still checked and counted.
    let out = cli.run(&["--json", "inspect", sealed.to_str().unwrap()]);
    assert!(!out.status.success(), "inspect fails on a damaged file");
    let dump: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(dump["record_count"].as_u64(), Some(count), "{dump}");

    // The default open reads every event.
    let events = cli.json_lines(&["read", "s", "--limit", "1000"]);
    let seqs: Vec<u64> = events.iter().map(|e| e["sequence"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=60).collect::<Vec<_>>());
}

/// Runs with `--json` and expects failure with one JSON object on stderr
/// (`error` and `message`) and this exit code; returns the object.
fn json_error(cli: &Cli, args: &[&str], code: i32) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = cli.run(&all);
    assert_eq!(out.status.code(), Some(code), "rheo {all:?}: {}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8(out.stderr).expect("utf-8 stderr");
    assert_eq!(err.lines().count(), 1, "rheo {all:?}: one stderr line: {err:?}");
    let v: Value = serde_json::from_str(&err).unwrap_or_else(|e| panic!("rheo {all:?}: not JSON ({e}): {err}"));
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    v
}

#[test]
fn every_bad_value_exits_2_and_a_failed_operation_exits_1() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s"]);
    cli.ok(&["append", "s", r#"{"total":5}"#]);
    cli.ok(&["group", "create", "s", "g"]);
    for (args, says) in [
        (
            &["query", "s", "--where", "total>abc"][..],
            r#"abc is not a number: a number field compared with text never matches; quote it, total>"abc", to compare text"#,
        ),
        (&["query", "s", "--where", "total"][..], "expected path=value"),
        (&["fetch", "s", "g", "--lease", "0"][..], "--lease 0: must be between 1 and 86400 seconds"),
        (&["fetch", "s", "g", "--limit", "20000"][..], "--limit 20000: must be between 1 and 10000"),
        (&["read", "s", "--limit", "0"][..], "--limit 0: must be between 1 and 10000"),
        (&["group", "create", "s", "h", "--max-attempts", "0"][..], "--max-attempts 0: must be between 1 and 1000000"),
        (&["query", "s", "--from", "yesterday"][..], "is not a time"),
        (&["stream", "create", "t", "--partitions", "0"][..], "partition count 0"),
        (&["fetch", "s", "g", "--limit", "many"][..], "invalid value 'many'"),
        (&["ack", "s", "g", "not-a-ref"][..], "not a lease reference"),
        (&["nonsense"][..], "unrecognized subcommand"),
    ] {
        let out = cli.run(args);
        assert_eq!(out.status.code(), Some(2), "rheo {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let err = fails_with(out, args);
        assert!(err.contains(says), "rheo {args:?}: {err}");
    }
    // Quoted text in a range comparison is allowed (and matches nothing here).
    assert_eq!(cli.json(&["query", "s", "--where", r#"total>"abc""#])["events"], serde_json::json!([]));
    // The backend URL: an unknown scheme lists the known ones.
    let out = rheo_at("foo:x", &["stream", "list"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: invalid --backend URL: ") && err.contains("native:PATH, sqlite:PATH"), "{err}");
    let out = rheo_at("native:", &["stream", "list"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a directory"));
    // A database backend the command was built without names the feature
    // and how to build with it (`cargo test` builds it without MongoDB).
    let out = rheo_at("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200", &["stream", "list"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "mongo") {
        assert!(!err.contains("needs the cargo feature"), "{err}");
    } else {
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("needs the cargo feature \"mongo\""), "{err}");
        assert!(err.contains("cargo install rheo-cli --features mongo"), "{err}");
    }
    // Failed operations: exit 1.
    for (args, says) in [
        (&["group", "info", "s", "nope"][..], r#"group "nope" does not exist"#),
        (&["stream", "create", "s"][..], r#"stream "s" already exists"#),
        (&["inspect", "/nonexistent/file.log"][..], "/nonexistent/file.log: no such file"),
    ] {
        let out = cli.run(args);
        assert_eq!(out.status.code(), Some(1), "rheo {args:?}");
        let err = fails_with(out, args);
        assert!(err.contains(says), "rheo {args:?}: {err}");
    }
}

#[test]
fn json_errors_are_one_object_on_stderr() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s"]);
    let v = json_error(&cli, &["fetch", "s", "g", "--lease", "0"], 2);
    assert_eq!(v["error"], "usage");
    assert_eq!(v["message"], "--lease 0: must be between 1 and 86400 seconds");
    // A clap error too: --json is seen before the arguments are parsed.
    let v = json_error(&cli, &["fetch", "s", "g", "--limit", "x"], 2);
    assert_eq!(v["error"], "usage");
    assert!(v["message"].as_str().unwrap().contains("--limit"), "{v}");
    assert_eq!(json_error(&cli, &["group"], 2)["error"], "usage");
    let v = json_error(&cli, &["group", "info", "s", "nope"], 1);
    assert_eq!(v["error"], "not_found");
    assert!(v["message"].as_str().unwrap().contains("nope"), "{v}");
    assert_eq!(json_error(&cli, &["stream", "create", "s"], 1)["error"], "already_exists");
    assert_eq!(json_error(&cli, &["inspect", "/nonexistent"], 1)["error"], "not_found");
}

#[test]
fn read_only_commands_on_a_missing_directory_fail_and_create_nothing() {
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("nothing-here");
    let backend = format!("native:{}?segment_bytes=4096", missing.display());
    for args in [
        &["read", "s"][..],
        &["query", "s"][..],
        &["tail", "s", "--count", "1"][..],
        &["stream", "list"][..],
        &["index", "status", "s"][..],
        &["group", "list", "s"][..],
        &["group", "info", "s", "g"][..],
        &["group", "lag", "s", "g"][..],
        &["dlq", "list", "s", "g"][..],
        &["top", "--iterations", "1"][..],
    ] {
        let out = rheo_at(&backend, args);
        assert_eq!(out.status.code(), Some(1), "rheo {args:?}");
        let err = fails_with(out, args);
        let expected = format!("error: no Rheo data directory at {} (no MANIFEST); check --backend", missing.display());
        assert_eq!(err, expected, "rheo {args:?}");
        assert!(!missing.exists(), "rheo {args:?} created {}", missing.display());
    }
    // An empty directory is not a data directory either.
    std::fs::create_dir(&missing).unwrap();
    let out = rheo_at(&backend, &["--json", "stream", "list"]);
    assert_eq!(out.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"], "not_found");
    assert_eq!(std::fs::read_dir(&missing).unwrap().count(), 0, "nothing created in the empty directory");
    // SQLite: a missing file is not created by a read.
    let db = parent.path().join("none.db");
    let out = rheo_at(&format!("sqlite:{}", db.display()), &["stream", "list"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no SQLite database at"));
    assert!(!db.exists());
    // A writing command creates the directory, then reads work.
    let out = rheo_at(&backend, &["stream", "create", "s"]);
    assert!(out.status.success());
    let out = rheo_at(&backend, &["stream", "list"]);
    assert!(out.status.success());
}

#[test]
fn read_without_partition_reads_every_partition_in_order() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s", "--partitions", "3"]);
    cli.ok(&["append", "s", r#"{"n":1}"#, r#"{"n":2}"#, "--partition", "2"]);
    cli.ok(&["append", "s", r#"{"n":3}"#, "--partition", "0"]);
    cli.ok(&["append", "s", r#"{"n":4}"#, r#"{"n":5}"#]);
    let at = |events: &[Value]| -> Vec<(u64, u64)> {
        events.iter().map(|e| (e["partition"].as_u64().unwrap(), e["sequence"].as_u64().unwrap())).collect()
    };
    // Unkeyed events without --partition go to partition 0.
    assert_eq!(at(&cli.json_lines(&["read", "s"])), [(0, 1), (0, 2), (0, 3), (2, 1), (2, 2)]);
    assert_eq!(at(&cli.json_lines(&["read", "s", "--limit", "4"])), [(0, 1), (0, 2), (0, 3), (2, 1)]);
    assert_eq!(at(&cli.json_lines(&["read", "s", "--after", "1"])), [(0, 2), (0, 3), (2, 2)]);
    assert_eq!(at(&cli.json_lines(&["read", "s", "--partition", "2"])), [(2, 1), (2, 2)]);
    assert!(cli.fails(&["read", "nope"]).contains(r#"stream "nope" does not exist"#));
    let text = cli.ok(&["read", "s", "--limit", "1"]);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.starts_with("PARTITION  SEQ  TIMESTAMP"), "{text}");
}

/// Fetches `limit` leases of `s`/`g` with `--lease 60` and returns their references.
fn fetch_refs(cli: &Cli, limit: &str) -> Vec<String> {
    let leases = cli.json(&["fetch", "s", "g", "--limit", limit, "--lease", "60"]);
    leases.as_array().unwrap().iter().map(|l| l["ref"].as_str().unwrap().to_owned()).collect()
}

fn setup_three(max_attempts: &str) -> Cli {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s"]);
    cli.ok(&["append", "s", r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#]);
    cli.ok(&["group", "create", "s", "g", "--max-attempts", max_attempts]);
    cli
}

#[test]
fn retry_gives_deliveries_back_and_dead_letters_the_last_attempt() {
    let cli = setup_three("2");
    let refs = fetch_refs(&cli, "1");
    let text = cli.ok(&["retry", &refs[0], "--reason", "flaky"]);
    assert!(text.starts_with(&format!("retried {}: claimable again at ", refs[0])), "{text}");
    // Redelivered at once (no backoff): attempt 2.
    let again = cli.json(&["fetch", "s", "g", "--limit", "1"]);
    assert_eq!((again[0]["event"]["sequence"].as_u64(), again[0]["attempt"].as_u64()), (Some(1), Some(2)));
    let out = cli.json(&["retry", again[0]["ref"].as_str().unwrap(), "--reason", "still flaky"]);
    assert_eq!(out[0]["ok"], true);
    assert_eq!(out[0]["outcome"], "dead_lettered");
    let dead = cli.json(&["dlq", "list", "s", "g"]);
    assert_eq!(dead[0]["sequence"], 1);
    assert_eq!(dead[0]["attempts"], 2);
    assert!(dead[0]["reason"].as_str().unwrap().contains("still flaky"), "{dead}");
    // The first lease is stale now: a failed operation naming it.
    let out = cli.run(&["retry", &refs[0]]);
    assert_eq!(out.status.code(), Some(1));
    let err = fails_with(out, &["retry"]);
    assert!(err.starts_with(&format!("error: retry {}: stale lease", refs[0])), "{err}");
    let v = json_error(&cli, &["retry", &refs[0]], 1);
    assert_eq!(v["error"], "stale_lease");
}

#[test]
fn retry_with_delay_keeps_the_delivery_back_until_then() {
    let cli = setup_three("5");
    let refs = fetch_refs(&cli, "1");
    let out = cli.json(&["retry", &refs[0], "--delay", "60"]);
    assert_eq!(out[0]["outcome"], "scheduled");
    let at = out[0]["available_at"].as_u64().unwrap();
    // Not claimable for a minute: the next fetch gets sequences 2 and 3 only.
    let leases = cli.json(&["fetch", "s", "g", "--limit", "10"]);
    let seqs: Vec<u64> = leases.as_array().unwrap().iter().map(|l| l["event"]["sequence"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [2, 3]);
    assert_eq!(cli.json(&["group", "info", "s", "g"])["retry_waiting"], 1, "available at {at}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    assert!(u128::from(at) > now + 50_000, "available at {at}, now {now}");
    let v = json_error(&cli, &["retry", &refs[0], "--delay", "100000"], 2);
    assert_eq!(v["message"], "--delay 100000: must be between 0 and 86400 seconds");
}

#[test]
fn reject_dead_letters_and_dlq_list_shows_it() {
    let cli = setup_three("5");
    let refs = fetch_refs(&cli, "2");
    let text = cli.ok(&["reject", &refs[0], &refs[1], "--reason", "bad payload"]);
    assert_eq!(
        text,
        format!(
            "rejected {} (dead-lettered: bad payload)\nrejected {} (dead-lettered: bad payload)\n",
            refs[0], refs[1]
        )
    );
    let dead = cli.json(&["dlq", "list", "s", "g"]);
    let dead: Vec<(u64, &str)> = dead
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["sequence"].as_u64().unwrap(), d["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(dead, [(1, "bad payload"), (2, "bad payload")]);
    assert!(cli.ok(&["dlq", "list", "s", "g"]).contains("bad payload"));
    assert_eq!(cli.json(&["group", "info", "s", "g"])["dead_letters"], 2);
    // Again: both stale, one error naming both; the JSON says which.
    let out = cli.run(&["--json", "reject", &refs[0], &refs[1]]);
    assert_eq!(out.status.code(), Some(1));
    let docs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((docs[0]["ok"].as_bool(), docs[1]["ok"].as_bool()), (Some(false), Some(false)));
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"], "stale_lease");
    let message = err["message"].as_str().unwrap();
    assert!(message.starts_with("2 of 2 leases failed") && message.contains(&refs[1]), "{message}");
}

#[test]
fn renew_extends_a_lease() {
    let cli = setup_three("5");
    let leases = cli.json(&["fetch", "s", "g", "--limit", "1", "--lease", "5"]);
    let (r, first) = (leases[0]["ref"].as_str().unwrap(), leases[0]["expires_at"].as_u64().unwrap());
    let out = cli.json(&["renew", r, "--lease", "3600"]);
    assert_eq!(out[0]["ok"], true);
    let renewed = out[0]["expires_at"].as_u64().unwrap();
    assert!(renewed > first + 3_000_000, "{renewed} about an hour after {first}");
    assert!(cli.ok(&["renew", r]).starts_with(&format!("renewed {r} until ")));
    assert_eq!(
        json_error(&cli, &["renew", r, "--lease", "0"], 2)["message"],
        "--lease 0: must be between 1 and 86400 seconds"
    );
    assert_eq!(json_error(&cli, &["renew", "lr1:nope"], 2)["error"], "usage");
    cli.ok(&["ack", "s", "g", r]);
    let err = cli.fails(&["renew", r]);
    assert!(err.starts_with(&format!("error: renew {r}: stale lease")), "{err}");
}

#[test]
fn top_prints_a_json_line_per_refresh_with_each_groups_numbers() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s", "--partitions", "2"]);
    cli.ok(&["stream", "create", "t"]);
    cli.ok(&["append", "s", r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#, "--partition", "0"]);
    cli.ok(&["append", "s", r#"{"n":4}"#, "--partition", "1"]);
    cli.ok(&["append", "t", r#"{"n":5}"#]);
    cli.ok(&["group", "create", "s", "g"]);
    cli.ok(&["group", "create", "s", "h"]);
    cli.ok(&["group", "create", "t", "g"]);
    let leases = cli.json(&["fetch", "s", "g", "--limit", "2", "--lease", "60"]);
    cli.ok(&["ack", "s", "g", leases[0]["ref"].as_str().unwrap()]);
    cli.ok(&["reject", leases[1]["ref"].as_str().unwrap()]);
    cli.ok(&["fetch", "s", "g", "--limit", "1", "--lease", "60"]);

    let lines = cli.json_lines(&["top", "--iterations", "2", "--interval", "0.2"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (i, refresh) in lines.iter().enumerate() {
        assert!(refresh["at"].as_u64().is_some(), "{refresh}");
        let rows: Vec<(&str, &str, u64, u64, u64)> = refresh["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let n = |k: &str| g[k].as_u64().unwrap();
                (
                    g["stream"].as_str().unwrap(),
                    g["group"].as_str().unwrap(),
                    n("lag"),
                    n("in_flight"),
                    n("dead_letters"),
                )
            })
            .collect();
        // g: sequence 1 acked, 2 dead (the frontier passes both), 3 in flight, 4 due.
        assert_eq!(rows, [("s", "g", 2, 1, 1), ("s", "h", 4, 0, 0), ("t", "g", 1, 0, 0)], "refresh {i}");
        let rates =
            |k: &str| -> Vec<Value> { refresh["groups"].as_array().unwrap().iter().map(|g| g[k].clone()).collect() };
        if i == 0 {
            assert!(rates("append_rate").iter().all(Value::is_null), "no rate before a second refresh: {refresh}");
        } else {
            assert!(rates("append_rate").iter().all(|r| r.as_f64() == Some(0.0)), "{refresh}");
            assert!(rates("settle_rate").iter().all(|r| r.as_f64() == Some(0.0)), "{refresh}");
        }
    }
    // Named streams only; an unknown one is not found.
    let only = cli.json_lines(&["top", "t", "--iterations", "1"]);
    assert_eq!(only[0]["groups"].as_array().unwrap().len(), 1);
    assert_eq!(json_error(&cli, &["top", "nope", "--iterations", "1"], 1)["error"], "not_found");
    assert_eq!(
        json_error(&cli, &["top", "--interval", "0"], 2)["message"],
        "--interval 0: must be between 0.1 and 3600 seconds"
    );
    // Off a terminal, without --json, the lines are JSON too.
    let plain = cli.ok(&["top", "--iterations", "1"]);
    let v: Value = serde_json::from_str(plain.trim()).unwrap();
    assert_eq!(v["groups"][0]["lag"], 2);
}

/// A `rheo append` reading stdin holds the directory (the writer); other
/// `rheo` processes read it meanwhile: lag, dead letters, `tail` following
/// the writer's appends, `top` seeing them, and a second writer refused
/// with the holder's pid.
#[test]
fn read_commands_work_beside_a_process_that_holds_the_directory() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};

    let cli = Cli::new();
    cli.ok(&["stream", "create", "s", "--partitions", "2"]);
    cli.ok(&["group", "create", "s", "g"]);
    cli.ok(&["append", "s", r#"{"n":0}"#, r#"{"n":1}"#, "--partition", "0"]);
    let leases = cli.json(&["fetch", "s", "g", "--limit", "1", "--lease", "60"]);
    cli.ok(&["reject", leases[0]["ref"].as_str().unwrap(), "--reason", "bad order"]);

    // The writer: appends each stdin line once read, prints it once durable.
    let mut writer = cli
        .command(&["--json", "append", "s", "--partition", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the writer");
    let mut stdin = writer.stdin.take().expect("stdin");
    let mut acks = std::io::BufReader::new(writer.stdout.take().expect("stdout")).lines();
    let mut append = |n: u64| {
        writeln!(stdin, "{{\"n\":{n}}}").and_then(|()| stdin.flush()).expect("write a line");
        let line = acks.next().expect("an acknowledgement").expect("read");
        let event: Value = serde_json::from_str(&line).expect("JSON line");
        assert_eq!(event["payload"]["n"], n, "{line}");
        Instant::now()
    };
    append(2);

    // A second writer is refused, naming the holder and the read commands.
    let refused = cli.fails(&["append", "s", r#"{"n":99}"#]);
    assert!(refused.contains(&format!("in use by process {}", writer.id())), "{refused}");
    assert!(refused.contains("these only read and work while it runs: read, query, tail"), "{refused}");
    let json_err = cli.run(&["--json", "group", "reset", "s", "g", "--latest", "--confirm"]);
    assert_eq!(json_err.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&json_err.stderr).expect("one JSON error");
    assert_eq!(err["error"], "locked", "{err}");

    // Reads see the writer's state, without the lock.
    let lag = cli.json(&["group", "lag", "s", "g"]);
    assert_eq!(lag["total"], 2, "sequence 1 of partition 0 was rejected: {lag}");
    let dead = cli.json(&["dlq", "list", "s", "g"]);
    assert_eq!(dead.as_array().map(Vec::len), Some(1), "{dead}");
    assert_eq!(dead[0]["reason"], "bad order");
    assert_eq!(cli.json(&["stream", "list"])[0]["high_watermarks"], serde_json::json!([2, 1]));
    let read = cli.json_lines(&["read", "s", "--partition", "1"]);
    assert_eq!(payloads(&read), vec![serde_json::json!({"n": 2})]);
    // The file tools read files, beside the writer too.
    let verified = cli.ok(&["verify"]);
    assert!(verified.trim_end().ends_with(": ok"), "{verified}");
    let segment = std::fs::read_dir(cli.data().join("streams/0000000000000001/00001"))
        .expect("partition 1")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .expect("a segment");
    let dump = cli.json(&["inspect", segment.to_str().expect("utf-8 path")]);
    assert_eq!(dump["records"][0]["payload"], serde_json::json!({"n": 2}), "{dump}");

    // `tail` follows what the writer appends after it started.
    let tail = cli
        .command(&["--json", "tail", "s", "--from-end", "--count", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tail");
    std::thread::sleep(Duration::from_millis(700));
    let mut last_ack = Instant::now();
    for n in 3..6 {
        last_ack = append(n);
        std::thread::sleep(Duration::from_millis(50));
    }
    let tailed = tail.wait_with_output().expect("tail");
    let caught_up = last_ack.elapsed();
    assert!(tailed.status.success(), "{}", String::from_utf8_lossy(&tailed.stderr));
    let seen: Vec<u64> = String::from_utf8(tailed.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON line")["payload"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(seen, vec![3, 4, 5]);
    println!("tail saw the writer's last append {caught_up:?} after it was acknowledged (incl. its exit)");

    // `top` sees the writer's appends as a rate.
    let top = cli
        .command(&["--json", "top", "--iterations", "2", "--interval", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn top");
    let until = Instant::now() + Duration::from_millis(1600);
    let mut n = 6;
    while Instant::now() < until {
        append(n);
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let top = top.wait_with_output().expect("top");
    assert!(top.status.success(), "{}", String::from_utf8_lossy(&top.stderr));
    let refreshes: Vec<Value> =
        String::from_utf8(top.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    assert_eq!(refreshes.len(), 2);
    let rate = refreshes[1]["groups"][0]["append_rate"].as_f64().expect("a rate on the second refresh");
    assert!(rate > 1.0, "top saw no appends: {}", refreshes[1]);

    drop(stdin);
    let done = writer.wait_with_output().expect("writer");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(String::from_utf8(done.stderr).unwrap(), "", "no progress output off a terminal");
    // Everything the writer acknowledged is there once it is gone.
    assert_eq!(cli.json(&["stream", "list"])[0]["high_watermarks"], serde_json::json!([2, n - 2]));
}

/// `rheo read | head -1`: when the reader closes the pipe, rheo stops
/// quietly (exit 0, nothing on stderr) instead of reporting a write error.
#[test]
fn a_closed_stdout_is_a_quiet_stop() {
    use std::io::BufRead;
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s"]);
    let many: String = (0..2000).map(|n| format!("{{\"n\":{n}}}\n")).collect();
    assert!(cli.run_stdin(&["append", "s"], &many).status.success());
    let mut child = cli
        .command(&["--json", "read", "s", "--limit", "2000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("one line");
    assert!(first.contains("\"sequence\":1"), "{first}");
    drop(out);
    let done = child.wait_with_output().expect("wait");
    assert_eq!(String::from_utf8_lossy(&done.stderr), "", "nothing on stderr");
    assert!(done.status.success(), "{:?}", done.status);
}

/// `append --id` and `--id-field`: running the same command or input again
/// appends each event once and says which were already there.
#[test]
fn appends_with_ids_are_safe_to_run_again() {
    let cli = Cli::new();
    cli.ok(&["stream", "create", "s"]);
    let first = cli.json(&["append", "s", r#"{"total":30}"#, "--id", "order-42"]);
    assert_eq!(first[0]["id"], "order-42");
    assert!(first[0].get("duplicate").is_none(), "{first}");
    let again = cli.ok(&["append", "s", r#"{"total":31}"#, "--id", "order-42"]);
    assert!(again.contains("appended 0 event(s) to s; 1 had an id already in the stream"), "{again}");
    let again = cli.json(&["append", "s", r#"{"total":31}"#, "--id", "order-42"]);
    assert_eq!((again[0]["duplicate"].as_bool(), again[0]["payload"]["total"].as_i64()), (Some(true), Some(30)));

    let input = "{\"order_id\":\"a\",\"n\":1}\n{\"order_id\":7,\"n\":2}\n{\"order_id\":\"a\",\"n\":3}\n";
    let out = cli.run_stdin(&["append", "s", "--id-field", "order_id"], input);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("appended 2 event(s) to s; 1 had an id already in the stream"), "{text}");
    let out = cli.run_stdin(&["append", "s", "--id-field", "order_id"], input);
    assert!(String::from_utf8(out.stdout).unwrap().contains("appended 0 event(s) to s; 3 had an id"));
    let ids: Vec<String> =
        cli.json_lines(&["read", "s"]).iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids, vec!["order-42", "a", "7"]);

    // Bad uses are usage errors (exit 2), and nothing is appended.
    for (args, says) in [
        (vec!["append", "s", "{}", "{}", "--id", "x"], "--id names one event"),
        (vec!["append", "s", r#"{"n":1}"#, "--id-field", "order_id"], "no string or number field"),
    ] {
        let out = cli.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{args:?}");
    }
    assert_eq!(cli.json(&["stream", "list"])[0]["high_watermarks"], serde_json::json!([3]));
}
