//! The MongoDB backend: `mongodb://…` (feature `mongo`), the official
//! driver over rustls (ADR 0014).
//!
//! It shares the reference implementation's collections in the URL's
//! database (`streams`, `events`, `groups`, `deliveries`, with the
//! reference's field and index names), so an Elixir Rheo can work on the
//! same database. What only this crate keeps lives in `rheo_rs_*`
//! collections the reference never reads.
//!
//! **In progress.** This version has the schema, streams, appends (one
//! multi-document transaction each, so a failure leaves no gap in the
//! sequences) and reads. Consumer groups, queries and wakeups are not built
//! yet: those calls return [`crate::Error::Unsupported`]
//! and the capabilities say so.
//!
//! URL options (query parameters; the driver's own, such as
//! `directConnection` or `replicaSet`, pass through):
//!
//! | option | meaning | default |
//! |---|---|---|
//! | the URL's path | the database | `rheo` |
//! | `rheo_connect_timeout_ms=N` | how long a call waits to reach a server before `BackendUnavailable` | 5000 |
//! | `rheo_pool=N` | the most connections (1 to 256) | 10 |
//!
//! Transactions need a replica set or a sharded cluster (a one-node
//! replica set will do); a standalone server is refused when the backend
//! opens, with an error that says so.
//!
//! ```no_run
//! # async fn demo() -> rheo::Result<()> {
//! let rheo = rheo::Rheo::open("mongodb://db.internal:27017/app?replicaSet=rs0").await?;
//! # Ok(()) }
//! ```

mod streams;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mongodb::bson::Document;
use mongodb::error::{ErrorKind, UNKNOWN_TRANSACTION_COMMIT_RESULT, WriteFailure};
use parking_lot::RwLock;

use super::redact;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::model::capabilities::Capabilities;
use crate::model::event::{Event, NewEvent, Position};
use crate::model::group::{FetchOptions, GroupOptions, GroupSummary, Lag, Replay, Reset, StreamInfo, StreamOptions};
use crate::model::lease::{FetchReport, LeaseRef, RetryOutcome};
use crate::model::query::{Page, Query};
use crate::model::time::{Clock, Timestamp};

const NAME: &str = "mongo";

/// The version of what this crate keeps in `rheo_rs_meta`.
const SCHEMA_VERSION: u16 = 1;

/// The reference's collections.
pub(crate) const STREAMS: &str = "streams";
pub(crate) const EVENTS: &str = "events";
pub(crate) const GROUPS: &str = "groups";
pub(crate) const DELIVERIES: &str = "deliveries";
/// This crate's own collection (schema version).
pub(crate) const META: &str = "rheo_rs_meta";

/// Options of a `mongodb://` URL that are this crate's, not the driver's.
#[derive(Debug, Clone, PartialEq)]
struct UrlOptions {
    connect_timeout: Duration,
    pool: u32,
}

impl Default for UrlOptions {
    fn default() -> Self {
        UrlOptions { connect_timeout: Duration::from_secs(5), pool: 10 }
    }
}

/// Splits the `rheo_*` options off a URL: (options, the URL the driver
/// gets).
fn parse_url(url: &str) -> Result<(UrlOptions, String)> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut o = UrlOptions::default();
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let number = |max: u64| -> Result<u64> {
            match v.parse::<u64>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(Error::invalid("url", format!("{k}={v:?}: expected a whole number from 1 to {max}"))),
            }
        };
        match k {
            "rheo_connect_timeout_ms" => o.connect_timeout = Duration::from_millis(number(3_600_000)?),
            "rheo_pool" => o.pool = u32::try_from(number(256)?).unwrap_or(256),
            k if k.starts_with("rheo_") => {
                return Err(Error::invalid(
                    "url",
                    format!("unknown mongo option {k:?}; expected rheo_connect_timeout_ms or rheo_pool"),
                ));
            }
            _ => rest.push(pair),
        }
    }
    let driver = if rest.is_empty() { base.to_owned() } else { format!("{base}?{}", rest.join("&")) };
    Ok((o, driver))
}

/// Where a driver error happened: before anything could change, or where
/// a lost reply leaves the outcome unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Safe,
    Commit,
}

