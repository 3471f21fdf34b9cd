//! The SQL backends: `sqlite:PATH` (feature `sqlite`) and `postgres://…`
//! (feature `postgres`), one core over sqlx with a small dialect seam
//! (ADR 0013).
//!
//! They share the reference implementation's schema (five `rheo_*` tables,
//! see `docs/guides/sql.md`): an Elixir Rheo producer and a Rust consumer
//! group, or competing consumers of both, can work on one database. Group
//! state lives in the database (`rheo_groups`, `rheo_deliveries`), so many
//! processes on many hosts can compete on a PostgreSQL group; every claim
//! is one statement with `FOR UPDATE SKIP LOCKED`, bounded below by the
//! group's frontier, and every settle is fenced by the lease id.
//!
//! URL options (query parameters; PostgreSQL's own parameters such as
//! `sslmode` pass through to the driver):
//!
//! | option | backend | meaning | default |
//! |---|---|---|---|
//! | `rheo_schema=NAME` | postgres | qualify the tables with this schema (created when missing) | none (the search path) |
//! | `rheo_pool=N` | both | the most connections (1 to 256; PostgreSQL opens as many again for claims and acks, and one for LISTEN) | 10 (sqlite: 1, see below) |
//! | `rheo_connect_timeout_ms=N` | both | how long a call waits for a connection before `BackendUnavailable` | 5000 |
//! | `rheo_statement_timeout_ms=N` | postgres | the server's `statement_timeout` | none |
//! | `synchronous=normal\|full` | sqlite | `PRAGMA synchronous` (`full`: every commit survives a power cut) | `full` |
//! | `busy_timeout_ms=N` | sqlite | how long a writer waits for the lock before its transaction runs again (for 4 times as long in all, at least 20 s; then `BackendUnavailable`) | 5000 |
//! | `rheo_claims=ranges\|rows` | both | how a fetch takes new events: `ranges` writes one claim row per run of positions (ADR 0021); `rows` writes a delivery row per event, as the Elixir reference does, for groups whose competing consumers include Elixir processes | `ranges` |
//! | `rheo_retention_interval_ms=N` | both | how often a background retention round runs over the streams with a retention (0: never; [`crate::Rheo::enforce_retention`] still works) | 10000 |
//!
//! SQLite uses one connection unless `rheo_pool` says more: its calls then
//! queue in order rather than race for SQLite's single write lock. More
//! connections let reads run beside a write; writers (of this and other
//! processes) then wait up to `busy_timeout_ms` for the lock.
//!
//! ```no_run
//! # async fn demo() -> rheo::Result<()> {
//! let rheo = rheo::Rheo::open("sqlite:./events.db").await?;
//! let pg = rheo::Rheo::open("postgres://app@db.internal/app?rheo_schema=events").await?;
//! # Ok(()) }
//! ```

// With one of the two features, the other dialect's helpers go unused.
#![cfg_attr(not(all(feature = "sqlite", feature = "postgres")), allow(dead_code, irrefutable_let_patterns))]

mod append;
mod claims;
mod db;
mod dialect;
mod frontier;
mod groups;
#[cfg(feature = "postgres")]
mod listen;
mod query;
mod retention;
mod schedule;
pub(crate) mod schema;
mod streams;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

#[cfg(feature = "postgres")]
use super::redact_url;
use super::url::{Taken, read_options};
use crate::backend::Subscription;
use crate::error::{Error, Result};
use crate::model::append::NewEvent;
use crate::model::capabilities::Capabilities;
use crate::model::event::Position;
use crate::model::stream::StreamInfo;
use crate::model::time::{Clock, Timestamp};

use db::{Phase, Pool, Stmt, map_err};
pub(crate) use dialect::Dialect;
use schema::Names;

