//! Opening a partition: every segment's header checked, sealed segments'
//! footers and indexes, and the active segment's tail recovered (a torn
//! tail cut, a multi-partition batch above the committed transaction
//! dropped).

use super::retention;
use super::writer::create_segment;
use super::*;

impl Partition {
    /// Opens (recovering) or creates the partition at `at`. Multi-partition
    /// batches above `committed_txn` are dropped from the tail.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        opts: &EngineOptions,
        at: Location,
        now_ms: i64,
        committed_txn: u64,
        truncations: &mut Vec<(String, Truncation)>,
    ) -> Result<Partition> {
        let Location { dir, stream_id, partition } = at;
        vfs.create_dir_all(&dir).map_err(|e| io_err(&*vfs, &dir, "create", e))?;
        let names = vfs.list(&dir).map_err(|e| io_err(&*vfs, &dir, "list", e))?;
        let mut bases: Vec<u64> = names
            .iter()
            .filter_map(|n| n.strip_suffix(".log").filter(|b| b.len() == 20).and_then(|b| b.parse().ok()))
            .collect();
        bases.sort_unstable();
        retention::remove_orphan_indexes(&*vfs, &dir, &names, &bases);
        // An index file's temporary copy left by a crash mid-write (derived
        // data: the builder writes it again if needed).
        for n in names.iter().filter(|n| n.ends_with(".tmp") && n.contains(".six.")) {
            let path = format!("{dir}/{n}");
            if let Err(e) = vfs.remove_file(&path) {
                tracing::warn!(file = %vfs.describe(&path).display(), error = %e, "could not remove a leftover index file");
            }
        }
        let mut segments = BTreeMap::new();
        let mut expected_base = None;
        // A segment followed by another was sealed: its footer was synced
        // before the next segment was created. Damage to its header or
        // footer (bit rot: they hold nothing its records do not) need not
        // make the partition unreadable: outside strict recovery it is read
        // by what its name and its successor say (each record is still
        // checked when read).
        let tolerant = opts.recovery != RecoveryMode::Strict;
        for (i, &base) in bases.iter().enumerate() {
            let last = i + 1 == bases.len();
            let successor = bases.get(i + 1).copied().filter(|&next| next > base && tolerant);
            let seg = match open_segment(&*vfs, &dir, base, stream_id, partition, successor.is_some()) {
                Ok(seg) => seg,
                Err(e) if last && torn_creation(&*vfs, &dir, base)? => {
                    // A crash while creating the segment: its name reached the
                    // disk but not its header, and no record was ever in it.
                    tracing::warn!(dir = %vfs.describe(&dir).display(), base, error = %e, "removing a segment whose creation was cut short");
                    for ext in ["log", "idx"] {
                        let path = format!("{dir}/{base:020}.{ext}");
                        if vfs.exists(&path).map_err(|e| io_err(&*vfs, &path, "stat", e))? {
                            vfs.remove_file(&path).map_err(|e| io_err(&*vfs, &path, "remove", e))?;
                        }
                    }
                    vfs.sync_dir(&dir).map_err(|e| sync_err(&*vfs, &dir, e))?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(exp) = expected_base
                && base != exp
            {
                return Err(corrupt(
                    &*vfs,
                    &seg.log_path,
                    0,
                    format!("segment starts at sequence {base}, expected {exp}"),
                ));
            }
            match read_footer(&*vfs, &seg)? {
                Some(f) => {
                    if opts.recovery == RecoveryMode::Strict {
                        check_sealed(&*vfs, &seg, &f)?;
                    }
                    expected_base = Some(f.last_seq.saturating_add(1));
                    *seg.footer.write() = Some(f);
                    segments.insert(base, Arc::new(seg));
                }
                None if last => {
                    segments.insert(base, Arc::new(seg));
                }
                None => {
                    let Some(next) = successor else {
                        let why = if tolerant {
                            "a segment before the last one is not sealed"
                        } else {
                            "the footer of a sealed segment is damaged (strict recovery refuses it)"
                        };
                        let len = seg.log.len().map_err(|e| io_err(&*vfs, &seg.log_path, "stat", e))?;
                        return Err(corrupt(&*vfs, &seg.log_path, len.saturating_sub(FOOTER_LEN as u64), why));
                    };
                    let f = inferred_footer(&*vfs, &seg, next)?;
                    tracing::warn!(
                        file = %vfs.describe(&seg.log_path).display(),
                        last_seq = f.last_seq,
                        records_end = f.records_end,
                        "a sealed segment's footer is damaged; its bounds are taken from the next segment and the file's length (each record is still checked when read; `rheo verify` lists it)"
                    );
                    expected_base = Some(next);
                    *seg.footer.write() = Some(f);
                    segments.insert(base, Arc::new(seg));
                }
            }
        }
        let p = |w| Partition {
            partition,
            stream_id,
            dir: dir.clone(),
            vfs: vfs.clone(),
            opts: opts.clone(),
            writer: Mutex::new(w),
            segments: RwLock::new(BTreeMap::new()),
            visible: AtomicU64::new(0),
            start: AtomicU64::new(1),
        };
        let last = segments.values().next_back().cloned();
        let writer = match last {
            Some(seg) if seg.footer().is_none() => {
                let (w, t) = recover_active(&*vfs, opts, seg, committed_txn)?;
                if let Some(t) = t {
                    truncations.push((w.active.log_path.clone(), t));
                }
                w
            }
            Some(seg) => {
                let next = seg.footer().map_or(1, |f| f.last_seq.saturating_add(1));
                create_segment(&*vfs, &dir, stream_id, partition, next, now_ms)?
            }
            None => create_segment(&*vfs, &dir, stream_id, partition, 1, now_ms)?,
        };
        let visible = writer.next_seq - 1;
        segments.insert(writer.active.base_seq, writer.active.clone());
        let part = p(writer);
        part.start.store(segments.keys().next().copied().unwrap_or(1), Ordering::SeqCst);
        *part.segments.write() = segments;
        part.visible.store(visible, Ordering::SeqCst);
        Ok(part)
    }
}

/// Opens a segment file and checks its header against its name.
/// `sealed_by_successor`: a later segment exists (and recovery is not
/// strict), so a damaged header is reported and the file read by its name;
/// a header of another format version, or of another partition, is still
/// refused.
pub(super) fn open_segment(
    vfs: &dyn Vfs,
    dir: &str,
    base: u64,
    stream_id: u64,
    partition: u32,
    sealed_by_successor: bool,
) -> Result<Segment> {
    let log_path = format!("{dir}/{}", log_name(base));
    let idx_path = format!("{dir}/{base:020}.idx");
    if base == 0 || base == u64::MAX {
        return Err(corrupt(vfs, &log_path, 0, format!("segment base sequence {base} is impossible")));
    }
    let log = StickySync::wrap(vfs.open(&log_path, false).map_err(|e| io_err(vfs, &log_path, "open", e))?);
    let mut hdr = [0u8; HEADER_LEN];
    let n = log.read_at(&mut hdr, 0).map_err(|e| io_err(vfs, &log_path, "read", e))?;
    let h = match SegmentHeader::decode(&hdr[..n]) {
        Ok(h) => h,
        Err(e @ DecodeError::Version { .. }) => return Err(corrupt(vfs, &log_path, 0, e)),
        Err(reason) if sealed_by_successor => {
            tracing::warn!(
                file = %vfs.describe(&log_path).display(),
                %reason,
                "a sealed segment's header is damaged; it is read by its name (each record is still checked when read; `rheo verify` lists it)"
            );
            SegmentHeader { partition, stream_id, base_seq: base, created_ms: 0 }
        }
        Err(reason) => return Err(corrupt(vfs, &log_path, 0, reason)),
    };
    if h.base_seq != base || h.partition != partition || h.stream_id != stream_id {
        return Err(corrupt(
            vfs,
            &log_path,
            0,
            format!(
                "header names stream {} partition {} base {}, the file name says stream {stream_id} partition {partition} base {base}",
                h.stream_id, h.partition, h.base_seq
            ),
        ));
    }
    Ok(Segment {
        base_seq: base,
        opened_ms: crate::model::time::Timestamp::now().as_millis(),
        log_path,
        idx_path,
        log,
        index: RwLock::new(None),
        footer: RwLock::new(None),
    })
}

/// True when a segment file with a bad header holds nothing but zeros after
/// it (or is shorter than a header): its creation was interrupted.
pub(super) fn torn_creation(vfs: &dyn Vfs, dir: &str, base: u64) -> Result<bool> {
    let path = format!("{dir}/{}", log_name(base));
    let log = vfs.open(&path, false).map_err(|e| io_err(vfs, &path, "open", e))?;
    let len = log.len().map_err(|e| io_err(vfs, &path, "stat", e))?;
    if len <= HEADER_LEN as u64 {
        return Ok(true);
    }
    let data_end = zero_run_start(&*log, HEADER_LEN as u64, len).map_err(|e| io_err(vfs, &path, "read", e))?;
    Ok(data_end == HEADER_LEN as u64)
}

/// The footer at the end of a segment, when it is sealed.
pub(super) fn read_footer(vfs: &dyn Vfs, seg: &Segment) -> Result<Option<Footer>> {
    let len = seg.log.len().map_err(|e| io_err(vfs, &seg.log_path, "stat", e))?;
    if len < (HEADER_LEN + FOOTER_LEN) as u64 {
        return Ok(None);
    }
    let mut b = [0u8; FOOTER_LEN];
    let n = seg.log.read_at(&mut b, len - FOOTER_LEN as u64).map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
    Ok(Footer::decode(&b[..n])
        .ok()
        .filter(|f| f.records_end.checked_add(FOOTER_LEN as u64) == Some(len) && f.first_seq == seg.base_seq))
}

/// The bounds of a sealed segment whose footer is damaged, from what
/// surrounds it: its records run from its base to the sequence before the
/// next segment's base, and end where the footer starts (`FOOTER_LEN`
/// before the end of the file, when the footer's magic is there; else at
/// the end of the file, where a read stops at what is not a record). Its
/// largest timestamp is unknown: `i64::MAX`, so that no time bound skips it.
pub(super) fn inferred_footer(vfs: &dyn Vfs, seg: &Segment, next_base: u64) -> Result<Footer> {
    let len = seg.log.len().map_err(|e| io_err(vfs, &seg.log_path, "stat", e))?;
    let mut magic = [0u8; 8];
    let footer_at = len.checked_sub(FOOTER_LEN as u64).filter(|&at| at >= HEADER_LEN as u64);
    let records_end = match footer_at {
        Some(at) => {
            let n = seg.log.read_at(&mut magic, at).map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
            if n == magic.len() && magic == FOOTER_MAGIC { at } else { len }
        }
        None => len.max(HEADER_LEN as u64),
    };
    let last_seq = next_base - 1;
    Ok(Footer { records_end, first_seq: seg.base_seq, last_seq, count: last_seq - seg.base_seq + 1, max_ts: i64::MAX })
}

/// Checks every record of a sealed segment (`RecoveryMode::Strict` at
/// open): each one's checksum, sequences from the base one by one up to
/// the footer's last, the records ending exactly where the footer starts.
/// The first problem is `Error::Corrupt` with its offset.
pub(super) fn check_sealed(vfs: &dyn Vfs, seg: &Segment, footer: &Footer) -> Result<()> {
    let bad = |offset: u64, reason: String| {
        corrupt(vfs, &seg.log_path, offset, format!("{reason} (strict recovery checks every record)"))
    };
    let mut scanner = Scanner::new(&*seg.log, HEADER_LEN as u64, footer.records_end);
    let mut expected = seg.base_seq;
    loop {
        match scanner.next_step().map_err(|e| io_err(vfs, &seg.log_path, "read", e))? {
            Step::Record { offset, header, .. } => {
                if header.seq != expected || header.seq > footer.last_seq {
                    return Err(bad(offset, format!("sequence {} where {expected} was expected", header.seq)));
                }
                expected += 1;
            }
            Step::End { offset, .. } => {
                if offset != footer.records_end || expected != footer.last_seq.saturating_add(1) {
                    return Err(bad(
                        offset,
                        format!(
                            "records end at sequence {} (offset {offset}); the footer says {} (offset {})",
                            expected - 1,
                            footer.last_seq,
                            footer.records_end
                        ),
                    ));
                }
                return Ok(());
            }
            Step::Truncated { offset } => return Err(bad(offset, "record runs past the footer".into())),
            Step::Invalid { offset, reason } => return Err(bad(offset, reason.into())),
        }
    }
}

/// Scans a whole sealed segment and returns index points at append
/// boundaries, and whether it met damage. Past damage it goes on at the next
/// record whose chain of records reaches the end of the segment exactly
/// (see [`find_chained_record`]) and puts a point there, so that reads
/// after the damage still seek; the points from the damage on say that any
/// timestamp and transaction may precede them (the damaged records' are
/// unknown). An index built over damage is kept in memory, not written: it
/// is not the writer's index.
pub(super) fn rebuild_index(vfs: &dyn Vfs, seg: &Segment, footer: &Footer) -> Result<(Vec<IndexEntry>, bool)> {
    let limit = footer.records_end;
    let mut out = Vec::new();
    let mut scanner = Scanner::new(&*seg.log, HEADER_LEN as u64, limit);
    let mut last_entry_offset = 0u64;
    let mut boundary = true;
    let mut max_ts = i64::MIN;
    let mut max_txn = 0;
    let mut expected = seg.base_seq;
    let mut damaged = false;
    loop {
        let step = scanner.next_step().map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
        let at = match step {
            Step::Record { offset, header, .. } if header.seq == expected => {
                if boundary && (out.is_empty() || offset - last_entry_offset >= INDEX_INTERVAL_BYTES) {
                    out.push(IndexEntry { seq: header.seq, offset, max_ts_before: max_ts, max_txn_before: max_txn });
                    last_entry_offset = offset;
                }
                boundary = header.flags & FLAG_END != 0;
                max_ts = max_ts.max(header.ts);
                max_txn = max_txn.max(header.txn);
                expected += 1;
                continue;
            }
            Step::End { .. } => return Ok((out, damaged)),
            Step::Record { offset, .. } | Step::Truncated { offset } | Step::Invalid { offset, .. } => offset,
        };
        damaged = true;
        let bound = Boundary { offset: Some(limit), seq: footer.last_seq.saturating_add(1), limit };
        match find_chained_record(&*seg.log, at, expected, bound).map_err(|e| io_err(vfs, &seg.log_path, "read", e))? {
            Some((next, seq)) => {
                (max_ts, max_txn) = (i64::MAX, u64::MAX);
                out.push(IndexEntry { seq, offset: next, max_ts_before: max_ts, max_txn_before: max_txn });
                last_entry_offset = next;
                boundary = false;
                expected = seq;
                scanner = Scanner::new(&*seg.log, next, limit);
            }
            None => return Ok((out, damaged)),
        }
    }
}

/// Writes a complete index file; failures are only logged (derived data).
pub(super) fn write_index(vfs: &dyn Vfs, path: &str, base: u64, entries: &[IndexEntry]) {
    let mut bytes = encode_index_header(base).to_vec();
    for e in entries {
        bytes.extend_from_slice(&e.encode());
    }
    let r = vfs.open(path, true).and_then(|f| {
        f.set_len(0)?;
        f.write_all_at(&bytes, 0)
    });
    if let Err(e) = r {
        tracing::warn!(file = %vfs.describe(path).display(), error = %e, "could not rewrite index");
    }
}

/// A scanned record's position, for recovery.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    pub(super) offset: u64,
    pub(super) end: u64,
    pub(super) header: RecordHeader,
}

