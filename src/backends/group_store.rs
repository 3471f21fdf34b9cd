//! The consumer-group operations of the database backends, written once
//! over a narrow storage port (ADR 0028).
//!
//! SQL, MongoDB and Redis keep a group the same way: a document (row, hash)
//! with a frontier and a cursor per partition, beside the stream's high
//! watermarks, and one delivery record per position that has one. What
//! differs is how a step is stored atomically: a transaction, a
//! multi-document transaction, a script. So each backend implements
//! [`GroupStore`] — reading a group, and one atomic step per operation —
//! and the checks, plans and answers around those steps live here:
//! [`create_group`], [`skip`], [`replay`], [`reset`], [`lag`],
//! [`group_info`] and [`retry`].
//!
//! The port's steps are the same statements, commands and scripts the
//! backends ran before (the fast shapes of ADR 0019–0025): a step here is
//! one round trip or one transaction, and an orchestration adds none.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backends::common::{self, GroupRow, GroupSettings, QueryPages};
use crate::error::{Error, Result};
use crate::groups::retention::new_start;
use crate::groups::rules;
use crate::model::group::{DeadLetter, DeadLetterOptions, FetchOptions};
use crate::model::group::{
    GroupInfo, GroupOptions, GroupSummary, Lag, Replay, ReplayFrom, Reset, StartPosition, check_partitions,
};
use crate::model::lease::{FetchReport, Lease, LeaseRef, RetryOutcome};
use crate::model::retention::{DroppedRange, GroupSkip, Retention, RetentionPolicy, RetentionReport};
use crate::model::time::Timestamp;

/// A group's deliveries by state, as [`GroupInfo`] gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DeliveryCounts {
    /// Leased to a consumer (expired leases not yet reclaimed included).
    pub inflight: u64,
    /// Waiting out a retry backoff.
    pub retry_waiting: u64,
    /// Dead-lettered.
    pub dead_letters: u64,
    /// Set aside until their scheduled time (ADR 0036).
    pub scheduled: u64,
    /// The earliest time among them.
    pub next_due: Option<Timestamp>,
}

/// A group to store: its attempts, its frontiers (each cursor one past
/// its frontier) and its settings.
#[derive(Clone, Copy)]
pub(crate) struct NewGroup<'a> {
    pub max_attempts: u32,
    pub frontiers: &'a BTreeMap<u32, u64>,
    pub settings: &'a GroupSettings,
}

/// The storage port of a database backend's groups: reads, and one atomic
/// step per group operation. Each step is one transaction or script; it
/// re-checks under its lock what the orchestration checked before it (a
/// concurrent call may have moved the group), and answers `GroupNotFound`
/// when the group went away.
pub(crate) trait GroupStore: QueryPages + Send + Sync {
    /// A stream's partition count and the high watermark of each
    /// partition. `StreamNotFound`.
    fn stream_marks(&self, stream: &str) -> impl Future<Output = Result<(u32, Vec<u64>)>> + Send;

    /// A group with its stream's high watermarks: `StreamNotFound`, then
    /// `GroupNotFound`.
    fn load_group(&self, stream: &str, group: &str) -> impl Future<Output = Result<GroupRow>> + Send;

    /// The first sequence retention kept in each partition (`hws` are the
    /// stream's high watermarks; a partition retention emptied starts
    /// past its high watermark).
    fn log_starts(&self, stream: &str, hws: &[u64]) -> impl Future<Output = Result<Vec<u64>>> + Send;

    /// Per partition (of `count`), the first sequence with a timestamp at
    /// or after `t`; partitions with none are left out.
    fn first_at_or_after(
        &self,
        stream: &str,
        count: u32,
        t: Timestamp,
    ) -> impl Future<Output = Result<BTreeMap<u32, u64>>> + Send;

    /// Stores a new group with its frontiers (each cursor one past its
    /// frontier) and settings; returns its creation time. `AlreadyExists`.
    fn insert_group(
        &self,
        stream: &str,
        group: &str,
        new: &NewGroup<'_>,
    ) -> impl Future<Output = Result<Timestamp>> + Send;

