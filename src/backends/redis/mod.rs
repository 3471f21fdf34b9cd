//! The Redis backend: `redis://…` (feature `redis`), Redis Streams with
//! consumer groups, every rule of `docs/semantics.md` (ADR 0019); a Redis
//! Cluster with `redis+cluster://host:port,host:port/` or `cluster=true`
//! (ADR 0023).
//!
//! Each partition is a Redis stream whose entry ids are the sequences
//! (`<sequence>-0`), so a read by sequence is an `XRANGE` and retention an
//! exact `XTRIM MINID`. Each group keeps its cursor, fences, due and done
//! sets and dead letters beside the streams in hashes and sorted sets, and
//! every step that reads and changes that state is one Lua script, so no
//! check and act are ever split across round trips. A claim decides which
//! positions to hand out in its script and the entries are then read with
//! `XRANGE` outside it (ADR 0024); each partition stream also carries a
//! Redis consumer group of the group's name that follows the cursor
//! (`XINFO GROUPS`), whose pending list is not used. `docs/guides/redis.md` is the user's guide.
//!
//! Keys, all under `rheo:<namespace>:` and with the stream's name as the
//! hash tag (so a Redis Cluster keeps a stream and its groups on one node):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `streams` | set | every stream's name |
//! | `meta:{s}` | hash | partition count, created, retention, indexes, per partition the high watermark (`hw:<p>`) and stored bytes (`bytes:<p>`) |
//! | `s:{s}:<p>` | stream | partition p's events, entry id `<sequence>-0` |
//! | `ids:{s}` | hash | producer-given event id → `<p>:<sequence>:<timestamp>` (idempotent appends) |
//! | `groups:{s}` | hash | group name → its name as keys spell it |
//! | `g:{s}:<g>` | hash | max attempts, settings, per partition frontier (`f:<p>`) and cursor (`c:<p>`), skipped count, dead-letter counter |
//! | `st:{s}:<g>:<p>` | hash | sequence → the fence of a delivery in flight or waiting to be retried (ADR 0026: compact `L<attempt>:<lease id>:<expiry>` for a lease, JSON otherwise) |
//! | `due:{s}:<g>:<p>` | sorted set | when they become claimable (lease expiry, end of the retry wait): one `b<lease id>:<ranges>` per claimed batch, a sequence of its own after a renewal or for a retry wait (ADR 0022) |
//! | `done:{s}:<g>:<p>` | sorted set | settled sequences above the frontier |
//! | `dl:{s}:<g>`, `dead:{s}:<g>`, `dlid:{s}:<g>` | sorted set, hashes | dead letters in order, their records, by event id |
//!
//! Names are spelled in keys with `%`, `{`, `}`, `:` and control bytes
//! percent-encoded, so no two names share a key.
//!
//! URL options (query parameters; the rest of the URL is the driver's):
//!
//! | option | meaning | default |
//! |---|---|---|
//! | `rheo_namespace=NAME` | the key prefix's namespace (several fleets may share a server) | `Rheo.Redis` |
//! | `rheo_connect_timeout_ms=N` | how long connecting may take before `BackendUnavailable` | 5000 |
//! | `rheo_response_timeout_ms=N` | how long a call waits for its reply (then `Ambiguous` for a write) | 10000 |
//! | `rheo_retention_interval_ms=N` | how often retention runs in the background (0: never) | 10000 |
//! | `rheo_wait_replicas=N` | every write waits (`WAIT`) until N replicas have it; fewer within the wait timeout: `Ambiguous` (0 to 64) | 0 |
//! | `rheo_wait_timeout_ms=N` | how long a write waits for its replicas (below the response timeout) | 1000 |
//! | `cluster=true` | the hosts are seeds of a Redis Cluster (as the `redis+cluster://` scheme says) | false |
//!
//! ```no_run
//! # async fn demo() -> rheo::Result<()> {
//! let rheo = rheo::Rheo::open("redis://cache.internal:6379/0?rheo_namespace=billing").await?;
//! let cluster = rheo::Rheo::open("redis+cluster://10.0.0.1:6379,10.0.0.2:6379/?rheo_namespace=billing").await?;
//! # Ok(()) }
//! ```

