//! Reading a native data directory's files directly, never through the
//! engine (which would repair them): decode them, check every checksum, and
//! say what is damaged and what the next open would repair. The `rheo
//! inspect` and `rheo verify` commands render these reports.
//!
//! ```no_run
//! let report = rheo::inspect::verify_dir(std::path::Path::new("./rheo-data"))?;
//! for p in &report.problems {
//!     eprintln!("{} at {}: {}", p.file.display(), p.offset, p.reason);
//! }
//! # Ok::<(), rheo::Error>(())
//! ```

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use crate::engine::delivery::{checkpoint, wal};
use crate::engine::error::{DecodeError, StorageError};
use crate::engine::index::file as six;
use crate::engine::log::{manifest, txn};
use crate::engine::segment::file::{Footer, IndexEntry, SegmentHeader};
use crate::engine::segment::format::{
    ENTRY_LEN, FLAG_END, FOOTER_LEN, FORMAT_VERSION, HDR_BASE_SEQ, HEADER_LEN, IDX_BASE_SEQ, IDX_CRC, IDX_HEADER_LEN,
    IDX_VERSION, INDEX_MAGIC,
};
use crate::engine::segment::record::{Decoded, decode_doc, decode_record, find_record};
use crate::error::{Error, Result};

fn get_u16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2).map_or(0, |x| u16::from_le_bytes([x[0], x[1]]))
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).and_then(|x| x.try_into().ok()).map_or(0, u32::from_le_bytes)
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).and_then(|x| x.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// The kinds of file of a data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FileKind {
    /// A segment of a partition's log (`<base>.log`).
    Segment,
    /// A segment's sparse index (`.idx`).
    SparseIndex,
    /// A segment's secondary index (`.six`).
    SecondaryIndex,
    /// A stream's delivery WAL (`wal-<generation>.log`).
    DeliveryWal,
    /// A stream's consumer-group checkpoint (`.ckpt`).
    Checkpoint,
    /// The data directory's stream registry (`MANIFEST`).
    Manifest,
    /// A stream's transaction log (`txn`).
    TxnLog,
}

/// The kind of data file `path` names, by its name; None for any other
/// file (a `LOCK`, a temporary file).
pub fn file_kind(path: &Path) -> Option<FileKind> {
    let name = path.file_name()?.to_str()?;
    Some(match name {
        "MANIFEST" => FileKind::Manifest,
        "txn" => FileKind::TxnLog,
        n if n.starts_with("wal-") && n.ends_with(".log") => FileKind::DeliveryWal,
        n if n.ends_with(".ckpt") => FileKind::Checkpoint,
        n if n.ends_with(".six") => FileKind::SecondaryIndex,
        n if n.ends_with(".idx") => FileKind::SparseIndex,
        n if n.ends_with(".log") => FileKind::Segment,
        _ => return None,
    })
}

/// One thing found wrong in a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// Where in the file.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

/// What reading one file found: its decoded parts and its problems.
#[derive(Debug, Default, Clone, Serialize)]
#[non_exhaustive]
pub struct FileReport {
    /// The decoded header (JSON; null when there is none).
    pub header: Value,
    /// The records listed (at most the limit asked for), decoded.
    pub records: Vec<Value>,
    /// Records seen (listed or not).
    pub count: u64,
    /// The decoded trailer or footer (null when there is none).
    pub trailer: Value,
    /// Damage: what the engine refuses or reports as `Corrupt`.
    pub problems: Vec<Finding>,
    /// What the engine's recovery would repair on its own at the next
    /// open: a torn tail it cuts (a crash mid-write), not damage.
    pub warnings: Vec<Finding>,
    /// A segment that ends with a footer.
    pub sealed: bool,
}

impl FileReport {
    pub(crate) fn problem(&mut self, offset: u64, reason: impl std::fmt::Display) {
        self.problems.push(Finding { offset, reason: reason.to_string() });
    }
    pub(crate) fn warning(&mut self, offset: u64, reason: impl std::fmt::Display) {
        self.warnings.push(Finding { offset, reason: reason.to_string() });
    }
    fn record(&mut self, limit: usize, v: impl FnOnce() -> Value) {
        if self.records.len() < limit {
            self.records.push(v());
        }
        self.count += 1;
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| StorageError::Io { op: "read", file: path.to_owned(), source }.into())
}