/// Recovers the active (unsealed) segment: finds the last complete append
/// (and drops multi-partition batches above `committed_txn`), truncates
/// anything after it, and rebuilds the writer state.
pub(super) fn recover_active(
    vfs: &dyn Vfs,
    opts: &EngineOptions,
    seg: Arc<Segment>,
    committed_txn: u64,
) -> Result<(Writer, Option<Truncation>)> {
    let file_len = seg.log.len().map_err(|e| io_err(vfs, &seg.log_path, "stat", e))?;
    let idx = vfs.open(&seg.idx_path, true).map_err(|e| io_err(vfs, &seg.idx_path, "open", e))?;
    // The index is never synced and its points may be written before their
    // records reach the disk, so no point proves the bytes before it are
    // whole (pages may persist out of order): scan the whole active segment
    // — at most `segment_bytes` — and rebuild its index from the records.
    let mut entries: Vec<IndexEntry> = Vec::new();
    let (start, start_seq, start_max_ts, start_max_txn) = (HEADER_LEN as u64, seg.base_seq, i64::MIN, 0);

    // Scan to the end of the valid records.
    let mut scanner = Scanner::new(&*seg.log, start, file_len);
    let mut seen: Vec<Seen> = Vec::new();
    let mut expected = start_seq;
    let stop = loop {
        match scanner.next_step().map_err(|e| io_err(vfs, &seg.log_path, "read", e))? {
            Step::Record { offset, header, .. } => {
                if header.seq != expected {
                    break Some((offset, "sequence out of order"));
                }
                expected += 1;
                let end = scanner.position();
                seen.push(Seen { offset, end, header });
            }
            Step::End { footer: false, .. } => break None,
            Step::End { offset, footer: true } => break Some((offset, "torn footer")),
            Step::Truncated { offset } => break Some((offset, "record runs past the end of the file")),
            Step::Invalid { offset, reason } => break Some((offset, reason)),
        }
    };
    if let Some((offset, reason)) = stop
        && opts.recovery != RecoveryMode::TruncateAtFirstDamage
    {
        check_tail(vfs, &seg, offset, reason, expected, file_len)?;
    }

    let keep = complete_prefix(&seen, committed_txn);
    let kept = &seen[..keep];
    let cut = kept.last().map_or(start, |s| s.end);
    // Anything non-zero after the cut (a torn write, an unacknowledged append,
    // pages flushed out of order) must go, or a later crash could revive it.
    let data_end = zero_run_start(&*seg.log, cut, file_len).map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
    let mut truncation = None;
    if data_end > cut || stop.is_some() {
        let reason = stop.map_or("incomplete or uncommitted batch", |(_, r)| r);
        // (A view's active segment may hold a live writer's append in flight.)
        if opts.recovery == RecoveryMode::Strict && !opts.live_tail {
            return Err(corrupt(vfs, &seg.log_path, cut, format!("{reason} (strict recovery refuses to truncate)")));
        }
        tracing::warn!(file = %vfs.describe(&seg.log_path).display(), offset = cut, dropped_bytes = data_end.saturating_sub(cut), reason, "truncating torn tail");
        truncate_tail(vfs, &seg, cut, file_len)?;
        truncation = Some(Truncation { offset: cut, dropped_bytes: data_end.saturating_sub(cut), reason });
    }

    let count = kept.last().map_or(start_seq - seg.base_seq, |s| s.header.seq - seg.base_seq + 1);
    let max_ts = kept.iter().map(|s| s.header.ts).fold(start_max_ts, i64::max);
    let max_txn = kept.iter().map(|s| s.header.txn).fold(start_max_txn, u64::max);
    // Rebuild the index tail from the scanned records.
    let mut last_index_offset = entries.last().map_or(HEADER_LEN as u64, |e| e.offset);
    // Without a trusted entry the scan started at the first record, which
    // gets the first index point, as the writer gives it.
    let mut boundary = entries.is_empty();
    let (mut running_ts, mut running_txn) = (start_max_ts, start_max_txn);
    for s in kept {
        if boundary && (entries.is_empty() || s.offset - last_index_offset >= INDEX_INTERVAL_BYTES) {
            entries.push(IndexEntry {
                seq: s.header.seq,
                offset: s.offset,
                max_ts_before: running_ts,
                max_txn_before: running_txn,
            });
            last_index_offset = s.offset;
        }
        boundary = s.header.flags & FLAG_END != 0;
        running_ts = running_ts.max(s.header.ts);
        running_txn = running_txn.max(s.header.txn);
    }
    write_index(vfs, &seg.idx_path, seg.base_seq, &entries);
    let idx_len = (IDX_HEADER_LEN + entries.len() * ENTRY_LEN) as u64;
    // A cut tail is a hole (truncated, then extended back): only the space
    // up to the cut counts as filled, so that `Sync` zero-fills (allocates)
    // it again before writing there, and a full disk fails cleanly.
    let prealloc_end =
        if truncation.is_some() { cut } else { seg.log.len().map_err(|e| io_err(vfs, &seg.log_path, "stat", e))? };
    *seg.index.write() = Some(entries);
    let next_seq = seg.base_seq + count;
    Ok((
        Writer {
            idx,
            end: cut,
            prealloc_end,
            idx_len,
            last_index_offset,
            next_seq,
            count,
            max_ts,
            max_txn,
            active: seg,
            pending: Vec::new(),
            window: None,
            unmapped: false,
            reserved_end: 0,
            touched: None,
            idx_pending: Vec::new(),
        },
        truncation,
    ))
}

