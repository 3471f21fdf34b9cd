//! The secondary-index file of a sealed segment (`<base>.six`), specified in
//! `format/secondary-index.md`: a header, blocks of sorted terms with their
//! delta-encoded sequence lists, a directory of the blocks, a trailer.
//!
//! Decoding never panics and never trusts a length: every count and offset
//! is checked against the bytes present and the segment it describes.

use std::ops::Bound;

use super::term::KeyRange;
use crate::engine::error::DecodeError;
use crate::engine::segment::format::MAX_BODY_LEN;

/// Magic of a secondary-index file (first and last 8 bytes).
pub const SIX_MAGIC: [u8; 8] = *b"RHEOSIX\0";
/// The format version this build writes and reads.
pub const SIX_VERSION: u16 = 1;

// Header (64 bytes).
/// Offset of the magic.
pub const SIX_MAGIC_AT: usize = 0;
/// Offset of the version (u16).
pub const SIX_VERSION_AT: usize = SIX_MAGIC_AT + 8;
/// Offset of the flags (u16, zero).
pub const SIX_FLAGS_AT: usize = SIX_VERSION_AT + 2;
/// Offset of the partition (u32).
pub const SIX_PARTITION_AT: usize = SIX_FLAGS_AT + 2;
/// Offset of the stream id (u64).
pub const SIX_STREAM_AT: usize = SIX_PARTITION_AT + 4;
/// Offset of the segment's base sequence (u64).
pub const SIX_BASE_AT: usize = SIX_STREAM_AT + 8;
/// Offset of the segment's last sequence (u64).
pub const SIX_LAST_AT: usize = SIX_BASE_AT + 8;
/// Offset of the segment's records_end (u64), from its footer.
pub const SIX_RECORDS_END_AT: usize = SIX_LAST_AT + 8;
/// Offset of the segment's largest timestamp (i64), from its footer.
pub const SIX_MAX_TS_AT: usize = SIX_RECORDS_END_AT + 8;
/// Offset of the reserved zero bytes (4).
pub const SIX_RESERVED_AT: usize = SIX_MAX_TS_AT + 8;
/// Offset of the header CRC32 (over bytes 0..60).
pub const SIX_HEADER_CRC_AT: usize = SIX_RESERVED_AT + 4;
/// Size of the header.
pub const SIX_HEADER_LEN: usize = SIX_HEADER_CRC_AT + 4;

// Trailer (24 bytes, the file's last).
/// Offset in the trailer of the directory's file offset (u64).
pub const SIX_DIR_OFFSET_AT: usize = 0;
/// Offset in the trailer of the directory's length (u32).
pub const SIX_DIR_LEN_AT: usize = SIX_DIR_OFFSET_AT + 8;
/// Offset in the trailer of the directory's CRC32 (u32).
pub const SIX_DIR_CRC_AT: usize = SIX_DIR_LEN_AT + 4;
/// Offset in the trailer of the closing magic.
pub const SIX_TRAILER_MAGIC_AT: usize = SIX_DIR_CRC_AT + 4;
/// Size of the trailer.
pub const SIX_TRAILER_LEN: usize = SIX_TRAILER_MAGIC_AT + 8;

/// A block is closed once it holds at least this many bytes.
pub const BLOCK_TARGET: usize = 4096;
/// The most fields one file may cover.
pub const MAX_FIELDS: usize = 1024;
/// The longest term key (field ordinal + value key). A value key is a tag
/// and at most a string's bytes, and a string is at most a record's body:
/// whatever the writer indexes, a reader accepts.
pub const MAX_KEY_LEN: usize = 2 + 1 + MAX_BODY_LEN as usize;

/// The segment an index file describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SixHeader {
    /// The partition.
    pub partition: u32,
    /// The stream's id.
    pub stream_id: u64,
    /// The segment's first sequence.
    pub base_seq: u64,
    /// The segment's last sequence.
    pub last_seq: u64,
    /// Where the segment's records end (its footer's `records_end`).
    pub records_end: u64,
    /// The segment's largest timestamp (its footer's `max_ts`).
    pub max_ts: i64,
}

/// Why an index file was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SixError {
    /// Damaged, or not an index file: rebuild it.
    Damaged(DecodeError),
    /// Written by another format version: rebuild it.
    Version(u16),
}

impl std::fmt::Display for SixError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SixError::Damaged(r) => r.fmt(f),
            SixError::Version(v) => write!(f, "index format version {v} (this build reads {SIX_VERSION})"),
        }
    }
}