/// A backend on a SQL database: SQLite or PostgreSQL. Open it with
/// `Rheo::open("sqlite:PATH")` or `Rheo::open("postgres://…")`.
#[derive(Debug)]
pub struct SqlBackend {
    d: Dialect,
    pool: Pool,
    names: Names,
    clock: Arc<dyn Clock>,
    /// Expiry and timestamps from the database's clock (PostgreSQL with
    /// the system clock), so that hosts with skewed clocks agree.
    db_clock: bool,
    /// False for `sqlite::memory:`.
    durable: bool,
    /// Partition counts of the streams seen (a stream's count never changes).
    partition_counts: RwLock<HashMap<String, u32>>,
    wakeups: Arc<WakeupMap>,
    #[cfg(feature = "postgres")]
    listener: listen::Listener,
    /// The LISTEN connection's own pool (one connection, opened on the
    /// first subscription), so that it never takes one of the calls'.
    #[cfg(feature = "postgres")]
    listen_pool: Option<sqlx::postgres::PgPool>,
    /// Index builds running in the background: (stream, field) -> failure.
    index_builds: Arc<parking_lot::Mutex<HashMap<String, IndexBuildState>>>,
    /// How often the facade runs a background retention round.
    retention_interval: Duration,
    /// How long a call keeps running a transaction again that met SQLite's
    /// lock held by another process (None on PostgreSQL).
    busy_budget: Option<Duration>,
    /// Group commit of appends (ADR 0020), and what its flushes need.
    appender: Arc<append::Appender>,
    appends: crate::backends::combine::Combiner<append::Key, append::Row, Position>,
    /// The frontier SQL and its flusher (ADR 0021).
    frontier: Arc<frontier::Frontiers>,
    /// The pool of claims and acks: on PostgreSQL connections that keep
    /// generic plans (see `open_postgres`); otherwise `pool` itself.
    hot: Pool,
    /// How fetches take fresh positions (`rheo_claims`).
    claims_mode: ClaimsMode,
    /// Partition counts and partition subsets of the groups fetched from
    /// (neither changes once a group exists): a fetch needs no read first.
    group_scopes: RwLock<HashMap<(String, String), GroupScope>>,
}

/// How a fetch takes positions no fetch has taken yet (URL `rheo_claims`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimsMode {
    /// One `rheo_rs_claims` row per run of fresh positions (ADR 0021).
    Ranges,
    /// A delivery row per position, as the reference writes them: for
    /// groups whose competing consumers include Elixir processes.
    Rows,
}

/// What a fetch needs to know of a group before it claims.
#[derive(Debug, Clone)]
pub(crate) struct GroupScope {
    pub count: u32,
    pub partitions: Option<Vec<u32>>,
}

/// A background index build.
#[derive(Debug, Clone)]
enum IndexBuildState {
    Running,
    Failed,
}

use crate::backends::WakeupMap;

/// "now" of one call: the database's clock, or a bound instant.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Now {
    Db,
    At(Timestamp),
}

/// On SQLite, a call whose transaction meets the write lock held by
/// another process (past `busy_timeout_ms`) runs it again until this many
/// busy timeouts, and at least [`BUSY_BUDGET_MIN`], have passed; then it
/// is `BackendUnavailable`.
const BUSY_ROUNDS: u32 = 4;
const BUSY_BUDGET_MIN: Duration = Duration::from_secs(20);

fn busy_budget(busy_timeout: Duration) -> Duration {
    busy_timeout.saturating_mul(BUSY_ROUNDS).max(BUSY_BUDGET_MIN)
}

/// The options parsed from a URL.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SqlOptions {
    pub pool: u32,
    pub connect_timeout: Duration,
    pub statement_timeout: Option<Duration>,
    pub schema: Option<String>,
    pub synchronous_full: bool,
    pub busy_timeout: Duration,
    /// How often the facade runs a background retention round (zero: never).
    pub retention_interval: Duration,
    pub claims: ClaimsMode,
}

