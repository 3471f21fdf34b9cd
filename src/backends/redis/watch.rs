//! Wakeups on Redis: one task per subscribed stream, on a connection of
//! its own, blocks in `XREAD BLOCK` on the stream's partitions from the
//! last entry it saw; any entry appended by any process wakes the
//! stream's subscribers. Appends of this handle wake them at once anyway;
//! both paths go through [`Seen`], so an append wakes once, whichever path
//! sees it first. A failed read is retried after a pause (subscribers poll
//! meanwhile).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::streams::{StreamReadOptions, StreamReadReply};

use super::conn::READ_TIMEOUT;
use crate::backends::WakeupMap;

/// How long one blocking read waits before it starts again.
const BLOCK: Duration = Duration::from_secs(5);
/// The pause after a failed read.
const PAUSE: Duration = Duration::from_secs(1);

/// The highest sequence of each (stream, partition) this handle has woken
/// subscribers for.
#[derive(Debug, Default)]
pub(super) struct Seen(Mutex<HashMap<(String, u32), u64>>);

impl Seen {
    /// Records that `stream`'s partition `p` holds `seq`; true when that is
    /// news (the subscribers are to be woken).
    pub fn raise(&self, stream: &str, p: u32, seq: u64) -> bool {
        let mut m = self.0.lock();
        match m.get_mut(&(stream.to_owned(), p)) {
            Some(s) if *s >= seq => false,
            Some(s) => {
                *s = seq;
                true
            }
            None => {
                m.insert((stream.to_owned(), p), seq);
                true
            }
        }
    }
}

/// The watch tasks of a backend, stopped when it is dropped.
#[derive(Default)]
pub(super) struct Watchers(Mutex<HashMap<String, tokio::task::JoinHandle<()>>>);

impl Watchers {
    /// Starts the task of `stream` unless it runs.
    pub fn ensure(
        &self,
        stream: &str,
        keys: Vec<String>,
        connector: &super::conn::Connector,
        wakeups: Arc<WakeupMap>,
        seen: Arc<Seen>,
    ) {
        let mut tasks = self.0.lock();
        if tasks.get(stream).is_some_and(|t| !t.is_finished()) {
            return;
        }
        let connector = connector.clone();
        let name = stream.to_owned();
        let task = tokio::spawn(async move { watch(connector, name, keys, wakeups, seen).await });
        tasks.insert(stream.to_owned(), task);
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for (_, t) in self.0.lock().drain() {
            t.abort();
        }
    }
}

async fn watch(
    connector: super::conn::Connector,
    stream: String,
    keys: Vec<String>,
    wakeups: Arc<WakeupMap>,
    seen: Arc<Seen>,
) {
    // From the last entry of each partition when the task starts, then
    // from the last one seen.
    let mut ids: Vec<Option<String>> = vec![None; keys.len()];
    loop {
        let mut conn = match connector.blocking(READ_TIMEOUT).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(stream, error = %e, "redis wakeups: cannot connect; retrying");
                tokio::time::sleep(PAUSE).await;
                continue;
            }
        };
        for (k, id) in keys.iter().zip(ids.iter_mut()) {
            if id.is_none() {
                let last: redis::RedisResult<redis::streams::StreamRangeReply> =
                    redis::AsyncCommands::xrevrange_count(&mut conn, k, "+", "-", 1).await;
                if let Ok(r) = last {
                    *id = Some(r.ids.first().map_or_else(|| "0-0".to_owned(), |e| e.id.clone()));
                }
            }
        }
        let from: Vec<String> = ids.iter().map(|i| i.clone().unwrap_or_else(|| "$".to_owned())).collect();
        let mut from = from;
        loop {
            let opts = StreamReadOptions::default().block(BLOCK.as_millis() as usize).count(100);
            let read: redis::RedisResult<Option<StreamReadReply>> =
                redis::AsyncCommands::xread_options(&mut conn, &keys, &from, &opts).await;
            match read {
                Ok(Some(reply)) => {
                    let mut news = false;
                    for k in reply.keys {
                        if let (Some(i), Some(last)) = (keys.iter().position(|x| *x == k.key), k.ids.last()) {
                            ids[i] = Some(last.id.clone());
                            from[i] = last.id.clone();
                            let seq = last.id.split_once('-').and_then(|(s, _)| s.parse::<u64>().ok());
                            let p = u32::try_from(i).unwrap_or(u32::MAX);
                            news |= seq.is_none_or(|q| seen.raise(&stream, p, q));
                        }
                    }
                    if news {
                        wakeups.wake(&stream);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(stream, error = %e, "redis wakeups: read failed; reconnecting");
                    // Whatever was appended meanwhile: wake, then read anew.
                    wakeups.wake(&stream);
                    tokio::time::sleep(PAUSE).await;
                    break;
                }
            }
        }
    }
}