fn damaged(r: impl Into<DecodeError>) -> SixError {
    SixError::Damaged(r.into())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl SixHeader {
    /// The 64 header bytes.
    pub fn encode(&self) -> [u8; SIX_HEADER_LEN] {
        let mut b = [0u8; SIX_HEADER_LEN];
        b[SIX_MAGIC_AT..SIX_MAGIC_AT + 8].copy_from_slice(&SIX_MAGIC);
        b[SIX_VERSION_AT..SIX_VERSION_AT + 2].copy_from_slice(&SIX_VERSION.to_le_bytes());
        b[SIX_PARTITION_AT..SIX_PARTITION_AT + 4].copy_from_slice(&self.partition.to_le_bytes());
        b[SIX_STREAM_AT..SIX_STREAM_AT + 8].copy_from_slice(&self.stream_id.to_le_bytes());
        b[SIX_BASE_AT..SIX_BASE_AT + 8].copy_from_slice(&self.base_seq.to_le_bytes());
        b[SIX_LAST_AT..SIX_LAST_AT + 8].copy_from_slice(&self.last_seq.to_le_bytes());
        b[SIX_RECORDS_END_AT..SIX_RECORDS_END_AT + 8].copy_from_slice(&self.records_end.to_le_bytes());
        b[SIX_MAX_TS_AT..SIX_MAX_TS_AT + 8].copy_from_slice(&self.max_ts.to_le_bytes());
        let crc = crc32fast::hash(&b[..SIX_HEADER_CRC_AT]);
        b[SIX_HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header.
    pub fn decode(b: &[u8]) -> Result<SixHeader, SixError> {
        if b.len() < SIX_HEADER_LEN || b[..8] != SIX_MAGIC {
            return Err(damaged("not a secondary-index file (bad magic or too short)"));
        }
        if crc32fast::hash(&b[..SIX_HEADER_CRC_AT]) != u32_at(b, SIX_HEADER_CRC_AT) {
            return Err(damaged("index header checksum mismatch"));
        }
        let version = u16_at(b, SIX_VERSION_AT);
        if version != SIX_VERSION {
            return Err(SixError::Version(version));
        }
        if u16_at(b, SIX_FLAGS_AT) != 0 || u32_at(b, SIX_RESERVED_AT) != 0 {
            return Err(damaged("index header flags or reserved bytes are not zero"));
        }
        let h = SixHeader {
            partition: u32_at(b, SIX_PARTITION_AT),
            stream_id: u64_at(b, SIX_STREAM_AT),
            base_seq: u64_at(b, SIX_BASE_AT),
            last_seq: u64_at(b, SIX_LAST_AT),
            records_end: u64_at(b, SIX_RECORDS_END_AT),
            max_ts: u64_at(b, SIX_MAX_TS_AT).cast_signed(),
        };
        if h.base_seq == 0 || h.last_seq < h.base_seq || h.last_seq == u64::MAX {
            return Err(damaged(format!("impossible sequence range {}..={}", h.base_seq, h.last_seq)));
        }
        Ok(h)
    }

    /// How many records the segment holds.
    pub fn count(&self) -> u64 {
        self.last_seq - self.base_seq + 1
    }
}

/// Appends `v` as an LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(u8::try_from(v & 0x7f).unwrap_or(0) | 0x80);
        v >>= 7;
    }
    out.push(u8::try_from(v).unwrap_or(0));
}

/// A cursor over bytes that reads varints and slices, checked.
#[derive(Debug, Clone, Copy)]
pub struct VarintReader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> VarintReader<'a> {
    /// Reads `b` from the start.
    pub fn new(b: &'a [u8]) -> Self {
        VarintReader { b, pos: 0 }
    }
    /// True when everything was read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.b.len()
    }
    /// An LEB128 varint (at most 10 bytes, no overflow).
    pub fn varint(&mut self) -> Result<u64, SixError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let byte = *self.b.get(self.pos).ok_or_else(|| damaged("varint runs past the end"))?;
            self.pos += 1;
            let bits = u64::from(byte & 0x7f);
            if i == 9 && bits > 1 {
                return Err(damaged("varint overflows 64 bits"));
            }
            v |= bits << (7 * i);
            if byte & 0x80 == 0 {
                // The writer uses the shortest form: one encoding per value.
                if byte == 0 && i > 0 {
                    return Err(damaged("varint longer than its shortest form"));
                }
                return Ok(v);
            }
        }
        Err(damaged("varint longer than 10 bytes"))
    }
    /// A varint that must fit `usize` and be at most `max`.
    pub fn len(&mut self, max: usize, what: &str) -> Result<usize, SixError> {
        let v = self.varint()?;
        usize::try_from(v).ok().filter(|&n| n <= max).ok_or_else(|| damaged(format!("{what} {v} is out of range")))
    }
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], SixError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| damaged("runs past the end"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
}

