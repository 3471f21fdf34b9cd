//! Model-based fuzzing of the native delivery table: the input is decoded
//! (with `arbitrary::Unstructured`) into a group's settings and a sequence
//! of calls on a `NativeBackend` over an engine on a `FaultyVfs` (over a
//! `MemVfs`) with a `ManualClock` (`Durability::Sync`, small
//! `checkpoint_bytes`, commits inline: no thread hand-off per call), on two
//! groups (`g`, with the input's settings, over both partitions; `h`, with
//! other settings, over partition 1 only): append, fetch, ack, ack_many,
//! retry, reject, renew, skip, advancing the clock, replay (from a
//! sequence, from a time, by query), reset (from the beginning, after a
//! sequence, at a time, at the end), checkpoint, reopen (drop and open
//! again), crash (drop, `MemVfs::crash`, open), and a crash *inside* a call
//! (a fault armed a few file operations into it). Every answer is checked
//! against a model written here, independent of the crate's group code:
//! per group and partition, each sequence is open (with its attempt count),
//! leased (lease id, expiry, attempt), waiting for a retry, acked (or
//! settled by a start or reset) or dead-lettered.
//!
//! What is checked, after every call, for both groups:
//! - a fetch returns exactly the claimable sequences in (partition,
//!   sequence) order, up to the limit, with their attempt, and dead-letters
//!   the expired leases it meets that are out of attempts; a sequence whose
//!   ack returned `Ok` (and was not replayed or reset since) is never
//!   delivered again;
//! - a settle (ack, ack_many, retry, reject, renew) succeeds exactly when
//!   the model holds the sequence under that lease id, else `StaleLease`;
//!   a skip answers as the model says (dead-lettered, already a dead
//!   letter, or refused);
//! - `lag` and `group_info` (high watermark, frontier = the longest prefix
//!   of settled sequences, in-flight, waiting and dead-letter counts) and
//!   the dead letters listed;
//! - replay returns how many settled sequences it reopened (a replay from a
//!   time with no event at or after it is `NoEventsInRange`);
//! - a crash keeps exactly what was synced: under `Durability::Sync` that is
//!   the state after the last call that syncs the WAL (a settle, a replay, a
//!   reset, a fetch that dead-lettered or passed over, a checkpoint) or
//!   after the last checkpoint (automatic ones are seen in the groups
//!   directory); claims and renewals after it are lost, appends are not. A
//!   crash inside a call (preceded by a checkpoint, so that only that call
//!   is in doubt) leaves the state before the call or the state after it:
//!   the one whose lag and counts the reopened directory shows (and the
//!   directory must open).

#![no_main]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use rheo::engine::vfs::{Fault, FaultyVfs, MemVfs, Vfs};
use rheo::engine::{Engine, EngineOptions};
use rheo::{AppendOptions, Backoff, Clock, DeadLetterOptions, Error, FetchOptions, GroupOptions, LeaseId, LeaseRef, ManualClock, NewEvent, Query, ReplayOptions, ResetOptions, RetryOutcome, StartPosition, StreamOptions, Timestamp};
use rheo::backends::Backend;
use rheo::backends::native::NativeBackend;
use rheo_fuzz::delivery::{GROUPS_DIR, START, STREAM, runtime, small_options};

const GROUPS: [&str; 2] = ["g", "h"];
const PARTS: u32 = 2;
/// At most this many calls per input.
const MAX_CALLS: usize = 64;
/// Leases kept to settle (the oldest are forgotten).
const MAX_LEASES: usize = 48;
/// Event tags (a payload field a replay by query selects on).
const TAGS: u64 = 3;

#[derive(Debug, Clone)]
enum Replay {
    Sequence(u64),
    /// From this many ms before now.
    Time(u64),
    Query(u64),
}

#[derive(Debug, Clone)]
enum Start {
    Beginning,
    After(u64),
    /// At this many ms before now.
    At(u64),
    Latest,
}