    /// Dead-letters one position `at` (partition, sequence) with `reason` (already prefixed), whatever
    /// its state, and moves the frontier past it when it can. True when it
    /// did, false when it already was a dead letter; `already_settled`
    /// when it was acknowledged or is behind the frontier.
    fn skip_position(
        &self,
        stream: &str,
        group: &str,
        at: (u32, u64),
        reason: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Reopens every settled delivery after each start (partition,
    /// sequence) up to the partition's high watermark in `hws`; returns
    /// how many.
    fn reopen_after(
        &self,
        stream: &str,
        group: &str,
        starts: &[(u32, u64)],
        hws: &[u64],
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Reopens exactly these (partition, sequence, event id) deliveries;
    /// returns how many.
    fn reopen_matches(
        &self,
        stream: &str,
        group: &str,
        matched: &[(u32, u64, String)],
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Clears the group's deliveries in the partitions of `starts` and
    /// restarts each at its frontier.
    fn restart(
        &self,
        stream: &str,
        group: &str,
        starts: &BTreeMap<u32, u64>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Brings `g`'s frontiers in `scope` up to what is settled, where a
    /// backend stores them lazily (SQL's flushed frontiers). The default:
    /// they are stored as they move.
    fn settled_frontiers(
        &self,
        _stream: &str,
        _group: &str,
        _g: &mut GroupRow,
        _scope: &[u32],
    ) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// How many of the group's deliveries are in flight, waiting out a
    /// backoff and dead-lettered.
    fn delivery_counts(
        &self,
        stream: &str,
        group: &str,
        scope: &[u32],
    ) -> impl Future<Output = Result<DeliveryCounts>> + Send;

    /// What a lease holds: None when it is stale.
    fn held_attempt(&self, lease: &LeaseRef) -> impl Future<Output = Result<Option<Held>>> + Send;

    /// Dead-letters a held delivery (`reason` already prefixed) at
    /// `held.now`. False when the lease no longer holds it.
    fn dead_letter(&self, lease: &LeaseRef, held: Held, reason: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Gives a held delivery back, claimable from `available_at` (at once
    /// when that is not after `held.now`). False when the lease no longer
    /// holds it at `held.attempt`.
    fn reschedule(
        &self,
        lease: &LeaseRef,
        held: Held,
        reason: &str,
        available_at: Timestamp,
    ) -> impl Future<Output = Result<bool>> + Send;
}

/// What a lease holds when a retry decides: the delivery's attempt, and
/// the time the decision is made at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub attempt: u32,
    pub now: Timestamp,
}

/// Creates a group: checks its options against the stream, places its
/// frontiers at its start and stores it.
pub(crate) async fn create_group<S: GroupStore + ?Sized>(
    store: &S,
    stream: &str,
    group: &str,
    opts: &GroupOptions,
) -> Result<GroupSummary> {
    let (count, hws) = store.stream_marks(stream).await?;
    opts.validate(stream, count)?;
    let subset = opts.partitions.as_ref().map(|ps| {
        let mut ps = ps.clone();
        ps.sort_unstable();
        ps.dedup();
        ps
    });
    let parts: Vec<u32> = subset.clone().unwrap_or_else(|| (0..count).collect());
    let frontiers = start_frontiers(store, stream, count, &opts.start, &parts, &hws).await?;
    let settings = GroupSettings {
        partitions: subset.clone(),
        retry_backoff: opts.retry_backoff,
        ordered_by_key: opts.ordered_by_key,
        ..GroupSettings::default()
    };
    let new = NewGroup { max_attempts: opts.max_attempts, frontiers: &frontiers, settings: &settings };
    let created_at = store.insert_group(stream, group, &new).await?;
    Ok(GroupSummary {
        name: group.to_owned(),
        max_attempts: opts.max_attempts,
        partitions: subset,
        created_at,
        ordered_by_key: opts.ordered_by_key,
    })
}

/// The frontier a group starts at in each partition of `parts`.
async fn start_frontiers<S: GroupStore + ?Sized>(
    store: &S,
    stream: &str,
    count: u32,
    start: &StartPosition,
    parts: &[u32],
    hws: &[u64],
) -> Result<BTreeMap<u32, u64>> {
    let firsts = match start {
        StartPosition::At(t) => store.first_at_or_after(stream, count, *t).await?,
        _ => BTreeMap::new(),
    };
    let log_starts = store.log_starts(stream, hws).await?;
    Ok(common::start_frontiers(start, parts, hws, &firsts, &log_starts))
}

/// Dead-letters one position of a group without reading its event (see
/// [`crate::backend::Backend::skip`]).
pub(crate) async fn skip<S: GroupStore + ?Sized>(
    store: &S,
    stream: &str,
    group: &str,
    partition: u32,
    sequence: u64,
    reason: &str,
) -> Result<bool> {
    let g = store.load_group(stream, group).await?;
    common::check_skip(&g, stream, group, partition, sequence)?;
    let log_start = store.log_starts(stream, &g.hws).await?.get(partition as usize).copied().unwrap_or(1);
    if sequence < log_start {
        return Err(common::dropped_by_retention(stream, partition, sequence, log_start));
    }
    store.skip_position(stream, group, (partition, sequence), &rules::skipped(reason)).await
}

/// Reopens deliveries from a sequence, a time or a query's matches.
pub(crate) async fn replay<S: GroupStore + ?Sized>(
    store: &S,
    stream: &str,
    group: &str,
    replay: &Replay,
) -> Result<u64> {
    let g = store.load_group(stream, group).await?;
    let scope = g.scope(stream, replay.partitions.as_deref())?;
    let starts: Vec<(u32, u64)> = match &replay.from {
        ReplayFrom::Sequence(from) => {
            // From before the log start: from it.
            let log_starts = store.log_starts(stream, &g.hws).await?;
            let first = |p: u32| log_starts.get(p as usize).copied().unwrap_or(1).saturating_sub(1);
            scope.iter().map(|&p| (p, (*from).max(first(p)))).collect()
        }
        ReplayFrom::Time(t) => {
            let firsts = store.first_at_or_after(stream, g.count, *t).await?;
            common::replay_time_starts(stream, group, &scope, &firsts, *t)?
        }
        ReplayFrom::Query(q) => {
            let matched = common::all_matches(store, q, &scope).await?;
            return store.reopen_matches(stream, group, &matched).await;
        }
    };
    store.reopen_after(stream, group, &starts, &g.hws).await
}

/// Clears the group's state in scope and restarts it at `reset.start`.
pub(crate) async fn reset<S: GroupStore + ?Sized>(store: &S, stream: &str, group: &str, reset: &Reset) -> Result<()> {
    let g = store.load_group(stream, group).await?;
    if let StartPosition::AfterPerPartition(m) = &reset.start {
        check_partitions(stream, &m.keys().copied().collect::<Vec<_>>(), g.count)?;
    }
    let scope = g.scope(stream, reset.partitions.as_deref())?;
    let starts = start_frontiers(store, stream, g.count, &reset.start, &scope, &g.hws).await?;
    store.restart(stream, group, &starts).await
}

/// Lag per partition of the group (or of `partitions`).
pub(crate) async fn lag<S: GroupStore + ?Sized>(
    store: &S,
    stream: &str,
    group: &str,
    partitions: Option<&[u32]>,
) -> Result<Lag> {
    let mut g = store.load_group(stream, group).await?;
    let scope = g.scope(stream, partitions)?;
    store.settled_frontiers(stream, group, &mut g, &scope).await?;
    Ok(g.lag(stream, group, &scope))
}

/// A group's settings, lag and delivery counts.
pub(crate) async fn group_info<S: GroupStore + ?Sized>(store: &S, stream: &str, group: &str) -> Result<GroupInfo> {
    let mut g = store.load_group(stream, group).await?;
    let scope = g.partitions();
    store.settled_frontiers(stream, group, &mut g, &scope).await?;
    let n = store.delivery_counts(stream, group, &scope).await?;
    Ok(GroupInfo {
        summary: g.summary(group),
        lag: g.lag(stream, group, &scope),
        inflight: n.inflight,
        retry_waiting: n.retry_waiting,
        dead_letters: n.dead_letters,
        retention_skipped: g.settings.retention_skipped,
        scheduled: n.scheduled,
        next_due: n.next_due,
    })
}

/// Gives a delivery back: rescheduled after its backoff while it has
/// attempts left, else dead-lettered (`max_attempts: <reason>`). The
/// decision rests on the attempt the lease holds; the step applies it
/// only while the lease still holds that attempt.
pub(crate) async fn retry<S: GroupStore + ?Sized>(
    store: &S,
    lease: &LeaseRef,
    reason: &str,
    delay: Option<Duration>,
) -> Result<RetryOutcome> {
    let g = store.load_group(&lease.stream, &lease.group).await?;
    let Some(held) = store.held_attempt(lease).await? else { return Err(lease.stale()) };
    let decision = rules::retry(held.attempt, g.max_attempts, reason, delay, &g.settings.retry_backoff, held.now);
    let outcome = decision.outcome();
    let done = match decision {
        rules::RetryDecision::DeadLetter { reason } => store.dead_letter(lease, held, &reason).await?,
        rules::RetryDecision::Reschedule { available_at } => {
            store.reschedule(lease, held, reason, available_at).await?
        }
    };
    if done { Ok(outcome) } else { Err(lease.stale()) }
}

/// The batch settles of the transactional backends (SQL, MongoDB), a
/// group at a time: [`per_group`].
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) trait SettleStore: GroupStore {
    /// Why settles on (stream, group) can't hold: `StreamNotFound`, then
    /// `GroupNotFound`; None when both exist.
    fn missing(&self, stream: &str, group: &str) -> impl Future<Output = Result<Option<Error>>> + Send;

    /// Dead-letters the delivery `lease` holds with `reason` (already
    /// prefixed), now; false when the lease no longer holds it.
    fn reject_held(&self, lease: &LeaseRef, reason: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Where a dead letter stands in the order of a group's dead letters.
    type DeadLetterKey: Send + Sync;

    /// The key of the dead letter `at` names (None: it is not one).
    fn dead_letter_key(
        &self,
        stream: &str,
        group: &str,
        at: DeadLetterAt<'_>,
    ) -> impl Future<Output = Result<Option<Self::DeadLetterKey>>> + Send;

    /// Up to `limit` dead letters of a group in order, after `after` (from
    /// the first when None).
    fn dead_letter_page(
        &self,
        stream: &str,
        group: &str,
        after: Option<&Self::DeadLetterKey>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>>> + Send;
}

/// A dead letter a page starts after: by position or by event id.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) enum DeadLetterAt<'a> {
    Position(u32, u64),
    Event(&'a str),
}

/// A page of a group's dead letters: in the order they were
/// dead-lettered (those the Elixir reference wrote, which carry no order
/// mark, first; then by time, partition and sequence), after the cursor
/// `opts` names. `CursorNotFound` when it names no dead letter.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) async fn dead_letters<S: SettleStore + ?Sized>(
    store: &S,
    stream: &str,
    group: &str,
    opts: &DeadLetterOptions,
) -> Result<Vec<DeadLetter>> {
    store.load_group(stream, group).await?;
    let at = match (opts.after_position, &opts.after) {
        (Some((p, q)), _) => Some((DeadLetterAt::Position(p, q), format!("{p}:{q}"))),
        (None, Some(id)) => Some((DeadLetterAt::Event(id), id.clone())),
        (None, None) => None,
    };
    let key =
        match at {
            Some((at, cursor)) => Some(store.dead_letter_key(stream, group, at).await?.ok_or_else(|| {
                Error::CursorNotFound { scope: format!("dead letters of {stream:?}/{group:?}"), cursor }
            })?),
            None => None,
        };
    store.dead_letter_page(stream, group, key.as_ref(), opts.limit).await
}

/// Rejects a lease: its delivery becomes a dead letter at once. A lease
/// that no longer holds it is stale, unless its stream or group is gone.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) async fn reject<S: SettleStore + ?Sized>(store: &S, lease: &LeaseRef, reason: &str) -> Result<()> {
    match store.reject_held(lease, &rules::rejected(reason)).await {
        Ok(true) => Ok(()),
        Ok(false) | Err(Error::GroupNotFound { .. }) => {
            Err(store.missing(&lease.stream, &lease.group).await?.unwrap_or_else(|| lease.stale()))
        }
        Err(e) => Err(e),
    }
}

/// Runs a batch settle or renewal a group at a time: `step` takes one
/// group's leases (their indexes in `leases`) and answers, by position,
/// what it did to each it still held. A lease it did not reach is stale,
/// unless its stream or group is gone, which all that group's leases then
/// answer (as they do when `step` finds the group gone).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) async fn per_group<S, T, F, Fut>(store: &S, leases: &[LeaseRef], mut step: F) -> Result<Vec<Result<T>>>
where
    S: SettleStore + ?Sized,
    T: Clone,
    F: FnMut(Arc<str>, Arc<str>, Vec<usize>) -> Fut,
    Fut: Future<Output = Result<HashMap<(u32, u64), T>>>,
{
    let mut out: Vec<Result<T>> = Vec::with_capacity(leases.len());
    out.resize_with(leases.len(), || Err(Error::failed("settle", "no result")));
    for ((stream, group), idx) in common::by_group(leases) {
        let (mut done, missing) = match step(stream.clone(), group.clone(), idx.clone()).await {
            Ok(done) if done.len() >= idx.len() => (done, None),
            Ok(done) => (done, store.missing(&stream, &group).await?),
            Err(e @ Error::GroupNotFound { .. }) => {
                (HashMap::new(), Some(store.missing(&stream, &group).await?.unwrap_or(e)))
            }
            Err(e) => return Err(e),
        };
        for i in idx {
            let l = &leases[i];
            out[i] = match &missing {
                Some(e) => Err(e.clone()),
                None => done.remove(&(l.partition, l.sequence)).ok_or_else(|| l.stale()),
            };
        }
    }
    Ok(out)
}

/// The leases a claim took and the spent positions it dead-lettered.
pub(crate) type Taken = (Vec<Lease>, Vec<(u32, u64)>);

/// A claim a fetch makes: the group, the partitions it takes from, the attempts a
/// delivery may have, for whom and for how long.
#[derive(Clone, Copy)]
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) struct ClaimSpec<'a> {
    pub stream: &'a str,
    pub group: &'a str,
    pub scope: &'a [u32],
    #[cfg_attr(not(feature = "mongo"), allow(dead_code))]
    pub max_attempts: u32,
    pub consumer: &'a str,
    pub lease: Duration,
    /// Per-key order: claim only what heads its key (MongoDB).
    #[cfg_attr(not(feature = "mongo"), allow(dead_code))]
    pub ordered_by_key: bool,
}

/// The fetch of a backend that adds delivery records ahead of its claims
/// (MongoDB; SQL with `rheo_claims=rows`): [`fetch_materialized`].
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) trait MaterializedFetch: GroupStore {
    /// Delivery records one materialization adds per partition at least
    /// (else 8 fetches' worth).
    const MATERIALIZE_MIN: u64;

    /// Adds delivery records for the next `chunk` events of each partition
    /// of `parts` at or after its cursor, and moves the cursors past them.
    /// With `only_near`, a partition another consumer materialized
    /// meanwhile may be left as it is (consumers that all see the window
    /// run low at once don't each add a chunk). A backend that schedules
    /// sets aside (parks) at most `budget` events scheduled after now, and
    /// returns how many; the others return 0.
    fn materialize(
        &self,
        stream: &str,
        group: &str,
        parts: &[u32],
        chunk: u64,
        budget: usize,
        only_near: bool,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Claims up to `limit` delivery records; returns the leases and the
    /// spent positions it dead-lettered.
    fn claim(&self, spec: &ClaimSpec<'_>, limit: usize) -> impl Future<Output = Result<Taken>> + Send;

    /// After positions were dead-lettered outside the group lock (spent
    /// leases a claim met): orders them and moves the frontier.
    fn settled(&self, stream: &str, group: &str, dead: &[(u32, u64)]) -> impl Future<Output = Result<()>> + Send;
}

/// A fetch over delivery records: the partitions whose window runs low
/// are materialized first; when the claim leaves the fetch short, the
/// other partitions behind their high watermark too, and it claims again.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) async fn fetch_materialized<S: MaterializedFetch + ?Sized>(
    store: &S,
    stream: &str,
    group: &str,
    opts: &FetchOptions,
) -> Result<FetchReport> {
    let g = store.load_group(stream, group).await?;
    let scope = g.scope(stream, opts.partitions.as_deref())?;
    if scope.is_empty() {
        return Ok(FetchReport::default());
    }
    let (chunk, behind, near) = common::materialize_plan(&g, &scope, opts.limit, S::MATERIALIZE_MIN);
    let mut budget = crate::groups::scheduled_budget(opts.limit);
    let mut scheduled = 0;
    if !near.is_empty() {
        scheduled = store.materialize(stream, group, &near, chunk, budget, true).await?;
        budget = budget.saturating_sub(usize::try_from(scheduled).unwrap_or(usize::MAX)).max(1);
    }
    let consumer = opts.consumer_id.as_deref().unwrap_or_default();
    let spec = ClaimSpec {
        stream,
        group,
        scope: &scope,
        max_attempts: g.max_attempts,
        consumer,
        lease: opts.lease,
        ordered_by_key: g.settings.ordered_by_key,
    };
    let (mut leases, mut spent) = store.claim(&spec, opts.limit).await?;
    let rest: Vec<u32> = behind.iter().copied().filter(|p| !near.contains(p)).collect();
    if leases.len() < opts.limit && !rest.is_empty() {
        scheduled += store.materialize(stream, group, &rest, chunk, budget, false).await?;
        let (more, more_spent) = store.claim(&spec, opts.limit - leases.len()).await?;
        leases.extend(more);
        spent.extend(more_spent);
    }
    leases.sort_by_key(|l| (l.event.partition(), l.event.sequence()));
    order_spent(store, stream, group, spent).await;
    Ok(FetchReport { leases, scheduled, ..FetchReport::default() })
}

/// Orders the positions a fetch's claim dead-lettered and moves the
/// frontier past them. The claim is made: failing the fetch now would
/// strand its leases until they expire, so a failure is logged, and the
/// next settle's advance redoes the order marks and the frontier move.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) async fn order_spent<S: MaterializedFetch + ?Sized>(
    store: &S,
    stream: &str,
    group: &str,
    mut spent: Vec<(u32, u64)>,
) {
    if spent.is_empty() {
        return;
    }
    spent.sort_unstable();
    if let Err(e) = store.settled(stream, group, &spent).await {
        tracing::warn!(stream, group, error = %e, "ordering dead letters after a claim failed");
    }
}

/// What a retention pass does to a stream: each partition's new start
/// (where nothing is dropped, its current start), the ranges it drops
/// (partition, first, new start), and whether the interest policy's
/// ceiling decided any.
#[derive(Debug, Default)]
pub(crate) struct RetentionPlan {
    pub starts: BTreeMap<u32, u64>,
    pub drops: Vec<(u32, u64, u64)>,
    pub ceiling_hit: bool,
}

impl RetentionPlan {
    /// Plans a pass: per partition, `starts` is its log start, `hws` its
    /// high watermark and `limits` the start its retention limits allow;
    /// `groups` are the stream's groups (their settled frontiers).
    pub(crate) fn new(
        policy: RetentionPolicy,
        starts: &[u64],
        hws: &[u64],
        limits: &[u64],
        groups: &[&GroupRow],
    ) -> Self {
        let mut plan = Self::default();
        for (p, ((&start, &hw), &limits)) in (0u32..).zip(starts.iter().zip(hws).zip(limits)) {
            let interest = groups
                .iter()
                .filter(|g| g.partitions().contains(&p))
                .map(|g| g.frontiers.get(&p).copied().unwrap_or(0).saturating_add(1))
                .min();
            let (new, ceiling) = new_start(policy, limits, interest);
            let new = new.min(hw + 1).max(start);
            if new > start {
                plan.ceiling_hit |= ceiling;
                plan.drops.push((p, start, new));
            }
            // Groups behind the start (moved by an earlier pass that failed
            // before its deletes, or created meanwhile) move too.
            plan.starts.insert(p, new);
        }
        plan
    }

    /// True when `g` has a frontier below a planned start.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
    pub(crate) fn leaves_behind(&self, g: &GroupRow) -> bool {
        self.starts.iter().any(|(&p, &s)| g.frontiers.get(&p).is_some_and(|&f| f.saturating_add(1) < s))
    }
}

/// One partition a retention pass moves a group in: its frontier goes from
/// `frontier` to `start - 1`, its cursor to at least `start`; positions
/// from `fresh_from` (the cursor) on were never handed out.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) struct PartitionMove {
    pub partition: u32,
    pub start: u64,
    pub frontier: u64,
    pub fresh_from: u64,
}

#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
impl PartitionMove {
    /// The group's new frontier in the partition.
    pub(crate) fn below(&self) -> u64 {
        self.start.saturating_sub(1)
    }

