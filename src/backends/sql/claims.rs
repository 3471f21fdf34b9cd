//! Claimed ranges (ADR 0021): how a fetch hands out fresh events without
//! writing a delivery row per event.
//!
//! A group's cursor (`rheo_groups.cursors`, the reference's) is the first
//! position of each partition no fetch has taken yet. A fetch that takes
//! fresh positions moves the cursor past them and writes one row of
//! `rheo_rs_claims` per block of [`CLAIM_MAX_POSITIONS`] sequences it takes
//! from: who holds them, until when, and the block's bitmap in eight 32-bit
//! words (a bit clear: in flight; set: settled, handed over to a delivery
//! row, or not the claim's). The lease of position `s` of a claim is
//! `base << 64 | s`, with version nibble 8 in `base`, so a settle finds its
//! claim without a table of lease ids; row leases are version 4.
//!
//! The state of a position below the cursor is, in this order: its
//! delivery row if it has one; else its claim's character if a claim
//! covers it; else settled (an ack that needed no row, or before the
//! group's start). A position whose claim needs per-lease state (a retry,
//! a reject, a skip, a renewal of part of a claim, a replay, an expired
//! claim met by a fetch) is *split* out first: it gets the delivery row of
//! an ordinary lease (status `leased`, attempt 1, the claim's lease id and
//! expiry) and its bit is set; everything after that is the row path of
//! `groups.rs`. A claim with every bit set says nothing and is deleted by
//! the next frontier flush.
//!
//! An ack of claimed leases is one statement that ORs its bits into the
//! claims' words (the same SQL on both dialects); it never locks the group
//! row. The frontier is derived state (the first
//! unsettled row or claimed bit, else the cursor, minus one) and is written by
//! the frontier flusher (`frontier.rs`), never ahead of what is settled.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde_json::Value;

use super::db::{Phase, Row, Tx, parse_map, sg};
use super::dialect::Dialect;
use super::streams::{EVENT_COLS, event_cols, seq_arg};
use super::{Now, SqlBackend, TxError, TxResult, at_commit, safe};
use crate::backends::common::frontier_cursor as fc;
use crate::backends::group_store::ClaimSpec;
use crate::error::{Error, Result};
use crate::model::lease::{LeaseId, LeaseRef};
use crate::model::time::Timestamp;

/// The sequences of a block: a claim covers positions of one block, and
/// its bitmap is the block's (eight words of 32 bits).
pub(crate) const CLAIM_MAX_POSITIONS: u64 = 256;

/// Bits 12..16 of a lease id's upper half: the UUID version. Row leases
/// are version 4 (`ids::new_lease_id`); claimed leases version 8.
const VERSION_MASK: u64 = 0xf000;
const CLAIM_VERSION: u64 = 0x8000;

/// A new claim base: 64 bits, version nibble 8, unique per fetch within a
/// process and random across processes.
pub(crate) fn new_claim_base() -> i64 {
    let id = crate::ids::new_lease_id();
    let (hi, lo) = split_u128(id);
    let mixed = hi.rotate_left(23) ^ lo.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed & !VERSION_MASK) | CLAIM_VERSION) as i64
}

fn split_u128(v: u128) -> (u64, u64) {
    let hi = u64::try_from(v >> 64).unwrap_or(u64::MAX);
    let lo = u64::try_from(v & u128::from(u64::MAX)).unwrap_or(u64::MAX);
    (hi, lo)
}

/// The base of a fetch's claims in partition `p`: two partitions' claims
/// of one fetch cover the same sequences, and their leases must differ.
/// (Bits 16.. only: the version nibble stays.)
pub(crate) fn partition_base(base: i64, p: u32) -> i64 {
    base ^ (i64::from(p) << 16)
}

/// The lease of position `seq` of the claim with `base`.
pub(crate) fn claim_lease(base: i64, seq: u64) -> LeaseId {
    LeaseId::from_u128((u128::from(base as u64) << 64) | u128::from(seq))
}

/// The claim base of a claimed lease of position `seq`; None for a row
/// lease (or an id that names another position).
pub(crate) fn claim_base(id: LeaseId, seq: u64) -> Option<i64> {
    let (hi, lo) = split_u128(id.as_u128());
    (hi & VERSION_MASK == CLAIM_VERSION && lo == seq).then_some(hi as i64)
}

/// Words of a claim's bitmap, and positions a word holds.
pub(crate) const WORDS: usize = 8;
const WORD_BITS: u64 = 32;
/// A word with every position settled.
pub(crate) const FULL: u32 = u32::MAX;

/// The block of a sequence (0-based), and its first sequence.
pub(crate) fn block_of(seq: u64) -> u64 {
    seq.saturating_sub(1) / CLAIM_MAX_POSITIONS
}

fn block_start(block: u64) -> u64 {
    block * CLAIM_MAX_POSITIONS + 1
}

/// The word and bit of a position in its block.
fn bit_of(seq: u64) -> (usize, u32) {
    let off = seq.saturating_sub(1) % CLAIM_MAX_POSITIONS;
    (usize::try_from(off / WORD_BITS).unwrap_or(0), 1u32 << (off % WORD_BITS))
}

/// The bitmap of a claim of `first..=last` (one block): their bits clear,
/// every other bit set.
pub(crate) fn open_words(first: u64, last: u64) -> [u32; WORDS] {
    let mut w = [FULL; WORDS];
    for q in first..=last {
        let (i, m) = bit_of(q);
        if let Some(word) = w.get_mut(i) {
            *word &= !m;
        }
    }
    w
}

/// A claim row as read for a split, an ack or a renewal.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub partition: u32,
    pub first: u64,
    pub last: u64,
    pub base: i64,
    pub consumer: String,
    pub leased_at: Timestamp,
    pub expires_at: Timestamp,
    pub words: [u32; WORDS],
}

impl Claim {
    /// True when position `seq` is in flight under this claim.
    pub fn open(&self, seq: u64) -> bool {
        if !(self.first..=self.last).contains(&seq) {
            return false;
        }
        let (i, m) = bit_of(seq);
        self.words.get(i).is_some_and(|w| w & m == 0)
    }

    fn set(&mut self, seq: u64) {
        if (self.first..=self.last).contains(&seq) {
            let (i, m) = bit_of(seq);
            if let Some(w) = self.words.get_mut(i) {
                *w |= m;
            }
        }
    }

    fn done(&self) -> bool {
        self.first > self.last || self.words.iter().all(|&w| w == FULL)
    }

    /// Positions in flight.
    pub fn open_count(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_zeros())).sum()
    }

    /// Ends the claim at `at`: what is above it is no longer the claim's.
    fn cut(&mut self, at: u64) {
        for q in at.saturating_add(1).max(self.first)..=self.last {
            self.set(q);
        }
        self.last = self.last.min(at);
    }
}

/// The first position in flight of a claim starting at `first` with these
/// words, if any.
pub(crate) fn first_open(first: u64, words: &[u32; WORDS]) -> Option<u64> {
    let start = block_start(block_of(first));
    words
        .iter()
        .enumerate()
        .find(|(_, w)| **w != FULL)
        .map(|(i, w)| start + (i as u64) * WORD_BITS + u64::from(w.trailing_ones()))
}

/// The SQL of "every bit of claim `k` is set".
pub(crate) fn all_set(k: &str) -> String {
    (0..WORDS).map(|i| format!("{k}.w{i} = {FULL}")).collect::<Vec<_>>().join(" AND ")
}

/// `w0, …, w7`, of alias `k` unless it is empty.
fn word_cols(k: &str) -> String {
    let dot = if k.is_empty() { String::new() } else { format!("{k}.") };
    (0..WORDS).map(|i| format!("{dot}w{i}")).collect::<Vec<_>>().join(", ")
}

/// The SQL of word `j` of a new claim whose positions are offsets
/// `lo..=hi` of its block: the bits of those positions clear, every other
/// set (`FULL - ((1 << (h + 1)) - (1 << l))`, l and h clamped to the word).
fn init_word(j: usize, lo: &str, hi: &str) -> String {
    let (a, b) = (j as u64 * WORD_BITS, j as u64 * WORD_BITS + WORD_BITS - 1);
    format!(
        "CASE WHEN ({hi}) < {a} OR ({lo}) > {b} THEN {FULL} ELSE {FULL} - ((CAST(1 AS BIGINT) << CAST(LEAST(({hi}), {b}) - {a} + 1 AS INTEGER)) \
         - (CAST(1 AS BIGINT) << CAST(GREATEST(({lo}), {a}) - {a} AS INTEGER))) END"
    )
}