/// Checks the bytes of a data file of `kind` named `name` (a segment's name
/// gives its base sequence when its header is damaged), listing at most
/// `limit` records.
pub fn check(kind: FileKind, b: &[u8], name: &str, limit: usize) -> FileReport {
    let mut r = FileReport::default();
    match kind {
        FileKind::Segment => segment(b, name, &mut r, limit),
        FileKind::SparseIndex => sparse_index(b, name, &mut r, limit),
        FileKind::SecondaryIndex => secondary_index(b, &mut r, limit),
        FileKind::DeliveryWal => delivery_wal(b, &mut r, limit),
        FileKind::Checkpoint => checkpoint_file(b, &mut r),
        FileKind::Manifest => manifest_file(b, &mut r),
        FileKind::TxnLog => txn_file(b, &mut r, limit),
    }
    r
}

/// The offset of the first non-zero byte of `b[from..]`, if any.
fn non_zero_after(b: &[u8], from: usize) -> Option<u64> {
    b.get(from..)?.iter().position(|&x| x != 0).map(|i| (from + i) as u64)
}

/// A segment: every record checked; after damage the check goes on at the
/// next valid record, so every damaged stretch is reported. A sealed
/// segment (ending with a footer) is checked up to its footer and any damage
/// is a problem. In the active one (no footer), what the engine's recovery
/// cuts at the next open (a torn tail: damage with no valid record after it,
/// bytes after the zeros that end the records, an append cut short) is a
/// warning; damage followed by valid records is a problem (the open refuses
/// it).
fn segment(b: &[u8], name: &str, r: &mut FileReport, limit: usize) {
    let name_base = name.split('.').next().and_then(|n| n.parse::<u64>().ok());
    let h = match SegmentHeader::decode(b) {
        Ok(h) => {
            r.header = json!({"partition": h.partition, "stream_id": h.stream_id, "base_seq": h.base_seq,
                "created_ms": h.created_ms, "created": crate::Timestamp::from_millis(h.created_ms).to_string()});
            h
        }
        Err(e) if b.len() >= HEADER_LEN && !matches!(e, DecodeError::Version { .. }) => {
            // The records are still checked, from the base sequence the
            // file's name gives (as the engine reads a sealed segment).
            r.problem(0, e.to_string());
            let Some(base_seq) = name_base.filter(|&n| n >= 1) else { return };
            SegmentHeader { partition: 0, stream_id: 0, base_seq, created_ms: 0 }
        }
        Err(e) => return r.problem(0, e.to_string()),
    };
    if name_base.is_some_and(|n| n != h.base_seq) {
        r.problem(HDR_BASE_SEQ as u64, format!("base sequence {} differs from the file name", h.base_seq));
    }
    // Sealed: the last 64 bytes are its footer.
    let footer_at = b.len().checked_sub(FOOTER_LEN).filter(|&at| at >= HEADER_LEN);
    let sealed = footer_at
        .and_then(|at| {
            Footer::decode(&b[at..]).ok().filter(|f| f.records_end == at as u64 && f.first_seq == h.base_seq)
        })
        .is_some();
    r.sealed = sealed;
    let end = if sealed { footer_at.unwrap_or(b.len()) } else { b.len() };
    let mut off = HEADER_LEN;
    let mut expected = h.base_seq;
    // Where the last append that ends with an END record ends, and its last sequence.
    let (mut append_end, mut last_end_seq) = (HEADER_LEN, h.base_seq - 1);
    let damaged_before = r.problems.len();
    while off < end {
        let reason = match decode_record(&b[off..end]) {
            Decoded::Record { header, doc, size } if header.seq == expected => {
                // A document that parses has a payload that decodes (checked whole).
                match decode_doc(doc) {
                    Ok(d) => r.record(limit, || {
                        json!({"offset": off, "size": size, "seq": header.seq, "ts": header.ts,
                            "timestamp": crate::Timestamp::from_millis(header.ts).to_string(),
                            "flags": header.flags, "txn": header.txn, "id": d.id(), "key": d.key(), "type": d.event_type(),
                            "metadata": d.metadata(), "payload": d.payload()})
                    }),
                    Err(e) => r.problem(off as u64, e),
                }
                off += size;
                expected = header.seq.saturating_add(1);
                if header.flags & FLAG_END != 0 {
                    (append_end, last_end_seq) = (off, header.seq);
                }
                continue;
            }
            Decoded::Record { header, .. } => format!("record sequence {} where {expected} was expected", header.seq),
            Decoded::End if sealed => format!("zeros where record {expected} was expected, before the footer"),
            Decoded::End => {
                if let Some(at) = non_zero_after(b, off) {
                    r.warning(at, "torn tail: bytes after the zeros that end the records (the next open cuts them)");
                }
                break;
            }
            Decoded::Footer if sealed => "a footer magic inside the records".to_owned(),
            Decoded::Footer => {
                r.warning(off as u64, "torn tail: a footer cut short (a crash while sealing; the next open cuts it)");
                break;
            }
            Decoded::Incomplete(_) if sealed => "record runs past the footer".to_owned(),
            Decoded::Incomplete(_) => "record cut short by the end of the file".to_owned(),
            Decoded::Invalid(reason) => reason.to_owned(),
        };
        // Damage at `off`: go on at the next valid record, if any.
        let limit_seq = expected.saturating_add(1 << 24);
        match find_record(&b[..end], off + 1, expected.saturating_add(1), limit_seq) {
            Some((at, next)) => {
                let lost = if next.seq > expected + 1 {
                    format!("; sequences {expected} to {} are unreadable", next.seq - 1)
                } else {
                    format!("; sequence {expected} is unreadable")
                };
                r.problem(off as u64, format!("{reason}{lost}, valid records resume at offset {at}"));
                off = at;
                expected = next.seq;
            }
            None if sealed => {
                r.problem(off as u64, format!("{reason}; nothing after it up to the footer can be read"));
                break;
            }
            None => {
                let dropped = b[off..].iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
                r.warning(off as u64, format!("torn tail: {reason} (the next open cuts {dropped} bytes here)"));
                off = end;
                break;
            }
        }
    }
    if sealed {
        if r.problems.len() == damaged_before {
            footer(b, end, h.base_seq, r);
        } else {
            r.trailer = json!({"offset": end});
        }
    } else if r.problems.len() == damaged_before && r.warnings.is_empty() && append_end < off {
        r.warning(
            append_end as u64,
            format!(
                "torn tail: the last append has no END record (the next open drops sequences {} on)",
                last_end_seq + 1
            ),
        );
    }
}