fn parse_options(scheme: &'static str, query: &str, allow_schema: bool) -> Result<(SqlOptions, Vec<(String, String)>)> {
    let mut o = SqlOptions {
        // SQLite: one connection by default. SQLite has one writer at a
        // time anyway; a single connection queues this process's calls
        // fairly (FIFO) instead of letting its writers race for the lock,
        // which starves some past busy_timeout ("database is locked").
        pool: if allow_schema { 10 } else { 1 },
        connect_timeout: Duration::from_secs(5),
        statement_timeout: None,
        schema: None,
        synchronous_full: true,
        busy_timeout: Duration::from_secs(5),
        retention_interval: Duration::from_secs(10),
        claims: ClaimsMode::Ranges,
    };
    let known: &[&str] = if allow_schema {
        &[
            "rheo_pool",
            "rheo_connect_timeout_ms",
            "rheo_retention_interval_ms",
            "rheo_claims",
            "rheo_statement_timeout_ms",
            "rheo_schema",
        ]
    } else {
        &[
            "rheo_pool",
            "rheo_connect_timeout_ms",
            "rheo_retention_interval_ms",
            "rheo_claims",
            "synchronous",
            "busy_timeout_ms",
        ]
    };
    let rest = read_options(scheme, query, |opt| {
        match opt.key {
            "rheo_pool" => o.pool = u32::try_from(opt.number(1, 256)?).unwrap_or(256),
            "rheo_connect_timeout_ms" => o.connect_timeout = opt.millis(1, 86_400_000)?,
            "rheo_retention_interval_ms" => o.retention_interval = opt.millis(0, 86_400_000)?,
            "rheo_claims" => o.claims = opt.choice(&[("ranges", ClaimsMode::Ranges), ("rows", ClaimsMode::Rows)])?,
            "rheo_statement_timeout_ms" if allow_schema => o.statement_timeout = Some(opt.millis(1, 86_400_000)?),
            "rheo_schema" if allow_schema => {
                let v = opt.value;
                if v.is_empty() || v.len() > 63 || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                    return Err(opt.refuse("a schema name is 1 to 63 letters, digits or underscores"));
                }
                o.schema = Some(v.to_owned());
            }
            "synchronous" if !allow_schema => o.synchronous_full = opt.choice(&[("full", true), ("normal", false)])?,
            "busy_timeout_ms" if !allow_schema => o.busy_timeout = opt.millis(1, 86_400_000)?,
            // SQLite has no driver options to pass on.
            k if k.starts_with("rheo_") || !allow_schema => return Err(opt.unknown(known)),
            _ => return Ok(Taken::Driver),
        }
        Ok(Taken::Yes)
    })?;
    let rest = rest
        .into_iter()
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    Ok((o, rest))
}

