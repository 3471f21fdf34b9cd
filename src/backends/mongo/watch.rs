//! MongoDB wakeups: one change stream per backend on `events` (inserts
//! only, each reduced to its stream's name), fanned out to the
//! subscribers of each stream. So appends by any process, this crate's or
//! the reference's, wake consumers here. The stream is opened again after
//! an error (with every stream woken, since inserts may have been missed
//! meanwhile); subscribers poll as well, so a lost wakeup costs at most a
//! poll interval.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::{Document, doc};
use parking_lot::Mutex;

use crate::backends::WakeupMap;

#[derive(Debug, Default)]
pub(crate) struct Watcher {
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Watcher {
    /// Starts the watching task once (on the first subscription).
    pub(crate) fn ensure_started(&self, events: mongodb::Collection<Document>, wakeups: Arc<WakeupMap>) {
        let mut task = self.task.lock();
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        *task = Some(tokio::spawn(run(events, wakeups)));
    }

    pub(crate) fn stop(&self) {
        if let Some(t) = self.task.lock().take() {
            t.abort();
        }
    }
}

async fn run(events: mongodb::Collection<Document>, wakeups: Arc<WakeupMap>) {
    let pipeline =
        [doc! { "$match": { "operationType": "insert" } }, doc! { "$project": { "fullDocument.stream": 1 } }];
    let mut pause = Duration::from_millis(100);
    let mut first = true;
    loop {
        let mut stream = match events.watch().pipeline(pipeline.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "mongo change stream failed to open; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        pause = Duration::from_millis(100);
        if !first {
            // Anything appended while no one watched.
            wakeups.wake_all();
        }
        first = false;
        while let Some(change) = stream.next().await {
            match change {
                Ok(c) => match c.full_document.as_ref().and_then(|d| d.get_str("stream").ok()) {
                    Some(s) => wakeups.wake(s),
                    None => wakeups.wake_all(),
                },
                Err(e) => {
                    tracing::debug!(error = %e, "mongo change stream lost; opening it again");
                    break;
                }
            }
        }
        wakeups.wake_all();
        tokio::time::sleep(pause).await;
    }
}
