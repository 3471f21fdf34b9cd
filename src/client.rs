//! `Rheo`: the handle users hold.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use serde::Serialize;

use crate::backend::{Backend, Subscription};
use crate::error::{Error, ObjectKind, Result};
use crate::model::append::{AppendOptions, NewEvent};
use crate::model::capabilities::Capabilities;
use crate::model::damage::Damage;
use crate::model::event::{Event, Position};
use crate::model::group::{
    DeadLetter, DeadLetterOptions, FetchOptions, GroupInfo, GroupOptions, GroupSummary, Lag, ReplayFrom, ReplayOptions,
    ResetOptions,
};
use crate::model::lease::{FetchReport, Lease, LeaseRef, RetryOutcome};
use crate::model::limits::{
    DEFAULT_MAX_EVENT_BYTES, MAX_BATCH_EVENTS, MAX_LIMIT, MAX_NAME_BYTES, MAX_REASON_BYTES, validate_lease,
    validate_limit, validate_name,
};
use crate::model::path::DELIVER_AT;

/// The latest scheduled delivery time a backend accepts: the last
/// millisecond of year 9999.
const MAX_DELIVER_AT_MS: i64 = 253_402_300_799_999;
use crate::model::payload::Payload;
use crate::model::query::{Page, Query};
use crate::model::retention::{Retention, RetentionReport};
use crate::model::stream::{IndexStatus, StreamInfo, StreamOptions};
use crate::model::time::{Clock, SystemClock, Timestamp};
use crate::observe;

/// How long an append answered as a duplicate waits for its original to
/// become readable (it may be a concurrent append still in flight).
const DUPLICATE_WAIT: Duration = Duration::from_secs(5);

/// The entry point: a cheap-to-clone handle on one backend.
///
/// ```
/// # tokio_test_block(async {
/// use rheo::{Rheo, GroupOptions, FetchOptions, AppendOptions, StreamOptions};
/// use serde_json::json;
///
/// let rheo = Rheo::open("memory:").await?;
/// rheo.create_stream("orders", StreamOptions::new().partitions(4)).await?;
/// rheo.create_group("orders", "billing", GroupOptions::new()).await?;
/// rheo.append("orders", &json!({"type": "order_placed", "key": "c-7", "total": 42}), AppendOptions::new()).await?;
///
/// for lease in rheo.fetch("orders", "billing", FetchOptions::new().limit(10)).await? {
///     println!("{} #{}: {}", lease.event.partition(), lease.event.sequence(), lease.event.payload());
///     rheo.ack(&lease).await?;
/// }
/// assert_eq!(rheo.lag("orders", "billing").await?.total, 0);
/// # Ok::<(), rheo::Error>(()) });
/// # fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f) }
/// ```
#[derive(Clone, Debug)]
pub struct Rheo {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Arc<dyn Backend>,
    /// What an append's delay is measured from (the builder's clock).
    clock: Arc<dyn Clock>,
    /// Whether the backend honours scheduled delivery times.
    schedules: bool,
    consumer_id: String,
    max_event_bytes: usize,
    /// Damaged positions already logged by this handle's fetches:
    /// (stream, group, partition, sequence), at most [`DAMAGE_WARNED_MAX`].
    damage_seen: parking_lot::Mutex<std::collections::HashSet<(String, String, u32, u64)>>,
    /// The background retention task of a backend that asks for one
    /// ([`Backend::retention_interval`]); stopped with the last handle.
    retainer: Option<tokio::task::AbortHandle>,
    /// Concurrent `ack` calls of one (stream, group) combined into
    /// `ack_many` calls, for backends that ask for it
    /// ([`Backend::combines_calls`]).
    acks: Option<AckCombiner>,
    /// Concurrent fetches of one (stream, group, consumer, lease,
    /// partitions) combined into one, for the same backends.
    fetches: Option<FetchCombiner>,
}

/// What fetches must share to be combined.
type FetchKey = (Arc<str>, Arc<str>, Option<String>, Duration, Option<Vec<u32>>);

/// The facade's fetch combiner: a call's one item is its limit.
type FetchCombiner = crate::backends::combine::Combiner<FetchKey, usize, FetchReport>;

/// The events of one append call: inline for one, so a single event's
/// append allocates no list.
type Events<T> = smallvec::SmallVec<[T; 1]>;

/// A fetch combiner over `backend`: a flush is one fetch for the sum of
/// the waiting calls' limits (at most [`MAX_LIMIT`]); each call gets the
/// next leases in order, up to its limit (so the first calls are served
/// first when fewer are due), the first call the damage report, and every
/// call the count of events set aside until their scheduled time.
fn fetch_combiner(backend: &Arc<dyn Backend>) -> Option<FetchCombiner> {
    if !backend.combines_calls() {
        return None;
    }
    let backend = backend.clone();
    Some(crate::backends::combine::Combiner::new(
        "fetch",
        usize::MAX,
        MAX_LIMIT,
        1,
        move |key: FetchKey, calls: Vec<crate::backends::combine::Call<usize>>| {
            let backend = backend.clone();
            async move {
                let (stream, group, consumer_id, lease, partitions) = key;
                let limits: Vec<usize> = calls.iter().map(|c| c.items.iter().sum()).collect();
                let opts = FetchOptions {
                    limit: limits.iter().sum::<usize>().clamp(1, MAX_LIMIT),
                    consumer_id,
                    lease,
                    partitions,
                };
                match backend.fetch(&stream, &group, &opts).await {
                    Ok(report) => {
                        let mut leases = report.leases.into_iter();
                        let mut damaged = Some(report.damaged);
                        // Each call hears that the fetch set events aside
                        // (a consumer fetches again at once after one).
                        limits
                            .iter()
                            .map(|&n| {
                                Ok(vec![FetchReport {
                                    leases: leases.by_ref().take(n).collect(),
                                    damaged: damaged.take().unwrap_or_default(),
                                    scheduled: report.scheduled,
                                }])
                            })
                            .collect()
                    }
                    Err(e) => calls.iter().map(|_| Err(e.clone())).collect(),
                }
            }
        },
    ))
}

/// The facade's ack combiner: items are leases, answers their acks.
type AckCombiner = crate::backends::combine::Combiner<(Arc<str>, Arc<str>), LeaseRef, Result<()>>;