/// One block of the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRef {
    /// Its first term key.
    pub first: Vec<u8>,
    /// Its file offset.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u32,
    /// CRC32 of its bytes.
    pub crc: u32,
    /// How many terms it holds.
    pub terms: u32,
}

/// Everything but the blocks: what a reader keeps in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SixMeta {
    /// The segment described.
    pub header: SixHeader,
    /// The fields covered, sorted; a term's first two bytes are the index
    /// of its field in this list (big-endian).
    pub fields: Vec<String>,
    /// Per field (same order), the smallest and largest value key it has
    /// (both empty when it has none): lookups outside skip the file without
    /// reading a block (time-ordered ids make this the common case).
    pub spans: Vec<(Vec<u8>, Vec<u8>)>,
    /// The blocks, in term order.
    pub blocks: Vec<BlockRef>,
    /// The last term key of the file (empty when it has no terms).
    pub last: Vec<u8>,
    /// Where the record offsets start (right after the blocks).
    pub offsets_at: u64,
    /// How many record offsets there are: one per record (u32, the byte
    /// offset of record `base_seq + i` in the segment), or none.
    pub offsets: u64,
}

/// One term of a block.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// Field ordinal (2 bytes, big-endian) + value key.
    pub key: &'a [u8],
    /// How many sequences follow.
    pub count: u64,
    postings: &'a [u8],
}

/// Encodes a whole index file. `terms` are (field ordinal, value key,
/// ascending record offsets from the base `seq - base_seq`), sorted by
/// ordinal then value key; `offsets` are the records' byte offsets (all of
/// them, or none).
pub fn encode<'t>(
    header: &SixHeader,
    fields: &[String],
    terms: impl IntoIterator<Item = (u16, &'t [u8], &'t [u32])>,
    offsets: &[u32],
) -> Vec<u8> {
    let mut out = header.encode().to_vec();
    let mut blocks: Vec<BlockRef> = Vec::new();
    let mut block = Vec::new();
    let mut first: Option<Vec<u8>> = None;
    let mut count = 0u32;
    let mut last = Vec::new();
    let mut postings = Vec::new();
    let mut spans: Vec<(Vec<u8>, Vec<u8>)> = vec![(Vec::new(), Vec::new()); fields.len()];
    let mut close = |out: &mut Vec<u8>, block: &mut Vec<u8>, first: &mut Option<Vec<u8>>, count: &mut u32| {
        if let Some(f) = first.take() {
            blocks.push(BlockRef {
                first: f,
                offset: out.len() as u64,
                len: u32::try_from(block.len()).unwrap_or(u32::MAX),
                crc: crc32fast::hash(block),
                terms: *count,
            });
            out.extend_from_slice(block);
            block.clear();
            *count = 0;
        }
    };
    let mut key = Vec::new();
    for (ord, value, offsets) in terms {
        key.clear();
        key.extend_from_slice(&ord.to_be_bytes());
        key.extend_from_slice(value);
        let key = key.as_slice();
        if first.is_none() {
            first = Some(key.to_vec());
        }
        if let Some(span) = spans.get_mut(usize::from(ord)) {
            if span.0.is_empty() {
                span.0 = value.to_vec();
            }
            span.1.clear();
            span.1.extend_from_slice(value);
        }
        postings.clear();
        let mut prev = 0u32;
        for (i, &o) in offsets.iter().enumerate() {
            put_varint(&mut postings, u64::from(if i == 0 { o } else { o - prev }));
            prev = o;
        }
        put_varint(&mut block, key.len() as u64);
        block.extend_from_slice(key);
        put_varint(&mut block, offsets.len() as u64);
        put_varint(&mut block, postings.len() as u64);
        block.extend_from_slice(&postings);
        count += 1;
        last.clear();
        last.extend_from_slice(key);
        if block.len() >= BLOCK_TARGET {
            close(&mut out, &mut block, &mut first, &mut count);
        }
    }
    close(&mut out, &mut block, &mut first, &mut count);
    // The record offsets: every record's, or none (a segment past 4 GiB).
    let offsets = if offsets.len() as u64 == header.count() { offsets } else { &[] };
    for o in offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
    let dir_offset = out.len() as u64;
    let mut dir = Vec::new();
    put_varint(&mut dir, fields.len() as u64);
    for (f, (lo, hi)) in fields.iter().zip(&spans) {
        put_varint(&mut dir, f.len() as u64);
        dir.extend_from_slice(f.as_bytes());
        put_varint(&mut dir, lo.len() as u64);
        dir.extend_from_slice(lo);
        put_varint(&mut dir, hi.len() as u64);
        dir.extend_from_slice(hi);
    }
    put_varint(&mut dir, blocks.len() as u64);
    for b in &blocks {
        put_varint(&mut dir, b.first.len() as u64);
        dir.extend_from_slice(&b.first);
        put_varint(&mut dir, b.offset);
        put_varint(&mut dir, u64::from(b.len));
        dir.extend_from_slice(&b.crc.to_le_bytes());
        put_varint(&mut dir, u64::from(b.terms));
    }
    put_varint(&mut dir, last.len() as u64);
    dir.extend_from_slice(&last);
    put_varint(&mut dir, offsets.len() as u64);
    out.extend_from_slice(&dir);
    out.extend_from_slice(&dir_offset.to_le_bytes());
    out.extend_from_slice(&u32::try_from(dir.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&dir).to_le_bytes());
    out.extend_from_slice(&SIX_MAGIC);
    out
}