/// How many of the scanned records recovery keeps: only complete appends,
/// i.e. up to the last record flagged END, and before the first
/// multi-partition batch whose commit is not recorded. Cutting at such a
/// batch may leave a run without its END record in front of it, so the END
/// rule applies again to what is left: the kept prefix always ends with an
/// END record (or is empty), which makes recovery idempotent (a second open
/// of what the first one kept keeps all of it).
pub(super) fn complete_prefix(seen: &[Seen], committed_txn: u64) -> usize {
    let through_last_end = |s: &[Seen]| s.iter().rposition(|s| s.header.flags & FLAG_END != 0).map_or(0, |i| i + 1);
    let keep = through_last_end(seen);
    match seen[..keep].iter().position(|s| s.header.flags & FLAG_MULTI != 0 && s.header.txn > committed_txn) {
        Some(i) => through_last_end(&seen[..i]),
        None => keep,
    }
}

/// Consecutive damaged records whose lengths a resynchronisation follows.
pub(super) const MAX_HOPS: u64 = 64;

/// Where a chain of records found after damage must lead to be trusted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Boundary {
    /// The next index point's byte offset, which the chain must reach
    /// exactly; None at the end of the segment's records.
    pub(crate) offset: Option<u64>,
    /// The sequence due there (the index point's, or the last sequence + 1).
    pub(crate) seq: u64,
    /// Where the search for a record start stops (the index point, or the
    /// end of the records or file).
    pub(crate) limit: u64,
}

