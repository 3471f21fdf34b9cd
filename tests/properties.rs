//! Property tests (proptest) of the rules in `docs/semantics.md`, each run against
//! every backend listed in `common::backends!` (as `<backend>::<property>`).
//!
//! Every case builds a fresh fixture (backend + manual clock) and a
//! current-thread tokio runtime. Case counts per property and backend (the
//! constants below), chosen so that the whole file runs in well under 60 s in
//! a debug build on 2 cores (memory backend: about 2 s):
//!
//! | property                                | cases | ops per case |
//! |-----------------------------------------|-------|--------------|
//! | `routing_is_stable`                     | 256   | up to 23     |
//! | `sequences_are_contiguous`              | 256   | up to 24     |
//! | `frontier_never_passes_a_hole`          | 128   | up to 59     |
//! | `old_lease_never_settles`               | 128   | up to 59     |
//! | `paging_returns_each_event_once`        | 256   | up to 39     |
//! | `paging_survives_appends_between_pages` | 128   | up to 29 + 9 batches |
//! | `groups_are_isolated`                   | 64    | up to 59 (two fixtures) |
//! | `backend_matches_model`                 | 64    | up to 79     |
//!
//! `PROPTEST_CASES=n` overrides every count (for soak runs).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use common::{Factory, Fixture, START};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use rheo::{
    AppendOptions, Backoff, Clock, DeadLetterOptions, Error, Event, FetchOptions, GroupOptions, Lease, LeaseRef,
    OrderBy, PartitionLag, Query, ReplayOptions, RetryOutcome, Rheo, StreamOptions, Timestamp, partition_for_key,
};
use serde_json::{Map, Value, json};

const STREAM: &str = "props";
const GROUP: &str = "g";
/// A limit large enough to read everything a case writes.
const ALL: usize = 10_000;

const ROUTING_CASES: u32 = 256;
const CONTIGUOUS_CASES: u32 = 256;
const FRONTIER_CASES: u32 = 128;
const LEASE_CASES: u32 = 128;
const PAGING_CASES: u32 = 256;
const PAGING_APPENDS_CASES: u32 = 128;
const ISOLATION_CASES: u32 = 64;
const MODEL_CASES: u32 = 64;

type CaseResult = Result<(), TestCaseError>;

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// The proptest config of a property: `cases` cases, unless the standard
/// `PROPTEST_CASES` environment variable asks for another count (for soak runs).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    ProptestConfig::with_cases(cases)
}

/// Runs one async case on a fresh current-thread runtime.
fn run(case: impl Future<Output = CaseResult>) -> CaseResult {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime builds").block_on(case)
}

fn fail(msg: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(msg.into())
}

/// Unwraps a library result, failing the case with context on error.
fn ok<T>(r: rheo::Result<T>, ctx: impl Display) -> Result<T, TestCaseError> {
    r.map_err(|e| fail(format!("{ctx}: unexpected error: {e}")))
}

/// START + `ms` milliseconds.
fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(START.as_millis() + ms)
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn ms_i64(ms: u64) -> i64 {
    i64::try_from(ms).expect("test durations are small")
}

fn seq_index(seq: u64) -> usize {
    usize::try_from(seq - 1).expect("test sequences are small")
}

fn seq_of(index: usize) -> u64 {
    u64::try_from(index).expect("test sequences are small") + 1
}

fn len_u64(n: usize) -> u64 {
    u64::try_from(n).expect("small")
}

/// A fresh fixture with stream `STREAM` of `partitions` partitions and the
/// given groups `(name, max_attempts)`.
async fn setup(factory: Factory, partitions: u32, groups: &[(&str, u32)]) -> Result<Fixture, TestCaseError> {
    let fx = factory().await;
    ok(fx.rheo.create_stream(STREAM, StreamOptions::new().partitions(partitions)).await, "create_stream")?;
    for &(group, max_attempts) in groups {
        ok(
            fx.rheo.create_group(STREAM, group, GroupOptions::new().max_attempts(max_attempts)).await,
            format!("create_group {group}"),
        )?;
    }
    Ok(fx)
}

async fn read_partition(rheo: &Rheo, partition: u32) -> Result<Vec<Event>, TestCaseError> {
    ok(rheo.read(STREAM, partition, 0, ALL).await, format!("read partition {partition}"))
}

async fn read_every_partition(rheo: &Rheo, partitions: u32) -> Result<Vec<Event>, TestCaseError> {
    let mut all = Vec::new();
    for p in 0..partitions {
        all.extend(read_partition(rheo, p).await?);
    }
    Ok(all)
}

/// How a lease is settled (renew counts as a settle: it needs the current lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SettleKind {
    Ack,
    Retry,
    Reject,
    /// Renew for this many milliseconds.
    Renew(u64),
    /// `retry_after` with this delay in milliseconds (0: at once).
    RetryAfter(u64),
}

/// What a settle returned.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Acked,
    Retried(RetryOutcome),
    Rejected,
    Renewed(Timestamp),
    Stale,
}

/// Settles without interpreting errors.
async fn settle_raw(rheo: &Rheo, lease: &LeaseRef, kind: SettleKind, reason: &str) -> rheo::Result<Outcome> {
    match kind {
        SettleKind::Ack => rheo.ack(lease).await.map(|()| Outcome::Acked),
        SettleKind::Retry => rheo.retry(lease, reason).await.map(Outcome::Retried),
        SettleKind::Reject => rheo.reject(lease, reason).await.map(|()| Outcome::Rejected),
        SettleKind::Renew(ms) => rheo.renew(lease, millis(ms)).await.map(Outcome::Renewed),
        SettleKind::RetryAfter(ms) => rheo.retry_after(lease, reason, millis(ms)).await.map(Outcome::Retried),
    }
}

/// Settles; `StaleLease` becomes [`Outcome::Stale`], any other error fails the case.
async fn settle(
    rheo: &Rheo,
    lease: &LeaseRef,
    kind: SettleKind,
    reason: &str,
    ctx: &str,
) -> Result<Outcome, TestCaseError> {
    match settle_raw(rheo, lease, kind, reason).await {
        Err(Error::StaleLease { .. }) => Ok(Outcome::Stale),
        other => ok(other, ctx),
    }
}

async fn fetch(rheo: &Rheo, group: &str, limit: usize, lease_ms: u64, ctx: &str) -> Result<Vec<Lease>, TestCaseError> {
    ok(rheo.fetch(STREAM, group, FetchOptions::new().limit(limit).lease(millis(lease_ms))).await, ctx)
}

// Shared strategies.

fn lease_ms() -> impl Strategy<Value = u64> {
    // 100 ms .. 3 s, in steps of 100 ms so that expiries coincide with clock moves.
    (1u64..=30).prop_map(|x| x * 100)
}

fn advance_ms() -> impl Strategy<Value = u64> {
    (0u64..=40).prop_map(|x| x * 100)
}

fn settle_kind() -> impl Strategy<Value = SettleKind> {
    prop_oneof![
        Just(SettleKind::Ack),
        Just(SettleKind::Retry),
        Just(SettleKind::Reject),
        lease_ms().prop_map(SettleKind::Renew),
        (0u64..=30).prop_map(|x| SettleKind::RetryAfter(x * 100)),
    ]
}

// ---------------------------------------------------------------------------
// 1. Routing stability
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct RoutingInput {
    partition_count: u32,
    keys: Vec<String>,
    /// (which key, key given in the payload instead of the options)
    appends: Vec<(Index, bool)>,
    /// `partition_for_key(probe, wide_count) < wide_count` for any count.
    probe: String,
    wide_count: u32,
}

fn routing_input() -> impl Strategy<Value = RoutingInput> {
    let key = prop_oneof!["[a-c]{0,2}", any::<String>()];
    (
        prop_oneof![1u32..=8, 1u32..=300],
        vec(key, 1..6),
        vec((any::<Index>(), any::<bool>()), 1..24),
        any::<String>(),
        1u32..,
    )
        .prop_map(|(partition_count, keys, appends, probe, wide_count)| RoutingInput {
            partition_count,
            keys,
            appends,
            probe,
            wide_count,
        })
}

