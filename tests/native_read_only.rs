//! Read-only opens of a native data directory (`native:DIR?read_only=true`)
//! beside a writer.
//!
//! The two-process test re-runs its own binary as the writer (told by
//! `RHEO_RO_CHILD_DIR`, as the SIGKILL tests do): it opens `native:DIR`,
//! creates a stream and a group, says `ready`, then appends a keyed event
//! every few milliseconds, printing `ack <partition> <sequence> <n>` for each
//! acknowledged one, and consumes: every fifth event it claims is rejected
//! (dead-lettered), the others acknowledged. The parent, another process,
//! opens the same directory read-only while the writer runs and checks that
//! it sees every acknowledged event within a second, group state and dead
//! letters, that its writes are refused, and that a writable open is
//! refused with a message naming the writer's pid. It then kills the writer
//! (SIGKILL, so a torn tail may be left), reads the whole directory
//! read-only, and checks that no file changed by a byte; the writer's next
//! open recovers every acknowledged event.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rheo::{AppendOptions, DeadLetterOptions, Error, FetchOptions, GroupOptions, Rheo, StreamOptions};
use serde_json::json;

#[path = "common/kill.rs"]
mod kill;
#[path = "common/rng.rs"]
mod rng;
use kill::{child_command, say};

const TEST_NAME: &str = "a_reader_process_follows_a_writer_process_and_never_writes";
const CHILD_DIR: &str = "RHEO_RO_CHILD_DIR";
const STREAM: &str = "live";
const GROUP: &str = "billing";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn a_reader_process_follows_a_writer_process_and_never_writes() {
    match std::env::var(CHILD_DIR) {
        Ok(dir) => writer(Path::new(&dir)),
        Err(_) => reader(),
    }
}

/// The writer process: appends and consumes until killed.
fn writer(dir: &Path) {
    runtime().block_on(async {
        say("");
        let rheo = Rheo::open(&format!("native:{}", dir.display())).await.expect("writer: open");
        rheo.create_stream(STREAM, StreamOptions::new().partitions(2)).await.expect("writer: stream");
        rheo.create_group(STREAM, GROUP, GroupOptions::new().max_attempts(1)).await.expect("writer: group");
        say("ready");
        let consumer = rheo.clone();
        tokio::spawn(async move {
            let mut claimed = 0u64;
            loop {
                let leases = consumer
                    .fetch(STREAM, GROUP, FetchOptions::new().limit(10).lease(Duration::from_secs(60)))
                    .await
                    .expect("writer: fetch");
                for lease in leases {
                    claimed += 1;
                    if claimed.is_multiple_of(5) {
                        consumer.reject(&lease, "every fifth").await.expect("writer: reject");
                    } else {
                        consumer.ack(&lease).await.expect("writer: ack");
                    }
                }
                tokio::time::sleep(Duration::from_millis(7)).await;
            }
        });
        for n in 0u64.. {
            let e = rheo
                .append(STREAM, &json!({"n": n}), AppendOptions::new().key(format!("k{n}")))
                .await
                .expect("writer: append");
            say(&format!("ack {} {} {n}", e.partition(), e.sequence()));
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    });
}

/// Every file under `dir` with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).expect("read"));
            }
        }
    }
    out
}

/// The acknowledged (partition, sequence, n) the writer printed so far.
fn acked(lines: &[String]) -> Vec<(u32, u64, u64)> {
    lines
        .iter()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("ack")).then_some(())?;
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// Every event of the stream as (partition, sequence) -> n.
async fn all_events(rheo: &Rheo) -> BTreeMap<(u32, u64), u64> {
    let mut out = BTreeMap::new();
    for p in 0..2 {
        let mut after = 0;
        loop {
            let batch = rheo.read(STREAM, p, after, 1000).await.expect("read");
            let Some(last) = batch.last() else { break };
            after = last.sequence();
            for e in &batch {
                out.insert((p, e.sequence()), e.payload().json().expect("json")["n"].as_u64().expect("n"));
            }
        }
    }
    out
}

