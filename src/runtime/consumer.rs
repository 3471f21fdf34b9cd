//! [`Rheo::consumer`](crate::Rheo::consumer): a managed consumer of one group.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::settle::{SettleOp, Stats, run_settler};
use super::stream::{LeaseStream, LeaseStreamOptions, StreamLease, release_all};
use super::{DEFAULT_CONCURRENCY, DEFAULT_DRAIN_TIMEOUT, Handler, Outcome, SETTLE_BATCH_MAX, panic_message};
use crate::backend::keeping_the_worker_free;
use crate::client::Rheo;
use crate::error::{Error, Result};
use crate::model::limits::MAX_LIMIT;

impl Rheo {
    /// A managed consumer of `group` on `stream`, with the defaults of
    /// `docs/semantics.md`: concurrency 1, max_demand 10, lease 30 s, poll 200 ms,
    /// drain timeout 5 s.
    ///
    /// ```
    /// # async fn f(rheo: &rheo::Rheo) -> rheo::Result<()> {
    /// use std::time::Duration;
    /// let handle = rheo.consumer("orders", "billing")
    ///     .concurrency(8)
    ///     .max_demand(100)
    ///     .lease(Duration::from_secs(10))
    ///     .spawn(rheo::handler_fn(|_lease| async { rheo::Outcome::Ack }))
    ///     .await?;
    /// let summary = handle.shutdown().await?;
    /// println!("acked {}", summary.acked);
    /// # Ok(()) }
    /// ```
    pub fn consumer(&self, stream: impl Into<String>, group: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder {
            rheo: self.clone(),
            stream: stream.into(),
            group: group.into(),
            concurrency: DEFAULT_CONCURRENCY,
            leases: LeaseStreamOptions::default(),
            retry_backoff: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// Settings of a consumer ([`Rheo::consumer`](crate::Rheo::consumer)); [`ConsumerBuilder::spawn`] starts it.
#[derive(Debug, Clone)]
pub struct ConsumerBuilder {
    rheo: Rheo,
    stream: String,
    group: String,
    concurrency: usize,
    /// The fetch loop's settings: `max_demand`, `lease`, `poll`,
    /// `partitions`, `consumer_id`.
    leases: LeaseStreamOptions,
    retry_backoff: Option<Duration>,
    drain_timeout: Duration,
}

impl ConsumerBuilder {
    /// Handlers running at once (default 1, at most [`MAX_LIMIT`]); never
    /// more than `max_demand`, which bounds the leases held (raise both).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }
    /// Leases held at once, fetched and not yet settled (default 10): the
    /// runtime fetches ahead up to this many while `concurrency` handlers
    /// run, so a fetch (and its sync) is shared by many events; a fetch asks
    /// for at most half, so one batch is handled while the other settles. Leases
    /// waiting for a handler are renewed like running ones.
    pub fn max_demand(self, n: usize) -> Self {
        self.with_leases(|o| o.max_demand(n))
    }
    /// Lease duration of each fetch (default 30 s); renewed every half.
    pub fn lease(self, d: Duration) -> Self {
        self.with_leases(|o| o.lease(d))
    }
    /// Longest idle wait between fetches when no wakeup comes (default 200 ms).
    pub fn poll(self, d: Duration) -> Self {
        self.with_leases(|o| o.poll(d))
    }
    /// Consume only these partitions (default: all of the group's).
    pub fn partitions(self, partitions: impl Into<Vec<u32>>) -> Self {
        self.with_leases(|o| o.partitions(partitions))
    }
    /// The consumer id of the fetches (default: the handle's).
    pub fn consumer_id(self, id: impl Into<String>) -> Self {
        self.with_leases(|o| o.consumer_id(id))
    }
    fn with_leases(mut self, set: impl FnOnce(LeaseStreamOptions) -> LeaseStreamOptions) -> Self {
        self.leases = set(std::mem::take(&mut self.leases));
        self
    }
    /// Delay before a delivery given back by [`Outcome::Retry`] (or a
    /// panic) is claimable again (default: the group's backoff).
    pub fn retry_backoff(mut self, d: Duration) -> Self {
        self.retry_backoff = Some(d);
        self
    }
    /// How long [`ConsumerHandle::shutdown`] waits for in-flight handlers and
    /// pending settles (default 5 s).
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    fn check(&self) -> Result<()> {
        let (stream, group) = (&self.stream, &self.group);
        self.leases.check(stream, group)?;
        let day = crate::model::limits::MAX_LEASE;
        for (name, d) in [("drain_timeout", Some(self.drain_timeout)), ("retry_backoff", self.retry_backoff)] {
            if d.is_some_and(|d| d > day) {
                return Err(Error::invalid(name, format!("{d:?} for {stream:?}/{group:?} is above 24h")));
            }
        }
        if self.concurrency == 0 || self.concurrency > MAX_LIMIT {
            return Err(Error::invalid(
                "concurrency",
                format!("{} for {:?}/{:?} is outside 1..={MAX_LIMIT}", self.concurrency, self.stream, self.group),
            ));
        }
        Ok(())
    }

    /// Checks the settings and that the group exists, runs the handler's
    /// `setup`, then starts consuming in background tasks (needs a Tokio
    /// runtime with the time driver).
    pub async fn spawn<H: Handler>(self, handler: H) -> Result<ConsumerHandle> {
        self.check()?;
        // The group (and the partitions asked for) must exist: a definite
        // error now, not warnings from every fetch later.
        match &self.leases.partitions {
            Some(p) => self.rheo.lag_of(&self.stream, &self.group, p).await?,
            None => self.rheo.lag(&self.stream, &self.group).await?,
        };
        handler.setup().await?;
        let stats = Arc::new(Stats::default());
        // The fetch loop: the lease stream holds at most `max_demand` leases
        // (fetched ahead, running, or waiting for their settle) and renews
        // them; `concurrency` workers (at most `max_demand`) run handlers.
        let leases = LeaseStream::counted(&self.rheo, &self.stream, &self.group, self.leases.clone(), stats.clone())?;
        let (settle_tx, settle_rx) = mpsc::channel(SETTLE_BATCH_MAX * 4);
        let settling = run_settler(self.rheo.clone(), settle_rx, stats.clone(), SETTLE_BATCH_MAX);
        let settler = tokio::spawn(keeping_the_worker_free(settling));
        let (stop_tx, stop_rx) = watch::channel(false);
        let ctx = Arc::new(Running {
            handling: AtomicUsize::new(0),
            stop: stop_rx.clone(),
            handler: Arc::new(handler),
            settle_tx,
            stats: stats.clone(),
            config: self,
        });
        let task = tokio::spawn(run(ctx, leases, stop_rx, settler));
        Ok(ConsumerHandle { stop: stop_tx, task, stats })
    }
}

/// A running consumer ([`Rheo::consumer`](crate::Rheo::consumer)). Dropping it stops fetching and lets the
/// drain finish in the background; [`ConsumerHandle::shutdown`] waits for it.
#[derive(Debug)]
pub struct ConsumerHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<RunSummary>,
    stats: Arc<Stats>,
}

/// What a consumer ([`Rheo::consumer`](crate::Rheo::consumer)) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunSummary {
    /// Leases fetched.
    pub fetched: u64,
    /// Deliveries acknowledged.
    pub acked: u64,
    /// Deliveries given back (handler retries, panics, nacks after a failed ack).
    pub retried: u64,
    /// Deliveries dead-lettered (rejects, and retries past `max_attempts`).
    pub dead_lettered: u64,
    /// Handlers that panicked (each also counted as a retry).
    pub panicked: u64,
    /// Leases lost: a renew or settle said the lease no longer held it.
    pub lost: u64,
    /// Leases left to expire: an ambiguous or failed settle, or a handler
    /// still running at the end of the drain.
    pub left_to_expiry: u64,
    /// Fetches that failed (each followed by a backoff).
    pub fetch_errors: u64,
    /// `ack_many` calls made.
    pub ack_batches: u64,
    /// Due positions fetches could not deliver because their records can't
    /// be read, counted at every fetch that met them (each is logged once;
    /// the consumer goes on with the rest: see `Rheo::fetch_report`).
    pub damaged: u64,
}

impl RunSummary {
    fn of(s: &Stats) -> Self {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        RunSummary {
            fetched: get(&s.fetched),
            acked: get(&s.acked),
            retried: get(&s.retried),
            dead_lettered: get(&s.dead_lettered),
            panicked: get(&s.panicked),
            lost: get(&s.lost),
            left_to_expiry: get(&s.left_to_expiry),
            fetch_errors: get(&s.fetch_errors),
            ack_batches: get(&s.ack_batches),
            damaged: get(&s.damaged),
        }
    }
}

impl ConsumerHandle {
    /// The counts so far.
    pub fn summary(&self) -> RunSummary {
        RunSummary::of(&self.stats)
    }

