//! Every backend, one folder each, and the registry that opens one from a
//! URL (ADR 0010).
//!
//! | scheme | backend | feature |
//! |---|---|---|
//! | `memory:` | [`memory::MemoryBackend`]: in-process, ephemeral | always built |
//! | `native:PATH[?options]` | [`native::NativeBackend`]: the embedded log engine | always built |
//! | `sqlite:PATH[?options]` | `sql::SqlBackend` on SQLite | `sqlite` |
//! | `postgres://…`, `postgresql://…` | `sql::SqlBackend` on PostgreSQL | `postgres` |
//! | `mongodb://…`, `mongodb+srv://…` | `mongo::MongoBackend` on MongoDB | `mongo` |
//! | `redis://…`, `rediss://…`, `redis+cluster://…` | `redis::RedisBackend` on Redis Streams (one server or a Redis Cluster) | `redis` |
//!
//! A backend plugs in as a folder here with one arm in `open` (crate-private) behind its
//! cargo feature; the facade ([`crate::Rheo`]) never names a concrete
//! backend.

use std::sync::Arc;

pub use crate::backend::{Backend, Subscription, Wakeups};
use crate::engine::EngineOptions;
use crate::error::{Error, Result};
use crate::model::time::Clock;

pub(crate) mod combine;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo", feature = "redis"))]
pub(crate) mod common;
pub(crate) mod dedupe;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo", feature = "redis"))]
pub(crate) mod group_store;
pub mod memory;
#[cfg(feature = "mongo")]
#[cfg_attr(docsrs, doc(cfg(feature = "mongo")))]
pub mod mongo;
pub mod native;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub mod sql;
pub(crate) mod url;

/// A backend URL with its password replaced by `***`, for logs and
/// messages (every backend's errors name URLs this way).
///
/// ```
/// assert_eq!(rheo::redact_url("postgres://app:secret@db/orders"), "postgres://app:***@db/orders");
/// assert_eq!(rheo::redact_url("native:./data"), "native:./data");
/// ```
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// True when `canonical` (a checked query path) is always indexed or one
/// of `declared` (fields as given) already names it: declaring it again
/// is a no-op.
pub(crate) fn index_declared(declared: &[String], canonical: &str) -> bool {
    crate::model::query::ALWAYS_INDEXED.contains(&canonical)
        || declared.iter().any(|f| crate::model::path::canonical_path(f).as_deref() == Some(canonical))
}

/// The index status of a backend whose queries scan (memory, Redis): the
/// always-indexed fields and the declared ones, each "ready" at once
/// (nothing is built).
pub(crate) fn scanned_index_status(declared: &[String]) -> Vec<crate::model::stream::IndexStatus> {
    let mut fields: Vec<String> = crate::model::query::ALWAYS_INDEXED.iter().map(|f| (*f).to_owned()).collect();
    fields.extend(declared.iter().filter_map(|f| crate::model::path::canonical_path(f)));
    fields.sort();
    fields.dedup();
    fields
        .into_iter()
        .map(|field| crate::model::stream::IndexStatus {
            field,
            segments_ready: 0,
            segments_total: 0,
            segments_failed: 0,
        })
        .collect()
}

/// The wakeup source of each stream of a database backend, shared with
/// the task that hears the database's notifications.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo", feature = "redis"))]
#[derive(Debug, Default)]
pub(crate) struct WakeupMap(parking_lot::RwLock<std::collections::HashMap<String, Arc<crate::backend::Wakeups>>>);

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo", feature = "redis"))]
impl WakeupMap {
    pub(crate) fn get(&self, stream: &str) -> Arc<crate::backend::Wakeups> {
        if let Some(w) = self.0.read().get(stream) {
            return w.clone();
        }
        self.0.write().entry(stream.to_owned()).or_default().clone()
    }

    /// Wakes the subscribers of one stream, if it has any.
    pub(crate) fn wake(&self, stream: &str) {
        if let Some(w) = self.0.read().get(stream) {
            w.appended();
        }
    }

    /// Wakes everyone (after missed notifications).
    #[cfg_attr(not(any(feature = "postgres", feature = "mongo")), allow(dead_code))]
    pub(crate) fn wake_all(&self) {
        for w in self.0.read().values() {
            w.appended();
        }
    }
}

/// A backend's notification task (PostgreSQL's `LISTEN`, MongoDB's change
/// stream): started on the first subscription, stopped with the backend.
#[cfg(any(feature = "postgres", feature = "mongo"))]
#[derive(Debug, Default)]
pub(crate) struct FeedTask(parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>);

#[cfg(any(feature = "postgres", feature = "mongo"))]
impl FeedTask {
    /// Spawns `run` unless the task runs.
    pub(crate) fn ensure_started(&self, run: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut task = self.0.lock();
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        *task = Some(tokio::spawn(run));
    }

    pub(crate) fn stop(&self) {
        if let Some(t) = self.0.lock().take() {
            t.abort();
        }
    }
}

