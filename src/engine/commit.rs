//! Group commit: appends and settles made durable in batches, one round at a time.
//!
//! Writers write their records (to the OS) under their partition lock and
//! queue a job naming the files to sync, the transaction to commit and the
//! sequences to publish. The commit thread takes every queued job at once
//! (a *round*), syncs each file once, records committed multi-partition
//! transactions, publishes the sequences, then wakes every waiter of the
//! round at once (one condition-variable broadcast for threads, a waker per
//! async task). While it syncs, new jobs queue into the next round: the
//! more concurrent writers, the more each sync carries.
//!
//! Under `Sync`, while writers come one at a time (the last few rounds held
//! a single job each: the queue is not *crowded*) and no round is being
//! committed, a submit leaves its round to its waiter, which commits it on
//! its own thread (it *leads*): a lone writer or settler then syncs without
//! handing its job to the commit thread and being woken back, two thread
//! switches per call. The commit thread takes the rounds queued while a
//! leader commits, and every round while the queue is crowded, so
//! concurrent writers still share syncs. One round is committed at a time,
//! in order. A waiter that must not block its thread for a sync (an async
//! task others wait behind) hands a round left to it to the commit thread
//! instead ([`Ticket::resolved_unled`]).
//!
//! A failed sync poisons the engine: the kernel may have dropped the dirty
//! pages, so nothing written since the last good sync can be trusted, and
//! every later write fails until the data directory is reopened.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::options::Durability;
use super::vfs::VfsFile;
use crate::error::{Error, Result};

/// How long the idle commit thread spins before parking when writers are
/// many (waiters never spin: on two cores, spinning writers starve the
/// commit thread).
const SPIN: std::time::Duration = std::time::Duration::from_micros(150);

/// The engine-wide poison flag.
#[derive(Debug, Default)]
pub struct Poison {
    /// The first reason, and the error underneath it when there was one (so
    /// that every later refusal still says, e.g., that the disk is full).
    reason: Mutex<Option<(String, Option<crate::error::Cause>)>>,
}

impl Poison {
    /// Fails with `Poisoned` once poisoned.
    pub fn check(&self, scope: &str) -> Result<()> {
        match &*self.reason.lock() {
            Some((reason, source)) => {
                Err(Error::Poisoned { scope: scope.to_owned(), reason: reason.clone(), source: source.clone() })
            }
            None => Ok(()),
        }
    }

    /// Poisons with the first reason given.
    pub fn set(&self, reason: String) {
        self.set_with(reason, None);
    }

    fn set_with(&self, reason: String, source: Option<crate::error::Cause>) {
        let mut r = self.reason.lock();
        if r.is_none() {
            tracing::error!(%reason, "storage poisoned: writes refused until reopen");
            *r = Some((reason, source));
        }
    }

    /// Poisons when `e` is `Error::Poisoned` (a failed sync reported by a
    /// lower layer), and gives `e` back: `.map_err(|e| poison.absorb(e))`.
    pub fn absorb(&self, e: Error) -> Error {
        if let Error::Poisoned { reason, source, .. } = &e {
            self.set_with(reason.clone(), source.clone());
        }
        e
    }

    /// The reason, once poisoned.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().as_ref().map(|(reason, _)| reason.clone())
    }
}

/// A writer whose appends the commit thread finishes: it writes what was
/// deferred, and publishes sequences once they are durable (a log
/// partition). The committer knows writers only through this trait, so
/// that the log depends on the committer and not the other way round.
pub trait Deferred: Send + Sync {
    /// Writes the records deferred so far; returns the file to sync.
    fn flush(&self) -> Result<Arc<dyn VfsFile>>;
    /// Makes every sequence up to `seq` visible to readers.
    fn publish(&self, seq: u64);
}

/// A record of multi-partition transactions (a stream's transaction log).
pub trait TxnRecord: Send + Sync {
    /// Records `txn` as committed, synced.
    fn commit(&self, txn: u64) -> Result<()>;
}

/// A job's list of files or partitions: inline for the usual one to
/// four, so submitting an append's job allocates no list.
pub type JobList<T> = smallvec::SmallVec<[T; 4]>;

/// Something to make durable.
#[derive(Default)]
pub struct Job {
    /// Files to `fdatasync`.
    pub files: JobList<Arc<dyn VfsFile>>,
    /// Writers whose deferred records to write (then sync their file).
    pub flush: JobList<Arc<dyn Deferred>>,
    /// A multi-partition transaction to record as committed after the files.
    pub txn: Option<(Arc<dyn TxnRecord>, u64)>,
    /// Sequences to publish once durable.
    pub publish: JobList<(Arc<dyn Deferred>, u64)>,
}

