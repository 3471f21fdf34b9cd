//! The one place that touches sqlx: a pool of either driver, statements
//! with owned arguments, rows read by index, and driver errors mapped to
//! [`Error`] at this boundary (no sqlx type leaves this module).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::time::Timestamp;

pub(crate) use super::dialect::Arg;
use super::dialect::Dialect;

#[cfg(feature = "postgres")]
use sqlx::postgres::{PgPool, PgRow, Postgres};
#[cfg(feature = "sqlite")]
use sqlx::sqlite::{Sqlite, SqlitePool, SqliteRow};
use sqlx::{AssertSqlSafe, Row as _};

/// A statement and its arguments; `arg` numbers the placeholders.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    pub(crate) sql: String,
    pub(crate) args: Vec<Arg>,
    dialect: Dialect,
}

impl Stmt {
    pub(crate) fn new(dialect: Dialect) -> Self {
        Stmt { sql: String::new(), args: Vec::new(), dialect }
    }

    /// Adds an argument; returns its placeholder (`$3` or `?3`).
    pub(crate) fn arg(&mut self, a: Arg) -> String {
        self.args.push(a);
        self.dialect.placeholder(self.args.len())
    }

    pub(crate) fn text(&mut self, s: impl Into<String>) -> String {
        self.arg(Arg::Text(s.into()))
    }

    pub(crate) fn int(&mut self, n: i64) -> String {
        self.arg(Arg::I64(n))
    }

    /// A timestamp argument, as the dialect writes it (an expression).
    pub(crate) fn ts(&mut self, t: Timestamp) -> String {
        let d = self.dialect;
        let ph = self.arg(d.ts_arg(t));
        d.ts_in(&ph)
    }

    pub(crate) fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }
}

/// A row of a result, read by column index.
pub(crate) enum Row {
    #[cfg(feature = "postgres")]
    Pg(PgRow),
    #[cfg(feature = "sqlite")]
    Lite(SqliteRow),
}

fn decode(e: sqlx::Error) -> Error {
    Error::failed("reading a row", e.to_string())
}

impl Row {
    pub(crate) fn opt_i64(&self, i: usize) -> Result<Option<i64>> {
        match self {
            #[cfg(feature = "postgres")]
            Row::Pg(r) => match r.try_get::<Option<i64>, _>(i) {
                Ok(v) => Ok(v),
                Err(_) => r.try_get::<Option<i32>, _>(i).map(|v| v.map(i64::from)).map_err(decode),
            },
            #[cfg(feature = "sqlite")]
            Row::Lite(r) => r.try_get::<Option<i64>, _>(i).map_err(decode),
        }
    }

    pub(crate) fn i64(&self, i: usize) -> Result<i64> {
        self.opt_i64(i)?.ok_or_else(|| Error::failed("reading a row", format!("column {i} is NULL")))
    }

    pub(crate) fn u64(&self, i: usize) -> Result<u64> {
        let v = self.i64(i)?;
        u64::try_from(v).map_err(|_| Error::failed("reading a row", format!("column {i} holds {v}, below zero")))
    }

    pub(crate) fn u32(&self, i: usize) -> Result<u32> {
        let v = self.i64(i)?;
        u32::try_from(v).map_err(|_| Error::failed("reading a row", format!("column {i} holds {v}, not a u32")))
    }

    pub(crate) fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self {
            #[cfg(feature = "postgres")]
            Row::Pg(r) => r.try_get::<Option<String>, _>(i).map_err(decode),
            #[cfg(feature = "sqlite")]
            Row::Lite(r) => r.try_get::<Option<String>, _>(i).map_err(decode),
        }
    }

    pub(crate) fn text(&self, i: usize) -> Result<String> {
        self.opt_text(i)?.ok_or_else(|| Error::failed("reading a row", format!("column {i} is NULL")))
    }

    /// A timestamp column read through `Dialect::ts_out`.
    pub(crate) fn opt_ts(&self, i: usize) -> Result<Option<Timestamp>> {
        match self {
            #[cfg(feature = "postgres")]
            Row::Pg(_) => Ok(self.opt_i64(i)?.map(Timestamp::from_millis)),
            #[cfg(feature = "sqlite")]
            Row::Lite(_) => match self.opt_text(i)? {
                None => Ok(None),
                Some(t) => super::dialect::parse_ts(&t)
                    .map(Some)
                    .ok_or_else(|| Error::failed("reading a row", format!("{t:?} is not a timestamp"))),
            },
        }
    }

    pub(crate) fn ts(&self, i: usize) -> Result<Timestamp> {
        self.opt_ts(i)?.ok_or_else(|| Error::failed("reading a row", format!("column {i} is NULL")))
    }
}

