//! [`LeaseStream`]: leases as a `futures::Stream`, bounded and renewed.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::task::AtomicWaker;
use futures::{FutureExt, Stream};

use tokio::time::Instant;

use super::renew::{AbortOnDrop, LostNotice, Renewals, run_renewer};
use super::settle::{Stats, settle};
use super::{DEFAULT_LEASE, DEFAULT_MAX_DEMAND, DEFAULT_POLL, ErrorBackoff, MIN_RENEW_INTERVAL, Outcome, Settled};
use crate::backend::{Subscription, keeping_the_worker_free};
use crate::client::Rheo;
use crate::error::{Error, ObjectKind, Result};
use crate::model::group::FetchOptions;
use crate::model::lease::{Lease, LeaseRef, RetryOutcome};
use crate::model::limits::{MAX_BATCH_EVENTS, MAX_LEASE, MAX_LIMIT, validate_name};

/// Settings of a [`LeaseStream`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LeaseStreamOptions {
    /// Leases outstanding (yielded or buffered, not yet settled or dropped)
    /// at most (default 10). A fetch asks for at most half of it, so that
    /// one batch is handled while the settles of the other are made.
    pub max_demand: usize,
    /// Lease duration of each fetch (default 30 s); renewed every half.
    pub lease: Duration,
    /// Longest idle wait between fetches when no wakeup comes (default 200 ms).
    pub poll: Duration,
    /// Consume only these partitions (default: all of the group's).
    pub partitions: Option<Vec<u32>>,
    /// The consumer id of the fetches (default: the handle's).
    pub consumer_id: Option<String>,
}

impl Default for LeaseStreamOptions {
    fn default() -> Self {
        LeaseStreamOptions {
            max_demand: DEFAULT_MAX_DEMAND,
            lease: DEFAULT_LEASE,
            poll: DEFAULT_POLL,
            partitions: None,
            consumer_id: None,
        }
    }
}

impl LeaseStreamOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets `max_demand`.
    pub fn max_demand(mut self, n: usize) -> Self {
        self.max_demand = n;
        self
    }
    /// Sets the lease duration.
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }
    /// Sets the idle poll interval.
    pub fn poll(mut self, d: Duration) -> Self {
        self.poll = d;
        self
    }
    /// Restricts to these partitions.
    pub fn partitions(mut self, partitions: impl Into<Vec<u32>>) -> Self {
        self.partitions = Some(partitions.into());
        self
    }
    /// Sets the consumer id.
    pub fn consumer_id(mut self, id: impl Into<String>) -> Self {
        self.consumer_id = Some(id.into());
        self
    }

    /// Checks the settings for a stream of `group` on `stream`: the names,
    /// `max_demand` within 1..=`MAX_LIMIT`, a lease of at least twice the
    /// shortest renewal interval and at most 24 h, a poll interval above
    /// zero and at most 24 h.
    pub(crate) fn check(&self, stream: &str, group: &str) -> Result<()> {
        validate_name(ObjectKind::Stream, stream)?;
        validate_name(ObjectKind::Group, group)?;
        if let Some(id) = &self.consumer_id {
            validate_name(ObjectKind::Consumer, id)?;
        }
        if self.max_demand == 0 || self.max_demand > MAX_LIMIT {
            return Err(Error::invalid(
                "max_demand",
                format!("{} for {stream:?}/{group:?} is outside 1..={MAX_LIMIT}", self.max_demand),
            ));
        }
        if self.lease.is_zero() || self.lease > MAX_LEASE {
            return Err(Error::invalid(
                "lease",
                format!("{:?} for {stream:?}/{group:?} is outside (0, 24h]", self.lease),
            ));
        }
        if self.lease < 2 * MIN_RENEW_INTERVAL {
            return Err(Error::invalid(
                "lease",
                format!(
                    "{:?} for {stream:?}/{group:?}: renewals are at least {MIN_RENEW_INTERVAL:?} apart, so a lease must be at least twice that",
                    self.lease
                ),
            ));
        }
        if self.poll.is_zero() || self.poll > MAX_LEASE {
            return Err(Error::invalid(
                "poll",
                format!("{:?} for {stream:?}/{group:?} is outside (0, 24h]", self.poll),
            ));
        }
        Ok(())
    }
}

