//! MongoDB wakeups: one change stream per backend on `events` (inserts
//! only, each reduced to its stream's name), fanned out to the
//! subscribers of each stream. So appends by any process, this crate's or
//! the reference's, wake consumers here. The stream is opened again after
//! an error (with every stream woken, since inserts may have been missed
//! meanwhile); subscribers poll as well, so a lost wakeup costs at most a
//! poll interval.

use std::sync::Arc;

use futures::StreamExt;
use mongodb::bson::{Document, doc};

use crate::backends::WakeupMap;

/// Wakes `wakeups` from the change stream of `events`, for ever.
pub(crate) async fn run(events: mongodb::Collection<Document>, wakeups: Arc<WakeupMap>) {
    let pipeline =
        [doc! { "$match": { "operationType": "insert" } }, doc! { "$project": { "fullDocument.stream": 1 } }];
    let open = || {
        let (events, pipeline) = (events.clone(), pipeline.clone());
        async move { events.watch().pipeline(pipeline).await.map_err(|e| e.to_string()) }
    };
    crate::backends::feed_wakeups(wakeups, "mongo change stream", open, |mut stream, wakeups| async move {
        while let Some(change) = stream.next().await {
            match change {
                Ok(c) => match c.full_document.as_ref().and_then(|d| d.get_str("stream").ok()) {
                    Some(s) => wakeups.wake(s),
                    None => wakeups.wake_all(),
                },
                Err(e) => {
                    tracing::debug!(error = %e, "mongo change stream lost; opening it again");
                    return;
                }
            }
        }
    })
    .await
}
