//! The write-ahead delivery table: a stream's consumer-group state, made
//! durable by a WAL of state transitions and periodic checkpoints.
//!
//! Files, in `streams/<id>/groups/`: `wal-<generation>.log` (the WAL,
//! [`wal`]) and `checkpoint-<generation>.ckpt` ([`checkpoint`]). The group
//! rules are the shared core (`crate::groups::GroupState`, the memory
//! backend's too); this module logs the transitions each call makes and
//! replays them on open. ADR 0004 records the decisions:
//!
//! - **Durability.** A record is written to the OS under the table's lock, in
//!   the order its transitions were applied. Under `Durability::Sync`,
//!   group creation, ack, retry, reject (and dead-lettering), replay and
//!   reset return only once their record is synced, through the same group
//!   commit as appends; claims and renewals are written but ride on the next
//!   sync. Losing one to a machine crash means a redelivery, and the attempt
//!   counter may hand out a number again (the lost claim's attempt was never
//!   on disk either, so `max_attempts` still bounds deliveries on disk).
//!   Under `Batched` every record is synced within `max_delay`; under `None`
//!   the OS decides. A process crash loses nothing in any mode.
//! - **Checkpoints** write every group's state once the WAL passes
//!   `checkpoint_bytes` and twice the last checkpoint's size, or
//!   `checkpoint_interval` has passed: sync the WAL,
//!   start the next WAL generation, write the checkpoint to a temporary file,
//!   sync it, rename it, sync the directory, then delete older files.
//! - **Reopen** loads the newest checkpoint and replays the WAL records
//!   after its LSN. State above a partition's high watermark (a log tail
//!   lost to a machine crash under `Batched`/`None`) is dropped.
//! - **Failures.** The WAL is zero-filled ahead of writes (under `Sync`);
//!   running out of space while doing so fails the call before it changes
//!   anything. A write or sync failing after the state changed poisons the
//!   data directory, as a failed append does.

pub mod checkpoint;
mod recovery;
pub mod wal;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::commit::{Committer, Job, Poison, Ticket};
use super::error::{DecodeError, corrupt, io_err, sync_err};
use super::index::StreamIndex;
use super::log::stream::StreamLog;
use super::options::{Durability, EngineOptions, RecoveryMode};
use super::vfs::{StickySync, Vfs, VfsFile};
use crate::error::{Error, ObjectKind, Result};
use crate::groups::journal::Transition;
use crate::groups::{EventSource, GroupState};
use crate::model::event::Event;
use crate::model::group::{GroupOptions, GroupSummary};
use crate::model::query::Query;
use crate::model::time::Timestamp;
use wal::{Body, End, WAL_FRAME_LEN, WAL_HEADER_LEN};

/// Room a group creation reserves beyond its snapshot's bound.
const CREATE_ROOM: u64 = 1 << 10;
/// The WAL is zero-filled ahead of its end in steps of at most this much
/// (beyond the room a call needs).
const MAX_RESERVE_STEP: u64 = 4 << 20;

/// Upper bounds of the WAL record one group call makes, for the space
/// `with_group` reserves before the call (generous MessagePack sizes: a
/// record's fixed part and group name, then per transition).
pub(crate) mod room {
    use crate::model::limits::MAX_NAME_BYTES;

    /// LSN, kind, name length, the name, the list and its framing.
    const BASE: u64 = 8 + 1 + 2 + MAX_NAME_BYTES as u64 + 64;
    /// One transition of fixed-size fields (`Renew`, `Reschedule`, `Ack`
    /// of one sequence, `Cursor`, `ReopenAfter`, `Reset`...).
    const OP: u64 = 64;
    /// One sequence in a list (`Ack`, `ReopenOne`, `Pass`).
    const SEQ: u64 = 9;
    /// One (sequence, lease id) of a claim.
    const LEASE: u64 = 32;

    /// A call that logs nothing (reads: lag, info, dead letters).
    pub(crate) const NONE: u64 = 0;

    /// One settle: renew, ack, retry (perhaps a dead letter with its
    /// reason, `max_attempts: ` before it), reject, skip (`skipped: `).
    pub(crate) const fn settle(reason_bytes: usize) -> u64 {
        BASE + OP + 16 + reason_bytes as u64
    }

    /// `n` renewals (`renew_many`): one `Renew` each.
    pub(crate) const fn renews(n: usize) -> u64 {
        BASE + OP * n as u64
    }