/// The outcome of commit rounds, shared by the commit thread and tickets.
#[derive(Default)]
struct Rounds {
    /// Every round up to this one is durable.
    durable: u64,
    /// The first round that failed, and why; it and every later round fail.
    failed: Option<(u64, Error)>,
    /// Async waiters: (round, waiter id, waker), woken when their round is
    /// decided.
    wakers: Vec<(u64, u64, Waker)>,
    /// The id the next registering waiter gets.
    next_waiter: u64,
}

impl Rounds {
    fn outcome(&self, round: u64) -> Option<Result<()>> {
        match &self.failed {
            Some((from, e)) if round >= *from => Some(Err(e.clone())),
            _ if round <= self.durable => Some(Ok(())),
            _ => None,
        }
    }
}

/// Waits for an append to be durable: resolves when the commit round it
/// joined is synced (or has failed).
#[derive(Debug)]
#[must_use = "an append is durable only when its ticket resolves"]
pub struct Ticket(Option<(u64, Arc<Shared>)>);

impl Ticket {
    /// A ticket that is already resolved.
    pub fn ready() -> Self {
        Ticket(None)
    }

    /// Blocks the thread until durable.
    pub fn wait(mut self) -> Result<()> {
        let Some((round, shared)) = self.0.take() else { return Ok(()) };
        if shared.inline {
            commit_inline(&shared, round);
        } else {
            lead(&shared, round);
        }
        let mut r = shared.rounds.lock();
        loop {
            if let Some(outcome) = r.outcome(round) {
                return outcome;
            }
            shared.decided.wait(&mut r);
        }
    }

    /// Resolves when durable. Its first poll may commit the round on the
    /// polling thread: under `Sync` when it leads (see the module docs), and
    /// always when the committer is inline (which may also wait there for
    /// an earlier round to finish).
    pub fn resolved(mut self) -> TicketFuture {
        TicketFuture { ticket: self.0.take(), waiter: None, lead: true }
    }

    /// As [`Ticket::resolved`], but a round left to this waiter is handed
    /// to the commit thread instead of being committed on the polling
    /// thread (an inline committer still commits there). For a waiter on an
    /// async worker that must not block it for a sync: a consumer's batched
    /// settles, whose worker goes on handing out the next batch meanwhile.
    pub fn resolved_unled(mut self) -> TicketFuture {
        TicketFuture { ticket: self.0.take(), waiter: None, lead: false }
    }
}

impl Drop for Ticket {
    /// A job is committed even when its ticket is dropped unawaited
    /// (`Batched` drops its tickets): inline, on the dropping thread; under
    /// `Sync`, by the commit thread, which the drop wakes (its submit may
    /// have left the round to this waiter). Nothing written stays
    /// unpublished.
    fn drop(&mut self) {
        if let Some((round, shared)) = self.0.take() {
            settle_unawaited(&shared, round);
        }
    }
}

/// A ticket dropped before it resolved: its job is committed all the same,
/// by this thread (inline) or by the commit thread, which a `Sync` submit
/// left to its waiter to call.
fn settle_unawaited(shared: &Shared, round: u64) {
    if shared.inline {
        commit_inline(shared, round);
    } else if shared.leads() {
        shared.wake.notify_one();
    }
}

/// The future of [`Ticket::resolved`].
#[derive(Debug)]
pub struct TicketFuture {
    ticket: Option<(u64, Arc<Shared>)>,
    /// Set once registered, so a re-poll replaces its waker instead of
    /// adding another.
    waiter: Option<u64>,
    /// May commit a round left to it on the polling thread (see
    /// [`Ticket::resolved_unled`]).
    lead: bool,
}

impl Drop for TicketFuture {
    /// See `Drop for Ticket`: a future dropped before it resolved still has
    /// its job committed.
    fn drop(&mut self) {
        if let Some((round, shared)) = self.ticket.take() {
            settle_unawaited(&shared, round);
        }
    }
}

impl Future for TicketFuture {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let Some((round, shared)) = &this.ticket else { return Poll::Ready(Ok(())) };
        if shared.inline {
            commit_inline(shared, *round);
        } else if this.waiter.is_none() {
            if this.lead {
                lead(shared, *round);
            } else if shared.leads() {
                // The submit may have left the round to this waiter.
                shared.wake.notify_one();
            }
        }
        let mut r = shared.rounds.lock();
        if let Some(outcome) = r.outcome(*round) {
            return Poll::Ready(outcome);
        }
        let waker = cx.waker().clone();
        match this.waiter {
            Some(id) => match r.wakers.iter_mut().find(|(_, w, _)| *w == id) {
                Some(slot) => slot.2 = waker,
                None => r.wakers.push((*round, id, waker)),
            },
            None => {
                let id = r.next_waiter;
                r.next_waiter += 1;
                this.waiter = Some(id);
                r.wakers.push((*round, id, waker));
            }
        }
        Poll::Pending
    }
}