/// An ack combiner over `backend`: a flush is one `ack_many` of every call
/// waiting (one lease each), at most [`MAX_BATCH_EVENTS`] leases.
fn ack_combiner(backend: &Arc<dyn Backend>) -> Option<AckCombiner> {
    if !backend.combines_calls() {
        return None;
    }
    let backend = backend.clone();
    Some(crate::backends::combine::Combiner::new(
        "ack",
        MAX_BATCH_EVENTS,
        usize::MAX,
        1,
        move |_key, calls: Vec<crate::backends::combine::Call<LeaseRef>>| {
            let backend = backend.clone();
            async move {
                let all: Vec<LeaseRef> = calls.iter().flat_map(|c| c.items.iter().cloned()).collect();
                match backend.ack_many(&all).await {
                    Ok(results) if results.len() == all.len() => {
                        let mut rest = results.into_iter();
                        calls.iter().map(|c| Ok(rest.by_ref().take(c.items.len()).collect())).collect()
                    }
                    Ok(results) => calls
                        .iter()
                        .map(|_| {
                            Err(Error::failed(
                                "ack",
                                format!("ack_many answered {} of {} leases (a bug)", results.len(), all.len()),
                            ))
                        })
                        .collect(),
                    Err(e) => calls.iter().map(|_| Err(e.clone())).collect(),
                }
            }
        },
    ))
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(r) = &self.retainer {
            r.abort();
        }
    }
}

/// Starts the background retention rounds of `backend` when it asks for
/// them and a Tokio runtime is running. The task holds the backend weakly:
/// it ends once every handle is gone.
fn start_retainer(backend: &Arc<dyn Backend>) -> Option<tokio::task::AbortHandle> {
    let every = backend.retention_interval()?;
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let weak = Arc::downgrade(backend);
    let task = runtime.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(backend) = weak.upgrade() else { break };
            match backend.retention_round().await {
                Ok(reports) => reports.iter().for_each(observe::retention),
                Err(e) => {
                    tracing::warn!(backend = backend.name(), error = %e, "retention round failed; the next one retries")
                }
            }
        }
    });
    Some(task.abort_handle())
}

/// Damaged positions a handle remembers having logged (then it forgets
/// them all and logs again).
const DAMAGE_WARNED_MAX: usize = 4096;

/// Configures a [`Rheo`] before opening it.
#[derive(Debug, Clone)]
pub struct RheoBuilder {
    clock: Arc<dyn Clock>,
    custom_clock: bool,
    consumer_id: Option<String>,
    max_event_bytes: usize,
}

impl Default for RheoBuilder {
    fn default() -> Self {
        RheoBuilder {
            clock: Arc::new(SystemClock),
            custom_clock: false,
            consumer_id: None,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
        }
    }
}

impl RheoBuilder {
    /// The clock backends read (default: the system clock). Tests pass a
    /// [`crate::ManualClock`] to move time without sleeping.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self.custom_clock = true;
        self
    }

    /// The consumer id used by `fetch` when the options name none
    /// (default: `rheo-` and a random UUID, one per handle).
    pub fn consumer_id(mut self, id: impl Into<String>) -> Self {
        self.consumer_id = Some(id.into());
        self
    }

    /// The largest event accepted, in encoded bytes (default 1 MiB).
    pub fn max_event_bytes(mut self, n: usize) -> Self {
        self.max_event_bytes = n;
        self
    }

    /// Opens a backend from a URL: `memory:` or `native:PATH[?options]`
    /// (see [`crate::backends`] for every scheme and
    /// [`crate::backends::native`] for the native options).
    pub async fn open(self, url: &str) -> Result<Rheo> {
        let cx = crate::backends::OpenContext { clock: self.clock.clone(), custom_clock: self.custom_clock };
        let backend = crate::backends::open(url, &cx).await?;
        backend.ensure_schema().await?;
        self.with_backend(backend)
    }

    /// Wraps an already built backend.
    pub fn with_backend(self, backend: Arc<dyn Backend>) -> Result<Rheo> {
        let consumer_id = self.consumer_id.unwrap_or_else(|| format!("rheo-{}", uuid::Uuid::new_v4()));
        validate_name(ObjectKind::Consumer, &consumer_id)?;
        if self.max_event_bytes == 0 {
            return Err(Error::invalid("max_event_bytes", "must be above zero"));
        }
        let retainer = start_retainer(&backend);
        let acks = ack_combiner(&backend);
        let fetches = fetch_combiner(&backend);
        let schedules = backend.capabilities().scheduled_delivery;
        Ok(Rheo {
            inner: Arc::new(Inner {
                backend,
                clock: self.clock,
                schedules,
                consumer_id,
                max_event_bytes: self.max_event_bytes,
                damage_seen: Default::default(),
                retainer,
                acks,
                fetches,
            }),
        })
    }
}

fn check_stream(stream: &str) -> Result<()> {
    validate_name(ObjectKind::Stream, stream)
}

fn check_group(stream: &str, group: &str) -> Result<()> {
    validate_name(ObjectKind::Stream, stream)?;
    validate_name(ObjectKind::Group, group)
}

fn check_lease_ref(lease: &LeaseRef) -> Result<()> {
    check_group(&lease.stream, &lease.group)
}

/// The leases of a batch call, each checked, at most [`MAX_BATCH_EVENTS`].
fn batch_of_leases<L: Into<LeaseRef>>(
    call: &'static str,
    leases: impl IntoIterator<Item = L>,
) -> Result<Vec<LeaseRef>> {
    let leases: Vec<LeaseRef> = leases.into_iter().map(Into::into).collect();
    if leases.len() > MAX_BATCH_EVENTS {
        return Err(Error::invalid(call, format!("more than {MAX_BATCH_EVENTS} leases in one call")));
    }
    leases.iter().try_for_each(check_lease_ref)?;
    Ok(leases)
}

/// The stream and group a batch call is observed under (its first lease's).
fn batch_names(leases: &[LeaseRef]) -> (&str, &str) {
    leases.first().map_or(("", ""), |l| (&*l.stream, &*l.group))
}

/// A backend's batch answer has one result per lease.
fn check_batch_results<T>(call: &'static str, leases: &[LeaseRef], results: &[Result<T>]) -> Result<()> {
    if results.len() == leases.len() {
        return Ok(());
    }
    let (stream, group) = batch_names(leases);
    Err(Error::failed(
        call,
        format!(
            "the backend returned {} results for {} leases (stream {stream:?}, group {group:?})",
            results.len(),
            leases.len()
        ),
    ))
}