fn footer(b: &[u8], off: usize, base_seq: u64, r: &mut FileReport) {
    let f = match Footer::decode(&b[off..]) {
        Ok(f) => f,
        Err(e) => return r.problem(off as u64, e.to_string()),
    };
    r.trailer = json!({"offset": off, "records_end": f.records_end, "first_seq": f.first_seq,
        "last_seq": f.last_seq, "count": f.count, "max_ts": f.max_ts});
    if f.records_end != off as u64 || f.first_seq != base_seq || f.count != r.count {
        r.problem(
            off as u64,
            format!(
                "footer says records end at {} with {} records from {}; found {} records ending at {off} from {base_seq}",
                f.records_end, f.count, f.first_seq, r.count
            ),
        );
    }
    if b.len() > off + FOOTER_LEN {
        r.problem((off + FOOTER_LEN) as u64, "bytes after the footer");
    }
}

fn sparse_index(b: &[u8], name: &str, r: &mut FileReport, limit: usize) {
    if b.len() < IDX_HEADER_LEN || b[..8] != INDEX_MAGIC {
        return r.problem(0, "not a sparse index file (bad magic or shorter than its header)");
    }
    let version = get_u16(b, IDX_VERSION);
    if version != FORMAT_VERSION {
        return r.problem(0, format!("index format version {version} is not supported"));
    }
    if crc32fast::hash(&b[..IDX_CRC]) != get_u32(b, IDX_CRC) {
        return r.problem(IDX_CRC as u64, "index header checksum mismatch");
    }
    let base_seq = get_u64(b, IDX_BASE_SEQ);
    r.header = json!({"base_seq": base_seq});
    if name.split('.').next().and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n != base_seq) {
        r.problem(IDX_BASE_SEQ as u64, format!("base sequence {base_seq} differs from the file name"));
    }
    let mut off = IDX_HEADER_LEN;
    while let Some(chunk) = b.get(off..off + ENTRY_LEN) {
        if chunk.iter().all(|&x| x == 0) {
            if let Some(at) = non_zero_after(b, off) {
                r.problem(at, "non-zero bytes after the end of the entries");
            }
            return;
        }
        let Some(e) = IndexEntry::decode(chunk) else {
            return r.problem(off as u64, "index entry checksum mismatch");
        };
        r.record(limit, || {
            json!({"offset": off, "seq": e.seq, "record_offset": e.offset,
                "max_ts_before": e.max_ts_before, "max_txn_before": e.max_txn_before})
        });
        off += ENTRY_LEN;
    }
    if off < b.len() && non_zero_after(b, off).is_some() {
        r.problem(off as u64, "index entry cut short by the end of the file");
    }
}