/// Which claims a split hands over to delivery rows.
#[derive(Debug, Clone)]
pub(crate) enum Split<'a> {
    /// Every open position of claims that expired by `now`, in `parts`.
    Expired(&'a [u32], Timestamp),
    /// Every open position above `after` in each of these partitions; the
    /// claims then end at `after` (what they settled above it is no longer
    /// theirs: the cursor moves back over it).
    After(&'a [(u32, u64)]),
    /// These positions.
    Positions(&'a [(u32, u64)]),
}

/// What a claim statement found besides its leases.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ClaimFlags {
    /// The group row exists.
    pub found: bool,
    /// The one-statement claim left this fetch to `claim_ranges_tx`
    /// (nothing was claimed).
    pub slow: bool,
    /// The fresh-only claim found claimable delivery rows and left this
    /// fetch to `claim_ranges_pg` (nothing was claimed).
    pub rows: bool,
}

/// The rows of a claim (one layout for both dialects): kind (0 a leased
/// row, 1 a spent row dead-lettered, 2 a claimed position), partition,
/// sequence, row lease id (NULL for kind 2), attempt, expiry, then the
/// event's columns (`event_cols`).
pub(crate) struct Claimed {
    pub rows: Vec<Row>,
    pub base: i64,
    pub flags: ClaimFlags,
    /// Scheduled events the claim set aside until their time (ADR 0036).
    pub parked: u64,
}

/// What a transactional claim meets (`claim_survey`).
struct Survey {
    hws: HashMap<u32, u64>,
    /// Claims in scope that expired, or reach a cursor.
    claims: bool,
    /// Claimable delivery rows above a frontier.
    rows: bool,
    /// Delivery rows at or after a cursor.
    ahead: bool,
    /// Events scheduled after now at or after a cursor.
    sched: bool,
    /// The claim's now.
    now: Timestamp,
}

/// Positions past a cursor (beyond a fetch's limit) whose rows the
/// transactional claim reads to find free ones: bounds its work when many
/// rows follow a cursor (a replay's), at the cost of a few more fetches.
const FRESH_WINDOW_ROWS: u64 = 1000;

/// A claim candidate: (partition, sequence, row id or None for a fresh
/// position, spent).
pub(super) type Candidate = (u32, u64, Option<String>, bool);

/// Per partition: the fresh positions offered, and how far the cursor goes
/// when all are taken (past rows that follow them).
type Offered = BTreeMap<u32, (Vec<u64>, u64)>;

/// Per partition: the positions among the fresh ones whose events are
/// scheduled after now (ADR 0036); those the cursor passes are parked.
type Parks = BTreeMap<u32, Vec<u64>>;

/// The walk: in (partition, sequence) order until `limit` claims; spent
/// rows met on the way are dead-lettered (at most `spent_max` a fetch; past
/// that a partition stops). Returns the rows picked, `[row id, lease id or
/// null, "1" when spent]`, and the fresh positions taken per partition.
pub(super) fn walk_candidates(
    cands: Vec<Candidate>,
    limit: usize,
    spent_max: usize,
    lease_ids: &[LeaseId],
) -> (Vec<Value>, BTreeMap<u32, Vec<u64>>) {
    let (mut spent_left, mut n_claim) = (spent_max, 0usize);
    let mut stopped: Option<u32> = None;
    let mut picks: Vec<Value> = Vec::new();
    let mut fresh: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (p, q, rowid, spent) in cands {
        if n_claim >= limit {
            break;
        }
        if stopped == Some(p) {
            continue;
        }
        match rowid {
            Some(rowid) if spent => {
                if spent_left == 0 {
                    stopped = Some(p);
                    continue;
                }
                spent_left -= 1;
                picks.push(Value::from(vec![Value::from(rowid), Value::Null, Value::from("1")]));
            }
            Some(rowid) => {
                let id = lease_ids.get(n_claim).map(ToString::to_string).unwrap_or_default();
                n_claim += 1;
                picks.push(Value::from(vec![Value::from(rowid), Value::from(id), Value::from("0")]));
            }
            None => {
                n_claim += 1;
                fresh.entry(p).or_default().push(q);
            }
        }
    }
    (picks, fresh)
}

/// [`walk_candidates`] in SQL (PostgreSQL): the CTEs `w` and `w2` over the
/// candidates `src` (columns `p`, `q` and `spent`), where `rn` counts the
/// claims before a row, `spent_n` the spent rows up to it, and `stop` is
/// the first spent row of its partition past `spent_max` (where it stops).
pub(super) fn walk_sql(src: &str, p: &str, q: &str, spent_max: usize) -> String {
    format!(
        "w AS (SELECT {src}.*, \
           COALESCE(sum(CASE WHEN {src}.spent THEN 0 ELSE 1 END) OVER (ORDER BY {src}.{p}, {src}.{q} \
             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS rn, \
           sum(CASE WHEN {src}.spent THEN 1 ELSE 0 END) OVER (ORDER BY {src}.{p}, {src}.{q} \
             ROWS UNBOUNDED PRECEDING) AS spent_n FROM {src}), \
         w2 AS (SELECT w.*, min(CASE WHEN w.spent AND w.spent_n > {spent_max} THEN w.{q} END) \
           OVER (PARTITION BY w.{p}) AS stop FROM w)"
    )
}

/// Moves each cursor past the fresh positions taken (past the rows met too
/// when every free one was taken, or there was none); true when one moved.
fn advance_cursors(
    offered: &Offered,
    fresh: &BTreeMap<u32, Vec<u64>>,
    frontiers: &BTreeMap<u32, u64>,
    cursors: &mut BTreeMap<u32, u64>,
) -> bool {
    let mut moved = false;
    for (&p, (free, end)) in offered {
        let taken = fresh.get(&p).map(Vec::as_slice).unwrap_or_default();
        let to = match taken.last() {
            Some(&last) if taken.len() < free.len() => last + 1,
            Some(_) => *end,
            // Nothing taken: only past the rows before the first free one.
            None => free.first().copied().unwrap_or(*end),
        };
        if to > fc(frontiers, cursors, p).1 {
            cursors.insert(p, to);
            moved = true;
        }
    }
    moved
}

impl SqlBackend {
    /// The common PostgreSQL claim: fresh positions only, in one small
    /// statement (a third of the plan of `claim_ranges_pg`, which every
    /// execution initializes, and a retry after a concurrent fetch moved
    /// the cursor re-runs). It claims nothing and says so when a partition
    /// in scope has claimable delivery rows (`rows`: `claim_ranges_pg`
    /// walks them with the fresh positions) or needs the transaction
    /// (`slow`: rows or claims between a cursor and the high watermark,
    /// expired claims). The same rules as `claim_ranges_pg` otherwise:
    /// the group row is locked only when the snapshot shows fresh events,
    /// fresh positions start at its locked cursor and end at the
    /// snapshot's high watermark, and a partition whose cursor moved back
    /// since the snapshot takes nothing.
    pub(super) async fn claim_fresh_pg(&self, spec: &ClaimSpec<'_>, limit: usize) -> TxResult<Claimed> {
        let ClaimSpec { stream, group, scope, consumer, lease: lease_for, .. } = *spec;
        let base = new_claim_base();
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let parts = s.text(format!("{{{}}}", scope.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")));
        let lim = s.int(i64::try_from(limit).unwrap_or(i64::MAX));
        let b = s.int(base);
        let cons = s.text(consumer);
        let now = self.now();
        let at = self.now_sql(&mut s, now);
        let exp = self.later_sql(&mut s, now, lease_for);
        let same = |a: &str| format!("{a}.stream = {st} AND {a}.group_name = {gr}");
        s.push(&format!(
            "WITH g AS (SELECT g0.cursors, g0.frontiers FROM {groups} g0 WHERE g0.stream = {st} AND g0.name = {gr}), \
             pc AS (SELECT sc.p, q.next_sequence AS hw, \
                   COALESCE((g.frontiers ->> sc.p::text)::bigint, 0) AS f, \
                   COALESCE((g.cursors ->> sc.p::text)::bigint, COALESCE((g.frontiers ->> sc.p::text)::bigint, 0) + 1) AS c \
                   FROM unnest({parts}::int[]) AS sc(p) CROSS JOIN g \
                   JOIN {seqs} q ON q.stream = {st} AND q.partition = sc.p), \
             gate AS (SELECT {any_claimable} AS rows, \
                   (EXISTS (SELECT 1 FROM pc CROSS JOIN LATERAL (SELECT 1 FROM {dl} d WHERE {sd} AND d.partition = pc.p \
                     AND d.sequence >= pc.c AND d.sequence <= pc.hw LIMIT 1) r) \
                   OR EXISTS (SELECT 1 FROM pc CROSS JOIN LATERAL (SELECT 1 FROM {claims} k WHERE {sk} \
                     AND k.partition = pc.p AND (k.last_seq >= pc.c OR (k.expires_at <= {at} AND NOT ({full_k}))) \
                     LIMIT 1) r) \
                   OR EXISTS (SELECT 1 FROM pc CROSS JOIN LATERAL (SELECT 1 FROM {sched} sc WHERE sc.stream = {st} \
                     AND sc.partition = pc.p AND sc.sequence >= pc.c AND sc.sequence <= pc.hw \
                     AND sc.deliver_at > {at} LIMIT 1) r)) AS slow), \
             lk AS (SELECT l.cursors FROM {groups} l WHERE l.stream = {st} AND l.name = {gr} \
                   AND NOT (SELECT rows OR slow FROM gate) \
                   AND EXISTS (SELECT 1 FROM pc WHERE COALESCE((l.cursors ->> pc.p::text)::bigint, pc.f + 1) <= pc.hw) \
                   FOR UPDATE), \
             fa AS (SELECT pc.p, cl.c, GREATEST(0, pc.hw + 1 - cl.c) AS avail FROM pc CROSS JOIN lk \
                   CROSS JOIN LATERAL (SELECT COALESCE((lk.cursors ->> pc.p::text)::bigint, pc.f + 1) AS c) cl \
                   WHERE cl.c >= pc.c), \
             fq AS (SELECT fa.p, fa.c, LEAST(fa.avail, GREATEST(0, {lim} - COALESCE(sum(LEAST(fa.avail, {lim})) \
                   OVER (ORDER BY fa.p ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)))::bigint AS n FROM fa), \
             fr AS (SELECT fq.p, GREATEST(fq.c, blk * {n} + 1) AS first, LEAST(fq.c + fq.n - 1, (blk + 1) * {n}) AS last, \
                   blk * {n} + 1 AS bs FROM fq \
                   CROSS JOIN LATERAL generate_series((fq.c - 1) / {n}, (fq.c + fq.n - 2) / {n}) AS blk WHERE fq.n > 0), \
             cu AS (UPDATE {groups} g3 SET cursors = g3.cursors || (SELECT jsonb_object_agg(fq.p::text, fq.c + fq.n) \
                   FROM fq WHERE fq.n > 0) \
                   WHERE g3.stream = {st} AND g3.name = {gr} AND EXISTS (SELECT 1 FROM fr) RETURNING 1), \
             ins AS (INSERT INTO {claims} (stream, group_name, partition, first_seq, last_seq, base, consumer_id, \
                   leased_at, expires_at, {words}) \
                   SELECT {st}, {gr}, fr.p, fr.first, fr.last, {b} # (fr.p::bigint << 16), {cons}, {at}, {exp}, {init} \
                   FROM fr WHERE EXISTS (SELECT 1 FROM cu) RETURNING partition, first_seq, last_seq, expires_at) \
             SELECT 2, ins.partition::bigint, e.sequence, NULL, 1, {exp_ins}, {cols} FROM ins CROSS JOIN LATERAL \
               (SELECT * FROM {ev} e1 WHERE e1.stream = {st} AND e1.partition = ins.partition \
               AND e1.sequence BETWEEN ins.first_seq AND ins.last_seq ORDER BY e1.sequence) e \
             UNION ALL \
             SELECT 9, (SELECT count(*) FROM g), CASE WHEN (SELECT slow FROM gate) THEN 1 ELSE 0 END, NULL, \
               CASE WHEN (SELECT rows FROM gate) THEN 1 ELSE 0 END, NULL, \
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
            groups = self.names.groups(),
            seqs = self.names.seqs(),
            claims = self.names.claims(),
            dl = self.names.deliveries(),
            ev = self.names.events(),
            sched = self.names.scheduled(),
            sk = same("k"),
            sd = same("d"),
            any_claimable = self.any_claimable(&st, &gr, &at),
            n = CLAIM_MAX_POSITIONS,
            exp_ins = self.d.ts_out("ins.expires_at"),
            cols = event_cols(self.d, "e"),
            full_k = all_set("k"),
            words = word_cols(""),
            init = (0..WORDS).map(|j| init_word(j, "fr.first - fr.bs", "fr.last - fr.bs")).collect::<Vec<_>>().join(", "),
        ));
        let mut rows = self.hot.all(&s).await.map_err(at_commit)?;
        let mut flags = ClaimFlags::default();
        if let Some(i) = rows.iter().position(|r| r.i64(0).ok() == Some(9)) {
            let r = rows.swap_remove(i);
            flags = ClaimFlags { found: r.i64(1)? > 0, slow: r.i64(2)? > 0, rows: r.i64(4)? > 0 };
        }
        Ok(Claimed { rows, base, flags, parked: 0 })
    }

    /// The PostgreSQL claim when delivery rows are claimable (retries,
    /// expired leases, replays): one statement. It locks candidate rows
    /// with `SKIP LOCKED` and, only when the snapshot shows fresh events,
    /// the group row (`FOR UPDATE`) to move the cursor; walks the
    /// candidates and the fresh positions in (partition, sequence) order;
    /// leases the rows it takes, dead-letters spent ones met on the way,
    /// writes the claim rows and returns every event.
    ///
    /// It leaves the fetch to `claim_ranges_tx` (claiming nothing) when its
    /// snapshot shows expired claims, or rows or claims between a cursor
    /// and the high watermark. Otherwise fresh positions start at the
    /// cursor of the locked row (a concurrent fetch may have moved it since
    /// the snapshot) and end at the snapshot's high watermark, so nothing
    /// the snapshot may not see is ever claimed; a partition whose locked
    /// cursor is behind the snapshot's (a replay moved it back meanwhile)
    /// takes nothing fresh.
    pub(super) async fn claim_ranges_pg(
        &self,
        spec: &ClaimSpec<'_>,
        limit: usize,
        ids: &[LeaseId],
    ) -> TxResult<Claimed> {
        let ClaimSpec { stream, group, scope, consumer, lease: lease_for, .. } = *spec;
        let base = new_claim_base();
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let parts = s.text(Value::from(scope.to_vec()).to_string());
        let spent_max = limit + crate::groups::SPENT_PER_FETCH;
        let per = s.int(i64::try_from(spent_max).unwrap_or(i64::MAX));
        let lim = s.int(i64::try_from(limit).unwrap_or(i64::MAX));
        let ids = s.text(Value::from(ids.iter().map(ToString::to_string).collect::<Vec<_>>()).to_string());
        let b = s.int(base);
        let cons = s.text(consumer);
        let claimable = self.claimable(&mut s);
        let now = self.now();
        let at = self.now_sql(&mut s, now);
        let exp = self.later_sql(&mut s, now, lease_for);
        let set =
            self.claim_set(&mut s, "pick.spent", &format!("({ids}::jsonb ->> pick.rn::int)"), consumer, lease_for);
        let cur = |alias: &str, p: &str| {
            format!(
                "COALESCE(({alias}.cursors ->> {p}::text)::bigint, COALESCE((g.frontiers ->> {p}::text)::bigint, 0) + 1)"
            )
        };
        let same = |a: &str| format!("{a}.stream = {st} AND {a}.group_name = {gr}");
        s.push(&format!(
            "WITH sc AS (SELECT (x.v)::int AS p FROM jsonb_array_elements_text({parts}::jsonb) AS x(v)), \
             g AS (SELECT g0.cursors, g0.frontiers, g0.max_attempts FROM {groups} g0 \
                   WHERE g0.stream = {st} AND g0.name = {gr}), \
             hw AS (SELECT q.partition AS p, q.next_sequence AS hw FROM {seqs} q WHERE q.stream = {st}), \
             ex AS (SELECT (EXISTS (SELECT 1 FROM {claims} k WHERE {sk} AND k.partition IN (SELECT p FROM sc) \
                     AND k.expires_at <= {at} AND NOT ({full_k})) \
                   OR EXISTS (SELECT 1 FROM sc JOIN hw ON hw.p = sc.p CROSS JOIN g CROSS JOIN LATERAL \
                     (SELECT d.sequence FROM {dl} d WHERE {sd} AND d.partition = sc.p AND d.sequence >= {cur_g} \
                      AND d.sequence <= hw.hw LIMIT 1) r) \
                   OR EXISTS (SELECT 1 FROM sc JOIN hw ON hw.p = sc.p CROSS JOIN g CROSS JOIN LATERAL \
                     (SELECT k.first_seq FROM {claims} k WHERE {sk} AND k.partition = sc.p \
                      AND k.last_seq >= {cur_g} LIMIT 1) r) \
                   OR EXISTS (SELECT 1 FROM sc JOIN hw ON hw.p = sc.p CROSS JOIN g CROSS JOIN LATERAL \
                     (SELECT 1 FROM {sched} s9 WHERE s9.stream = {st} AND s9.partition = sc.p \
                      AND s9.sequence >= {cur_g} AND s9.sequence <= hw.hw AND s9.deliver_at > {at} LIMIT 1) r)) AS slow), \
             rc AS (SELECT y.* FROM sc CROSS JOIN g CROSS JOIN LATERAL ( \
                   SELECT d.ctid AS tid, d.partition AS p, d.sequence AS s, d.event_id, \
                   (d.status = 'leased' AND d.lease_id IS NOT NULL AND d.attempt >= g.max_attempts) AS spent \
                   FROM {dl} d WHERE {sd} AND d.partition = sc.p \
                   AND d.sequence > COALESCE((g.frontiers ->> sc.p::text)::bigint, 0) AND {claimable} \
                   ORDER BY d.sequence LIMIT {per} FOR UPDATE OF d SKIP LOCKED) y \
                   WHERE NOT (SELECT slow FROM ex)), \
             lk AS (SELECT l.cursors FROM {groups} l WHERE l.stream = {st} AND l.name = {gr} \
                   AND NOT (SELECT slow FROM ex) \
                   AND EXISTS (SELECT 1 FROM sc JOIN hw ON hw.p = sc.p CROSS JOIN g WHERE {cur_l} <= hw.hw) \
                   FOR UPDATE), \
             fa AS (SELECT sc.p, cl.c, GREATEST(0, hw.hw + 1 - cl.c) AS avail \
                   FROM sc JOIN hw ON hw.p = sc.p CROSS JOIN lk CROSS JOIN g \
                   CROSS JOIN LATERAL (SELECT {cur_lk} AS c, {cur_g} AS c0) cl WHERE cl.c >= cl.c0), \
             cand AS (SELECT rc.p, rc.s, rc.tid, rc.event_id, rc.spent, false AS fresh FROM rc \
                   UNION ALL SELECT fa.p, gs.s, NULL::tid, NULL::text, false, true FROM fa \
                   CROSS JOIN LATERAL generate_series(fa.c, fa.c + LEAST(fa.avail, {lim}) - 1) AS gs(s)), \
             {walk}, \
             fq AS (SELECT fa.p, fa.c, LEAST(fa.avail, GREATEST(0, {lim} - COALESCE(sum(LEAST(fa.avail, {lim})) \
                   OVER (ORDER BY fa.p ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)))::bigint AS n FROM fa), \
             pick AS (SELECT w2.p, w2.s, w2.tid, w2.event_id, w2.spent, w2.fresh, w2.rn FROM w2 \
                   WHERE EXISTS (SELECT 1 FROM rc) AND w2.rn < {lim} AND (NOT w2.spent OR w2.spent_n <= {spent_max}) \
                   AND (w2.stop IS NULL OR w2.s < w2.stop) \
                   UNION ALL SELECT fq.p, gs.s, NULL::tid, NULL::text, false, true, 0 FROM fq \
                   CROSS JOIN LATERAL generate_series(fq.c, fq.c + fq.n - 1) AS gs(s) \
                   WHERE NOT EXISTS (SELECT 1 FROM rc)), \
             ru AS (UPDATE {dl} d SET {set} FROM pick WHERE NOT pick.fresh AND d.ctid = pick.tid \
                   RETURNING pick.spent, d.partition, d.sequence, d.lease_id, d.attempt, d.expires_at, d.event_id), \
             fr AS (SELECT pick.p, min(pick.s) AS first, max(pick.s) AS last, \
                   ((min(pick.s) - 1) / {CLAIM_MAX_POSITIONS}) * {CLAIM_MAX_POSITIONS} + 1 AS bs FROM pick \
                   WHERE pick.fresh GROUP BY pick.p, (pick.s - 1) / {CLAIM_MAX_POSITIONS}), \
             cu AS (UPDATE {groups} g3 SET cursors = g3.cursors || (SELECT jsonb_object_agg(x.p::text, x.last + 1) \
                   FROM (SELECT fr.p, max(fr.last) AS last FROM fr GROUP BY fr.p) x) \
                   WHERE g3.stream = {st} AND g3.name = {gr} AND EXISTS (SELECT 1 FROM fr) RETURNING 1), \
             ins AS (INSERT INTO {claims} (stream, group_name, partition, first_seq, last_seq, base, consumer_id, \
                   leased_at, expires_at, {words}) \
                   SELECT {st}, {gr}, fr.p, fr.first, fr.last, {b} # (fr.p::bigint << 16), {cons}, {at}, {exp}, {init} \
                   FROM fr WHERE EXISTS (SELECT 1 FROM cu) RETURNING partition, first_seq, last_seq, expires_at) \
             SELECT CASE WHEN ru.spent THEN 1 ELSE 0 END, ru.partition::bigint, ru.sequence, ru.lease_id, \
                   ru.attempt::bigint, {exp_ru}, {cols} \
               FROM ru LEFT JOIN LATERAL (SELECT * FROM {ev} e1 WHERE e1.id = ru.event_id LIMIT 1) e ON true \
             UNION ALL \
             SELECT 2, ins.partition::bigint, e.sequence, NULL, 1, {exp_ins}, {cols} FROM ins CROSS JOIN LATERAL \
               (SELECT * FROM {ev} e1 WHERE e1.stream = {st} AND e1.partition = ins.partition \
               AND e1.sequence BETWEEN ins.first_seq AND ins.last_seq ORDER BY e1.sequence) e \
             UNION ALL \
             SELECT 9, (SELECT count(*) FROM g), CASE WHEN (SELECT slow FROM ex) THEN 1 ELSE 0 END, NULL, \
               0, NULL, \
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
            groups = self.names.groups(),
            seqs = self.names.seqs(),
            claims = self.names.claims(),
            dl = self.names.deliveries(),
            ev = self.names.events(),
            sched = self.names.scheduled(),
            sk = same("k"),
            sd = same("d"),
            walk = walk_sql("cand", "p", "s", spent_max),
            cur_l = cur("l", "sc.p"),
            cur_lk = cur("lk", "sc.p"),
            cur_g = cur("g", "sc.p"),
            exp_ru = self.d.ts_out("ru.expires_at"),
            exp_ins = self.d.ts_out("ins.expires_at"),
            cols = event_cols(self.d, "e"),
            full_k = all_set("k"),
            words = (0..WORDS).map(|i| format!("w{i}")).collect::<Vec<_>>().join(", "),
            init =
                (0..WORDS).map(|j| init_word(j, "fr.first - fr.bs", "fr.last - fr.bs")).collect::<Vec<_>>().join(", "),
        ));
        debug_assert_eq!(EVENT_COLS, 8);
        // One statement, so no transaction around it: a connection lost
        // while it runs leaves the outcome unknown (Ambiguous).
        let mut rows = self.hot.all(&s).await.map_err(at_commit)?;
        let mut flags = ClaimFlags::default();
        if let Some(i) = rows.iter().position(|r| r.i64(0).ok() == Some(9)) {
            let r = rows.swap_remove(i);
            flags = ClaimFlags { found: r.i64(1)? > 0, slow: r.i64(2)? > 0, rows: false };
        }
        Ok(Claimed { rows, base, flags, parked: 0 })
    }

    /// The claim as a transaction: always on SQLite (inside one `BEGIN
    /// IMMEDIATE`, which every writer of the file takes), and on PostgreSQL
    /// when the one-statement claim finds what it leaves to this path
    /// (expired claims, delivery rows or claims between a cursor and its
    /// high watermark: after a replay or a skip ahead). It locks the group
    /// row first, so what it reads cannot change under it: expired claims
    /// and claims at or after a cursor are split into rows, then the walk
    /// over candidate rows and fresh positions, where fresh positions skip
    /// the rows among them (a claim marks those `'1'`: their row decides).
    pub(super) async fn claim_ranges_tx(
        &self,
        spec: &ClaimSpec<'_>,
        limit: usize,
        ids: &[LeaseId],
    ) -> TxResult<Claimed> {
        let ClaimSpec { stream, group, scope, consumer, lease: lease_for, .. } = *spec;
        let base = new_claim_base();
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let Some((frontiers, mut cursors, max_attempts)) = self.lock_for_claim(&mut tx, stream, group).await? else {
            return Ok(Claimed { rows: Vec::new(), base, flags: ClaimFlags::default(), parked: 0 });
        };
        let now_ts = self.db_now(&mut tx).await?;
        // What this fetch meets, read once (under the lock): each kind of
        // work below runs only when there is some.
        let mut seen = self.claim_survey(&mut tx, stream, group, scope, &frontiers, &cursors, now_ts).await?;
        if seen.claims {
            // Splits make rows: of expired claims below the cursors, of
            // claims reaching one at or after it.
            seen.rows = true;
            seen.ahead = true;
            self.split_claims(&mut tx, stream, group, &Split::Expired(scope, now_ts)).await?;
            let reaching: Vec<(u32, u64)> =
                scope.iter().map(|&p| (p, fc(&frontiers, &cursors, p).1.saturating_sub(1))).collect();
            self.split_claims(&mut tx, stream, group, &Split::After(&reaching)).await?;
        }
        let spent_max = limit + crate::groups::SPENT_PER_FETCH;
        let marks = (&frontiers, &cursors, max_attempts);
        let (cands, offered, parks) =
            self.claim_candidates(&mut tx, (stream, group), scope, limit, spent_max, marks, &seen).await?;
        let (picks, fresh) = walk_candidates(cands, limit, spent_max, ids);
        let keys = self.claim_rows(&mut tx, picks, consumer, lease_for).await?;
        let expires = now_ts.saturating_add(lease_for);
        let moved = advance_cursors(&offered, &fresh, &frontiers, &mut cursors);
        // The scheduled events the cursors passed wait as parked rows.
        let passed: Vec<(u32, u64)> = parks
            .iter()
            .flat_map(|(&p, qs)| {
                let c = fc(&frontiers, &cursors, p).1;
                qs.iter().filter(move |&&q| q < c).map(move |&q| (p, q))
            })
            .collect();
        let parked = self.park_positions(&mut tx, (stream, group), &passed, Now::At(now_ts)).await?;
        let ranges = if fresh.is_empty() {
            Vec::new()
        } else {
            self.insert_fresh_claims(&mut tx, (stream, group), &fresh, base, consumer, (now_ts, expires)).await?
        };
        if moved {
            self.frontier.write_maps(&mut tx, stream, group, None, Some(&cursors)).await?;
        }
        let flags = ClaimFlags { found: true, slow: false, rows: false };
        if keys.is_empty() && ranges.is_empty() {
            tx.commit().await.map_err(at_commit)?;
            return Ok(Claimed { rows: Vec::new(), base, flags, parked });
        }
        let out = self.read_claimed(&mut tx, stream, keys, ranges, expires).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(Claimed { rows: out, base, flags, parked })
    }

    /// Locks the group row (PostgreSQL: `FOR UPDATE`; SQLite holds the
    /// database) and reads its frontiers, cursors and `max_attempts`; None
    /// when the group is gone.
    async fn lock_for_claim(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
    ) -> TxResult<Option<(BTreeMap<u32, u64>, BTreeMap<u32, u64>, i64)>> {
        let pg = self.d == Dialect::Postgres;
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        s.push(&format!(
            "SELECT {}, {}, max_attempts FROM {} WHERE stream = {st} AND name = {gr}{}",
            self.d.json_out("frontiers"),
            self.d.json_out("cursors"),
            self.names.groups(),
            if pg { " FOR UPDATE" } else { "" }
        ));
        let rows = tx.all(&s).await.map_err(safe)?;
        let Some(row) = rows.first() else { return Ok(None) };
        let frontiers = parse_map(stream, group, "frontiers", &row.text(0)?)?;
        let cursors = parse_map(stream, group, "cursors", &row.text(1)?)?;
        Ok(Some((frontiers, cursors, row.i64(2)?)))
    }

    /// The candidates of a claim in `scope`: claimable delivery rows above
    /// each frontier (with whether each is spent), and the free positions
    /// in a bounded window after each cursor, offered with how far the
    /// cursor goes when all of them are taken.
    #[allow(clippy::too_many_arguments)]
    async fn claim_candidates(
        &self,
        tx: &mut Tx,
        (stream, group): (&str, &str),
        scope: &[u32],
        limit: usize,
        spent_max: usize,
        (frontiers, cursors, max_attempts): (&BTreeMap<u32, u64>, &BTreeMap<u32, u64>, i64),
        seen: &Survey,
    ) -> TxResult<(Vec<Candidate>, Offered, Parks)> {
        let pg = self.d == Dialect::Postgres;
        let hws = &seen.hws;
        let mut parks: Parks = BTreeMap::new();
        let mut park_left = crate::groups::scheduled_budget(limit);
        let id = if pg { "d.ctid::text" } else { "CAST(d.rowid AS TEXT)" };
        let mut cands: Vec<Candidate> = Vec::new();
        let mut offered: Offered = BTreeMap::new();
        for (i, &p) in scope.iter().enumerate() {
            let (f, c) = fc(frontiers, cursors, p);
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let part = s.int(i64::from(p));
            let fl = s.int(seq_arg(f));
            let ma = s.int(max_attempts);
            let per = s.int(i64::try_from(spent_max).unwrap_or(i64::MAX));
            let claimable = self.claimable(&mut s);
            s.push(&format!(
                "SELECT {id}, d.sequence, \
                 CASE WHEN d.status = 'leased' AND d.lease_id IS NOT NULL AND d.attempt >= {ma} THEN 1 ELSE 0 END \
                 FROM {} d WHERE d.stream = {st} AND d.group_name = {gr} AND d.partition = {part} \
                 AND d.sequence > {fl} AND {claimable} ORDER BY d.sequence LIMIT {per}{}",
                self.names.deliveries(),
                if pg { " FOR UPDATE OF d SKIP LOCKED" } else { "" }
            ));
            if seen.rows {
                for r in tx.all(&s).await.map_err(safe)? {
                    cands.push((p, r.u64(1)?, Some(r.text(0)?), r.i64(2)? == 1));
                }
            }
            let hw = hws.get(&p).copied().unwrap_or(0);
            if c > hw {
                continue;
            }
            // Rows in a bounded window after the cursor: the free
            // positions there are offered (at most `limit`).
            let mut window_end = hw.min(c.saturating_add(limit as u64 + FRESH_WINDOW_ROWS));
            // Events scheduled after now are not offered: they are parked
            // as the cursor passes them, at most this partition's share of
            // the budget (`park_share`);
            // past it the window ends before the next one.
            let mut later = Vec::new();
            if seen.sched {
                let share = crate::groups::park_share(park_left, scope.len() - i);
                later = self.scheduled_ahead(tx, stream, p, (c, window_end), Now::At(seen.now), share + 1).await?;
                if later.len() > share {
                    window_end = later[share].saturating_sub(1);
                    later.truncate(share);
                }
                park_left = park_left.saturating_sub(later.len());
            }
            let taken = if seen.ahead {
                self.rows_between(tx, stream, group, p, c, window_end).await?
            } else {
                BTreeSet::new()
            };
            let mut free = Vec::new();
            let mut q = c;
            while q <= window_end && free.len() < limit {
                if !taken.contains(&q) && later.binary_search(&q).is_err() {
                    free.push(q);
                }
                q += 1;
            }
            later.retain(|q| !taken.contains(q));
            if !later.is_empty() {
                parks.insert(p, later);
            }
            // With nothing free, the cursor still passes the rows it met.
            offered.insert(p, (free, q));
        }
        for (&p, (free, _)) in &offered {
            cands.extend(free.iter().map(|&q| (p, q, None, false)));
        }
        cands.sort_by_key(|c| (c.0, c.1));
        Ok((cands, offered, parks))
    }

    /// Claims the delivery rows the walk picked (and dead-letters the spent
    /// ones) in one `UPDATE`; returns their keys for `read_claimed`: (kind,
    /// partition, sequence, lease id, attempt, expiry, event id).
    async fn claim_rows(
        &self,
        tx: &mut Tx,
        picks: Vec<Value>,
        consumer: &str,
        lease_for: Duration,
    ) -> TxResult<Vec<Value>> {
        let pg = self.d == Dialect::Postgres;
        let mut keys: Vec<Value> = Vec::new();
        if picks.is_empty() {
            return Ok(keys);
        }
        let mut s = self.stmt();
        let arr = s.text(Value::from(picks).to_string());
        let set = self.claim_set(&mut s, "(x.c2 = '1')", "x.c1", consumer, lease_for);
        let by_id = if pg { "d.ctid = (x.c0)::tid" } else { "d.rowid = CAST(x.c0 AS INTEGER)" };
        s.push(&format!(
            "UPDATE {dl} AS d SET {set} FROM {rows} AS x WHERE {by_id} \
             RETURNING CASE WHEN status = 'rejected' THEN 1 ELSE 0 END, partition, sequence, lease_id, \
             attempt, {exp}, event_id",
            dl = self.names.deliveries(),
            rows = self.d.json_rows(&arr, 3),
            exp = self.d.ts_out("expires_at"),
        ));
        for r in &tx.all(&s).await.map_err(safe)? {
            keys.push(self.claimed_key(r)?);
        }
        Ok(keys)
    }

    /// A claimed delivery row as `UPDATE … RETURNING` gave it (spent as 1,
    /// partition, sequence, lease id, attempt, expiry, event id), as JSON
    /// for reading its event in the claim's column layout.
    pub(super) fn claimed_key(&self, r: &Row) -> Result<Value> {
        let exp = match self.d {
            Dialect::Postgres => r.opt_i64(5)?.map_or(Value::Null, Value::from),
            Dialect::Sqlite => r.opt_text(5)?.map_or(Value::Null, Value::from),
        };
        Ok(Value::from(vec![
            Value::from(r.i64(0)?),
            Value::from(r.u32(1)?),
            Value::from(r.u64(2)?),
            r.opt_text(3)?.map_or(Value::Null, Value::from),
            Value::from(r.i64(4)?),
            exp,
            Value::from(r.text(6)?),
        ]))
    }

    /// Inserts one claim row per span of the fresh positions taken; returns
    /// the runs taken, (partition, first, last), for `read_claimed`.
    async fn insert_fresh_claims(
        &self,
        tx: &mut Tx,
        (stream, group): (&str, &str),
        fresh: &BTreeMap<u32, Vec<u64>>,
        base: i64,
        consumer: &str,
        (now_ts, expires): (Timestamp, Timestamp),
    ) -> TxResult<Vec<Value>> {
        let mut ranges: Vec<Value> = Vec::new();
        let mut claims: Vec<Value> = Vec::new();
        for (&p, qs) in fresh {
            for (first, last, words) in spans(qs) {
                let mut row =
                    vec![Value::from(p), Value::from(first), Value::from(last), Value::from(partition_base(base, p))];
                row.extend(words.iter().map(|&w| Value::from(w)));
                claims.push(Value::from(row));
            }
            for run in runs(qs) {
                ranges.push(Value::from(vec![Value::from(p), Value::from(run.0), Value::from(run.1)]));
            }
        }
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let arr = s.text(Value::from(claims).to_string());
        let cons = s.text(consumer);
        let at = s.ts(now_ts);
        let exp = s.ts(expires);
        let xs: Vec<String> = (0..WORDS).map(|i| self.d.as_int(&format!("x.c{}", i + 4))).collect();
        s.push(&format!(
            "INSERT INTO {} (stream, group_name, partition, first_seq, last_seq, base, consumer_id, leased_at, \
             expires_at, {}) SELECT {st}, {gr}, {}, {}, {}, {}, {cons}, {at}, {exp}, {} FROM {} AS x",
            self.names.claims(),
            word_cols(""),
            self.d.as_int("x.c0"),
            self.d.as_int("x.c1"),
            self.d.as_int("x.c2"),
            self.d.as_int("x.c3"),
            xs.join(", "),
            self.d.json_rows(&arr, 4 + WORDS),
        ));
        tx.exec(&s).await.map_err(safe)?;
        Ok(ranges)
    }

    /// The events of a claim, in one read, in the claim's column layout:
    /// rows' by event id, fresh positions' by runs of sequences.
    async fn read_claimed(
        &self,
        tx: &mut Tx,
        stream: &str,
        keys: Vec<Value>,
        ranges: Vec<Value>,
        expires: Timestamp,
    ) -> TxResult<Vec<Row>> {
        let mut s = self.stmt();
        let st = s.text(stream);
        let mut parts = Vec::new();
        if !keys.is_empty() {
            let arr = s.text(Value::from(keys).to_string());
            parts.push(format!(
                "SELECT {}, {}, {}, x.c3, {}, {}, {cols} FROM {rows} AS x LEFT JOIN {ev} e ON e.id = x.c6",
                self.d.as_int("x.c0"),
                self.d.as_int("x.c1"),
                self.d.as_int("x.c2"),
                self.d.as_int("x.c4"),
                match self.d {
                    Dialect::Postgres => self.d.as_int("x.c5"),
                    Dialect::Sqlite => "x.c5".to_owned(),
                },
                cols = event_cols(self.d, "e"),
                rows = self.d.json_rows(&arr, 7),
                ev = self.names.events(),
            ));
        }
        if !ranges.is_empty() {
            let arr = s.text(Value::from(ranges).to_string());
            let exp = s.arg(self.d.ts_arg(expires));
            parts.push(format!(
                "SELECT 2, e.partition, e.sequence, NULL, 1, {exp}, {cols} FROM {rows} AS x {join} {ev} e \
                 ON e.stream = {st} AND e.partition = {p} AND e.sequence BETWEEN {a} AND {b}",
                join = self.d.ordered_join(),
                cols = event_cols(self.d, "e"),
                rows = self.d.json_rows(&arr, 3),
                ev = self.names.events(),
                p = self.d.as_int("x.c0"),
                a = self.d.as_int("x.c1"),
                b = self.d.as_int("x.c2"),
            ));
        }
        s.push(&parts.join(" UNION ALL "));
        tx.all(&s).await.map_err(safe)
    }

    /// One read of what a transactional claim meets in `scope`: the high
    /// watermarks, claims that expired or reach a cursor, claimable
    /// delivery rows, and delivery rows at or after a cursor.
    #[allow(clippy::too_many_arguments)]
    async fn claim_survey(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
        scope: &[u32],
        frontiers: &BTreeMap<u32, u64>,
        cursors: &BTreeMap<u32, u64>,
        now: Timestamp,
    ) -> TxResult<Survey> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let rows: Vec<Value> = scope
            .iter()
            .map(|&p| {
                let (f, c) = fc(frontiers, cursors, p);
                Value::from(vec![Value::from(p), Value::from(seq_arg(f)), Value::from(seq_arg(c))])
            })
            .collect();
        let arr = s.text(Value::from(rows).to_string());
        let at = s.ts(now);
        let (p, c) = (self.d.as_int("x.c0"), self.d.as_int("x.c2"));
        let hws = match self.d {
            Dialect::Postgres => "jsonb_object_agg(q.partition, q.next_sequence)::text",
            Dialect::Sqlite => "json_group_object(q.partition, q.next_sequence)",
        };
        s.push(&format!(
            "SELECT (SELECT {hws} FROM {seqs} q WHERE q.stream = {st}), \
             CASE WHEN EXISTS (SELECT 1 FROM {xs} AS x {join} {claims} k ON k.stream = {st} AND k.group_name = {gr} \
               AND k.partition = {p} WHERE (k.expires_at <= {at} AND NOT ({full})) OR k.last_seq >= {c}) THEN 1 ELSE 0 END, \
             CASE WHEN {any_claimable} THEN 1 ELSE 0 END, \
             CASE WHEN EXISTS (SELECT 1 FROM {xs} AS x {join} {dl} d ON d.stream = {st} AND d.group_name = {gr} \
               AND d.partition = {p} WHERE d.sequence >= {c}) THEN 1 ELSE 0 END, \
             CASE WHEN EXISTS (SELECT 1 FROM {xs} AS x {join} {sched} sc ON sc.stream = {st} \
               AND sc.partition = {p} WHERE sc.sequence >= {c} AND sc.deliver_at > {at}) THEN 1 ELSE 0 END",
            sched = self.names.scheduled(),
            any_claimable = self.any_claimable(&st, &gr, &at),
            seqs = self.names.seqs(),
            claims = self.names.claims(),
            dl = self.names.deliveries(),
            xs = self.d.json_rows(&arr, 3),
            full = all_set("k"),
            join = self.d.ordered_join(),
        ));
        let rows = tx.all(&s).await.map_err(safe)?;
        let r = rows.first().ok_or_else(|| Error::failed("fetch", "the survey returned no row"))?;
        let hws = match r.opt_text(0)? {
            Some(t) => parse_map(stream, group, "high watermarks", &t)?.into_iter().collect(),
            None => HashMap::new(),
        };
        Ok(Survey {
            hws,
            claims: r.i64(1)? == 1,
            rows: r.i64(2)? == 1,
            ahead: r.i64(3)? == 1,
            sched: r.i64(4)? == 1,
            now,
        })
    }

    /// SQL true when the group has a claimable delivery row in any
    /// partition: a hint (a claim then looks per partition, above each
    /// frontier, which a claimable row is always above) shaped for the
    /// reference's claim index, `(stream, group_name, status, expires_at)`,
    /// so that rows waiting until later (scheduled events set aside, ADR
    /// 0036; retries) are never walked to find that none is claimable.
    fn any_claimable(&self, st: &str, gr: &str, at: &str) -> String {
        let dl = self.names.deliveries();
        format!(
            "(EXISTS (SELECT 1 FROM {dl} d WHERE d.stream = {st} AND d.group_name = {gr} AND d.status = 'available') \
             OR EXISTS (SELECT 1 FROM {dl} d WHERE d.stream = {st} AND d.group_name = {gr} AND d.status = 'leased' \
             AND d.expires_at IS NOT NULL AND d.expires_at <= {at}))"
        )
    }

    /// The sequences of a partition's delivery rows in `from..=to`.
    async fn rows_between(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
        p: u32,
        from: u64,
        to: u64,
    ) -> TxResult<BTreeSet<u64>> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let part = s.int(i64::from(p));
        let lo = s.int(seq_arg(from));
        let hi = s.int(seq_arg(to));
        s.push(&format!(
            "SELECT d.sequence FROM {} d WHERE d.stream = {st} AND d.group_name = {gr} AND d.partition = {part} \
             AND d.sequence >= {lo} AND d.sequence <= {hi}",
            self.names.deliveries(),
        ));
        Ok(tx.all(&s).await.map_err(safe)?.iter().map(|r| r.u64(0)).collect::<Result<_>>()?)
    }

    /// Reads the claims of a group that `sel` touches (locking them on
    /// PostgreSQL).
    async fn claims_for(&self, tx: &mut Tx, stream: &str, group: &str, sel: &Split<'_>) -> TxResult<Vec<Claim>> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let cond = match sel {
            Split::Expired(parts, now) => {
                let arr = s.text(Value::from(parts.to_vec()).to_string());
                let at = s.ts(*now);
                format!(
                    "k.partition IN (SELECT {} FROM {} AS x) AND k.expires_at <= {at} AND NOT ({})",
                    self.d.as_int("x.c0"),
                    self.json_scalars(&arr),
                    all_set("k")
                )
            }
            Split::After(after) => {
                let rows: Vec<Value> = after.iter().map(|&(p, a)| Value::from(vec![p as u64, a])).collect();
                let arr = s.text(Value::from(rows).to_string());
                format!(
                    "EXISTS (SELECT 1 FROM {} AS x WHERE {} = k.partition AND k.last_seq > {})",
                    self.d.json_rows(&arr, 2),
                    self.d.as_int("x.c0"),
                    self.d.as_int("x.c1")
                )
            }
            Split::Positions(ps) => {
                let rows: Vec<Value> = ps.iter().map(|&(p, q)| Value::from(vec![u64::from(p), q])).collect();
                let arr = s.text(Value::from(rows).to_string());
                format!(
                    "EXISTS (SELECT 1 FROM {} AS x WHERE {} = k.partition AND {q} BETWEEN k.first_seq AND k.last_seq)",
                    self.d.json_rows(&arr, 2),
                    self.d.as_int("x.c0"),
                    q = self.d.as_int("x.c1")
                )
            }
        };
        s.push(&format!(
            "SELECT k.partition, k.first_seq, k.last_seq, k.base, k.consumer_id, {}, {}, {} FROM {} k \
             WHERE k.stream = {st} AND k.group_name = {gr} AND {cond} ORDER BY k.partition, k.first_seq{}",
            self.d.ts_out("k.leased_at"),
            self.d.ts_out("k.expires_at"),
            word_cols("k"),
            self.names.claims(),
            if self.d == Dialect::Postgres { " FOR UPDATE" } else { "" }
        ));
        tx.all(&s).await.map_err(safe)?.iter().map(|r| Ok(read_claim(r)?)).collect()
    }

    /// Hands the open positions `sel` names over to delivery rows (status
    /// `leased`, attempt 1, the claim's lease id, holder and expiry), so
    /// that the row path of `groups.rs` settles, renews, reopens or
    /// dead-letters them; claims left with nothing open are deleted.
    /// Returns the positions handed over.
    pub(super) async fn split_claims(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
        sel: &Split<'_>,
    ) -> TxResult<Vec<(u32, u64)>> {
        let claims = self.claims_for(tx, stream, group, sel).await?;
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Option<BTreeSet<(u32, u64)>> = match sel {
            Split::Positions(ps) => Some(ps.iter().copied().collect()),
            _ => None,
        };
        let after: BTreeMap<u32, u64> = match sel {
            Split::After(a) => a.iter().copied().collect(),
            _ => BTreeMap::new(),
        };
        let mut rows: Vec<Value> = Vec::new();
        let mut handed = Vec::new();
        let mut changed: Vec<Claim> = Vec::new();
        for mut c in claims {
            let before = (c.words, c.last);
            for q in c.first..=c.last {
                let take = match (&wanted, sel) {
                    (Some(w), _) => w.contains(&(c.partition, q)),
                    (None, Split::After(_)) => after.get(&c.partition).is_some_and(|&a| q > a),
                    _ => true,
                };
                if take && c.open(q) {
                    c.set(q);
                    handed.push((c.partition, q));
                    rows.push(Value::from(vec![
                        Value::from(c.partition),
                        Value::from(q),
                        Value::from(claim_lease(c.base, q).to_string()),
                        Value::from(c.consumer.as_str()),
                        self.ts_json(c.leased_at),
                        self.ts_json(c.expires_at),
                    ]));
                }
            }
            if let Some(&a) = after.get(&c.partition) {
                // Cut at `after`: nothing above it stays claimed.
                c.cut(a);
            }
            if (c.words, c.last) != before {
                changed.push(c);
            }
        }
        for chunk in rows.chunks(1000) {
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let arr = s.text(Value::from(chunk.to_vec()).to_string());
            let now = self.now();
            let at = self.now_sql(&mut s, now);
            let (ins, ignore) = match self.d {
                Dialect::Postgres => ("INSERT INTO", "ON CONFLICT DO NOTHING"),
                Dialect::Sqlite => ("INSERT OR IGNORE INTO", ""),
            };
            s.push(&format!(
                "{ins} {dl} (stream, group_name, event_id, partition, sequence, status, attempt, lease_id, \
                 consumer_id, leased_at, expires_at, created_at) \
                 SELECT {st}, {gr}, e.id, e.partition, e.sequence, 'leased', 1, x.c2, x.c3, {la}, {ea}, {at} \
                 FROM {rows} AS x {join} {ev} e ON e.stream = {st} AND e.partition = {p} AND e.sequence = {q} {ignore}",
                join = self.d.ordered_join(),
                dl = self.names.deliveries(),
                ev = self.names.events(),
                rows = self.d.json_rows(&arr, 6),
                p = self.d.as_int("x.c0"),
                q = self.d.as_int("x.c1"),
                la = self.ts_from_json("x.c4"),
                ea = self.ts_from_json("x.c5"),
            ));
            tx.exec(&s).await.map_err(safe)?;
        }
        self.write_claims(tx, stream, group, &changed).await?;
        Ok(handed)
    }

    /// Writes claims back: their words and end, or deletes those with nothing
    /// open.
    async fn write_claims(&self, tx: &mut Tx, stream: &str, group: &str, claims: &[Claim]) -> TxResult<()> {
        let (done, open): (Vec<&Claim>, Vec<&Claim>) = claims.iter().partition(|c| c.done());
        for chunk in done.chunks(1000) {
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let keys: Vec<Value> = chunk.iter().map(|c| Value::from(vec![u64::from(c.partition), c.first])).collect();
            let arr = s.text(Value::from(keys).to_string());
            s.push(&format!(
                "DELETE FROM {t} WHERE stream = {st} AND group_name = {gr} AND EXISTS (SELECT 1 FROM {rows} AS x \
                 WHERE {p} = {t}.partition AND {q} = {t}.first_seq)",
                t = self.names.claims(),
                rows = self.d.json_rows(&arr, 2),
                p = self.d.as_int("x.c0"),
                q = self.d.as_int("x.c1"),
            ));
            tx.exec(&s).await.map_err(safe)?;
        }
        for chunk in open.chunks(1000) {
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let keys: Vec<Value> = chunk.iter().map(|c| claim_key_words(c)).collect();
            let arr = s.text(Value::from(keys).to_string());
            let sets: Vec<String> =
                (0..WORDS).map(|i| format!("w{i} = {}", self.d.as_int(&format!("x.c{}", i + 3)))).collect();
            s.push(&format!(
                "UPDATE {t} SET last_seq = {l}, {sets} FROM {rows} AS x WHERE {t}.stream = {st} \
                 AND {t}.group_name = {gr} AND {t}.partition = {p} AND {t}.first_seq = {q}",
                t = self.names.claims(),
                rows = self.d.json_rows(&arr, 3 + WORDS),
                p = self.d.as_int("x.c0"),
                q = self.d.as_int("x.c1"),
                l = self.d.as_int("x.c2"),
                sets = sets.join(", "),
            ));
            tx.exec(&s).await.map_err(safe)?;
        }
        Ok(())
    }

    /// Deletes a group's claims in `parts` (a reset).
    pub(super) async fn delete_claims(
        &self,
        tx: &mut Tx,
        stream: &str,
        group: &str,
        parts: Option<&[u32]>,
    ) -> TxResult<()> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let cond = match parts {
            Some(ps) => {
                let arr = s.text(Value::from(ps.to_vec()).to_string());
                format!(" AND partition IN (SELECT {} FROM {} AS x)", self.d.as_int("x.c0"), self.json_scalars(&arr))
            }
            None => String::new(),
        };
        s.push(&format!("DELETE FROM {} WHERE stream = {st} AND group_name = {gr}{cond}", self.names.claims()));
        tx.exec(&s).await.map_err(safe)?;
        Ok(())
    }

    /// `(SELECT value AS c0 …)` rows of a JSON array of scalars.
    fn json_scalars(&self, arr: &str) -> String {
        match self.d {
            Dialect::Postgres => format!("(SELECT x.v AS c0 FROM jsonb_array_elements_text({arr}::jsonb) AS x(v))"),
            Dialect::Sqlite => format!("(SELECT x.value AS c0 FROM json_each({arr}) AS x)"),
        }
    }

    /// A timestamp as a JSON array element (milliseconds on PostgreSQL,
    /// the reference's text on SQLite), and back in SQL.
    fn ts_json(&self, t: Timestamp) -> Value {
        match self.d {
            Dialect::Postgres => Value::from(t.as_millis()),
            Dialect::Sqlite => Value::from(super::dialect::format_ts(t)),
        }
    }

    fn ts_from_json(&self, col: &str) -> String {
        match self.d {
            Dialect::Postgres => format!("('epoch'::timestamptz + ({col})::bigint * interval '1 millisecond')"),
            Dialect::Sqlite => col.to_owned(),
        }
    }

    // ---- settles of claimed leases ----

    /// Acks claimed leases: sets their characters, in one statement on
    /// PostgreSQL (claims locked, rewritten, never the group row), in the
    /// caller's transaction on SQLite. Returns the positions acked; the
    /// others are stale as far as their claims go (a split may have handed
    /// them to rows: the caller tries those as row leases).
    pub(super) async fn ack_claimed(
        &self,
        stream: &str,
        group: &str,
        leases: &[(u32, u64, i64)],
    ) -> Result<Vec<(u32, u64)>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        // One UPDATE on both dialects: it ORs each claim's mask into its
        // words (a row lock on PostgreSQL, re-read if another settle got
        // there first), and records which bits it set, read back below.
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        let arr = s.text(Value::from(ack_masks(leases)).to_string());
        let t = self.names.claims();
        let m = |i: usize| self.d.as_int(&format!("x.c{}", i + 3));
        let acked: Vec<String> = (0..WORDS).map(|i| format!("({} & ~{t}.w{i})", m(i))).collect();
        let ors: Vec<String> = (0..WORDS).map(|i| format!("w{i} = {t}.w{i} | {}", m(i))).collect();
        s.push(&format!(
            "UPDATE {t} SET acked = {acked}, {ors} FROM {rows} AS x WHERE {t}.stream = {st} AND {t}.group_name = {gr} \
             AND {t}.partition = {p} AND {t}.base = {b} AND {t}.first_seq BETWEEN {blk} * {n} + 1 AND {blk} * {n} + {n} \
             RETURNING partition, first_seq, acked",
            acked = acked.join(" || ':' || "),
            ors = ors.join(", "),
            rows = self.d.json_rows(&arr, 3 + WORDS),
            p = self.d.as_int("x.c0"),
            blk = self.d.as_int("x.c1"),
            b = self.d.as_int("x.c2"),
            n = CLAIM_MAX_POSITIONS,
        ));
        let rows = super::retry_tx!(self, "ack", self.hot.all(&s).await.map_err(at_commit))?;
        let mut out = Vec::new();
        for r in &rows {
            let (p, first) = (r.u32(0)?, r.u64(1)?);
            let text = r.text(2)?;
            let start = block_start(block_of(first));
            for (i, w) in text.split(':').enumerate() {
                let bits: i64 = w.parse().map_err(|_| {
                    Error::failed("ack", format!("claim {p}/{first} of {stream:?}/{group:?}: bad acked {text:?}"))
                })?;
                for bit in 0..WORD_BITS {
                    if bits & (1 << bit) != 0 {
                        out.push((p, start + i as u64 * WORD_BITS + bit));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Renews claimed leases: a claim whose every open position is renewed
    /// gets the new expiry; positions renewed without the rest of their
    /// claim are handed to rows with it. Returns each renewed position's
    /// new expiry.
    pub(super) async fn renew_claimed(
        &self,
        stream: &str,
        group: &str,
        leases: &[(u32, u64, i64)],
        d: Duration,
    ) -> Result<HashMap<(u32, u64), Timestamp>> {
        if leases.is_empty() {
            return Ok(HashMap::new());
        }
        super::retry_tx!(self, "renew", self.renew_claimed_tx(stream, group, leases, d).await)
    }

    async fn renew_claimed_tx(
        &self,
        stream: &str,
        group: &str,
        leases: &[(u32, u64, i64)],
        d: Duration,
    ) -> TxResult<HashMap<(u32, u64), Timestamp>> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let now = self.db_now(&mut tx).await?;
        let expires = now.saturating_add(d);
        let positions: Vec<(u32, u64)> = leases.iter().map(|&(p, q, _)| (p, q)).collect();
        let claims = self.claims_for(&mut tx, stream, group, &Split::Positions(&positions)).await?;
        // Per claim (index), the open positions renewed.
        let mut per: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
        for &(p, q, b) in leases {
            if let Some(i) = claims.iter().position(|c| c.partition == p && c.base == b && c.open(q)) {
                per.entry(i).or_default().insert(q);
            }
        }
        let mut out = HashMap::new();
        let mut whole: Vec<Value> = Vec::new();
        let mut part: Vec<(u32, u64)> = Vec::new();
        for (i, qs) in per {
            let Some(c) = claims.get(i) else { continue };
            for &q in &qs {
                out.insert((c.partition, q), expires);
            }
            if qs.len() as u64 == c.open_count() {
                whole.push(Value::from(vec![u64::from(c.partition), c.first]));
            } else {
                part.extend(qs.iter().map(|&q| (c.partition, q)));
            }
        }
        if !whole.is_empty() {
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let arr = s.text(Value::from(whole).to_string());
            let exp = s.ts(expires);
            s.push(&format!(
                "UPDATE {t} SET expires_at = {exp} WHERE stream = {st} AND group_name = {gr} AND EXISTS \
                 (SELECT 1 FROM {rows} AS x WHERE {p} = {t}.partition AND {q} = {t}.first_seq)",
                t = self.names.claims(),
                rows = self.d.json_rows(&arr, 2),
                p = self.d.as_int("x.c0"),
                q = self.d.as_int("x.c1"),
            ));
            tx.exec(&s).await.map_err(safe)?;
        }
        if !part.is_empty() {
            self.split_claims(&mut tx, stream, group, &Split::Positions(&part)).await?;
            let rows: Vec<Value> = part.iter().map(|&(p, q)| Value::from(vec![u64::from(p), q])).collect();
            let mut s = self.stmt();
            let (st, gr) = sg(&mut s, stream, group);
            let arr = s.text(Value::from(rows).to_string());
            let exp = s.ts(expires);
            let at = s.ts(now);
            s.push(&format!(
                "UPDATE {t} SET expires_at = {exp}, renewed_at = {at} WHERE stream = {st} AND group_name = {gr} \
                 AND status = 'leased' AND EXISTS (SELECT 1 FROM {rows} AS x WHERE {p} = {t}.partition \
                 AND {q} = {t}.sequence)",
                t = self.names.deliveries(),
                rows = self.d.json_rows(&arr, 2),
                p = self.d.as_int("x.c0"),
                q = self.d.as_int("x.c1"),
            ));
            tx.exec(&s).await.map_err(safe)?;
        }
        tx.commit().await.map_err(at_commit)?;
        Ok(out)
    }

    /// "Now" for a write: the database's clock where the backend uses it
    /// (read in the transaction), else the handle's.
    pub(super) async fn db_now(&self, tx: &mut Tx) -> TxResult<Timestamp> {
        match self.now() {
            Now::At(t) => Ok(t),
            Now::Db => {
                let mut s = self.stmt();
                s.push(&format!("SELECT {}", self.d.ts_out("now()")));
                let rows = tx.all(&s).await.map_err(safe)?;
                Ok(rows.first().ok_or_else(|| Error::failed("renew", "now() returned no row"))?.ts(0)?)
            }
        }
    }

    /// Hands the position of one claimed lease over to a delivery row
    /// (before a retry or reject of it), in a transaction of its own.
    /// Nothing happens when the claim no longer holds it.
    pub(super) async fn split_lease(&self, lease: &LeaseRef) -> Result<()> {
        if claim_base(lease.lease_id, lease.sequence).is_none() {
            return Ok(());
        }
        let pos = [(lease.partition, lease.sequence)];
        super::retry_tx!(self, "settle", {
            async {
                let mut tx = self.pool.begin().await.map_err(safe)?;
                self.split_claims(&mut tx, &lease.stream, &lease.group, &Split::Positions(&pos)).await?;
                tx.commit().await.map_err(at_commit)?;
                Ok::<_, TxError>(())
            }
            .await
        })
    }

    /// In-flight positions of a group's claims (`group_info`).
    pub(super) async fn claimed_inflight(&self, stream: &str, group: &str) -> Result<u64> {
        let mut s = self.stmt();
        let (st, gr) = sg(&mut s, stream, group);
        s.push(&format!(
            "SELECT {} FROM {} k WHERE k.stream = {st} AND k.group_name = {gr} AND NOT ({})",
            word_cols("k"),
            self.names.claims(),
            all_set("k")
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("group_info", Phase::Safe))?;
        let mut n = 0;
        for r in &rows {
            n += read_words(r, 0)?.iter().map(|w| u64::from(w.count_zeros())).sum::<u64>();
        }
        Ok(n)
    }
}

/// The runs of consecutive positions of `qs` (sorted): (first, last).
fn runs(qs: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &q in qs {
        match out.last_mut() {
            Some((_, last)) if *last + 1 == q => *last = q,
            _ => out.push((q, q)),
        }
    }
    out
}

/// The claims of a partition's fresh positions `qs` (sorted): one per
/// block of [`CLAIM_MAX_POSITIONS`] sequences, from the first position
/// taken in it to the last; the bits of the positions taken are clear,
/// every other bit (rows between them, the rest of the block) set.
/// Returns (first, last, words).
fn spans(qs: &[u64]) -> Vec<(u64, u64, [u32; WORDS])> {
    let mut out: Vec<(u64, u64, [u32; WORDS])> = Vec::new();
    for &q in qs {
        let (i, m) = bit_of(q);
        match out.last_mut() {
            Some((first, last, words)) if block_of(q) == block_of(*first) => {
                *last = q;
                if let Some(w) = words.get_mut(i) {
                    *w &= !m;
                }
            }
            _ => out.push((q, q, open_words(q, q))),
        }
    }
    out
}

/// The acks of claimed leases as `[partition, block, base, m0..m7]` rows:
/// one per (partition, block, base), its words the bits to set.
fn ack_masks(leases: &[(u32, u64, i64)]) -> Vec<Value> {
    let mut masks: BTreeMap<(u32, u64, i64), [u32; WORDS]> = BTreeMap::new();
    for &(p, q, b) in leases {
        let (i, m) = bit_of(q);
        if let Some(w) = masks.entry((p, block_of(q), b)).or_insert([0; WORDS]).get_mut(i) {
            *w |= m;
        }
    }
    masks
        .into_iter()
        .map(|((p, blk, b), ws)| {
            let mut row = vec![Value::from(p), Value::from(blk), Value::from(b)];
            row.extend(ws.iter().map(|&w| Value::from(w)));
            Value::from(row)
        })
        .collect()
}

/// `[partition, first, last, w0..w7]` of a claim (for an update).
fn claim_key_words(c: &Claim) -> Value {
    let mut row = vec![Value::from(c.partition), Value::from(c.first), Value::from(c.last)];
    row.extend(c.words.iter().map(|&w| Value::from(w)));
    Value::from(row)
}

/// Word `i` of a row's `w0..w7` starting at column `at + i`.
fn word_at(r: &Row, at: usize) -> Result<u32> {
    let v = r.i64(at)?;
    u32::try_from(v).map_err(|_| Error::failed("reading a claim", format!("a bitmap word holds {v}")))
}

/// The eight words of a row from column `at`.
fn read_words(r: &Row, at: usize) -> Result<[u32; WORDS]> {
    let mut w = [FULL; WORDS];
    for (i, slot) in w.iter_mut().enumerate() {
        *slot = word_at(r, at + i)?;
    }
    Ok(w)
}

fn read_claim(r: &Row) -> Result<Claim> {
    Ok(Claim {
        partition: r.u32(0)?,
        first: r.u64(1)?,
        last: r.u64(2)?,
        base: r.i64(3)?,
        consumer: r.text(4)?,
        leased_at: r.ts(5)?,
        expires_at: r.ts(6)?,
        words: read_words(r, 7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_lease_ids_name_their_claim_and_position_and_never_look_like_row_leases() {
        let base = new_claim_base();
        let id = claim_lease(base, 42);
        assert_eq!(claim_base(id, 42), Some(base));
        assert_eq!(claim_base(id, 43), None, "another position");
        for _ in 0..1000 {
            let row = LeaseId::from_u128(crate::ids::new_lease_id());
            assert_eq!(claim_base(row, split_u128(row.as_u128()).1), None, "row leases are version 4");
        }
        let other = new_claim_base();
        assert_ne!(base, other, "each fetch has its own base");
        assert_eq!(id.to_string().as_bytes()[14], b'8', "UUID version 8: {id}");
    }

    #[test]
    fn spans_mark_rows_between_and_split_at_block_edges() {
        let m = CLAIM_MAX_POSITIONS;
        let got = spans(&[1, 2, 3, 5, 6]);
        assert_eq!(got.len(), 1);
        let (first, last, w) = got[0];
        assert_eq!((first, last), (1, 6));
        assert_eq!(w[0], !0b11_0111, "positions 1-3, 5 and 6 open; 4 (a row) and the rest set");
        assert!(w[1..].iter().all(|&x| x == FULL));
        let got = spans(&[m - 1, m, m + 1, m + 2]);
        assert_eq!(got.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(), vec![(m - 1, m), (m + 1, m + 2)]);
        assert_eq!(got[0].2[WORDS - 1], !(0b11 << 30), "the block's last two positions");
        assert_eq!(got[1].2[0], !0b11, "the next block's first two");
        assert!(spans(&[]).is_empty());
    }

    #[test]
    fn a_claims_bitmap_opens_its_range_and_finds_its_first_open_position() {
        let mut c = Claim {
            partition: 0,
            first: 300,
            last: 340,
            base: 0,
            consumer: String::new(),
            leased_at: Timestamp::from_millis(0),
            expires_at: Timestamp::from_millis(0),
            words: open_words(300, 340),
        };
        assert_eq!(c.open_count(), 41);
        assert!(c.open(300) && c.open(340) && !c.open(299) && !c.open(341));
        assert_eq!(first_open(c.first, &c.words), Some(300));
        c.set(300);
        c.set(301);
        assert_eq!(first_open(c.first, &c.words), Some(302));
        c.cut(320);
        assert_eq!((c.last, c.open_count()), (320, 19));
        for q in 302..=320 {
            c.set(q);
        }
        assert!(c.done() && first_open(c.first, &c.words).is_none());
    }
}