/// The first record start after damage at `damaged_at` (where `expected`
/// should have started) whose chain of records, each with the next
/// sequence, leads to `b` (see [`Boundary`]); with its sequence. The
/// damaged record's own length is tried first, then every later byte
/// offset with a plausible frame.
pub(crate) fn find_chained_record(
    log: &dyn VfsFile,
    damaged_at: u64,
    expected: u64,
    b: Boundary,
) -> std::io::Result<Option<(u64, u64)>> {
    let stop = b.offset.unwrap_or(b.limit);
    let chains = |at: u64| -> std::io::Result<Option<u64>> {
        let mut s = Scanner::with_chunk(log, at, b.limit, CHUNK_POINT);
        let mut first = None;
        let mut next = None;
        loop {
            let pos = s.position();
            if next == Some(b.seq) {
                return Ok(if b.offset.is_none_or(|o| o == pos) { first } else { None });
            }
            if pos >= stop {
                return Ok(None);
            }
            match s.next_step()? {
                Step::Record { header, .. } if next.is_none_or(|n| n == header.seq) && header.seq < b.seq => {
                    first.get_or_insert(header.seq);
                    next = Some(header.seq + 1);
                }
                _ => return Ok(None),
            }
        }
    };
    // 1. A damaged record's length is often intact (a flipped bit in its
    // body): the next record starts right after it. Follow the lengths of
    // consecutive damaged records (dense damage must not hide the good
    // records between): a checksummed record with exactly the sequence the
    // hops predict, at exactly the offset they predict, is believed without
    // a chain to the boundary (bytes inside a payload would have to carry
    // that sequence and a valid checksum at that offset). A chain that
    // reaches the boundary is believed from the first hop on.
    let mut at = damaged_at;
    for hop in 1..=MAX_HOPS {
        let mut frame = [0u8; PROBE];
        if log.read_at(&mut frame, at)? < PROBE {
            break;
        }
        let len = u64::from(get_u32(&frame, REC_LEN));
        if !(u64::from(BODY_MIN_U32)..=u64::from(MAX_BODY_LEN)).contains(&len) {
            break;
        }
        let next = at + FRAME_LEN as u64 + len;
        if next >= stop {
            break;
        }
        let want = expected + hop;
        match record_at(log, next, b.limit) {
            Some(h) if h.seq == want && h.seq < b.seq => return Ok(Some((next, want))),
            Some(_) => break,
            None => {}
        }
        if hop == 1
            && let Some(seq) = chains(next)?
            && seq > expected
        {
            return Ok(Some((next, seq)));
        }
        at = next;
    }
    // 2. Every later offset with a plausible frame.
    let mut buf = vec![0u8; 64 << 10];
    let mut at = damaged_at + 1;
    while at + PROBE as u64 <= stop {
        let n = log.read_at(&mut buf, at)?;
        if n < PROBE {
            break;
        }
        for i in 0..=(n - PROBE) {
            let pos = at + i as u64;
            if pos + PROBE as u64 > stop {
                break;
            }
            if plausible_frame(&buf[i..i + PROBE], expected + 1, b.seq)
                && let Some(seq) = chains(pos)?
            {
                return Ok(Some((pos, seq)));
            }
        }
        at += (n - PROBE + 1) as u64;
    }
    Ok(None)
}