fn reader() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = child_command(&exe, TEST_NAME).env(CHILD_DIR, &dir).spawn().expect("spawn the writer");
    let stdout = child.stdout.take().expect("stdout");
    let lines = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let collector = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                lines.lock().push(line);
            }
        })
    };
    let started = Instant::now();
    while !lines.lock().iter().any(|l| l == "ready") {
        assert!(started.elapsed() < Duration::from_secs(30), "the writer did not get ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let url = format!("native:{}?read_only=true", dir.display());
    runtime().block_on(async {
        // A writable open is refused, naming the writer.
        match Rheo::open(&format!("native:{}", dir.display())).await {
            Err(e @ Error::Locked { .. }) => {
                let text = e.to_string();
                assert!(text.contains(&format!("process {}", child.id())), "{text}");
                assert!(text.contains("read_only=true"), "{text}");
            }
            other => panic!("a second writer must be refused: {other:?}"),
        }
        let ro = Rheo::open(&url).await.expect("read-only open beside the writer");
        // Every acknowledged event shows up within a second, for 2 seconds of appends.
        let mut rounds = 0;
        let mut max_catch_up = Duration::ZERO;
        while started.elapsed() < Duration::from_secs(4) || rounds < 5 {
            let expected = acked(&lines.lock());
            let asked = Instant::now();
            loop {
                let seen = all_events(&ro).await;
                let missing: Vec<_> = expected.iter().filter(|(p, s, n)| seen.get(&(*p, *s)) != Some(n)).collect();
                if missing.is_empty() {
                    break;
                }
                assert!(
                    asked.elapsed() < Duration::from_secs(1),
                    "acknowledged events not seen by the reader after 1 s: {missing:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            max_catch_up = max_catch_up.max(asked.elapsed());
            rounds += 1;
        }
        assert!(acked(&lines.lock()).len() > 50, "the writer appended too little to test anything");
        println!("reader: {rounds} rounds, longest catch-up {max_catch_up:?}");

        // Group state: lag, info and dead letters of the writer's group.
        let info = ro.group_info(STREAM, GROUP).await.expect("group info");
        let lag = ro.lag(STREAM, GROUP).await.expect("lag");
        assert_eq!(lag.partitions.len(), 2);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let dead = ro.dead_letters(STREAM, GROUP, DeadLetterOptions::new()).await.expect("dead letters");
            if !dead.is_empty() {
                assert!(dead.iter().all(|d| d.reason.contains("every fifth")), "{dead:?}");
                break;
            }
            assert!(Instant::now() < deadline, "no dead letter seen; group info {info:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let streams = ro.list_streams().await.expect("list streams");
        assert_eq!(streams.len(), 1);
        assert!(streams[0].high_watermarks.iter().sum::<u64>() > 0);

        // Writes are refused, naming the directory.
        for result in [
            ro.append(STREAM, &json!({"x": 1}), AppendOptions::new()).await.map(|_| ()),
            ro.create_stream("other", StreamOptions::new()).await.map(|_| ()),
            ro.fetch(STREAM, GROUP, FetchOptions::new()).await.map(|_| ()),
        ] {
            match result {
                Err(e @ Error::ReadOnly { .. }) => assert!(e.to_string().contains("read-only"), "{e}"),
                other => panic!("a write on a read-only open must be refused: {other:?}"),
            }
        }
    });

    // Kill the writer (perhaps mid-append), then read everything read-only:
    // not a byte of the directory changes.
    child.kill().expect("SIGKILL the writer");
    child.wait().expect("reap the writer");
    collector.join().expect("collector");
    let before = files(&dir);
    let acknowledged = acked(&lines.lock());
    runtime().block_on(async {
        let ro = Rheo::open(&url).await.expect("read-only open after the kill");
        let seen = all_events(&ro).await;
        for (p, s, n) in &acknowledged {
            assert_eq!(seen.get(&(*p, *s)), Some(n), "acknowledged {p}/{s} missing from the read-only view");
        }
        ro.group_info(STREAM, GROUP).await.expect("group info");
        ro.dead_letters(STREAM, GROUP, DeadLetterOptions::new()).await.expect("dead letters");
    });
    let after = files(&dir);
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>(), "files created or removed");
    for (path, bytes) in &before {
        assert!(after[path] == *bytes, "{} was changed by a read-only open", path.display());
    }
    // The writer's next open recovers every acknowledged event.
    runtime().block_on(async {
        let rw = Rheo::open(&format!("native:{}", dir.display())).await.expect("writable reopen");
        let seen = all_events(&rw).await;
        for (p, s, n) in &acknowledged {
            assert_eq!(seen.get(&(*p, *s)), Some(n));
        }
    });
}

#[tokio::test]
async fn a_read_only_open_never_creates_a_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("nope");
    let err = Rheo::open(&format!("native:{}?read_only=true", missing.display())).await.expect_err("missing dir");
    assert!(err.to_string().contains("no Rheo data directory"), "{err}");
    assert!(!missing.exists(), "a read-only open created the directory");
    // An empty directory is not a data directory either, and stays empty.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let err = Rheo::open(&format!("native:{}?read_only=true", empty.display())).await.expect_err("empty dir");
    assert!(err.to_string().contains("no MANIFEST"), "{err}");
    assert_eq!(std::fs::read_dir(&empty).expect("read_dir").count(), 0);
}

#[tokio::test]
async fn a_second_writable_handle_in_one_process_is_told_so() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let url = format!("native:{}", tmp.path().display());
    let _first = Rheo::open(&url).await.expect("open");
    let err = Rheo::open(&url).await.expect_err("second handle");
    let text = err.to_string();
    assert!(text.contains("another handle in this process"), "{text}");
    assert!(!text.contains("another process"), "{text}");
    // A read-only handle beside it is fine, in the same process too.
    let ro = Rheo::open(&format!("{url}?read_only=true")).await.expect("read-only beside a writer");
    assert!(ro.list_streams().await.expect("list").is_empty());
}

#[tokio::test]
async fn a_torn_tail_is_cut_in_the_view_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let url = format!("native:{}", tmp.path().display());
    {
        let rheo = Rheo::open(&url).await.expect("open");
        rheo.create_stream("t", StreamOptions::new().partitions(1)).await.expect("stream");
        for n in 0..10 {
            rheo.append("t", &json!({"n": n}), AppendOptions::new()).await.expect("append");
        }
    }
    // A torn append: garbage after the last record of the active segment.
    let segment = files(tmp.path()).into_keys().find(|p| p.extension().is_some_and(|e| e == "log")).expect("a segment");
    let bytes = std::fs::read(&segment).expect("read");
    let end = bytes.iter().rposition(|&b| b != 0).expect("records") + 1;
    let mut torn = bytes.clone();
    torn[end..end + 7].copy_from_slice(&[0x5a; 7]);
    std::fs::write(&segment, &torn).expect("tear");
    let before = files(tmp.path());
    let ro = Rheo::open(&format!("{url}?read_only=true")).await.expect("read-only open");
    assert_eq!(ro.read("t", 0, 0, 100).await.expect("read").len(), 10);
    drop(ro);
    assert_eq!(files(tmp.path()), before, "the read-only open changed the directory");
}