impl Rheo {
    /// Opens a backend with default settings (see [`RheoBuilder::open`]).
    pub async fn open(url: &str) -> Result<Rheo> {
        RheoBuilder::default().open(url).await
    }

    /// A builder for non-default settings.
    pub fn builder() -> RheoBuilder {
        RheoBuilder::default()
    }

    /// The backend behind this handle, for this crate's own tests (a call
    /// made on it would skip the facade's checks: not part of the API).
    #[cfg(any(test, feature = "internals"))]
    #[doc(hidden)]
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// What the backend guarantees.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.backend.capabilities()
    }

    /// The default consumer id of this handle.
    pub fn consumer_id(&self) -> &str {
        &self.inner.consumer_id
    }

    /// Checks the backend is reachable.
    pub async fn ping(&self) -> Result<()> {
        observed("ping", "", "", self.inner.backend.ping()).await
    }

    /// Creates a stream.
    pub async fn create_stream(&self, stream: &str, opts: StreamOptions) -> Result<StreamInfo> {
        check_stream(stream)?;
        opts.validate(stream)?;
        observed("create_stream", stream, "", self.inner.backend.create_stream(stream, &opts)).await
    }

    /// Adds an index on `field` (a query path such as `"currency"` or
    /// `"order.customer_id"`) to a stream. It returns once the index is
    /// recorded; events already in the stream are indexed in the background,
    /// and queries stay exact meanwhile (they scan what is not indexed yet).
    /// The returned [`IndexBuild`] reports progress or waits for the end.
    /// Adding a field already indexed is a no-op.
    ///
    /// ```
    /// # async fn f(rheo: &rheo::Rheo) -> rheo::Result<()> {
    /// let build = rheo.create_index("orders", "currency").await?;
    /// build.wait(|p| eprintln!("{}: {}/{} segments", p.field, p.segments_ready, p.segments_total)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_index(&self, stream: &str, field: &str) -> Result<IndexBuild> {
        check_stream(stream)?;
        let canonical = crate::model::query::check_index_field(stream, field)?;
        observed("create_index", stream, "", self.inner.backend.create_index(stream, field)).await?;
        Ok(IndexBuild { rheo: self.clone(), stream: stream.to_owned(), field: canonical })
    }

    /// How far each indexed field of a stream is built.
    pub async fn index_status(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        check_stream(stream)?;
        observed("index_status", stream, "", self.inner.backend.index_status(stream)).await
    }

    /// Creates a stream, or returns the existing one of that name: what a
    /// program opening a durable backend on every start wants. An existing
    /// stream with another partition count is `InvalidArgument` (its
    /// partitions can't change).
    ///
    /// ```
    /// # async fn f(rheo: &rheo::Rheo) -> rheo::Result<()> {
    /// use rheo::StreamOptions;
    /// let first = rheo.ensure_stream("orders", StreamOptions::new().partitions(4)).await?;
    /// let again = rheo.ensure_stream("orders", StreamOptions::new().partitions(4)).await?;
    /// assert_eq!(first.name, again.name);
    /// # Ok(()) }
    /// ```
    pub async fn ensure_stream(&self, stream: &str, opts: StreamOptions) -> Result<StreamInfo> {
        let want = opts.partition_count;
        match self.create_stream(stream, opts).await {
            Err(Error::AlreadyExists { .. }) => {
                let info = self.inner.backend.stream_info(stream).await?;
                if info.partition_count != want {
                    return Err(Error::invalid(
                        "partitions",
                        format!(
                            "stream {stream:?} exists with {} partitions, not {want}; a stream's partition count never changes",
                            info.partition_count
                        ),
                    ));
                }
                Ok(info)
            }
            other => other,
        }
    }

    /// Creates a consumer group, or returns the existing one of that name
    /// (with its position kept). An existing group with another
    /// `max_attempts`, partition scope or per-key order is `InvalidArgument`.
    pub async fn ensure_group(&self, stream: &str, group: &str, opts: GroupOptions) -> Result<GroupSummary> {
        let (want_attempts, want_order) = (opts.max_attempts, opts.ordered_by_key);
        let mut want_parts = opts.partitions.clone();
        if let Some(p) = want_parts.as_mut() {
            p.sort_unstable();
            p.dedup();
        }
        match self.create_group(stream, group, opts).await {
            Err(Error::AlreadyExists { .. }) => {
                let existing = self.inner.backend.list_groups(stream).await?.into_iter().find(|g| g.name == group);
                let summary = existing.ok_or_else(|| Error::group_not_found(stream, group))?;
                if summary.max_attempts != want_attempts || summary.partitions != want_parts {
                    return Err(Error::invalid(
                        "group",
                        format!(
                            "group {group:?} of stream {stream:?} exists with max_attempts {} and partitions {:?}, not {want_attempts} and {want_parts:?}",
                            summary.max_attempts, summary.partitions
                        ),
                    ));
                }
                if summary.ordered_by_key != want_order {
                    let (has, not) = if want_order { ("without", "") } else { ("with", "out") };
                    return Err(Error::invalid(
                        "group",
                        format!(
                            "group {group:?} of stream {stream:?} exists {has} per-key order, not with{not} it (ordered_by_key)"
                        ),
                    ));
                }
                Ok(summary)
            }
            other => other,
        }
    }

    /// Creates a consumer group.
    pub async fn create_group(&self, stream: &str, group: &str, opts: GroupOptions) -> Result<GroupSummary> {
        check_group(stream, group)?;
        if opts.ordered_by_key && !self.inner.backend.capabilities().ordered_by_key {
            return Err(Error::Unsupported {
                backend: self.inner.backend.name(),
                operation: "per-key order (a group created with ordered_by_key)",
            });
        }
        observed("create_group", stream, group, self.inner.backend.create_group(stream, group, &opts)).await
    }

    fn prepare(&self, stream: &str, payload: Payload, mut opts: AppendOptions) -> Result<NewEvent> {
        payload.check().map_err(|e| e.payload_context(|| format!("appended to stream {stream:?}")))?;
        if opts.delay.is_some() {
            opts.resolve_delay(self.inner.clock.now());
        }
        let event = NewEvent::prepare(payload, opts);
        if let Some(at) = event.metadata.get(DELIVER_AT) {
            self.check_schedule(stream, at)?;
        }
        if event.id.is_empty() || event.id.len() > MAX_NAME_BYTES {
            return Err(Error::invalid(
                "id",
                format!("event id must be 1 to {MAX_NAME_BYTES} bytes, got {}", event.id.len()),
            ));
        }
        let size_bytes = event.encoded_len();
        if size_bytes > self.inner.max_event_bytes {
            return Err(Error::EventTooLarge {
                stream: stream.to_owned(),
                size_bytes,
                max_bytes: self.inner.max_event_bytes,
            });
        }
        Ok(event)
    }

    /// An event's `deliver_at` entry: an integer, on a backend that
    /// schedules.
    #[cold]
    fn check_schedule(&self, stream: &str, at: &serde_json::Value) -> Result<()> {
        if !at.is_i64() {
            return Err(Error::invalid(
                DELIVER_AT,
                format!(
                    "stream {stream:?}: the metadata entry {DELIVER_AT:?} is a scheduled delivery time, \
                     milliseconds since the Unix epoch (an integer); got {at}"
                ),
            ));
        }
        // Every backend stores and compares the time the same way only inside
        // four-digit years (SQLite compares RFC 3339 text, PostgreSQL's
        // `timestamptz` ends in year 294276, BSON dates and native integers
        // do not end there): refuse what lies outside rather than let one
        // backend hold an event another would hand out at once.
        let ms = at.as_i64().unwrap_or_default();
        if !(0..=MAX_DELIVER_AT_MS).contains(&ms) {
            return Err(Error::invalid(
                DELIVER_AT,
                format!(
                    "stream {stream:?}: the scheduled delivery time {ms} (ms since the Unix epoch) lies outside \
                     1970-01-01T00:00:00.000Z..=9999-12-31T23:59:59.999Z"
                ),
            ));
        }
        if !self.inner.schedules {
            return Err(Error::Unsupported {
                backend: self.inner.backend.name(),
                operation: "scheduled delivery (an event with a deliver_at time)",
            });
        }
        Ok(())
    }

    /// Appends one event: any serializable payload (your own type, or a
    /// `serde_json::Value`), serialized once into its stored encoding.
    ///
    /// The event size limit ([`RheoBuilder::max_event_bytes`]) counts the
    /// encoded payload (MessagePack), the metadata's JSON length, and the id,
    /// key and type.
    ///
    /// The payload is serialized when this is called, not when the future
    /// is first polled, so the future does not borrow it.
    pub fn append<'a, T: Serialize + ?Sized>(
        &'a self,
        stream: &'a str,
        payload: &T,
        opts: AppendOptions,
    ) -> impl Future<Output = Result<Event>> + Send + use<'a, T> {
        let event = check_stream(stream)
            .and_then(|()| encode(stream, payload))
            .and_then(|payload| self.prepare(stream, payload, opts));
        self.store_one(stream, event)
    }

    /// Appends one event whose payload is already encoded (e.g. JSON text a
    /// bridge passes through, [`Payload::from_json`]): nothing is
    /// re-serialized on the way (JSON text is stored as MessagePack).
    pub fn append_encoded<'a>(
        &'a self,
        stream: &'a str,
        payload: Payload,
        opts: AppendOptions,
    ) -> impl Future<Output = Result<Event>> + Send + 'a {
        let event = check_stream(stream).and_then(|()| self.prepare(stream, payload, opts));
        self.store_one(stream, event)
    }

    /// Stores one prepared event. The checks and the encoding are done
    /// before, outside the future, and the future is `store`'s own: what
    /// an `async fn` takes as arguments stays in its future beside what it
    /// awaits, and a future is moved whole on its way to being polled.
    fn store_one<'a>(
        &'a self,
        stream: &'a str,
        event: Result<NewEvent>,
    ) -> impl Future<Output = Result<Event>> + Send + 'a {
        use futures::FutureExt;
        match event {
            Ok(event) => futures::future::Either::Left(self.store("append", stream, smallvec::smallvec![event]).map(
                move |stored| {
                    stored?.pop().ok_or_else(|| {
                        Error::failed("append", format!("stream {stream:?}: the backend stored no event"))
                    })
                },
            )),
            Err(e) => futures::future::Either::Right(std::future::ready(Err(e))),
        }
    }

    /// Appends payloads atomically (all or none), each with default options.
    pub async fn append_batch<T, I>(&self, stream: &str, payloads: I) -> Result<Vec<Event>>
    where
        T: Serialize,
        I: IntoIterator<Item = T>,
    {
        self.append_batch_with(stream, payloads.into_iter().map(|p| (p, AppendOptions::new()))).await
    }

    /// Appends payloads with their options atomically (all or none), at most
    /// [`MAX_BATCH_EVENTS`] per call.
    pub async fn append_batch_with<T, I>(&self, stream: &str, items: I) -> Result<Vec<Event>>
    where
        T: Serialize,
        I: IntoIterator<Item = (T, AppendOptions)>,
    {
        check_stream(stream)?;
        let mut events = Events::new();
        for (payload, opts) in items {
            if events.len() == MAX_BATCH_EVENTS {
                return Err(Error::invalid(
                    "append_batch",
                    format!("more than {MAX_BATCH_EVENTS} events in one batch"),
                ));
            }
            events.push(self.prepare(stream, encode(stream, &payload)?, opts)?);
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.store("append_batch", stream, events).await?.into_vec())
    }

    /// Hands prepared events to the backend and builds the appended events
    /// from the positions it returns.
    async fn store(&self, call: &'static str, stream: &str, events: Events<NewEvent>) -> Result<Events<Event>> {
        let positions = observed(call, stream, "", self.inner.backend.append_batch(stream, &events)).await?;
        if positions.len() != events.len() {
            // The events are stored, but which went where is unknown.
            return Err(Error::ambiguous(
                call,
                format!(
                    "stream {stream:?}: the backend returned {} positions for {} events",
                    positions.len(),
                    events.len()
                ),
            ));
        }
        let duplicates = positions.iter().filter(|p| p.duplicate).count();
        let name = observe::appended(stream, events.len() - duplicates);
        if duplicates > 0 {
            // Boxed: a rare path whose reads and waits would otherwise make
            // every append's future larger.
            return Box::pin(self.with_originals(call, stream, &name, events, positions)).await;
        }
        Ok(events
            .into_iter()
            .zip(positions)
            .map(|(mut e, at)| {
                // The backend's word on where and when it stored the event.
                e.timestamp = Some(at.timestamp);
                e.into_event(&name, at.partition, at.sequence, at.timestamp)
            })
            .collect())
    }

    /// The appended events of a batch with duplicates among them: each
    /// duplicate's stored original in its place.
    async fn with_originals(
        &self,
        call: &'static str,
        stream: &str,
        name: &Arc<str>,
        events: Events<NewEvent>,
        positions: Vec<Position>,
    ) -> Result<Events<Event>> {
        let mut out = Events::with_capacity(events.len());
        for (mut e, at) in events.into_iter().zip(positions) {
            if !at.duplicate {
                e.timestamp = Some(at.timestamp);
                out.push(e.into_event(name, at.partition, at.sequence, at.timestamp));
                continue;
            }
            // The batch's new events are committed already: whatever goes
            // wrong now, the caller must not read "nothing was written".
            let original = self.original(call, stream, &e.id, at).await.map_err(|err| match err {
                Error::Ambiguous { .. } => err,
                other => Error::ambiguous(
                    call,
                    format!("stream {stream:?}: the append was stored, but reading back the original of duplicate id {:?} failed: {other}", e.id),
                ),
            })?;
            out.push(original);
        }
        Ok(out)
    }

    /// The stored original of an appended duplicate, marked
    /// [`Event::is_duplicate`]. It may still be on its way to being
    /// published (a concurrent append of the same id that has not returned
    /// yet): read again for up to [`DUPLICATE_WAIT`], then `Ambiguous`.
    async fn original(&self, call: &'static str, stream: &str, id: &str, at: Position) -> Result<Event> {
        let deadline = std::time::Instant::now() + DUPLICATE_WAIT;
        let mut pause = Duration::from_micros(200);
        loop {
            let found = self.inner.backend.read(stream, at.partition, at.sequence.saturating_sub(1), 1).await?;
            match found.into_iter().next() {
                Some(e) if e.sequence() == at.sequence && e.id() == id => return Ok(e.into_duplicate()),
                Some(e) if e.sequence() == at.sequence => {
                    return Err(Error::failed(
                        call,
                        format!(
                            "stream {stream:?}: id {id:?} was answered as a duplicate of partition {} sequence {}, which holds id {:?}",
                            at.partition,
                            at.sequence,
                            e.id()
                        ),
                    ));
                }
                _ if std::time::Instant::now() >= deadline => {
                    return Err(Error::ambiguous(
                        call,
                        format!(
                            "stream {stream:?}: id {id:?} is a duplicate of partition {} sequence {}, which is not readable after {DUPLICATE_WAIT:?} (its own append may have failed); retry",
                            at.partition, at.sequence
                        ),
                    ));
                }
                _ => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
            }
        }
    }

    /// Events of one partition after a sequence, ascending; no group state.
    pub async fn read(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        check_stream(stream)?;
        validate_limit("limit", limit)?;
        observed("read", stream, "", self.inner.backend.read(stream, partition, after, limit)).await
    }

    /// The first page of a query's events.
    pub async fn query(&self, query: &Query) -> Result<Vec<Event>> {
        Ok(self.query_page(query).await?.events)
    }

    /// One page of a query, with the cursor of the next.
    pub async fn query_page(&self, query: &Query) -> Result<Page> {
        check_stream(&query.stream)?;
        query.validate()?;
        observed("query", &query.stream, "", self.inner.backend.query(query)).await
    }

    /// Every event matching a query, fetched lazily a page (`query.limit`
    /// events) at a time.
    ///
    /// ```
    /// # async fn f(rheo: rheo::Rheo) -> rheo::Result<()> {
    /// use futures::TryStreamExt;
    /// let all: Vec<_> = rheo.stream_query(rheo::Query::new("orders").eq("type", "paid")).try_collect().await?;
    /// # Ok(()) }
    /// ```
    pub fn stream_query(&self, query: Query) -> impl Stream<Item = Result<Event>> + Send + 'static {
        let rheo = self.clone();
        futures::stream::try_unfold(Some(query), move |state| {
            let rheo = rheo.clone();
            async move {
                let Some(q) = state else { return Ok::<_, Error>(None) };
                let page = rheo.query_page(&q).await?;
                let next = page.next_cursor.map(|c| q.clone().cursor(c));
                Ok(Some((futures::stream::iter(page.events.into_iter().map(Ok)), next)))
            }
        })
        .try_flatten()
        .boxed()
    }

    /// Claims deliveries for a group. A position whose stored record can't
    /// be read is not claimed: it is logged (`warn`, once per position per
    /// handle, with the file and offset), counted in
    /// [`observe::DAMAGED`], and left due (not claimed, no attempt
    /// counted; it is not dead-lettered); see
    /// [`Rheo::fetch_report`] to receive such positions.
    pub async fn fetch(&self, stream: &str, group: &str, opts: FetchOptions) -> Result<Vec<Lease>> {
        Ok(self.fetch_report(stream, group, opts).await?.leases)
    }

    /// Claims deliveries for a group, and reports the positions that were
    /// due but whose stored records can't be read (damage): those are not
    /// claimed (no attempt counted), block only themselves, and stay due
    /// until an operator skips them ([`Rheo::skip`]) or restores the file.
    /// A fetch whose reads fail otherwise (an I/O error) fails with nothing
    /// claimed.
    pub async fn fetch_report(&self, stream: &str, group: &str, opts: FetchOptions) -> Result<FetchReport> {
        check_group(stream, group)?;
        validate_limit("limit", opts.limit)?;
        validate_lease("lease", opts.lease)?;
        let mut opts = opts;
        match &opts.consumer_id {
            Some(id) => validate_name(ObjectKind::Consumer, id)?,
            None => opts.consumer_id = Some(self.inner.consumer_id.clone()),
        }
        let report = match &self.inner.fetches {
            // Combined with the same fetches of its group waiting meanwhile.
            Some(fetches) => {
                let key: FetchKey = (
                    Arc::from(stream),
                    Arc::from(group),
                    opts.consumer_id.clone(),
                    opts.lease,
                    opts.partitions.clone(),
                );
                let combined = async {
                    let mut answers = fetches.submit(key, vec![opts.limit], opts.limit).await?;
                    answers.pop().ok_or_else(|| Error::failed("fetch", "no answer for the fetch"))
                };
                observed("fetch", stream, group, combined).await?
            }
            None => observed("fetch", stream, group, self.inner.backend.fetch(stream, group, &opts)).await?,
        };
        observe::leased(stream, group, &report.leases);
        if !report.damaged.is_empty() {
            observe::damaged(group, &report.damaged);
            self.warn_damage(group, &report.damaged);
        }
        Ok(report)
    }

    /// Logs damaged positions a fetch met, each once per handle (a
    /// consumer polling past the same damage would otherwise repeat it).
    fn warn_damage(&self, group: &str, damaged: &[Damage]) {
        let mut seen = self.inner.damage_seen.lock();
        for d in damaged {
            if seen.len() >= DAMAGE_WARNED_MAX {
                seen.clear();
            }
            if seen.insert((d.stream.clone(), group.to_owned(), d.partition, d.sequence)) {
                tracing::warn!(
                    stream = %d.stream, group, partition = d.partition, sequence = d.sequence,
                    file = %d.file.display(), offset = d.offset, reason = %d.reason,
                    "a due event can't be read: its position is not delivered (the rest of the group goes on); skip it or restore the file (docs/guides/operations.md)"
                );
            }
        }
    }

    /// Dead-letters one position of a group without reading its event: the
    /// operator's way past a damaged record (see the runbook in
    /// `docs/guides/operations.md`). Works whatever the position's state;
    /// a lease holding it becomes stale. The dead letter's reason is
    /// `skipped: <reason>`, and [`Rheo::dead_letters`] lists it with the
    /// damage. Returns true when it dead-lettered the position, false when
    /// it already was a dead letter. An acknowledged position, a sequence
    /// outside the partition, or a partition the group does not consume is
    /// refused with `InvalidArgument`, a partition the stream does not have
    /// with `InvalidPartition`, changing nothing.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt").block_on(async {
    /// use rheo::{AppendOptions, GroupOptions, Rheo, StreamOptions};
    /// let rheo = Rheo::open("memory:").await?;
    /// rheo.create_stream("orders", StreamOptions::new()).await?;
    /// rheo.create_group("orders", "billing", GroupOptions::new()).await?;
    /// rheo.append("orders", &serde_json::json!({"n": 1}), AppendOptions::new()).await?;
    /// assert!(rheo.skip("orders", "billing", 0, 1, "record damaged, restored elsewhere").await?);
    /// let dead = rheo.dead_letters("orders", "billing", Default::default()).await?;
    /// assert_eq!(dead[0].reason, "skipped: record damaged, restored elsewhere");
    /// assert_eq!(rheo.lag("orders", "billing").await?.total, 0);
    /// # Ok::<(), rheo::Error>(()) }).expect("example");
    /// ```
    pub async fn skip(&self, stream: &str, group: &str, partition: u32, sequence: u64, reason: &str) -> Result<bool> {
        check_group(stream, group)?;
        check_reason(reason)?;
        let skipped =
            observed("skip", stream, group, self.inner.backend.skip(stream, group, partition, sequence, reason))
                .await?;
        if skipped {
            observe::settled(observe::DEAD_LETTERED, stream, group, 1);
        }
        Ok(skipped)
    }

    /// Extends a lease; returns the new expiry.
    pub async fn renew(&self, lease: impl Into<LeaseRef>, lease_duration: Duration) -> Result<Timestamp> {
        let lease = lease.into();
        check_lease_ref(&lease)?;
        validate_lease("lease", lease_duration)?;
        observed("renew", &lease.stream, &lease.group, self.inner.backend.renew(&lease, lease_duration)).await
    }

    /// Acknowledges a delivery.
    pub async fn ack(&self, lease: impl Into<LeaseRef>) -> Result<()> {
        let lease = lease.into();
        check_lease_ref(&lease)?;
        let (stream, group) = (lease.stream.clone(), lease.group.clone());
        match &self.inner.acks {
            // Combined with the other acks of its group waiting meanwhile.
            Some(acks) => {
                let combined = async {
                    let mut answers = acks.submit((stream.clone(), group.clone()), vec![lease], 1).await?;
                    answers.pop().unwrap_or_else(|| Err(Error::failed("ack", "no answer for the lease")))
                };
                observed("ack", &stream, &group, combined).await?;
            }
            None => observed("ack", &stream, &group, self.inner.backend.ack(&lease)).await?,
        }
        observe::settled(observe::ACKED, &stream, &group, 1);
        Ok(())
    }

    /// Extends many leases by `lease_duration` in one call (one WAL record
    /// and one sync per stream and group on `native:`); one result per
    /// lease, in order: its new expiry, or its own error (a stale lease
    /// fails alone). The outer error is for the whole call: a bad argument,
    /// more than [`MAX_BATCH_EVENTS`] leases, an unavailable backend.
    ///
    /// ```
    /// # async fn f(rheo: &rheo::Rheo, leases: &[rheo::Lease]) -> rheo::Result<()> {
    /// use std::time::Duration;
    /// for (lease, r) in leases.iter().zip(rheo.renew_many(leases, Duration::from_secs(30)).await?) {
    ///     match r {
    ///         Ok(expiry) => println!("#{} held until {expiry}", lease.sequence()),
    ///         Err(e) => println!("#{} lost: {e}", lease.sequence()),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn renew_many<L, I>(&self, leases: I, lease_duration: Duration) -> Result<Vec<Result<Timestamp>>>
    where
        L: Into<LeaseRef>,
        I: IntoIterator<Item = L>,
    {
        validate_lease("lease", lease_duration)?;
        let leases = batch_of_leases("renew_many", leases)?;
        let (stream, group) = batch_names(&leases);
        let results =
            observed("renew_many", stream, group, self.inner.backend.renew_many(&leases, lease_duration)).await?;
        check_batch_results("renew_many", &leases, &results)?;
        Ok(results)
    }

    /// Acknowledges many deliveries in one call; one result per lease, in
    /// order (a stale lease fails alone).
    pub async fn ack_many<L, I>(&self, leases: I) -> Result<Vec<Result<()>>>
    where
        L: Into<LeaseRef>,
        I: IntoIterator<Item = L>,
    {
        let leases = batch_of_leases("ack_many", leases)?;
        let (stream, group) = batch_names(&leases);
        let results = observed("ack_many", stream, group, self.inner.backend.ack_many(&leases)).await?;
        check_batch_results("ack_many", &leases, &results)?;
        for (lease, r) in leases.iter().zip(&results) {
            if r.is_ok() {
                observe::settled(observe::ACKED, &lease.stream, &lease.group, 1);
            }
        }
        Ok(results)
    }

    /// Gives a delivery back with a reason; the group's backoff applies.
    pub async fn retry(&self, lease: impl Into<LeaseRef>, reason: &str) -> Result<RetryOutcome> {
        let lease = lease.into();
        check_lease_ref(&lease)?;
        check_reason(reason)?;
        let outcome =
            observed("retry", &lease.stream, &lease.group, self.inner.backend.retry(&lease, reason, None)).await?;
        let name = match outcome {
            RetryOutcome::Scheduled { .. } => observe::RETRIED,
            RetryOutcome::DeadLettered => observe::DEAD_LETTERED,
        };
        observe::settled(name, &lease.stream, &lease.group, 1);
        Ok(outcome)
    }

    /// Gives a delivery back, claimable again after `delay`.
    pub async fn retry_after(&self, lease: impl Into<LeaseRef>, reason: &str, delay: Duration) -> Result<RetryOutcome> {
        let lease = lease.into();
        check_lease_ref(&lease)?;
        check_reason(reason)?;
        if !delay.is_zero() {
            validate_lease("delay", delay)?;
        }
        let outcome =
            observed("retry", &lease.stream, &lease.group, self.inner.backend.retry(&lease, reason, Some(delay)))
                .await?;
        let name = match outcome {
            RetryOutcome::Scheduled { .. } => observe::RETRIED,
            RetryOutcome::DeadLettered => observe::DEAD_LETTERED,
        };
        observe::settled(name, &lease.stream, &lease.group, 1);
        Ok(outcome)
    }

    /// Dead-letters a delivery for this group.
    pub async fn reject(&self, lease: impl Into<LeaseRef>, reason: &str) -> Result<()> {
        let lease = lease.into();
        check_lease_ref(&lease)?;
        check_reason(reason)?;
        observed("reject", &lease.stream, &lease.group, self.inner.backend.reject(&lease, reason)).await?;
        observe::settled(observe::DEAD_LETTERED, &lease.stream, &lease.group, 1);
        Ok(())
    }

    /// Reopens deliveries; returns how many events were reopened.
    pub async fn replay(&self, stream: &str, group: &str, opts: ReplayOptions) -> Result<u64> {
        check_group(stream, group)?;
        let replay = opts.validate(stream, group)?;
        if let ReplayFrom::Query(q) = &replay.from {
            q.validate()?;
        }
        observed("replay", stream, group, self.inner.backend.replay(stream, group, &replay)).await
    }

    /// Clears and restarts a group; `opts.confirm` must be true.
    pub async fn reset_group(&self, stream: &str, group: &str, opts: ResetOptions) -> Result<()> {
        check_group(stream, group)?;
        let reset = opts.confirmed_for(stream, group)?;
        observed("reset_group", stream, group, self.inner.backend.reset_group(stream, group, &reset)).await
    }

    /// Lag of a group over all its partitions.
    pub async fn lag(&self, stream: &str, group: &str) -> Result<Lag> {
        check_group(stream, group)?;
        let lag = observed("lag", stream, group, self.inner.backend.lag(stream, group, None)).await?;
        observe::lag(&lag);
        Ok(lag)
    }

    /// Lag of a group over some partitions.
    pub async fn lag_of(&self, stream: &str, group: &str, partitions: &[u32]) -> Result<Lag> {
        check_group(stream, group)?;
        let lag = observed("lag", stream, group, self.inner.backend.lag(stream, group, Some(partitions))).await?;
        observe::lag(&lag);
        Ok(lag)
    }

    /// Every stream.
    pub async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        observed("list_streams", "", "", self.inner.backend.list_streams()).await
    }

    /// One stream: each partition's first and last sequence and size
    /// ([`StreamInfo::partitions`]), its retention and dedupe window.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
    /// # let rheo = rheo::Rheo::open("memory:").await?;
    /// rheo.create_stream("orders", rheo::StreamOptions::new()).await?;
    /// rheo.append("orders", &serde_json::json!({"n": 1}), rheo::AppendOptions::new()).await?;
    /// let info = rheo.stream_info("orders").await?;
    /// assert_eq!((info.partitions[0].first_sequence, info.partitions[0].last_sequence), (1, 1));
    /// # Ok::<(), rheo::Error>(()) }).expect("example");
    /// ```
    pub async fn stream_info(&self, stream: &str) -> Result<StreamInfo> {
        check_stream(stream)?;
        observed("stream_info", stream, "", self.inner.backend.stream_info(stream)).await
    }

    /// Replaces a stream's retention (see [`Retention`]); returns the
    /// stream. Nothing is dropped by the call itself: the backend's next
    /// retention pass (in the background, or [`Rheo::enforce_retention`])
    /// applies it. `Unsupported` on a backend without retention
    /// ([`Capabilities::retention`]).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
    /// # let rheo = rheo::Rheo::open("memory:").await?;
    /// use rheo::{Retention, StreamOptions};
    /// rheo.create_stream("audit", StreamOptions::new()).await?;
    /// for n in 0..10 {
    ///     rheo.append("audit", &serde_json::json!({"n": n}), rheo::AppendOptions::new()).await?;
    /// }
    /// rheo.set_retention("audit", Retention::new().max_events(3)).await?;
    /// let report = rheo.enforce_retention("audit").await?;
    /// assert_eq!(report.events_dropped(), 7);
    /// assert_eq!(rheo.read("audit", 0, 0, 100).await?.len(), 3);
    /// # Ok::<(), rheo::Error>(()) }).expect("example");
    /// ```
    pub async fn set_retention(&self, stream: &str, retention: Retention) -> Result<StreamInfo> {
        check_stream(stream)?;
        retention.validate(stream)?;
        observed("set_retention", stream, "", self.inner.backend.set_retention(stream, &retention)).await
    }

    /// Runs one retention pass over a stream now and says what it dropped
    /// and which groups it moved (backends with retention also run passes
    /// in the background). `Unsupported` on a backend without retention.
    pub async fn enforce_retention(&self, stream: &str) -> Result<RetentionReport> {
        check_stream(stream)?;
        let report = observed("enforce_retention", stream, "", self.inner.backend.enforce_retention(stream)).await?;
        observe::retention(&report);
        Ok(report)
    }

    /// The groups of a stream.
    pub async fn list_groups(&self, stream: &str) -> Result<Vec<GroupSummary>> {
        check_stream(stream)?;
        observed("list_groups", stream, "", self.inner.backend.list_groups(stream)).await
    }

    /// Dead letters of a group, oldest first.
    pub async fn dead_letters(&self, stream: &str, group: &str, opts: DeadLetterOptions) -> Result<Vec<DeadLetter>> {
        check_group(stream, group)?;
        validate_limit("limit", opts.limit)?;
        observed("dead_letters", stream, group, self.inner.backend.dead_letters(stream, group, &opts)).await
    }

    /// Lag, in-flight and dead-letter counts of a group.
    pub async fn group_info(&self, stream: &str, group: &str) -> Result<GroupInfo> {
        check_group(stream, group)?;
        let info = observed("group_info", stream, group, self.inner.backend.group_info(stream, group)).await?;
        observe::group_info(&info);
        Ok(info)
    }

    /// A subscription to appends on `stream` (see [`Subscription`]): keep
    /// one per consumer loop and wait on it between fetches that came back
    /// empty. On a backend without wakeups its waits just sleep (polling).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
    /// # let rheo = rheo::Rheo::open("memory:").await?;
    /// # rheo.create_stream("orders", rheo::StreamOptions::new()).await?;
    /// let mut appends = rheo.subscribe("orders").await?;
    /// rheo.append("orders", &serde_json::json!({"n": 1}), rheo::AppendOptions::new()).await?;
    /// // Appended since subscribing: returns at once.
    /// assert!(appends.wait(std::time::Duration::from_secs(60)).await);
    /// # Ok::<(), rheo::Error>(()) }).expect("example");
    /// ```
    pub async fn subscribe(&self, stream: &str) -> Result<Subscription> {
        check_stream(stream)?;
        observed("subscribe", stream, "", self.inner.backend.subscribe(stream)).await
    }

    /// Waits until events are appended to `stream`, or `timeout` (a
    /// subscription made for this one wait: appends before the call are not
    /// seen; a loop keeps one from [`Rheo::subscribe`] instead).
    pub async fn wait_for_events(&self, stream: &str, timeout: Duration) -> Result<()> {
        self.subscribe(stream).await?.wait(timeout).await;
        Ok(())
    }
}

