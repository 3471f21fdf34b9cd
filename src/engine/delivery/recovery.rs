//! Reopening a stream's delivery table: the newest checkpoint, then the
//! WAL generations it does not cover replayed in LSN order, a torn tail
//! dropped as the recovery mode allows, covered files removed, and group
//! state above the log's end clamped (a log tail lost to a machine crash).

use super::*;

/// The generations found in a table's directory, ascending.
struct Generations {
    wals: Vec<u64>,
    ckpts: Vec<u64>,
}

/// What the checkpoint and the WAL replay rebuilt.
struct Replayed {
    groups: BTreeMap<String, GroupState>,
    /// The generation of the checkpoint loaded (0: none).
    ckpt_gen: u64,
    /// The last LSN applied.
    last_lsn: u64,
}

impl DeliveryTable {
    /// Opens (recovering) or creates the delivery table of a stream.
    pub(crate) fn open(vfs: Arc<dyn Vfs>, opts: &EngineOptions, log: &StreamLog) -> Result<(Self, DeliveryRecovery)> {
        let dir = format!("{}/groups", log.dir());
        let v = &*vfs;
        ensure_dir(v, &dir, log.dir())?;
        let found = list_generations(v, &dir)?;
        let mut report = DeliveryRecovery { checkpoint: None, replayed: 0, torn_bytes: 0, clamped: 0 };
        let mut state = load_checkpoint(v, &dir, &found, &mut report)?;
        let replay = generations_to_replay(v, &dir, opts, &found, state.ckpt_gen)?;
        let current = replay_wals(v, &dir, opts, &replay, &mut state, &mut report)?;
        let wal = match current {
            Some(w) => w,
            // Never reuse the name of a generation that holds records.
            None => WalFile::create(v, &dir, state.ckpt_gen.max(replay.last().map_or(0, |g| g + 1)).max(1))?,
        };
        remove_covered(v, &dir, &found, state.ckpt_gen)?;
        let journaled = clamp_to_log(state.groups, log, &mut report);
        let table = Table {
            groups: journaled,
            wal,
            next_lsn: state.last_lsn + 1,
            last_checkpoint: Instant::now(),
            buf: Vec::new(),
        };
        let table = DeliveryTable {
            vfs,
            dir,
            inner: Mutex::new(table),
            checkpointing: Mutex::new(()),
            last_checkpoint_bytes: Default::default(),
        };
        if report.clamped > 0 {
            // The clamp changed state that the checkpoint and WAL on disk
            // still hold: make it durable before new appends reuse those
            // sequences, or the next reopen would replay the old state over
            // them.
            table.checkpoint(&Poison::default())?;
        }
        Ok((table, report))
    }
}

/// Creates the table's directory when missing (a stream created before
/// consumer groups existed on native, or a new one) and makes its name
/// durable.
fn ensure_dir(v: &dyn Vfs, dir: &str, stream_dir: &str) -> Result<()> {
    if !v.exists(dir).map_err(|e| io_err(v, dir, "stat", e))? {
        v.create_dir_all(dir).map_err(|e| io_err(v, dir, "create", e))?;
        v.sync_dir(stream_dir).map_err(|e| sync_err(v, stream_dir, e))?;
    }
    Ok(())
}

/// The WAL and checkpoint generations in `dir` (a leftover `.tmp` file is
/// removed). A generation at or above `MAX_COUNTER` is damage.
fn list_generations(v: &dyn Vfs, dir: &str) -> Result<Generations> {
    let names = v.list(dir).map_err(|e| io_err(v, dir, "list", e))?;
    let mut found = Generations { wals: Vec::new(), ckpts: Vec::new() };
    for name in &names {
        let wal = generation_of(name, "wal-", ".log");
        let ckpt = generation_of(name, "checkpoint-", ".ckpt");
        if let Some(g) = wal.or(ckpt).filter(|&g| g >= MAX_COUNTER) {
            let path = format!("{dir}/{name}");
            return Err(corrupt(v, &path, 0, format!("generation {g} is out of range (at most {MAX_COUNTER})")));
        }
        if let Some(g) = wal {
            found.wals.push(g);
        } else if let Some(g) = ckpt {
            found.ckpts.push(g);
        } else if name.ends_with(".tmp") {
            let path = format!("{dir}/{name}");
            v.remove_file(&path).map_err(|e| io_err(v, &path, "remove", e))?;
        }
    }
    found.wals.sort_unstable();
    found.ckpts.sort_unstable();
    Ok(found)
}