/// `recovery=strict` is honoured by a read-only open: a flipped byte in a
/// sealed segment fails it, naming the file, while the default mode opens;
/// the torn tail of the active segment (a live writer's append in flight)
/// is tolerated either way and cut in the view only.
#[tokio::test]
async fn strict_recovery_checks_sealed_segments_in_a_read_only_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let url = format!("native:{}?segment_bytes=4096", tmp.path().display());
    {
        let rheo = Rheo::open(&url).await.expect("open");
        rheo.create_stream("t", StreamOptions::new().partitions(1)).await.expect("stream");
        for n in 0..100 {
            rheo.append("t", &json!({"n": n, "pad": "x".repeat(60)}), AppendOptions::new()).await.expect("append");
        }
    }
    let mut segments: Vec<PathBuf> =
        files(tmp.path()).into_keys().filter(|p| p.extension().is_some_and(|e| e == "log")).collect();
    segments.sort();
    assert!(segments.len() >= 3, "sealed segments: {segments:?}");
    // A torn append at the end of the active segment: strict views open.
    let active = segments.last().expect("active");
    let bytes = std::fs::read(active).expect("read");
    let end = bytes.iter().rposition(|&b| b != 0).expect("records") + 1;
    let mut torn = bytes.clone();
    torn.resize(torn.len().max(end + 7), 0);
    torn[end..end + 7].copy_from_slice(&[0x5a; 7]);
    std::fs::write(active, &torn).expect("tear");
    let before = files(tmp.path());
    let strict = format!("{url}&read_only=true&recovery=strict");
    let ro = Rheo::open(&strict).await.expect("a strict view tolerates the active tail");
    assert_eq!(ro.read("t", 0, 0, 1000).await.expect("read").len(), 100);
    drop(ro);
    // A flipped byte inside the first (sealed) segment's records.
    let sealed = &segments[0];
    let mut bytes = std::fs::read(sealed).expect("read");
    bytes[200] ^= 0x10;
    std::fs::write(sealed, &bytes).expect("flip");
    match Rheo::open(&strict).await {
        Err(Error::Corrupt { file, .. }) => assert_eq!(file.file_name(), sealed.file_name(), "{file:?}"),
        other => panic!("a strict view of a damaged sealed segment: {:?}", other.map(|_| ())),
    }
    Rheo::open(&format!("{url}&read_only=true")).await.expect("the default mode opens (and checks on read)");
    let mut after = files(tmp.path());
    after.insert(sealed.clone(), before[sealed].clone());
    assert_eq!(after, before, "the read-only opens changed the directory");
}