mod conn;
mod groups;
mod scripts;
mod streams;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::RwLock;
use redis::Value;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use super::group_store;
use super::redact_url;
use super::url::{Taken, driver_url, read_options};
use crate::backend::{Backend, Subscription};
use crate::backends::WakeupMap;
use crate::backends::combine::Combiner;
use crate::error::{Error, Result};
use crate::model::append::NewEvent;
use crate::model::capabilities::Capabilities;
use crate::model::event::{Event, Position};
use crate::model::group::{
    DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, Replay, Reset,
};
use crate::model::lease::{FetchReport, LeaseRef, RetryOutcome};
use crate::model::query::{Page, Query};
use crate::model::retention::{Retention, RetentionReport};
use crate::model::stream::{IndexStatus, StreamInfo, StreamOptions};
use crate::model::time::{Clock, Timestamp};

const NAME: &str = "redis";

/// The namespace of the key prefix when the URL names none (the
/// reference's default).
pub const DEFAULT_NAMESPACE: &str = "Rheo.Redis";

/// Options of a `redis://` URL that are this crate's, not the driver's.
#[derive(Debug, Clone, PartialEq)]
struct UrlOptions {
    namespace: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    retention_interval: Duration,
    /// Replicas every write waits for (`WAIT`); 0: none.
    wait_replicas: u32,
    wait_timeout: Duration,
    /// `cluster=true`: the hosts are seeds of a Redis Cluster.
    cluster: bool,
}

impl Default for UrlOptions {
    fn default() -> Self {
        UrlOptions {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            retention_interval: Duration::from_secs(10),
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
            cluster: false,
        }
    }
}

/// Splits the `rheo_*` options off a URL: (options, the URL the driver
/// gets).
fn parse_url(url: &str) -> Result<(UrlOptions, String)> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut o = UrlOptions::default();
    let driver = read_options(NAME, query, |opt| {
        match opt.key {
            "rheo_namespace" => {
                let v = opt.value;
                if v.is_empty() || v.len() > 64 || v.bytes().any(|b| b.is_ascii_control() || b == b':' || b == b' ') {
                    return Err(opt.refuse("1 to 64 characters, no spaces, colons or control characters"));
                }
                o.namespace = v.to_owned();
            }
            "rheo_connect_timeout_ms" => o.connect_timeout = opt.millis(1, 3_600_000)?,
            "rheo_response_timeout_ms" => o.response_timeout = opt.millis(1, 3_600_000)?,
            "rheo_retention_interval_ms" => o.retention_interval = opt.millis(0, 86_400_000)?,
            "rheo_wait_replicas" => o.wait_replicas = u32::try_from(opt.number(0, 64)?).unwrap_or(64),
            "rheo_wait_timeout_ms" => o.wait_timeout = opt.millis(1, 3_600_000)?,
            "cluster" => o.cluster = opt.boolean()?,
            k if k.starts_with("rheo_") => {
                return Err(opt.unknown(&[
                    "rheo_namespace",
                    "rheo_connect_timeout_ms",
                    "rheo_response_timeout_ms",
                    "rheo_retention_interval_ms",
                    "rheo_wait_replicas",
                    "rheo_wait_timeout_ms",
                ]));
            }
            _ => return Ok(Taken::Driver),
        }
        Ok(Taken::Yes)
    })?;
    if o.wait_replicas > 0 && o.wait_timeout >= o.response_timeout {
        return Err(Error::invalid(
            "url",
            format!(
                "rheo_wait_timeout_ms ({} ms) must be below rheo_response_timeout_ms ({} ms): a write's reply \
                 comes after its replicas' wait",
                o.wait_timeout.as_millis(),
                o.response_timeout.as_millis()
            ),
        ));
    }
    Ok((o, driver_url(base, &driver)))
}