/// The directory's position from the trailer (the last 24 bytes of a file
/// of `file_len` bytes): (offset, length, crc).
pub fn decode_trailer(t: &[u8], file_len: u64) -> Result<(u64, u32, u32), SixError> {
    if t.len() != SIX_TRAILER_LEN || t[SIX_TRAILER_MAGIC_AT..] != SIX_MAGIC {
        return Err(damaged("index trailer missing (a file cut short?)"));
    }
    let (offset, len, crc) = (u64_at(t, SIX_DIR_OFFSET_AT), u32_at(t, SIX_DIR_LEN_AT), u32_at(t, SIX_DIR_CRC_AT));
    let end = offset.checked_add(u64::from(len)).and_then(|e| e.checked_add(SIX_TRAILER_LEN as u64));
    if offset < SIX_HEADER_LEN as u64 || end != Some(file_len) {
        return Err(damaged(format!("directory at {offset} (+{len}) does not end where the trailer starts")));
    }
    Ok((offset, len, crc))
}

/// Decodes and checks the directory (`dir` at `dir_offset`, CRC checked by
/// the caller or here when `crc` is given).
pub fn decode_dir(header: SixHeader, dir: &[u8], dir_offset: u64, crc: u32) -> Result<SixMeta, SixError> {
    if crc32fast::hash(dir) != crc {
        return Err(damaged("index directory checksum mismatch"));
    }
    let mut r = VarintReader::new(dir);
    let nfields = r.len(MAX_FIELDS, "field count")?;
    let mut fields: Vec<String> = Vec::with_capacity(nfields);
    let mut spans = Vec::with_capacity(nfields);
    for _ in 0..nfields {
        let n = r.len(dir.len(), "field name length")?;
        let name = std::str::from_utf8(r.take(n)?).map_err(|_| damaged("field name is not UTF-8"))?;
        if fields.last().is_some_and(|prev| prev.as_str() >= name) {
            return Err(damaged("fields are not sorted and distinct"));
        }
        fields.push(name.to_owned());
        let n = r.len(MAX_KEY_LEN, "key length")?;
        let lo = r.take(n)?.to_vec();
        let n = r.len(MAX_KEY_LEN, "key length")?;
        let hi = r.take(n)?.to_vec();
        if lo > hi || lo.is_empty() != hi.is_empty() {
            return Err(damaged(format!("field {name:?}: value span is reversed or half empty")));
        }
        spans.push((lo, hi));
    }
    let nblocks = r.len(dir.len(), "block count")?;
    let mut blocks: Vec<BlockRef> = Vec::with_capacity(nblocks);
    let mut expect = SIX_HEADER_LEN as u64;
    for _ in 0..nblocks {
        let n = r.len(MAX_KEY_LEN, "key length")?;
        let first = r.take(n)?.to_vec();
        let offset = r.varint()?;
        let len = u32::try_from(r.varint()?).map_err(|_| damaged("block length out of range"))?;
        let crc = u32_at(r.take(4)?, 0);
        let terms = u32::try_from(r.varint()?).map_err(|_| damaged("block term count out of range"))?;
        if offset != expect || len == 0 || terms == 0 {
            return Err(damaged(format!(
                "block at {offset} (+{len}, {terms} terms) where one was expected at {expect}"
            )));
        }
        if blocks.last().is_some_and(|b| b.first >= first) {
            return Err(damaged("block first keys are not ascending"));
        }
        expect = offset + u64::from(len);
        blocks.push(BlockRef { first, offset, len, crc, terms });
    }
    // The writer closes a block once it holds BLOCK_TARGET bytes: every
    // block but the last is at least that long (one way to cut the terms).
    if blocks.iter().rev().skip(1).any(|b| (b.len as usize) < BLOCK_TARGET) {
        return Err(damaged(format!("a block before the last is shorter than {BLOCK_TARGET} bytes")));
    }
    let n = r.len(MAX_KEY_LEN, "key length")?;
    let last = r.take(n)?.to_vec();
    let offsets = r.varint()?;
    if offsets != 0 && offsets != header.count() {
        return Err(damaged(format!("{offsets} record offsets for a segment of {} records", header.count())));
    }
    let offsets_at = expect;
    if offsets.checked_mul(4).and_then(|b| offsets_at.checked_add(b)) != Some(dir_offset) {
        return Err(damaged(format!(
            "blocks end at {offsets_at}, then {offsets} record offsets; the directory starts at {dir_offset}"
        )));
    }
    if !r.is_empty() {
        return Err(damaged("bytes after the directory's end"));
    }
    if blocks.last().is_some_and(|b| b.first > last) || (blocks.is_empty() != last.is_empty()) {
        return Err(damaged("the last key is before the last block"));
    }
    Ok(SixMeta { header, fields, spans, blocks, last, offsets_at, offsets })
}