fn encode<T: Serialize + ?Sized>(stream: &str, payload: &T) -> Result<Payload> {
    Payload::encode(payload).map_err(|e| e.payload_context(|| format!("appended to stream {stream:?}")))
}

/// Checks a settle reason: at most [`MAX_REASON_BYTES`] bytes.
fn check_reason(reason: &str) -> Result<()> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(Error::invalid(
            "reason",
            format!("{} bytes is above the maximum {MAX_REASON_BYTES}", reason.len()),
        ));
    }
    Ok(())
}

/// An index being built in the background (from [`Rheo::create_index`]).
#[derive(Debug, Clone)]
pub struct IndexBuild {
    rheo: Rheo,
    stream: String,
    field: String,
}

/// How often [`IndexBuild::wait`] looks at the progress.
const INDEX_POLL: Duration = Duration::from_millis(50);

impl IndexBuild {
    /// The canonical field being indexed.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Its progress now.
    pub async fn status(&self) -> Result<IndexStatus> {
        let all = self.rheo.index_status(&self.stream).await?;
        all.into_iter().find(|s| s.field == self.field).ok_or_else(|| {
            Error::failed("index_status", format!("stream {:?} reports no index on {:?}", self.stream, self.field))
        })
    }

    /// Waits until every segment is indexed, calling `progress` each time
    /// the count changes (and once at the start); returns the final status.
    pub async fn wait(&self, mut progress: impl FnMut(&IndexStatus)) -> Result<IndexStatus> {
        let mut last: Option<IndexStatus> = None;
        loop {
            let s = self.status().await?;
            if last.as_ref() != Some(&s) {
                progress(&s);
            }
            if s.ready() {
                return Ok(s);
            }
            if s.segments_failed > 0 && s.segments_ready + s.segments_failed >= s.segments_total {
                return Err(Error::failed(
                    "create_index",
                    format!(
                        "stream {:?}: the index on {:?} could not be built for {} of {} segments (see the log); queries scan them, and the build is retried",
                        self.stream, self.field, s.segments_failed, s.segments_total
                    ),
                ));
            }
            last = Some(s);
            tokio::time::sleep(INDEX_POLL).await;
        }
    }
}

