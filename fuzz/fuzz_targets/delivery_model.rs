//! Model-based fuzzing of the native delivery table: the input is decoded
//! (with `arbitrary::Unstructured`) into a group's settings and a sequence
//! of calls on a `NativeBackend` over an engine on a `MemVfs` with a
//! `ManualClock` (`Durability::Sync`, small `checkpoint_bytes`): append,
//! fetch, ack, ack_many, retry, reject, renew, advancing the clock, replay
//! from a sequence, checkpoint, reopen (drop and open again) and crash
//! (drop, `MemVfs::crash`, open). Every answer is checked against a model
//! written here, independent of the crate's group code: per partition, each
//! sequence is open (with its attempt count), leased (lease id, expiry,
//! attempt), waiting for a retry, acked or dead-lettered.
//!
//! What is checked, after every call:
//! - a fetch returns exactly the claimable sequences in (partition,
//!   sequence) order, up to the limit, with their attempt, and dead-letters
//!   the expired leases it meets that are out of attempts; a sequence whose
//!   ack returned `Ok` (and was not replayed since) is never delivered again;
//! - a settle (ack, ack_many, retry, reject, renew) succeeds exactly when
//!   the model holds the sequence under that lease id: a lease whose
//!   delivery was fetched again under a new lease gets `StaleLease`, and so
//!   does a settled one; after a reopen without crash every held lease still
//!   settles (a `Reopen` may ack every held lease at once to show it);
//! - `lag` and `group_info`: the high watermark, the frontier (the longest
//!   prefix of settled sequences, replays reopening them), in-flight,
//!   waiting and dead-letter counts;
//! - replay returns how many settled sequences it reopened;
//! - a crash keeps exactly what was synced: under `Durability::Sync` that is
//!   the state after the last call that syncs the WAL (a settle, a replay, a
//!   fetch that dead-lettered, a checkpoint) or after the last
//!   checkpoint (automatic ones are seen in the groups directory); claims
//!   and renewals after it are lost, appends are not.

#![no_main]

use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use rheo::engine::vfs::{MemVfs, Vfs};
use rheo::engine::{Engine, EngineOptions};
use rheo::{
    AppendOptions, Backend, Backoff, Clock, Error, FetchOptions, GroupOptions, LeaseRef, ManualClock, NativeBackend,
    NewEvent, ReplayOptions, RetryOutcome, StreamOptions, Timestamp,
};
use rheo_fuzz::delivery::{GROUPS_DIR, START, STREAM, runtime, small_options};

const GROUP: &str = "g";
const PARTS: u32 = 2;
/// At most this many calls per input.
const MAX_CALLS: usize = 64;
/// Leases kept to settle (the oldest are forgotten).
const MAX_LEASES: usize = 48;

#[derive(Debug)]
enum Call {
    Append { p: u32, n: u8 },
    Fetch { limit: usize, lease_ms: u64, only: Option<u32> },
    Ack(usize),
    AckMany(Vec<usize>),
    Retry(usize, Option<u64>),
    Reject(usize),
    Renew(usize, u64),
    Advance(u64),
    Replay { from: u64, only: Option<u32> },
    Checkpoint,
    Reopen { settle_all: bool },
    Crash,
}

fn partition(u: &mut Unstructured<'_>) -> arbitrary::Result<Option<u32>> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => Some(0),
        1 => Some(1),
        _ => None,
    })
}

/// A lease to settle: an index into the leases kept (modulo their count).
fn index(u: &mut Unstructured<'_>) -> arbitrary::Result<usize> {
    Ok(usize::from(u.arbitrary::<u8>()?))
}

fn call(u: &mut Unstructured<'_>) -> arbitrary::Result<Call> {
    Ok(match u.int_in_range(0..=23u8)? {
        0..=3 => Call::Append { p: u.int_in_range(0..=PARTS - 1)?, n: u.int_in_range(1..=5)? },
        4..=7 => {
            Call::Fetch { limit: u.int_in_range(1..=8)?, lease_ms: u.int_in_range(1..=5_000)?, only: partition(u)? }
        }
        8..=10 => Call::Ack(index(u)?),
        11 => Call::AckMany((0..u.int_in_range(1..=5)?).map(|_| index(u)).collect::<arbitrary::Result<_>>()?),
        12..=13 => Call::Retry(index(u)?, if u.arbitrary()? { Some(u.int_in_range(0..=3_000)?) } else { None }),
        14 => Call::Reject(index(u)?),
        15 => Call::Renew(index(u)?, u.int_in_range(1..=5_000)?),
        16..=17 => Call::Advance(u.int_in_range(1..=6_000)?),
        18 => Call::Replay { from: u.int_in_range(0..=40)?, only: partition(u)? },
        19 => Call::Checkpoint,
        20..=21 => Call::Reopen { settle_all: u.arbitrary()? },
        _ => Call::Crash,
    })
}