    /// `n` acknowledgements (`ack_many`): at worst one `Ack` each.
    pub(crate) const fn acks(n: usize) -> u64 {
        BASE + (OP + SEQ) * n as u64
    }

    /// A fetch of `limit` over `partitions` by a consumer id of
    /// `consumer_bytes`: per partition a claim (with the consumer id), a
    /// pass, a park and a cursor; per claimed position a lease; per damaged
    /// one a pass; per scheduled one set aside a sequence and its time; the
    /// spent deliveries it dead-letters.
    pub(crate) const fn fetch(
        limit: usize,
        partitions: u32,
        consumer_bytes: usize,
        damaged: usize,
        parked: usize,
        spent: usize,
    ) -> u64 {
        BASE + partitions as u64 * (4 * OP + consumer_bytes as u64)
            + limit as u64 * LEASE
            + damaged as u64 * SEQ
            + parked as u64 * (2 * SEQ + 2)
            + spent as u64 * (OP + 32)
    }

    /// A replay or reset over `partitions` (one transition each), reopening
    /// `seqs` chosen sequences (a replay by query).
    pub(crate) const fn reopen(partitions: u32, seqs: usize) -> u64 {
        BASE + partitions as u64 * OP + seqs as u64 * SEQ
    }
}

/// The shared pieces of the engine a table writes through.
pub(crate) struct EngineParts<'a> {
    pub(crate) opts: &'a EngineOptions,
    pub(crate) committer: &'a Committer,
    pub(crate) poison: &'a Poison,
}

/// A stream's consumer groups and their WAL.
#[derive(Debug)]
pub(crate) struct DeliveryTable {
    vfs: Arc<dyn Vfs>,
    dir: String,
    inner: Mutex<Table>,
    /// Held for a whole checkpoint (taken before `inner`, or tried while
    /// holding it): one checkpoint at a time, whose file is written after
    /// `inner` is released.
    checkpointing: Mutex<()>,
    /// The size of the last checkpoint this table wrote (0 before one):
    /// the WAL grows to twice that before the next (see `maybe_checkpoint`).
    last_checkpoint_bytes: std::sync::atomic::AtomicU64,
}

/// A checkpoint whose state is taken and whose WAL generation is switched,
/// left to write (without the table's lock).
struct PendingCheckpoint {
    next: u64,
    old_generation: u64,
    lsn: u64,
    snaps: Vec<crate::groups::journal::GroupSnapshot>,
}

#[derive(Debug)]
struct Table {
    groups: BTreeMap<String, GroupState>,
    wal: WalFile,
    /// The LSN the next record gets.
    next_lsn: u64,
    last_checkpoint: Instant,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct WalFile {
    file: Arc<dyn VfsFile>,
    path: String,
    generation: u64,
    /// The version in its header: an older one takes no new record (they
    /// go to a new generation of the current version, see `WalFile::reserve`).
    version: u16,
    /// Where the next record goes.
    len: u64,
    /// Zero-filled up to here.
    prealloc_end: u64,
}

fn wal_name(generation: u64) -> String {
    format!("wal-{generation:020}.log")
}

fn ckpt_name(generation: u64) -> String {
    format!("checkpoint-{generation:020}.ckpt")
}

/// The generation in a file name with this prefix and suffix.
fn generation_of(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?.strip_suffix(suffix).filter(|g| g.len() == 20)?.parse().ok()
}

/// Generations and LSNs stay below this (2^62): a file that says otherwise
/// is damaged or crafted, and the next one's number must not overflow. A
/// table writing a million records a second takes 146,000 years to get
/// there.
const MAX_COUNTER: u64 = 1 << 62;

/// Records that must be durable before the call returns (under `Sync`).
fn needs_sync(ops: &[Transition]) -> bool {
    // A lost claim, cursor move, pass or park changes nothing a caller was
    // told is done (the position is claimable again, or fresh again, and
    // the next fetch that meets a scheduled event early sets it aside again).
    ops.iter().any(|op| {
        !matches!(
            op,
            Transition::Claim { .. }
                | Transition::Cursor { .. }
                | Transition::Renew { .. }
                | Transition::Pass { .. }
                | Transition::Park { .. }
        )
    })
}

impl WalFile {
    /// Creates (or empties) generation `generation` and makes it durable.
    fn create(vfs: &dyn Vfs, dir: &str, generation: u64) -> Result<WalFile> {
        let path = format!("{dir}/{}", wal_name(generation));
        let file = StickySync::wrap(vfs.open(&path, true).map_err(|e| io_err(vfs, &path, "create", e))?);
        file.set_len(0).map_err(|e| io_err(vfs, &path, "truncate", e))?;
        file.write_all_at(&wal::header(generation), 0).map_err(|e| io_err(vfs, &path, "write", e))?;
        file.sync_data().map_err(|e| sync_err(vfs, &path, e))?;
        vfs.sync_dir(dir).map_err(|e| sync_err(vfs, dir, e))?;
        let len = WAL_HEADER_LEN as u64;
        Ok(WalFile { file, path, generation, version: wal::WAL_VERSION, len, prealloc_end: len })
    }