async fn routing_is_stable(factory: Factory, input: RoutingInput) -> CaseResult {
    let RoutingInput { partition_count: count, keys, appends, probe, wide_count } = input;
    let wide = partition_for_key(&probe, wide_count);
    prop_assert!(wide < wide_count, "partition_for_key({probe:?}, {wide_count}) = {wide}, not below the count");
    prop_assert_eq!(partition_for_key(&probe, wide_count), wide, "partition_for_key is not deterministic");

    let fx = setup(factory, count, &[]).await?;
    let mut placed: HashMap<&str, u32> = HashMap::new();
    for (i, (pick, via_payload)) in appends.iter().enumerate() {
        let key = &keys[pick.index(keys.len())];
        let expected = partition_for_key(key, count);
        prop_assert!(expected < count, "partition_for_key({key:?}, {count}) = {expected}");
        let ctx = format!("append #{i} key {key:?} (via payload: {via_payload}) over {count} partitions");
        let event = if *via_payload {
            ok(fx.rheo.append(STREAM, &json!({"key": key, "i": i}), AppendOptions::new()).await, &ctx)?
        } else {
            ok(fx.rheo.append(STREAM, &json!({"i": i}), AppendOptions::new().key(key.clone())).await, &ctx)?
        };
        prop_assert_eq!(event.partition(), expected, "{}: landed outside partition_for_key", ctx);
        prop_assert_eq!(event.key(), Some(key.as_str()), "{}: key not kept", ctx);
        let first = *placed.entry(key.as_str()).or_insert(event.partition());
        prop_assert_eq!(event.partition(), first, "{}: the same key landed in two partitions", ctx);
    }
    let stored = read_every_partition(&fx.rheo, count).await?;
    prop_assert_eq!(stored.len(), appends.len(), "read back a different number of events");
    for e in &stored {
        let key = e.key().ok_or_else(|| fail(format!("event {e:?} lost its key")))?;
        prop_assert_eq!(e.partition(), partition_for_key(key, count), "stored event {:?} in the wrong partition", e);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 2. Contiguous sequences
// ---------------------------------------------------------------------------

/// Where an appended event goes.
#[derive(Debug, Clone)]
enum Route {
    /// No key, no partition: partition 0.
    Default,
    /// Routed by this key.
    Key(String),
    /// This partition (modulo the partition count).
    Partition(u32),
}

impl Route {
    fn partition(&self, count: u32) -> u32 {
        match self {
            Route::Default => 0,
            Route::Key(k) => partition_for_key(k, count),
            Route::Partition(p) => p % count,
        }
    }

    fn options(&self, count: u32) -> AppendOptions {
        match self {
            Route::Default => AppendOptions::new(),
            Route::Key(k) => AppendOptions::new().key(k.clone()),
            Route::Partition(p) => AppendOptions::new().partition(p % count),
        }
    }
}

fn route() -> impl Strategy<Value = Route> {
    prop_oneof![Just(Route::Default), "[a-e]".prop_map(Route::Key), (0u32..4).prop_map(Route::Partition)]
}

#[derive(Debug, Clone)]
enum AppendOp {
    One(Route),
    Batch(Vec<Route>),
    /// A batch with an out-of-range partition inserted at `Index`: appends nothing.
    BadBatch(Vec<Route>, Index),
}

fn append_op() -> impl Strategy<Value = AppendOp> {
    prop_oneof![
        3 => route().prop_map(AppendOp::One),
        3 => vec(route(), 1..8).prop_map(AppendOp::Batch),
        1 => (vec(route(), 0..6), any::<Index>()).prop_map(|(r, i)| AppendOp::BadBatch(r, i)),
    ]
}

async fn sequences_are_contiguous(factory: Factory, count: u32, ops: Vec<AppendOp>, page: usize) -> CaseResult {
    let fx = setup(factory, count, &[]).await?;
    let p_index = |p: u32| usize::try_from(p).expect("small partition");
    // Per partition, the tags appended, in order.
    let mut model: Vec<Vec<u64>> = vec![Vec::new(); p_index(count)];
    let mut next_tag = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let ctx = format!("op #{i} {op:?} over {count} partitions");
        match op {
            AppendOp::One(route) => {
                let tag = next_tag;
                next_tag += 1;
                let e = ok(fx.rheo.append(STREAM, &json!({"tag": tag}), route.options(count)).await, &ctx)?;
                let p = route.partition(count);
                let part = &mut model[p_index(p)];
                part.push(tag);
                prop_assert_eq!((e.partition(), e.sequence()), (p, len_u64(part.len())), "{}", ctx);
            }
            AppendOp::Batch(routes) => {
                let items: Vec<(Value, AppendOptions)> = routes
                    .iter()
                    .enumerate()
                    .map(|(j, r)| (json!({"tag": next_tag + len_u64(j)}), r.options(count)))
                    .collect();
                let events = ok(fx.rheo.append_batch_with(STREAM, items).await, &ctx)?;
                prop_assert_eq!(events.len(), routes.len(), "{}: batch returned another number of events", ctx);
                for (e, r) in events.iter().zip(routes) {
                    let tag = next_tag;
                    next_tag += 1;
                    let p = r.partition(count);
                    let part = &mut model[p_index(p)];
                    part.push(tag);
                    prop_assert_eq!(
                        (e.partition(), e.sequence(), e.payload().json().expect("json")),
                        (p, len_u64(part.len()), &json!({"tag": tag})),
                        "{}: batch events must be contiguous per partition and in input order",
                        ctx
                    );
                }
            }
            AppendOp::BadBatch(routes, bad_at) => {
                let mut items: Vec<(Value, AppendOptions)> =
                    routes.iter().map(|r| (json!({"tag": "never"}), r.options(count))).collect();
                let at = bad_at.index(items.len() + 1);
                items.insert(at, (json!({"tag": "bad"}), AppendOptions::new().partition(count)));
                match fx.rheo.append_batch_with(STREAM, items).await {
                    Err(Error::InvalidPartition { partition, .. }) if partition == count => {}
                    other => return Err(fail(format!("{ctx}: expected InvalidPartition({count}), got {other:?}"))),
                }
            }
        }
        let streams = ok(fx.rheo.list_streams().await, &ctx)?;
        let info = streams.iter().find(|s| s.name == STREAM).ok_or_else(|| fail(format!("{ctx}: stream gone")))?;
        let expected: Vec<u64> = model.iter().map(|p| len_u64(p.len())).collect();
        prop_assert_eq!(&info.high_watermarks, &expected, "{}: high watermarks", ctx);
    }
    // Read every partition back in pages of `page`.
    for p in 0..count {
        let mut after = 0;
        let mut seen = Vec::new();
        loop {
            let batch = ok(fx.rheo.read(STREAM, p, after, page).await, format!("read {p} after {after}"))?;
            prop_assert!(batch.len() <= page, "read returned more than its limit");
            let Some(last) = batch.last() else { break };
            after = last.sequence();
            seen.extend(batch);
        }
        let sequences: Vec<u64> = seen.iter().map(|e| e.sequence()).collect();
        let part = &model[p_index(p)];
        let want: Vec<u64> = (1..=len_u64(part.len())).collect();
        prop_assert_eq!(sequences, want, "partition {} sequences are not exactly 1..=n in order", p);
        let tags: Vec<Value> = seen.iter().map(|e| e.payload().json().expect("json")["tag"].clone()).collect();
        let want_tags: Vec<Value> = part.iter().map(|&t| json!(t)).collect();
        prop_assert_eq!(tags, want_tags, "partition {} holds other events than appended", p);
        prop_assert!(seen.iter().all(|e| e.partition() == p), "read of partition {p} returned another partition");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. The frontier never passes a hole
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum FrontierOp {
    Append(usize),
    Fetch {
        limit: usize,
        lease_ms: u64,
    },
    /// Settle an issued lease (held or old).
    Settle(SettleKind, Index),
    Advance(u64),
}

fn frontier_op() -> impl Strategy<Value = FrontierOp> {
    prop_oneof![
        2 => (1usize..=3).prop_map(FrontierOp::Append),
        3 => (1usize..=4, lease_ms()).prop_map(|(limit, lease_ms)| FrontierOp::Fetch { limit, lease_ms }),
        5 => (settle_kind(), any::<Index>()).prop_map(|(k, i)| FrontierOp::Settle(k, i)),
        2 => advance_ms().prop_map(FrontierOp::Advance),
    ]
}

async fn frontier_never_passes_a_hole(factory: Factory, ops: Vec<FrontierOp>) -> CaseResult {
    // max_attempts 2 so retries and expired last attempts dead-letter.
    let fx = setup(factory, 1, &[(GROUP, 2)]).await?;
    let mut leases: Vec<Lease> = Vec::new();
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    let mut dead_before: BTreeSet<u64> = BTreeSet::new();
    let mut hw = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let ctx = format!("op #{i} {op:?}");
        let mut must_be_dead = None;
        match op {
            FrontierOp::Append(n) => {
                for _ in 0..*n {
                    ok(fx.rheo.append(STREAM, &json!({"op": i}), AppendOptions::new()).await, &ctx)?;
                    hw += 1;
                }
            }
            FrontierOp::Fetch { limit, lease_ms } => {
                leases.extend(fetch(&fx.rheo, GROUP, *limit, *lease_ms, &ctx).await?)
            }
            FrontierOp::Settle(kind, pick) => {
                if leases.is_empty() {
                    continue;
                }
                let lease = &leases[pick.index(leases.len())];
                let seq = lease.sequence();
                match settle(&fx.rheo, &lease.to_ref(), *kind, &format!("r{i}"), &ctx).await? {
                    Outcome::Acked => {
                        prop_assert!(
                            !dead_before.contains(&seq),
                            "{ctx}: ack of {seq} succeeded after it was dead-lettered"
                        );
                        prop_assert!(acked.insert(seq), "{ctx}: sequence {seq} acked twice");
                    }
                    Outcome::Rejected | Outcome::Retried(RetryOutcome::DeadLettered) => must_be_dead = Some(seq),
                    Outcome::Retried(_) | Outcome::Renewed(_) | Outcome::Stale => {}
                }
            }
            FrontierOp::Advance(ms) => fx.clock.advance(millis(*ms)),
        }
        let dead: BTreeSet<u64> = ok(
            fx.rheo.dead_letters(STREAM, GROUP, DeadLetterOptions::new().limit(ALL)).await,
            format!("{ctx}: dead_letters"),
        )?
        .iter()
        .map(|d| d.sequence)
        .collect();
        prop_assert!(dead.is_superset(&dead_before), "{ctx}: dead letters vanished: {dead_before:?} -> {dead:?}");
        prop_assert!(acked.is_disjoint(&dead), "{ctx}: acked {acked:?} and dead {dead:?} overlap");
        if let Some(seq) = must_be_dead {
            prop_assert!(dead.contains(&seq), "{ctx}: {seq} was dead-lettered but is not in dead_letters {dead:?}");
        }
        let lag = ok(fx.rheo.lag(STREAM, GROUP).await, format!("{ctx}: lag"))?;
        let part = lag.partitions.first().ok_or_else(|| fail(format!("{ctx}: lag has no partition")))?;
        let f = part.frontier;
        prop_assert_eq!(part.high_watermark, hw, "{}: high watermark", ctx);
        prop_assert_eq!(part.lag, hw.saturating_sub(f), "{}: lag = HW - F", ctx);
        let settled = |s: u64| acked.contains(&s) || dead.contains(&s);
        if let Some(hole) = (1..=f).find(|&s| !settled(s)) {
            return Err(fail(format!(
                "{ctx}: frontier {f} passes the hole at {hole} (acked {acked:?}, dead {dead:?}, hw {hw})"
            )));
        }
        prop_assert!(
            f >= hw || !settled(f + 1),
            "{ctx}: frontier {f} stops before {} which is settled (acked {acked:?}, dead {dead:?})",
            f + 1
        );
        dead_before = dead;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. An old lease never settles
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum LeaseOp {
    Append(u32),
    Fetch {
        limit: usize,
        lease_ms: u64,
    },
    /// Settle a lease that still holds its delivery (possibly expired, not reclaimed).
    SettleCurrent(SettleKind, Index),
    /// Settle a lease that was settled, or whose delivery was reclaimed.
    SettleOld(SettleKind, Index),
    Advance(u64),
}

fn lease_op() -> impl Strategy<Value = LeaseOp> {
    prop_oneof![
        2 => (0u32..2).prop_map(LeaseOp::Append),
        3 => (1usize..=4, lease_ms()).prop_map(|(limit, lease_ms)| LeaseOp::Fetch { limit, lease_ms }),
        3 => (settle_kind(), any::<Index>()).prop_map(|(k, i)| LeaseOp::SettleCurrent(k, i)),
        3 => (settle_kind(), any::<Index>()).prop_map(|(k, i)| LeaseOp::SettleOld(k, i)),
        2 => advance_ms().prop_map(LeaseOp::Advance),
    ]
}

struct Tracked {
    lease: Lease,
    expires_at: Timestamp,
    current: bool,
}

async fn old_lease_never_settles(factory: Factory, ops: Vec<LeaseOp>) -> CaseResult {
    // A large max_attempts: no delivery is dead-lettered behind our back, so
    // which leases are current is known exactly.
    let fx = setup(factory, 2, &[(GROUP, 1000)]).await?;
    let mut tracked: Vec<Tracked> = Vec::new();
    let mut holder: HashMap<(u32, u64), usize> = HashMap::new();
    let mut lease_ids: HashSet<rheo::LeaseId> = HashSet::new();
    for (i, op) in ops.iter().enumerate() {
        let ctx = format!("op #{i} {op:?}");
        let now = fx.clock.now();
        match op {
            LeaseOp::Append(p) => {
                ok(fx.rheo.append(STREAM, &json!({"op": i}), AppendOptions::new().partition(*p)).await, &ctx)?;
            }
            LeaseOp::Fetch { limit, lease_ms } => {
                for lease in fetch(&fx.rheo, GROUP, *limit, *lease_ms, &ctx).await? {
                    let key = (lease.partition(), lease.sequence());
                    prop_assert!(lease_ids.insert(lease.lease_id), "{ctx}: lease id {} reused", lease.lease_id);
                    prop_assert_eq!(lease.expires_at, now.saturating_add(millis(*lease_ms)), "{}: expiry", ctx);
                    if let Some(&j) = holder.get(&key) {
                        let old = &mut tracked[j];
                        prop_assert!(
                            old.expires_at <= now,
                            "{ctx}: {key:?} handed out again while lease #{j} holds it until {}",
                            old.expires_at
                        );
                        old.current = false; // reclaimed
                    }
                    holder.insert(key, tracked.len());
                    tracked.push(Tracked { expires_at: lease.expires_at, lease, current: true });
                }
            }
            LeaseOp::SettleCurrent(kind, pick) => {
                let current: Vec<usize> = (0..tracked.len()).filter(|&j| tracked[j].current).collect();
                if current.is_empty() {
                    continue;
                }
                let j = current[pick.index(current.len())];
                let lease = tracked[j].lease.to_ref();
                let ctx = format!(
                    "{ctx} on lease #{j} {:?} (expires {})",
                    (lease.partition, lease.sequence),
                    tracked[j].expires_at
                );
                let outcome = ok(settle_raw(&fx.rheo, &lease, *kind, "r").await, &ctx)?;
                match outcome {
                    Outcome::Renewed(t) => {
                        let SettleKind::Renew(ms) = kind else { return Err(fail(format!("{ctx}: renewed?"))) };
                        prop_assert_eq!(t, now.saturating_add(millis(*ms)), "{}: renewed expiry", ctx);
                        tracked[j].expires_at = t;
                    }
                    _ => {
                        tracked[j].current = false;
                        holder.remove(&(lease.partition, lease.sequence));
                    }
                }
            }
            LeaseOp::SettleOld(kind, pick) => {
                let old: Vec<usize> = (0..tracked.len()).filter(|&j| !tracked[j].current).collect();
                if old.is_empty() {
                    continue;
                }
                let j = old[pick.index(old.len())];
                let lease = tracked[j].lease.to_ref();
                match settle_raw(&fx.rheo, &lease, *kind, "r").await {
                    Err(Error::StaleLease { partition, sequence, lease_id, stream, group }) => {
                        prop_assert_eq!(
                            (partition, sequence, lease_id, stream.as_str(), group.as_str()),
                            (lease.partition, lease.sequence, lease.lease_id, STREAM, GROUP),
                            "{}: StaleLease names another lease",
                            ctx
                        );
                    }
                    other => {
                        return Err(fail(format!(
                            "{ctx}: old lease #{j} {:?} must be StaleLease, got {other:?}",
                            (lease.partition, lease.sequence)
                        )));
                    }
                }
            }
            LeaseOp::Advance(ms) => fx.clock.advance(millis(*ms)),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 5. Paging returns each matching event exactly once
// ---------------------------------------------------------------------------

/// The payload field `n` of an event.
#[derive(Debug, Clone)]
enum NVal {
    Int(i64),
    /// Half this number, as a float (`3` gives 1.5; `4` gives 2.0, equal to 2).
    Half(i64),
    /// The number as a string: never equal to the number.
    Str(i64),
    Missing,
}

#[derive(Debug, Clone)]
struct EventSpec {
    partition: u32,
    n: NVal,
    type_a: bool,
    /// An explicit timestamp (START + ms), else the clock's.
    timestamp: Option<i64>,
    /// Clock advance before the append, ms.
    advance: u64,
}

fn event_spec() -> impl Strategy<Value = EventSpec> {
    let n = prop_oneof![
        4 => (-3i64..12).prop_map(NVal::Int),
        1 => (-6i64..24).prop_map(NVal::Half),
        1 => (-3i64..12).prop_map(NVal::Str),
        1 => Just(NVal::Missing),
    ];
    (0u32..4, n, any::<bool>(), proptest::option::weighted(0.3, 0i64..60), 0u64..3)
        .prop_map(|(partition, n, type_a, timestamp, advance)| EventSpec { partition, n, type_a, timestamp, advance })
}

async fn append_spec(fx: &Fixture, spec: &EventSpec, count: u32, tag: usize) -> Result<Event, TestCaseError> {
    fx.clock.advance(millis(spec.advance));
    let mut payload = Map::new();
    payload.insert("type".into(), json!(if spec.type_a { "a" } else { "b" }));
    payload.insert("tag".into(), json!(tag));
    match spec.n {
        NVal::Int(n) => {
            payload.insert("n".into(), json!(n));
        }
        NVal::Half(n) => {
            payload.insert("n".into(), json!(f64::from(i32::try_from(n).expect("small")) / 2.0));
        }
        NVal::Str(n) => {
            payload.insert("n".into(), json!(n.to_string()));
        }
        NVal::Missing => {}
    }
    let mut opts = AppendOptions::new().partition(spec.partition % count);
    if let Some(t) = spec.timestamp {
        opts = opts.timestamp(at(t));
    }
    ok(fx.rheo.append(STREAM, &Value::Object(payload), opts).await, format!("append {spec:?}"))
}

#[derive(Debug, Clone)]
enum FilterSpec {
    Gte(i64),
    Gt(i64),
    Lt(i64),
    Lte(i64),
    Eq(i64),
    In(Vec<i64>),
    /// `n == "<x>"` (the string).
    EqStr(i64),
    /// `n > "<x>"` (strings compare with strings only).
    GtStr(i64),
    Exists,
    Missing,
    /// `type == "a"` (true) or `"b"`.
    Type(bool),
    /// `partition == p`.
    Partition(u32),
    /// `partition in [...]`.
    PartitionIn(Vec<u32>),
    /// `sequence > n`.
    SequenceGt(u64),
    /// `timestamp < START + ms`.
    TimestampLt(i64),
}

fn filter_spec() -> impl Strategy<Value = FilterSpec> {
    let x = -4i64..13;
    prop_oneof![
        x.clone().prop_map(FilterSpec::Gte),
        x.clone().prop_map(FilterSpec::Gt),
        x.clone().prop_map(FilterSpec::Lt),
        x.clone().prop_map(FilterSpec::Lte),
        x.clone().prop_map(FilterSpec::Eq),
        vec(x.clone(), 0..4).prop_map(FilterSpec::In),
        x.clone().prop_map(FilterSpec::EqStr),
        x.prop_map(FilterSpec::GtStr),
        Just(FilterSpec::Exists),
        Just(FilterSpec::Missing),
        any::<bool>().prop_map(FilterSpec::Type),
        (0u32..4).prop_map(FilterSpec::Partition),
        vec(0u32..5, 0..3).prop_map(FilterSpec::PartitionIn),
        (0u64..8).prop_map(FilterSpec::SequenceGt),
        (0i64..70).prop_map(FilterSpec::TimestampLt),
    ]
}

#[derive(Debug, Clone)]
struct QuerySpec {
    filters: Vec<FilterSpec>,
    /// Name the field `payload.n` instead of `n`.
    dotted: bool,
    after_sequence: Option<u64>,
    until_sequence: Option<u64>,
    after_sequences: BTreeMap<u32, u64>,
    from: Option<i64>,
    to: Option<i64>,
    order: OrderBy,
    descending: bool,
    limit: usize,
}

fn query_spec() -> impl Strategy<Value = QuerySpec> {
    let order = prop_oneof![Just(OrderBy::Sequence), Just(OrderBy::Timestamp), Just(OrderBy::Partition)];
    let bound = |hi: u64| proptest::option::weighted(0.2, 0..hi);
    let time = || proptest::option::weighted(0.2, 0i64..70);
    let per_partition = prop_oneof![3 => Just(BTreeMap::new()), 1 => btree_map(0u32..4, 0u64..8, 1..3)];
    let bounds = (bound(6), bound(15), per_partition);
    (vec(filter_spec(), 0..3), any::<bool>(), bounds, time(), time(), order, any::<bool>(), 1usize..=7).prop_map(
        |(filters, dotted, bounds, from, to, order, descending, limit)| QuerySpec {
            filters,
            dotted,
            after_sequence: bounds.0,
            until_sequence: bounds.1,
            after_sequences: bounds.2,
            from,
            to,
            order,
            descending,
            limit,
        },
    )
}

impl QuerySpec {
    fn query(&self) -> Query {
        let field = if self.dotted { "payload.n" } else { "n" };
        let mut q = Query::new(STREAM).order_by(self.order).limit(self.limit);
        if self.descending {
            q = q.descending();
        }
        for f in &self.filters {
            q = match f {
                FilterSpec::Gte(x) => q.gte(field, *x),
                FilterSpec::Gt(x) => q.gt(field, *x),
                FilterSpec::Lt(x) => q.lt(field, *x),
                FilterSpec::Lte(x) => q.lte(field, *x),
                FilterSpec::Eq(x) => q.eq(field, *x),
                FilterSpec::In(xs) => q.is_in(field, xs.iter().copied()),
                FilterSpec::EqStr(x) => q.eq(field, x.to_string()),
                FilterSpec::GtStr(x) => q.gt(field, x.to_string()),
                FilterSpec::Exists => q.exists(field),
                FilterSpec::Missing => q.missing(field),
                FilterSpec::Type(a) => q.eq("type", if *a { "a" } else { "b" }),
                FilterSpec::Partition(p) => q.partition(*p),
                FilterSpec::PartitionIn(ps) => q.is_in("partition", ps.iter().copied()),
                FilterSpec::SequenceGt(n) => q.gt("sequence", *n),
                FilterSpec::TimestampLt(t) => q.lt("timestamp", at(*t)),
            };
        }
        if let Some(n) = self.after_sequence {
            q = q.after_sequence(n);
        }
        if let Some(n) = self.until_sequence {
            q = q.until_sequence(n);
        }
        if !self.after_sequences.is_empty() {
            q = q.after_sequences(self.after_sequences.clone());
        }
        if let Some(t) = self.from {
            q = q.from(at(t));
        }
        if let Some(t) = self.to {
            q = q.to(at(t));
        }
        q
    }

    /// The test's own reading of the filter and bounds.
    fn matches(&self, e: &Event) -> bool {
        let n = e.payload().json().expect("json").get("n");
        // Numbers compare by value (2.0 == 2), never with strings.
        let num = n.filter(|v| v.is_number()).and_then(Value::as_f64);
        let x = |x: &i64| f64::from(i32::try_from(*x).expect("small"));
        let filters = self.filters.iter().all(|f| match f {
            FilterSpec::Gte(v) => num.is_some_and(|n| n >= x(v)),
            FilterSpec::Gt(v) => num.is_some_and(|n| n > x(v)),
            FilterSpec::Lt(v) => num.is_some_and(|n| n < x(v)),
            FilterSpec::Lte(v) => num.is_some_and(|n| n <= x(v)),
            FilterSpec::Eq(v) => num == Some(x(v)),
            FilterSpec::In(vs) => num.is_some_and(|n| vs.iter().any(|v| n == x(v))),
            FilterSpec::EqStr(v) => n.and_then(Value::as_str) == Some(v.to_string().as_str()),
            FilterSpec::GtStr(v) => n.and_then(Value::as_str).is_some_and(|s| s > v.to_string().as_str()),
            FilterSpec::Exists => n.is_some(),
            FilterSpec::Missing => n.is_none(),
            FilterSpec::Type(a) => e.event_type() == Some(if *a { "a" } else { "b" }),
            FilterSpec::Partition(p) => e.partition() == *p,
            FilterSpec::PartitionIn(ps) => ps.contains(&e.partition()),
            FilterSpec::SequenceGt(s) => e.sequence() > *s,
            FilterSpec::TimestampLt(t) => e.timestamp() < at(*t),
        });
        filters
            && self.after_sequence.is_none_or(|a| e.sequence() > a)
            && self.after_sequences.get(&e.partition()).is_none_or(|&a| e.sequence() > a)
            && self.until_sequence.is_none_or(|u| e.sequence() <= u)
            && self.from.is_none_or(|t| e.timestamp() >= at(t))
            && self.to.is_none_or(|t| e.timestamp() <= at(t))
    }

    /// The documented order: sequence then partition; timestamp then
    /// partition then sequence; partition then sequence.
    fn key(&self, e: &Event) -> (i64, u64, u64) {
        match self.order {
            OrderBy::Sequence => (0, e.sequence(), u64::from(e.partition())),
            OrderBy::Timestamp => (e.timestamp().as_millis(), u64::from(e.partition()), e.sequence()),
            OrderBy::Partition => (0, u64::from(e.partition()), e.sequence()),
        }
    }

    fn expected(&self, all: &[Event]) -> Vec<Event> {
        let mut v: Vec<Event> = all.iter().filter(|e| self.matches(e)).cloned().collect();
        v.sort_by_key(|e| self.key(e));
        if self.descending {
            v.reverse();
        }
        v
    }
}

fn positions(events: &[Event]) -> Vec<(u32, u64)> {
    events.iter().map(|e| (e.partition(), e.sequence())).collect()
}

async fn paging_returns_each_event_once(
    factory: Factory,
    count: u32,
    events: Vec<EventSpec>,
    spec: QuerySpec,
) -> CaseResult {
    let fx = setup(factory, count, &[]).await?;
    for (i, e) in events.iter().enumerate() {
        append_spec(&fx, e, count, i).await?;
    }
    let all = read_every_partition(&fx.rheo, count).await?;
    let expected = spec.expected(&all);
    let base = spec.query();
    let mut q = base.clone();
    let mut got: Vec<Event> = Vec::new();
    let mut pages = 0;
    loop {
        pages += 1;
        prop_assert!(pages <= expected.len() + 2, "more pages than events: {} pages so far", pages);
        let page = ok(fx.rheo.query_page(&q).await, format!("page {pages} of {q:?}"))?;
        prop_assert!(page.events.len() <= spec.limit, "page {pages} has {} events > limit", page.events.len());
        got.extend(page.events);
        match page.next_cursor {
            Some(c) => q = base.clone().cursor(c),
            None => break,
        }
    }
    prop_assert_eq!(
        positions(&got),
        positions(&expected),
        "pages (partition, sequence) differ from the filtered read; query {:?}",
        base
    );
    prop_assert_eq!(got, expected, "paged events differ from the stored ones");
    Ok(())
}

async fn paging_survives_appends_between_pages(
    factory: Factory,
    count: u32,
    events: Vec<EventSpec>,
    spec: QuerySpec,
    between: Vec<Vec<EventSpec>>,
) -> CaseResult {
    let fx = setup(factory, count, &[]).await?;
    let mut tag = 0;
    for e in &events {
        append_spec(&fx, e, count, tag).await?;
        tag += 1;
    }
    let before: Vec<(u32, u64)> = positions(&spec.expected(&read_every_partition(&fx.rheo, count).await?));
    let base = spec.query();
    let mut q = base.clone();
    let mut seen: HashSet<(u32, u64)> = HashSet::new();
    let mut got: Vec<Event> = Vec::new();
    let mut last_key = None;
    let mut pending = between.iter();
    let mut pages = 0;
    loop {
        pages += 1;
        let most = events.len() + between.iter().map(Vec::len).sum::<usize>() + 2;
        prop_assert!(pages <= most, "more pages than events: {} pages so far", pages);
        let page = ok(fx.rheo.query_page(&q).await, format!("page {pages} of {q:?}"))?;
        prop_assert!(page.events.len() <= spec.limit, "page {pages} has {} events > limit", page.events.len());
        for e in &page.events {
            let pos = (e.partition(), e.sequence());
            prop_assert!(seen.insert(pos), "page {pages}: {pos:?} returned twice");
            prop_assert!(spec.matches(e), "page {pages}: {pos:?} does not match the query: {e:?}");
            let key = spec.key(e);
            prop_assert!(
                last_key.is_none_or(|k| key > k),
                "page {pages}: {pos:?} with key {key:?} out of ascending order after {last_key:?}"
            );
            last_key = Some(key);
        }
        got.extend(page.events);
        // New events arrive before the next page is asked for.
        for e in pending.next().into_iter().flatten() {
            append_spec(&fx, e, count, tag).await?;
            tag += 1;
        }
        match page.next_cursor {
            Some(c) => q = base.clone().cursor(c),
            None => break,
        }
    }
    let missed: Vec<&(u32, u64)> = before.iter().filter(|p| !seen.contains(p)).collect();
    prop_assert!(
        missed.is_empty(),
        "events that existed before the first page were missed: {missed:?}; query {base:?}"
    );
    // Whatever was returned is stored exactly as returned.
    let all = read_every_partition(&fx.rheo, count).await?;
    let stored: HashMap<(u32, u64), &Event> = all.iter().map(|e| ((e.partition(), e.sequence()), e)).collect();
    for e in &got {
        prop_assert_eq!(Some(&e), stored.get(&(e.partition(), e.sequence())), "returned event differs from stored");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 6. Group isolation
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum GroupOp {
    Fetch { limit: usize, lease_ms: u64 },
    Settle(SettleKind, Index),
    Replay(u64),
}

fn group_op() -> impl Strategy<Value = GroupOp> {
    prop_oneof![
        3 => (1usize..=4, lease_ms()).prop_map(|(limit, lease_ms)| GroupOp::Fetch { limit, lease_ms }),
        4 => (settle_kind(), any::<Index>()).prop_map(|(k, i)| GroupOp::Settle(k, i)),
        1 => (0u64..5).prop_map(GroupOp::Replay),
    ]
}

#[derive(Debug, Clone)]
enum IsoOp {
    Append(u32),
    Advance(u64),
    /// On group `a`, only in the fixture that has it.
    A(GroupOp),
    /// On group `b`, in both fixtures.
    B(GroupOp),
}

fn iso_op() -> impl Strategy<Value = IsoOp> {
    prop_oneof![
        2 => (0u32..2).prop_map(IsoOp::Append),
        1 => advance_ms().prop_map(IsoOp::Advance),
        4 => group_op().prop_map(IsoOp::A),
        3 => group_op().prop_map(IsoOp::B),
    ]
}

/// Applies a group operation and returns what it observably did (no lease ids).
async fn apply_group_op(
    rheo: &Rheo,
    group: &str,
    leases: &mut Vec<Lease>,
    op: &GroupOp,
    reason: &str,
    ctx: &str,
) -> Result<String, TestCaseError> {
    Ok(match op {
        GroupOp::Fetch { limit, lease_ms } => {
            let got = fetch(rheo, group, *limit, *lease_ms, ctx).await?;
            let seen: Vec<_> = got
                .iter()
                .map(|l| (l.event.id().to_owned(), l.partition(), l.sequence(), l.attempt, l.expires_at))
                .collect();
            leases.extend(got);
            format!("fetched {seen:?}")
        }
        GroupOp::Settle(kind, pick) => {
            if leases.is_empty() {
                return Ok("no lease".into());
            }
            let j = pick.index(leases.len());
            let lease = leases[j].to_ref();
            let outcome = settle(rheo, &lease, *kind, reason, ctx).await?;
            format!("lease #{j} {:?}: {outcome:?}", (lease.partition, lease.sequence))
        }
        GroupOp::Replay(s) => {
            let n = ok(rheo.replay(STREAM, group, ReplayOptions::from_sequence(*s)).await, ctx)?;
            format!("replayed {n}")
        }
    })
}

/// Everything observable about a group, without lease ids.
#[derive(Debug, PartialEq)]
struct GroupView {
    lag: Vec<PartitionLag>,
    total: u64,
    dead: Vec<(String, u32, u64, String, u32, Timestamp)>,
    inflight: u64,
    retry_waiting: u64,
    dead_count: u64,
}

async fn group_view(rheo: &Rheo, group: &str, ctx: &str) -> Result<GroupView, TestCaseError> {
    let lag = ok(rheo.lag(STREAM, group).await, ctx)?;
    let dead = ok(rheo.dead_letters(STREAM, group, DeadLetterOptions::new().limit(ALL)).await, ctx)?;
    let info = ok(rheo.group_info(STREAM, group).await, ctx)?;
    Ok(GroupView {
        lag: lag.partitions,
        total: lag.total,
        dead: dead
            .into_iter()
            .map(|d| {
                (
                    d.event.map_or_else(String::new, |e| e.id().to_owned()),
                    d.partition,
                    d.sequence,
                    d.reason,
                    d.attempts,
                    d.dead_lettered_at,
                )
            })
            .collect(),
        inflight: info.inflight,
        retry_waiting: info.retry_waiting,
        dead_count: info.dead_letters,
    })
}

async fn groups_are_isolated(factory: Factory, a_max_attempts: u32, ops: Vec<IsoOp>) -> CaseResult {
    // `solo` has only group b; `mixed` has b and a. Both see the same appends,
    // clock moves and operations on b; only `mixed` sees operations on a.
    let solo = setup(factory, 2, &[("b", 2)]).await?;
    let mixed = setup(factory, 2, &[("b", 2), ("a", a_max_attempts)]).await?;
    let (mut b_solo, mut b_mixed, mut a_leases) = (Vec::new(), Vec::new(), Vec::new());
    for (i, op) in ops.iter().enumerate() {
        let ctx = format!("op #{i} {op:?}");
        let reason = format!("r{i}");
        match op {
            IsoOp::Append(p) => {
                for fx in [&solo, &mixed] {
                    let opts = AppendOptions::new().partition(*p).id(format!("e{i}"));
                    ok(fx.rheo.append(STREAM, &json!({"op": i}), opts).await, &ctx)?;
                }
            }
            IsoOp::Advance(ms) => {
                solo.clock.advance(millis(*ms));
                mixed.clock.advance(millis(*ms));
            }
            IsoOp::A(g) => {
                apply_group_op(&mixed.rheo, "a", &mut a_leases, g, &reason, &ctx).await?;
            }
            IsoOp::B(g) => {
                let alone = apply_group_op(&solo.rheo, "b", &mut b_solo, g, &reason, &ctx).await?;
                let beside_a = apply_group_op(&mixed.rheo, "b", &mut b_mixed, g, &reason, &ctx).await?;
                prop_assert_eq!(alone, beside_a, "{}: group b behaves differently beside group a", ctx);
            }
        }
        let alone = group_view(&solo.rheo, "b", &ctx).await?;
        let beside_a = group_view(&mixed.rheo, "b", &ctx).await?;
        prop_assert_eq!(alone, beside_a, "{}: group b's state changed by group a", ctx);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 7. Model vs backend
// ---------------------------------------------------------------------------

const MODEL_PARTITIONS: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// At or below the group's start position: never delivered, counts as
    /// committed for the frontier.
    Skipped,
    Available,
    Leased {
        lease: usize,
        expires: i64,
    },
    /// Retried; claimable again from `ready_at` (ms since START).
    Waiting {
        ready_at: i64,
    },
    Acked,
    Dead,
}

impl SlotState {
    fn committed(self) -> bool {
        matches!(self, SlotState::Skipped | SlotState::Acked | SlotState::Dead)
    }
}

#[derive(Debug, Clone)]
struct Slot {
    state: SlotState,
    attempts: u32,
    /// Its scheduled delivery time (ms since START), if any: no fetch
    /// claims it before then.
    deliver_at: Option<i64>,
}

/// The reason a dead letter must carry.
#[derive(Debug, Clone, PartialEq)]
enum Reason {
    Exact(String),
    /// Dead-lettered by a fetch after its last lease expired: starts with `max_attempts:`.
    ExpiredLastAttempt,
}

#[derive(Debug, Clone, PartialEq)]
struct ModelDead {
    partition: u32,
    sequence: u64,
    reason: Reason,
    attempts: u32,
    at: Timestamp,
}

/// The group under test in the model property.
#[derive(Debug, Clone)]
struct ModelGroup {
    max_attempts: u32,
    /// `start_after` (0: from the beginning).
    start_after: u64,
    backoff: Backoff,
}

fn model_group() -> impl Strategy<Value = ModelGroup> {
    let backoff = prop_oneof![
        3 => Just(Backoff::None),
        1 => lease_ms().prop_map(|d| Backoff::Fixed(millis(d))),
        1 => ((1u64..=10), lease_ms()).prop_map(|(base, max)| Backoff::Exponential {
            base: millis(base * 100),
            max: millis(max),
        }),
    ];
    (1u32..=4, prop_oneof![3 => Just(0u64), 1 => 1u64..=4], backoff)
        .prop_map(|(max_attempts, start_after, backoff)| ModelGroup { max_attempts, start_after, backoff })
}

/// The test's own reading of the retry backoff: none; fixed; or
/// `base * 2^(attempt-1)` capped at `max`.
fn backoff_ms(backoff: &Backoff, attempt: u32) -> i64 {
    let ms = |d: &Duration| i64::try_from(d.as_millis()).expect("small duration");
    match backoff {
        Backoff::None => 0,
        Backoff::Fixed(d) => ms(d),
        Backoff::Exponential { base, max } => {
            (ms(base).saturating_mul(1i64 << attempt.saturating_sub(1).min(40))).min(ms(max))
        }
    }
}

/// The reference model of one group over a stream.
///
/// Rules (docs/semantics.md and the API docs):
/// - the frontier starts at `start_after`; sequences at or below it are never
///   delivered; F = the largest n with every sequence in start..=n acked or
///   dead-lettered, `lag = max(HW - F, 0)`;
/// - fetch claims claimable deliveries in (partition, sequence) order, up to
///   `limit`; claimable = available, or leased with `expires_at <= now`
///   (a lease must be settled *before* `expires_at`), or retried with
///   `available_at <= now`. Each claim increments `attempt`;
/// - a claimable delivery whose attempts already reached `max_attempts` (its
///   last lease expired) is dead-lettered by the fetch that meets it (reason
///   `max_attempts: ...`) and does not count against the limit;
/// - a lease settles (ack, retry, reject, renew) while its delivery is still
///   leased under it, expired or not; otherwise `StaleLease`;
/// - retry at `attempt >= max_attempts` dead-letters with
///   `max_attempts: <reason>`; otherwise the delivery is claimable again at
///   now + (the explicit delay, else the group's backoff for that attempt);
/// - `replay(from_sequence: s)` reopens acked, dead-lettered and skipped
///   events with sequence > s with fresh attempts (in-flight and waiting ones
///   keep their state), drops their dead letters, sets F = min(F, s), and
///   returns how many events it reopened.
struct Model {
    /// Milliseconds since START.
    now: i64,
    group: ModelGroup,
    /// Per partition: sequences at or below it are skipped (start position).
    start: Vec<u64>,
    parts: Vec<Vec<Slot>>,
    /// (partition, sequence) of every lease issued, by issue order.
    leases: Vec<(u32, u64)>,
    dead: Vec<ModelDead>,
}

impl Model {
    fn new(partitions: u32, group: ModelGroup) -> Self {
        let n = usize::try_from(partitions).expect("small");
        Model {
            now: 0,
            start: vec![group.start_after; n],
            group,
            parts: vec![Vec::new(); n],
            leases: Vec::new(),
            dead: Vec::new(),
        }
    }

    fn append(&mut self, p: u32, deliver_at: Option<i64>) -> u64 {
        let i = usize::try_from(p).expect("small");
        let part = &mut self.parts[i];
        let seq = len_u64(part.len()) + 1;
        let state = if seq <= self.start[i] { SlotState::Skipped } else { SlotState::Available };
        part.push(Slot { state, attempts: 0, deliver_at });
        seq
    }

    /// Events scheduled after now that no claim has taken.
    fn scheduled_ahead(&self) -> usize {
        let now = self.now;
        self.parts
            .iter()
            .flatten()
            .filter(|s| s.state == SlotState::Available && s.deliver_at.is_some_and(|t| t > now))
            .count()
    }

    /// Returns (lease index, partition, sequence, attempt, expires_at).
    fn fetch(&mut self, limit: usize, lease_ms: u64, scope: Option<&[u32]>) -> Vec<(usize, u32, u64, u32, Timestamp)> {
        let Model { now, group, parts, leases, dead, .. } = self;
        let expires = *now + ms_i64(lease_ms);
        let mut out = Vec::new();
        for (p, part) in (0u32..).zip(parts.iter_mut()) {
            if scope.is_some_and(|s| !s.contains(&p)) {
                continue;
            }
            for (idx, slot) in part.iter_mut().enumerate() {
                if out.len() >= limit {
                    break;
                }
                let claimable = match slot.state {
                    // Not before its time (docs/semantics.md, "Scheduled delivery").
                    SlotState::Available => slot.deliver_at.is_none_or(|t| t <= *now),
                    SlotState::Leased { expires: until, .. } => until <= *now,
                    SlotState::Waiting { ready_at } => ready_at <= *now,
                    SlotState::Skipped | SlotState::Acked | SlotState::Dead => false,
                };
                if !claimable {
                    continue;
                }
                let sequence = seq_of(idx);
                if slot.attempts >= group.max_attempts {
                    slot.state = SlotState::Dead;
                    dead.push(ModelDead {
                        partition: p,
                        sequence,
                        reason: Reason::ExpiredLastAttempt,
                        attempts: slot.attempts,
                        at: at(*now),
                    });
                    continue;
                }
                slot.attempts += 1;
                let lease = leases.len();
                leases.push((p, sequence));
                slot.state = SlotState::Leased { lease, expires };
                out.push((lease, p, sequence, slot.attempts, at(expires)));
            }
        }
        out
    }

    fn settle(&mut self, lease: usize, kind: SettleKind, reason: &str) -> Outcome {
        let (p, seq) = self.leases[lease];
        let now = self.now;
        let group = self.group.clone();
        let slot = &mut self.parts[usize::try_from(p).expect("small")][seq_index(seq)];
        let SlotState::Leased { lease: holder, .. } = slot.state else { return Outcome::Stale };
        if holder != lease {
            return Outcome::Stale;
        }
        let attempts = slot.attempts;
        let mut dead_reason = None;
        let outcome = match kind {
            SettleKind::Ack => {
                slot.state = SlotState::Acked;
                Outcome::Acked
            }
            SettleKind::Retry | SettleKind::RetryAfter(_) if attempts >= group.max_attempts => {
                slot.state = SlotState::Dead;
                dead_reason = Some(format!("max_attempts: {reason}"));
                Outcome::Retried(RetryOutcome::DeadLettered)
            }
            SettleKind::Retry | SettleKind::RetryAfter(_) => {
                let delay = match kind {
                    SettleKind::RetryAfter(ms) => ms_i64(ms),
                    _ => backoff_ms(&group.backoff, attempts),
                };
                let ready_at = now + delay;
                slot.state = if delay == 0 { SlotState::Available } else { SlotState::Waiting { ready_at } };
                Outcome::Retried(RetryOutcome::Scheduled { available_at: at(ready_at) })
            }
            SettleKind::Reject => {
                slot.state = SlotState::Dead;
                dead_reason = Some(reason.to_owned());
                Outcome::Rejected
            }
            SettleKind::Renew(ms) => {
                let expires = now + ms_i64(ms);
                slot.state = SlotState::Leased { lease, expires };
                Outcome::Renewed(at(expires))
            }
        };
        if let Some(r) = dead_reason {
            self.dead.push(ModelDead { partition: p, sequence: seq, reason: Reason::Exact(r), attempts, at: at(now) });
        }
        outcome
    }

    fn replay(&mut self, from: u64) -> u64 {
        let mut reopened = 0;
        for (start, part) in self.start.iter_mut().zip(&mut self.parts) {
            *start = (*start).min(from);
            for (idx, slot) in part.iter_mut().enumerate() {
                if seq_of(idx) > from && slot.state.committed() {
                    // The schedule belongs to the event: it stays.
                    *slot = Slot { state: SlotState::Available, attempts: 0, deliver_at: slot.deliver_at };
                    reopened += 1;
                }
            }
        }
        self.dead.retain(|d| d.sequence <= from);
        reopened
    }

    fn lag(&self) -> Vec<PartitionLag> {
        (0u32..)
            .zip(&self.parts)
            .zip(&self.start)
            .map(|((p, part), &start)| {
                let committed = len_u64(part.iter().take_while(|s| s.state.committed()).count());
                PartitionLag::new(p, len_u64(part.len()), committed.max(start))
            })
            .collect()
    }

    fn held(&self) -> Vec<usize> {
        let mut held: Vec<usize> = self
            .parts
            .iter()
            .flatten()
            .filter_map(|s| match s.state {
                SlotState::Leased { lease, .. } => Some(lease),
                _ => None,
            })
            .collect();
        held.sort_unstable();
        held
    }

    /// Deliveries still waiting out a retry backoff.
    fn retry_waiting(&self) -> u64 {
        let now = self.now;
        len_u64(
            self.parts
                .iter()
                .flatten()
                .filter(|s| matches!(s.state, SlotState::Waiting { ready_at } if ready_at > now))
                .count(),
        )
    }
}

#[derive(Debug, Clone)]
enum ModelOp {
    Append(Route),
    /// An append scheduled this many ms ahead, on a backend that schedules
    /// and while fewer than [`MODEL_SCHEDULED_MAX`] wait (so that no fetch
    /// meets more than its budget of them); else a plain append.
    AppendAt(Route, u64),
    Fetch {
        limit: usize,
        lease_ms: u64,
        partitions: Option<Vec<u32>>,
    },
    /// Settle a lease the model says is held (`held`), else any lease ever issued.
    Settle {
        kind: SettleKind,
        held: bool,
        pick: Index,
    },
    Advance(u64),
    Replay(u64),
    /// `lag_of` one partition.
    Lag(u32),
}

/// The most events the model test keeps scheduled and not yet due: below
/// a fetch's share of its scheduled budget (64 over 3 partitions).
const MODEL_SCHEDULED_MAX: usize = 16;

fn model_op() -> impl Strategy<Value = ModelOp> {
    let scope = proptest::option::weighted(0.25, proptest::sample::subsequence(vec![0u32, 1, 2], 1..=3));
    prop_oneof![
        4 => route().prop_map(ModelOp::Append),
        2 => (route(), (1u64..=50).prop_map(|x| x * 100)).prop_map(|(r, ms)| ModelOp::AppendAt(r, ms)),
        4 => (1usize..=4, lease_ms(), scope)
            .prop_map(|(limit, lease_ms, partitions)| ModelOp::Fetch { limit, lease_ms, partitions }),
        5 => (settle_kind(), proptest::bool::weighted(0.7), any::<Index>())
            .prop_map(|(kind, held, pick)| ModelOp::Settle { kind, held, pick }),
        2 => advance_ms().prop_map(ModelOp::Advance),
        1 => (0u64..6).prop_map(ModelOp::Replay),
        1 => (0..MODEL_PARTITIONS).prop_map(ModelOp::Lag),
    ]
}

async fn compare_with_model(fx: &Fixture, model: &Model, ctx: &str) -> CaseResult {
    let lag = ok(fx.rheo.lag(STREAM, GROUP).await, format!("{ctx}: lag"))?;
    let want = model.lag();
    prop_assert_eq!(&lag.partitions, &want, "{}: lag per partition", ctx);
    prop_assert_eq!(lag.total, want.iter().map(|p| p.lag).sum::<u64>(), "{}: total lag", ctx);

    let dead = ok(
        fx.rheo.dead_letters(STREAM, GROUP, DeadLetterOptions::new().limit(ALL)).await,
        format!("{ctx}: dead_letters"),
    )?;
    let got: Vec<ModelDead> = dead
        .iter()
        .zip(model.dead.iter().map(Some).chain(std::iter::repeat(None)))
        .map(|(d, m)| ModelDead {
            partition: d.partition,
            sequence: d.sequence,
            reason: match m {
                Some(ModelDead { reason: Reason::ExpiredLastAttempt, .. }) if d.reason.starts_with("max_attempts:") => {
                    Reason::ExpiredLastAttempt
                }
                _ => Reason::Exact(d.reason.clone()),
            },
            attempts: d.attempts,
            at: d.dead_lettered_at,
        })
        .collect();
    prop_assert_eq!(&got, &model.dead, "{}: dead letters (in dead-letter order)", ctx);

    let info = ok(fx.rheo.group_info(STREAM, GROUP).await, format!("{ctx}: group_info"))?;
    prop_assert_eq!(info.inflight, len_u64(model.held().len()), "{}: inflight (leased, expired included)", ctx);
    prop_assert_eq!(info.dead_letters, len_u64(model.dead.len()), "{}: dead-letter count", ctx);
    prop_assert_eq!(&info.lag.partitions, &want, "{}: group_info lag", ctx);
    // `GroupInfo::retry_waiting`: "deliveries waiting out a retry backoff";
    // once `available_at` has passed, the delivery is claimable, not waiting.
    prop_assert_eq!(info.retry_waiting, model.retry_waiting(), "{}: retry_waiting (backoff not yet over)", ctx);
    // Scheduled events are counted once a fetch has set them aside: at
    // most those not yet due.
    prop_assert!(
        info.scheduled <= len_u64(model.scheduled_ahead()),
        "{ctx}: scheduled {} with {} not yet due",
        info.scheduled,
        model.scheduled_ahead()
    );
    Ok(())
}

async fn backend_matches_model(factory: Factory, group: ModelGroup, ops: Vec<ModelOp>) -> CaseResult {
    let fx = factory().await;
    ok(fx.rheo.create_stream(STREAM, StreamOptions::new().partitions(MODEL_PARTITIONS)).await, "create_stream")?;
    let opts = GroupOptions::new()
        .max_attempts(group.max_attempts)
        .start_after(group.start_after)
        .retry_backoff(group.backoff);
    ok(fx.rheo.create_group(STREAM, GROUP, opts).await, "create_group")?;
    let mut model = Model::new(MODEL_PARTITIONS, group);
    compare_with_model(&fx, &model, "after create_group").await?;
    let mut leases: Vec<Lease> = Vec::new();
    let mut lease_ids: HashSet<rheo::LeaseId> = HashSet::new();
    for (i, op) in ops.iter().enumerate() {
        let ctx = format!("op #{i} {op:?}");
        match op {
            ModelOp::Append(route) => {
                let e = ok(fx.rheo.append(STREAM, &json!({"op": i}), route.options(MODEL_PARTITIONS)).await, &ctx)?;
                let p = route.partition(MODEL_PARTITIONS);
                let seq = model.append(p, None);
                prop_assert_eq!((e.partition(), e.sequence()), (p, seq), "{}: appended at", ctx);
            }
            ModelOp::AppendAt(route, ahead) => {
                let schedules = fx.rheo.capabilities().scheduled_delivery;
                let when =
                    (schedules && model.scheduled_ahead() < MODEL_SCHEDULED_MAX).then(|| model.now + ms_i64(*ahead));
                let mut opts = route.options(MODEL_PARTITIONS);
                if let Some(t) = when {
                    opts = opts.deliver_at(at(t));
                }
                let e = ok(fx.rheo.append(STREAM, &json!({"op": i}), opts).await, &ctx)?;
                let p = route.partition(MODEL_PARTITIONS);
                let seq = model.append(p, when);
                prop_assert_eq!((e.partition(), e.sequence()), (p, seq), "{}: appended at", ctx);
                prop_assert_eq!(e.deliver_at(), when.map(at), "{}: scheduled for", ctx);
            }
            ModelOp::Fetch { limit, lease_ms, partitions } => {
                let mut opts = FetchOptions::new().limit(*limit).lease(millis(*lease_ms));
                if let Some(ps) = partitions {
                    opts = opts.partitions(ps.clone());
                }
                let got = ok(fx.rheo.fetch(STREAM, GROUP, opts).await, &ctx)?;
                let want = model.fetch(*limit, *lease_ms, partitions.as_deref());
                let seen: Vec<(u32, u64, u32, Timestamp)> =
                    got.iter().map(|l| (l.partition(), l.sequence(), l.attempt, l.expires_at)).collect();
                let wanted: Vec<(u32, u64, u32, Timestamp)> =
                    want.iter().map(|&(_, p, s, a, t)| (p, s, a, t)).collect();
                prop_assert_eq!(seen, wanted, "{}: fetched (partition, sequence, attempt, expires_at)", ctx);
                for l in &got {
                    prop_assert!(lease_ids.insert(l.lease_id), "{ctx}: lease id {} reused", l.lease_id);
                    prop_assert_eq!(l.group.as_ref(), GROUP, "{}: lease group", ctx);
                    prop_assert_eq!(l.consumer_id.as_ref(), fx.rheo.consumer_id(), "{}: lease consumer", ctx);
                }
                leases.extend(got);
            }
            ModelOp::Settle { kind, held, pick } => {
                let held_now = model.held();
                let j = if *held && !held_now.is_empty() {
                    held_now[pick.index(held_now.len())]
                } else if !leases.is_empty() {
                    pick.index(leases.len())
                } else {
                    continue;
                };
                let lease = leases[j].to_ref();
                let ctx = format!("{ctx} on lease #{j} {:?}", (lease.partition, lease.sequence));
                let reason = format!("r{i}");
                let got = settle(&fx.rheo, &lease, *kind, &reason, &ctx).await?;
                let want = model.settle(j, *kind, &reason);
                prop_assert_eq!(got, want, "{}: settle outcome", ctx);
            }
            ModelOp::Advance(ms) => {
                fx.clock.advance(millis(*ms));
                model.now += ms_i64(*ms);
            }
            ModelOp::Replay(s) => {
                let got = ok(fx.rheo.replay(STREAM, GROUP, ReplayOptions::from_sequence(*s)).await, &ctx)?;
                let want = model.replay(*s);
                // `Rheo::replay` "returns how many events were reopened": events
                // that exist, not sequences between `s` and a start position
                // beyond the high watermark.
                prop_assert_eq!(got, want, "{}: replay reopened count", ctx);
            }
            ModelOp::Lag(p) => {
                let got = ok(fx.rheo.lag_of(STREAM, GROUP, &[*p]).await, &ctx)?;
                let want: Vec<PartitionLag> = model.lag().into_iter().filter(|l| l.partition == *p).collect();
                prop_assert_eq!(&got.partitions, &want, "{}: lag_of", ctx);
                prop_assert_eq!(got.total, want.iter().map(|l| l.lag).sum::<u64>(), "{}: lag_of total", ctx);
            }
        }
        compare_with_model(&fx, &model, &ctx).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// One module of tests per backend
// ---------------------------------------------------------------------------

// Per-key order: in a keyed group, a claim of an event never has an earlier
// unsettled event of its key before it, and neither a claim nor a renewal
// ever meets another live lease of its key, under random appends, fetches,
// settles and renewals (of expired leases too), expiries and replays.

const KEY_ORDER_CASES: u32 = 64;
const KEYS: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum KeyOp {
    /// Append one event with this key (None: no key).
    Append(Option<usize>),
    Fetch {
        limit: usize,
        lease_ms: u64,
    },
    Settle(Index, SettleKind),
    Advance(u64),
    /// Replay from this fraction of the high watermark (0..=4 quarters).
    Replay(u8),
}

fn key_op() -> impl Strategy<Value = KeyOp> {
    prop_oneof![
        4 => prop::option::weighted(0.8, 0usize..KEYS.len()).prop_map(KeyOp::Append),
        4 => (1usize..=4, lease_ms()).prop_map(|(limit, lease_ms)| KeyOp::Fetch { limit, lease_ms }),
        4 => (any::<Index>(), settle_kind()).prop_map(|(i, k)| KeyOp::Settle(i, k)),
        2 => advance_ms().prop_map(KeyOp::Advance),
        1 => (0u8..=4).prop_map(KeyOp::Replay),
    ]
}

async fn key_order_holds(factory: Factory, ops: Vec<KeyOp>) -> CaseResult {
    let fx = factory().await;
    let rheo = &fx.rheo;
    ok(rheo.create_stream(STREAM, StreamOptions::new().partitions(1)).await, "create_stream")?;
    let opts = GroupOptions::new().max_attempts(1000).ordered_by_key();
    if !rheo.capabilities().ordered_by_key {
        let refused = matches!(rheo.create_group(STREAM, GROUP, opts).await, Err(Error::Unsupported { .. }));
        prop_assert!(refused, "a backend without per-key order refuses the group");
        return Ok(());
    }
    ok(rheo.create_group(STREAM, GROUP, opts).await, "create_group")?;
    // Key of each appended sequence (index = sequence - 1).
    let mut keys: Vec<Option<usize>> = Vec::new();
    let mut settled: BTreeSet<u64> = BTreeSet::new();
    // Leases handed out and not settled by us or replaced by a later claim
    // (expired ones too: they may still be settled or renewed).
    let mut held: Vec<(Lease, Timestamp)> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        let now = fx.clock.now();
        match op {
            KeyOp::Append(k) => {
                let mut o = AppendOptions::new().partition(0);
                if let Some(k) = k {
                    o = o.key(KEYS[k]);
                }
                ok(rheo.append(STREAM, &json!({"step": step}), o).await, "append")?;
                keys.push(k);
            }
            KeyOp::Fetch { limit, lease_ms } => {
                let got = fetch(rheo, GROUP, limit, lease_ms, "fetch").await?;
                // A lease another claim replaced is stale now.
                held.retain(|(l, _)| !got.iter().any(|g| g.event.sequence() == l.event.sequence()));
                for l in got {
                    let s = l.event.sequence();
                    let k = keys[seq_index(s)];
                    if let Some(k) = k {
                        for earlier in 1..s {
                            prop_assert!(
                                keys[seq_index(earlier)] != Some(k) || settled.contains(&earlier),
                                "step {step}: {s} (key {}) claimed before earlier {earlier} settled",
                                KEYS[k]
                            );
                        }
                        for (other, exp) in &held {
                            prop_assert!(
                                !(keys[seq_index(other.event.sequence())] == Some(k) && *exp > now),
                                "step {step}: {s} (key {}) claimed while {} holds a live lease",
                                KEYS[k],
                                other.event.sequence()
                            );
                        }
                    }
                    held.push((l.clone(), l.expires_at));
                }
            }
            KeyOp::Settle(i, kind) => {
                if held.is_empty() {
                    continue;
                }
                let idx = i.index(held.len());
                let lease = LeaseRef::from(&held[idx].0);
                let s = held[idx].0.event.sequence();
                match settle(rheo, &lease, kind, "prop", "settle").await? {
                    Outcome::Acked | Outcome::Rejected | Outcome::Retried(RetryOutcome::DeadLettered) => {
                        settled.insert(s);
                        held.remove(idx);
                    }
                    Outcome::Retried(_) | Outcome::Stale => {
                        held.remove(idx);
                    }
                    Outcome::Renewed(exp) => {
                        held[idx].1 = exp;
                        if let Some(k) = keys[seq_index(s)] {
                            for (other, oexp) in &held {
                                let o = other.event.sequence();
                                prop_assert!(
                                    o == s || keys[seq_index(o)] != Some(k) || *oexp <= now,
                                    "step {step}: renewed {s} (key {}) while {o} holds a live lease",
                                    KEYS[k]
                                );
                            }
                        }
                    }
                }
            }
            KeyOp::Advance(ms) => fx.clock.advance(millis(ms)),
            KeyOp::Replay(q) => {
                let from = len_u64(keys.len()) * u64::from(q) / 4;
                ok(rheo.replay(STREAM, GROUP, ReplayOptions::from_sequence(from)).await, "replay")?;
                let reopened: Vec<u64> = settled.range(from + 1..).copied().collect();
                for s in reopened {
                    settled.remove(&s);
                }
            }
        }
    }
    Ok(())
}

/// The properties that need only the log (streams, appends, reads,
/// queries); expanded inside a backend module that defines `FACTORY`.
macro_rules! log_property_tests {
    ($(#[$attr:meta])*) => {
        proptest! {
            #![proptest_config(config(ROUTING_CASES / SCALE))]
            #[test]
            $(#[$attr])*
            fn routing_is_stable(input in routing_input()) {
                run(super::routing_is_stable(FACTORY, input))?;
            }
        }

        proptest! {
            #![proptest_config(config(CONTIGUOUS_CASES / SCALE))]
            #[test]
            $(#[$attr])*
            fn sequences_are_contiguous(count in 1u32..=4, ops in vec(append_op(), 1..25), page in 1usize..=7) {
                run(super::sequences_are_contiguous(FACTORY, count, ops, page))?;
            }
        }

        proptest! {
            #![proptest_config(config(PAGING_CASES / SCALE))]
            #[test]
            $(#[$attr])*
            fn paging_returns_each_event_once(
                count in 1u32..=4,
                events in vec(event_spec(), 0..40),
                spec in query_spec(),
            ) {
                run(super::paging_returns_each_event_once(FACTORY, count, events, spec))?;
            }
        }

        proptest! {
            #![proptest_config(config(PAGING_APPENDS_CASES / SCALE))]
            #[test]
            $(#[$attr])*
            fn paging_survives_appends_between_pages(
                count in 1u32..=4,
                events in vec(event_spec(), 0..30),
                spec in query_spec().prop_map(|s| QuerySpec { descending: false, ..s }),
                between in vec(vec(event_spec(), 0..4), 0..10),
            ) {
                run(super::paging_survives_appends_between_pages(FACTORY, count, events, spec, between))?;
            }
        }
    };
}

macro_rules! properties {
    ($backend:ident, $factory:expr) => {
        properties!($backend, $factory, 1;);
    };
    ($backend:ident, $factory:expr, $scale:expr; $(#[$attr:meta])*) => {
        mod $backend {
            use super::*;

            const FACTORY: Factory = $factory;
            /// Each property runs its case count divided by this.
            const SCALE: u32 = $scale;

            log_property_tests!($(#[$attr])*);

            proptest! {
                #![proptest_config(config(FRONTIER_CASES / SCALE))]
                #[test]
            $(#[$attr])*
                fn frontier_never_passes_a_hole(ops in vec(frontier_op(), 1..60)) {
                    run(super::frontier_never_passes_a_hole(FACTORY, ops))?;
                }
            }

            proptest! {
                #![proptest_config(config(LEASE_CASES / SCALE))]
                #[test]
            $(#[$attr])*
                fn old_lease_never_settles(ops in vec(lease_op(), 1..60)) {
                    run(super::old_lease_never_settles(FACTORY, ops))?;
                }
            }

            proptest! {
                #![proptest_config(config(ISOLATION_CASES / SCALE))]
                #[test]
            $(#[$attr])*
                fn groups_are_isolated(a_max_attempts in 1u32..=3, ops in vec(iso_op(), 1..60)) {
                    run(super::groups_are_isolated(FACTORY, a_max_attempts, ops))?;
                }
            }

            proptest! {
                #![proptest_config(config(MODEL_CASES / SCALE))]
                #[test]
            $(#[$attr])*
                fn backend_matches_model(group in model_group(), ops in vec(model_op(), 1..80)) {
                    run(super::backend_matches_model(FACTORY, group, ops))?;
                }
            }

            proptest! {
                #![proptest_config(config(KEY_ORDER_CASES / SCALE))]
                #[test]
            $(#[$attr])*
                fn key_order_holds(ops in vec(key_op(), 1..80)) {
                    run(super::key_order_holds(FACTORY, ops))?;
                }
            }
        }
    };
}

// Every property runs on memory and on the native engine over `MemVfs`: the
// same code as on disk (the Vfs contract test covers `StdVfs`), without an
// fsync per append and settle, which would make hundreds of generated cases
// take minutes. The conformance suite runs the native backend on disk.
properties!(memory, crate::common::memory);
properties!(native_mem, crate::common::native_mem);
// The SQL backends pay a schema per case (and PostgreSQL a round trip per
// call): an eighth of the cases each, said here and in docs/benchmarks.md.
properties!(sqlite, crate::common::sqlite, 8;);
properties!(sqlite_rows, crate::common::sqlite_rows, 8;);
properties!(postgres, crate::common::postgres, 8;
    #[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]);
properties!(postgres_rows, crate::common::postgres_rows, 8;
    #[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]);
// MongoDB on SecantusDB (a server written in Python) is slower still: a
// thirty-second of the cases, said here and in docs/benchmarks.md.
#[cfg(feature = "mongo")]
properties!(mongo, crate::common::mongo, 32;
    #[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]);
// Redis answers in well under a millisecond: an eighth of the cases, as SQL.
#[cfg(feature = "redis")]
properties!(redis, crate::common::redis, 8;
    #[ignore = "needs a Redis server: .ci/run starts one and runs these with RHEO_REDIS_URL set"]);