/// The header of the record at `offset`, when a valid one starts there.
pub(super) fn record_at(log: &dyn VfsFile, offset: u64, file_len: u64) -> Option<RecordHeader> {
    let mut s = Scanner::new(log, offset, file_len);
    match s.next_step().ok()? {
        Step::Record { header, .. } => Some(header),
        _ => None,
    }
}

/// Decides whether a bad record at `offset` is a torn tail (the last write
/// was cut short) or corruption in the middle of the log. It is corruption
/// Decides whether a bad record at `offset` is a torn tail (the last write
/// was cut short) or damage in the middle of the log: it is damage when a
/// valid record with a later sequence appears anywhere after it, before the
/// zeros that end the written data.
pub(super) fn check_tail(
    vfs: &dyn Vfs,
    seg: &Segment,
    offset: u64,
    reason: &str,
    expected: u64,
    file_len: u64,
) -> Result<()> {
    let log = &*seg.log;
    let read_err = |e| io_err(vfs, &seg.log_path, "read", e);
    let data_end = zero_run_start(log, offset, file_len).map_err(read_err)?;
    // Only positions whose length is plausible and whose sequence is just
    // after the damage are checked in full (CRC), so the search is linear.
    let plausible = |b: &[u8]| plausible_frame(b, expected + 1, expected.saturating_add(1 << 24).saturating_add(1));
    let mut buf = vec![0u8; read_buffer_len(data_end.saturating_sub(offset))];
    let mut at = offset + 1;
    while at + PROBE as u64 <= data_end {
        let n = log.read_at(&mut buf, at).map_err(read_err)?;
        if n < PROBE {
            break;
        }
        for i in 0..=(n - PROBE) {
            let pos = at + i as u64;
            if pos + PROBE as u64 > data_end {
                break;
            }
            if plausible(&buf[i..i + PROBE])
                && let Some(h) = record_at(log, pos, file_len)
                && h.seq > expected
            {
                return Err(corrupt(
                    vfs,
                    &seg.log_path,
                    offset,
                    format!("{reason}, followed by valid records (sequence {} at offset {pos})", h.seq),
                ));
            }
        }
        at += (n - PROBE + 1) as u64;
    }
    Ok(())
}