#[derive(Default)]
struct Queue {
    /// The round that queued jobs join.
    open: u64,
    jobs: Vec<Job>,
    first_at: Option<Instant>,
    shutdown: bool,
    /// A round is being committed (by the commit thread or a leader).
    busy: bool,
    /// One of the last [`LONE_ROUNDS`] rounds taken held more than one job:
    /// writers are many, so their rounds go to the commit thread, which
    /// syncs while the callers' threads go on producing the next round.
    crowded: bool,
    /// Rounds of at most one job taken in a row (saturating).
    lone_streak: u8,
    /// The commit thread is parked, waiting to be called.
    parked: bool,
}

/// Rounds of a single job in a row after which waiters lead again.
const LONE_ROUNDS: u8 = 4;

/// State shared by the commit thread, writers and tickets.
pub struct Shared {
    /// True while jobs are queued, readable without a lock (for the spin).
    queued: AtomicBool,
    queue: Mutex<Queue>,
    wake: Condvar,
    rounds: Mutex<Rounds>,
    decided: Condvar,
    poison: Arc<Poison>,
    durability: Durability,
    /// No commit thread: rounds are committed by the threads that wait on
    /// (or drop) their tickets (`EngineOptions::inline_io`).
    inline: bool,
    /// The threads that sync a round's other files (see [`sync_all`]),
    /// started with its first round of several files.
    syncers: std::sync::OnceLock<Syncers>,
}

impl Shared {
    /// True when waiters lead (see the module docs): under `Sync`, with a
    /// commit thread.
    fn leads(&self) -> bool {
        !self.inline && self.durability == Durability::Sync
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("durability", &self.durability).finish()
    }
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
        Committer::new(durability, poison, false)
    }

    /// A committer without a thread: each round is committed by the first
    /// thread that waits on (or drops) a ticket of it, on that thread. No
    /// hand-off between threads, no batching of concurrent callers beyond
    /// what is queued when a waiter comes, and no background sync (under
    /// `Batched` a job is committed when its ticket is dropped, at once).
    pub fn inline(durability: Durability, poison: Arc<Poison>) -> Result<Self> {
        Committer::new(durability, poison, true)
    }

    fn new(durability: Durability, poison: Arc<Poison>, inline: bool) -> Result<Self> {
        let shared = Arc::new(Shared {
            queued: AtomicBool::new(false),
            queue: Mutex::new(Queue { open: 1, lone_streak: LONE_ROUNDS, ..Queue::default() }),
            wake: Condvar::new(),
            rounds: Mutex::new(Rounds::default()),
            decided: Condvar::new(),
            poison,
            durability,
            inline,
            syncers: std::sync::OnceLock::new(),
        });
        if inline {
            return Ok(Committer { shared, thread: Mutex::new(None) });
        }
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rheo-commit".into())
            .spawn(move || run(&s))
            .map_err(|e| Error::failed("start commit thread", e.to_string()))?;
        Ok(Committer { shared, thread: Mutex::new(Some(thread)) })
    }

    /// Queues a job into the open round; the ticket resolves when that round
    /// is durable.
    pub fn submit(&self, job: Job) -> Ticket {
        let mut q = self.shared.queue.lock();
        if q.first_at.is_none() {
            q.first_at = Some(Instant::now());
        }
        let round = q.open;
        let was_idle = q.jobs.is_empty();
        // A lone writer's waiter leads (see `lead`); the commit thread is
        // called only for rounds that are not left to a leader.
        let leader = self.shared.leads() && !q.busy && !q.crowded;
        q.jobs.push(job);
        self.shared.queued.store(true, Ordering::Release);
        drop(q);
        if was_idle && !leader {
            self.shared.wake.notify_one();
        }
        Ticket(Some((round, self.shared.clone())))
    }

    /// Stops the thread after it has committed every queued job.
    pub fn shutdown(&self) {
        if self.shared.inline {
            let open = self.shared.queue.lock().open;
            commit_inline(&self.shared, open);
        }
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
        let (round, jobs) = {
            let mut q = s.queue.lock();
            loop {
                if !q.jobs.is_empty() && !q.busy {
                    if let (Durability::Batched { max_delay }, Some(first), false) =
                        (s.durability, q.first_at, q.shutdown)
                    {
                        let due = first.checked_add(max_delay).unwrap_or(first);
                        if Instant::now() < due {
                            s.wake.wait_until(&mut q, due);
                            continue;
                        }
                    }
                    break;
                }
                if q.shutdown && !q.busy {
                    return;
                }
                if q.crowded && !q.busy {
                    // Many writers re-submit right after their wake-up: spin a
                    // little before parking so their next round starts at once.
                    // (A lone writer leads its own rounds: no spin for it.)
                    drop(q);
                    let spin_until = Instant::now() + SPIN;
                    while !s.queued.load(Ordering::Acquire) && Instant::now() < spin_until {
                        std::hint::spin_loop();
                    }
                    q = s.queue.lock();
                    if !q.jobs.is_empty() || q.shutdown {
                        continue;
                    }
                }
                q.parked = true;
                s.wake.wait(&mut q);
                q.parked = false;
            }
            take_round(s, &mut q)
        };
        commit_round(s, round, &jobs);
    }
}