/// How often an idle stream refreshes its group's lag and in-flight gauges.
const GAUGE_REFRESH: Duration = Duration::from_secs(1);

/// State shared by the stream, its leases and the renewal task.
#[derive(Debug)]
struct Shared {
    rheo: Rheo,
    outstanding: AtomicUsize,
    waker: AtomicWaker,
    /// The leases buffered or yielded and not yet settled or dropped.
    renewals: Arc<Renewals>,
    /// What the stream did (read by a managed consumer's summary).
    stats: Arc<Stats>,
    /// Renews `renewals`; ends with the last of the stream and its leases.
    _renewer: AbortOnDrop,
}

/// What a fetch gave: the leases, and whether it set scheduled events
/// aside (it may have stopped at its budget for them).
type Fetched = (Vec<Lease>, bool);

enum State {
    Idle,
    /// A fetch in flight; the first one subscribes to the stream's appends
    /// before it fetches, so that no append after it is missed.
    Fetching(BoxFuture<'static, (Result<Fetched>, Option<Subscription>)>),
    /// Waiting out a backoff or for appends; gives the subscription back.
    Waiting(BoxFuture<'static, Option<Subscription>>),
}

/// Leases of one group as a [`futures::Stream`]: at most `max_demand`
/// outstanding, renewed in the background until settled or dropped, each
/// settled through its [`StreamLease`]. It is the fetch loop of the managed
/// consumer ([`Rheo::consumer`]) too.
///
/// A failed fetch is logged and retried after a backoff (100 ms doubling to
/// 5 s); a failure that is not transient is also yielded as an `Err` item
/// (the stream goes on after it). An idle stream waits for an append to the
/// stream or the poll interval, and refreshes the group's lag and in-flight
/// gauges at most once a second.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
/// use futures::StreamExt;
/// use rheo::{AppendOptions, GroupOptions, LeaseStreamOptions, Rheo, StreamOptions};
///
/// let rheo = Rheo::open("memory:").await?;
/// rheo.create_stream("orders", StreamOptions::new()).await?;
/// rheo.create_group("orders", "billing", GroupOptions::new()).await?;
/// rheo.append_batch("orders", (0..20).map(|n| serde_json::json!({ "n": n }))).await?;
///
/// let leases = rheo.lease_stream("orders", "billing", LeaseStreamOptions::new().max_demand(8))?;
/// // Up to 8 handled at once; each settled through the item.
/// leases
///     .take(20)
///     .map(|lease| async move { lease?.ack().await })
///     .buffer_unordered(8)
///     .for_each(|r| async move { r.expect("ack") })
///     .await;
/// assert_eq!(rheo.lag("orders", "billing").await?.total, 0);
/// # Ok::<(), rheo::Error>(()) }).expect("example");
/// ```
pub struct LeaseStream {
    shared: Arc<Shared>,
    stream: String,
    group: String,
    fetch: FetchOptions,
    max_demand: usize,
    poll: Duration,
    /// Fetched, not yet yielded: held (and renewed) under their ids.
    buffer: VecDeque<(u64, LostNotice, Lease)>,
    state: State,
    backoff: ErrorBackoff,
    /// Appends to the stream wake an idle stream (None until made, or
    /// while a wait holds it).
    appends: Option<Subscription>,
    /// When an idle wait last refreshed the group's lag and in-flight gauges.
    gauges_at: Option<Instant>,
}

impl std::fmt::Debug for LeaseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseStream")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .field("max_demand", &self.max_demand)
            .field("outstanding", &self.outstanding())
            .finish_non_exhaustive()
    }
}

impl Rheo {
    /// Leases of `group` on `stream` as a [`LeaseStream`] (see there).
    /// Needs to be called inside a Tokio runtime (renewal runs as a task).
    pub fn lease_stream(&self, stream: &str, group: &str, opts: LeaseStreamOptions) -> Result<LeaseStream> {
        LeaseStream::new(self, stream, group, opts)
    }
}

impl LeaseStream {
    /// Same as [`Rheo::lease_stream`].
    pub fn new(rheo: &Rheo, stream: &str, group: &str, opts: LeaseStreamOptions) -> Result<LeaseStream> {
        Self::counted(rheo, stream, group, opts, Arc::default())
    }