/// Where one sequence of the group stands, in the model.
#[derive(Debug, Clone, PartialEq)]
enum Hold {
    /// Claimable; claimed this many times since it was (re)opened.
    Open(u32),
    /// Claimed under `id` until `expires` (claimable again from then on,
    /// while the lease still settles until another fetch claims it).
    Leased { id: String, expires: Timestamp, attempt: u32 },
    /// Retried: claimable again from `ready`.
    Waiting { ready: Timestamp, attempt: u32 },
    /// `ack` returned `Ok`.
    Acked,
    /// Rejected, retried out of attempts, or expired out of attempts.
    Dead,
}

impl Hold {
    fn settled(&self) -> bool {
        matches!(self, Hold::Acked | Hold::Dead)
    }
}

/// Per partition, the hold of each sequence (index = sequence - 1).
type Parts = Vec<Vec<Hold>>;

struct Model {
    max_attempts: u32,
    backoff: Duration,
    /// What the live engine holds.
    live: Parts,
    /// What the disk holds: the live state at the last WAL sync.
    durable: Parts,
    /// The newest checkpoint generation seen in the groups directory.
    checkpoint: Option<u64>,
}

impl Model {
    fn held(&self, l: &LeaseRef) -> Option<u32> {
        let seq = usize::try_from(l.sequence).ok()?.checked_sub(1)?;
        match self.live.get(l.partition as usize)?.get(seq)? {
            Hold::Leased { id, attempt, .. } if *id == l.lease_id => Some(*attempt),
            _ => None,
        }
    }

    fn set(&mut self, l: &LeaseRef, h: Hold) {
        self.live[l.partition as usize][(l.sequence - 1) as usize] = h;
    }

    fn frontier(&self, p: usize) -> u64 {
        self.live[p].iter().take_while(|h| h.settled()).count() as u64
    }

    /// The claims a fetch makes, in order: (partition, sequence, attempt);
    /// dead-letters the spent ones it meets. Returns whether it did.
    fn fetch(&mut self, now: Timestamp, limit: usize, scope: &[u32]) -> (Vec<(u32, u64, u32)>, bool) {
        let mut out = Vec::new();
        let mut dead = false;
        'parts: for &p in scope {
            for (i, h) in self.live[p as usize].iter_mut().enumerate() {
                if out.len() == limit {
                    break 'parts;
                }
                let attempt = match h {
                    Hold::Open(a) => *a,
                    Hold::Leased { expires, attempt, .. } if *expires <= now => *attempt,
                    Hold::Waiting { ready, attempt } if *ready <= now => *attempt,
                    _ => continue,
                };
                if attempt >= self.max_attempts {
                    *h = Hold::Dead;
                    dead = true;
                    continue;
                }
                out.push((p, i as u64 + 1, attempt + 1));
            }
        }
        (out, dead)
    }

    fn synced(&mut self) {
        self.durable = self.live.clone();
    }

    /// After a crash: the durable holds, and every event appended since
    /// (appends are synced before they return) open.
    fn crash(&mut self) {
        let mut parts = self.durable.clone();
        for (p, live) in parts.iter_mut().zip(&self.live) {
            assert!(p.len() <= live.len(), "the durable model has more events than the live one");
            p.resize(live.len(), Hold::Open(0));
        }
        self.live = parts;
        self.synced();
    }
}

fn options(checkpoint_bytes: u64, preallocate_bytes: u64) -> EngineOptions {
    EngineOptions { checkpoint_bytes, preallocate_bytes, ..small_options() }
}

fn open(mem: &MemVfs, opts: &EngineOptions, clock: &ManualClock, what: &str) -> NativeBackend {
    match Engine::open(Arc::new(mem.clone()), opts.clone()) {
        Ok(engine) => NativeBackend::with_engine(engine, Arc::new(clock.clone())),
        Err(e) => panic!("{what}: the data directory does not open: {e}"),
    }
}

