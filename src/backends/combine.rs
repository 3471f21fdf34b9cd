//! Group commit in the client: concurrent calls that write to one place
//! (a stream's partition, a group's settles) are coalesced into one flush,
//! with at most one flush in flight per key (ADR 0020).
//!
//! A caller hands its items to [`Combiner::submit`] and awaits its own
//! answer. The first caller of an idle key starts a flush task; calls that
//! arrive while a flush runs wait in the key's queue and go together in the
//! next one, up to `max_items` items and `max_bytes` bytes (a call is never
//! split: one larger than the bounds goes alone). There is no timer: a
//! flush starts as soon as the previous one ends, so a lone caller pays no
//! delay and many callers share one round trip and one commit (RocksDB's
//! and the native engine's leader/follower batching).
//!
//! The flush runs in a task of its own, so a caller that is cancelled (its
//! future dropped) cancels nothing of what the others wait for. A flush
//! answers each call on its own: the flush function decides whether one
//! call's failure fails the others (see `sql::append`).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures::FutureExt as _;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

/// The items of one call, as a flush receives them.
pub(crate) struct Call<T> {
    pub items: Vec<T>,
}

/// What a flush answers: one result per call, in the calls' order.
pub(crate) type Answers<R> = Vec<Result<Vec<R>>>;

type FlushFn<K, T, R> = dyn Fn(K, Vec<Call<T>>) -> Pin<Box<dyn Future<Output = Answers<R>> + Send>> + Send + Sync;

struct Waiting<T, R> {
    items: Vec<T>,
    bytes: usize,
    reply: oneshot::Sender<Result<Vec<R>>>,
}

struct Queue<T, R> {
    waiting: VecDeque<Waiting<T, R>>,
    /// Flush tasks running for the key (at most `Inner::depth`).
    running: usize,
}

struct Inner<K, T, R> {
    /// Keys with a flush task running, and the calls waiting for the next flush.
    queues: Mutex<HashMap<K, Queue<T, R>>>,
    flush: Box<FlushFn<K, T, R>>,
    max_items: usize,
    max_bytes: usize,
    /// The most flushes of one key in flight at once.
    depth: usize,
    /// What the operation is called in errors.
    operation: &'static str,
}

/// Coalesces concurrent calls per key into flushes (see the module docs).
pub(crate) struct Combiner<K, T, R> {
    inner: Arc<Inner<K, T, R>>,
}

impl<K, T, R> std::fmt::Debug for Combiner<K, T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner")
            .field("operation", &self.inner.operation)
            .field("max_items", &self.inner.max_items)
            .field("max_bytes", &self.inner.max_bytes)
            .finish_non_exhaustive()
    }
}

impl<K, T, R> Combiner<K, T, R>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    T: Send + 'static,
    R: Send + 'static,
{
    /// A combiner whose flushes take at most `max_items` items and
    /// `max_bytes` bytes (a single larger call still goes, alone), with at
    /// most `depth` flushes of one key in flight.
    pub(crate) fn new<F, Fut>(
        operation: &'static str,
        max_items: usize,
        max_bytes: usize,
        depth: usize,
        flush: F,
    ) -> Self
    where
        F: Fn(K, Vec<Call<T>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Answers<R>> + Send + 'static,
    {
        let flush: Box<FlushFn<K, T, R>> = Box::new(move |k, calls| Box::pin(flush(k, calls)));
        Combiner {
            inner: Arc::new(Inner {
                queues: Mutex::new(HashMap::new()),
                flush,
                max_items: max_items.max(1),
                max_bytes: max_bytes.max(1),
                depth: depth.max(1),
                operation,
            }),
        }
    }

    /// Queues `items` (weighing `bytes`) for the next flush of `key` and
    /// waits for their answer. Must be called inside a tokio runtime.
    pub(crate) async fn submit(&self, key: K, items: Vec<T>, bytes: usize) -> Result<Vec<R>> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queues = self.inner.queues.lock();
            let q = queues.entry(key.clone()).or_insert_with(|| Queue { waiting: VecDeque::new(), running: 0 });
            q.waiting.push_back(Waiting { items, bytes, reply });
            let start = q.running < self.inner.depth;
            if start {
                q.running += 1;
            }
            start
        };
        if start {
            tokio::spawn(run(self.inner.clone(), key));
        }
        match answer.await {
            Ok(r) => r,
            // The flush task ended without answering (the runtime shut
            // down): the flush may or may not have been written.
            Err(_) => Err(Error::ambiguous(
                self.inner.operation,
                "the flush task stopped before it answered (the runtime is shutting down?)",
            )),
        }
    }
}