fn secondary_index(b: &[u8], r: &mut FileReport, limit: usize) {
    match six::decode_all(b) {
        Ok((meta, terms)) => {
            let h = meta.header;
            r.header = json!({"partition": h.partition, "stream_id": h.stream_id, "base_seq": h.base_seq,
                "last_seq": h.last_seq, "records_end": h.records_end, "max_ts": h.max_ts,
                "fields": meta.fields, "blocks": meta.blocks.len(), "record_offsets": meta.offsets});
            for (key, seqs) in terms {
                let field = key
                    .get(..2)
                    .and_then(|o| meta.fields.get(usize::from(u16::from_be_bytes([o[0], o[1]]))))
                    .cloned()
                    .unwrap_or_default();
                r.record(limit, || {
                    let value_key: String = key.iter().skip(2).map(|x| format!("{x:02x}")).collect();
                    json!({"field": field, "value_key_hex": value_key, "sequences": seqs})
                });
            }
        }
        // Each problem where it is: the header field, the trailer, the
        // directory, each block (a bad one does not hide the next), each
        // record offset. (Index files are derived data: the engine rebuilds
        // a damaged one.)
        Err(_) => {
            for (offset, reason) in six::verify(b) {
                r.problem(offset, format!("{reason} (derived data: the engine rebuilds this file)"));
            }
        }
    }
}

/// A delivery WAL: every record checked; after damage the check goes on at
/// the next valid record (a frame whose checksum holds and whose body
/// decodes, with a later LSN). Damage with nothing valid after it is a torn
/// tail, which the next open cuts when this is the newest generation (a
/// warning; `verify` makes it a problem for an older one); damage followed
/// by valid records, or a checksummed record that does not decode, is a
/// problem.
fn delivery_wal(b: &[u8], r: &mut FileReport, limit: usize) {
    let generation = match wal::check_header(b) {
        Ok(g) => g,
        Err(e) => return r.problem(0, e.to_string()),
    };
    r.header = json!({"generation": generation, "version": wal::version_of(b)});
    let mut off = wal::WAL_HEADER_LEN;
    let mut last_lsn = 0;
    loop {
        let reason = match wal_record_at(b, off) {
            WalAt::End => return,
            WalAt::Record { value, size, lsn } => {
                r.record(limit, || {
                    let mut v = value;
                    v["offset"] = json!(off);
                    v
                });
                if last_lsn != 0 && lsn != last_lsn + 1 {
                    r.problem(off as u64, format!("LSN {lsn} where {} was expected", last_lsn + 1));
                }
                last_lsn = lsn;
                off += size;
                continue;
            }
            WalAt::Undecodable(reason) => {
                // Whole and checksummed: not a torn write.
                r.problem(off as u64, format!("a checksummed record that does not decode: {reason}"));
                match next_wal_record(b, off + 1, last_lsn) {
                    Some(at) => {
                        off = at;
                        continue;
                    }
                    None => return,
                }
            }
            WalAt::Damaged(reason) => reason,
        };
        match next_wal_record(b, off + 1, last_lsn) {
            Some(at) => {
                r.problem(off as u64, format!("{reason}, followed by valid records (from offset {at})"));
                off = at;
            }
            None => {
                let dropped = b[off..].iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
                r.warning(off as u64, format!("torn tail: {reason} (the next open cuts {dropped} bytes here)"));
                return;
            }
        }
    }
}