/// Commits a round taken with [`take_round`], then clears `busy`: also when
/// committing panics (a waker, a bug), which poisons the engine and fails
/// the round instead of leaving every later round waiting for `busy`.
fn commit_round(s: &Shared, round: u64, jobs: &[Job]) {
    let _done = Committing { s, round };
    decide(s, round, jobs);
}

/// Clears `busy` when the committer of `round` is done (see [`commit_round`]).
struct Committing<'a> {
    s: &'a Shared,
    round: u64,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        let s = self.s;
        if std::thread::panicking() {
            let reason = format!("a panic while committing round {}", self.round);
            s.poison.set(reason.clone());
            let wakers = {
                let mut r = s.rounds.lock();
                if r.failed.is_none() {
                    r.failed = Some((self.round, Error::Poisoned { scope: "storage".into(), reason, source: None }));
                }
                std::mem::take(&mut r.wakers)
            };
            s.decided.notify_all();
            wakers.into_iter().for_each(|(_, _, w)| w.wake());
        }
        let mut q = s.queue.lock();
        q.busy = false;
        // Inline waiters wait for `busy` to clear; the commit thread, for the
        // jobs queued meanwhile (a lone leader's round wakes nobody).
        let more = s.inline || !q.jobs.is_empty() || q.shutdown;
        drop(q);
        if more {
            s.wake.notify_all();
        }
    }
}

/// Takes the open round's jobs to commit them (the queue marked busy).
fn take_round(s: &Shared, q: &mut Queue) -> (u64, Vec<Job>) {
    let round = q.open;
    s.queued.store(false, Ordering::Release);
    q.open += 1;
    q.busy = true;
    q.lone_streak = if q.jobs.len() > 1 { 0 } else { q.lone_streak.saturating_add(1) };
    q.crowded = q.lone_streak < LONE_ROUNDS;
    q.first_at = None;
    (round, std::mem::take(&mut q.jobs))
}

/// A `Sync` waiter of `round` commits it on this thread when the round is
/// still queued, no round is being committed and the queue is not crowded.
/// Otherwise it leaves the round to whoever is committing, which takes the
/// queue when done (a leader wakes the commit thread for it), or to the
/// commit thread, which a crowded queue's submit woke. A waiter whose
/// submit found the queue busy (and woke the commit thread) may still find
/// the round untaken here and lead it: whoever comes first commits.
fn lead(s: &Shared, round: u64) {
    if !s.leads() {
        return;
    }
    let jobs = {
        let mut q = s.queue.lock();
        if q.busy || q.crowded || q.open != round || q.jobs.is_empty() {
            return;
        }
        take_round(s, &mut q)
    };
    commit_round(s, round, &jobs.1);
}

/// Commits one round's jobs, records the outcome, wakes its waiters.
fn decide(s: &Shared, round: u64, jobs: &[Job]) {
    let outcome = commit(s, jobs);
    let wakers = {
        let mut r = s.rounds.lock();
        match outcome {
            Ok(()) => r.durable = r.durable.max(round),
            Err(e) => {
                if r.failed.is_none() {
                    r.failed = Some((round, e));
                }
            }
        }
        let (ready, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut r.wakers).into_iter().partition(|(w, _, _)| *w <= round);
        r.wakers = waiting;
        ready
    };
    s.decided.notify_all();
    for (_, _, waker) in wakers {
        waker.wake();
    }
}