/// A name as keys spell it: `%`, `{`, `}`, `:` and control bytes
/// percent-encoded, so that every name has its own keys and the hash tag
/// `{...}` holds the whole stream name.
pub(crate) fn key_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '%' | '{' | '}' | ':') || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Maps a driver error at the boundary. `write`: the call may have changed
/// something, so a reply lost after it was sent leaves it `Ambiguous`.
pub(crate) fn map_err(operation: &'static str, write: bool, e: &redis::RedisError) -> Error {
    use redis::ErrorKind as K;
    let text = e.to_string();
    if e.is_connection_refusal() {
        return Error::unavailable(NAME, operation, text);
    }
    if e.is_timeout() || e.is_connection_dropped() || e.is_io_error() {
        return if write {
            Error::ambiguous(operation, format!("{NAME}: {text}"))
        } else {
            Error::unavailable(NAME, operation, text)
        };
    }
    match e.kind() {
        // The server refused the call before running it.
        K::Server(redis::ServerErrorKind::BusyLoading)
        | K::Server(redis::ServerErrorKind::TryAgain)
        | K::Server(redis::ServerErrorKind::ClusterDown)
        | K::Server(redis::ServerErrorKind::MasterDown)
        | K::Server(redis::ServerErrorKind::ReadOnly) => Error::unavailable(NAME, operation, text),
        _ if text.contains("OOM") => {
            Error::unavailable(NAME, operation, format!("{text} (the server is at its maxmemory: nothing was written)"))
        }
        // A script that stopped with an error may have made some of its
        // writes (Redis does not roll a script back): unknown.
        _ if write && text.contains("script") => Error::ambiguous(
            operation,
            format!("{NAME}: {text} (a script stopped part way; some of its writes may have been made)"),
        ),
        _ => Error::failed(operation, format!("{NAME}: {text}")),
    }
}

/// What the server's persistence makes of an acknowledged write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Durability {
    /// `appendonly yes`.
    pub aof: bool,
    /// `appendfsync`: `always`, `everysec` or `no`.
    pub fsync: String,
    /// False when `CONFIG GET` was refused (a managed server): unknown.
    pub known: bool,
}

impl Durability {
    /// True only with AOF and `appendfsync always`: every acknowledged
    /// write was on disk (fsynced) before its reply.
    pub fn durable(&self) -> bool {
        self.known && self.aof && self.fsync == "always"
    }

    /// One line for logs and `rheo` output.
    pub fn describe(&self) -> String {
        match (self.known, self.aof, self.fsync.as_str()) {
            (false, _, _) => "unknown (CONFIG GET refused): treated as not durable".to_owned(),
            (true, false, _) => {
                "no AOF: acknowledged writes are lost when Redis restarts (RDB snapshots at best)".to_owned()
            }
            (true, true, "always") => "AOF with appendfsync always: acknowledged writes survive a crash".to_owned(),
            (true, true, "everysec") => {
                "AOF with appendfsync everysec: up to about a second of acknowledged writes can be lost in a crash"
                    .to_owned()
            }
            (true, true, other) => {
                format!("AOF with appendfsync {other}: the OS decides when writes reach the disk")
            }
        }
    }
}

