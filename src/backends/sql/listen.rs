//! PostgreSQL wakeups: one `LISTEN rheo_events` connection per backend,
//! fanned out to the subscribers of each stream. The payload is the
//! reference's (`{"stream": s, "count": n}`), so an Elixir producer with
//! `notify: true` wakes Rust consumers too. The listener reconnects by
//! itself; after a reconnect (notifications may have been missed) it wakes
//! every stream. Subscribers poll as well, so a lost notification costs at
//! most a poll interval.
//!
//! Notifications are sent by a [`Notifier`], out of the append path: an
//! append transaction that calls `pg_notify` takes PostgreSQL's cluster-wide
//! notify lock in `PreCommit_Notify` and holds it through its WAL flush, so
//! every notifying commit of every stream would run one at a time (ADR
//! 0020). The notifier sends what the appends of the last few milliseconds
//! marked, one statement for every stream at once.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sqlx::postgres::{PgListener, PgPool};

use super::WakeupMap;
use crate::backends::FeedTask;

/// The shortest time between two notification statements of one backend.
pub(crate) const NOTIFY_EVERY: Duration = Duration::from_millis(5);

/// At most this many streams' notifications in one statement (the rest
/// go in the next one).
const NOTIFY_MAX_STREAMS: usize = 1000;

/// Sends the notifications of this backend's appends, coalesced: at most
/// one statement every [`NOTIFY_EVERY`], naming each stream that was
/// appended to once, with the number of events appended since the last.
#[derive(Debug)]
pub(crate) struct Notifier {
    /// Streams appended to since the last statement, and how many events.
    pending: Mutex<std::collections::BTreeMap<String, u64>>,
    wake: tokio::sync::Notify,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// This backend's id and schema, in every payload (see [`Filter`]).
    origin: String,
    schema: Option<String>,
}

impl Notifier {
    pub(crate) fn new(origin: String, schema: Option<String>) -> Self {
        Notifier {
            pending: Mutex::new(std::collections::BTreeMap::new()),
            wake: tokio::sync::Notify::new(),
            task: Mutex::new(None),
            origin,
            schema,
        }
    }

    /// Notes that `count` events were committed to `stream`: other
    /// processes are told within a few milliseconds. Starts the sending
    /// task on first use (inside a tokio runtime).
    pub(crate) fn appended(self: &Arc<Self>, pool: &PgPool, stream: &str, count: usize) {
        {
            let mut pending = self.pending.lock();
            *pending.entry(stream.to_owned()).or_default() += count as u64;
        }
        {
            let mut task = self.task.lock();
            if task.as_ref().is_none_or(|t| t.is_finished()) {
                *task = Some(tokio::spawn(send_loop(self.clone(), pool.clone())));
            }
        }
        self.wake.notify_one();
    }

    /// The payloads of what is pending (at most `NOTIFY_MAX_STREAMS`), taken.
    fn take(&self) -> Vec<String> {
        let mut pending = self.pending.lock();
        let mut out = Vec::new();
        while out.len() < NOTIFY_MAX_STREAMS {
            let Some((stream, count)) = pending.pop_first() else { break };
            out.push(
                serde_json::json!({"stream": stream, "count": count, "schema": self.schema, "origin": self.origin})
                    .to_string(),
            );
        }
        if !pending.is_empty() {
            self.wake.notify_one();
        }
        out
    }

    pub(crate) fn stop(&self) {
        if let Some(t) = self.task.lock().take() {
            t.abort();
        }
    }
}

/// Sends what is pending, then waits at least `NOTIFY_EVERY` before the
/// next statement: the first append after a quiet spell is told at once,
/// a busy stream at most every few milliseconds. Stopped (aborted) when
/// the backend is dropped.
async fn send_loop(n: Arc<Notifier>, pool: PgPool) {
    loop {
        let payloads = n.take();
        if payloads.is_empty() {
            // A mark made since `take` left a permit: this returns at once.
            n.wake.notified().await;
            continue;
        }
        // A notification carries no data worth a WAL flush: the commit of
        // this small transaction does not wait for one, so the notify lock
        // is held for microseconds. Lost notifications cost a poll.
        let sql = "SELECT set_config('synchronous_commit', 'off', true), pg_notify('rheo_events', p) \
                   FROM jsonb_array_elements_text($1::jsonb) AS p";
        let arr = serde_json::Value::from(payloads).to_string();
        crate::observe::round_trip("postgres");
        if let Err(e) = sqlx::query(sql).bind(arr).execute(&pool).await {
            tracing::debug!(error = %e, "postgres NOTIFY failed; other processes' consumers will poll");
        }
        tokio::time::sleep(NOTIFY_EVERY).await;
    }
}

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
    task: FeedTask,
}

impl Listener {
    pub(crate) fn new(wakeups: Arc<WakeupMap>, filter: Filter) -> Self {
        Listener { wakeups, filter, task: FeedTask::default() }
    }

    /// Starts the listening task once (on the first subscription).
    pub(crate) fn ensure_started(&self, pool: &PgPool) {
        self.task.ensure_started(run(pool.clone(), self.wakeups.clone(), self.filter.clone()));
    }

    pub(crate) fn stop(&self) {
        self.task.stop();
    }
}

async fn run(pool: PgPool, wakeups: Arc<WakeupMap>, filter: Filter) {
    let open = || {
        let pool = pool.clone();
        async move {
            let mut listener = PgListener::connect_with(&pool).await.map_err(|e| e.to_string())?;
            listener.listen(CHANNEL).await.map_err(|e| e.to_string())?;
            Ok(listener)
        }
    };
    crate::backends::feed_wakeups(wakeups, "postgres LISTEN", open, |mut listener: PgListener, wakeups| {
        let filter = filter.clone();
        async move {
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
                        return;
                    }
                }
            }
        }
    })
    .await
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