/// What is at an offset of a WAL file.
enum WalAt {
    /// The end of the records: the end of the file, or zeros to it.
    End,
    Record {
        value: Value,
        size: usize,
        lsn: u64,
    },
    /// A whole, checksummed record whose body does not decode.
    Undecodable(String),
    /// Not a record.
    Damaged(String),
}

fn wal_record_at(b: &[u8], off: usize) -> WalAt {
    let Some(frame) = b.get(off..off + wal::WAL_FRAME_LEN) else {
        return match non_zero_after(b, off) {
            Some(_) => WalAt::Damaged("a frame cut short by the end of the file".into()),
            None => WalAt::End,
        };
    };
    let len = get_u32(frame, 0);
    if len == 0 {
        return match non_zero_after(b, off) {
            Some(at) => WalAt::Damaged(format!("non-zero bytes (at offset {at}) after the zeros that end the log")),
            None => WalAt::End,
        };
    }
    if len > wal::WAL_MAX_BODY {
        return WalAt::Damaged(format!("record length {len} exceeds {}", wal::WAL_MAX_BODY));
    }
    let start = off + wal::WAL_FRAME_LEN;
    let Some(body) = b.get(start..start + len as usize) else {
        return WalAt::Damaged("a record cut short by the end of the file".into());
    };
    if crc32fast::hash(body) != get_u32(frame, 4) {
        return WalAt::Damaged("record checksum mismatch".into());
    }
    match wal_body(body) {
        Ok(value) => WalAt::Record { value, size: wal::WAL_FRAME_LEN + len as usize, lsn: get_u64(body, 0) },
        Err(e) => WalAt::Undecodable(e),
    }
}

/// The offset of the next valid WAL record at or after `from` with an LSN
/// above `after_lsn`.
fn next_wal_record(b: &[u8], from: usize, after_lsn: u64) -> Option<usize> {
    // Cheap checks first (a length that fits, a plausible LSN and kind), so
    // that only likely starts are checksummed.
    let plausible = |at: usize| {
        let len = get_u32(b, at) as usize;
        let body = at + wal::WAL_FRAME_LEN;
        let lsn = get_u64(b, body);
        len >= wal::WAL_BODY_NAME
            && len <= wal::WAL_MAX_BODY as usize
            && body + len <= b.len()
            && lsn > after_lsn
            && lsn - after_lsn <= 1 << 24
            && matches!(b[body + wal::WAL_BODY_KIND], wal::KIND_CREATE | wal::KIND_OPS)
    };
    (from..b.len().saturating_sub(wal::WAL_FRAME_LEN + wal::WAL_BODY_NAME))
        .find(|&at| plausible(at) && matches!(wal_record_at(b, at), WalAt::Record { lsn, .. } if lsn > after_lsn))
}

/// A WAL record body as JSON: LSN, kind, group, and its MessagePack payload.
fn wal_body(body: &[u8]) -> Result<Value, String> {
    if body.len() < wal::WAL_BODY_NAME {
        return Err(format!("record body of {} bytes is shorter than its fixed fields", body.len()));
    }
    let lsn = get_u64(body, 0);
    let kind = match body[wal::WAL_BODY_KIND] {
        wal::KIND_CREATE => "create",
        wal::KIND_OPS => "ops",
        k => return Err(format!("unknown record kind {k}")),
    };
    let name_end = wal::WAL_BODY_NAME + usize::from(get_u16(body, wal::WAL_BODY_NAME_LEN));
    let name = body.get(wal::WAL_BODY_NAME..name_end).ok_or("group name runs past the record")?;
    let group = std::str::from_utf8(name).map_err(|_| "group name is not UTF-8")?;
    let payload = rmp_serde::from_slice::<AnyValue>(&body[name_end..])
        .map_err(|e| format!("record payload does not decode: {e}"))?
        .0;
    Ok(json!({"lsn": lsn, "kind": kind, "group": group, "payload": payload}))
}