impl SixMeta {
    /// Checks a block's bytes (as read from `offset`) and iterates its terms.
    pub fn block<'b>(&self, i: usize, bytes: &'b [u8]) -> Result<BlockIter<'b>, SixError> {
        let b = self.blocks.get(i).ok_or_else(|| damaged("no such block"))?;
        if bytes.len() != b.len as usize || crc32fast::hash(bytes) != b.crc {
            return Err(damaged(format!("block at offset {} checksum mismatch", b.offset)));
        }
        Ok(BlockIter { r: VarintReader::new(bytes), left: b.terms, max_count: self.header.count() })
    }

    /// The first block that may hold `key` or a later key.
    pub fn block_for(&self, key: &[u8]) -> usize {
        self.blocks.partition_point(|b| b.first.as_slice() <= key).saturating_sub(1)
    }

    /// True when no key of the file can be in `lo..=hi` by the directory
    /// alone (before the first or after the last key).
    pub fn excludes(&self, lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
        let Some(first) = self.blocks.first().map(|b| &b.first) else { return true };
        let below = match hi {
            Bound::Included(h) => h < first,
            Bound::Excluded(h) => h <= first,
            Bound::Unbounded => false,
        };
        let above = match lo {
            Bound::Included(l) => *l > self.last,
            Bound::Excluded(l) => *l >= self.last,
            Bound::Unbounded => false,
        };
        below || above
    }

    /// True when field `ord` has no value key in `r` by its span alone.
    pub fn span_excludes(&self, ord: u16, r: &KeyRange) -> bool {
        let Some((lo, hi)) = self.spans.get(usize::from(ord)) else { return true };
        if lo.is_empty() {
            return true;
        }
        let below = match &r.hi {
            Bound::Included(h) => h < lo,
            Bound::Excluded(h) => h <= lo,
            Bound::Unbounded => false,
        };
        let above = match &r.lo {
            Bound::Included(l) => l > hi,
            Bound::Excluded(l) => l >= hi,
            Bound::Unbounded => false,
        };
        below || above
    }

    /// The ordinal of a field, when the file covers it.
    pub fn ordinal(&self, field: &str) -> Option<u16> {
        self.fields.binary_search_by(|f| f.as_str().cmp(field)).ok().and_then(|i| u16::try_from(i).ok())
    }
}

/// The terms of a checked block.
#[derive(Debug)]
pub struct BlockIter<'b> {
    r: VarintReader<'b>,
    left: u32,
    max_count: u64,
}