    /// Makes sure `room` more bytes can be written without growing the
    /// file: zero-fills ahead of the end (`room` and `step` more, `step`
    /// being `preallocate_bytes` up to 4 MiB), under every durability and
    /// even with preallocation off (then `room` alone), so that a full
    /// disk fails the call here,
    /// before it changes any state, rather than in the record's write
    /// after it (which would poison). Before the first record written into
    /// a file of an older format version, the records go on in a new
    /// generation of the current version instead (the old one is synced
    /// first, as a checkpoint does).
    fn reserve(&mut self, vfs: &dyn Vfs, dir: &str, step: u64, room: u64) -> Result<()> {
        if room == 0 {
            // A read (lag, info, dead letters): it writes nothing.
            return Ok(());
        }
        if room > u64::from(wal::WAL_MAX_BODY) {
            return Err(Error::invalid(
                "delivery change",
                format!("a change of up to {room} bytes is above the largest WAL record ({} bytes)", wal::WAL_MAX_BODY),
            ));
        }
        if self.version != wal::WAL_VERSION {
            self.file.sync_data().map_err(|e| sync_err(vfs, &self.path, e))?;
            match WalFile::create(vfs, dir, self.generation + 1) {
                Ok(next) => *self = next,
                Err(e @ Error::Poisoned { .. }) => return Err(e),
                Err(e) => {
                    // Nothing changed: what was created of the new
                    // generation goes (a strict open would refuse it).
                    let path = format!("{dir}/{}", wal_name(self.generation + 1));
                    if vfs.exists(&path).unwrap_or(false) && vfs.remove_file(&path).is_err() {
                        tracing::warn!(file = %vfs.describe(&path).display(), "could not remove a WAL generation whose creation failed");
                    }
                    return Err(e);
                }
            }
        }
        let need = self.len + room + WAL_FRAME_LEN as u64;
        if need <= self.prealloc_end {
            return Ok(());
        }
        let target = need.max(self.prealloc_end) + step.min(MAX_RESERVE_STEP).max(room);
        let from = self.prealloc_end.max(self.len);
        let zeros = vec![0u8; usize::try_from(target - from).unwrap_or(0)];
        if let Err(e) = self.file.write_all_at(&zeros, from) {
            // Nothing changed yet: zeros past the end are not records.
            return Err(crate::engine::error::io_err(vfs, &self.path, "reserve space in", e));
        }
        self.prealloc_end = target;
        Ok(())
    }
}

/// A native stream's log and indexes as the group core's event source.
#[derive(Clone, Copy)]
pub(crate) struct LogSource<'a> {
    /// The stream's log.
    pub(crate) log: &'a StreamLog,
    /// Its secondary indexes (the planner reads through them).
    pub(crate) index: &'a StreamIndex,
}

impl EventSource for LogSource<'_> {
    fn stream(&self) -> &str {
        &self.log.name
    }
    fn partition_count(&self) -> u32 {
        self.log.partition_count()
    }
    fn high_watermark(&self, p: u32) -> u64 {
        self.log.high_watermark(p)
    }
    fn event(&self, p: u32, seq: u64) -> Result<Event> {
        self.read_each(p, &[seq])?.pop().ok_or_else(|| self.missing(p, seq))?
    }
    fn read_each(&self, p: u32, seqs: &[u64]) -> Result<Vec<Result<Event>>> {
        let records = self.log.partition(p)?.read_each(seqs)?;
        Ok(records.into_iter().map(|r| r.map(|r| r.into_event(&self.log.name, p))).collect())
    }
    fn first_at_or_after(&self, p: u32, t: Timestamp) -> Result<Option<u64>> {
        self.log.seek_time(p, t.as_millis())
    }
    fn matching(&self, p: u32, q: &Query, f: &mut dyn FnMut(u64)) -> Result<()> {
        crate::engine::index::planner::matching(self.log, self.index, p, q, f)
    }
    fn position_of(&self, id: &str) -> Result<Option<(u32, u64)>> {
        crate::engine::index::planner::position_of(self.log, self.index, id)
    }
    fn log_start(&self, p: u32) -> u64 {
        self.log.log_start(p)
    }
}