    /// A lease stream that counts what it does in `stats`.
    pub(crate) fn counted(
        rheo: &Rheo,
        stream: &str,
        group: &str,
        opts: LeaseStreamOptions,
        stats: Arc<Stats>,
    ) -> Result<LeaseStream> {
        opts.check(stream, group)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::failed("lease_stream", format!("{stream:?}/{group:?}: must be created inside a Tokio runtime"))
        })?;
        let renewals = Arc::<Renewals>::default();
        // Its syncs must not hold up the tasks of the worker it runs on.
        let renewer = runtime.spawn(keeping_the_worker_free(run_renewer(
            rheo.clone(),
            Arc::downgrade(&renewals),
            opts.lease,
            stream.to_owned(),
            group.to_owned(),
        )));
        let shared = Arc::new(Shared {
            rheo: rheo.clone(),
            outstanding: AtomicUsize::new(0),
            waker: AtomicWaker::new(),
            renewals,
            stats,
            _renewer: AbortOnDrop(renewer),
        });
        Ok(LeaseStream {
            shared,
            stream: stream.to_owned(),
            group: group.to_owned(),
            fetch: FetchOptions {
                limit: opts.max_demand,
                consumer_id: opts.consumer_id,
                lease: opts.lease,
                partitions: opts.partitions,
            },
            max_demand: opts.max_demand,
            poll: opts.poll,
            buffer: VecDeque::new(),
            state: State::Idle,
            backoff: ErrorBackoff::new(),
            appends: None,
            gauges_at: None,
        })
    }

    /// Leases yielded or buffered and not yet settled or dropped.
    pub fn outstanding(&self) -> usize {
        self.shared.outstanding.load(Ordering::Acquire)
    }

    fn start_fetch(&mut self, limit: usize) {
        let shared = self.shared.clone();
        let (stream, group) = (self.stream.clone(), self.group.clone());
        let mut opts = self.fetch.clone();
        opts.limit = limit;
        let subscribed = self.appends.is_some();
        self.state = State::Fetching(
            async move {
                let rheo = &shared.rheo;
                let appends = if subscribed { None } else { rheo.subscribe(&stream).await.ok() };
                // Damage is logged by the facade and counted here; the
                // stream goes on with every position it could read.
                // A fetch that set scheduled events aside may have stopped
                // at its budget for them, with due events further on.
                let fetched = rheo.fetch_report(&stream, &group, opts).await.map(|report| {
                    Stats::add(&shared.stats.damaged, report.damaged.len() as u64);
                    (report.leases, report.scheduled > 0)
                });
                (fetched, appends)
            }
            .boxed(),
        );
    }

    /// Waits out a backoff, or (idle) for an append or the poll interval;
    /// an idle wait first refreshes the group's lag and in-flight gauges
    /// (`group_info` sets them), at most once a second.
    fn start_wait(&mut self, backoff: Option<Duration>) {
        let rheo = self.shared.rheo.clone();
        let (stream, group) = (self.stream.clone(), self.group.clone());
        let poll = self.poll;
        let appends = self.appends.take();
        let started = Instant::now();
        let refresh = backoff.is_none() && self.gauges_at.is_none_or(|t| started.duration_since(t) >= GAUGE_REFRESH);
        if refresh {
            self.gauges_at = Some(started);
        }
        self.state = State::Waiting(
            async move {
                if let Some(d) = backoff {
                    tokio::time::sleep(d).await;
                    return appends;
                }
                if refresh && let Err(e) = rheo.group_info(&stream, &group).await {
                    tracing::debug!(%stream, %group, "refreshing the gauges: {e}");
                }
                // Subscribed by the first fetch (or now, when that failed):
                // no append between two waits is missed.
                let appends = match appends {
                    Some(s) => Some(s),
                    None => rheo.subscribe(&stream).await.ok(),
                };
                let Some(mut appends) = appends else {
                    // Poll, and subscribe again next time.
                    tokio::time::sleep_until(started + poll).await;
                    return None;
                };
                appends.wait((started + poll).saturating_duration_since(Instant::now())).await;
                Some(appends)
            }
            .boxed(),
        );
    }

    /// Holds fetched leases (renewed from now on) until they are yielded.
    fn hold(&mut self, leases: Vec<Lease>) {
        for lease in leases {
            let (id, lost) = self.shared.renewals.insert(lease.to_ref());
            self.buffer.push_back((id, lost, lease));
        }
    }

    fn wrap(&self, id: u64, lost: LostNotice, lease: Lease) -> StreamLease {
        StreamLease { lease, lost: Some(lost), slot: Slot { shared: self.shared.clone(), id } }
    }

    /// The leases fetched and not yet yielded, taken out of the stream (a
    /// consumer that stops releases them).
    pub(crate) fn take_buffered(&mut self) -> Vec<StreamLease> {
        let buffered: Vec<_> = self.buffer.drain(..).collect();
        buffered.into_iter().map(|(id, lost, lease)| self.wrap(id, lost, lease)).collect()
    }
}