/// An inline committer's round `round`, committed on this thread unless it
/// already was (or another thread is committing it, in which case the
/// caller waits for its outcome as usual).
fn commit_inline(s: &Shared, round: u64) {
    let jobs = {
        let mut q = s.queue.lock();
        // One round at a time, in order: a later round must not be published
        // (nor reported durable) while an earlier one is still syncing.
        while q.busy {
            s.wake.wait(&mut q);
        }
        if q.open != round {
            return;
        }
        take_round(s, &mut q)
    };
    commit_round(s, round, &jobs.1);
}

/// Syncs every distinct file of the jobs once, commits their transactions,
/// then publishes.
fn commit(s: &Shared, jobs: &[Job]) -> Result<()> {
    s.poison.check("storage")?;
    // One write per partition for everything its writers deferred.
    let mut flushed: Vec<*const ()> = Vec::new();
    let mut files: Vec<Arc<dyn VfsFile>> = Vec::new();
    for p in jobs.iter().flat_map(|j| &j.flush) {
        let key = Arc::as_ptr(p).cast::<()>();
        if flushed.contains(&key) {
            continue;
        }
        flushed.push(key);
        files.push(p.flush().inspect_err(|e| s.poison.set_with(e.to_string(), Some(Arc::new(e.clone()))))?);
    }
    let mut seen: Vec<*const ()> = Vec::new();
    let mut to_sync: Vec<&Arc<dyn VfsFile>> = Vec::new();
    for f in files.iter().chain(jobs.iter().flat_map(|j| &j.files)) {
        let key = Arc::as_ptr(f).cast::<()>();
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        to_sync.push(f);
    }
    sync_all(&s.syncers, &to_sync)
        .map_err(|e| poisoned(s, crate::engine::error::poisoned("storage", "fdatasync failed", e)))?;
    let mut txns: Vec<(&Arc<dyn TxnRecord>, u64)> = Vec::new();
    for (log, txn) in jobs.iter().filter_map(|j| j.txn.as_ref()) {
        match txns.iter_mut().find(|(l, _)| std::ptr::addr_eq(Arc::as_ptr(l), Arc::as_ptr(log))) {
            Some(entry) => entry.1 = entry.1.max(*txn),
            None => txns.push((log, *txn)),
        }
    }
    for (log, txn) in txns {
        log.commit(txn).map_err(|e| {
            let reason = format!("committing transaction {txn}: {e}");
            poisoned(s, Error::Poisoned { scope: "storage".into(), reason, source: Some(Arc::new(e)) })
        })?;
    }
    // A sync elsewhere (a roll's barrier) may have failed meanwhile: publish
    // nothing after a poisoning.
    s.poison.check("storage")?;
    for job in jobs {
        for (p, seq) in &job.publish {
            p.publish(*seq);
        }
    }
    Ok(())
}

/// The most files synced at once (one thread each beyond the first).
const PARALLEL_SYNCS: usize = 8;

/// A file to sync, and where to answer.
type SyncJob = (Arc<dyn VfsFile>, std::sync::mpsc::Sender<std::io::Result<()>>);

/// The threads that sync files beside the committing thread: kept for the
/// committer's life (a round of several files used to start a thread for
/// each, ~3 thread starts per round under many writers); they stop when
/// the committer's state is dropped. The queue is bounded by the callers:
/// one round at a time, at most `PARALLEL_SYNCS - 1` files each.
struct Syncers {
    /// None when no thread could be started: every file is synced by the
    /// committing thread.
    jobs: Option<std::sync::mpsc::Sender<SyncJob>>,
}

impl Syncers {
    fn start() -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<SyncJob>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for _ in 1..PARALLEL_SYNCS {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new().name("rheo-sync".into()).spawn(move || {
                loop {
                    let next = rx.lock().recv();
                    let Ok((file, answer)) = next else { return };
                    // A panic (a bug below) is an answer, and the thread stays.
                    let synced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| file.sync_data()))
                        .unwrap_or_else(|_| Err(std::io::Error::other("a sync thread panicked")));
                    // The file is let go before the round hears it is done.
                    drop(file);
                    let _ = answer.send(synced);
                }
            });
            started += usize::from(spawned.is_ok());
        }
        Syncers { jobs: (started > 0).then_some(tx) }
    }
}