/// Maps a driver error at the boundary: unreachable → `BackendUnavailable`,
/// an unknown commit result or a lost reply to a write → `Ambiguous`, a
/// duplicate key → the caller's (it knows what was duplicated), the rest
/// → `Failed`. Never a driver type in the public API.
pub(crate) fn map_err(operation: &'static str, phase: Phase, e: &mongodb::error::Error) -> Error {
    let text = describe(e);
    if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT) {
        return Error::ambiguous(operation, format!("{NAME}: {text}"));
    }
    match &*e.kind {
        ErrorKind::ServerSelection { .. } | ErrorKind::DnsResolve { .. } | ErrorKind::Authentication { .. } => {
            Error::unavailable(NAME, operation, text)
        }
        ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => match phase {
            Phase::Safe => Error::unavailable(NAME, operation, text),
            Phase::Commit => Error::ambiguous(operation, format!("{NAME}: {text}")),
        },
        ErrorKind::Write(WriteFailure::WriteConcernError(_)) => Error::ambiguous(operation, format!("{NAME}: {text}")),
        ErrorKind::Command(c) if UNAVAILABLE_CODES.contains(&c.code) => match phase {
            Phase::Safe => Error::unavailable(NAME, operation, text),
            Phase::Commit => Error::ambiguous(operation, format!("{NAME}: {text}")),
        },
        _ => Error::failed(operation, format!("{NAME}: {text}")),
    }
}

/// A driver error in a line: the server's code, name and message, without
/// the raw reply the driver's own text carries.
pub(crate) fn describe(e: &mongodb::error::Error) -> String {
    match &*e.kind {
        ErrorKind::Command(c) => format!("server error {} ({}): {}", c.code, c.code_name, c.message),
        ErrorKind::Write(WriteFailure::WriteError(w)) => format!("write error {}: {}", w.code, w.message),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
            format!("write concern error {} ({}): {}", w.code, w.code_name, w.message)
        }
        other => other.to_string(),
    }
}

/// Server codes that mean "not now": host unreachable or not found (6,
/// 7), network timeout (89), interrupted at shutdown (11600, 91), not
/// primary (10107, 13435, 13436, 189), exceeded time limit (50, 262).
const UNAVAILABLE_CODES: [i32; 11] = [6, 7, 89, 91, 11600, 10107, 13435, 13436, 189, 50, 262];

/// True when a driver error is a duplicate key (code 11000).
pub(crate) fn is_duplicate(e: &mongodb::error::Error) -> bool {
    match &*e.kind {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == 11000,
        ErrorKind::Command(c) => c.code == 11000,
        ErrorKind::InsertMany(m) => m.write_errors.as_ref().is_some_and(|w| w.iter().any(|w| w.code == 11000)),
        _ => false,
    }
}

/// True when the whole transaction may run again (the server says so).
pub(crate) fn is_transient(e: &mongodb::error::Error) -> bool {
    e.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR)
}

/// The MongoDB backend.
pub struct MongoBackend {
    client: mongodb::Client,
    db: mongodb::Database,
    clock: Arc<dyn Clock>,
    /// Partition counts of the streams this handle has seen (they never change).
    partition_counts: RwLock<HashMap<String, u32>>,
}

impl std::fmt::Debug for MongoBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoBackend").field("database", &self.db.name()).finish_non_exhaustive()
    }
}

impl MongoBackend {
    /// Opens `mongodb://…` (or `mongodb+srv://…`): parses the URL, reaches
    /// the server, refuses one without transactions, and creates the
    /// collections' indexes.
    pub(crate) async fn open(url: &str, clock: Arc<dyn Clock>) -> Result<MongoBackend> {
        let (o, driver_url) = parse_url(url)?;
        let mut opts = mongodb::options::ClientOptions::parse(&driver_url)
            .await
            .map_err(|e| Error::invalid("url", format!("{}: {e}", redact(url))))?;
        if opts.server_selection_timeout.is_none() {
            opts.server_selection_timeout = Some(o.connect_timeout);
        }
        if opts.connect_timeout.is_none() {
            opts.connect_timeout = Some(o.connect_timeout);
        }
        if opts.max_pool_size.is_none() {
            opts.max_pool_size = Some(o.pool);
        }
        if opts.app_name.is_none() {
            opts.app_name = Some("rheo".to_owned());
        }
        let database = opts.default_database.clone().unwrap_or_else(|| "rheo".to_owned());
        check_database_name(&database)?;
        let client =
            mongodb::Client::with_options(opts).map_err(|e| Error::invalid("url", format!("{}: {e}", redact(url))))?;
        let db = client.database(&database);
        let backend = MongoBackend { client, db, clock, partition_counts: RwLock::new(HashMap::new()) };
        backend.check_server(url).await?;
        Ok(backend)
    }

    /// Reaches the server and refuses one that can't run transactions.
    async fn check_server(&self, url: &str) -> Result<()> {
        let hello = self
            .db
            .run_command(mongodb::bson::doc! { "hello": 1 })
            .await
            .map_err(|e| Error::unavailable(NAME, "open", format!("cannot reach {}: {e}", redact(url))))?;
        let replica_set = hello.get_str("setName").is_ok();
        let router = hello.get_str("msg").is_ok_and(|m| m == "isdbgrid");
        if !replica_set && !router {
            return Err(Error::invalid(
                "url",
                format!(
                    "{}: the server is a standalone mongod, which has no multi-document transactions; \
                     rheo needs a replica set (one node will do: start mongod with --replSet and run \
                     rs.initiate()) or a sharded cluster",
                    redact(url)
                ),
            ));
        }
        Ok(())
    }

