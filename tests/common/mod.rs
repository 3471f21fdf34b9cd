//! Backend fixtures shared by the conformance suite and the property tests.
//!
//! A fixture is a fresh, empty backend behind a `Rheo` handle, driven by a
//! manual clock so that expiry and backoff are tested without sleeping.
//! Adding a backend to every suite is one line in `backends!` below.

#![allow(dead_code)]

use std::any::Any;
use std::sync::Arc;

use futures::future::BoxFuture;
use rheo::{ManualClock, Rheo, Timestamp};

/// A fresh backend and the clock it reads.
pub struct Fixture {
    /// The handle under test.
    pub rheo: Rheo,
    /// The clock every backend call reads.
    pub clock: ManualClock,
    /// Keeps temporary directories, servers... alive for the test.
    pub guard: Option<Box<dyn Any + Send>>,
    /// A slow backend (MongoDB on SecantusDB, a server written in Python):
    /// cases that work on thousands of events use a few hundred instead,
    /// and say so in their name's documentation.
    pub small: bool,
}

/// Builds a fresh fixture.
pub type Factory = fn() -> BoxFuture<'static, Fixture>;

/// The instant every fixture's clock starts at (2026-01-01T00:00:00Z).
pub const START: Timestamp = Timestamp::from_millis(1_767_225_600_000);

/// The memory backend.
pub fn memory() -> BoxFuture<'static, Fixture> {
    Box::pin(async {
        let clock = ManualClock::new(START);
        let rheo = Rheo::builder()
            .clock(Arc::new(clock.clone()))
            .consumer_id("test-consumer")
            .open("memory:")
            .await
            .expect("memory backend opens");
        Fixture { rheo, clock, guard: None, small: false }
    })
}

/// The native backend on an in-memory file system (`MemVfs`), with tiny
/// segments (4 KiB): most events are in sealed segments, read through their
/// index files once the background builder has written them (and scanned
/// before), the rest through the active segment's in-memory index. It
/// commits inline (`EngineOptions::inline_io`: on the waiting threads,
/// no commit thread); `native_disk` runs the commit thread.
pub fn native_mem() -> BoxFuture<'static, Fixture> {
    Box::pin(async {
        let clock = ManualClock::new(START);
        let vfs: Arc<dyn rheo::engine::vfs::Vfs> = Arc::new(rheo::engine::vfs::MemVfs::new());
        // No background retention: the cases run passes themselves, on
        // the fixture's clock.
        let opts = rheo::backends::native::EngineOptions::default()
            .segment_bytes(4096)
            .preallocate_bytes(1024)
            .inline_io(true)
            .retention_interval(std::time::Duration::ZERO);
        let engine = rheo::engine::Engine::open(vfs, opts).expect("engine opens");
        let backend = rheo::backends::native::NativeBackend::with_engine(engine, Arc::new(clock.clone()));
        let rheo = Rheo::builder()
            .clock(Arc::new(clock.clone()))
            .consumer_id("test-consumer")
            .with_backend(Arc::new(backend))
            .expect("native backend");
        Fixture { rheo, clock, guard: None, small: false }
    })
}

/// The native backend on disk, in a temporary directory, with small
/// segments (16 KiB, preallocated 4 KiB at a time) so that a few hundred
/// events span sealed segments that retention can drop.
pub fn native_disk() -> BoxFuture<'static, Fixture> {
    Box::pin(async {
        let clock = ManualClock::new(START);
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!(
            "native:{}?segment_bytes=16384&preallocate_bytes=4096&retention_interval_ms=0",
            dir.path().display()
        );
        let rheo = Rheo::builder()
            .clock(Arc::new(clock.clone()))
            .consumer_id("test-consumer")
            .open(&url)
            .await
            .expect("native backend opens");
        Fixture { rheo, clock, guard: Some(Box::new(dir)), small: false }
    })
}

/// SQLite on a temporary file.
pub fn sqlite() -> BoxFuture<'static, Fixture> {
    sqlite_with("")
}

/// SQLite with a delivery row per claim (`rheo_claims=rows`, the mode for
/// groups shared with Elixir consumers).
pub fn sqlite_rows() -> BoxFuture<'static, Fixture> {
    sqlite_with("&rheo_claims=rows")
}