impl SqlBackend {
    /// Opens `sqlite:PATH[?options]` (the file is created when missing;
    /// `sqlite::memory:` is a private in-memory database).
    #[cfg(feature = "sqlite")]
    pub(crate) async fn open_sqlite(url: &str, clock: Arc<dyn Clock>) -> Result<SqlBackend> {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
        let rest = url.strip_prefix("sqlite:").unwrap_or(url);
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (o, _) = parse_options("sqlite", query, false)?;
        if path.is_empty() {
            return Err(Error::invalid("url", format!("{url:?}: expected sqlite:PATH or sqlite::memory:")));
        }
        let memory = path == ":memory:";
        let mut opts = SqliteConnectOptions::new()
            // sqlx runs SQLite on a thread of its own and hands rows over a
            // channel: room for a whole fetch's rows lets the thread finish
            // a statement without waiting for the caller to take each one.
            .row_buffer_size(1024)
            .busy_timeout(o.busy_timeout)
            .synchronous(if o.synchronous_full { SqliteSynchronous::Full } else { SqliteSynchronous::Normal })
            .foreign_keys(false)
            // Statement journals (a multi-row write inside a transaction)
            // in memory, not a file created and deleted per transaction.
            .pragma("temp_store", "memory");
        let pool_size = if memory {
            opts = opts.in_memory(true).shared_cache(false);
            1
        } else {
            let p = std::path::Path::new(path);
            if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty())
                && !parent.is_dir()
            {
                return Err(Error::invalid(
                    "url",
                    format!("sqlite: directory {} of {path:?} does not exist", parent.display()),
                ));
            }
            opts = opts.filename(p).create_if_missing(true).journal_mode(SqliteJournalMode::Wal);
            o.pool
        };
        let pool = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .max_connections(pool_size)
            .min_connections(if memory { 1 } else { 0 })
            .idle_timeout(if memory { None } else { Some(Duration::from_secs(600)) })
            .max_lifetime(if memory { None } else { Some(Duration::from_secs(3600)) })
            // A call may wait for the one connection while its holder waits
            // for another process's write lock: up to the busy budget more.
            .acquire_timeout(o.connect_timeout.saturating_add(busy_budget(o.busy_timeout)))
            .connect_with(opts)
            .await
            .map_err(|e| open_error("sqlite", path, e))?;
        let lite = Pool::Lite(pool, busy_budget(o.busy_timeout));
        let mut backend = Self::new(
            Dialect::Sqlite,
            lite.clone(),
            lite,
            Names::new(None),
            clock,
            false,
            !memory,
            Some(busy_budget(o.busy_timeout)),
        );
        backend.retention_interval = o.retention_interval;
        backend.claims_mode = o.claims;
        Ok(backend)
    }

    /// Opens `postgres://…` (or `postgresql://…`).
    #[cfg(feature = "postgres")]
    pub(crate) async fn open_postgres(url: &str, clock: Arc<dyn Clock>, custom_clock: bool) -> Result<SqlBackend> {
        use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
        use std::str::FromStr;
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (o, rest) = parse_options("postgres", query, true)?;
        let mut driver_url = base.to_owned();
        if !rest.is_empty() {
            driver_url.push('?');
            let pairs: Vec<String> = rest.iter().map(|(k, v)| format!("{k}={v}")).collect();
            driver_url.push_str(&pairs.join("&"));
        }
        let mut opts = PgConnectOptions::from_str(&driver_url)
            .map_err(|e| Error::invalid("url", format!("{}: {e}", redact_url(url))))?
            .application_name("rheo")
            // Every statement here is short and touches a few hundred rows,
            // but the planner's default 100-row guess for a JSON array can
            // push an estimate past `jit_above_cost`, and compiling then
            // costs 20 ms where running costs 1. And a claim must walk the
            // frontier index in order and stop after a few hundred rows:
            // guessing the claimable rows rare (most are acked), the
            // planner would rather bitmap-scan every row above the frontier
            // and sort them, which grows with the table (ADR 0013).
            .options([("jit", "off"), ("enable_bitmapscan", "off")]);
        if let Some(t) = o.statement_timeout {
            opts = opts.options([("statement_timeout", format!("{}ms", t.as_millis()))]);
        }
        let listen_pool =
            PgPoolOptions::new().max_connections(1).acquire_timeout(o.connect_timeout).connect_lazy_with(opts.clone());
        // No ping before each use: a dead connection fails its statement,
        // which is mapped like any other connection loss.
        let pool_options = || {
            PgPoolOptions::new()
                .test_before_acquire(false)
                .max_connections(o.pool)
                .min_connections(0)
                .acquire_timeout(o.connect_timeout)
                .idle_timeout(Some(Duration::from_secs(600)))
                .max_lifetime(Some(Duration::from_secs(1800)))
        };
        // Claims, acks and append flushes: statements of a dozen CTEs that
        // take 1-3 ms to plan and about as long to run. Their generic plans (cached per
        // connection) are as good as custom ones once no sequential scan is
        // considered: every one of their scans walks an index and stops
        // early. Other calls keep custom plans (a user's query is planned
        // for its values). ADR 0021.
        let hot_pool = pool_options().connect_lazy_with(
            opts.clone().options([("plan_cache_mode", "force_generic_plan"), ("enable_seqscan", "off")]),
        );
        let pool = pool_options().connect_with(opts).await.map_err(|e| open_error("postgres", &redact_url(url), e))?;
        let mut backend = Self::new(
            Dialect::Postgres,
            Pool::Pg(pool),
            Pool::Pg(hot_pool),
            Names::new(o.schema),
            clock,
            !custom_clock,
            true,
            None,
        );
        backend.listen_pool = Some(listen_pool);
        backend.retention_interval = o.retention_interval;
        backend.claims_mode = o.claims;
        Ok(backend)
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        d: Dialect,
        pool: Pool,
        hot: Pool,
        names: Names,
        clock: Arc<dyn Clock>,
        db_clock: bool,
        durable: bool,
        busy_budget: Option<Duration>,
    ) -> Self {
        let wakeups = Arc::new(WakeupMap::default());
        let origin = uuid::Uuid::new_v4().simple().to_string();
        let appender =
            Arc::new(append::Appender::new(d, hot.clone(), names.clone(), wakeups.clone(), &origin, busy_budget));
        let appends = appender.combiner();
        let frontier = Arc::new(frontier::Frontiers::new(d, pool.clone(), names.clone(), busy_budget));
        SqlBackend {
            hot,
            frontier,
            claims_mode: ClaimsMode::Ranges,
            group_scopes: RwLock::new(HashMap::new()),
            busy_budget,
            appender,
            appends,
            d,
            #[cfg(feature = "postgres")]
            listener: listen::Listener::new(
                wakeups.clone(),
                listen::Filter { origin: origin.clone(), schema: names.schema().map(str::to_owned) },
            ),
            #[cfg(feature = "postgres")]
            listen_pool: None,
            pool,
            names,
            clock,
            db_clock,
            durable,
            partition_counts: RwLock::new(HashMap::new()),
            wakeups,
            index_builds: Arc::default(),
            retention_interval: Duration::from_secs(10),
        }
    }

    fn be(&self) -> &'static str {
        self.d.name()
    }

    fn busy_budget(&self) -> Option<Duration> {
        self.busy_budget
    }

    fn now(&self) -> Now {
        if self.db_clock { Now::Db } else { Now::At(self.clock.now()) }
    }

    /// The SQL of `now` in a statement.
    fn now_sql(&self, s: &mut Stmt, now: Now) -> String {
        match now {
            Now::Db => "now()".to_owned(),
            Now::At(t) => s.ts(t),
        }
    }

    /// The SQL of `now + d` in a statement.
    fn later_sql(&self, s: &mut Stmt, now: Now, d: Duration) -> String {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        match now {
            Now::Db => {
                let ph = s.int(ms);
                self.d.ts_plus("now()", &ph)
            }
            Now::At(t) => s.ts(t.saturating_add(d)),
        }
    }

    fn stmt(&self) -> Stmt {
        Stmt::new(self.d)
    }

    fn err(&self, operation: &'static str, phase: Phase) -> impl Fn(sqlx::Error) -> Error + '_ {
        move |e| map_err(self.be(), operation, phase, e)
    }
}