    /// The positions never handed out among those the move passes.
    pub(crate) fn fresh(&self) -> u64 {
        self.start.saturating_sub(self.fresh_from)
    }
}

/// A group's move past a retention plan's starts, under its lock (see
/// [`RetentionStore::move_group`]): the partitions it moves in, and then
/// its new maps and what each partition skipped.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) struct GroupMove {
    pub frontiers: BTreeMap<u32, u64>,
    pub cursors: BTreeMap<u32, u64>,
    pub moved: std::collections::BTreeSet<u32>,
    pub skipped: Vec<(u32, u64)>,
}

#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
impl GroupMove {
    pub(crate) fn new(frontiers: BTreeMap<u32, u64>, cursors: BTreeMap<u32, u64>) -> Self {
        GroupMove { frontiers, cursors, moved: Default::default(), skipped: Vec::new() }
    }

    /// The partitions of `plan` (partition -> start) the group is behind.
    pub(crate) fn steps(&self, plan: &BTreeMap<u32, u64>) -> Vec<PartitionMove> {
        plan.iter()
            .filter_map(|(&partition, &start)| {
                let &frontier = self.frontiers.get(&partition)?;
                if frontier >= start.saturating_sub(1) {
                    return None;
                }
                let (_, c) = common::frontier_cursor(&self.frontiers, &self.cursors, partition);
                Some(PartitionMove { partition, start, frontier, fresh_from: (frontier + 1).max(c) })
            })
            .collect()
    }