impl Stream for LeaseStream {
    type Item = Result<StreamLease>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some((id, lost, lease)) = this.buffer.pop_front() {
                return Poll::Ready(Some(Ok(this.wrap(id, lost, lease))));
            }
            match &mut this.state {
                State::Fetching(fut) => {
                    let r = match fut.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready((r, appends)) => {
                            if appends.is_some() {
                                this.appends = appends;
                            }
                            r
                        }
                    };
                    match r {
                        Ok((leases, set_aside)) if leases.is_empty() => {
                            this.backoff.reset();
                            if set_aside {
                                // Fetch again at once: not idle.
                                this.state = State::Idle;
                            } else {
                                this.start_wait(None);
                            }
                        }
                        Ok((leases, _)) => {
                            this.backoff.reset();
                            Stats::add(&this.shared.stats.fetched, leases.len() as u64);
                            this.shared.outstanding.fetch_add(leases.len(), Ordering::AcqRel);
                            this.hold(leases);
                            this.state = State::Idle;
                        }
                        Err(e) => {
                            Stats::add(&this.shared.stats.fetch_errors, 1);
                            let d = this.backoff.next_delay();
                            this.start_wait(Some(d));
                            tracing::warn!(stream = %this.stream, group = %this.group,
                                "fetch failed, retrying in {d:?}: {e}");
                            if !e.is_transient() {
                                return Poll::Ready(Some(Err(e)));
                            }
                        }
                    }
                }
                State::Waiting(fut) => match fut.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(appends) => {
                        this.appends = appends;
                        this.state = State::Idle;
                    }
                },
                State::Idle => {
                    let mut out = this.outstanding();
                    if out >= this.max_demand {
                        this.shared.waker.register(cx.waker());
                        // A slot freed between the load and the register.
                        out = this.outstanding();
                        if out >= this.max_demand {
                            return Poll::Pending;
                        }
                    }
                    // At most half the demand per fetch, so that two
                    // batches are in flight: one handed out and handled
                    // while the other's settles sync.
                    this.start_fetch((this.max_demand - out).min(this.max_demand.div_ceil(2)));
                }
            }
        }
    }
}

impl Drop for LeaseStream {
    /// Leases fetched but never yielded stop being renewed: they are left
    /// to expire (claimable again after their lease).
    fn drop(&mut self) {
        for (id, _, _) in self.buffer.drain(..) {
            self.shared.renewals.remove(id);
        }
    }
}

/// A slot of the stream's `max_demand`, released when the lease is settled
/// or dropped.
#[derive(Debug)]
struct Slot {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.renewals.remove(self.id);
        self.shared.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.shared.waker.wake();
    }
}

/// A lease yielded by a [`LeaseStream`]: read it through `Deref<Target =
/// Lease>`, settle it with [`StreamLease::settle`] (or its shorthands
/// [`ack`](StreamLease::ack), [`retry`](StreamLease::retry),
/// [`retry_after`](StreamLease::retry_after), [`reject`](StreamLease::reject)).
/// Dropping it unsettled frees its slot, stops its renewal and leaves the
/// delivery to lease expiry. It converts into a [`LeaseRef`], so a batch can
/// be settled with [`Rheo::ack_many`]:
///
/// ```
/// # async fn f(rheo: rheo::Rheo, leases: rheo::LeaseStream) -> rheo::Result<()> {
/// use futures::StreamExt;
/// let mut chunks = leases.ready_chunks(100);
/// while let Some(chunk) = chunks.next().await {
///     let chunk: Vec<_> = chunk.into_iter().collect::<rheo::Result<_>>()?;
///     for r in rheo.ack_many(chunk).await? {
///         r?;
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StreamLease {
    lease: Lease,
    /// Given by a renewal that finds the lease lost (taken by a consumer
    /// that waits for it).
    lost: Option<LostNotice>,
    slot: Slot,
}