impl<'b> BlockIter<'b> {
    /// How far into the block the reading is (for reports).
    pub fn position(&self) -> usize {
        self.r.pos
    }

    /// The next term, or `None` at the end (checking the block ends exactly).
    pub fn next_entry(&mut self) -> Result<Option<Entry<'b>>, SixError> {
        if self.left == 0 {
            return if self.r.is_empty() { Ok(None) } else { Err(damaged("bytes after a block's last term")) };
        }
        self.left -= 1;
        // ... and so holds no term after reaching it.
        if self.left == 0 && self.r.pos >= BLOCK_TARGET {
            return Err(damaged(format!("a block holds a term after reaching {BLOCK_TARGET} bytes")));
        }
        let n = self.r.len(MAX_KEY_LEN, "key length")?;
        let key = self.r.take(n)?;
        let count = self.r.varint()?;
        if count == 0 || count > self.max_count {
            return Err(damaged(format!("posting count {count} is out of range")));
        }
        let plen = self.r.len(usize::MAX, "posting length")?;
        let postings = self.r.take(plen)?;
        Ok(Some(Entry { key, count, postings }))
    }
}

impl Entry<'_> {
    /// The sequences, checked: ascending, within `base..=last`, exactly
    /// `count` of them filling the posting bytes.
    pub fn sequences(&self, header: &SixHeader, out: &mut Vec<u64>) -> Result<(), SixError> {
        let mut r = VarintReader::new(self.postings);
        let mut seq = header.base_seq;
        for i in 0..self.count {
            let d = r.varint()?;
            if i > 0 && d == 0 {
                return Err(damaged("posting list is not strictly ascending"));
            }
            seq = seq
                .checked_add(d)
                .filter(|&s| s <= header.last_seq)
                .ok_or_else(|| damaged(format!("posting beyond the segment's last sequence {}", header.last_seq)))?;
            out.push(seq);
        }
        if !r.is_empty() {
            return Err(damaged("bytes after a posting list"));
        }
        Ok(())
    }
}

/// The term key of a field ordinal and value-key range end.
pub fn term_bound(ordinal: u16, b: &Bound<Vec<u8>>, upper: bool) -> Bound<Vec<u8>> {
    let with = |k: &[u8]| {
        let mut v = ordinal.to_be_bytes().to_vec();
        v.extend_from_slice(k);
        v
    };
    match b {
        Bound::Included(k) => Bound::Included(with(k)),
        Bound::Excluded(k) => Bound::Excluded(with(k)),
        Bound::Unbounded if upper => match ordinal.checked_add(1) {
            Some(next) => Bound::Excluded(next.to_be_bytes().to_vec()),
            None => Bound::Unbounded,
        },
        Bound::Unbounded => Bound::Included(ordinal.to_be_bytes().to_vec()),
    }
}

/// The term-key range of a value-key range of one field.
pub fn term_range(ordinal: u16, r: &KeyRange) -> KeyRange {
    KeyRange { lo: term_bound(ordinal, &r.lo, false), hi: term_bound(ordinal, &r.hi, true) }
}

/// Every term of a file with its sequences, in key order.
pub type Terms = Vec<(Vec<u8>, Vec<u64>)>;