impl LogSource<'_> {
    fn missing(&self, p: u32, seq: u64) -> Error {
        Error::failed("read", format!("stream {:?} partition {p} has no sequence {seq}", self.log.name))
    }
}

/// What reopening found, for the engine's recovery report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecovery {
    /// The checkpoint loaded, if any: (generation, LSN).
    pub checkpoint: Option<(u64, u64)>,
    /// WAL records replayed.
    pub replayed: u64,
    /// Bytes of a torn WAL tail dropped.
    pub torn_bytes: u64,
    /// Group partitions whose state above the log's end was dropped.
    pub clamped: usize,
}

impl DeliveryTable {
    /// The lowest `frontier + 1` of partition `p` over the groups consuming
    /// it (what the `interest` retention policy keeps); None when none does.
    pub(crate) fn interest_start(&self, p: u32) -> Option<u64> {
        crate::groups::retention::interest_start(self.inner.lock().groups.values(), p)
    }

    /// Summaries of every group, by name.
    pub(crate) fn list(&self) -> Vec<GroupSummary> {
        self.inner.lock().groups.values().map(|g| g.summary.clone()).collect()
    }

    /// Creates a group; durable once the ticket resolves.
    pub(crate) fn create(
        &self,
        ctx: &EngineParts<'_>,
        src: LogSource<'_>,
        group: &str,
        opts: &GroupOptions,
        now: Timestamp,
    ) -> Result<(GroupSummary, Ticket)> {
        let mut t = self.inner.lock();
        ctx.poison.check(&src.log.name)?;
        if t.groups.contains_key(group) {
            return Err(Error::AlreadyExists { kind: ObjectKind::Group, name: format!("{}/{group}", src.log.name) });
        }
        if group.is_empty() || group.len() > crate::model::limits::MAX_NAME_BYTES {
            return Err(Error::invalid(
                "group",
                format!(
                    "a group name must be 1 to {} bytes, got {}",
                    crate::model::limits::MAX_NAME_BYTES,
                    group.len()
                ),
            ));
        }
        let g = GroupState::create(&src, group, opts, now)?;
        let snap = g.snapshot();
        // A new group's snapshot: a fixed part per partition.
        let room = CREATE_ROOM + 64 * snap.parts.len() as u64;
        t.wal.reserve(&*self.vfs, &self.dir, ctx.opts.preallocate_bytes, room).map_err(|e| ctx.poison.absorb(e))?;
        let summary = g.summary.clone();
        let ticket = self.write(&mut t, ctx, group, &Body::Create(snap), room, true)?;
        t.groups.insert(group.to_owned(), g.journaled());
        self.maybe_checkpoint(t, ctx);
        Ok((summary, ticket))
    }

    /// Learns the keys of every keyed group's materialized deliveries from
    /// the log (see `GroupState::learn_keys`): once, at open, before the
    /// groups serve anything.
    pub(crate) fn learn_keys(&self, src: LogSource<'_>) -> Result<()> {
        let mut t = self.inner.lock();
        for g in t.groups.values_mut() {
            g.learn_keys(&src)?;
        }
        Ok(())
    }

    /// Runs `f` on a group's state and logs the transitions it made. The
    /// ticket resolves once they are as durable as the settings promise.
    ///
    /// `room` bounds the size of the WAL record `f` can make (see
    /// [`Room`]): that much space is reserved before `f` runs, so that a
    /// full disk fails the call before anything changes. `f` does every
    /// read that can fail before its first change: when it fails it has
    /// changed nothing, and nothing is logged.
    pub(crate) fn with_group<T>(
        &self,
        ctx: &EngineParts<'_>,
        src: LogSource<'_>,
        group: &str,
        room: u64,
        f: impl FnOnce(&mut GroupState, &dyn EventSource) -> Result<T>,
    ) -> Result<(T, Ticket)> {
        let mut t = self.inner.lock();
        ctx.poison.check(&src.log.name)?;
        if !t.groups.contains_key(group) {
            return Err(Error::group_not_found(&src.log.name, group));
        }
        t.wal.reserve(&*self.vfs, &self.dir, ctx.opts.preallocate_bytes, room).map_err(|e| ctx.poison.absorb(e))?;
        let Some(g) = t.groups.get_mut(group) else { return Err(Error::group_not_found(&src.log.name, group)) };
        let out = f(g, &src);
        let ops = g.take_ops();
        debug_assert!(out.is_ok() || ops.is_empty(), "a failed group call changed state: {ops:?}");
        let ticket = if ops.is_empty() {
            Ticket::ready()
        } else {
            let sync = needs_sync(&ops);
            let ticket = self.write(&mut t, ctx, group, &Body::Ops(ops), room, sync)?;
            self.maybe_checkpoint(t, ctx);
            ticket
        };
        Ok((out?, ticket))
    }

