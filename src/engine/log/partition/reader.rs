//! A partition's read path: scans, point reads, seeks by sequence and time
//! through the sparse index, and the resynchronisation past damage.

use super::recovery::{Boundary, find_chained_record, rebuild_index, write_index};
use super::*;

impl Partition {
    /// Events with sequence > `after`, ascending, at most `limit`, never above
    /// the visible sequence.
    pub fn read(&self, after: u64, limit: usize) -> Result<Vec<StoredRecord>> {
        let mut out = Vec::with_capacity(self.read_room(after, limit));
        self.scan(after, u64::MAX, |r| {
            out.push(r);
            out.len() < limit
        })?;
        Ok(out)
    }

    /// As [`Partition::read`], each record made the event it holds as it is
    /// read (of stream `stream`, this partition being `partition`).
    pub fn read_events(&self, after: u64, limit: usize, stream: &Arc<str>, partition: u32) -> Result<Vec<Event>> {
        let mut out = Vec::with_capacity(self.read_room(after, limit));
        self.scan_raw(after, u64::MAX, |offset, header, doc, seg| {
            let event =
                Document::parse_event(doc.share(), stream, partition, header.seq, Timestamp::from_millis(header.ts))
                    .map_err(|reason| corrupt(&*self.vfs, &seg.log_path, offset, reason))?;
            out.push(event);
            Ok(out.len() < limit)
        })?;
        Ok(out)
    }

    /// How many records a read of at most `limit` after `after` can return
    /// (what is visible), bounded: the room to reserve for them at once.
    fn read_room(&self, after: u64, limit: usize) -> usize {
        let visible = usize::try_from(self.visible().saturating_sub(after)).unwrap_or(usize::MAX);
        limit.min(visible).min(1 << 16)
    }

    /// Calls `f` on each record with `after < seq <= until` (and visible), in
    /// order, until `f` returns false.
    pub fn scan(&self, after: u64, until: u64, mut f: impl FnMut(StoredRecord) -> bool) -> Result<()> {
        self.scan_raw(after, until, |offset, header, doc, seg| {
            let doc = doc.decode().map_err(|reason| corrupt(&*self.vfs, &seg.log_path, offset, reason))?;
            Ok(f(StoredRecord { header, doc }))
        })
    }