fn newest_checkpoint(mem: &MemVfs) -> Option<u64> {
    mem.list(GROUPS_DIR)
        .ok()?
        .iter()
        .filter_map(|n| n.strip_prefix("checkpoint-")?.strip_suffix(".ckpt")?.parse().ok())
        .max()
}

fn lease_ref(p: u32, seq: u64, id: &str) -> LeaseRef {
    LeaseRef {
        stream: STREAM.into(),
        group: GROUP.into(),
        partition: p,
        sequence: seq,
        lease_id: id.into(),
        receipt: None,
    }
}

fn event_id(p: u32, seq: u64) -> String {
    format!("e{p}-{seq}")
}

/// A settle's result against the model: `Ok` exactly when held, else `StaleLease`.
fn expect_settled<T: std::fmt::Debug>(what: &str, l: &LeaseRef, held: bool, r: &rheo::Result<T>, why: &str) {
    match (held, r) {
        (true, Ok(_)) | (false, Err(Error::StaleLease { .. })) => {}
        (true, Err(e)) => panic!("{what} of a lease the model holds ({l:?}) failed: {e}"),
        (false, Ok(v)) => panic!("{what} of a lease the model does not hold ({l:?}, {why}) succeeded: {v:?}"),
        (false, Err(e)) => panic!("{what} of a stale lease ({l:?}) failed with {e}, not StaleLease"),
    }
}

/// Why the model does not hold a lease, for messages.
fn why_not(m: &Model, l: &LeaseRef) -> String {
    match m.live.get(l.partition as usize).and_then(|p| p.get((l.sequence - 1) as usize)) {
        Some(Hold::Leased { .. }) => "fetched again under a new lease".into(),
        Some(h) => format!("now {h:?}"),
        None => "no such sequence".into(),
    }
}

async fn check(b: &NativeBackend, m: &Model, now: Timestamp, step: usize, call: &Call) {
    if let Some(reason) = b.engine().poisoned() {
        panic!("step {step} ({call:?}): the engine is poisoned: {reason}");
    }
    let lag = b.lag(STREAM, GROUP, None).await.expect("lag");
    let info = b.group_info(STREAM, GROUP).await.expect("group_info");
    assert_eq!(lag.partitions, info.lag.partitions, "lag and group_info disagree");
    for (p, pl) in lag.partitions.iter().enumerate() {
        assert_eq!(pl.partition as usize, p);
        let hw = m.live[p].len() as u64;
        assert_eq!(pl.high_watermark, hw, "step {step} ({call:?}): high watermark of partition {p}");
        let frontier = m.frontier(p);
        assert_eq!(
            pl.frontier, frontier,
            "step {step} ({call:?}): frontier of partition {p} is not the settled prefix; model {:?}",
            m.live[p]
        );
    }
    let all = || m.live.iter().flatten();
    let inflight = all().filter(|h| matches!(h, Hold::Leased { .. })).count() as u64;
    let waiting = all().filter(|h| matches!(h, Hold::Waiting { ready, .. } if *ready > now)).count() as u64;
    let dead = all().filter(|h| matches!(h, Hold::Dead)).count() as u64;
    assert_eq!(
        (info.inflight, info.retry_waiting, info.dead_letters),
        (inflight, waiting, dead),
        "step {step} ({call:?}): (in flight, waiting, dead letters); model {:?}",
        m.live
    );
}