impl std::ops::Deref for StreamLease {
    type Target = Lease;
    fn deref(&self) -> &Lease {
        &self.lease
    }
}

impl StreamLease {
    /// The lease. Its `expires_at` is the one of the fetch; renewals move
    /// the real expiry on.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Settles the delivery as `outcome` says and frees the slot: the one
    /// settle call, as a [`Handler`](crate::Handler) decides it. A reason is
    /// cut to [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES), a retry delay
    /// to [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// ```
    /// # async fn f(lease: rheo::StreamLease) -> rheo::Result<()> {
    /// use rheo::{Outcome, Settled};
    /// let outcome = match lease.event.payload().json() {
    ///     Ok(_) => Outcome::Ack,
    ///     Err(e) => Outcome::reject(format!("not JSON: {e}")),
    /// };
    /// match lease.settle(outcome).await? {
    ///     Settled::DeadLettered => println!("dead-lettered"),
    ///     _ => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn settle(self, outcome: Outcome) -> Result<Settled> {
        settle(&self.slot.shared.rheo, &self.lease.to_ref(), &outcome).await
    }

    /// Acknowledges the delivery and frees the slot.
    pub async fn ack(self) -> Result<()> {
        self.settle(Outcome::Ack).await.map(|_| ())
    }

    /// Gives the delivery back with a reason (the group's backoff applies)
    /// and frees the slot.
    pub async fn retry(self, reason: &str) -> Result<RetryOutcome> {
        self.settle(Outcome::retry(reason)).await.map(Settled::into_retry)
    }

    /// Gives the delivery back, claimable again after `delay`.
    pub async fn retry_after(self, reason: &str, delay: Duration) -> Result<RetryOutcome> {
        self.settle(Outcome::retry_after(reason, delay)).await.map(Settled::into_retry)
    }

    /// Dead-letters the delivery for this group and frees the slot.
    pub async fn reject(self, reason: &str) -> Result<()> {
        self.settle(Outcome::reject(reason)).await.map(|_| ())
    }

    /// Frees the slot and stops renewal; the caller settles the lease itself.
    pub fn into_lease(self) -> Lease {
        let StreamLease { lease, lost: _, slot } = self;
        drop(slot);
        lease
    }

    /// The notice a renewal gives when it finds the lease lost (once).
    pub(crate) fn take_lost_notice(&mut self) -> Option<LostNotice> {
        self.lost.take()
    }

    /// True when a renewal has found the lease lost (another consumer may
    /// have it).
    pub(crate) fn is_lost(&mut self) -> bool {
        self.lost.as_mut().is_some_and(LostNotice::is_lost)
    }
}

/// Gives deliveries back at once, unhandled: they stop being renewed and
/// their leases are cut to [`RELEASE`] in one `renew_many` (no attempt is
/// spent beyond the fetch's). A renewal that took them in its snapshot lands
/// before this, never after. What fails is left to lease expiry.
pub(crate) async fn release_all(leases: Vec<StreamLease>) {
    let Some(first) = leases.first() else { return };
    let shared = first.slot.shared.clone();
    let _renewals_paused = shared.renewals.renewing.lock().await;
    for lease in &leases {
        shared.renewals.remove(lease.slot.id);
    }
    for batch in leases.chunks(MAX_BATCH_EVENTS) {
        match shared.rheo.renew_many(batch.iter().map(LeaseRef::from), RELEASE).await {
            Ok(results) => {
                for (lease, r) in batch.iter().zip(results) {
                    if let Err(e) = r {
                        tracing::debug!(stream = %lease.stream(), group = %lease.group,
                            sequence = lease.sequence(), "release: {e}");
                    }
                }
            }
            Err(e) => tracing::debug!(leases = batch.len(), "release: {e}"),
        }
    }
}

/// The lease a released delivery is left with: it expires at once.
const RELEASE: Duration = Duration::from_millis(1);

impl From<&StreamLease> for LeaseRef {
    fn from(l: &StreamLease) -> Self {
        l.lease.to_ref()
    }
}

impl From<StreamLease> for LeaseRef {
    fn from(l: StreamLease) -> Self {
        l.lease.to_ref()
    }
}