    /// Stops fetching, waits for in-flight handlers and pending settles (up
    /// to the drain timeout; what is left then expires), and returns the
    /// final counts.
    pub async fn shutdown(self) -> Result<RunSummary> {
        // A send error means the run already ended: nothing to stop.
        let _ = self.stop.send(true);
        self.task.await.map_err(|e| Error::failed("group shutdown", format!("consumer task ended abnormally: {e}")))
    }
}

struct Running {
    /// Handlers running now (a handler whose lease was found lost, or
    /// that returned and waits to queue its settle, is not counted).
    handling: AtomicUsize,
    /// Set when a shutdown is asked.
    stop: watch::Receiver<bool>,
    config: ConsumerBuilder,
    handler: Arc<dyn Handler>,
    settle_tx: mpsc::Sender<SettleOp>,
    stats: Arc<Stats>,
}

/// Resolves when a stop is asked (or the handle is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // An error means the handle was dropped: stop as well.
    let _ = stop.wait_for(|s| *s).await;
}

/// The fetch loop hands each lease the stream yields to `concurrency`
/// handler workers until a stop is asked; then what was fetched and not yet
/// handed out is released, and the rest drained.
async fn run(
    ctx: Arc<Running>,
    mut leases: LeaseStream,
    mut stop: watch::Receiver<bool>,
    settler: tokio::task::JoinHandle<()>,
) -> RunSummary {
    // Workers take leases from one queue: a lease goes to a worker that is
    // free, with no task spawned per lease. The stream bounds what is held
    // to `max_demand`, so the queue never fills. More workers than
    // `max_demand` would only wait.
    let (tx, rx) = mpsc::channel(ctx.config.leases.max_demand);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let workers = ctx.config.concurrency.min(ctx.config.leases.max_demand);
    let mut tasks = JoinSet::new();
    for _ in 0..workers {
        tasks.spawn(worker(ctx.clone(), rx.clone()));
    }
    loop {
        let next = tokio::select! {
            biased;
            // A fetch in flight is abandoned: what it leased expires.
            _ = stopped(&mut stop) => break,
            next = leases.next() => next,
        };
        match next {
            Some(Ok(lease)) => {
                // The queue holds at most what the stream holds, so this
                // waits only for a free slot, and fails only once the queue
                // is closed, which `run` does after this loop.
                if let Err(mpsc::error::SendError(lease)) = tx.send(lease).await {
                    release_all(vec![lease]).await;
                    break;
                }
            }
            // Counted and logged by the stream, which backs off and goes on.
            Some(Err(_)) => {}
            None => break,
        }
    }
    let deadline = Instant::now() + ctx.config.drain_timeout;
    // Workers take no lease after the stop: what is queued or buffered
    // never started.
    drop(tx);
    let mut unstarted = leases.take_buffered();
    drop(leases);
    {
        let mut rx = rx.lock().await;
        rx.close();
        while let Ok(lease) = rx.try_recv() {
            unstarted.push(lease);
        }
    }
    // One found lost while it waited is another consumer's: not released.
    let before = unstarted.len();
    let unstarted: Vec<_> = unstarted.into_iter().filter_map(|mut l| (!l.is_lost()).then_some(l)).collect();
    Stats::add(&ctx.stats.lost, (before - unstarted.len()) as u64);
    Stats::add(&ctx.stats.left_to_expiry, unstarted.len() as u64);
    // One `renew_many` gives them back; a backend that does not answer by
    // the drain's deadline leaves them to expire.
    if tokio::time::timeout_at(deadline, release_all(unstarted)).await.is_err() {
        tracing::warn!(stream = %ctx.config.stream, group = %ctx.config.group,
            "drain timeout: leases fetched ahead were left to expire, not released");
    }
    drain(ctx, deadline, tasks, settler).await
}