/// Every problem of an index file, each at the byte offset it is at (for
/// `rheo verify`): the header's field, the trailer, the directory, each
/// block on its own (a damaged block does not hide the next one, and a bad
/// term is reported where it starts), the record offsets. Empty when
/// [`decode_all`] accepts the file.
pub fn verify(bytes: &[u8]) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let header = match SixHeader::decode(bytes) {
        Ok(h) => h,
        Err(e) => {
            let at = if bytes.len() < SIX_HEADER_LEN || bytes[..8] != SIX_MAGIC {
                SIX_MAGIC_AT
            } else if crc32fast::hash(&bytes[..SIX_HEADER_CRC_AT]) != u32_at(bytes, SIX_HEADER_CRC_AT) {
                SIX_HEADER_CRC_AT
            } else if u16_at(bytes, SIX_VERSION_AT) != SIX_VERSION {
                SIX_VERSION_AT
            } else if u16_at(bytes, SIX_FLAGS_AT) != 0 {
                SIX_FLAGS_AT
            } else if u32_at(bytes, SIX_RESERVED_AT) != 0 {
                SIX_RESERVED_AT
            } else {
                SIX_BASE_AT
            };
            out.push((at as u64, e.to_string()));
            return out;
        }
    };
    let trailer_at = bytes.len().saturating_sub(SIX_TRAILER_LEN);
    if bytes.len() < SIX_HEADER_LEN + SIX_TRAILER_LEN {
        out.push((bytes.len() as u64, "index file too short for its trailer".into()));
        return out;
    }
    let (dir_at, len, crc) = match decode_trailer(&bytes[trailer_at..], bytes.len() as u64) {
        Ok(t) => t,
        Err(e) => {
            out.push((trailer_at as u64, e.to_string()));
            return out;
        }
    };
    let Some(dir) = usize::try_from(dir_at).ok().and_then(|at| bytes.get(at..at + len as usize)) else {
        out.push((trailer_at as u64, "directory runs past the end".into()));
        return out;
    };
    let meta = match decode_dir(header, dir, dir_at, crc) {
        Ok(m) => m,
        Err(e) => {
            out.push((dir_at, e.to_string()));
            return out;
        }
    };
    let mut prev_key: Option<Vec<u8>> = None;
    for (i, b) in meta.blocks.iter().enumerate() {
        let Some(block) = usize::try_from(b.offset).ok().and_then(|at| bytes.get(at..at + b.len as usize)) else {
            out.push((b.offset, "block runs past the end".into()));
            continue;
        };
        let mut it = match meta.block(i, block) {
            Ok(it) => it,
            Err(e) => {
                out.push((b.offset, e.to_string()));
                prev_key = None;
                continue;
            }
        };
        let mut first = true;
        loop {
            let at = b.offset + it.position() as u64;
            let e = match it.next_entry() {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(e) => {
                    out.push((at, e.to_string()));
                    break;
                }
            };
            let problem = if first && e.key != b.first.as_slice() {
                Some("a block's first key differs from the directory".to_owned())
            } else if prev_key.as_deref().is_some_and(|k| k >= e.key) {
                Some("term keys are not ascending".to_owned())
            } else if e.key.len() < 2 || usize::from(u16::from_be_bytes([e.key[0], e.key[1]])) >= meta.fields.len() {
                Some("a term names no covered field".to_owned())
            } else {
                e.sequences(&meta.header, &mut Vec::new()).err().map(|e| e.to_string())
            };
            if let Some(p) = problem {
                out.push((at, p));
            }
            first = false;
            prev_key = Some(e.key.to_vec());
        }
    }
    if let Ok(at) = usize::try_from(meta.offsets_at) {
        let mut prev = 0u64;
        for i in 0..usize::try_from(meta.offsets).unwrap_or(0) {
            let Some(o) = bytes.get(at + 4 * i..at + 4 * i + 4).map(|b| u64::from(u32_at(b, 0))) else { break };
            if o <= prev || o < 64 || o >= meta.header.records_end {
                out.push((
                    (at + 4 * i) as u64,
                    format!("record offset {o} of record {i} is out of order or outside the records"),
                ));
            }
            prev = o;
        }
    }
    if out.is_empty()
        && let Err(e) = decode_all(bytes)
    {
        // What the per-part checks above do not cover (the value spans,
        // the last key): reported at the directory.
        out.push((dir_at, e.to_string()));
    }
    out
}