/// Runs a backend call in a `tracing` span named `rheo` (fields `op`,
/// `stream`, `group`), logging a failure at debug level; the names are in
/// `docs/observability.md`.
async fn observed<T>(
    op: &'static str,
    stream: &str,
    group: &str,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    use tracing::Instrument;
    let span = tracing::debug_span!("rheo", op, stream, group);
    let r = call.instrument(span.clone()).await;
    if let Err(e) = &r {
        span.in_scope(|| tracing::debug!(error = %e, "backend call failed"));
    }
    r
}
#[cfg(test)]
mod future_size {
    /// A single append's future is moved whole on its way to being polled
    /// (into the caller's own future, or a task): it stays small, so that
    /// the copies stay cheap (issue 34; it was 2,288 bytes, and the copies
    /// took ~10 % of a `None` append's CPU).
    #[tokio::test]
    async fn an_append_future_stays_under_a_kilobyte() {
        let rheo = super::Rheo::open("memory:").await.expect("open");
        let payload = serde_json::json!({"n": 1});
        let append = rheo.append("s", &payload, crate::AppendOptions::new());
        let encoded = rheo.append_encoded("s", crate::Payload::from_value(&payload), crate::AppendOptions::new());
        for (call, size) in
            [("append", std::mem::size_of_val(&append)), ("append_encoded", std::mem::size_of_val(&encoded))]
        {
            assert!(size <= 1024, "{call}'s future is {size} bytes");
        }
    }

    /// The payload is serialized when `append` is called: its future does
    /// not borrow it (this compiles only so).
    #[tokio::test]
    async fn an_append_future_outlives_its_payload() {
        let rheo = super::Rheo::open("memory:").await.expect("open");
        rheo.create_stream("s", crate::StreamOptions::new()).await.expect("stream");
        let append = {
            let payload = serde_json::json!({"n": 1});
            rheo.append("s", &payload, crate::AppendOptions::new())
        };
        assert_eq!(append.await.expect("append").sequence(), 1);
    }
}
