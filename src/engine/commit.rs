//! Group commit: one thread makes appends durable in batches.
//!
//! Writers write their records (to the OS) under their partition lock and
//! queue a job naming the files to sync, the transaction to commit and the
//! sequences to publish. The commit thread takes every queued job at once,
//! syncs each file once, records committed multi-partition transactions,
//! then publishes the sequences and wakes the writers. While it syncs, new
//! jobs queue up: the more concurrent writers, the more each sync carries.
//!
//! A failed sync poisons the engine: the kernel may have dropped the dirty
//! pages, so nothing written since the last good sync can be trusted, and
//! every later write fails until the data directory is reopened.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use futures::channel::oneshot;
use parking_lot::{Condvar, Mutex};

use super::log::partition::Partition;
use super::log::txn::TxnLog;
use super::options::Durability;
use super::vfs::VfsFile;
use crate::error::{Error, Result};

/// The engine-wide poison flag.
#[derive(Debug, Default)]
pub struct Poison {
    reason: Mutex<Option<String>>,
}

impl Poison {
    /// Fails with `Poisoned` once poisoned.
    pub fn check(&self, scope: &str) -> Result<()> {
        match &*self.reason.lock() {
            Some(reason) => Err(Error::Poisoned { scope: scope.to_owned(), reason: reason.clone() }),
            None => Ok(()),
        }
    }

    /// Poisons with the first reason given.
    pub fn set(&self, reason: String) {
        let mut r = self.reason.lock();
        if r.is_none() {
            tracing::error!(%reason, "storage poisoned: writes refused until reopen");
            *r = Some(reason);
        }
    }

    /// The reason, once poisoned.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().clone()
    }
}

/// Something to make durable.
pub struct Job {
    /// Files to `fdatasync`.
    pub files: Vec<Arc<dyn VfsFile>>,
    /// A multi-partition transaction to record as committed after the files.
    pub txn: Option<(Arc<TxnLog>, u64)>,
    /// Sequences to publish once durable.
    pub publish: Vec<(Arc<Partition>, u64)>,
    /// Told the outcome.
    pub done: Option<oneshot::Sender<Result<()>>>,
}

/// Waits for an append to be durable.
#[derive(Debug)]
#[must_use = "an append is durable only when its ticket resolves"]
pub struct Ticket(Option<oneshot::Receiver<Result<()>>>);

impl Ticket {
    /// A ticket that is already resolved.
    pub fn ready() -> Self {
        Ticket(None)
    }

    /// Blocks the thread until durable.
    pub fn wait(self) -> Result<()> {
        futures::executor::block_on(self.resolved())
    }

    /// Resolves when durable (for async callers: never blocks a thread).
    pub async fn resolved(self) -> Result<()> {
        match self.0 {
            None => Ok(()),
            Some(rx) => rx.await.unwrap_or_else(|_| Err(Error::ambiguous("append", "the commit thread stopped"))),
        }
    }
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    first_at: Option<Instant>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    poison: Arc<Poison>,
    durability: Durability,
    /// The most jobs taken in one commit (bounds memory per round).
    max_jobs: usize,
}

/// The commit thread and its queue.
pub struct Committer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer").field("durability", &self.shared.durability).finish()
    }
}

impl Committer {
    /// Starts the commit thread.
    pub fn start(durability: Durability, poison: Arc<Poison>) -> Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            poison,
            durability,
            max_jobs: 65_536,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rheo-commit".into())
            .spawn(move || run(&s))
            .map_err(|e| Error::failed("start commit thread", e.to_string()))?;
        Ok(Committer { shared, thread: Mutex::new(Some(thread)) })
    }

    /// Queues a job and returns the ticket of its outcome (resolved at once
    /// when the job has no `done`).
    pub fn submit(&self, mut job: Job, wants_ticket: bool) -> Ticket {
        let ticket = if wants_ticket {
            let (tx, rx) = oneshot::channel();
            job.done = Some(tx);
            Ticket(Some(rx))
        } else {
            Ticket::ready()
        };
        let mut q = self.shared.queue.lock();
        if q.first_at.is_none() {
            q.first_at = Some(Instant::now());
        }
        q.jobs.push(job);
        drop(q);
        self.shared.wake.notify_one();
        ticket
    }

    /// Stops the thread after it has committed every queued job.
    pub fn shutdown(&self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run(s: &Shared) {
    loop {
        let jobs = {
            let mut q = s.queue.lock();
            loop {
                if !q.jobs.is_empty() {
                    if let (Durability::Batched { max_delay }, Some(first), false) =
                        (s.durability, q.first_at, q.shutdown)
                    {
                        let due = first + max_delay;
                        if Instant::now() < due {
                            s.wake.wait_until(&mut q, due);
                            continue;
                        }
                    }
                    break;
                }
                if q.shutdown {
                    return;
                }
                s.wake.wait(&mut q);
            }
            let n = q.jobs.len().min(s.max_jobs);
            let rest = q.jobs.split_off(n);
            let jobs = std::mem::replace(&mut q.jobs, rest);
            q.first_at = if q.jobs.is_empty() { None } else { Some(Instant::now()) };
            jobs
        };
        commit(s, jobs);
    }
}

/// Syncs every distinct file of the jobs once, commits their transactions,
/// then publishes and answers.
fn commit(s: &Shared, jobs: Vec<Job>) {
    let mut outcome = s.poison.check("storage");
    if outcome.is_ok() {
        let mut seen: Vec<*const ()> = Vec::new();
        'files: for job in &jobs {
            for f in &job.files {
                let key = Arc::as_ptr(f).cast::<()>();
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                if let Err(e) = f.sync_data() {
                    outcome = Err(poisoned(s, format!("fdatasync failed: {e}")));
                    break 'files;
                }
            }
        }
    }
    if outcome.is_ok() {
        for job in &jobs {
            if let Some((log, txn)) = &job.txn
                && let Err(e) = log.commit(*txn, true)
            {
                outcome = Err(poisoned(s, format!("committing transaction {txn}: {e}")));
                break;
            }
        }
    }
    for job in jobs {
        if outcome.is_ok() {
            for (p, seq) in &job.publish {
                p.publish(*seq);
            }
        }
        if let Some(done) = job.done {
            let _ = done.send(outcome.clone());
        }
    }
}

fn poisoned(s: &Shared, reason: String) -> Error {
    s.poison.set(reason.clone());
    Error::Poisoned { scope: "storage".into(), reason }
}