/// Runs a transaction body (an expression evaluated afresh each time),
/// again after a short pause when the database reports a serialization
/// failure or a deadlock (at most 4 times); maps what it fails with.
macro_rules! retry_tx {
    ($self:ident, $op:expr, $body:expr) => {{
        let mut attempt = 0u32;
        let started = std::time::Instant::now();
        loop {
            match $body {
                Ok(v) => break Ok(v),
                Err($crate::backends::sql::TxError::Rheo(e)) => break Err(e),
                Err($crate::backends::sql::TxError::Raced(e)) => {
                    if attempt < 4 {
                        attempt += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(1u64 << attempt)).await;
                        continue;
                    }
                    // Nothing was committed: safe to retry later.
                    break Err($crate::error::Error::BackendUnavailable {
                        backend: $self.be(),
                        operation: $op,
                        cause: std::sync::Arc::new(e),
                    });
                }
                Err($crate::backends::sql::TxError::Sql(e, phase)) => {
                    // SQLite's write lock held by another process past
                    // busy_timeout, or this handle's one connection busy
                    // meanwhile: nothing was done (a COMMIT that meets BUSY
                    // did not commit), so the whole transaction runs again,
                    // within the busy budget.
                    if $crate::backends::sql::db::is_busy(&e)
                        && $self.busy_budget().is_some_and(|b| started.elapsed() < b)
                    {
                        attempt = attempt.saturating_add(1);
                        let jitter = u64::from(started.elapsed().subsec_nanos() % 7);
                        tokio::time::sleep(std::time::Duration::from_millis(1 + jitter + u64::from(attempt.min(10))))
                            .await;
                        continue;
                    }
                    if $crate::backends::sql::db::is_conflict(&e) && attempt < 4 {
                        attempt += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(2u64 << attempt)).await;
                        continue;
                    }
                    break Err($crate::backends::sql::db::map_err($self.be(), $op, phase, e));
                }
            }
        }
    }};
}
pub(crate) use retry_tx;

/// What a step of a transaction answers.
pub(crate) type TxResult<T> = std::result::Result<T, TxError>;