/// A buffer for reading `left` bytes in steps of at most 1 MiB (a small
/// file gets a small buffer: opening many small partitions stays cheap).
pub(super) fn read_buffer_len(left: u64) -> usize {
    usize::try_from(left.clamp(PROBE as u64, 1 << 20)).unwrap_or(1 << 20)
}

/// The offset where the run of zeros at the end of the written data starts
/// (searching from `from`).
pub(super) fn zero_run_start(log: &dyn VfsFile, from: u64, file_len: u64) -> std::io::Result<u64> {
    let mut last_nonzero_end = from;
    let mut at = from;
    let mut buf = vec![0u8; read_buffer_len(file_len.saturating_sub(from))];
    while at < file_len {
        let n = log.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().rposition(|&b| b != 0) {
            last_nonzero_end = at + i as u64 + 1;
        }
        at += n as u64;
    }
    Ok(last_nonzero_end)
}

/// Drops everything after `cut` (keeping the file's preallocated length
/// filled with zeros), durably.
pub(super) fn truncate_tail(vfs: &dyn Vfs, seg: &Segment, cut: u64, file_len: u64) -> Result<()> {
    let log = &*seg.log;
    log.set_len(cut).map_err(|e| io_err(vfs, &seg.log_path, "truncate", e))?;
    if file_len > cut {
        log.set_len(file_len).map_err(|e| io_err(vfs, &seg.log_path, "extend", e))?;
    }
    log.sync_data().map_err(|e| sync_err(vfs, &seg.log_path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(records: &[(u8, u64)]) -> Vec<Seen> {
        records
            .iter()
            .enumerate()
            .map(|(i, &(flags, txn))| Seen {
                offset: 64 + 100 * i as u64,
                end: 164 + 100 * i as u64,
                header: RecordHeader { seq: i as u64 + 1, ts: 0, flags, txn },
            })
            .collect()
    }

    /// The `segment_recovery` regression of issue 11: cutting at an
    /// uncommitted multi-partition batch must not leave a run without its
    /// END record in front (the next open would drop it).
    #[test]
    fn the_kept_prefix_always_ends_with_an_end_record() {
        let multi_end = FLAG_MULTI | FLAG_END;
        assert_eq!(complete_prefix(&seen(&[(0, 0), (multi_end, 5)]), 0), 0);
        assert_eq!(complete_prefix(&seen(&[(FLAG_END, 0), (0, 0), (multi_end, 5)]), 0), 1);
        assert_eq!(complete_prefix(&seen(&[(FLAG_END, 0), (0, 0), (multi_end, 5)]), 5), 3, "committed: all kept");
        assert_eq!(complete_prefix(&seen(&[(FLAG_END, 0), (FLAG_MULTI, 6), (multi_end, 6), (FLAG_END, 0)]), 5), 1);
        assert_eq!(complete_prefix(&seen(&[(FLAG_END, 0), (0, 0)]), 0), 1, "a torn batch");
        for records in [&[(0u8, 0u64), (multi_end, 5)][..], &[(FLAG_END, 0), (0, 0), (multi_end, 9), (FLAG_END, 0)]] {
            let s = seen(records);
            let keep = complete_prefix(&s, 0);
            assert_eq!(complete_prefix(&s[..keep], 0), keep, "idempotent on {records:?}");
        }
    }
}