/// The groups of the newest checkpoint (none when there is no checkpoint),
/// every snapshot checked.
fn load_checkpoint(v: &dyn Vfs, dir: &str, found: &Generations, report: &mut DeliveryRecovery) -> Result<Replayed> {
    let mut groups: BTreeMap<String, GroupState> = BTreeMap::new();
    let Some(&g) = found.ckpts.last() else {
        return Ok(Replayed { groups, ckpt_gen: 0, last_lsn: 0 });
    };
    let path = format!("{dir}/{}", ckpt_name(g));
    let bytes = read_all(v, &path)?;
    if let Some(found) = checkpoint::other_version(&bytes) {
        let supported = checkpoint::CKPT_VERSION;
        return Err(Error::UnsupportedVersion { file: v.describe(&path), found, supported });
    }
    let c = checkpoint::decode(&bytes).map_err(|reason| corrupt(v, &path, 0, reason))?;
    if c.generation != g {
        return Err(corrupt(v, &path, 0, format!("header says generation {}", c.generation)));
    }
    if c.lsn >= MAX_COUNTER {
        return Err(corrupt(v, &path, 0, format!("LSN {} is out of range (at most {MAX_COUNTER})", c.lsn)));
    }
    for snap in &c.groups {
        GroupState::check_snapshot(snap).map_err(|reason| corrupt(v, &path, 0, reason))?;
        if groups.insert(snap.summary.name.clone(), GroupState::restore(snap)).is_some() {
            return Err(corrupt(v, &path, 0, format!("group {:?} appears twice", snap.summary.name)));
        }
    }
    report.checkpoint = Some((g, c.lsn));
    Ok(Replayed { groups, ckpt_gen: g, last_lsn: c.lsn })
}

/// The WAL generations the checkpoint does not cover. A crash while a
/// checkpoint created the next generation can leave it with a short or
/// torn header and nothing else: that file holds no record, and goes
/// (unless recovery is strict).
fn generations_to_replay(
    v: &dyn Vfs,
    dir: &str,
    opts: &EngineOptions,
    found: &Generations,
    ckpt_gen: u64,
) -> Result<Vec<u64>> {
    let mut replay: Vec<u64> = found.wals.iter().copied().filter(|&g| g >= ckpt_gen).collect();
    if let Some(&g) = replay.last() {
        let path = format!("{dir}/{}", wal_name(g));
        let bytes = read_all(v, &path)?;
        match wal::check_header(&bytes) {
            Err(reason)
                if bytes.len() <= WAL_HEADER_LEN + WAL_FRAME_LEN && !matches!(reason, DecodeError::Version { .. }) =>
            {
                if opts.recovery == RecoveryMode::Strict && !opts.live_tail {
                    return Err(corrupt(v, &path, 0, reason));
                }
                tracing::warn!(file = %v.describe(&path).display(), %reason, "removing a WAL file cut short while being created");
                v.remove_file(&path).map_err(|e| io_err(v, &path, "remove", e))?;
                v.sync_dir(dir).map_err(|e| sync_err(v, dir, e))?;
                replay.pop();
            }
            _ => {}
        }
    }
    Ok(replay)
}