fn sqlite_with(options: &'static str) -> BoxFuture<'static, Fixture> {
    Box::pin(async move {
        let clock = ManualClock::new(START);
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite:{}?rheo_retention_interval_ms=0{options}", dir.path().join("rheo.db").display());
        let rheo = Rheo::builder()
            .clock(Arc::new(clock.clone()))
            .consumer_id("test-consumer")
            .open(&url)
            .await
            .expect("sqlite backend opens");
        Fixture { rheo, clock, guard: Some(Box::new(dir)), small: false }
    })
}

/// Why the PostgreSQL cases are ignored by a plain `cargo test`.
pub const NEEDS_POSTGRES: &str = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set";

/// The PostgreSQL server's URL (`RHEO_POSTGRES_URL`); a case that needs it
/// fails without it (they are ignored unless asked for).
pub fn postgres_url() -> String {
    std::env::var("RHEO_POSTGRES_URL")
        .expect("RHEO_POSTGRES_URL names a PostgreSQL database (postgres://user@host:port/db); .ci/run starts one")
}

/// PostgreSQL, in a fresh schema of the database `RHEO_POSTGRES_URL` names
/// (so cases running at once never meet).
pub fn postgres() -> BoxFuture<'static, Fixture> {
    postgres_with("")
}

/// PostgreSQL with a delivery row per claim (`rheo_claims=rows`).
pub fn postgres_rows() -> BoxFuture<'static, Fixture> {
    postgres_with("&rheo_claims=rows")
}

fn postgres_with(options: &'static str) -> BoxFuture<'static, Fixture> {
    Box::pin(async move {
        let clock = ManualClock::new(START);
        let base = postgres_url();
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}rheo_schema={schema}&rheo_pool=4&rheo_retention_interval_ms=0{options}");
        let rheo = Rheo::builder()
            .clock(Arc::new(clock.clone()))
            .consumer_id("test-consumer")
            .open(&url)
            .await
            .expect("postgres backend opens");
        Fixture { rheo, clock, guard: None, small: false }
    })
}

/// Why the MongoDB cases are ignored by a plain `cargo test`.
pub const NEEDS_MONGO: &str =
    "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set (and --features mongo)";

/// The MongoDB-wire server's URL (`RHEO_MONGO_URL`) with `db` as its
/// database.
#[cfg(feature = "mongo")]
pub fn mongo_url(db: &str) -> String {
    let base = std::env::var("RHEO_MONGO_URL")
        .expect("RHEO_MONGO_URL names a MongoDB-wire server (mongodb://host:port/?...); .ci/run starts one");
    let (head, query) = base.split_once('?').unwrap_or((&base, ""));
    let head = head.trim_end_matches('/');
    if query.is_empty() { format!("{head}/{db}") } else { format!("{head}/{db}?{query}") }
}

/// `url` with background retention rounds off (the cases run passes
/// themselves, on the fixture's clock).
#[cfg(feature = "mongo")]
pub fn no_background_retention(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}rheo_retention_interval_ms=0")
}

/// Drops a MongoDB database when dropped (the case passed or failed).
#[cfg(feature = "mongo")]
pub struct DropDatabase(pub String);

#[cfg(feature = "mongo")]
impl Drop for DropDatabase {
    fn drop(&mut self) {
        let db = self.0.clone();
        // A runtime of its own on its own thread: the case's may be gone.
        let _ = std::thread::spawn(move || {
            let Ok(base) = std::env::var("RHEO_MONGO_URL") else { return };
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                rt.block_on(async {
                    if let Ok(c) = mongodb::Client::with_uri_str(&base).await {
                        let _ = c.database(&db).drop().await;
                    }
                });
            }
        })
        .join();
    }
}

/// MongoDB, in a fresh database of the server `RHEO_MONGO_URL` names,
/// dropped when the fixture goes.
#[cfg(feature = "mongo")]
pub fn mongo() -> BoxFuture<'static, Fixture> {
    Box::pin(async {
        let clock = ManualClock::new(START);
        let db = format!("t_{}", uuid::Uuid::new_v4().simple());
        let rheo = Rheo::builder()
            .clock(Arc::new(clock.clone()))
            .consumer_id("test-consumer")
            .open(&no_background_retention(&mongo_url(&db)))
            .await
            .expect("mongo backend opens");
        Fixture { rheo, clock, guard: Some(Box::new(DropDatabase(db))), small: true }
    })
}

/// Why the Redis cases are ignored by a plain `cargo test`.
pub const NEEDS_REDIS: &str =
    "needs a Redis server: .ci/run starts one and runs these with RHEO_REDIS_URL set (and --features redis)";

/// The Redis server's URL (`RHEO_REDIS_URL`).
#[cfg(feature = "redis")]
pub fn redis_url() -> String {
    std::env::var("RHEO_REDIS_URL")
        .expect("RHEO_REDIS_URL names a Redis server (redis://host:port/); .ci/run starts one")
}

/// Deletes every key of a namespace when dropped (the case passed or failed).
#[cfg(feature = "redis")]
pub struct DropNamespace(pub String);