/// Where an error happened, which decides what the caller is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// A read, or a statement inside a transaction not yet committed: a
    /// lost connection rolls it back, so nothing happened.
    Safe,
    /// A write in autocommit, or a COMMIT: a lost connection leaves the
    /// outcome unknown.
    Commit,
}

/// Maps a driver error. `backend` names it, `operation` the call.
pub(crate) fn map_err(backend: &'static str, operation: &'static str, phase: Phase, e: sqlx::Error) -> Error {
    use sqlx::Error as E;
    match e {
        E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed | E::BeginFailed => {
            Error::unavailable(backend, operation, e.to_string())
        }
        E::Io(_) | E::Tls(_) | E::Protocol(_) => match phase {
            Phase::Safe => Error::unavailable(backend, operation, e.to_string()),
            Phase::Commit => Error::ambiguous(operation, format!("{backend}: {e}")),
        },
        E::Database(ref db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let msg = db.message().to_owned();
            match db_class(&code) {
                // SQLite's lock was busy: the statement (or COMMIT) did
                // nothing, whatever the phase.
                DbClass::Unavailable if matches!(code.as_str(), "5" | "6" | "261" | "262" | "517") => {
                    Error::unavailable(
                        backend,
                        operation,
                        format!("{msg} (code {code}: another writer holds the lock)"),
                    )
                }
                DbClass::Unavailable => match phase {
                    Phase::Safe => Error::unavailable(backend, operation, format!("{msg} (code {code})")),
                    Phase::Commit => Error::ambiguous(operation, format!("{backend}: {msg} (code {code})")),
                },
                DbClass::Conflict => Error::failed(
                    operation,
                    format!("{backend}: {msg} (code {code}: a serialization failure or deadlock)"),
                ),
                DbClass::Other => Error::failed(operation, format!("{backend}: {msg} (code {code})")),
            }
        }
        other => Error::failed(operation, format!("{backend}: {other}")),
    }
}

enum DbClass {
    /// The server can't serve now (shutting down, cancelled, busy, a
    /// timeout): nothing was done, or the commit is in doubt.
    Unavailable,
    /// A serialization failure or deadlock that outlived its retries.
    Conflict,
    Other,
}

fn db_class(code: &str) -> DbClass {
    match code {
        // PostgreSQL: connection exceptions, operator intervention
        // (shutdown, cancel, statement timeout), insufficient resources,
        // lock timeouts. SQLite: BUSY (5), LOCKED (6) and their extended codes.
        c if c.starts_with("08") || c.starts_with("57") || c.starts_with("53") => DbClass::Unavailable,
        "55P03" | "5" | "6" | "261" | "517" | "262" => DbClass::Unavailable,
        "40001" | "40P01" => DbClass::Conflict,
        _ => DbClass::Other,
    }
}

/// True for an error worth retrying the whole transaction for
/// (serialization failure, deadlock).
pub(crate) fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

/// True when SQLite's lock was busy (BUSY or LOCKED and their extended
/// codes) or no connection of the pool came free in time: the statement
/// did nothing. (Only SQLite's handles act on it: see `retry_tx`.)
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("5" | "6" | "261" | "262" | "517")),
        _ => false,
    }
}

/// Runs `op` again while it fails with SQLite's lock busy (it did nothing
/// then), for at most `budget`; the last error after that.
#[cfg(feature = "sqlite")]
async fn busy_retry<T, F, Fut>(budget: std::time::Duration, mut op: F) -> std::result::Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
{
    let started = std::time::Instant::now();
    let mut attempt = 0u64;
    loop {
        match op().await {
            Err(e) if is_busy(&e) && started.elapsed() < budget => {
                attempt += 1;
                let jitter = u64::from(started.elapsed().subsec_nanos() % 7);
                tokio::time::sleep(std::time::Duration::from_millis(1 + jitter + attempt.min(10))).await;
            }
            r => return r,
        }
    }
}

/// True for a unique-key violation.
pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

/// True when a database error names (in its constraint or message) one
/// of `parts`.
pub(crate) fn names_constraint(e: &sqlx::Error, parts: &[&str]) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            let c = db.constraint().unwrap_or_default();
            let m = db.message();
            parts.iter().any(|p| c.contains(p) || m.contains(p))
        }
        _ => false,
    }
}