    /// Records a partition moved, with the unsettled positions it skipped.
    pub(crate) fn record(&mut self, m: &PartitionMove, skipped: u64) {
        let (_, c) = common::frontier_cursor(&self.frontiers, &self.cursors, m.partition);
        self.frontiers.insert(m.partition, m.below());
        self.cursors.insert(m.partition, c.max(m.start));
        self.moved.insert(m.partition);
        if skipped > 0 {
            self.skipped.push((m.partition, skipped));
        }
    }

    /// What it skipped in all.
    pub(crate) fn total(&self) -> u64 {
        self.skipped.iter().map(|(_, n)| n).sum()
    }

    /// The group's settings (as stored, `stored`) with what the move
    /// skipped counted. Settings it cannot read are refused, not replaced:
    /// writing defaults over them would lose them.
    pub(crate) fn counted(&self, stream: &str, group: &str, stored: Option<&str>) -> Result<GroupSettings> {
        let mut settings: GroupSettings = match stored {
            Some(t) => serde_json::from_str(t).map_err(|e| {
                Error::failed("enforce_retention", format!("group {stream:?}/{group:?}: settings: {e}"))
            })?,
            None => GroupSettings::default(),
        };
        settings.retention_skipped = settings.retention_skipped.saturating_add(self.total());
        Ok(settings)
    }
}