/// Wakes subscribers from a database's notification feed, which may drop:
/// `open` connects it (again after a failure, after a pause doubling from
/// 100 ms to 5 s) and `read` takes its notifications until it is lost.
/// Everyone is woken when it is lost and when it is back (notifications in
/// between were missed); subscribers poll as well, so a lost wakeup costs
/// at most a poll interval.
#[cfg(any(feature = "postgres", feature = "mongo"))]
pub(crate) async fn feed_wakeups<T, O, OF, R, RF>(wakeups: Arc<WakeupMap>, what: &'static str, mut open: O, mut read: R)
where
    O: FnMut() -> OF,
    OF: std::future::Future<Output = std::result::Result<T, String>>,
    R: FnMut(T, Arc<WakeupMap>) -> RF,
    RF: std::future::Future<Output = ()>,
{
    const PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
    let mut pause = PAUSE;
    let mut first = true;
    loop {
        let feed = match open().await {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "{what} failed to open; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(5));
                continue;
            }
        };
        pause = PAUSE;
        if !first {
            wakeups.wake_all();
        }
        first = false;
        read(feed, wakeups.clone()).await;
        wakeups.wake_all();
        tokio::time::sleep(pause).await;
    }
}

/// What every backend is opened with, besides its URL.
#[derive(Debug, Clone)]
pub(crate) struct OpenContext {
    /// The clock the backend reads.
    pub clock: Arc<dyn Clock>,
    /// True when the user gave the clock (tests): a database backend then
    /// reads it rather than the database's own clock.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub custom_clock: bool,
}

/// The backends behind a cargo feature: (schemes, feature, name). A
/// scheme whose feature is off names it.
const PLANNED: [(&[&str], &str, &str); 4] = [
    (&["sqlite"], "sqlite", "SQLite"),
    (&["postgres", "postgresql"], "postgres", "PostgreSQL"),
    (&["mongodb", "mongodb+srv"], "mongo", "MongoDB"),
    (&["redis", "rediss", "redis+cluster", "rediss+cluster"], "redis", "Redis"),
];

/// Opens the backend a URL names (`scheme:rest`). An unknown scheme is
/// `Error::InvalidArgument` listing the known ones; a known scheme whose backend
/// is not built names the cargo feature it needs.
pub(crate) async fn open(url: &str, cx: &OpenContext) -> Result<Arc<dyn Backend>> {
    let (scheme, rest) = url.split_once(':').unwrap_or((url, ""));
    match scheme {
        "memory" => Ok(Arc::new(memory::MemoryBackend::with_clock(cx.clock.clone()))),
        "native" => {
            let (path, opts) = native::parse_url(rest, EngineOptions::default())?;
            if opts.read_only {
                return Ok(Arc::new(native::ReadOnlyNative::open(&path, opts, cx.clock.clone()).await?));
            }
            Ok(Arc::new(native::NativeBackend::open(&path, opts, cx.clock.clone()).await?))
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(sql::SqlBackend::open_sqlite(url, cx.clock.clone()).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            Ok(Arc::new(sql::SqlBackend::open_postgres(url, cx.clock.clone(), cx.custom_clock).await?))
        }
        #[cfg(feature = "mongo")]
        "mongodb" | "mongodb+srv" => Ok(Arc::new(mongo::MongoBackend::open(url, cx.clock.clone()).await?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => {
            Ok(Arc::new(self::redis::RedisBackend::open(url, cx.clock.clone()).await?))
        }
        _ => match PLANNED.iter().find(|(schemes, _, _)| schemes.contains(&scheme)) {
            Some((_, feature, name)) => Err(Error::invalid(
                "url",
                format!(
                    "{scheme}: URLs open the {name} backend, which needs the cargo feature {feature:?} \
                     (this build of rheo was compiled without it)"
                ),
            )),
            None => Err(Error::invalid(
                "url",
                format!(
                    "{url:?}: unknown backend scheme {scheme:?}; expected memory:, native:PATH, sqlite:PATH, \
                     postgres://..., mongodb://... or redis://..."
                ),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::time::SystemClock;

    fn cx() -> OpenContext {
        OpenContext { clock: Arc::new(SystemClock), custom_clock: false }
    }

    #[tokio::test]
    async fn schemes_open_their_backend_or_say_what_is_missing() {
        let memory = open("memory:", &cx()).await.expect("memory");
        assert_eq!(memory.capabilities().backend, "memory");
        let mut missing = Vec::new();
        if cfg!(not(feature = "redis")) {
            missing.push(("redis://h", "\"redis\""));
        }
        if cfg!(not(feature = "mongo")) {
            missing.push(("mongodb://h", "\"mongo\""));
        }
        if cfg!(not(feature = "postgres")) {
            missing.extend([("postgres://localhost/db", "\"postgres\""), ("postgresql://x", "\"postgres\"")]);
        }
        if cfg!(not(feature = "sqlite")) {
            missing.push(("sqlite:./x.db", "\"sqlite\""));
        }
        for (url, feature) in missing {
            let Err(e) = open(url, &cx()).await else { panic!("{url}: opened a backend that is not built") };
            assert!(matches!(e, Error::InvalidArgument { .. }), "{url}: {e}");
            assert!(e.to_string().contains(feature), "{url}: {e}");
        }
        let Err(e) = open("kafka://h", &cx()).await else { panic!("opened an unknown scheme") };
        assert!(e.to_string().contains("unknown backend scheme \"kafka\""), "{e}");
        // The native backend's own options are checked before anything opens.
        for (query, says) in [("inline_io=maybe", "expected true or false"), ("colour=red", "unknown native option")] {
            let url = format!("native:./never-created?{query}");
            let Err(e) = open(&url, &cx()).await else { panic!("{url}: opened") };
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(says), "{url}: {e}");
        }
        assert!(!std::path::Path::new("./never-created").exists());
    }
}