/// The flush task of one key: flushes what waits until nothing does.
async fn run<K, T, R>(inner: Arc<Inner<K, T, R>>, key: K)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    T: Send + 'static,
    R: Send + 'static,
{
    loop {
        let batch = {
            let mut queues = inner.queues.lock();
            let Some(q) = queues.get_mut(&key) else { return };
            if q.waiting.is_empty() {
                q.running -= 1;
                if q.running == 0 {
                    queues.remove(&key);
                }
                return;
            }
            let (mut items, mut bytes) = (0usize, 0usize);
            let mut batch = Vec::new();
            while let Some(w) = q.waiting.front() {
                let fits = items + w.items.len() <= inner.max_items && bytes + w.bytes <= inner.max_bytes;
                if !batch.is_empty() && !fits {
                    break;
                }
                items += w.items.len();
                bytes += w.bytes;
                if let Some(w) = q.waiting.pop_front() {
                    batch.push(w);
                }
            }
            batch
        };
        let mut calls = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        for w in batch {
            calls.push(Call { items: w.items });
            replies.push(w.reply);
        }
        let n = calls.len();
        let flushed = AssertUnwindSafe((inner.flush)(key.clone(), calls)).catch_unwind().await;
        let answers = match flushed {
            Ok(a) if a.len() == n => a,
            Ok(a) => (0..n)
                .map(|_| {
                    Err(Error::ambiguous(
                        inner.operation,
                        format!("a flush of {n} calls gave {} answers (a bug): it may have been written", a.len()),
                    ))
                })
                .collect(),
            Err(_) => (0..n)
                .map(|_| Err(Error::ambiguous(inner.operation, "a flush panicked (a bug): it may have been written")))
                .collect(),
        };
        for (reply, answer) in replies.into_iter().zip(answers) {
            // A caller that went away no longer needs its answer.
            let _ = reply.send(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_flushes_and_each_gets_its_own_answer() {
        let flushes = Arc::new(AtomicUsize::new(0));
        let largest = Arc::new(AtomicUsize::new(0));
        let (f, l) = (flushes.clone(), largest.clone());
        let c: Arc<Combiner<u32, u64, u64>> = Arc::new(Combiner::new("test", 50, usize::MAX, 2, move |k, calls| {
            let (f, l) = (f.clone(), l.clone());
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                let items: usize = calls.iter().map(|c| c.items.len()).sum();
                l.fetch_max(items, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                calls
                    .into_iter()
                    .map(|c| {
                        if c.items.first() == Some(&13) {
                            Err(Error::invalid("n", "13 is refused"))
                        } else {
                            Ok(c.items.iter().map(|i| i * 10 + u64::from(k)).collect())
                        }
                    })
                    .collect()
            }
        }));
        let mut tasks = Vec::new();
        for i in 0..400u64 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move { (i, c.submit((i % 2) as u32, vec![i, i + 1000], 16).await) }));
        }
        for t in tasks {
            let (i, r) = t.await.expect("task");
            if i == 13 {
                assert!(r.is_err(), "call 13 fails alone");
            } else {
                let k = i % 2;
                assert_eq!(r.expect("answer"), vec![i * 10 + k, (i + 1000) * 10 + k]);
            }
        }
        let n = flushes.load(Ordering::SeqCst);
        assert!(n < 400, "400 concurrent calls took {n} flushes: nothing was combined");
        assert!(largest.load(Ordering::SeqCst) <= 50, "a flush went over its bound");
    }

    #[tokio::test]
    async fn a_call_larger_than_the_bound_goes_alone_and_a_panic_answers_everyone() {
        let c: Combiner<(), u8, u8> = Combiner::new("test", 2, 4, 1, |_, calls: Vec<Call<u8>>| async move {
            if calls.iter().any(|c| c.items.contains(&0)) {
                panic!("boom");
            }
            calls.into_iter().map(|c| Ok(c.items)).collect()
        });
        assert_eq!(c.submit((), vec![1, 2, 3], 9).await.expect("large call"), vec![1, 2, 3]);
        let e = c.submit((), vec![0], 1).await.expect_err("panicked flush");
        assert!(e.to_string().contains("panicked"), "{e}");
        assert_eq!(c.submit((), vec![7], 1).await.expect("after a panic"), vec![7], "the key works again");
    }
}