#[derive(Debug, Clone)]
enum Call {
    Append {
        p: u32,
        n: u8,
    },
    Fetch {
        g: usize,
        limit: usize,
        lease_ms: u64,
        only: Option<u32>,
    },
    Ack(usize),
    AckMany(Vec<usize>),
    Retry(usize, Option<u64>),
    Reject(usize),
    Renew(usize, u64),
    Advance(u64),
    Replay {
        g: usize,
        mode: Replay,
        only: Option<u32>,
    },
    Reset {
        g: usize,
        start: Start,
        only: Option<u32>,
    },
    Skip {
        g: usize,
        p: u32,
        seq: u64,
    },
    Checkpoint,
    Reopen {
        settle_all: bool,
    },
    Crash,
    /// The call, with a crash armed this many file operations into it.
    CrashIn {
        after: u64,
        call: Box<Call>,
    },
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

fn fetch(u: &mut Unstructured<'_>, g: usize) -> arbitrary::Result<Call> {
    Ok(Call::Fetch { g, limit: u.int_in_range(1..=8)?, lease_ms: u.int_in_range(1..=5_000)?, only: partition(u)? })
}

/// The calls. Opcodes 0 to 23 keep the meaning they had before the model
/// covered two groups (the seed corpus relies on it); calls on group `h`
/// and the newer calls have opcodes 24 to 31.
fn call(u: &mut Unstructured<'_>, nested: bool) -> arbitrary::Result<Call> {
    let op = u.int_in_range(0..=31u8)?;
    Ok(match op {
        0..=3 => Call::Append { p: u.int_in_range(0..=PARTS - 1)?, n: u.int_in_range(1..=5)? },
        4..=7 => fetch(u, 0)?,
        8..=10 => Call::Ack(index(u)?),
        11 => Call::AckMany((0..u.int_in_range(1..=5)?).map(|_| index(u)).collect::<arbitrary::Result<_>>()?),
        12..=13 => Call::Retry(index(u)?, if u.arbitrary()? { Some(u.int_in_range(0..=3_000)?) } else { None }),
        14 => Call::Reject(index(u)?),
        15 => Call::Renew(index(u)?, u.int_in_range(1..=5_000)?),
        16..=17 => Call::Advance(u.int_in_range(1..=6_000)?),
        18 => Call::Replay { g: 0, mode: Replay::Sequence(u.int_in_range(0..=40)?), only: partition(u)? },
        19 => Call::Checkpoint,
        20..=21 => Call::Reopen { settle_all: u.arbitrary()? },
        22..=23 => Call::Crash,
        24 => fetch(u, 1)?,
        25 => {
            let g = u.int_in_range(0..=1)?;
            let mode = match u.int_in_range(0..=2u8)? {
                0 => Replay::Sequence(u.int_in_range(0..=40)?),
                1 => Replay::Time(u.int_in_range(0..=20_000)?),
                _ => Replay::Query(u.int_in_range(0..=TAGS - 1)?),
            };
            Call::Replay { g, mode, only: partition(u)? }
        }
        26 => {
            let g = u.int_in_range(0..=1)?;
            let start = match u.int_in_range(0..=3u8)? {
                0 => Start::Beginning,
                1 => Start::After(u.int_in_range(0..=40)?),
                2 => Start::At(u.int_in_range(0..=20_000)?),
                _ => Start::Latest,
            };
            Call::Reset { g, start, only: partition(u)? }
        }
        27 => Call::Skip { g: u.int_in_range(0..=1)?, p: u.int_in_range(0..=PARTS - 1)?, seq: u.int_in_range(0..=40)? },
        28..=29 if !nested => {
            let after = u.int_in_range(1..=12)?;
            let inner = call(u, true)?;
            match inner {
                Call::Fetch { .. }
                | Call::Ack(_)
                | Call::AckMany(_)
                | Call::Retry(..)
                | Call::Reject(_)
                | Call::Replay { .. }
                | Call::Reset { .. }
                | Call::Skip { .. } => Call::CrashIn { after, call: Box::new(inner) },
                other => other,
            }
        }
        _ => fetch(u, 1)?,
    })
}

/// Where one sequence of a group stands, in the model.
#[derive(Debug, Clone, PartialEq)]
enum Hold {
    /// Claimable; claimed this many times since it was (re)opened.
    Open(u32),
    /// Claimed under `id` until `expires` (claimable again from then on,
    /// while the lease still settles until another fetch claims it). The id
    /// is empty for a claim whose fetch crashed (it settles nothing).
    /// `id` 0: held under a lease the model never saw (a real one is never 0).
    Leased { id: LeaseId, expires: Timestamp, attempt: u32 },
    /// Retried: claimable again from `ready`.
    Waiting { ready: Timestamp, attempt: u32 },
    /// `ack` returned `Ok`, or settled by a start or reset.
    Acked,
    /// Rejected, retried out of attempts, expired out of attempts, skipped.
    Dead,
}

impl Hold {
    fn settled(&self) -> bool {
        matches!(self, Hold::Acked | Hold::Dead)
    }
}

/// One partition of a group: the hold of each sequence (index = sequence
/// - 1), and how far positions count as settled before they exist (a
/// start or reset after a sequence not yet appended).
#[derive(Debug, Clone, PartialEq, Default)]
struct Part {
    holds: Vec<Hold>,
    pre_settled: u64,
}

/// A group in the model: its partitions (absent ones are not consumed).
#[derive(Debug, Clone, PartialEq)]
struct Group {
    max_attempts: u32,
    backoff: Duration,
    parts: Vec<Option<Part>>,
}

/// The state of every group.
type State = Vec<Group>;

/// What the API shows of a group: (high watermark, frontier) per
/// partition, in-flight, waiting, dead letters.
type Fingerprint = (Vec<(u64, u64)>, u64, u64, u64);

struct Model {
    /// Per partition, each event's (timestamp, tag).
    events: Vec<Vec<(Timestamp, u64)>>,
    /// What the live engine holds.
    live: State,
    /// What the disk holds: the live state at the last WAL sync.
    durable: State,
    /// The newest checkpoint generation seen in the groups directory.
    checkpoint: Option<u64>,
}

fn part_mut(state: &mut State, g: usize, p: u32) -> Option<&mut Part> {
    state.get_mut(g)?.parts.get_mut(p as usize)?.as_mut()
}

impl Model {
    fn hold(&self, g: usize, p: u32, seq: u64) -> Option<&Hold> {
        self.live.get(g)?.parts.get(p as usize)?.as_ref()?.holds.get(usize::try_from(seq).ok()?.checked_sub(1)?)
    }