/// Syncs the files, several at once: a round that wrote to several
/// partitions (a multi-partition batch, or writers of several partitions)
/// waits for about one device flush instead of one per file, as the block
/// layer merges flushes that are pending together. The first error is
/// returned after every sync has finished (none is left running).
fn sync_all(syncers: &std::sync::OnceLock<Syncers>, files: &[&Arc<dyn VfsFile>]) -> std::io::Result<()> {
    match files {
        [] => Ok(()),
        [one] => one.sync_data(),
        _ => {
            let syncers = syncers.get_or_init(Syncers::start);
            let mut first_err = None;
            for chunk in files.chunks(PARALLEL_SYNCS) {
                let Some((head, rest)) = chunk.split_first() else { continue };
                let (tx, rx) = std::sync::mpsc::channel();
                let mut handed = 0;
                let mut results = Vec::with_capacity(chunk.len());
                // A panic here (a bug below) unwinds only after the syncs
                // handed out have answered: none is left running.
                let mut panicked = None;
                let mut here =
                    |f: &Arc<dyn VfsFile>| match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        f.sync_data()
                    })) {
                        Ok(r) => Some(r),
                        Err(payload) => {
                            panicked.get_or_insert(payload);
                            None
                        }
                    };
                for f in rest {
                    let sent = syncers.jobs.as_ref().is_some_and(|jobs| jobs.send(((*f).clone(), tx.clone())).is_ok());
                    if sent {
                        handed += 1;
                    } else {
                        // No thread to take it: synced here.
                        results.extend(here(f));
                    }
                }
                drop(tx);
                results.extend(here(head));
                for _ in 0..handed {
                    // A sync thread that died dropped its answer.
                    results.push(rx.recv().unwrap_or_else(|_| Err(std::io::Error::other("a sync thread stopped"))));
                }
                if let Some(payload) = panicked {
                    std::panic::resume_unwind(payload);
                }
                for r in results {
                    if let Err(e) = r {
                        first_err.get_or_insert(e);
                    }
                }
            }
            first_err.map_or(Ok(()), Err)
        }
    }
}