    /// Writes one record at the WAL's end. A failure here comes after the
    /// state changed in memory, so it poisons. The record fits the `room`
    /// reserved for it (a bound each caller computes; see [`Room`]).
    fn write(
        &self,
        t: &mut Table,
        ctx: &EngineParts<'_>,
        group: &str,
        body: &Body,
        room: u64,
        sync: bool,
    ) -> Result<Ticket> {
        let lsn = t.next_lsn;
        let mut buf = std::mem::take(&mut t.buf);
        buf.clear();
        let encoded = wal::encode(&mut buf, lsn, group, body).map_err(|reason| Error::failed("delivery WAL", reason));
        debug_assert!(
            encoded.is_err() || buf.len() as u64 <= room + WAL_FRAME_LEN as u64,
            "a WAL record of {} bytes for a call that reserved {room}: {body:?}",
            buf.len()
        );
        let written = encoded.and_then(|()| {
            t.wal.file.write_all_at(&buf, t.wal.len).map_err(|e| io_err(&*self.vfs, &t.wal.path, "write", e))
        });
        if let Err(e) = written {
            let reason = format!("delivery state of group {group:?} changed but its WAL record failed: {e}");
            ctx.poison.set(reason.clone());
            t.buf = buf;
            return Err(Error::Poisoned {
                scope: self.vfs.describe(&t.wal.path).display().to_string(),
                reason,
                source: None,
            });
        }
        t.wal.len += buf.len() as u64;
        t.wal.prealloc_end = t.wal.prealloc_end.max(t.wal.len);
        t.next_lsn += 1;
        t.buf = buf;
        let job = || Job { files: smallvec::smallvec![t.wal.file.clone()], ..Job::default() };
        Ok(match ctx.opts.durability {
            Durability::Sync if sync => ctx.committer.submit(job()),
            Durability::Sync | Durability::None => Ticket::ready(),
            Durability::Batched { .. } => {
                let _ = ctx.committer.submit(job());
                Ticket::ready()
            }
        })
    }

    /// Checkpoints when the WAL's size or age says so: the state is taken
    /// and the WAL switched under the table's lock (`t`, released here),
    /// the file written after it, so other calls on the stream's groups
    /// wait only for the snapshot, not for the writes and syncs.
    fn maybe_checkpoint(&self, mut t: parking_lot::MutexGuard<'_, Table>, ctx: &EngineParts<'_>) {
        let size = t.wal.len.saturating_sub(WAL_HEADER_LEN as u64);
        // A large, quiet state (say 1M deliveries waiting for their time)
        // is not rewritten every `checkpoint_bytes` of WAL: the WAL grows
        // to twice the last checkpoint first, as Redis rewrites its AOF
        // once it has doubled. A checkpoint then costs at most half the
        // bytes of the WAL it replaces; a reopen replays at most the larger
        // of `checkpoint_bytes` and twice the last checkpoint (more after
        // failed checkpoints, whose generations stay).
        let last = self.last_checkpoint_bytes.load(std::sync::atomic::Ordering::Relaxed);
        let due = size >= ctx.opts.checkpoint_bytes.max(last.saturating_mul(2))
            || (size > 0 && t.last_checkpoint.elapsed() >= ctx.opts.checkpoint_interval);
        if !due {
            return;
        }
        // Another checkpoint is being written: this one comes later.
        let Some(_one) = self.checkpointing.try_lock() else { return };
        let pending = self.checkpoint_begin(&mut t, ctx.poison);
        drop(t);
        if let Err(e) = pending.and_then(|p| self.checkpoint_finish(p, ctx.poison)) {
            tracing::warn!(dir = %self.vfs.describe(&self.dir).display(), error = %e, "checkpoint failed; the WAL keeps growing until one succeeds");
        }
    }