/// A pool of either driver.
#[derive(Debug, Clone)]
pub(crate) enum Pool {
    #[cfg(feature = "postgres")]
    Pg(PgPool),
    /// With how long a statement that meets another process's write lock
    /// is tried again (see `retry_tx`, which does the same for transactions).
    #[cfg(feature = "sqlite")]
    Lite(SqlitePool, std::time::Duration),
}

/// An open transaction of either driver; dropping it rolls back.
pub(crate) enum Tx {
    #[cfg(feature = "postgres")]
    Pg(sqlx::Transaction<'static, Postgres>),
    #[cfg(feature = "sqlite")]
    Lite(sqlx::Transaction<'static, Sqlite>),
}

macro_rules! bind_all {
    ($q:expr, $args:expr) => {{
        let mut q = $q;
        for a in $args {
            q = match a {
                Arg::I64(v) => q.bind(*v),
                Arg::F64(v) => q.bind(*v),
                Arg::Text(v) => q.bind(v.clone()),
            };
        }
        q
    }};
}

impl Pool {
    fn trip(&self) {
        crate::observe::round_trip(match self {
            #[cfg(feature = "postgres")]
            Pool::Pg(_) => "postgres",
            #[cfg(feature = "sqlite")]
            Pool::Lite(..) => "sqlite",
        });
    }

    pub(crate) async fn all(&self, s: &Stmt) -> std::result::Result<Vec<Row>, sqlx::Error> {
        self.trip();
        match self {
            #[cfg(feature = "postgres")]
            Pool::Pg(p) => {
                let q = bind_all!(sqlx::query::<Postgres>(AssertSqlSafe(s.sql.clone())), &s.args);
                Ok(q.fetch_all(p).await?.into_iter().map(Row::Pg).collect())
            }
            #[cfg(feature = "sqlite")]
            Pool::Lite(p, budget) => {
                let rows = busy_retry(*budget, || {
                    bind_all!(sqlx::query::<Sqlite>(AssertSqlSafe(s.sql.clone())), &s.args).fetch_all(p)
                })
                .await?;
                Ok(rows.into_iter().map(Row::Lite).collect())
            }
        }
    }

    pub(crate) async fn exec(&self, s: &Stmt) -> std::result::Result<u64, sqlx::Error> {
        self.trip();
        match self {
            #[cfg(feature = "postgres")]
            Pool::Pg(p) => {
                let q = bind_all!(sqlx::query::<Postgres>(AssertSqlSafe(s.sql.clone())), &s.args);
                Ok(q.execute(p).await?.rows_affected())
            }
            #[cfg(feature = "sqlite")]
            Pool::Lite(p, budget) => {
                let done = busy_retry(*budget, || {
                    bind_all!(sqlx::query::<Sqlite>(AssertSqlSafe(s.sql.clone())), &s.args).execute(p)
                })
                .await?;
                Ok(done.rows_affected())
            }
        }
    }

    /// Begins a write transaction (`BEGIN IMMEDIATE` on SQLite, so that a
    /// read-modify-write never meets `database is locked` halfway).
    pub(crate) async fn begin(&self) -> std::result::Result<Tx, sqlx::Error> {
        self.trip();
        match self {
            #[cfg(feature = "postgres")]
            Pool::Pg(p) => Ok(Tx::Pg(p.begin().await?)),
            #[cfg(feature = "sqlite")]
            Pool::Lite(p, budget) => Ok(Tx::Lite(busy_retry(*budget, || p.begin_with("BEGIN IMMEDIATE")).await?)),
        }
    }
}

impl Pool {
    /// SQLite: runs `script` (statements separated by `;`, the first of
    /// them `BEGIN IMMEDIATE`, values written as literals: see
    /// [`lite_literal`]) and then `COMMIT`, in one hand-off to sqlx's
    /// SQLite thread, and returns the rows the statements returned.
    /// `rows` is how many rows the script returns before its COMMIT: an
    /// error after them was the COMMIT's. A failure before the commit rolls
    /// back (Phase::Safe); a `COMMIT` that fails with the lock busy rolls
    /// back too (SQLite did not commit); another `COMMIT` failure leaves the
    /// outcome unknown (Phase::Commit).
    #[cfg(feature = "sqlite")]
    pub(crate) async fn lite_script(
        &self,
        script: String,
        rows: usize,
    ) -> std::result::Result<Vec<Row>, (sqlx::Error, Phase)> {
        use futures::TryStreamExt as _;
        let Pool::Lite(p, budget) = self else {
            return Err((sqlx::Error::Configuration("lite_script on a PostgreSQL pool".into()), Phase::Safe));
        };
        self.trip();
        let mut conn = busy_retry(*budget, || p.acquire()).await.map_err(|e| (e, Phase::Safe))?;
        let mut out = Vec::with_capacity(rows);
        let failed = {
            let mut stream = sqlx::raw_sql(AssertSqlSafe(format!("{script}; COMMIT"))).fetch(&mut *conn);
            loop {
                match stream.try_next().await {
                    Ok(Some(r)) => out.push(Row::Lite(r)),
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            }
        };
        let Some(e) = failed else { return Ok(out) };
        // It stopped at the failing statement: undo what ran (a failed
        // BEGIN left nothing to undo, and says so; so does a COMMIT that
        // went through).
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
        let phase = if out.len() >= rows && !is_busy(&e) { Phase::Commit } else { Phase::Safe };
        Err((e, phase))
    }
}

/// A text value as an SQLite string literal (for [`Pool::lite_script`]).
#[cfg(feature = "sqlite")]
pub(crate) fn lite_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl Tx {
    fn trip(&self) {
        crate::observe::round_trip(match self {
            #[cfg(feature = "postgres")]
            Tx::Pg(_) => "postgres",
            #[cfg(feature = "sqlite")]
            Tx::Lite(_) => "sqlite",
        });
    }

    pub(crate) async fn all(&mut self, s: &Stmt) -> std::result::Result<Vec<Row>, sqlx::Error> {
        self.trip();
        match self {
            #[cfg(feature = "postgres")]
            Tx::Pg(t) => {
                let q = bind_all!(sqlx::query::<Postgres>(AssertSqlSafe(s.sql.clone())), &s.args);
                Ok(q.fetch_all(&mut **t).await?.into_iter().map(Row::Pg).collect())
            }
            #[cfg(feature = "sqlite")]
            Tx::Lite(t) => {
                let q = bind_all!(sqlx::query::<Sqlite>(AssertSqlSafe(s.sql.clone())), &s.args);
                Ok(q.fetch_all(&mut **t).await?.into_iter().map(Row::Lite).collect())
            }
        }
    }

    pub(crate) async fn exec(&mut self, s: &Stmt) -> std::result::Result<u64, sqlx::Error> {
        self.trip();
        match self {
            #[cfg(feature = "postgres")]
            Tx::Pg(t) => {
                let q = bind_all!(sqlx::query::<Postgres>(AssertSqlSafe(s.sql.clone())), &s.args);
                Ok(q.execute(&mut **t).await?.rows_affected())
            }
            #[cfg(feature = "sqlite")]
            Tx::Lite(t) => {
                let q = bind_all!(sqlx::query::<Sqlite>(AssertSqlSafe(s.sql.clone())), &s.args);
                Ok(q.execute(&mut **t).await?.rows_affected())
            }
        }
    }

    pub(crate) async fn commit(self) -> std::result::Result<(), sqlx::Error> {
        self.trip();
        match self {
            #[cfg(feature = "postgres")]
            Tx::Pg(t) => t.commit().await,
            #[cfg(feature = "sqlite")]
            Tx::Lite(t) => t.commit().await,
        }
    }
}

/// Reads a `{"0": n}` map (the reference writes integers; strings of
/// digits are read too).
pub(super) fn parse_map(stream: &str, group: &str, what: &str, text: &str) -> Result<BTreeMap<u32, u64>> {
    let bad = |why: String| Error::failed("reading a group", format!("group {stream:?}/{group:?}: {what}: {why}"));
    let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let Value::Object(m) = v else { return Err(bad(format!("{text} is not an object"))) };
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let p: u32 = k.parse().map_err(|_| bad(format!("key {k:?} is not a partition")))?;
        let n = match &v {
            // A float (a start past i64::MAX read back by SQLite) saturates.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Value::Number(n) => n.as_u64().or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)),
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
        .ok_or_else(|| bad(format!("{v} is not a sequence")))?;
        out.insert(p, n);
    }
    Ok(out)
}

/// A group row as a tuple of stream and group arguments.
pub(super) fn sg(s: &mut Stmt, stream: &str, group: &str) -> (String, String) {
    (s.text(stream), s.text(group))
}

/// A `{"0": n}` map as the reference writes it.
pub(super) fn map_text(m: &BTreeMap<u32, u64>) -> String {
    // Sequences are BIGINT in SQL: a start past i64::MAX is as good as i64::MAX.
    let obj: serde_json::Map<String, Value> =
        m.iter().map(|(p, n)| (p.to_string(), Value::from((*n).min(i64::MAX as u64)))).collect();
    Value::Object(obj).to_string()
}