/// Replays the records of `replay` above the checkpoint's LSN into
/// `state`, in LSN order; a damaged tail is dropped when the recovery mode
/// allows it. Returns the newest generation, opened for appends.
fn replay_wals(
    v: &dyn Vfs,
    dir: &str,
    opts: &EngineOptions,
    replay: &[u64],
    state: &mut Replayed,
    report: &mut DeliveryRecovery,
) -> Result<Option<WalFile>> {
    let ckpt_lsn = state.last_lsn;
    let groups = &mut state.groups;
    let mut current: Option<WalFile> = None;
    for (i, &g) in replay.iter().enumerate() {
        let last = i + 1 == replay.len();
        let path = format!("{dir}/{}", wal_name(g));
        let bytes = read_all(v, &path)?;
        match wal::check_header(&bytes) {
            Ok(h) if h == g => {}
            Ok(h) => return Err(corrupt(v, &path, 0, format!("header says generation {h}"))),
            Err(reason) => return Err(corrupt(v, &path, 0, reason)),
        }
        let (records, valid, end) = wal::decode_records(&bytes);
        for r in records {
            if r.lsn <= ckpt_lsn {
                // Already in the checkpoint.
                continue;
            }
            if r.lsn >= MAX_COUNTER {
                let reason = format!("LSN {} is out of range (at most {MAX_COUNTER})", r.lsn);
                return Err(corrupt(v, &path, r.offset, reason));
            }
            if r.lsn != state.last_lsn + 1 {
                let reason = format!("LSN {} where {} was expected", r.lsn, state.last_lsn + 1);
                return Err(corrupt(v, &path, r.offset, reason));
            }
            state.last_lsn = r.lsn;
            report.replayed += 1;
            match r.body {
                Body::Create(snap) => {
                    if snap.summary.name != r.group {
                        let reason = format!("record of group {:?} creates {:?}", r.group, snap.summary.name);
                        return Err(corrupt(v, &path, r.offset, reason));
                    }
                    if groups.contains_key(&r.group) {
                        return Err(corrupt(v, &path, r.offset, format!("group {:?} created twice", r.group)));
                    }
                    GroupState::check_snapshot(&snap).map_err(|reason| corrupt(v, &path, r.offset, reason))?;
                    groups.insert(r.group, GroupState::restore(&snap));
                }
                Body::Ops(ops) => {
                    let Some(g) = groups.get_mut(&r.group) else {
                        let reason = format!("transitions of unknown group {:?}", r.group);
                        return Err(corrupt(v, &path, r.offset, reason));
                    };
                    for op in &ops {
                        g.apply(op);
                    }
                }
            }
        }
        let damage = match end {
            End::Clean => None,
            End::Damaged(reason) => Some((reason, false)),
            End::Undecodable(reason) => Some((reason, true)),
        };
        if let Some((reason, whole)) = damage {
            let at = valid as u64;
            let followed = !whole && wal::valid_record_after(&bytes, valid, state.last_lsn);
            let tolerated = match opts.recovery {
                // (A view: the last WAL's tail may be a live writer's.)
                RecoveryMode::Strict if opts.live_tail => last && !followed && !whole,
                RecoveryMode::Strict => false,
                // A record written whole that this build can't read is
                // not a torn write: keep it unless told to drop it.
                RecoveryMode::TolerateTornTail => last && !followed && !whole,
                RecoveryMode::TruncateAtFirstDamage => last,
            };
            if !tolerated {
                let what = if whole {
                    "a record with a valid checksum that this build can't decode"
                } else if followed {
                    "damage followed by valid records"
                } else {
                    "damaged record"
                };
                return Err(corrupt(v, &path, at, format!("{what}: {reason}")));
            }
            let dropped = bytes[valid..].iter().rposition(|&b| b != 0).map_or(0, |end| end + 1) as u64;
            tracing::warn!(file = %v.describe(&path).display(), offset = at, bytes = dropped, %reason, "dropping a torn delivery WAL tail");
            report.torn_bytes += dropped;
            let file = v.open(&path, false).map_err(|e| io_err(v, &path, "open", e))?;
            file.set_len(at).map_err(|e| io_err(v, &path, "truncate", e))?;
            file.sync_data().map_err(|e| sync_err(v, &path, e))?;
        }
        if last {
            let file = StickySync::wrap(v.open(&path, false).map_err(|e| io_err(v, &path, "open", e))?);
            let prealloc_end = file.len().map_err(|e| io_err(v, &path, "stat", e))?;
            let version = wal::version_of(&bytes).unwrap_or(wal::WAL_VERSION);
            current = Some(WalFile { file, path, generation: g, version, len: valid as u64, prealloc_end });
        }
    }
    Ok(current)
}

/// Removes the WAL generations and checkpoints older than the checkpoint
/// loaded (it covers them).
fn remove_covered(v: &dyn Vfs, dir: &str, found: &Generations, ckpt_gen: u64) -> Result<()> {
    for &g in found.wals.iter().filter(|&&g| g < ckpt_gen) {
        let path = format!("{dir}/{}", wal_name(g));
        v.remove_file(&path).map_err(|e| io_err(v, &path, "remove", e))?;
    }
    for &g in found.ckpts.iter().filter(|&&g| g < ckpt_gen) {
        let path = format!("{dir}/{}", ckpt_name(g));
        v.remove_file(&path).map_err(|e| io_err(v, &path, "remove", e))?;
    }
    Ok(())
}

/// Drops every group's state above the log's end (a log tail lost to a
/// machine crash) and starts journaling.
fn clamp_to_log(
    groups: BTreeMap<String, GroupState>,
    log: &StreamLog,
    report: &mut DeliveryRecovery,
) -> BTreeMap<String, GroupState> {
    let mut journaled = BTreeMap::new();
    for (name, mut g) in groups {
        let clamped = g.clamp(|p| log.high_watermark(p));
        if clamped > 0 {
            tracing::warn!(stream = %log.name, group = %name, partitions = clamped, "group state above the log's end dropped (a log tail lost to a machine crash)");
        }
        // Retention deletes segments only once the groups behind the new
        // log start were moved past it by a WAL record; under `Batched` or
        // `None` durability that record may be lost: move them again.
        let mut moved = 0;
        for p in 0..log.partition_count() {
            if g.frontier(p).is_some_and(|f| f.saturating_add(1) < log.log_start(p)) {
                g.drop_before(p, log.log_start(p));
                moved += 1;
            }
        }
        if moved > 0 {
            tracing::info!(stream = %log.name, group = %name, partitions = moved, "group moved to the log start (its retention record was not durable)");
        }
        report.clamped += clamped + moved;
        journaled.insert(name, g.journaled());
    }
    journaled
}