/// Poisons the engine with `e`'s reason (`e` is `Error::Poisoned`) and
/// returns it.
fn poisoned(s: &Shared, e: Error) -> Error {
    s.poison.absorb(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_after_a_poisoning_keeps_its_cause() {
        let poison = Poison::default();
        assert!(poison.check("s").is_ok());
        let full = crate::engine::error::poisoned("d", "fsync failed", std::io::Error::from_raw_os_error(28));
        let _ = poison.absorb(full);
        // A later poisoning does not replace the first cause.
        poison.set("a second failure".into());
        let refused = poison.check("s").expect_err("poisoned");
        assert!(matches!(&refused, Error::Poisoned { reason, .. } if reason.starts_with("fsync failed")), "{refused}");
        assert_eq!(refused.io_error_kind(), Some(std::io::ErrorKind::StorageFull), "{refused}");
    }
    use std::time::Duration;

    /// What a test file's sync does.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum OnSync {
        Succeed,
        /// Fails with EIO (after a short sleep, like a real sync).
        Fail,
        /// Panics (a bug anywhere in a commit).
        Panic,
    }

    /// A file that counts its syncs and does `on_sync` at each.
    #[derive(Debug)]
    struct TestFile {
        syncs: std::sync::atomic::AtomicU32,
        on_sync: OnSync,
        /// The name of the thread that synced it last.
        synced_on: Mutex<Option<String>>,
        /// Syncs that returned.
        finished: std::sync::atomic::AtomicU32,
    }

    impl TestFile {
        fn new(on_sync: OnSync) -> Arc<TestFile> {
            Arc::new(TestFile {
                syncs: std::sync::atomic::AtomicU32::new(0),
                on_sync,
                synced_on: Mutex::new(None),
                finished: std::sync::atomic::AtomicU32::new(0),
            })
        }
    }

    impl VfsFile for TestFile {
        fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<usize> {
            Ok(0)
        }
        fn write_all_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            Ok(0)
        }
        fn set_len(&self, _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.syncs.fetch_add(1, Ordering::SeqCst);
            *self.synced_on.lock() = std::thread::current().name().map(str::to_owned);
            match self.on_sync {
                OnSync::Panic => panic!("sync_data panicked"),
                OnSync::Fail => {
                    std::thread::sleep(Duration::from_millis(5));
                    self.finished.fetch_add(1, Ordering::SeqCst);
                    Err(std::io::Error::from_raw_os_error(5))
                }
                OnSync::Succeed => {
                    std::thread::sleep(Duration::from_millis(5));
                    self.finished.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            }
        }
    }

    #[test]
    fn several_files_are_all_synced_once_and_a_failure_is_reported_after_all() {
        // One set of sync threads for every round, as a committer keeps.
        let syncers = std::sync::OnceLock::new();
        for failing in [None, Some(0), Some(3), Some(11)] {
            let files: Vec<Arc<TestFile>> = (0..12)
                .map(|i| TestFile::new(if Some(i) == failing { OnSync::Fail } else { OnSync::Succeed }))
                .collect();
            let dyns: Vec<Arc<dyn VfsFile>> = files.iter().map(|f| f.clone() as Arc<dyn VfsFile>).collect();
            let refs: Vec<&Arc<dyn VfsFile>> = dyns.iter().collect();
            let result = sync_all(&syncers, &refs);
            assert_eq!(result.is_err(), failing.is_some(), "{failing:?}");
            if let Err(e) = result {
                assert_eq!(e.raw_os_error(), Some(5));
            }
            // Every file was synced exactly once, the failing one included.
            for (i, f) in files.iter().enumerate() {
                assert_eq!(f.syncs.load(Ordering::SeqCst), 1, "{failing:?}: file {i}");
            }
        }
        assert!(sync_all(&syncers, &[]).is_ok());
        // Syncs that panic on the sync threads (every one of them) fail
        // the round after the others finished, and the threads stay to
        // sync the next round.
        for round in 0..2 {
            let files: Vec<Arc<TestFile>> = (0..PARALLEL_SYNCS)
                .map(|i| TestFile::new(if i > 0 && round == 0 { OnSync::Panic } else { OnSync::Succeed }))
                .collect();
            let dyns: Vec<Arc<dyn VfsFile>> = files.iter().map(|f| f.clone() as Arc<dyn VfsFile>).collect();
            let refs: Vec<&Arc<dyn VfsFile>> = dyns.iter().collect();
            let result = sync_all(&syncers, &refs);
            assert_eq!(result.is_err(), round == 0, "round {round}: {result:?}");
            assert!(files.iter().all(|f| f.syncs.load(Ordering::SeqCst) == 1), "round {round}: every file synced once");
            let on_threads =
                files.iter().skip(1).filter(|f| f.synced_on.lock().as_deref() == Some("rheo-sync")).count();
            assert_eq!(
                on_threads,
                PARALLEL_SYNCS - 1,
                "round {round}: the other files were synced by the kept threads"
            );
        }
        // A panic while syncing on the committing thread unwinds only
        // after the syncs handed out have answered.
        let files: Vec<Arc<TestFile>> =
            (0..3).map(|i| TestFile::new(if i == 0 { OnSync::Panic } else { OnSync::Succeed })).collect();
        let dyns: Vec<Arc<dyn VfsFile>> = files.iter().map(|f| f.clone() as Arc<dyn VfsFile>).collect();
        let refs: Vec<&Arc<dyn VfsFile>> = dyns.iter().collect();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sync_all(&syncers, &refs)));
        assert!(unwound.is_err(), "the panic reaches the caller");
        assert!(files.iter().skip(1).all(|f| f.finished.load(Ordering::SeqCst) == 1), "the others finished first");
    }

    #[test]
    fn an_inline_ioter_commits_on_the_waiting_or_dropping_thread() {
        let committer = Committer::inline(Durability::Sync, Arc::new(Poison::default())).expect("inline");
        assert!(committer.thread.lock().is_none(), "no commit thread");
        let first = committer.submit(Job::default());
        let second = committer.submit(Job::default());
        assert_eq!(committer.shared.rounds.lock().durable, 0, "nothing committed before a waiter comes");
        drop(first);
        assert_eq!(committer.shared.rounds.lock().durable, 1, "a dropped ticket commits its round");
        second.wait().expect("the same round, already durable");
        let third = committer.submit(Job::default());
        let mut fut = third.resolved();
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(Pin::new(&mut fut).poll(&mut cx), Poll::Ready(Ok(()))), "the first poll commits");
        assert_eq!(committer.shared.rounds.lock().durable, 2);
        let fourth = committer.submit(Job::default());
        std::mem::forget(fourth);
        committer.shutdown();
        assert_eq!(committer.shared.rounds.lock().durable, 3, "shutdown commits what is queued");
    }

    /// Waits until the commit thread has parked (else, starting up, it
    /// would take a round it was not called for: correct, but not what a
    /// test of leading wants to see).
    fn parked(committer: &Committer) {
        let until = Instant::now() + Duration::from_secs(10);
        while !committer.shared.queue.lock().parked {
            assert!(Instant::now() < until, "the commit thread never parked");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_lone_sync_waiter_leads_and_a_dropped_ticket_still_commits() {
        let committer = Committer::start(Durability::Sync, Arc::new(Poison::default())).expect("start");
        parked(&committer);
        let ticket = committer.submit(Job::default());
        {
            let q = committer.shared.queue.lock();
            assert!(!q.busy && q.jobs.len() == 1, "a lone writer's round waits for its waiter");
        }
        ticket.wait().expect("durable");
        assert_eq!(committer.shared.rounds.lock().durable, 1);
        // Unawaited: the commit thread is called and commits it.
        drop(committer.submit(Job::default()));
        let until = Instant::now() + Duration::from_secs(10);
        while committer.shared.rounds.lock().durable < 2 {
            assert!(Instant::now() < until, "a dropped ticket's round was never committed");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Many jobs in one round: the next rounds go to the commit thread.
        let tickets: Vec<_> = (0..3).map(|_| committer.submit(Job::default())).collect();
        tickets.into_iter().for_each(|t| t.wait().expect("durable"));
        assert!(committer.shared.queue.lock().crowded, "a round of 3 jobs marks the queue crowded");
        let t = committer.submit(Job::default());
        assert!(t.wait().is_ok(), "a crowded queue's round is committed by the commit thread");
        committer.shutdown();
    }

    #[test]
    fn an_unled_waiter_hands_its_round_to_the_commit_thread() {
        let committer = Committer::start(Durability::Sync, Arc::new(Poison::default())).expect("start");
        let file = TestFile::new(OnSync::Succeed);
        let job = || Job { files: smallvec::smallvec![file.clone() as Arc<dyn VfsFile>], ..Job::default() };
        let mut cx = Context::from_waker(Waker::noop());
        // A lone waiter that leads syncs (5 ms) within its first poll.
        parked(&committer);
        let mut led = committer.submit(job()).resolved();
        assert!(matches!(Pin::new(&mut led).poll(&mut cx), Poll::Ready(Ok(()))), "a leader commits in its poll");
        // One that may not lead returns at once; the commit thread syncs.
        parked(&committer);
        let mut unled = committer.submit(job()).resolved_unled();
        assert!(Pin::new(&mut unled).poll(&mut cx).is_pending(), "an unled waiter does not sync in its poll");
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match Pin::new(&mut unled).poll(&mut cx) {
                Poll::Ready(r) => break r.expect("durable"),
                Poll::Pending => assert!(Instant::now() < until, "the commit thread never committed the round"),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(committer.shared.rounds.lock().durable, 2);
        assert_eq!(file.syncs.load(Ordering::SeqCst), 2, "one sync per round");
        committer.shutdown();
    }

    #[test]
    fn a_panic_while_leading_fails_the_round_and_poisons_instead_of_hanging() {
        let committer = Committer::start(Durability::Sync, Arc::new(Poison::default())).expect("start");
        parked(&committer);
        let file: Arc<dyn VfsFile> = TestFile::new(OnSync::Panic);
        let job = Job { files: smallvec::smallvec![file], ..Job::default() };
        let ticket = committer.submit(job);
        let led = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ticket.wait()));
        assert!(led.is_err(), "the leader's commit panicked");
        assert!(!committer.shared.queue.lock().busy, "busy is cleared on unwind");
        assert!(committer.shared.poison.reason().is_some_and(|r| r.contains("panic")));
        // Later rounds are decided (failed by the poison), not left waiting.
        let err = committer.submit(Job::default()).wait().expect_err("poisoned");
        assert!(matches!(err, Error::Poisoned { .. }), "{err}");
        committer.shutdown();
    }

    #[test]
    fn concurrent_inline_waiters_all_commit_and_leave_the_queue_idle() {
        let committer = Arc::new(Committer::inline(Durability::Sync, Arc::new(Poison::default())).expect("inline"));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = committer.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let t = c.submit(Job::default());
                        let round = t.0.as_ref().map(|(r, _)| *r).expect("a real ticket");
                        t.wait().expect("durable");
                        assert!(c.shared.rounds.lock().durable >= round);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no panic");
        }
        assert!(!committer.shared.queue.lock().busy);
    }

    #[test]
    fn a_ticket_polled_again_keeps_one_waker() {
        let poison = Arc::new(Poison::default());
        let committer =
            Committer::start(Durability::Batched { max_delay: Duration::from_secs(30) }, poison).expect("start");
        let mut fut = committer.submit(Job::default()).resolved();
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..5 {
            assert!(Pin::new(&mut fut).poll(&mut cx).is_pending(), "the round waits for max_delay");
        }
        let shared = fut.ticket.as_ref().map(|(_, s)| s.clone()).expect("a real ticket");
        assert_eq!(shared.rounds.lock().wakers.len(), 1);
        committer.shutdown();
        assert!(matches!(Pin::new(&mut fut).poll(&mut cx), Poll::Ready(Ok(()))), "shutdown commits queued jobs");
    }
}