/// What a transaction body fails with: a rule of the crate, or a driver
/// error and where it happened (so a conflict can be retried).
pub(crate) enum TxError {
    Rheo(Error),
    Sql(sqlx::Error, Phase),
    /// Another transaction changed what this one read (an id appended
    /// concurrently): run it again; this error after the last attempt.
    Raced(Error),
}

impl From<Error> for TxError {
    fn from(e: Error) -> Self {
        TxError::Rheo(e)
    }
}

/// `?` on a driver error inside a transaction body (nothing committed yet).
pub(crate) fn safe(e: sqlx::Error) -> TxError {
    TxError::Sql(e, Phase::Safe)
}

/// `?` on a driver error of a commit.
pub(crate) fn at_commit(e: sqlx::Error) -> TxError {
    TxError::Sql(e, Phase::Commit)
}

fn open_error(backend: &'static str, what: &str, e: sqlx::Error) -> Error {
    let detail = match &e {
        sqlx::Error::Database(db) => {
            format!("{} (code {})", db.message(), db.code().as_deref().unwrap_or("?"))
        }
        other => other.to_string(),
    };
    let mapped = map_err(backend, "open", Phase::Safe, e);
    match mapped {
        Error::BackendUnavailable { .. } => {
            Error::unavailable(backend, "open", format!("cannot reach {what}: {detail}"))
        }
        _ => Error::failed("open", format!("{backend}: cannot open {what}: {detail}")),
    }
}

impl Drop for SqlBackend {
    fn drop(&mut self) {
        self.appender.stop();
        #[cfg(feature = "postgres")]
        self.listener.stop();
    }
}

// The methods of its own; the rest forward to `group_store` and the
// `*_impl` methods (`group_store::database_backend!`).
super::group_store::database_backend! {
    impl Backend for SqlBackend {
        fn name(&self) -> &'static str {
            self.be()
        }

        fn combines_calls(&self) -> bool {
            true
        }

        fn capabilities(&self) -> Capabilities {
            let mut c = Capabilities::new(self.be());
            c.durable = self.durable;
            c.distributed = self.d == Dialect::Postgres;
            c.wakeups = true;
            c.ops_inspect = true;
            c.retention = true;
            c.scheduled_delivery = true;
            c
        }

        async fn ping(&self) -> Result<()> {
            let mut s = self.stmt();
            s.push("SELECT 1");
            self.pool.all(&s).await.map_err(self.err("ping", Phase::Safe))?;
            Ok(())
        }

        async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
            self.append_impl(stream, events).await
        }

        async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
            self.list_streams_impl(None).await
        }

        async fn subscribe(&self, stream: &str) -> Result<Subscription> {
            self.partition_count(stream).await?;
            #[cfg(feature = "postgres")]
            if let Some(pool) = &self.listen_pool {
                self.listener.ensure_started(pool);
            }
            Ok(self.wakeups.get(stream).subscribe())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse_what_they_do_not_know() {
        let (o, rest) = parse_options("postgres", "sslmode=disable&rheo_schema=ev&rheo_pool=3", true).expect("ok");
        assert_eq!((o.schema.as_deref(), o.pool), (Some("ev"), 3));
        assert_eq!(rest, vec![("sslmode".to_owned(), "disable".to_owned())]);
        for bad in ["rheo_pool=0", "rheo_schema=a-b", "rheo_colour=red", "rheo_connect_timeout_ms=x"] {
            let e = parse_options("postgres", bad, true).expect_err(bad);
            assert!(e.to_string().contains(bad.split('=').next().unwrap_or("")), "{e}");
        }
        assert!(parse_options("sqlite", "sslmode=disable", false).is_err(), "sqlite passes nothing through");
        assert!(parse_options("sqlite", "rheo_schema=x", false).is_err(), "no schemas on sqlite");
        let (o, _) = parse_options("sqlite", "synchronous=normal&busy_timeout_ms=20", false).expect("ok");
        assert!(!o.synchronous_full && o.busy_timeout == Duration::from_millis(20));
    }

    #[test]
    fn urls_in_messages_hide_the_password() {
        assert_eq!(redact_url("postgres://u:secret@h:5/db"), "postgres://u:***@h:5/db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
    }
}
