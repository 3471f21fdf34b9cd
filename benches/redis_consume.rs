//! Consuming from Redis: Rheo's Redis backend beside bare Redis Streams on
//! the same server in the same run (docs/benchmarks.md, issue 19).
//!
//! `RHEO_REDIS_URL=redis://… cargo bench -p rheo --features redis --bench
//! redis_consume` (run the server with `--appendonly yes --appendfsync
//! always` for the durable figures; the table says which it was). Each
//! case consumes `RHEO_BENCH_EVENTS` events (default 20,000, 200-byte
//! payloads, one partition) with one consumer, 100 per batch, and prints
//! events/s, the median of `RHEO_BENCH_ROUNDS` rounds (default 3):
//!
//! - **rheo fetch(100) + ack_many**: through the public API, every lease
//!   fenced (two script calls per batch);
//! - **bare Lua in the server**: one `EVAL` per batch running
//!   `XREADGROUP COUNT 100` and `XACK` of what it read, the upper bound of
//!   any client (one round trip, no fences);
//! - **bare client loop**: `XREADGROUP COUNT 100`, then `XACK` of its ids
//!   (two round trips, no fences), what a user writes by hand.
//!
//! The events are appended before each case (not timed). The rheo case
//! also prints its time per batch in fetch and in ack_many;
//! `RHEO_BENCH_ONLY_RHEO=1` runs only it.

#![allow(missing_docs)]

use std::time::Instant;

use rheo::{AppendOptions, FetchOptions, GroupOptions, Rheo, StreamOptions};
use serde_json::json;

const BATCH: usize = 100;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn payload(n: usize) -> serde_json::Value {
    json!({"type": "order_placed", "order": n, "customer": "customer-0042", "currency": "EUR",
           "total": 12_345, "note": "x".repeat(96)})
}

/// The bare in-server loop: XREADGROUP COUNT n, then XACK of what it read.
const LUA_BATCH: &str = r"
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], 'c', 'COUNT', ARGV[2], 'STREAMS', KEYS[1], '>')
if not r then return 0 end
local ids = {}
for _, e in ipairs(r[1][2]) do ids[#ids + 1] = e[1] end
redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
return #ids
";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn fill_raw(conn: &mut redis::aio::MultiplexedConnection, key: &str, events: usize) {
    let body = serde_json::to_string(&payload(0)).expect("json");
    for chunk in (0..events).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for _ in chunk {
            pipe.cmd("XADD").arg(key).arg("*").arg("payload").arg(&body).ignore();
        }
        let () = pipe.query_async(conn).await.expect("xadd");
    }
    let () = redis::cmd("XGROUP").arg("CREATE").arg(key).arg("g").arg("0").query_async(conn).await.expect("group");
}

async fn rheo_round(base: &str, events: usize) -> f64 {
    let ns = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let sep = if base.contains('?') { '&' } else { '?' };
    let rheo = Rheo::open(&format!("{base}{sep}rheo_namespace={ns}&rheo_retention_interval_ms=0")).await.expect("open");
    rheo.create_stream("s", StreamOptions::new()).await.expect("stream");
    for start in (0..events).step_by(1000) {
        let batch: Vec<_> = (start..(start + 1000).min(events)).map(|i| (payload(i), AppendOptions::new())).collect();
        rheo.append_batch_with("s", batch).await.expect("append");
    }
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    let t = Instant::now();
    let mut done = 0;
    let (mut in_fetch, mut in_ack) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    while done < events {
        let t0 = Instant::now();
        let leases = rheo.fetch("s", "g", FetchOptions::new().limit(BATCH)).await.expect("fetch");
        let t1 = Instant::now();
        assert!(!leases.is_empty(), "events left to fetch");
        for r in rheo.ack_many(&leases).await.expect("ack") {
            r.expect("acked");
        }
        in_fetch += t1 - t0;
        in_ack += t1.elapsed();
        done += leases.len();
    }
    let rate = events as f64 / t.elapsed().as_secs_f64();
    let batches = u32::try_from(events.div_ceil(BATCH)).unwrap_or(u32::MAX);
    eprintln!("rheo: per batch, fetch {:?}, ack_many {:?}", in_fetch / batches, in_ack / batches);
    assert_eq!(rheo.lag("s", "g").await.expect("lag").total, 0);
    drop_keys(base, &format!("rheo:{ns}:*")).await;
    rate
}