/// A connection to one server (reconnecting by itself) or to a Redis
/// Cluster (routing each call by its key's slot).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    /// A connection without reconnection (the watch tasks' blocking reads).
    Plain(redis::aio::MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Plain(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The keys a script may touch besides `KEYS[1]` (the meta hash). On a
/// cluster every one of them is declared, so that while the stream's slot
/// migrates between nodes the server refuses the whole call up front
/// (`ASK`, `TRYAGAIN`) instead of stopping the script at the first key it
/// finds missing, half way through its writes (ADR 0023).
#[derive(Debug, Clone, Copy)]
pub(super) enum Keys<'a> {
    /// The stream's own keys: its meta, ids and groups hashes and its
    /// partition streams.
    Stream,
    /// Those of a stream of this many partitions about to be created.
    NewStream(u32),
    /// The stream's keys and one group's.
    Group(&'a str),
    /// The stream's keys and these groups'.
    Groups(&'a [String]),
}

/// The Redis backend: its state, shared with the append combiner's
/// flushes, and the combiner.
pub struct RedisBackend {
    core: Arc<Core>,
    /// Concurrent appends to one stream go to the server together, one
    /// script per flush (see `Core::flush_appends`).
    appends: Combiner<Arc<str>, streams::Encoded, Position>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("prefix", &self.core.base).finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Opens `redis://…` (or `rediss://…`), or a cluster
    /// (`redis+cluster://…`, `cluster=true`): parses the URL, connects, and
    /// reads the servers' persistence settings.
    pub(crate) async fn open(url: &str, clock: Arc<dyn Clock>) -> Result<RedisBackend> {
        let core = Arc::new(Core::open(url, clock).await?);
        let shared = core.clone();
        let appends = Combiner::new(
            "append",
            streams::FLUSH_MAX_EVENTS,
            streams::FLUSH_MAX_BYTES,
            streams::FLUSH_DEPTH,
            move |stream: Arc<str>, calls| {
                let core = shared.clone();
                async move { core.flush_appends(&stream, calls).await }
            },
        );
        Ok(RedisBackend { core, appends })
    }

    /// What the server's persistence makes of acknowledged writes.
    pub fn durability(&self) -> String {
        self.core.durability()
    }
}

/// The Redis backend's state and operations.
pub(crate) struct Core {
    conn: Conn,
    /// On a cluster, the connection scripts that write go through: it
    /// never resends a call by itself (a resent script could run twice);
    /// `run` resends only what the cluster refused unrun.
    writes: Conn,
    connector: conn::Connector,
    /// On a cluster, how long one call may wait for a slot to settle
    /// (the response timeout).
    response_timeout: Duration,
    /// `rheo:<namespace>:`.
    base: String,
    clock: Arc<dyn Clock>,
    /// Partition counts of the streams this handle has seen (they never change).
    partition_counts: RwLock<HashMap<String, u32>>,
    wakeups: Arc<WakeupMap>,
    /// What subscribers were woken for (see `watch`).
    seen: Arc<watch::Seen>,
    watchers: watch::Watchers,
    durability: Durability,
    retention_interval: Duration,
    scripts: scripts::Scripts,
    /// `rheo_wait_replicas` and its timeout: every write waits for them.
    wait: Option<(u32, Duration)>,
}

impl Core {
    /// Connects (see [`RedisBackend::open`]).
    async fn open(url: &str, clock: Arc<dyn Clock>) -> Result<Core> {
        let (o, driver_url) = parse_url(url)?;
        let opened = if o.cluster || conn::cluster_scheme(&driver_url) {
            conn::open_cluster(url, &driver_url, &o).await?
        } else {
            conn::open_single(url, driver_url, &o).await?
        };
        let mut backend = Core {
            conn: opened.conn,
            writes: opened.writes,
            connector: opened.connector,
            response_timeout: o.response_timeout,
            base: format!("rheo:{}:", o.namespace),
            clock,
            partition_counts: RwLock::new(HashMap::new()),
            wakeups: Arc::new(WakeupMap::default()),
            seen: Arc::new(watch::Seen::default()),
            watchers: watch::Watchers::default(),
            durability: Durability { aof: false, fsync: String::new(), known: false },
            retention_interval: o.retention_interval,
            scripts: scripts::Scripts::new(),
            wait: (o.wait_replicas > 0).then_some((o.wait_replicas, o.wait_timeout)),
        };
        backend.durability = conn::durability(&mut backend.conn()).await?;
        tracing::info!(
            url = %redact_url(url),
            cluster = backend.is_cluster(),
            durability = %backend.durability.describe(),
            "redis backend opened"
        );
        Ok(backend)
    }

    /// True on a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// What the server's persistence makes of acknowledged writes.
    pub fn durability(&self) -> String {
        self.durability.describe()
    }

    fn conn(&self) -> Conn {
        self.conn.clone()
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The hash tag of a stream: `{<name as keys spell it>}`.
    fn tag(stream: &str) -> String {
        format!("{{{}}}", key_name(stream))
    }

    fn meta_key(&self, stream: &str) -> String {
        format!("{}meta:{}", self.base, Self::tag(stream))
    }

    fn part_key(&self, stream: &str, p: u32) -> String {
        format!("{}s:{}:{p}", self.base, Self::tag(stream))
    }

    fn group_key(&self, stream: &str, group: &str) -> String {
        format!("{}g:{}:{}", self.base, Self::tag(stream), key_name(group))
    }

    fn streams_key(&self) -> String {
        format!("{}streams", self.base)
    }

    /// Runs a script on `stream`'s keys: `args` after the prefix and the
    /// tag. `write`: a lost reply leaves the call `Ambiguous`. `keys`: what
    /// else it may touch, declared on a cluster (see [`Keys`]).
    ///
    /// On a cluster a write goes through a connection that never resends
    /// by itself: what the cluster refused before running it (`MOVED`,
    /// `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, a refused connection while a
    /// replica takes over) is sent again here until the response timeout,
    /// and nothing else is, so a script never runs twice.
    async fn run<A: redis::ToRedisArgs + Sync>(
        &self,
        script: &redis::Script,
        stream: &str,
        keys: Keys<'_>,
        args: &[A],
        operation: &'static str,
        write: bool,
    ) -> Result<Value> {
        let mut inv = script.prepare_invoke();
        inv.key(self.meta_key(stream));
        if self.is_cluster() {
            for k in self.declared_keys(stream, keys).await? {
                inv.key(k);
            }
        }
        inv.arg(&self.base).arg(Self::tag(stream));
        for a in args {
            inv.arg(a);
        }
        let mut conn = if write { self.writes.clone() } else { self.conn() };
        let deadline = tokio::time::Instant::now() + self.response_timeout;
        let mut pause = Duration::from_millis(5);
        let out = loop {
            crate::observe::round_trip(NAME);
            match inv.invoke_async::<Value>(&mut conn).await {
                Ok(v) => break v,
                Err(e) if self.is_cluster() && conn::unrun(&e) && tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(stream, operation, error = %e, "redis cluster: refused before running; again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(e) => return Err(map_err(operation, write, &e)),
            }
        };
        if write && let Some((n, timeout)) = self.wait {
            self.wait_for_replicas(&mut conn, stream, n, timeout, operation).await?;
        }
        Ok(out)
    }

    /// Every key `keys` names but the meta hash.
    async fn declared_keys(&self, stream: &str, keys: Keys<'_>) -> Result<Vec<String>> {
        let count = match keys {
            Keys::NewStream(n) => n,
            _ => self.partition_count(stream).await?,
        };
        let t = Self::tag(stream);
        let b = &self.base;
        let mut out = vec![format!("{b}ids:{t}"), format!("{b}groups:{t}")];
        out.extend((0..count).map(|p| self.part_key(stream, p)));
        let one = |g: &str, out: &mut Vec<String>| {
            let g = key_name(g);
            out.push(format!("{b}g:{t}:{g}"));
            for kind in ["st", "due", "done"] {
                out.extend((0..count).map(|p| format!("{b}{kind}:{t}:{g}:{p}")));
            }
            for kind in ["dl", "dead", "dlid"] {
                out.push(format!("{b}{kind}:{t}:{g}"));
            }
        };
        match keys {
            Keys::Stream | Keys::NewStream(_) => {}
            Keys::Group(g) => one(g, &mut out),
            Keys::Groups(gs) => gs.iter().for_each(|g| one(g, &mut out)),
        }
        Ok(out)
    }

    /// `WAIT n timeout` after a write (`rheo_wait_replicas`): it covers
    /// every write this connection sent before it. Fewer replicas than
    /// asked within the timeout: `Ambiguous` (the master has the write; a
    /// failover before a replica has it would lose it).
    async fn wait_for_replicas(
        &self,
        conn: &mut Conn,
        stream: &str,
        n: u32,
        timeout: Duration,
        operation: &'static str,
    ) -> Result<()> {
        crate::observe::round_trip(NAME);
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let mut wait = redis::cmd("WAIT");
        wait.arg(n).arg(millis);
        let got = match conn {
            // The master that ran the write: WAIT counts the replicas that
            // have every write of this connection to it.
            Conn::Cluster(c) => c.route_command(wait, conn::master_of(&self.meta_key(stream))).await,
            _ => wait.query_async(conn).await,
        }
        .map_err(|e| map_err(operation, true, &e))?;
        let got = v_int(&got).unwrap_or(0);
        if got < i64::from(n) {
            return Err(Error::ambiguous(
                operation,
                format!(
                    "{NAME}: stream {stream:?}: written on the master, but {got} of the {n} replicas \
                     rheo_wait_replicas asks for confirmed it within {millis} ms (a failover before one does \
                     may lose it; an append retried with its event ids is stored once)"
                ),
            ));
        }
        Ok(())
    }
}

// ---- reading replies ----

pub(crate) fn v_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(crate) fn v_u64(v: &Value) -> Option<u64> {
    v_int(v).and_then(|n| u64::try_from(n).ok())
}

pub(crate) fn v_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(crate) fn v_arr(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

/// A script's answer that is one of the "missing" codes: -1 the stream,
/// -2 the group.
pub(crate) fn missing_code(v: &Value, stream: &str, group: &str) -> Result<()> {
    match v_int(v) {
        Some(-1) => Err(Error::stream_not_found(stream)),
        Some(-2) => Err(Error::group_not_found(stream, group)),
        _ => Ok(()),
    }
}

/// An answer that is not what the script returns.
pub(crate) fn bad_reply(operation: &'static str, what: &str) -> Error {
    Error::failed(operation, format!("{NAME}: unexpected reply from the {operation} script: {what}"))
}

#[async_trait]
impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn combines_calls(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::new(NAME);
        c.durable = self.core.durability.durable();
        c.distributed = true;
        c.wakeups = true;
        c.ops_inspect = true;
        c.retention = true;
        c
    }

    async fn ping(&self) -> Result<()> {
        let mut conn = self.core.conn();
        redis::cmd("PING").query_async::<String>(&mut conn).await.map_err(|e| map_err("ping", false, &e))?;
        Ok(())
    }

    async fn ensure_schema(&self) -> Result<()> {
        // Keys need no schema; this checks the server runs the scripts
        // (Redis 7 or later: shebang flags, XGROUP SETID inside Lua).
        Backend::ping(self).await?;
        if let Some(v) = conn::lowest_version(&mut self.core.conn()).await
            && v.split('.').next().and_then(|m| m.trim().parse::<u32>().ok()).is_some_and(|m| m < 7)
        {
            return Err(Error::invalid("url", format!("redis {v}: rheo needs Redis 7 or later")));
        }
        Ok(())
    }

    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        self.core.create_stream_impl(stream, opts).await
    }

    async fn create_group(&self, stream: &str, group: &str, opts: &GroupOptions) -> Result<GroupSummary> {
        group_store::create_group(&*self.core, stream, group, opts).await
    }

    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
        let out = self.core.append_combined(&self.appends, stream, events).await?;
        let mut news = false;
        for at in out.iter().filter(|at| !at.duplicate) {
            news |= self.core.seen.raise(stream, at.partition, at.sequence);
        }
        if news {
            self.core.wakeups.wake(stream);
        }
        Ok(out)
    }

    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.core.read_impl(stream, partition, after, limit).await
    }

    async fn query(&self, query: &Query) -> Result<Page> {
        self.core.query_impl(query).await
    }

    async fn fetch(&self, stream: &str, group: &str, opts: &FetchOptions) -> Result<FetchReport> {
        self.core.fetch_impl(stream, group, opts).await
    }

    async fn renew(&self, lease: &LeaseRef, lease_duration: Duration) -> Result<Timestamp> {
        let mut all = self.core.renew_many_impl(std::slice::from_ref(lease), lease_duration).await?;
        all.pop().unwrap_or_else(|| Err(Error::failed("renew", "no result")))
    }

    async fn renew_many(&self, leases: &[LeaseRef], lease_duration: Duration) -> Result<Vec<Result<Timestamp>>> {
        self.core.renew_many_impl(leases, lease_duration).await
    }

    async fn ack(&self, lease: &LeaseRef) -> Result<()> {
        let mut all = self.core.ack_many_impl(std::slice::from_ref(lease)).await?;
        all.pop().unwrap_or_else(|| Err(Error::failed("ack", "no result")))
    }

    async fn ack_many(&self, leases: &[LeaseRef]) -> Result<Vec<Result<()>>> {
        self.core.ack_many_impl(leases).await
    }

    async fn retry(&self, lease: &LeaseRef, reason: &str, delay: Option<Duration>) -> Result<RetryOutcome> {
        group_store::retry(&*self.core, lease, reason, delay).await
    }

    async fn reject(&self, lease: &LeaseRef, reason: &str) -> Result<()> {
        self.core.reject_impl(lease, reason).await
    }

    async fn skip(&self, stream: &str, group: &str, partition: u32, sequence: u64, reason: &str) -> Result<bool> {
        group_store::skip(&*self.core, stream, group, partition, sequence, reason).await
    }

    async fn replay(&self, stream: &str, group: &str, replay: &Replay) -> Result<u64> {
        group_store::replay(&*self.core, stream, group, replay).await
    }

    async fn reset_group(&self, stream: &str, group: &str, reset: &Reset) -> Result<()> {
        group_store::reset(&*self.core, stream, group, reset).await
    }

    async fn lag(&self, stream: &str, group: &str, partitions: Option<&[u32]>) -> Result<Lag> {
        group_store::lag(&*self.core, stream, group, partitions).await
    }

    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        self.core.list_streams_impl().await
    }

    async fn stream_info(&self, stream: &str) -> Result<StreamInfo> {
        self.core.stream_info_impl(stream).await
    }

    async fn set_retention(&self, stream: &str, retention: &Retention) -> Result<StreamInfo> {
        self.core.set_retention_impl(stream, retention).await
    }

    async fn enforce_retention(&self, stream: &str) -> Result<RetentionReport> {
        self.core.enforce_retention_impl(stream).await
    }

    fn retention_interval(&self) -> Option<Duration> {
        (!self.core.retention_interval.is_zero()).then_some(self.core.retention_interval)
    }

    async fn retention_round(&self) -> Result<Vec<RetentionReport>> {
        self.core.retention_round_impl().await
    }

    async fn list_groups(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        self.core.list_groups_impl(stream).await
    }

    async fn dead_letters(&self, stream: &str, group: &str, opts: &DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        self.core.dead_letters_impl(stream, group, opts).await
    }

    async fn group_info(&self, stream: &str, group: &str) -> Result<GroupInfo> {
        group_store::group_info(&*self.core, stream, group).await
    }

    async fn create_index(&self, stream: &str, field: &str) -> Result<()> {
        self.core.create_index_impl(stream, field).await
    }

    async fn index_status(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        self.core.index_status_impl(stream).await
    }

    async fn subscribe(&self, stream: &str) -> Result<Subscription> {
        let count = self.core.partition_count(stream).await?;
        let keys = (0..count).map(|p| self.core.part_key(stream, p)).collect();
        self.core.watchers.ensure(
            stream,
            keys,
            &self.core.connector,
            self.core.wakeups.clone(),
            self.core.seen.clone(),
        );
        Ok(self.core.wakeups.get(stream).subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rheo_options_are_taken_off_the_url_and_checked() {
        let (o, driver) = parse_url("redis://h:1/0?rheo_namespace=billing&protocol=resp3").expect("parse");
        assert_eq!(o.namespace, "billing");
        assert_eq!(driver, "redis://h:1/0?protocol=resp3");
        let (o, _) = parse_url("redis://h/?rheo_wait_replicas=2&rheo_wait_timeout_ms=250").expect("parse");
        assert_eq!((o.wait_replicas, o.wait_timeout), (2, Duration::from_millis(250)));
        let (o, driver) = parse_url("redis://h/").expect("parse");
        assert_eq!((o, driver.as_str()), (UrlOptions::default(), "redis://h/"));
        for (url, says) in [
            ("redis://h/?rheo_namespace=", "1 to 64 characters"),
            ("redis://h/?rheo_namespace=a:b", "no spaces, colons"),
            ("redis://h/?rheo_connect_timeout_ms=0", "from 1 to"),
            ("redis://h/?rheo_retention_interval_ms=x", "from 0 to"),
            ("redis://h/?rheo_colour=red", "unknown redis option \"rheo_colour\""),
            ("redis://h/?rheo_wait_replicas=65", "from 0 to 64"),
            ("redis://h/?rheo_wait_replicas=-1", "from 0 to 64"),
            ("redis://h/?rheo_wait_replicas=1&rheo_wait_timeout_ms=10000", "must be below rheo_response_timeout_ms"),
        ] {
            let e = parse_url(url).expect_err(url);
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn names_have_keys_of_their_own() {
        assert_eq!(key_name("orders.v2"), "orders.v2");
        assert_eq!(key_name("a}:b{%"), "a%7D%3Ab%7B%25");
        // Without the encoding these two pairs would share the key g:{a}:x}:b.
        let one = format!("{}:{}", key_name("a"), key_name("x}:b"));
        let two = format!("{}:{}", key_name("a}:x"), key_name("b"));
        assert_ne!(one, two);
        assert_eq!(Core::tag("a}b"), "{a%7Db}");
    }

    #[test]
    fn durability_is_stated_per_setting() {
        let d = |aof, fsync: &str| Durability { aof, fsync: fsync.to_owned(), known: true };
        assert!(d(true, "always").durable());
        assert!(!d(true, "everysec").durable() && d(true, "everysec").describe().contains("a second"));
        assert!(!d(false, "always").durable() && d(false, "always").describe().contains("no AOF"));
        assert!(!Durability { aof: true, fsync: "always".into(), known: false }.durable());
    }
}