/// Takes the next lease from the queue and handles it, until a stop is
/// asked or the queue closes.
async fn worker(ctx: Arc<Running>, leases: Arc<tokio::sync::Mutex<mpsc::Receiver<StreamLease>>>) {
    let mut stop = ctx.stop.clone();
    loop {
        let next = tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            next = async { leases.lock().await.recv().await } => next,
        };
        let Some(lease) = next else { return };
        run_handler(&ctx, lease).await;
    }
}

/// A handler counted in [`Running::handling`] until [`Handling::stop`] (or
/// its drop).
struct Handling<'a> {
    count: &'a AtomicUsize,
    stopped: bool,
}

impl<'a> Handling<'a> {
    fn start(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Handling { count, stopped: false }
    }
    fn stop(&mut self) {
        if !std::mem::replace(&mut self.stopped, true) {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long queued settles may still run once the drain timeout is spent.
const SETTLE_GRACE: Duration = Duration::from_secs(1);

async fn drain(
    ctx: Arc<Running>,
    deadline: Instant,
    mut tasks: JoinSet<()>,
    mut settler: tokio::task::JoinHandle<()>,
) -> RunSummary {
    let stats = ctx.stats.clone();
    let handlers_done = tokio::time::timeout_at(deadline, async { while tasks.join_next().await.is_some() {} }).await;
    if handlers_done.is_err() {
        let abandoned = ctx.handling.load(Ordering::Acquire) as u64;
        tracing::warn!("drain timeout: {abandoned} handlers still running; their leases are left to expire");
        Stats::add(&stats.left_to_expiry, abandoned);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    // The settler ends once every sender (this one and the workers') is gone.
    drop(ctx);
    // Settles already queued get a moment even when the handlers used up
    // the drain timeout: they are finished work.
    let settle_deadline = deadline.max(Instant::now() + SETTLE_GRACE);
    if tokio::time::timeout_at(settle_deadline, &mut settler).await.is_err() {
        let abandoned = stats.queued.load(Ordering::Acquire);
        tracing::warn!("drain timeout: {abandoned} pending settles abandoned; their leases are left to expire");
        Stats::add(&stats.left_to_expiry, abandoned);
        settler.abort();
    }
    RunSummary::of(&stats)
}

/// Runs the handler on one lease (renewed by the stream meanwhile), then
/// queues its settle; the lease keeps its demand slot and its renewal until
/// the settle is done. A lease lost before it starts is not handled, one
/// lost while it runs is not settled (another consumer has it).
async fn run_handler(ctx: &Running, mut lease: StreamLease) {
    let cfg = &ctx.config;
    let started = AtomicBool::new(false);
    // Counted as running (for the drain) until its handler returns or its
    // lease is found lost, whichever comes first.
    let mut running = Handling::start(&ctx.handling);
    let mut lost = lease.take_lost_notice();
    let result = {
        let lease = &*lease;
        let handling = AssertUnwindSafe(async {
            started.store(true, Ordering::Release);
            ctx.handler.handle(lease).await
        })
        .catch_unwind();
        tokio::pin!(handling);
        let renewing = async {
            match &mut lost {
                Some(notice) => notice.lost().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(renewing);
        let mut held = true;
        let result = loop {
            tokio::select! {
                // The notice first: a lease found lost while it waited in
                // the stream's buffer is never handled.
                biased;
                () = &mut renewing, if held => {
                    held = false;
                    running.stop();
                    Stats::add(&ctx.stats.lost, 1);
                    if !started.load(Ordering::Acquire) {
                        return; // another consumer has it: do not run the handler
                    }
                }
                r = &mut handling => break r,
            }
        };
        running.stop();
        if !held {
            return;
        }
        result
    };
    let outcome = match result {
        Ok(Outcome::Retry(reason)) => match cfg.retry_backoff {
            Some(d) => Outcome::RetryAfter(reason, d),
            None => Outcome::Retry(reason),
        },
        Ok(outcome) => outcome,
        Err(panic) => {
            Stats::add(&ctx.stats.panicked, 1);
            let reason = format!("handler_panic: {}", panic_message(&*panic));
            match cfg.retry_backoff {
                Some(d) => Outcome::RetryAfter(reason, d),
                None => Outcome::Retry(reason),
            }
        }
    };
    Stats::add(&ctx.stats.queued, 1);
    if ctx.settle_tx.send(SettleOp { lease, outcome }).await.is_err() {
        ctx.stats.queued.fetch_sub(1, Ordering::AcqRel);
        Stats::add(&ctx.stats.left_to_expiry, 1);
    }
}