    fn held(&self, g: usize, l: &LeaseRef) -> Option<u32> {
        match self.hold(g, l.partition, l.sequence)? {
            Hold::Leased { id, attempt, .. } if *id == l.lease_id && id.as_u128() != 0 => Some(*attempt),
            _ => None,
        }
    }

    fn set(&mut self, g: usize, l: &LeaseRef, h: Hold) {
        if let Some(part) = part_mut(&mut self.live, g, l.partition) {
            part.holds[(l.sequence - 1) as usize] = h;
        }
    }

    fn append(&mut self, p: u32, ts: Timestamp, tag: u64) {
        self.events[p as usize].push((ts, tag));
        let seq = self.events[p as usize].len() as u64;
        for state in [&mut self.live, &mut self.durable] {
            for g in state.iter_mut() {
                if let Some(part) = g.parts[p as usize].as_mut() {
                    part.holds.push(if seq <= part.pre_settled { Hold::Acked } else { Hold::Open(0) });
                }
            }
        }
    }

    fn scope(&self, g: usize, only: Option<u32>) -> Vec<u32> {
        (0..PARTS).filter(|&p| self.live[g].parts[p as usize].is_some() && only.is_none_or(|o| o == p)).collect()
    }

    /// The claims a fetch makes, in order: (partition, sequence, attempt);
    /// dead-letters the spent ones it meets (at most `limit` + 64, then
    /// each partition stops at its first spent one). Returns whether it did.
    fn fetch(&mut self, g: usize, now: Timestamp, limit: usize, scope: &[u32]) -> (Vec<(u32, u64, u32)>, bool) {
        let mut out = Vec::new();
        let mut dead = false;
        let mut spent_left = limit + 64;
        let max_attempts = self.live[g].max_attempts;
        'parts: for &p in scope {
            let Some(part) = part_mut(&mut self.live, g, p) else { continue };
            for (i, h) in part.holds.iter_mut().enumerate() {
                if out.len() == limit {
                    break 'parts;
                }
                let attempt = match h {
                    Hold::Open(a) => *a,
                    Hold::Leased { expires, attempt, .. } if *expires <= now => *attempt,
                    Hold::Waiting { ready, attempt } if *ready <= now => *attempt,
                    _ => continue,
                };
                if attempt >= max_attempts {
                    if spent_left == 0 {
                        continue 'parts;
                    }
                    spent_left -= 1;
                    *h = Hold::Dead;
                    dead = true;
                    continue;
                }
                out.push((p, i as u64 + 1, attempt + 1));
            }
        }
        (out, dead)
    }

    /// Reopens every settled sequence above `after` in `p`: returns how many.
    fn reopen_after(&mut self, g: usize, p: u32, after: u64) -> u64 {
        let Some(part) = part_mut(&mut self.live, g, p) else { return 0 };
        part.pre_settled = part.pre_settled.min(after);
        let mut n = 0;
        for h in part.holds.iter_mut().skip(usize::try_from(after).unwrap_or(usize::MAX)) {
            if h.settled() {
                *h = Hold::Open(0);
                n += 1;
            }
        }
        n
    }

    /// The frontier a reset or start gives `p`.
    fn start_frontier(&self, p: u32, start: &Start, now: Timestamp) -> u64 {
        let events = &self.events[p as usize];
        let hw = events.len() as u64;
        match start {
            Start::Beginning => 0,
            Start::After(n) => *n,
            Start::Latest => hw,
            Start::At(back) => {
                let t = back_from(now, *back);
                events.iter().position(|(ts, _)| *ts >= t).map_or(hw, |i| i as u64)
            }
        }
    }

    fn synced(&mut self) {
        self.durable = self.live.clone();
    }

    /// After a crash: the durable holds (appends are synced before they
    /// return, so they are all there).
    fn crash(&mut self) {
        self.live = self.durable.clone();
    }

    fn fingerprint(state: &State, g: usize, now: Timestamp, events: &[Vec<(Timestamp, u64)>]) -> Fingerprint {
        let group = &state[g];
        let mut lag = Vec::new();
        let (mut inflight, mut waiting, mut dead) = (0, 0, 0);
        for (p, part) in group.parts.iter().enumerate() {
            let Some(part) = part else { continue };
            let hw = events[p].len() as u64;
            let settled = part.holds.iter().take_while(|h| h.settled()).count() as u64;
            let frontier = if settled == hw { hw.max(part.pre_settled) } else { settled };
            lag.push((hw, frontier));
            for h in &part.holds {
                match h {
                    Hold::Leased { .. } => inflight += 1,
                    Hold::Waiting { ready, .. } if *ready > now => waiting += 1,
                    Hold::Dead => dead += 1,
                    _ => {}
                }
            }
        }
        (lag, inflight, waiting, dead)
    }
}

/// `ms` before `now`.
fn back_from(now: Timestamp, ms: u64) -> Timestamp {
    Timestamp::from_millis(now.as_millis().saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX)))
}

fn options(checkpoint_bytes: u64, preallocate_bytes: u64) -> EngineOptions {
    small_options().checkpoint_bytes(checkpoint_bytes).preallocate_bytes(preallocate_bytes)
}