/// The retention steps of a database backend whose pass is a sequence of
/// steps (SQL, MongoDB): each group moved in one transaction, then the
/// events deleted in batches.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) trait RetentionStore: GroupStore {
    /// A stream's stored retention as JSON (None: unlimited).
    /// `StreamNotFound`.
    fn retention_text(&self, stream: &str) -> impl Future<Output = Result<Option<String>>> + Send;

    /// The first sequence of partition `p` whose timestamp is at most `age`
    /// old by the backend's clock (None: every event is older).
    fn first_younger_than(
        &self,
        stream: &str,
        p: u32,
        age: std::time::Duration,
    ) -> impl Future<Output = Result<Option<u64>>> + Send;

    /// The newest sequence of partition `p` at which the bytes of its
    /// events, summed newest first, pass `max` (None: they never do).
    fn newest_past_bytes(&self, stream: &str, p: u32, max: u64) -> impl Future<Output = Result<Option<u64>>> + Send;

    /// The names of a stream's groups.
    fn group_names(&self, stream: &str) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// Moves one group past each partition's planned start, under its
    /// lock: the unsettled positions below a start are counted as skipped,
    /// its deliveries below it go (dead letters stay), the frontier and
    /// cursor move up. Returns (partition, skipped) where it skipped any.
    fn move_group(
        &self,
        stream: &str,
        group: &str,
        starts: &BTreeMap<u32, u64>,
    ) -> impl Future<Output = Result<Vec<(u32, u64)>>> + Send;

    /// Deletes partition `p`'s events below `start`; returns their bytes.
    fn delete_below(&self, stream: &str, p: u32, start: u64) -> impl Future<Output = Result<u64>> + Send;

    /// The streams that have a retention (a background round's list).
    fn retained_streams(&self) -> impl Future<Output = Result<Vec<String>>> + Send;
}