fn checkpoint_file(b: &[u8], r: &mut FileReport) {
    let (generation, lsn, body_len) = match checkpoint::check_header(b) {
        Ok(h) => h,
        Err(e) => return r.problem(0, e),
    };
    r.header = json!({"generation": generation, "lsn": lsn, "body_len": body_len});
    if let Err(e) = checkpoint::inspect(b) {
        return r.problem(checkpoint::CKPT_HEADER_LEN as u64, e);
    }
    match rmp_serde::from_slice::<AnyValue>(&b[checkpoint::CKPT_HEADER_LEN..]) {
        Ok(AnyValue(groups)) => {
            r.header["groups"] = json!(groups.as_array().map_or(0, Vec::len));
            r.trailer = json!({"groups": groups});
        }
        Err(e) => r.problem(checkpoint::CKPT_HEADER_LEN as u64, format!("checkpoint body: {e}")),
    }
}

fn manifest_file(b: &[u8], r: &mut FileReport) {
    match manifest::decode(b) {
        Ok(body) => {
            r.header = serde_json::to_value(&body).unwrap_or(Value::Null);
        }
        Err((offset, reason)) => r.problem(offset, reason),
    }
}

fn txn_file(b: &[u8], r: &mut FileReport, limit: usize) {
    if let Err(e) = txn::check_header(b) {
        return r.problem(0, e);
    }
    let (last, valid) = txn::decode(b);
    r.header = json!({"last_committed": last});
    let mut off = txn::TXN_RECORD_LEN;
    while off + txn::TXN_RECORD_LEN <= usize::try_from(valid).unwrap_or(0) {
        let id = get_u64(b, off);
        r.record(limit, || json!({"offset": off, "txn": id}));
        off += txn::TXN_RECORD_LEN;
    }
    if let Some(at) = non_zero_after(b, off) {
        r.problem(at.min(off as u64), "transaction entry checksum mismatch or ids out of order");
    }
}

/// Any MessagePack value as JSON (byte strings become arrays of numbers),
/// for dumping payloads whose Rust types are internal to the engine.
struct AnyValue(Value);

impl<'de> serde::Deserialize<'de> for AnyValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(AnyVisitor).map(AnyValue)
    }
}

struct AnyVisitor;