#[cfg(feature = "redis")]
impl Drop for DropNamespace {
    fn drop(&mut self) {
        let ns = self.0.clone();
        // A runtime of its own on its own thread: the case's may be gone.
        let _ = std::thread::spawn(move || {
            if let Ok(url) = std::env::var("RHEO_REDIS_URL") {
                unlink_namespace(&url, &ns);
            }
        })
        .join();
    }
}

/// Deletes every key of namespace `ns` on the server or cluster `url`
/// names (blocking; errors ignored).
#[cfg(feature = "redis")]
pub fn unlink_namespace(url: &str, ns: &str) {
    let pattern = format!("rheo:{ns}:*");
    let base = url.split('?').next().unwrap_or(url);
    if let Some(hosts) = base.strip_prefix("redis+cluster://") {
        // KEYS goes to every master, UNLINK to each key's own.
        let seeds: Vec<String> = hosts.trim_end_matches('/').split(',').map(|h| format!("redis://{h}/")).collect();
        let Ok(client) = redis::cluster::ClusterClient::new(seeds) else { return };
        let Ok(mut conn) = client.get_connection() else { return };
        let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut conn).unwrap_or_default();
        for k in keys {
            let _: redis::RedisResult<i64> = redis::cmd("UNLINK").arg(k).query(&mut conn);
        }
        return;
    }
    let Ok(client) = redis::Client::open(base) else { return };
    let Ok(mut conn) = client.get_connection() else { return };
    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut conn).unwrap_or_default();
    for chunk in keys.chunks(500) {
        let _: redis::RedisResult<i64> = redis::cmd("UNLINK").arg(chunk).query(&mut conn);
    }
}

/// Redis, in a fresh key namespace of the server `RHEO_REDIS_URL` names,
/// deleted when the fixture goes.
#[cfg(feature = "redis")]
pub fn redis() -> BoxFuture<'static, Fixture> {
    Box::pin(async {
        let clock = ManualClock::new(START);
        let ns = format!("t_{}", uuid::Uuid::new_v4().simple());
        let base = redis_url();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}rheo_namespace={ns}&rheo_retention_interval_ms=0");
        let rheo = Rheo::builder()
            .clock(Arc::new(clock.clone()))
            .consumer_id("test-consumer")
            .open(&url)
            .await
            .expect("redis backend opens");
        Fixture { rheo, clock, guard: Some(Box::new(DropNamespace(ns))), small: false }
    })
}

/// Expands `$callback!(name, factory)` once per backend that implements the
/// whole of docs/semantics.md. Adding a backend = one line here.
#[macro_export]
macro_rules! backends {
    ($callback:ident) => {
        $callback!(memory, $crate::common::memory);
        $callback!(native_mem, $crate::common::native_mem);
        $callback!(native_disk, $crate::common::native_disk);
        $callback!(sqlite, $crate::common::sqlite);
        $callback!(sqlite_rows, $crate::common::sqlite_rows);
    };
}

/// Expands `$callback!(name, factory)` once per backend that needs a
/// service; their cases are ignored by a plain `cargo test` (which lists
/// them as such) and run by .ci/run with `--ignored`.
#[macro_export]
macro_rules! service_backends {
    ($callback:ident) => {
        $callback!(postgres, $crate::common::postgres);
        $callback!(postgres_rows, $crate::common::postgres_rows);
    };
}

/// Expands `$callback!(name, factory)` for MongoDB when the `mongo`
/// feature is on (`cargo test` leaves it off; see Cargo.toml). Its cases
/// are ignored unless run with `--ignored`, as .ci/run does with a server
/// started.
#[cfg(feature = "mongo")]
#[macro_export]
macro_rules! mongo_backends {
    ($callback:ident) => {
        $callback!(mongo, $crate::common::mongo);
    };
}

/// (The `mongo` feature is off: no MongoDB cases.)
#[cfg(not(feature = "mongo"))]
#[macro_export]
macro_rules! mongo_backends {
    ($callback:ident) => {};
}

/// Expands `$callback!(name, factory)` for Redis when the `redis` feature
/// is on (`cargo test` leaves it off). Its cases are ignored unless run
/// with `--ignored`, as .ci/run does with a server started.
#[cfg(feature = "redis")]
#[macro_export]
macro_rules! redis_backends {
    ($callback:ident) => {
        $callback!(redis, $crate::common::redis);
    };
}

/// (The `redis` feature is off: no Redis cases.)
#[cfg(not(feature = "redis"))]
#[macro_export]
macro_rules! redis_backends {
    ($callback:ident) => {};
}