/// One retention pass over a stream: every group behind a new start is
/// moved to it first (what it skipped is counted), then the events go.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) async fn enforce_retention<S: RetentionStore + ?Sized>(store: &S, stream: &str) -> Result<RetentionReport> {
    let retention = retention_of(store, stream).await?;
    let mut report = RetentionReport::new(stream);
    if retention.is_unlimited() {
        return Ok(report);
    }
    let (count, hws) = store.stream_marks(stream).await?;
    let starts = store.log_starts(stream, &hws).await?;
    let mut groups = Vec::new();
    for name in store.group_names(stream).await? {
        let mut g = store.load_group(stream, &name).await?;
        let parts = g.partitions();
        // The interest policy drops what is settled: as settled, not as
        // last stored.
        store.settled_frontiers(stream, &name, &mut g, &parts).await?;
        groups.push((name, g));
    }
    let mut limits = Vec::with_capacity(count as usize);
    for (p, (&start, &hw)) in (0u32..).zip(starts.iter().zip(&hws)) {
        limits.push(limits_start(store, stream, p, &retention, start, hw).await?);
    }
    let plan = RetentionPlan::new(
        retention.policy,
        &starts,
        &hws,
        &limits,
        &groups.iter().map(|(_, g)| g).collect::<Vec<_>>(),
    );
    report.ceiling_hit = plan.ceiling_hit;
    for (name, g) in &groups {
        if plan.leaves_behind(g) {
            for (partition, skipped) in store.move_group(stream, name, &plan.starts).await? {
                report.skipped.push(GroupSkip { group: name.clone(), partition, skipped });
            }
        }
    }
    for &(partition, first, new) in &plan.drops {
        let bytes = store.delete_below(stream, partition, new).await?;
        report.dropped.push(DroppedRange { partition, first, last: new - 1, bytes });
    }
    Ok(report)
}

