//! The query planner: per partition and segment, read candidates from the
//! indexes when a filter can use them, else scan; re-check the whole query
//! on every event read, so an index only ever narrows the reading.
//!
//! - Bounds: the explicit sequence bounds, `sequence` filters, the cursor
//!   (orders by sequence or partition) and `from` (through the time index)
//!   narrow each partition's range before anything is read.
//! - Index: `eq`/`in` filters on indexed fields give posting lists, the
//!   smallest first, intersected; ranges and `exists` are used when no
//!   equality applies and they are selective (at most a quarter of the
//!   segment). Sealed segments read their index file, the active segment
//!   its in-memory index (records beyond it are scanned).
//! - Order and limit: ascending by sequence or partition, descending by
//!   sequence or partition, reading stops once the page is full and the
//!   next event would rank after it.

use std::sync::Arc;

use super::prefilter::Prefilter;
use super::term::{KeyRange, canonical, ranges};
use super::{FieldSet, PartitionIndex, SixFile, StreamIndex};
use crate::engine::log::partition::{Partition, Segment};
use crate::engine::log::stream::StreamLog;
use crate::error::Result;
use crate::model::limits::MAX_LIMIT;
use crate::model::query::{Access, Explain, Filter, Op, OrderBy, Page, PageBuilder, Query};
use crate::model::time::Timestamp;

/// An indexable filter.
#[derive(Debug)]
struct Term {
    field: String,
    ranges: Vec<KeyRange>,
    /// Every range is one key (equality): cheap and selective.
    point: bool,
}

/// The filters of a query an index can answer.
#[derive(Debug)]
struct Plan {
    terms: Vec<Term>,
}

impl Plan {
    fn new(q: &Query, fields: &FieldSet) -> Plan {
        let mut terms: Vec<Term> = q
            .filters
            .iter()
            .filter_map(|f| {
                let field = canonical(&f.path).filter(|c| fields.contains(c))?;
                let ranges = ranges(&f.op)?;
                let point = ranges.iter().all(KeyRange::is_point);
                Some(Term { field, ranges, point })
            })
            .collect();
        // Equalities first: they are looked up before any range.
        terms.sort_by_key(|t| !t.point);
        Plan { terms }
    }
}