fn open(vfs: &FaultyVfs, opts: &EngineOptions, clock: &ManualClock, what: &str) -> NativeBackend {
    match Engine::open(Arc::new(vfs.clone()), opts.clone()) {
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

fn lease_ref(g: usize, p: u32, seq: u64, id: LeaseId) -> LeaseRef {
    LeaseRef {
        stream: STREAM.into(),
        group: GROUPS[g].into(),
        partition: p,
        sequence: seq,
        lease_id: id,
        receipt: None,
    }
}

fn event_id(p: u32, seq: u64) -> String {
    format!("e{p}-{seq}")
}

fn group_of(l: &LeaseRef) -> usize {
    GROUPS.iter().position(|g| *g == &*l.group).unwrap_or(0)
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
    match m.hold(group_of(l), l.partition, l.sequence) {
        Some(Hold::Leased { .. }) => "fetched again under a new lease".into(),
        Some(h) => format!("now {h:?}"),
        None => "no such sequence".into(),
    }
}

/// What the backend shows of group `g`.
async fn observed(b: &NativeBackend, g: usize) -> Fingerprint {
    let info = b.group_info(STREAM, GROUPS[g]).await.expect("group_info");
    let lag = info.lag.partitions.iter().map(|pl| (pl.high_watermark, pl.frontier)).collect();
    (lag, info.inflight, info.retry_waiting, info.dead_letters)
}

async fn check(b: &NativeBackend, m: &Model, now: Timestamp, step: usize, call: &Call) {
    if let Some(reason) = b.engine().poisoned() {
        panic!("step {step} ({call:?}): the engine is poisoned: {reason}");
    }
    for g in 0..GROUPS.len() {
        let lag = b.lag(STREAM, GROUPS[g], None).await.expect("lag");
        let info = b.group_info(STREAM, GROUPS[g]).await.expect("group_info");
        assert_eq!(lag.partitions, info.lag.partitions, "lag and group_info disagree");
        let want = Model::fingerprint(&m.live, g, now, &m.events);
        assert_eq!(
            observed(b, g).await,
            want,
            "step {step} ({call:?}): group {}: ((high watermark, frontier) per partition, in flight, waiting, dead letters); model {:?}",
            GROUPS[g],
            m.live[g]
        );
        let dead = b.dead_letters(STREAM, GROUPS[g], &DeadLetterOptions::new().limit(10_000)).await.expect("dlq");
        let got: BTreeSet<(u32, u64)> = dead.iter().map(|d| (d.partition, d.sequence)).collect();
        let mut model_dead = BTreeSet::new();
        for (p, part) in m.live[g].parts.iter().enumerate() {
            for (i, h) in part.iter().flat_map(|part| part.holds.iter().enumerate()) {
                if matches!(h, Hold::Dead) {
                    model_dead.insert((p as u32, i as u64 + 1));
                }
            }
        }
        assert_eq!(got, model_dead, "step {step} ({call:?}): group {}: dead letters", GROUPS[g]);
        assert!(dead.iter().all(|d| d.event.is_some() && d.damage.is_none()), "nothing is damaged here");
    }
}

/// What the model predicts a call answers.
#[derive(Debug)]
enum Expect {
    /// Appends, clock moves, checkpoints, reopens: checked where they run.
    Nothing,
    /// A fetch's claims (partition, sequence, attempt); or the fetch is
    /// refused (a partition the group does not consume).
    Claims(Option<Vec<(u32, u64, u32)>>),
    /// A settle succeeds (`true`) or is `StaleLease`.
    Settle(bool),
    /// A retry's outcome, or `StaleLease` (None).
    Retry(Option<RetryOutcome>),
    /// Per lease of an `ack_many`: succeeds or `StaleLease`.
    Acks(Vec<bool>),
    /// A skip: dead-lettered (true), already a dead letter (false), or
    /// refused (None).
    Skip(Option<bool>),
    /// A replay: how many it reopens; `Err(true)`: no event in range;
    /// `Err(false)`: refused (a partition the group does not consume).
    Replay(Result<u64, bool>),
    /// A reset succeeds, or is refused.
    Reset(bool),
}

struct Run {
    faulty: FaultyVfs,
    mem: MemVfs,
    opts: EngineOptions,
    clock: ManualClock,
    backend: Option<NativeBackend>,
    m: Model,
    leases: Vec<LeaseRef>,
}

impl Run {
    fn b(&self) -> &NativeBackend {
        self.backend.as_ref().expect("an open backend")
    }

    fn pick(&self, i: usize) -> Option<LeaseRef> {
        (!self.leases.is_empty()).then(|| self.leases[i % self.leases.len()].clone())
    }

    /// The state after `call` and what it answers, by the model alone
    /// (claims hold an empty lease id until the fetch's answer gives theirs).
    /// The bool: the call syncs the WAL.
    fn predict(&self, call: &Call, now: Timestamp) -> (State, Expect, bool) {
        let mut m =
            Model { events: self.m.events.clone(), live: self.m.live.clone(), durable: Vec::new(), checkpoint: None };
        let (expect, syncs) = match call {
            Call::Fetch { g, limit, lease_ms, only } => {
                // A partition the group does not consume is an empty scope.
                let scope = m.scope(*g, *only);
                let (claims, dead) = m.fetch(*g, now, *limit, &scope);
                let expires = now.saturating_add(Duration::from_millis(*lease_ms));
                for &(p, seq, attempt) in &claims {
                    m.set(
                        *g,
                        &lease_ref(*g, p, seq, LeaseId::from_u128(0)),
                        Hold::Leased { id: LeaseId::from_u128(0), expires, attempt },
                    );
                }
                (Expect::Claims(Some(claims)), dead)
            }
            Call::Ack(i) | Call::Reject(i) => match self.pick(*i) {
                Some(l) => {
                    let g = group_of(&l);
                    let held = m.held(g, &l).is_some();
                    if held {
                        m.set(g, &l, if matches!(call, Call::Ack(_)) { Hold::Acked } else { Hold::Dead });
                    }
                    (Expect::Settle(held), held)
                }
                None => (Expect::Nothing, false),
            },
            Call::AckMany(is) => {
                let mut held = Vec::new();
                for l in is.iter().filter_map(|&i| self.pick(i)) {
                    let g = group_of(&l);
                    let h = m.held(g, &l).is_some();
                    if h {
                        m.set(g, &l, Hold::Acked);
                    }
                    held.push(h);
                }
                let any = held.iter().any(|&h| h);
                (Expect::Acks(held), any)
            }
            Call::Retry(i, delay) => match self.pick(*i) {
                Some(l) => {
                    let g = group_of(&l);
                    match m.held(g, &l) {
                        None => (Expect::Retry(None), false),
                        Some(attempt) if attempt >= m.live[g].max_attempts => {
                            m.set(g, &l, Hold::Dead);
                            (Expect::Retry(Some(RetryOutcome::DeadLettered)), true)
                        }
                        Some(attempt) => {
                            let wait = delay.map_or(m.live[g].backoff, Duration::from_millis);
                            let ready = now.saturating_add(wait);
                            let hold =
                                if ready <= now { Hold::Open(attempt) } else { Hold::Waiting { ready, attempt } };
                            m.set(g, &l, hold);
                            (Expect::Retry(Some(RetryOutcome::Scheduled { available_at: ready })), true)
                        }
                    }
                }
                None => (Expect::Nothing, false),
            },
            Call::Renew(i, ms) => match self.pick(*i) {
                Some(l) => {
                    let g = group_of(&l);
                    let held = m.held(g, &l);
                    if let Some(attempt) = held {
                        let expires = now.saturating_add(Duration::from_millis(*ms));
                        m.set(g, &l, Hold::Leased { id: l.lease_id, expires, attempt });
                    }
                    (Expect::Settle(held.is_some()), false)
                }
                None => (Expect::Nothing, false),
            },
            Call::Skip { g, p, seq } => {
                let hw = m.events[*p as usize].len() as u64;
                let consumed = m.live[*g].parts[*p as usize].is_some();
                match (consumed, m.hold(*g, *p, *seq).cloned()) {
                    (false, _) => (Expect::Skip(None), false),
                    _ if *seq == 0 || *seq > hw => (Expect::Skip(None), false),
                    (_, Some(Hold::Dead)) => (Expect::Skip(Some(false)), false),
                    (_, Some(Hold::Acked)) => (Expect::Skip(None), false),
                    _ => {
                        if let Some(part) = part_mut(&mut m.live, *g, *p) {
                            part.holds[(*seq - 1) as usize] = Hold::Dead;
                        }
                        (Expect::Skip(Some(true)), true)
                    }
                }
            }
            Call::Replay { g, mode, only } => {
                let scope = m.scope(*g, *only);
                {
                    let mut reopened = 0;
                    let mut none_in_range = false;
                    match mode {
                        Replay::Sequence(from) => {
                            for &p in &scope {
                                reopened += m.reopen_after(*g, p, *from);
                            }
                        }
                        Replay::Time(back) => {
                            let t = back_from(now, *back);
                            let starts: Vec<(u32, u64)> = scope
                                .iter()
                                .filter_map(|&p| {
                                    let i = m.events[p as usize].iter().position(|(ts, _)| *ts >= t)?;
                                    Some((p, i as u64))
                                })
                                .collect();
                            none_in_range = starts.is_empty();
                            for (p, after) in starts {
                                reopened += m.reopen_after(*g, p, after);
                            }
                        }
                        Replay::Query(tag) => {
                            for &p in &scope {
                                let tags: Vec<u64> = m.events[p as usize].iter().map(|(_, t)| *t).collect();
                                if let Some(part) = part_mut(&mut m.live, *g, p) {
                                    for (h, t) in part.holds.iter_mut().zip(tags) {
                                        if t == *tag && h.settled() {
                                            *h = Hold::Open(0);
                                            reopened += 1;
                                        }
                                    }
                                }
                            }
                        }
                    }
                    // What is logged (and synced): a reopening per partition
                    // replayed from a sequence or time; by query, only the
                    // sequences reopened.
                    let logs = match mode {
                        Replay::Query(_) => reopened > 0,
                        _ => !scope.is_empty(),
                    };
                    if none_in_range {
                        (Expect::Replay(Err(true)), false)
                    } else {
                        (Expect::Replay(Ok(reopened)), logs)
                    }
                }
            }
            Call::Reset { g, start, only } => {
                let scope = m.scope(*g, *only);
                {
                    for &p in &scope {
                        let frontier = m.start_frontier(p, start, now);
                        if let Some(part) = part_mut(&mut m.live, *g, p) {
                            for (i, h) in part.holds.iter_mut().enumerate() {
                                *h = if (i as u64) < frontier { Hold::Acked } else { Hold::Open(0) };
                            }
                            part.pre_settled = frontier;
                        }
                    }
                    (Expect::Reset(true), !scope.is_empty())
                }
            }
            _ => (Expect::Nothing, false),
        };
        (m.live, expect, syncs)
    }

    /// Runs one call on the backend and checks its answer against the
    /// model's prediction, then takes the predicted state. Inside
    /// `CrashIn` (`crashing`), an answer cut short by the crash returns
    /// true (the caller sorts out the state).
    async fn apply(&mut self, step: usize, call: &Call, crashing: bool) -> bool {
        let now = self.clock.now();
        let (state, expect, syncs) = self.predict(call, now);
        macro_rules! answer {
            ($r:expr) => {
                match $r {
                    Err(e) if crashing && self.faulty.crashed() && !e.is_stale_lease() => return true,
                    r => r,
                }
            };
        }
        match (call, expect) {
            (Call::Append { p, n }, _) => {
                let first = self.m.events[*p as usize].len() as u64 + 1;
                let events: Vec<NewEvent> = (0..u64::from(*n))
                    .map(|i| {
                        let opts = AppendOptions::new().partition(*p).id(event_id(*p, first + i));
                        NewEvent::prepare(serde_json::json!({"i": first + i, "tag": (first + i) % TAGS}), opts)
                    })
                    .collect();
                let out = self.b().append_batch(STREAM, &events).await.expect("append");
                let seqs: Vec<u64> = out.iter().map(|e| e.sequence).collect();
                assert_eq!(seqs, (first..first + u64::from(*n)).collect::<Vec<_>>(), "appended sequences");
                for e in &out {
                    self.m.append(*p, e.timestamp, e.sequence % TAGS);
                }
                return false;
            }
            (Call::Fetch { g, limit, lease_ms, only }, Expect::Claims(want)) => {
                let lease = Duration::from_millis(*lease_ms);
                let mut fetch = FetchOptions::new().limit(*limit).consumer("c").lease(lease);
                if let Some(p) = only {
                    fetch = fetch.partitions(vec![*p]);
                }
                let r = answer!(self.b().fetch(STREAM, GROUPS[*g], &fetch).await);
                let Some(want) = want else {
                    assert!(
                        matches!(r, Err(Error::InvalidPartition { .. } | Error::InvalidArgument { .. }))
                            || r.as_ref().is_ok_and(|r| r.leases.is_empty()),
                        "step {step}: a fetch of a partition not consumed: {r:?}"
                    );
                    return false;
                };
                let report = r.unwrap_or_else(|e| panic!("step {step}: fetch failed: {e}"));
                assert!(report.damaged.is_empty(), "nothing is damaged here");
                let got = report.leases;
                let claims: Vec<(u32, u64, u32)> =
                    got.iter().map(|l| (l.partition(), l.sequence(), l.attempt)).collect();
                assert_eq!(claims, want, "step {step} ({call:?}): claims (partition, sequence, attempt)");
                self.m.live = state;
                for l in &got {
                    assert_eq!(l.event.id(), event_id(l.partition(), l.sequence()), "the delivered event");
                    assert_eq!(l.expires_at, now.saturating_add(lease), "the lease's expiry");
                    let r = l.to_ref();
                    self.m.set(*g, &r, Hold::Leased { id: l.lease_id, expires: l.expires_at, attempt: l.attempt });
                    self.leases.push(r);
                }
                if self.leases.len() > MAX_LEASES {
                    self.leases.drain(..self.leases.len() - MAX_LEASES);
                }
            }
            (Call::Ack(i) | Call::Reject(i), Expect::Settle(held)) => {
                let l = self.pick(*i).expect("a lease");
                let why = why_not(&self.m, &l);
                let r = if matches!(call, Call::Ack(_)) {
                    self.b().ack(&l).await
                } else {
                    self.b().reject(&l, "bad").await
                };
                let r = answer!(r);
                expect_settled("ack or reject", &l, held, &r, &why);
                self.m.live = state;
            }
            (Call::Renew(i, ms), Expect::Settle(held)) => {
                let l = self.pick(*i).expect("a lease");
                let why = why_not(&self.m, &l);
                let r = self.b().renew(&l, Duration::from_millis(*ms)).await;
                expect_settled("renew", &l, held, &r, &why);
                if held {
                    assert_eq!(r.ok(), Some(now.saturating_add(Duration::from_millis(*ms))), "the renewed expiry");
                }
                self.m.live = state;
            }
            (Call::AckMany(is), Expect::Acks(held)) => {
                let refs: Vec<LeaseRef> = is.iter().filter_map(|&i| self.pick(i)).collect();
                if refs.is_empty() {
                    return false;
                }
                let rs = answer!(self.b().ack_many(&refs).await).expect("ack_many");
                assert_eq!(rs.len(), refs.len(), "one result per lease");
                for ((l, r), h) in refs.iter().zip(&rs).zip(held) {
                    if let Err(e) = r
                        && crashing
                        && self.faulty.crashed()
                        && !e.is_stale_lease()
                    {
                        return true;
                    }
                    expect_settled("ack_many", l, h, r, &why_not(&self.m, l));
                }
                self.m.live = state;
            }
            (Call::Retry(i, delay), Expect::Retry(outcome)) => {
                let l = self.pick(*i).expect("a lease");
                let why = why_not(&self.m, &l);
                let r = answer!(self.b().retry(&l, "again", delay.map(Duration::from_millis)).await);
                expect_settled("retry", &l, outcome.is_some(), &r, &why);
                if let Some(o) = outcome {
                    assert_eq!(r.ok(), Some(o), "step {step}: the retry's outcome");
                }
                self.m.live = state;
            }
            (Call::Skip { g, p, seq }, Expect::Skip(want)) => {
                let r = answer!(self.b().skip(STREAM, GROUPS[*g], *p, *seq, "skip").await);
                match want {
                    Some(w) => assert_eq!(r.ok(), Some(w), "step {step} ({call:?}): skip"),
                    None => assert!(
                        matches!(r, Err(Error::InvalidArgument { .. })),
                        "step {step} ({call:?}): skip refused: {r:?}"
                    ),
                }
                self.m.live = state;
            }
            (Call::Replay { g, mode, only }, Expect::Replay(want)) => {
                let mut opts = match mode {
                    Replay::Sequence(from) => ReplayOptions::from_sequence(*from),
                    Replay::Time(back) => ReplayOptions::from_time(back_from(now, *back)),
                    Replay::Query(tag) => ReplayOptions::query(Query::new(STREAM).eq("tag", serde_json::json!(tag))),
                };
                if let Some(p) = only {
                    opts = opts.partitions(vec![*p]);
                }
                let replay = opts.validate(STREAM, GROUPS[*g]).expect("one start");
                let r = answer!(self.b().replay(STREAM, GROUPS[*g], &replay).await);
                match want {
                    Ok(n) => assert_eq!(r.ok(), Some(n), "step {step} ({call:?}): events reopened"),
                    Err(true) => assert!(
                        matches!(r, Err(Error::NoEventsInRange { .. })),
                        "step {step}: no event in range: {r:?}"
                    ),
                    Err(false) => assert!(r.is_err(), "step {step}: a replay of a partition not consumed: {r:?}"),
                }
                self.m.live = state;
            }
            (Call::Reset { g, start, only }, Expect::Reset(ok)) => {
                let position = match start {
                    Start::Beginning => StartPosition::Beginning,
                    Start::After(n) => StartPosition::After(*n),
                    Start::At(back) => StartPosition::At(back_from(now, *back)),
                    Start::Latest => StartPosition::Latest,
                };
                let mut opts = ResetOptions::confirmed().start(position);
                if let Some(p) = only {
                    opts = opts.partitions(vec![*p]);
                }
                let reset = opts.confirmed_for(STREAM, GROUPS[*g]).expect("confirmed");
                let r = answer!(self.b().reset_group(STREAM, GROUPS[*g], &reset).await);
                assert_eq!(r.is_ok(), ok, "step {step} ({call:?}): reset: {r:?}");
                self.m.live = state;
            }
            (Call::Advance(ms), _) => self.clock.advance(Duration::from_millis(*ms)),
            (Call::Checkpoint, _) => {
                self.b().engine().checkpoint(STREAM).expect("checkpoint");
                self.m.synced();
            }
            (Call::Reopen { settle_all }, _) => {
                // Opening syncs nothing: unsynced claims stay unsynced.
                self.backend = None;
                self.backend = Some(open(&self.faulty, &self.opts, &self.clock, "reopen"));
                if *settle_all {
                    self.settle_all(step).await;
                }
            }
            (Call::Crash, _) => {
                self.crash_and_reopen();
                self.m.crash();
            }
            (Call::CrashIn { after, call }, _) => {
                // Only this call in doubt: everything before it is synced.
                self.b().engine().checkpoint(STREAM).expect("checkpoint");
                self.m.synced();
                self.m.checkpoint = newest_checkpoint(&self.mem);
                let before = self.m.live.clone();
                let (after_state, _, _) = self.predict(call, now);
                let before_leases = self.leases.len();
                self.faulty.arm(*after);
                let cut = Box::pin(self.apply(step, call, true)).await;
                let fired = self.faulty.crashed();
                self.faulty.arm(0);
                if !fired {
                    assert!(!cut, "a call was cut short without a crash");
                    return false;
                }
                // The call may have answered before the crash (which then hit
                // its checkpoint, say): either way its record may or may not
                // be on disk.
                self.leases.truncate(before_leases);
                self.crash_and_reopen();
                let now = self.clock.now();
                let mut seen = Vec::new();
                for g in 0..GROUPS.len() {
                    seen.push(observed(self.b(), g).await);
                }
                // Per group: an `ack_many` over two groups settles each
                // group's leases in its own WAL record, so the crash may fall
                // between them.
                let mut state = before.clone();
                for g in 0..GROUPS.len() {
                    if seen[g] == Model::fingerprint(&before, g, now, &self.m.events) {
                        continue;
                    }
                    if seen[g] != Model::fingerprint(&after_state, g, now, &self.m.events) {
                        panic!(
                            "step {step}: after a crash inside {call:?} group {} holds neither the state before the call nor the one after it: {seen:?}\nbefore: {before:?}\nafter: {after_state:?}",
                            GROUPS[g]
                        );
                    }
                    state[g] = after_state[g].clone();
                }
                self.m.live = state;
                self.m.synced();
                return false;
            }
            // A settle with no lease kept yet.
            (_, Expect::Nothing) => return false,
            (call, expect) => unreachable!("no prediction {expect:?} for {call:?}"),
        }
        if syncs {
            self.m.synced();
        }
        false
    }

    /// Acks every lease the model holds (after a reopen: they all hold).
    async fn settle_all(&mut self, step: usize) {
        let mut refs = Vec::new();
        for (g, group) in self.m.live.iter().enumerate() {
            for (p, part) in group.parts.iter().enumerate() {
                for (i, h) in part.iter().flat_map(|part| part.holds.iter().enumerate()) {
                    if let Hold::Leased { id, .. } = h
                        && id.as_u128() != 0
                    {
                        refs.push((g, lease_ref(g, p as u32, i as u64 + 1, *id)));
                    }
                }
            }
        }
        if refs.is_empty() {
            return;
        }
        let only: Vec<LeaseRef> = refs.iter().map(|(_, l)| l.clone()).collect();
        let rs = self.b().ack_many(&only).await.expect("ack_many after reopen");
        for ((g, l), r) in refs.iter().zip(&rs) {
            assert!(r.is_ok(), "step {step}: a lease held before the reopen does not settle: {l:?}: {r:?}");
            self.m.set(*g, l, Hold::Acked);
        }
        self.m.synced();
    }

    fn crash_and_reopen(&mut self) {
        self.backend = None;
        self.faulty.restart();
        self.backend = Some(open(&self.faulty, &self.opts, &self.clock, "open after a crash"));
    }
}

async fn run(data: &[u8]) -> arbitrary::Result<()> {
    let mut u = Unstructured::new(data);
    let max_attempts = u.int_in_range(1..=4)?;
    let backoff = Duration::from_millis([0, 300, 2_000][u.int_in_range(0..=2usize)?]);
    let checkpoint_bytes = [256, 1024, 4096, u64::MAX][u.int_in_range(0..=3usize)?];
    let preallocate_bytes = if u.arbitrary()? { 4096 } else { 0 };
    let mut calls = Vec::new();
    while !u.is_empty() && calls.len() < MAX_CALLS {
        match call(&mut u, false) {
            Ok(c) => calls.push(c),
            Err(_) => break,
        }
    }

    let opts = options(checkpoint_bytes, preallocate_bytes);
    let mem = MemVfs::new();
    let faulty = FaultyVfs::new(mem.clone(), Fault::Crash, 0, 1);
    let clock = ManualClock::new(START);
    let b = open(&faulty, &opts, &clock, "a new directory");
    b.create_stream(STREAM, &StreamOptions::new().partitions(PARTS)).await.expect("create the stream");
    // `h`: other settings, partition 1 only.
    let settings = [
        (max_attempts, backoff, None),
        (5 - max_attempts, if backoff.is_zero() { Duration::from_millis(700) } else { Duration::ZERO }, Some(vec![1])),
    ];
    let mut groups = Vec::new();
    for (name, (attempts, backoff, partitions)) in GROUPS.iter().zip(settings) {
        let backoff_opt = if backoff.is_zero() { Backoff::None } else { Backoff::Fixed(backoff) };
        let mut group = GroupOptions::new().max_attempts(attempts).retry_backoff(backoff_opt);
        if let Some(ps) = &partitions {
            group = group.partitions(ps.clone());
        }
        b.create_group(STREAM, name, &group).await.expect("create a group");
        let parts =
            (0..PARTS).map(|p| partitions.as_ref().is_none_or(|ps| ps.contains(&p)).then(Part::default)).collect();
        groups.push(Group { max_attempts: attempts, backoff, parts });
    }
    let model = Model {
        events: vec![Vec::new(); PARTS as usize],
        live: groups.clone(),
        durable: groups,
        checkpoint: newest_checkpoint(&mem),
    };
    let mut run = Run { faulty, mem, opts, clock, backend: Some(b), m: model, leases: Vec::new() };

    let trace = std::env::var_os("RHEO_FUZZ_TRACE").is_some();
    for (step, call) in calls.iter().enumerate() {
        if trace {
            eprintln!("step {step}: {call:?}");
        }
        run.apply(step, call, false).await;
        // An automatic checkpoint made everything so far durable.
        let ckpt = newest_checkpoint(&run.mem);
        if ckpt != run.m.checkpoint {
            run.m.checkpoint = ckpt;
            run.m.synced();
        }
        if trace {
            for g in 0..GROUPS.len() {
                eprintln!("  {}: {:?} model {:?}", GROUPS[g], observed(run.b(), g).await, run.m.live[g]);
            }
        }
        check(run.b(), &run.m, run.clock.now(), step, call).await;
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = runtime().block_on(run(data));
});