/// A stream's retention (unlimited when none is stored).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) async fn retention_of<S: RetentionStore + ?Sized>(store: &S, stream: &str) -> Result<Retention> {
    match store.retention_text(stream).await? {
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| Error::failed("retention", format!("stream {stream:?}: rheo_rs_stream_settings holds {e}"))),
        None => Ok(Retention::default()),
    }
}

/// The first sequence of partition `p` the age and size limits keep
/// (exact: event by event), at least `start` (`hw`: its high watermark).
async fn limits_start<S: RetentionStore + ?Sized>(
    store: &S,
    stream: &str,
    p: u32,
    r: &Retention,
    start: u64,
    hw: u64,
) -> Result<u64> {
    let mut first = start;
    if let Some(n) = r.max_events {
        first = first.max((hw + 1).saturating_sub(n));
    }
    if let Some(age) = r.max_age {
        first = first.max(store.first_younger_than(stream, p, age).await?.unwrap_or(hw + 1));
    }
    if let Some(max) = r.max_bytes
        && let Some(q) = store.newest_past_bytes(stream, p, max).await?
    {
        first = first.max(q.saturating_add(1));
    }
    Ok(first)
}

/// One background round of a [`RetentionStore`]: a pass over every stream
/// with a retention.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mongo")), allow(dead_code))]
pub(crate) async fn retention_round<S: RetentionStore + ?Sized>(store: &S) -> Result<Vec<RetentionReport>> {
    let mut out = Vec::new();
    for stream in store.retained_streams().await? {
        gather_pass(&mut out, &stream, enforce_retention(store, &stream).await);
    }
    Ok(out)
}

/// Keeps a background pass's report; a failure is logged (the next round
/// retries) and a stream deleted meanwhile passed over.
pub(crate) fn gather_pass(out: &mut Vec<RetentionReport>, stream: &str, pass: Result<RetentionReport>) {
    match pass {
        Ok(report) => out.push(report),
        Err(Error::StreamNotFound { .. }) => {}
        Err(e) => tracing::warn!(stream = %stream, error = %e, "retention pass failed; the next round retries"),
    }
}