    /// Writes a checkpoint now and drops the WAL it covers.
    pub(crate) fn checkpoint(&self, poisoned: &Poison) -> Result<()> {
        let _one = self.checkpointing.lock();
        let pending = {
            let mut t = self.inner.lock();
            poisoned.check(&self.dir)?;
            self.checkpoint_begin(&mut t, poisoned)?
        };
        self.checkpoint_finish(pending, poisoned)
    }

    /// Steps 1 and 2 and the snapshot, under the table's lock.
    fn checkpoint_begin(&self, t: &mut Table, poisoned: &Poison) -> Result<PendingCheckpoint> {
        let v = &*self.vfs;
        let poison = |e: Error| poisoned.absorb(e);
        // 1. Everything so far durable, so no later generation follows a torn tail.
        t.wal.file.sync_data().map_err(|e| poison(sync_err(v, &t.wal.path, e)))?;
        // 2. The next generation takes new records from now on, whether or
        // not the checkpoint below succeeds: the old one is complete and
        // synced, so only the newest generation can ever have a torn tail.
        let next = t.wal.generation + 1;
        let new_wal = WalFile::create(v, &self.dir, next).map_err(poison)?;
        let old = std::mem::replace(&mut t.wal, new_wal);
        t.last_checkpoint = Instant::now();
        // 3a. The state as of the last record of the old generation.
        let snaps: Vec<_> = t.groups.values().map(GroupState::snapshot).collect();
        Ok(PendingCheckpoint { next, old_generation: old.generation, lsn: t.next_lsn - 1, snaps })
    }

    /// Steps 3b and 4, without the table's lock (new records go to the new
    /// generation meanwhile; a crash or failure here leaves the older
    /// checkpoint and every WAL generation since, all replayed on reopen).
    fn checkpoint_finish(&self, p: PendingCheckpoint, poisoned: &Poison) -> Result<()> {
        let v = &*self.vfs;
        let dir = &self.dir;
        let poison = |e: Error| poisoned.absorb(e);
        // 3b. The checkpoint, atomically.
        let bytes = checkpoint::encode(p.next, p.lsn, &p.snaps).map_err(|r| Error::failed("checkpoint", r))?;
        drop(p.snaps);
        let tmp = format!("{dir}/{}.tmp", ckpt_name(p.next));
        let path = format!("{dir}/{}", ckpt_name(p.next));
        let f = v.open(&tmp, true).map_err(|e| io_err(v, &tmp, "create", e))?;
        f.set_len(0).map_err(|e| io_err(v, &tmp, "truncate", e))?;
        if let Err(e) = f.write_all_at(&bytes, 0) {
            let _ = v.remove_file(&tmp);
            return Err(io_err(v, &tmp, "write", e));
        }
        f.sync_data().map_err(|e| poison(sync_err(v, &tmp, e)))?;
        v.rename(&tmp, &path).map_err(|e| io_err(v, &path, "rename", e))?;
        v.sync_dir(dir).map_err(|e| poison(sync_err(v, dir, e)))?;
        self.last_checkpoint_bytes.store(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        // 4. Drop what the checkpoint covers.
        for name in v.list(dir).map_err(|e| io_err(v, dir, "list", e))? {
            let stale = generation_of(&name, "wal-", ".log").is_some_and(|g| g <= p.old_generation)
                || generation_of(&name, "checkpoint-", ".ckpt").is_some_and(|g| g < p.next);
            if stale {
                let path = format!("{dir}/{name}");
                v.remove_file(&path).map_err(|e| io_err(v, &path, "remove", e))?;
            }
        }
        v.sync_dir(dir).map_err(|e| poison(sync_err(v, dir, e)))?;
        Ok(())
    }
}

/// Reads a whole file.
fn read_all(vfs: &dyn Vfs, path: &str) -> Result<Vec<u8>> {
    let f = vfs.open(path, false).map_err(|e| io_err(vfs, path, "open", e))?;
    let len = f.len().map_err(|e| io_err(vfs, path, "stat", e))?;
    let len = usize::try_from(len).map_err(|_| corrupt(vfs, path, 0, format!("{len} bytes is too large")))?;
    let mut buf = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let n = f.read_at(&mut buf[at..], at as u64).map_err(|e| io_err(vfs, path, "read", e))?;
        if n == 0 {
            break;
        }
        at += n;
    }
    buf.truncate(at);
    Ok(buf)
}

#[cfg(test)]
mod tests;