async fn run(data: &[u8]) -> arbitrary::Result<()> {
    let mut u = Unstructured::new(data);
    let max_attempts = u.int_in_range(1..=4)?;
    let backoff = Duration::from_millis([0, 300, 2_000][u.int_in_range(0..=2usize)?]);
    let checkpoint_bytes = [256, 1024, 4096, u64::MAX][u.int_in_range(0..=3usize)?];
    let preallocate_bytes = if u.arbitrary()? { 4096 } else { 0 };
    let mut calls = Vec::new();
    while !u.is_empty() && calls.len() < MAX_CALLS {
        match call(&mut u) {
            Ok(c) => calls.push(c),
            Err(_) => break,
        }
    }

    let opts = options(checkpoint_bytes, preallocate_bytes);
    let mem = MemVfs::new();
    let clock = ManualClock::new(START);
    let mut b = open(&mem, &opts, &clock, "a new directory");
    b.create_stream(STREAM, &StreamOptions::new().partitions(PARTS)).await.expect("create the stream");
    let backoff_opt = if backoff.is_zero() { Backoff::None } else { Backoff::Fixed(backoff) };
    let group = GroupOptions::new().max_attempts(max_attempts).retry_backoff(backoff_opt);
    b.create_group(STREAM, GROUP, &group).await.expect("create the group");
    let mut m = Model {
        max_attempts,
        backoff,
        live: vec![Vec::new(); PARTS as usize],
        durable: vec![Vec::new(); PARTS as usize],
        checkpoint: newest_checkpoint(&mem),
    };
    let mut leases: Vec<LeaseRef> = Vec::new();
    let pick = |leases: &Vec<LeaseRef>, i: usize| (!leases.is_empty()).then(|| leases[i % leases.len()].clone());

    for (step, call) in calls.iter().enumerate() {
        let now = clock.now();
        match call {
            Call::Append { p, n } => {
                let first = m.live[*p as usize].len() as u64 + 1;
                let events = (0..u64::from(*n))
                    .map(|i| {
                        let opts = AppendOptions::new().partition(*p).id(event_id(*p, first + i));
                        NewEvent::prepare(serde_json::json!({"i": first + i}), opts)
                    })
                    .collect();
                let out = b.append_batch(STREAM, events).await.expect("append");
                let seqs: Vec<u64> = out.iter().map(|e| e.sequence).collect();
                assert_eq!(seqs, (first..first + u64::from(*n)).collect::<Vec<_>>(), "appended sequences");
                m.live[*p as usize].extend((0..*n).map(|_| Hold::Open(0)));
            }
            Call::Fetch { limit, lease_ms, only } => {
                let lease = Duration::from_millis(*lease_ms);
                let mut fetch = FetchOptions::new().limit(*limit).consumer("c").lease(lease);
                let scope: Vec<u32> = match only {
                    Some(p) => {
                        fetch = fetch.partitions(vec![*p]);
                        vec![*p]
                    }
                    None => (0..PARTS).collect(),
                };
                let got = b.fetch(STREAM, GROUP, &fetch).await.expect("fetch").leases;
                for l in &got {
                    let h = &m.live[l.partition() as usize][(l.sequence() - 1) as usize];
                    assert!(
                        !matches!(h, Hold::Acked),
                        "step {step}: sequence {} of partition {} was acked and is delivered again",
                        l.sequence(),
                        l.partition()
                    );
                    assert!(!matches!(h, Hold::Dead), "step {step}: a dead letter is delivered again: {l:?}");
                    assert_eq!(l.event.id, event_id(l.partition(), l.sequence()), "the delivered event");
                    assert_eq!(l.expires_at, now.saturating_add(lease), "the lease's expiry");
                }
                let (want, dead) = m.fetch(now, *limit, &scope);
                let claims: Vec<(u32, u64, u32)> =
                    got.iter().map(|l| (l.partition(), l.sequence(), l.attempt)).collect();
                assert_eq!(claims, want, "step {step} ({call:?}): claims (partition, sequence, attempt)");
                for l in &got {
                    let r = l.to_ref();
                    m.set(&r, Hold::Leased { id: l.lease_id.clone(), expires: l.expires_at, attempt: l.attempt });
                    leases.push(r);
                }
                if leases.len() > MAX_LEASES {
                    leases.drain(..leases.len() - MAX_LEASES);
                }
                if dead {
                    m.synced();
                }
            }
            Call::Ack(i) => {
                if let Some(l) = pick(&leases, *i) {
                    let held = m.held(&l).is_some();
                    let why = why_not(&m, &l);
                    let r = b.ack(&l).await;
                    expect_settled("ack", &l, held, &r, &why);
                    if held {
                        m.set(&l, Hold::Acked);
                        m.synced();
                    }
                }
            }
            Call::AckMany(is) => {
                let refs: Vec<LeaseRef> = is.iter().filter_map(|&i| pick(&leases, i)).collect();
                if !refs.is_empty() {
                    let rs = b.ack_many(&refs).await.expect("ack_many");
                    assert_eq!(rs.len(), refs.len(), "one result per lease");
                    let mut any = false;
                    for (l, r) in refs.iter().zip(&rs) {
                        let held = m.held(l).is_some();
                        expect_settled("ack_many", l, held, r, &why_not(&m, l));
                        if held {
                            m.set(l, Hold::Acked);
                            any = true;
                        }
                    }
                    if any {
                        m.synced();
                    }
                }
            }
            Call::Retry(i, delay) => {
                if let Some(l) = pick(&leases, *i) {
                    let held = m.held(&l);
                    let why = why_not(&m, &l);
                    let delay = delay.map(Duration::from_millis);
                    let r = b.retry(&l, "again", delay).await;
                    expect_settled("retry", &l, held.is_some(), &r, &why);
                    if let Some(attempt) = held {
                        if attempt >= m.max_attempts {
                            assert_eq!(r.ok(), Some(RetryOutcome::DeadLettered), "a retry out of attempts");
                            m.set(&l, Hold::Dead);
                        } else {
                            let ready = now.saturating_add(delay.unwrap_or(m.backoff));
                            assert_eq!(r.ok(), Some(RetryOutcome::Scheduled { available_at: ready }), "a retry");
                            m.set(&l, Hold::Waiting { ready, attempt });
                        }
                        m.synced();
                    }
                }
            }
            Call::Reject(i) => {
                if let Some(l) = pick(&leases, *i) {
                    let held = m.held(&l).is_some();
                    let why = why_not(&m, &l);
                    let r = b.reject(&l, "bad").await;
                    expect_settled("reject", &l, held, &r, &why);
                    if held {
                        m.set(&l, Hold::Dead);
                        m.synced();
                    }
                }
            }
            Call::Renew(i, ms) => {
                if let Some(l) = pick(&leases, *i) {
                    let held = m.held(&l);
                    let why = why_not(&m, &l);
                    let r = b.renew(&l, Duration::from_millis(*ms)).await;
                    expect_settled("renew", &l, held.is_some(), &r, &why);
                    if let Some(attempt) = held {
                        let expires = now.saturating_add(Duration::from_millis(*ms));
                        assert_eq!(r.ok(), Some(expires), "the renewed expiry");
                        m.set(&l, Hold::Leased { id: l.lease_id.clone(), expires, attempt });
                    }
                }
            }
            Call::Advance(ms) => clock.advance(Duration::from_millis(*ms)),
            Call::Replay { from, only } => {
                let mut opts = ReplayOptions::from_sequence(*from);
                let scope: Vec<u32> = match only {
                    Some(p) => {
                        opts = opts.partitions(vec![*p]);
                        vec![*p]
                    }
                    None => (0..PARTS).collect(),
                };
                let mut reopened = 0;
                for &p in &scope {
                    for h in m.live[p as usize].iter_mut().skip(usize::try_from(*from).unwrap_or(usize::MAX)) {
                        if h.settled() {
                            *h = Hold::Open(0);
                            reopened += 1;
                        }
                    }
                }
                let got = b.replay(STREAM, GROUP, &opts).await.expect("replay");
                assert_eq!(got, reopened, "step {step} ({call:?}): events reopened");
                m.synced();
            }
            Call::Checkpoint => {
                b.engine().checkpoint(STREAM).expect("checkpoint");
                m.synced();
            }
            Call::Reopen { settle_all } => {
                drop(b);
                // Opening syncs nothing: unsynced claims stay unsynced.
                b = open(&mem, &opts, &clock, "reopen");
                if *settle_all {
                    let mut refs = Vec::new();
                    for (p, holds) in m.live.iter().enumerate() {
                        for (i, h) in holds.iter().enumerate() {
                            if let Hold::Leased { id, .. } = h {
                                refs.push(lease_ref(p as u32, i as u64 + 1, id));
                            }
                        }
                    }
                    if !refs.is_empty() {
                        let rs = b.ack_many(&refs).await.expect("ack_many after reopen");
                        for (l, r) in refs.iter().zip(&rs) {
                            assert!(
                                r.is_ok(),
                                "step {step}: a lease held before the reopen does not settle: {l:?}: {r:?}"
                            );
                            m.set(l, Hold::Acked);
                        }
                        m.synced();
                    }
                }
            }
            Call::Crash => {
                drop(b);
                mem.crash();
                b = open(&mem, &opts, &clock, "open after a crash");
                m.crash();
            }
        }
        // An automatic checkpoint made everything so far durable.
        let ckpt = newest_checkpoint(&mem);
        if ckpt != m.checkpoint {
            m.checkpoint = ckpt;
            m.synced();
        }
        check(&b, &m, clock.now(), step, call).await;
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = runtime().block_on(run(data));
});