impl<'de> serde::de::Visitor<'de> for AnyVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any MessagePack value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(json!(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(json!(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(json!(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Value, E> {
        Ok(json!(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(AnyVisitor)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(AnyValue(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some((AnyValue(k), AnyValue(v))) = map.next_entry()? {
            let key = match k {
                Value::String(s) => s,
                other => other.to_string(),
            };
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Reads and checks one data file (its kind by its name), listing at most
/// `limit` records. `InvalidArgument` for a file whose name is not one of a
/// data directory's; a read that fails names the file.
pub fn inspect_file(path: &Path, limit: usize) -> Result<(FileKind, usize, FileReport)> {
    let kind = file_kind(path).ok_or_else(|| {
        Error::invalid(
            "file",
            format!(
                "{}: not a data file this tool knows (.log, .idx, .six, wal-*.log, .ckpt, MANIFEST, txn)",
                path.display()
            ),
        )
    })?;
    let b = read_file(path)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    Ok((kind, b.len(), check(kind, &b, name, limit)))
}

/// One finding of [`verify_dir`], with its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct FileFinding {
    /// The file.
    pub file: PathBuf,
    /// Its kind.
    pub kind: FileKind,
    /// Where in the file.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

/// What [`verify_dir`] found in a data directory.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DirReport {
    /// The directory.
    pub dir: PathBuf,
    /// Data files checked.
    pub files: usize,
    /// Records seen in them.
    pub records: u64,
    /// Damage (the directory is not ok when there is any).
    pub problems: Vec<FileFinding>,
    /// What the next open repairs on its own (a torn tail).
    pub warnings: Vec<FileFinding>,
}

impl DirReport {
    /// True when nothing is damaged (warnings are repaired by the next open).
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Every data file under `dir`, sorted, skipping temporary files.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|source| Error::from(StorageError::Io { op: "list", file: dir.to_owned(), source }))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            walk(&p, out)?;
        } else if file_kind(&p).is_some() {
            out.push(p);
        }
    }
    Ok(())
}

/// Checks every data file under `dir`. Only the newest file of its kind in
/// its directory may have a torn tail (the last segment of a partition, the
/// newest WAL generation) and only the last segment may be unsealed: in any
/// other file that is damage. `InvalidArgument` for a path that is not a
/// directory, or a directory with no data file (a wrong path).
pub fn verify_dir(dir: &Path) -> Result<DirReport> {
    if !dir.is_dir() {
        return Err(Error::invalid("dir", format!("{} is not a directory", dir.display())));
    }
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    if files.is_empty() {
        return Err(Error::invalid(
            "dir",
            format!(
                "{} holds no Rheo data file (no MANIFEST, segments or WAL): is it a native data directory?",
                dir.display()
            ),
        ));
    }
    let mut report =
        DirReport { dir: dir.to_owned(), files: files.len(), records: 0, problems: Vec::new(), warnings: Vec::new() };
    let entry = |path: &Path, kind: FileKind, p: &Finding| FileFinding {
        file: path.to_owned(),
        kind,
        offset: p.offset,
        reason: p.reason.clone(),
    };
    if !files.iter().any(|f| file_kind(f) == Some(FileKind::Manifest)) {
        report.problems.push(FileFinding {
            file: dir.join("MANIFEST"),
            kind: FileKind::Manifest,
            offset: 0,
            reason: "missing: the directory has data files but no MANIFEST".into(),
        });
    }
    for path in &files {
        let Some(kind) = file_kind(path) else { continue };
        let b = read_file(path)?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let mut r = check(kind, &b, name, 0);
        report.records += r.count;
        let newest = is_newest_of_its_kind(path, kind, &files);
        if matches!(kind, FileKind::Segment) && !r.sealed && !newest {
            r.problem(
                b.len().saturating_sub(FOOTER_LEN) as u64,
                "no valid footer, though a later segment exists: the footer is damaged (the default open \
                 takes the bounds from the next segment; strict refuses it)",
            );
        }
        if !newest {
            let torn = std::mem::take(&mut r.warnings);
            r.problems.extend(torn.into_iter().map(|w| Finding {
                offset: w.offset,
                reason: format!("{} (damage: not the newest file of its kind)", w.reason),
            }));
        }
        report.problems.extend(r.problems.iter().map(|p| entry(path, kind, p)));
        report.warnings.extend(r.warnings.iter().map(|p| entry(path, kind, p)));
    }
    Ok(report)
}

/// True when `path` is the last segment of its partition, or the newest WAL
/// generation of its groups directory (names sort by number), or a file of
/// another kind.
fn is_newest_of_its_kind(path: &Path, kind: FileKind, files: &[PathBuf]) -> bool {
    if !matches!(kind, FileKind::Segment | FileKind::DeliveryWal) {
        return true;
    }
    let parent = path.parent();
    files.iter().filter(|f| f.parent() == parent && file_kind(f) == Some(kind)).max().is_none_or(|last| last == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_kinds_by_name() {
        assert_eq!(file_kind(Path::new("a/00001/00000000000000000001.log")), Some(FileKind::Segment));
        assert_eq!(file_kind(Path::new("groups/wal-00000000000000000001.log")), Some(FileKind::DeliveryWal));
        assert_eq!(file_kind(Path::new("x.six")), Some(FileKind::SecondaryIndex));
        assert_eq!(file_kind(Path::new("x.six.tmp")), None);
        assert_eq!(file_kind(Path::new("LOCK")), None);
    }
}