async fn bare_round(conn: &mut redis::aio::MultiplexedConnection, events: usize, in_server: bool) -> f64 {
    let key = format!("bench:{}", uuid::Uuid::new_v4().simple());
    fill_raw(conn, &key, events).await;
    let script = redis::Script::new(LUA_BATCH);
    let t = Instant::now();
    let mut done = 0;
    while done < events {
        let n: usize = if in_server {
            script.key(&key).arg("g").arg(BATCH).invoke_async(conn).await.expect("eval")
        } else {
            let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("g")
                .arg("c")
                .arg("COUNT")
                .arg(BATCH)
                .arg("STREAMS")
                .arg(&key)
                .arg(">")
                .query_async(conn)
                .await
                .expect("xreadgroup");
            let ids: Vec<String> = reply.keys.iter().flat_map(|k| k.ids.iter().map(|e| e.id.clone())).collect();
            let acked: usize = redis::cmd("XACK").arg(&key).arg("g").arg(&ids).query_async(conn).await.expect("xack");
            assert_eq!(acked, ids.len());
            ids.len()
        };
        assert!(n > 0, "events left to read");
        done += n;
    }
    let rate = events as f64 / t.elapsed().as_secs_f64();
    let () = redis::cmd("DEL").arg(&key).query_async(conn).await.expect("del");
    rate
}

async fn drop_keys(base: &str, pattern: &str) {
    let client = redis::Client::open(base.split('?').next().unwrap_or(base)).expect("client");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connection");
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut conn).await.expect("keys");
    for chunk in keys.chunks(500) {
        let _: i64 = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await.expect("unlink");
    }
}

fn main() {
    let Ok(base) = std::env::var("RHEO_REDIS_URL") else {
        eprintln!("redis_consume: set RHEO_REDIS_URL (redis://host:port/) to run it; nothing ran");
        return;
    };
    // `cargo bench` passes --bench; `cargo test --benches` runs it once.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let events = env("RHEO_BENCH_EVENTS", 20_000);
    let rounds = env("RHEO_BENCH_ROUNDS", 3).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = redis::Client::open(base.split('?').next().unwrap_or(&base)).expect("client");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connection");
        let cfg: Vec<String> =
            redis::cmd("CONFIG").arg("GET").arg("append*").query_async(&mut conn).await.unwrap_or_default();
        let (mut rheo, mut lua, mut bare) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            rheo.push(rheo_round(&base, events).await);
            if std::env::var("RHEO_BENCH_ONLY_RHEO").is_ok() {
                lua.push(1.0);
                bare.push(1.0);
                continue;
            }
            lua.push(bare_round(&mut conn, events, true).await);
            bare.push(bare_round(&mut conn, events, false).await);
        }
        let (r, l, b) = (median(rheo), median(lua), median(bare));
        println!("Redis {:?}, {events} events, 1 consumer, {BATCH} per batch, median of {rounds} rounds", cfg);
        println!();
        println!("| case | events/s | vs bare Lua |");
        println!("|---|---:|---:|");
        println!("| rheo fetch(100) + ack_many (fenced) | {r:.0} | {:.0} % |", 100.0 * r / l);
        println!("| bare Lua in the server (XREADGROUP + XACK per EVAL) | {l:.0} | 100 % |");
        println!("| bare client loop (XREADGROUP, then XACK) | {b:.0} | {:.0} % |", 100.0 * b / l);
    });
}