/// `impl Backend` for a database backend that keeps its groups in a
/// transactional store (SQL, MongoDB): the methods given, then every other
/// one forwarded — group operations to this module's orchestrations,
/// storage to the backend's own `*_impl` methods (`renew`/`ack` as batches
/// of one). Redis's forwards go through its shared core and stay its own.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo"))]
macro_rules! database_backend {
    (impl Backend for $t:ty { $($own:tt)* }) => {
        #[async_trait::async_trait]
        impl $crate::backend::Backend for $t {
            $($own)*

            async fn ensure_schema(&self) -> $crate::error::Result<()> {
                self.ensure_schema_impl().await
            }

            async fn create_stream(
                &self,
                stream: &str,
                opts: &$crate::model::stream::StreamOptions,
            ) -> $crate::error::Result<$crate::model::stream::StreamInfo> {
                self.create_stream_impl(stream, opts).await
            }

            async fn create_group(
                &self,
                stream: &str,
                group: &str,
                opts: &$crate::model::group::GroupOptions,
            ) -> $crate::error::Result<$crate::model::group::GroupSummary> {
                $crate::backends::group_store::create_group(self, stream, group, opts).await
            }

            async fn read(
                &self,
                stream: &str,
                partition: u32,
                after: u64,
                limit: usize,
            ) -> $crate::error::Result<Vec<$crate::model::event::Event>> {
                self.read_impl(stream, partition, after, limit).await
            }

            async fn query(&self, query: &$crate::model::query::Query) -> $crate::error::Result<$crate::model::query::Page> {
                self.query_impl(query).await
            }

            async fn fetch(
                &self,
                stream: &str,
                group: &str,
                opts: &$crate::model::group::FetchOptions,
            ) -> $crate::error::Result<$crate::model::lease::FetchReport> {
                self.fetch_impl(stream, group, opts).await
            }

            async fn renew(
                &self,
                lease: &$crate::model::lease::LeaseRef,
                lease_duration: std::time::Duration,
            ) -> $crate::error::Result<$crate::model::time::Timestamp> {
                let mut all = self.renew_many_impl(std::slice::from_ref(lease), lease_duration).await?;
                all.pop().unwrap_or_else(|| Err($crate::error::Error::failed("renew", "no result")))
            }

            async fn renew_many(
                &self,
                leases: &[$crate::model::lease::LeaseRef],
                lease_duration: std::time::Duration,
            ) -> $crate::error::Result<Vec<$crate::error::Result<$crate::model::time::Timestamp>>> {
                self.renew_many_impl(leases, lease_duration).await
            }

            async fn ack(&self, lease: &$crate::model::lease::LeaseRef) -> $crate::error::Result<()> {
                let mut all = self.ack_many_impl(std::slice::from_ref(lease)).await?;
                all.pop().unwrap_or_else(|| Err($crate::error::Error::failed("ack", "no result")))
            }

            async fn ack_many(
                &self,
                leases: &[$crate::model::lease::LeaseRef],
            ) -> $crate::error::Result<Vec<$crate::error::Result<()>>> {
                self.ack_many_impl(leases).await
            }

            async fn retry(
                &self,
                lease: &$crate::model::lease::LeaseRef,
                reason: &str,
                delay: Option<std::time::Duration>,
            ) -> $crate::error::Result<$crate::model::lease::RetryOutcome> {
                $crate::backends::group_store::retry(self, lease, reason, delay).await
            }

            async fn reject(&self, lease: &$crate::model::lease::LeaseRef, reason: &str) -> $crate::error::Result<()> {
                $crate::backends::group_store::reject(self, lease, reason).await
            }

            async fn skip(
                &self,
                stream: &str,
                group: &str,
                partition: u32,
                sequence: u64,
                reason: &str,
            ) -> $crate::error::Result<bool> {
                $crate::backends::group_store::skip(self, stream, group, partition, sequence, reason).await
            }

            async fn replay(
                &self,
                stream: &str,
                group: &str,
                replay: &$crate::model::group::Replay,
            ) -> $crate::error::Result<u64> {
                $crate::backends::group_store::replay(self, stream, group, replay).await
            }

            async fn reset_group(
                &self,
                stream: &str,
                group: &str,
                reset: &$crate::model::group::Reset,
            ) -> $crate::error::Result<()> {
                $crate::backends::group_store::reset(self, stream, group, reset).await
            }

            async fn lag(
                &self,
                stream: &str,
                group: &str,
                partitions: Option<&[u32]>,
            ) -> $crate::error::Result<$crate::model::group::Lag> {
                $crate::backends::group_store::lag(self, stream, group, partitions).await
            }

            async fn list_groups(&self, stream: &str) -> $crate::error::Result<Vec<$crate::model::group::GroupSummary>> {
                self.list_groups_impl(stream).await
            }

            async fn dead_letters(
                &self,
                stream: &str,
                group: &str,
                opts: &$crate::model::group::DeadLetterOptions,
            ) -> $crate::error::Result<Vec<$crate::model::group::DeadLetter>> {
                $crate::backends::group_store::dead_letters(self, stream, group, opts).await
            }

            async fn group_info(&self, stream: &str, group: &str) -> $crate::error::Result<$crate::model::group::GroupInfo> {
                $crate::backends::group_store::group_info(self, stream, group).await
            }

            async fn create_index(&self, stream: &str, field: &str) -> $crate::error::Result<()> {
                self.create_index_impl(stream, field).await
            }

            async fn index_status(&self, stream: &str) -> $crate::error::Result<Vec<$crate::model::stream::IndexStatus>> {
                self.index_status_impl(stream).await
            }

            async fn stream_info(&self, stream: &str) -> $crate::error::Result<$crate::model::stream::StreamInfo> {
                self.stream_info_impl(stream).await
            }

            async fn set_retention(
                &self,
                stream: &str,
                retention: &$crate::model::retention::Retention,
            ) -> $crate::error::Result<$crate::model::stream::StreamInfo> {
                self.set_retention_impl(stream, retention).await
            }

            async fn enforce_retention(&self, stream: &str) -> $crate::error::Result<$crate::model::retention::RetentionReport> {
                $crate::backends::group_store::enforce_retention(self, stream).await
            }

            fn retention_interval(&self) -> Option<std::time::Duration> {
                (!self.retention_interval.is_zero()).then_some(self.retention_interval)
            }

            async fn retention_round(&self) -> $crate::error::Result<Vec<$crate::model::retention::RetentionReport>> {
                $crate::backends::group_store::retention_round(self).await
            }
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongo"))]
pub(crate) use database_backend;
