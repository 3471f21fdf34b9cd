//! Shared setup of the engine benches: a data directory, 200-byte events.

#![allow(dead_code)]

use std::sync::Arc;

use rheo::engine::log::stream::Routed;
use rheo::engine::stream::Stream;
use rheo::engine::{Engine, EngineOptions};
use rheo::{AppendOptions, NewEvent};
use serde_json::json;

/// A fresh engine in a temporary directory (kept alive by the returned guard).
pub fn engine(opts: EngineOptions, partitions: u32) -> (Engine, Arc<Stream>, tempfile::TempDir) {
    let dir = tempfile::tempdir_in(bench_dir()).expect("temporary directory");
    let engine = Engine::open_dir(dir.path(), opts).expect("open");
    engine.create_stream("s", partitions, &[], 0).expect("stream");
    let stream = engine.stream("s").expect("stream");
    (engine, stream, dir)
}

/// Where bench data lives: `RHEO_BENCH_DIR`, else the target directory (a
/// real disk; /tmp may be a tmpfs, which would make fsync free).
pub fn bench_dir() -> std::path::PathBuf {
    std::env::var_os("RHEO_BENCH_DIR")
        .map(Into::into)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// An event whose record is about 200 bytes of payload.
pub fn event(n: u64) -> NewEvent {
    NewEvent::prepare(
        json!({"type": "order_placed", "order": n, "customer": "customer-0042", "currency": "EUR",
               "total": 12_345, "note": "x".repeat(96)}),
        AppendOptions::new().id(format!("evt-{n:020}")),
    )
}

/// Appends `events` to partition 0 as one atomic batch and waits until durable.
pub fn append(engine: &Engine, log: &Stream, events: &[NewEvent]) {
    let routed: Vec<Routed<'_>> =
        events.iter().map(|e| Routed { partition: 0, ts: 1_700_000_000_000, event: e }).collect();
    let (_, ticket) = engine.append(log, &routed).expect("append");
    ticket.wait().expect("durable");
}