/// A whole file decoded and checked (tests, fuzzing, `verify`): its
/// directory and every term with its sequences.
pub fn decode_all(bytes: &[u8]) -> Result<(SixMeta, Terms), SixError> {
    let header = SixHeader::decode(bytes)?;
    if bytes.len() < SIX_HEADER_LEN + SIX_TRAILER_LEN {
        return Err(damaged("index file too short"));
    }
    let t = &bytes[bytes.len() - SIX_TRAILER_LEN..];
    let (offset, len, crc) = decode_trailer(t, bytes.len() as u64)?;
    let start = usize::try_from(offset).map_err(|_| damaged("directory offset out of range"))?;
    let dir = bytes.get(start..start + len as usize).ok_or_else(|| damaged("directory runs past the end"))?;
    let meta = decode_dir(header, dir, offset, crc)?;
    let mut terms: Vec<(Vec<u8>, Vec<u64>)> = Vec::new();
    for (i, b) in meta.blocks.iter().enumerate() {
        let at = usize::try_from(b.offset).map_err(|_| damaged("block offset out of range"))?;
        let block = bytes.get(at..at + b.len as usize).ok_or_else(|| damaged("block runs past the end"))?;
        let mut it = meta.block(i, block)?;
        let mut first = true;
        while let Some(e) = it.next_entry()? {
            if first && e.key != b.first.as_slice() {
                return Err(damaged("a block's first key differs from the directory"));
            }
            first = false;
            if terms.last().is_some_and(|(k, _)| k.as_slice() >= e.key) {
                return Err(damaged("term keys are not ascending"));
            }
            if e.key.len() < 2 || usize::from(u16::from_be_bytes([e.key[0], e.key[1]])) >= meta.fields.len() {
                return Err(damaged("a term names no covered field"));
            }
            let mut seqs = Vec::new();
            e.sequences(&meta.header, &mut seqs)?;
            terms.push((e.key.to_vec(), seqs));
        }
    }
    if terms.last().map(|(k, _)| k.as_slice()).unwrap_or(&[]) != meta.last.as_slice() {
        return Err(damaged("the directory's last key is not the last term"));
    }
    let at = usize::try_from(meta.offsets_at).map_err(|_| damaged("offsets out of range"))?;
    let mut prev = 0u64;
    for i in 0..usize::try_from(meta.offsets).unwrap_or(0) {
        let o = u64::from(u32_at(bytes, at + 4 * i));
        if o <= prev || o < 64 || o >= meta.header.records_end {
            return Err(damaged(format!("record offset {o} of record {i} is out of order or outside the records")));
        }
        prev = o;
    }
    for (i, (lo, hi)) in meta.spans.iter().enumerate() {
        let ord = u16::try_from(i).unwrap_or(u16::MAX).to_be_bytes();
        let mut of_field = terms.iter().filter(|(k, _)| k[..2] == ord).map(|(k, _)| &k[2..]);
        let first = of_field.next();
        let last = of_field.next_back().or(first);
        if first.unwrap_or(&[]) != lo.as_slice() || last.unwrap_or(&[]) != hi.as_slice() {
            return Err(damaged(format!(
                "field {:?}: the directory's value span differs from its terms",
                meta.fields[i]
            )));
        }
    }
    Ok((meta, terms))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Offsets = Vec<(Vec<u8>, Vec<u32>)>;

    fn sample(n_terms: u32) -> (SixHeader, Vec<u8>, Offsets) {
        let h = SixHeader { partition: 3, stream_id: 9, base_seq: 101, last_seq: 600, records_end: 9000, max_ts: 77 };
        let terms: Vec<(Vec<u8>, Vec<u32>)> = (0..n_terms)
            .map(|i| {
                let mut k = vec![0, u8::try_from(i % 2).expect("small")];
                k.extend_from_slice(format!("value-{i:06}").as_bytes());
                (k, (0..=(i % 7)).map(|j| j * 50 + i % 50).collect())
            })
            .collect();
        let mut sorted = terms.clone();
        sorted.sort();
        let fields = vec!["id".to_owned(), "type".to_owned()];
        let offsets: Vec<u32> = (0..500).map(|i| 64 + 16 * i).collect();
        let terms = sorted.iter().map(|(k, v)| (u16::from_be_bytes([k[0], k[1]]), &k[2..], v.as_slice()));
        let bytes = encode(&h, &fields, terms, &offsets);
        (h, bytes, sorted)
    }

    #[test]
    fn round_trip_many_blocks() {
        let (h, bytes, terms) = sample(2000);
        let (meta, got) = decode_all(&bytes).expect("decode");
        assert_eq!(meta.header, h);
        assert!(meta.blocks.len() > 3);
        assert_eq!(got.len(), terms.len());
        for ((k, seqs), (k2, offs)) in got.iter().zip(&terms) {
            assert_eq!(k, k2);
            assert_eq!(seqs, &offs.iter().map(|&o| 101 + u64::from(o)).collect::<Vec<_>>());
        }
        let (_, empty, _) = sample(0);
        let (meta, got) = decode_all(&empty).expect("empty");
        assert!(meta.blocks.is_empty() && got.is_empty());
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_refused() {
        let (_, bytes, _) = sample(40);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x5a;
            assert!(decode_all(&b).is_err(), "flip at {i} went unnoticed");
        }
        for n in 0..bytes.len() {
            assert!(decode_all(&bytes[..n]).is_err(), "cut at {n}");
        }
    }

    #[test]
    fn varints_round_trip_and_overflow_is_refused() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(VarintReader::new(&b).varint().expect("varint"), v);
        }
        assert!(VarintReader::new(&[0xff; 10]).varint().is_err());
        assert!(VarintReader::new(&[0x80]).varint().is_err());
    }
}
