//! The metrics the facade records, captured by a recorder local to the test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use rheo::{AppendOptions, FetchOptions, GroupOptions, Rheo, StreamOptions, observe};
use serde_json::json;

/// Every counter and gauge by name and labels (`name{k=v,...}`).
#[derive(Default, Clone)]
struct Captured(Arc<Mutex<HashMap<String, f64>>>);

struct Cell(Arc<Mutex<HashMap<String, f64>>>, String);

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        *self.0.lock().expect("lock").entry(self.1.clone()).or_default() += value as f64;
    }
    fn absolute(&self, value: u64) {
        self.0.lock().expect("lock").insert(self.1.clone(), value as f64);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, value: f64) {
        *self.0.lock().expect("lock").entry(self.1.clone()).or_default() += value;
    }
    fn decrement(&self, value: f64) {
        *self.0.lock().expect("lock").entry(self.1.clone()).or_default() -= value;
    }
    fn set(&self, value: f64) {
        self.0.lock().expect("lock").insert(self.1.clone(), value);
    }
}

fn name(key: &Key) -> String {
    let mut labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recorder for Captured {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Cell(self.0.clone(), name(key))))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(Cell(self.0.clone(), name(key))))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[test]
fn the_facade_counts_appends_leases_settles_and_sets_lag() {
    let rec = Captured::default();
    metrics::with_local_recorder(&rec, || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let rheo = Rheo::open("memory:").await.expect("open");
            rheo.create_stream("s", StreamOptions::new()).await.expect("stream");
            rheo.create_group("s", "g", GroupOptions::new().max_attempts(1)).await.expect("group");
            let batch = (0..3).map(|i| (json!({"i": i}), AppendOptions::new()));
            rheo.append_batch_with("s", batch).await.expect("append");
            let leases = rheo.fetch("s", "g", FetchOptions::new().limit(10)).await.expect("fetch");
            assert_eq!(leases.len(), 3);
            rheo.ack(&leases[0]).await.expect("ack");
            // max_attempts 1: a retry of the last attempt dead-letters.
            rheo.retry(&leases[1], "later").await.expect("retry");
            rheo.reject(&leases[2], "bad").await.expect("reject");
            let lag = rheo.lag("s", "g").await.expect("lag");
            assert_eq!(lag.total, 0);
            rheo.group_info("s", "g").await.expect("info");
        });
    });
    let got = rec.0.lock().expect("lock").clone();
    let sg = "group=g,stream=s";
    let want = [
        (format!("{}{{stream=s}}", observe::APPENDED), 3.0),
        (format!("{}{{{sg}}}", observe::LEASED), 3.0),
        (format!("{}{{{sg}}}", observe::ACKED), 1.0),
        (format!("{}{{{sg}}}", observe::DEAD_LETTERED), 2.0),
        (format!("{}{{group=g,partition=0,stream=s}}", observe::LAG), 0.0),
        (format!("{}{{{sg}}}", observe::INFLIGHT), 0.0),
    ];
    for (k, v) in want {
        assert_eq!(got.get(&k), Some(&v), "{k} in {got:?}");
    }
    assert!(!got.contains_key(&format!("{}{{{sg}}}", observe::RETRIED)), "{got:?}");
}

#[test]
fn an_idle_group_consumer_refreshes_its_gauges() {
    let rec = Captured::default();
    let key = format!("{}{{group=g,stream=s}}", observe::INFLIGHT);
    let lag_key = format!("{}{{group=g,partition=0,stream=s}}", observe::LAG);
    metrics::with_local_recorder(&rec, || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let rheo = Rheo::open("memory:").await.expect("open");
            rheo.create_stream("s", StreamOptions::new()).await.expect("stream");
            rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
            rheo.append_batch("s", (0..3).map(|i| json!({"i": i}))).await.expect("append");
            let handle = rheo
                .consumer("s", "g")
                .spawn(rheo::handler_fn(|_lease| async { rheo::Outcome::Ack }))
                .await
                .expect("spawn");
            // Nothing here reads group_info: only the consumer can set it.
            for _ in 0..800 {
                if rec.0.lock().expect("lock").get(&key) == Some(&0.0)
                    && rec.0.lock().expect("lock").get(&lag_key) == Some(&0.0)
                {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            handle.shutdown().await.expect("shutdown");
        });
    });
    let got = rec.0.lock().expect("lock").clone();
    assert_eq!(got.get(&key), Some(&0.0), "{got:?}");
    assert_eq!(got.get(&lag_key), Some(&0.0), "the lag once everything is acked: {got:?}");
}

/// Counts the `warn` events whose message starts with a prefix.
struct Warnings(Arc<Mutex<Vec<String>>>, &'static str);

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        if *event.metadata().level() == tracing::Level::WARN && m.0.starts_with(self.1) {
            self.0.lock().expect("lock").push(m.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A damaged record: every fetch that meets it counts it
/// (`rheo_damaged_reads_total`), the warning is logged once per position
/// per handle.
#[test]
fn damage_is_counted_at_every_fetch_and_warned_once_per_position() {
    use rheo::engine::segment::format::{FRAME_LEN, HEADER_LEN};
    use rheo::engine::segment::record::{Decoded, decode_record};

    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("native:{}?segment_bytes=4096", dir.path().display());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let rheo = Rheo::open(&url).await.expect("open");
        rheo.create_stream("s", StreamOptions::new()).await.expect("stream");
        rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
        for i in 0..40 {
            rheo.append("s", &json!({"i": i, "pad": "x".repeat(100)}), AppendOptions::new()).await.expect("append");
        }
    });
    // Record 3 of the first (sealed) segment: one byte of its body flipped.
    let mut segment = None;
    for stream in std::fs::read_dir(dir.path().join("streams")).expect("streams") {
        let path = stream.expect("entry").path().join("00000").join(format!("{:020}.log", 1));
        if path.exists() {
            segment = Some(path);
        }
    }
    let segment = segment.expect("the first segment");
    let mut bytes = std::fs::read(&segment).expect("read");
    let mut at = HEADER_LEN;
    loop {
        let Decoded::Record { header, size, .. } = decode_record(&bytes[at..]) else { panic!("no record 3") };
        if header.seq == 3 {
            break;
        }
        at += size;
    }
    bytes[at + FRAME_LEN + 30] ^= 0x5a;
    std::fs::write(&segment, &bytes).expect("write");

    let rec = Captured::default();
    let warned = Arc::new(Mutex::new(Vec::new()));
    let subscriber = Warnings(warned.clone(), "a due event can't be read");
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&rec, || {
            rt.block_on(async {
                let rheo = Rheo::open(&url).await.expect("reopen");
                for round in 0..3 {
                    let report = rheo.fetch_report("s", "g", FetchOptions::new().limit(100)).await.expect("fetch");
                    let damaged: Vec<u64> = report.damaged.iter().map(|d| d.sequence).collect();
                    assert_eq!(damaged, [3], "round {round}");
                    assert_eq!(report.leases.len(), if round == 0 { 39 } else { 0 }, "round {round}");
                }
            });
        });
    });
    let got = rec.0.lock().expect("lock").clone();
    assert_eq!(got.get(&format!("{}{{group=g,stream=s}}", observe::DAMAGED)), Some(&3.0), "{got:?}");
    assert_eq!(warned.lock().expect("lock").len(), 1, "{:?}", warned.lock().expect("lock"));
}