/// Something that answers posting lists for one run of sequences.
enum Postings<'a> {
    File(&'a SixFile),
    Memory(&'a super::MemIndex),
}

/// What a source could tell about a run.
enum Candidates {
    /// These sequences (ascending) hold every match.
    Seqs(Vec<u64>, Vec<String>),
    /// No filter narrows it.
    Scan(&'static str),
}

impl Postings<'_> {
    fn lookup(&self, t: &Term, cap: u64) -> std::result::Result<Option<Vec<u64>>, super::SixError> {
        match self {
            Postings::File(f) => f.lookup(&t.field, &t.ranges, cap),
            Postings::Memory(m) => Ok(m.lookup(&t.field, &t.ranges, cap)),
        }
    }
    fn covers(&self, field: &str) -> bool {
        match self {
            Postings::File(f) => f.meta.ordinal(field).is_some(),
            Postings::Memory(m) => m.fields.contains(field),
        }
    }

    /// Intersects the posting lists of the plan's terms this source covers.
    fn candidates(&self, plan: &Plan, records: u64) -> std::result::Result<Candidates, super::SixError> {
        let usable: Vec<&Term> = plan.terms.iter().filter(|t| self.covers(&t.field)).collect();
        if usable.is_empty() {
            return Ok(Candidates::Scan("no filter on a field this index covers"));
        }
        let range_cap = (records / 4).max(64);
        let mut lists: Vec<(Vec<u64>, &str)> = Vec::new();
        for t in usable {
            if !t.point && !lists.is_empty() {
                break; // an equality already narrowed it; ranges are re-checked
            }
            let cap = if t.point { u64::MAX } else { range_cap };
            if let Some(l) = self.lookup(t, cap)? {
                let empty = l.is_empty();
                lists.push((l, &t.field));
                if empty {
                    break;
                }
            }
        }
        if lists.is_empty() {
            return Ok(Candidates::Scan("ranges too wide to help"));
        }
        lists.sort_by_key(|(l, _)| l.len());
        let fields = lists.iter().map(|(_, f)| (*f).to_owned()).collect();
        let mut it = lists.into_iter();
        let mut acc = it.next().map(|(l, _)| l).unwrap_or_default();
        for (l, _) in it {
            if acc.is_empty() {
                break;
            }
            acc = intersect(&acc, &l);
        }
        Ok(Candidates::Seqs(acc, fields))
    }
}

/// The sequences in both ascending lists (galloping through the longer).
fn intersect(small: &[u64], large: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(small.len());
    let mut rest = large;
    for &s in small {
        let i = rest.partition_point(|&x| x < s);
        rest = &rest[i..];
        match rest.first() {
            Some(&x) if x == s => out.push(s),
            Some(_) => {}
            None => break,
        }
    }
    out
}

/// Runs a query over a native stream: one page, with how it was read.
pub fn query_page(log: &StreamLog, index: &StreamIndex, q: &Query) -> Result<Page> {
    let fields = index.fields();
    let plan = Plan::new(q, &fields);
    let mut builder = q.page_builder();
    let mut explain = Vec::new();
    let ordered_asc = q.scan_is_ordered();
    let ordered_desc = q.descending && matches!(q.order_by, OrderBy::Sequence | OrderBy::Partition);
    for p in q.partitions(log.partition_count()) {
        let part = log.partition(p)?;
        let Some(pix) = index.partition(p) else { continue };
        let (mut after, until) = q.narrowed_bounds(p);
        let until = until.min(part.visible());
        if after >= until {
            continue;
        }
        if let Some(from) = q.from {
            // Every event before the first at/after `from` is older.
            match part.seek_time(from.as_millis())? {
                Some(s) => after = after.max(s - 1),
                None => continue,
            }
            if after >= until {
                continue;
            }
        }
        let mut segs: Vec<Arc<Segment>> = part
            .segments()
            .into_iter()
            .filter(|s| s.base_seq <= until && s.footer().is_none_or(|f| f.last_seq > after))
            .collect();
        if ordered_desc {
            segs.reverse();
        }
        if !plan.terms.is_empty() {
            // Index upkeep never fails a query: what it could not index is scanned.
            if let Err(e) = pix.catch_up(part, &fields) {
                tracing::warn!(stream = %log.name, partition = p, error = %e, "indexing the active segment failed; scanning it");
            }
        }
        let mut run =
            Run { stream: &log.name, p, part, builder: &mut builder, ordered_asc, ordered_desc, stopped: false };
        for seg in segs {
            let lo = after.saturating_add(1).max(seg.base_seq);
            let hi = seg.footer().map_or(until, |f| f.last_seq.min(until));
            if lo > hi {
                continue;
            }
            let first = if ordered_desc { hi } else { lo };
            if (ordered_asc || ordered_desc) && run.builder.past_end_at(p, first) {
                break;
            }
            run.segment(pix, &plan, &seg, lo, hi, &mut explain)?;
            if run.stopped {
                break;
            }
        }
    }
    let mut page = builder.finish();
    page.explain = explain;
    Ok(page)
}

/// Reading one partition into the page.
struct Run<'a, 'q> {
    /// The stream's name, shared by the events read.
    stream: &'a Arc<str>,
    p: u32,
    part: &'a Partition,
    builder: &'a mut PageBuilder<'q>,
    ordered_asc: bool,
    ordered_desc: bool,
    stopped: bool,
}

/// Where a candidate record is: its byte offset in the segment, when the
/// index knows it (checked against the record read there).
enum Locate<'a> {
    /// From a sealed segment's index file (read on demand).
    File(&'a SixFile),
    /// Copied from the in-memory index, parallel to the candidates.
    Known(Vec<Option<u64>>),
}

impl Run<'_, '_> {
    fn segment(
        &mut self,
        pix: &PartitionIndex,
        plan: &Plan,
        seg: &Segment,
        lo: u64,
        hi: u64,
        explain: &mut Vec<Explain>,
    ) -> Result<()> {
        if plan.terms.is_empty() {
            return self.scan(lo, hi, "no filter on an indexed field", explain);
        }
        if seg.footer().is_some() {
            let Some(file) = pix.sealed(self.part, seg) else {
                return self.scan(lo, hi, "the segment's index is not built yet", explain);
            };
            let records = file.meta.header.count();
            match Postings::File(&file).candidates(plan, records) {
                Ok(Candidates::Seqs(mut seqs, fields)) => {
                    seqs.retain(|&s| s >= lo && s <= hi);
                    if self.too_many(seqs.len(), lo, hi) {
                        return self.scan(lo, hi, "most of the run matches: a scan reads it faster", explain);
                    }
                    self.explain_index(fields, seqs.len(), "file", lo, hi, explain);
                    return self.read_all(seg, &seqs, &Locate::File(&file));
                }
                Ok(Candidates::Scan(reason)) => return self.scan(lo, hi, reason, explain),
                Err(e) => {
                    tracing::warn!(file = %file.path(), error = %e, "index file damaged; scanning and rebuilding");
                    pix.invalidate(seg.base_seq);
                    return self.scan(lo, hi, "the segment's index was damaged", explain);
                }
            }
        }
        // The active segment: its in-memory index up to where it reached.
        let guard = pix.active.lock();
        let (found, upto) = match guard.as_ref() {
            Some(m) if m.base == seg.base_seq => {
                let indexed_hi = hi.min(m.upto);
                let c = Postings::Memory(m)
                    .candidates(plan, m.upto.saturating_sub(m.base) + 1)
                    .unwrap_or(Candidates::Scan("the in-memory index could not answer"));
                let found = match c {
                    Candidates::Seqs(mut seqs, fields) => {
                        seqs.retain(|&s| s >= lo && s <= indexed_hi);
                        let offs = seqs.iter().map(|&s| m.offset_of(s)).collect();
                        Ok((seqs, offs, fields))
                    }
                    Candidates::Scan(reason) => Err(reason),
                };
                (found, m.upto)
            }
            _ => (Err("the active segment is not indexed yet"), seg.base_seq - 1),
        };
        drop(guard);
        let indexed_hi = hi.min(upto);
        let tail = |run: &mut Self, explain: &mut Vec<Explain>| {
            if indexed_hi < hi && !run.stopped {
                run.scan(lo.max(indexed_hi + 1), hi, "records newer than the in-memory index", explain)?;
            }
            Ok::<(), crate::Error>(())
        };
        if self.ordered_desc {
            tail(self, explain)?;
        }
        if lo <= indexed_hi && !self.stopped {
            match found {
                Ok((seqs, _, _)) if self.too_many(seqs.len(), lo, indexed_hi) => {
                    self.scan(lo, indexed_hi, "most of the run matches: a scan reads it faster", explain)?;
                }
                Ok((seqs, offs, fields)) => {
                    self.explain_index(fields, seqs.len(), "memory", lo, indexed_hi, explain);
                    self.read_all(seg, &seqs, &Locate::Known(offs))?;
                }
                Err(reason) => self.scan(lo, indexed_hi, reason, explain)?,
            }
        }
        if !self.ordered_desc {
            tail(self, explain)?;
        }
        Ok(())
    }

    /// True when reading `n` candidates one by one would cost more than
    /// scanning the run `lo..=hi`: over a quarter of it, in an order that
    /// cannot stop early (an ordered read stops at the page's end).
    fn too_many(&self, n: usize, lo: u64, hi: u64) -> bool {
        !(self.ordered_asc || self.ordered_desc) && n as u64 > (hi - lo + 1) / 4
    }

    fn explain_index(&self, fields: Vec<String>, n: usize, source: &str, lo: u64, hi: u64, explain: &mut Vec<Explain>) {
        explain.push(Explain {
            partition: self.p,
            first: lo,
            last: hi,
            access: Access::Index { fields, candidates: n as u64, source: source.to_owned() },
        });
    }

    /// Offers the candidates (ascending) in the page's order: newest first
    /// when descending.
    fn read_all(&mut self, seg: &Segment, seqs: &[u64], locate: &Locate<'_>) -> Result<()> {
        let order: Box<dyn Iterator<Item = usize>> =
            if self.ordered_desc { Box::new((0..seqs.len()).rev()) } else { Box::new(0..seqs.len()) };
        for i in order {
            let seq = seqs[i];
            if (self.ordered_asc || self.ordered_desc) && self.builder.past_end_at(self.p, seq) {
                self.stopped = true;
                return Ok(());
            }
            let offset = match locate {
                Locate::File(f) => f.offset_of(seq),
                Locate::Known(offs) => offs.get(i).copied().flatten(),
            };
            let record = match offset {
                Some(o) => self.part.record_at(seg, o, seq)?,
                None => None,
            };
            let record = match record {
                Some(r) => Some(r),
                None => {
                    // No offset, or a stale one: find it through the sparse index.
                    let mut got = None;
                    self.part.fetch(&[seq], |r| {
                        got = Some(r);
                        false
                    })?;
                    got
                }
            };
            if let Some(r) = record {
                self.builder.offer(r.into_event(self.stream, self.p));
            }
        }
        Ok(())
    }

    fn scan(&mut self, lo: u64, hi: u64, reason: &str, explain: &mut Vec<Explain>) -> Result<()> {
        explain.push(Explain {
            partition: self.p,
            first: lo,
            last: hi,
            access: Access::Scan { reason: reason.to_owned() },
        });
        let (p, ordered_asc, stream) = (self.p, self.ordered_asc, self.stream);
        let builder = &mut *self.builder;
        let q = builder.query();
        let prefilter = Prefilter::new(q);
        let mut stopped = false;
        self.part.scan_lazy(lo - 1, hi, |r| {
            let (seq, ts) = (r.header.seq, r.header.ts);
            if ordered_asc && builder.past_end_at(p, seq) {
                stopped = true;
                return Ok(false);
            }
            // Only records that can match become events.
            if q.matches_position(p, seq, Timestamp::from_millis(ts))
                && prefilter.as_ref().is_none_or(|f| f.may_match(&r.doc))
            {
                builder.offer(r.decode()?.into_event(stream, p));
            }
            Ok(true)
        })?;
        // A descending scan reads forwards: it may stop only between runs.
        self.stopped |= stopped;
        Ok(())
    }
}

/// The sequences of partition `p` whose events match `q`, ascending, through
/// the planner (replay by query, by ids): pages of the largest size.
pub fn matching(log: &StreamLog, index: &StreamIndex, p: u32, q: &Query, f: &mut dyn FnMut(u64)) -> Result<()> {
    // Pages of this partition in ascending order; the given query's own
    // cursor and order (if any) still decide what matches.
    let mut pages = q.clone();
    pages.filters.push(Filter { path: "partition".into(), op: Op::Eq(p.into()) });
    pages.order_by = OrderBy::Sequence;
    pages.descending = false;
    pages.limit = MAX_LIMIT;
    pages.cursor = None;
    loop {
        let page = query_page(log, index, &pages)?;
        for e in page.events.iter().filter(|e| q.matches(e)) {
            f(e.sequence());
        }
        match page.next_cursor {
            Some(c) => pages.cursor = Some(c),
            None => return Ok(()),
        }
    }
}

/// The first (partition, sequence) holding the event `id` (the lowest
/// partition, then sequence), through the id index (the dead-letter cursor).
pub fn position_of(log: &StreamLog, index: &StreamIndex, id: &str) -> Result<Option<(u32, u64)>> {
    // Partition by partition, so the search stops at the first that has it.
    for p in 0..log.partition_count() {
        let q = Query::new(log.name.to_string()).eq("id", id).partition(p).limit(1);
        if let Some(e) = query_page(log, index, &q)?.events.first() {
            return Ok(Some((p, e.sequence())));
        }
    }
    Ok(None)
}