    fn collection(&self, name: &str) -> mongodb::Collection<Document> {
        self.db.collection::<Document>(name)
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn unsupported(operation: &'static str) -> Error {
        Error::Unsupported { backend: NAME, operation }
    }
}

/// MongoDB's rules for database names (the ones a URL path can break).
fn check_database_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 63 || name.chars().any(|c| "/\\. \"$".contains(c) || c == '\0') {
        return Err(Error::invalid(
            "url",
            format!("database name {name:?}: 1 to 63 characters, none of / \\ . space \" $"),
        ));
    }
    Ok(())
}

#[async_trait]
impl Backend for MongoBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::new(NAME);
        c.durable = true;
        c.distributed = true;
        c
    }

    async fn ping(&self) -> Result<()> {
        self.db.run_command(mongodb::bson::doc! { "ping": 1 }).await.map_err(|e| map_err("ping", Phase::Safe, &e))?;
        Ok(())
    }

    async fn ensure_schema(&self) -> Result<()> {
        self.ensure_schema_impl().await
    }

    async fn create_stream(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        self.create_stream_impl(stream, opts).await
    }

    async fn create_group(&self, _stream: &str, _group: &str, _opts: &GroupOptions) -> Result<GroupSummary> {
        Err(Self::unsupported("create_group"))
    }

    async fn append_batch(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
        self.append_impl(stream, events).await
    }

    async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.read_impl(stream, partition, after, limit).await
    }

    async fn query(&self, _query: &Query) -> Result<Page> {
        Err(Self::unsupported("query"))
    }

    async fn fetch(&self, _stream: &str, _group: &str, _opts: &FetchOptions) -> Result<FetchReport> {
        Err(Self::unsupported("fetch"))
    }

    async fn renew(&self, _lease: &LeaseRef, _lease_duration: Duration) -> Result<Timestamp> {
        Err(Self::unsupported("renew"))
    }

    async fn ack(&self, _lease: &LeaseRef) -> Result<()> {
        Err(Self::unsupported("ack"))
    }

    async fn retry(&self, _lease: &LeaseRef, _reason: &str, _delay: Option<Duration>) -> Result<RetryOutcome> {
        Err(Self::unsupported("retry"))
    }

    async fn reject(&self, _lease: &LeaseRef, _reason: &str) -> Result<()> {
        Err(Self::unsupported("reject"))
    }

    async fn replay(&self, _stream: &str, _group: &str, _replay: &Replay) -> Result<u64> {
        Err(Self::unsupported("replay"))
    }

    async fn reset_group(&self, _stream: &str, _group: &str, _reset: &Reset) -> Result<()> {
        Err(Self::unsupported("reset_group"))
    }

    async fn lag(&self, _stream: &str, _group: &str, _partitions: Option<&[u32]>) -> Result<Lag> {
        Err(Self::unsupported("lag"))
    }

    async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        self.list_streams_impl().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rheo_options_are_taken_off_the_url_and_checked() {
        let (o, driver) = parse_url("mongodb://h:1/db?directConnection=true&rheo_pool=3&w=majority").expect("parse");
        assert_eq!(o.pool, 3);
        assert_eq!(driver, "mongodb://h:1/db?directConnection=true&w=majority");
        let (o, driver) = parse_url("mongodb://h/db").expect("parse");
        assert_eq!((o, driver.as_str()), (UrlOptions::default(), "mongodb://h/db"));
        for (url, says) in [
            ("mongodb://h/?rheo_pool=0", "from 1 to 256"),
            ("mongodb://h/?rheo_pool=x", "from 1 to 256"),
            ("mongodb://h/?rheo_connect_timeout_ms=", "whole number"),
            ("mongodb://h/?rheo_colour=red", "unknown mongo option \"rheo_colour\""),
        ] {
            let e = parse_url(url).expect_err(url);
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(redact("mongodb://app:s3cret@h:27017/db?x=1"), "mongodb://app:***@h:27017/db?x=1");
        assert_eq!(redact("mongodb://app@h/db"), "mongodb://app@h/db");
        assert_eq!(redact("mongodb://h"), "mongodb://h");
    }

    #[test]
    fn database_names_are_checked() {
        assert!(check_database_name("rheo_test").is_ok());
        for bad in ["", "a.b", "a b", "a/b", "a$b", &"x".repeat(64)] {
            assert!(check_database_name(bad).is_err(), "{bad:?}");
        }
    }
}
