//! PostgreSQL wakeups: one `LISTEN rheo_events` connection per backend,
//! fanned out to the subscribers of each stream. The payload is the
//! reference's (`{"stream": s, "count": n}`), so an Elixir producer with
//! `notify: true` wakes Rust consumers too. The listener reconnects by
//! itself; after a reconnect (notifications may have been missed) it wakes
//! every stream. Subscribers poll as well, so a lost notification costs at
//! most a poll interval.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sqlx::postgres::{PgListener, PgPool};

use super::WakeupMap;

/// The channel the reference notifies on.
pub(crate) const CHANNEL: &str = "rheo_events";

/// Whose notifications a listener takes.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    /// This backend's own id: its appends wake its subscribers directly,
    /// so their notifications are skipped (one wake per append).
    pub origin: String,
    /// The schema of its tables: notifications of another schema's streams
    /// are skipped (the reference's, without a schema, are taken).
    pub schema: Option<String>,
}

impl Filter {
    /// The stream a notification wakes, or None to skip it; `Some(None)`
    /// wakes every stream (a payload this code can't read).
    fn stream_of(&self, payload: &str) -> Option<Option<String>> {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(payload) else { return Some(None) };
        if let Some(origin) = v.get("origin") {
            // A Rust backend's: its own, or another schema's, are skipped.
            let schema = v.get("schema").and_then(|o| o.as_str());
            if origin.as_str() == Some(self.origin.as_str()) || schema != self.schema.as_deref() {
                return None;
            }
        }
        Some(v.get("stream").and_then(|s| s.as_str()).map(str::to_owned))
    }
}

#[derive(Debug)]
pub(crate) struct Listener {
    wakeups: Arc<WakeupMap>,
    filter: Filter,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Listener {
    pub(crate) fn new(wakeups: Arc<WakeupMap>, filter: Filter) -> Self {
        Listener { wakeups, filter, task: Mutex::new(None) }
    }

    /// Starts the listening task once (on the first subscription).
    pub(crate) fn ensure_started(&self, pool: &PgPool) {
        let mut task = self.task.lock();
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (pool, wakeups, filter) = (pool.clone(), self.wakeups.clone(), self.filter.clone());
        *task = Some(tokio::spawn(run(pool, wakeups, filter)));
    }

    pub(crate) fn stop(&self) {
        if let Some(t) = self.task.lock().take() {
            t.abort();
        }
    }
}

async fn run(pool: PgPool, wakeups: Arc<WakeupMap>, filter: Filter) {
    let mut pause = Duration::from_millis(100);
    let mut first = true;
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "postgres LISTEN connection failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Err(e) = listener.listen(CHANNEL).await {
            tracing::debug!(error = %e, "postgres LISTEN failed; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
            continue;
        }
        pause = Duration::from_millis(100);
        if !first {
            // Anything appended while no one listened.
            wakeups.wake_all();
        }
        first = false;
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => match filter.stream_of(n.payload()) {
                    Some(Some(stream)) => wakeups.wake(&stream),
                    Some(None) => wakeups.wake_all(),
                    None => {}
                },
                // The connection was lost; the next call reconnects and
                // re-listens. Notifications in between are lost: wake all.
                Ok(None) => wakeups.wake_all(),
                Err(e) => {
                    tracing::debug!(error = %e, "postgres LISTEN connection lost; reconnecting");
                    wakeups.wake_all();
                    tokio::time::sleep(pause).await;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_of_this_backend_and_of_other_schemas_are_skipped() {
        let f = Filter { origin: "me".into(), schema: Some("a".into()) };
        assert_eq!(f.stream_of(r#"{"stream":"s","count":1}"#), Some(Some("s".into())), "the reference's payload");
        assert_eq!(f.stream_of(r#"{"stream":"s","count":1,"schema":"a","origin":"other"}"#), Some(Some("s".into())));
        assert_eq!(f.stream_of(r#"{"stream":"s","count":1,"schema":"a","origin":"me"}"#), None);
        assert_eq!(f.stream_of(r#"{"stream":"s","count":1,"schema":"b","origin":"x"}"#), None);
        assert_eq!(f.stream_of(r#"{"stream":"s","count":1,"schema":null,"origin":"x"}"#), None, "the default schema's");
        assert_eq!(f.stream_of("not json"), Some(None));
    }
}