    /// As [`Partition::scan`], but each record comes undecoded: `f` looks
    /// at its header and MessagePack document and decodes it (checking the
    /// document whole) only if it wants the event. A record passed over is
    /// neither copied nor checked beyond its frame's checksum.
    pub fn scan_lazy(&self, after: u64, until: u64, mut f: impl FnMut(LazyRecord<'_>) -> Result<bool>) -> Result<()> {
        self.scan_raw(after, until, |offset, header, doc, seg| {
            f(LazyRecord { header, doc, offset, path: &seg.log_path, vfs: &*self.vfs })
        })
    }

    /// As [`Partition::scan`], with each record's undecoded MessagePack
    /// document (and its offset and segment, for errors).
    pub fn scan_raw(
        &self,
        after: u64,
        until: u64,
        mut f: impl FnMut(u64, RecordHeader, Doc<'_>, &Segment) -> Result<bool>,
    ) -> Result<()> {
        let visible = self.visible();
        let until = until.min(visible);
        // Retention dropped what is below the log start.
        let after = after.max(self.log_start().saturating_sub(1));
        if after >= until {
            return Ok(());
        }
        let first = after + 1;
        let segs: Vec<Arc<Segment>> = {
            let map = self.segments.read();
            let start = map.range(..=first).next_back().map_or(0, |(&b, _)| b);
            map.range(start..).map(|(_, s)| s.clone()).collect()
        };
        for seg in segs {
            if !self.scan_segment(&seg, first, until, CHUNK_SCAN, &mut f)? {
                break;
            }
        }
        Ok(())
    }

    /// Scans one segment from `first` to `until` (both within the visible
    /// records); false when `f` asked to stop or `until` was reached.
    /// Damage before `first` (met on the way from the index point to it) is
    /// stepped over when the scan can resynchronise after it; damage at or
    /// after `first` is `Error::Corrupt`.
    pub(super) fn scan_segment(
        &self,
        seg: &Segment,
        first: u64,
        until: u64,
        chunk: usize,
        f: &mut RawVisitor<'_>,
    ) -> Result<bool> {
        let (start, start_seq) = self.seek_point(seg, first)?;
        let limit = self.records_limit(seg)?;
        let mut scanner = Scanner::with_chunk(&*seg.log, start, limit, chunk);
        let mut expected = start_seq;
        loop {
            let step = scanner.next_step().map_err(|e| io_err(&*self.vfs, &seg.log_path, "read", e))?;
            let (offset, reason) = match step {
                Step::Record { header, doc, offset } => {
                    if header.seq != expected {
                        (offset, format!("sequence {} where {expected} was expected", header.seq))
                    } else {
                        expected = header.seq + 1;
                        if header.seq > until {
                            return Ok(false);
                        }
                        if header.seq < first {
                            continue;
                        }
                        if !f(offset, header, doc, seg)? {
                            return Ok(false);
                        }
                        if header.seq == until {
                            return Ok(false);
                        }
                        continue;
                    }
                }
                Step::End { offset, .. } => {
                    // A sealed segment ends where its footer says; records
                    // missing before that end are damage.
                    match seg.footer() {
                        Some(ft) if expected <= ft.last_seq && expected <= until => (
                            offset,
                            format!("records end at sequence {}, the footer says {}", expected - 1, ft.last_seq),
                        ),
                        _ => return Ok(true),
                    }
                }
                Step::Truncated { offset } => (offset, "record runs past the end of the file".to_owned()),
                Step::Invalid { offset, reason } => (offset, reason.to_owned()),
            };
            // Beyond the visible records a writer may be mid-write; before
            // them, or anywhere in a sealed segment, it is damage.
            if seg.footer().is_none() && expected > until {
                return Ok(false);
            }
            if expected >= first {
                return Err(corrupt(&*self.vfs, &seg.log_path, offset, reason));
            }
            match self.resync(seg, offset, expected)? {
                Some((at, seq)) if seq <= first => {
                    scanner = Scanner::with_chunk(&*seg.log, at, limit, chunk);
                    expected = seq;
                }
                _ => return Err(corrupt(&*self.vfs, &seg.log_path, offset, reason)),
            }
        }
    }

    /// Reads the records of `seqs` (strictly ascending, each a visible
    /// sequence): one outcome per sequence, in order. A record that fails a
    /// check is `Err(Error::Corrupt)` naming its file and offset, for its
    /// own position only: the read resynchronises at the next record it can
    /// trust (see [`Partition::resync`]) and goes on, so damage blocks only
    /// the positions it covers. The outer error is a failure to read at all
    /// (an I/O error, a sequence that is not visible): nothing was read.
    pub fn read_each(&self, seqs: &[u64]) -> Result<Vec<Result<StoredRecord>>> {
        let visible = self.visible();
        let mut out = Vec::with_capacity(seqs.len());
        let mut i = 0;
        while i < seqs.len() {
            let s = seqs[i];
            if s == 0 || s > visible || seqs[..i].last().is_some_and(|&prev| prev >= s) {
                return Err(Error::failed(
                    "read",
                    format!("{}: sequence {s} is not a visible position (visible up to {visible})", self.describe()),
                ));
            }
            let Some(seg) = self.segments.read().range(..=s).next_back().map(|(_, g)| g.clone()) else {
                return Err(Error::failed("read", format!("{}: no segment holds sequence {s}", self.describe())));
            };
            let seg_last = seg.footer().map_or(visible, |f| f.last_seq.min(visible));
            let j = i + seqs[i..].partition_point(|&x| x <= seg_last);
            if j == i {
                return Err(Error::failed("read", format!("{}: no segment holds sequence {s}", self.describe())));
            }
            self.read_segment_each(&seg, &seqs[i..j], seg_last, &mut out)?;
            i = j;
        }
        Ok(out)
    }

    /// [`Partition::read_each`] within one segment (`wanted` all at most `seg_last`).
    pub(super) fn read_segment_each(
        &self,
        seg: &Segment,
        wanted: &[u64],
        seg_last: u64,
        out: &mut Vec<Result<StoredRecord>>,
    ) -> Result<()> {
        let vfs = &*self.vfs;
        let limit = self.records_limit(seg)?;
        let (start, mut expected) = self.seek_point(seg, wanted[0])?;
        let mut scanner = Scanner::with_chunk(&*seg.log, start, limit, CHUNK_POINT);
        let mut k = 0;
        while k < wanted.len() {
            let step = scanner.next_step().map_err(|e| io_err(vfs, &seg.log_path, "read", e))?;
            let (offset, reason) = match step {
                Step::Record { header, doc, offset } if header.seq == expected => {
                    expected += 1;
                    if header.seq == wanted[k] {
                        out.push(
                            doc.decode()
                                .map(|doc| StoredRecord { header, doc })
                                .map_err(|reason| corrupt(vfs, &seg.log_path, offset, reason)),
                        );
                        k += 1;
                        // A far next position is reached by a new seek.
                        if k < wanted.len() {
                            let (at, seq) = self.seek_point(seg, wanted[k])?;
                            if seq > expected && at > scanner.position() + 2 * INDEX_INTERVAL_BYTES {
                                scanner = Scanner::with_chunk(&*seg.log, at, limit, CHUNK_POINT);
                                expected = seq;
                            }
                        }
                    }
                    continue;
                }
                Step::Record { header, offset, .. } => {
                    (offset, format!("sequence {} where {expected} was expected", header.seq))
                }
                Step::End { offset, .. } => {
                    (offset, format!("records end at sequence {}, before sequence {seg_last}", expected - 1))
                }
                Step::Truncated { offset } => (offset, "record runs past the end of the file".to_owned()),
                Step::Invalid { offset, reason } => (offset, reason.to_owned()),
            };
            // Damage at `offset`, where sequence `expected` should start.
            let next = self.resync(seg, offset, expected)?;
            let resumed = next.map_or(u64::MAX, |(_, seq)| seq);
            while k < wanted.len() && wanted[k] < resumed {
                let why = if wanted[k] == expected {
                    reason.clone()
                } else {
                    format!("unreadable: damage at this offset (sequence {expected}: {reason}) covers it")
                };
                out.push(Err(corrupt(vfs, &seg.log_path, offset, why)));
                k += 1;
            }
            match next {
                Some((at, seq)) => {
                    scanner = Scanner::with_chunk(&*seg.log, at, limit, CHUNK_POINT);
                    expected = seq;
                }
                None => break,
            }
        }
        Ok(())
    }

    /// After damage at `damaged_at` (where sequence `expected` should have
    /// started), the next record start that can be trusted, with its
    /// sequence (greater than `expected`); None when nothing after the
    /// damage can be trusted.
    ///
    /// Trusted: a record start the writer recorded in the sparse index, or
    /// a checksummed record whose chain of following records, each with the
    /// next sequence, reaches such an index point exactly; past the last
    /// index point, the end of the segment's records (a sealed segment's
    /// `records_end` exactly, with its last sequence done; the active
    /// segment's last visible record). Candidates, cheapest first: the end
    /// the damaged record's own length gives, then every later byte offset
    /// with a plausible frame (the search stops at the boundary).
    pub fn resync(&self, seg: &Segment, damaged_at: u64, expected: u64) -> Result<Option<(u64, u64)>> {
        let limit = self.records_limit(seg)?;
        let (last, end) = match seg.footer() {
            Some(f) => (f.last_seq, Some(f.records_end)),
            None => (self.visible(), None),
        };
        if expected >= last {
            return Ok(None);
        }
        self.ensure_index(seg)?;
        let point = {
            let ix = seg.index.read();
            ix.as_deref().unwrap_or(&[]).iter().find(|e| e.offset > damaged_at && e.seq > expected).copied()
        };
        let bound = match point {
            Some(e) if e.seq <= last => Boundary { offset: Some(e.offset), seq: e.seq, limit },
            _ => Boundary { offset: end, seq: last.saturating_add(1), limit },
        };
        let read_err = |e| io_err(&*self.vfs, &seg.log_path, "read", e);
        let found = find_chained_record(&*seg.log, damaged_at, expected, bound).map_err(read_err)?;
        Ok(match (found, point) {
            (Some(hit), _) => Some(hit),
            (None, Some(e)) if e.seq <= last => Some((e.offset, e.seq)),
            (None, _) => None,
        })
    }

    /// The end of a segment's records (or of its file, when active).
    pub(super) fn records_limit(&self, seg: &Segment) -> Result<u64> {
        match seg.footer() {
            Some(f) => Ok(f.records_end),
            None => seg.log.len().map_err(|e| io_err(&*self.vfs, &seg.log_path, "stat", e)),
        }
    }

    /// Calls `f` on the records of the given sequences (ascending; those
    /// above the visible records are skipped), reading each from the
    /// nearest index point with small reads, until `f` returns false.
    pub fn fetch(&self, seqs: &[u64], mut f: impl FnMut(StoredRecord) -> bool) -> Result<()> {
        let visible = self.visible();
        let mut i = 0;
        while i < seqs.len() {
            let s = seqs[i];
            if s == 0 || s > visible {
                break;
            }
            let Some(seg) = self.segments.read().range(..=s).next_back().map(|(_, g)| g.clone()) else {
                i += 1;
                continue;
            };
            let seg_last = seg.footer().map_or(visible, |f| f.last_seq.min(visible));
            // One pass over this segment while the next wanted record is
            // near; a far one is reached by a new seek.
            let mut stop = false;
            let far = |from: u64, to: u64| -> Result<bool> {
                Ok(self.seek(&seg, to)? > self.seek(&seg, from)? + 2 * INDEX_INTERVAL_BYTES)
            };
            let mut decode_err = None;
            self.scan_segment(&seg, s, seg_last, CHUNK_POINT, &mut |offset, header, doc, seg| {
                while i < seqs.len() && seqs[i] < header.seq {
                    i += 1; // not in the log (never expected): skip it
                }
                if i >= seqs.len() || seqs[i] > seg_last {
                    return Ok(false);
                }
                if seqs[i] == header.seq {
                    // A query's records are scattered: copied, so that
                    // each keeps only its own bytes.
                    match doc.decode_copy() {
                        Ok(doc) => {
                            if !f(StoredRecord { header, doc }) {
                                stop = true;
                                return Ok(false);
                            }
                        }
                        Err(reason) => {
                            decode_err = Some(corrupt(&*self.vfs, &seg.log_path, offset, reason));
                            return Ok(false);
                        }
                    }
                    i += 1;
                    if i < seqs.len() && seqs[i] <= seg_last && far(header.seq, seqs[i])? {
                        return Ok(false);
                    }
                }
                Ok(true)
            })?;
            if let Some(e) = decode_err {
                return Err(e);
            }
            if stop {
                return Ok(());
            }
            // A wanted sequence the segment did not hold: skip it.
            if i < seqs.len() && seqs[i] == s {
                i += 1;
            }
        }
        Ok(())
    }

    /// The record `seq` of `seg`, read at byte `offset` (from an index's
    /// offset table). `None` when the bytes there are not that visible
    /// record: the caller falls back to [`Partition::fetch`].
    pub fn record_at(&self, seg: &Segment, offset: u64, seq: u64) -> Result<Option<StoredRecord>> {
        if seq > self.visible() || offset < HEADER_LEN as u64 {
            return Ok(None);
        }
        let limit = match seg.footer() {
            Some(f) => f.records_end,
            None => seg.log.len().map_err(|e| io_err(&*self.vfs, &seg.log_path, "stat", e))?,
        };
        let mut scanner = Scanner::with_chunk(&*seg.log, offset, limit, CHUNK_RECORD);
        match scanner.next_step().map_err(|e| io_err(&*self.vfs, &seg.log_path, "read", e))? {
            Step::Record { header, doc, .. } if header.seq == seq => {
                let doc = doc.decode().map_err(|reason| corrupt(&*self.vfs, &seg.log_path, offset, reason))?;
                Ok(Some(StoredRecord { header, doc }))
            }
            _ => Ok(None),
        }
    }

    /// The byte offset to start scanning `seg` for sequence `first`.
    pub(super) fn seek(&self, seg: &Segment, first: u64) -> Result<u64> {
        Ok(self.seek_point(seg, first)?.0)
    }

    /// The index point at or before `first` in `seg`: the byte offset of a
    /// record start and that record's sequence.
    pub(super) fn seek_point(&self, seg: &Segment, first: u64) -> Result<(u64, u64)> {
        self.ensure_index(seg)?;
        let ix = seg.index.read();
        let entries = ix.as_deref().unwrap_or(&[]);
        let i = entries.partition_point(|e| e.seq <= first);
        Ok(if i == 0 { (HEADER_LEN as u64, seg.base_seq) } else { (entries[i - 1].offset, entries[i - 1].seq) })
    }

    /// Loads a sealed segment's index, rebuilding it from the log when the
    /// file is missing, stale or corrupt.
    pub(super) fn ensure_index(&self, seg: &Segment) -> Result<()> {
        if seg.index.read().is_some() {
            return Ok(());
        }
        let Some(footer) = seg.footer() else { return Ok(()) };
        let vfs = &*self.vfs;
        let loaded = match vfs.open(&seg.idx_path, false) {
            Ok(f) => {
                let most = footer.count.saturating_mul(ENTRY_LEN as u64).saturating_add(IDX_HEADER_LEN as u64);
                let len = f.len().unwrap_or(0).min(most);
                let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
                let n = f.read_at(&mut buf, 0).unwrap_or(0);
                decode_index(&buf[..n], seg.base_seq)
            }
            Err(_) => Vec::new(),
        };
        let entries = if loaded.last().is_some_and(|e| e.offset < footer.records_end && e.seq <= footer.last_seq)
            && !loaded.is_empty()
        {
            loaded
        } else {
            let (rebuilt, damaged) = rebuild_index(vfs, seg, &footer)?;
            if damaged {
                tracing::warn!(file = %vfs.describe(&seg.log_path).display(), "a sealed segment's index was rebuilt over damaged records; it is kept in memory only");
            } else {
                write_index(vfs, &seg.idx_path, seg.base_seq, &rebuilt);
            }
            rebuilt
        };
        *seg.index.write() = Some(entries);
        Ok(())
    }

    /// The first visible sequence whose timestamp is at or after `t` (the
    /// time index), or None. Timestamps need not be monotonic: each index
    /// point carries the largest timestamp before it, so whole blocks (and
    /// whole sealed segments, by their footer) whose events are all older
    /// than `t` are skipped without being read.
    pub fn seek_time(&self, t: i64) -> Result<Option<u64>> {
        let visible = self.visible();
        let start = self.log_start();
        for seg in self.segments() {
            let below_start = seg.footer().is_some_and(|f| f.last_seq < start);
            if below_start || seg.footer().is_some_and(|f| f.max_ts < t) || seg.base_seq > visible {
                continue;
            }
            self.ensure_index(&seg)?;
            // The first point with an event at/after t before it ends the block
            // that holds the answer; the block starts at the point before it.
            let start = {
                let ix = seg.index.read();
                let entries = ix.as_deref().unwrap_or(&[]);
                let i = entries.partition_point(|e| e.max_ts_before < t);
                if i == 0 { seg.base_seq } else { entries[i - 1].seq }
            };
            let mut found = None;
            let until = seg.footer().map_or(visible, |f| f.last_seq.min(visible));
            self.scan(start.max(self.log_start()) - 1, until, |r| {
                if r.header.ts >= t {
                    found = Some(r.header.seq);
                    return false;
                }
                true
            })?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }
}
