//! `rheo inspect` and `rheo verify`: read a native data directory's files
//! directly (never through the engine, which would repair them), decode
//! them, and check every checksum.

use std::path::{Path, PathBuf};

use clap::Args;
use rheo::engine::delivery::{checkpoint, wal};
use rheo::engine::index::file as six;
use rheo::engine::log::{manifest, txn};
use rheo::engine::segment::file::{Footer, IndexEntry, SegmentHeader};
use rheo::engine::segment::format::{
    ENTRY_LEN, FOOTER_LEN, FORMAT_VERSION, HDR_BASE_SEQ, HEADER_LEN, IDX_BASE_SEQ, IDX_CRC, IDX_HEADER_LEN,
    IDX_VERSION, INDEX_MAGIC,
};
use rheo::engine::segment::record::{Decoded, decode_doc, decode_record};
use serde::Serialize;
use serde_json::{Value, json};

use super::output::{line, print_json};
use super::{CliError, CliResult, Ctx};

fn get_u16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2).map_or(0, |x| u16::from_le_bytes([x[0], x[1]]))
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).and_then(|x| x.try_into().ok()).map_or(0, u32::from_le_bytes)
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).and_then(|x| x.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// The most records `inspect` lists from one file unless `--all`.
const INSPECT_RECORDS_DEFAULT: usize = 1000;

/// Arguments of `rheo inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A segment `.log`, sparse index `.idx`, secondary index `.six`,
    /// delivery WAL `wal-*.log`, checkpoint `.ckpt`, `MANIFEST` or `txn`.
    file: PathBuf,
    /// The most records to list.
    #[arg(long, default_value_t = INSPECT_RECORDS_DEFAULT)]
    limit: usize,
}

/// Arguments of `rheo verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The data directory (default: the `--backend` path when it is
    /// `native:PATH`).
    dir: Option<PathBuf>,
}

/// The kinds of file of a data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Segment,
    SparseIndex,
    SecondaryIndex,
    DeliveryWal,
    Checkpoint,
    Manifest,
    TxnLog,
}

fn kind_of(path: &Path) -> Option<Kind> {
    let name = path.file_name()?.to_str()?;
    Some(match name {
        "MANIFEST" => Kind::Manifest,
        "txn" => Kind::TxnLog,
        n if n.starts_with("wal-") && n.ends_with(".log") => Kind::DeliveryWal,
        n if n.ends_with(".ckpt") => Kind::Checkpoint,
        n if n.ends_with(".six") => Kind::SecondaryIndex,
        n if n.ends_with(".idx") => Kind::SparseIndex,
        n if n.ends_with(".log") => Kind::Segment,
        _ => return None,
    })
}

/// One problem found in a file.
#[derive(Debug, Serialize)]
struct Problem {
    offset: u64,
    reason: String,
}

/// What reading one file found: its decoded parts and its problems.
#[derive(Debug, Default)]
struct Report {
    header: Value,
    records: Vec<Value>,
    /// Records seen (listed or not).
    count: u64,
    trailer: Value,
    problems: Vec<Problem>,
}

impl Report {
    fn problem(&mut self, offset: u64, reason: impl Into<String>) {
        self.problems.push(Problem { offset, reason: reason.into() });
    }
    fn record(&mut self, limit: usize, v: impl FnOnce() -> Value) {
        if self.records.len() < limit {
            self.records.push(v());
        }
        self.count += 1;
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| CliError::new(format!("cannot read {}: {e}", path.display())))
}

fn check(kind: Kind, b: &[u8], name: &str, limit: usize) -> Report {
    let mut r = Report::default();
    match kind {
        Kind::Segment => segment(b, name, &mut r, limit),
        Kind::SparseIndex => sparse_index(b, name, &mut r, limit),
        Kind::SecondaryIndex => secondary_index(b, &mut r, limit),
        Kind::DeliveryWal => delivery_wal(b, &mut r, limit),
        Kind::Checkpoint => checkpoint_file(b, &mut r),
        Kind::Manifest => manifest_file(b, &mut r),
        Kind::TxnLog => txn_file(b, &mut r, limit),
    }
    r
}

/// The offset of the first non-zero byte of `b[from..]`, if any.
fn non_zero_after(b: &[u8], from: usize) -> Option<u64> {
    b.get(from..)?.iter().position(|&x| x != 0).map(|i| (from + i) as u64)
}

fn segment(b: &[u8], name: &str, r: &mut Report, limit: usize) {
    let h = match SegmentHeader::decode(b) {
        Ok(h) => h,
        Err(e) => return r.problem(0, e.to_string()),
    };
    r.header = json!({"partition": h.partition, "stream_id": h.stream_id, "base_seq": h.base_seq,
        "created_ms": h.created_ms, "created": rheo::Timestamp::from_millis(h.created_ms).to_string()});
    if name.split('.').next().and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n != h.base_seq) {
        r.problem(HDR_BASE_SEQ as u64, format!("base sequence {} differs from the file name", h.base_seq));
    }
    let mut off = HEADER_LEN;
    let mut expected = h.base_seq;
    while let Some(rest) = b.get(off..).filter(|r| !r.is_empty()) {
        match decode_record(rest) {
            Decoded::Record { header, doc, size } => {
                if header.seq != expected {
                    r.problem(off as u64, format!("record sequence {} where {expected} was expected", header.seq));
                }
                expected = header.seq.saturating_add(1);
                match decode_doc(doc) {
                    Ok((id, key, event_type, metadata, payload)) => r.record(limit, || {
                        json!({"offset": off, "size": size, "seq": header.seq, "ts": header.ts,
                            "timestamp": rheo::Timestamp::from_millis(header.ts).to_string(),
                            "flags": header.flags, "txn": header.txn, "id": id, "key": key, "type": event_type,
                            "metadata": metadata, "payload": payload})
                    }),
                    Err(e) => r.problem(off as u64, e),
                }
                off += size;
            }
            Decoded::End => {
                if let Some(at) = non_zero_after(b, off) {
                    r.problem(at, "non-zero bytes after the end of the records");
                }
                break;
            }
            Decoded::Footer => {
                footer(b, off, h.base_seq, r);
                break;
            }
            Decoded::Incomplete(_) => {
                r.problem(off as u64, "record cut short by the end of the file (torn write)");
                break;
            }
            Decoded::Invalid(reason) => {
                r.problem(off as u64, reason);
                break;
            }
        }
    }
}

fn footer(b: &[u8], off: usize, base_seq: u64, r: &mut Report) {
    let f = match Footer::decode(&b[off..]) {
        Ok(f) => f,
        Err(e) => return r.problem(off as u64, e),
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

fn sparse_index(b: &[u8], name: &str, r: &mut Report, limit: usize) {
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

fn secondary_index(b: &[u8], r: &mut Report, limit: usize) {
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
        // The file format locates damage by block, not by byte: the report
        // names the file and says what does not check out.
        Err(e) => r.problem(0, e.to_string()),
    }
}

fn delivery_wal(b: &[u8], r: &mut Report, limit: usize) {
    let generation = match wal::check_header(b) {
        Ok(g) => g,
        Err(e) => return r.problem(0, e.to_string()),
    };
    r.header = json!({"generation": generation});
    let mut off = wal::WAL_HEADER_LEN;
    loop {
        let Some(frame) = b.get(off..off + wal::WAL_FRAME_LEN) else {
            if let Some(at) = non_zero_after(b, off) {
                r.problem(at, "a frame cut short by the end of the file");
            }
            return;
        };
        let len = get_u32(frame, 0);
        if len == 0 {
            if let Some(at) = non_zero_after(b, off) {
                r.problem(at, "non-zero bytes after the end of the log");
            }
            return;
        }
        if len > wal::WAL_MAX_BODY {
            return r.problem(off as u64, format!("record length {len} exceeds {}", wal::WAL_MAX_BODY));
        }
        let start = off + wal::WAL_FRAME_LEN;
        let Some(body) = b.get(start..start + len as usize) else {
            return r.problem(off as u64, "a record cut short by the end of the file (torn write)");
        };
        if crc32fast::hash(body) != get_u32(frame, 4) {
            return r.problem(off as u64, "record checksum mismatch");
        }
        match wal_body(body) {
            Ok(v) => r.record(limit, || {
                let mut v = v;
                v["offset"] = json!(off);
                v
            }),
            Err(e) => r.problem(off as u64, e),
        }
        off = start + len as usize;
    }
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

fn checkpoint_file(b: &[u8], r: &mut Report) {
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

fn manifest_file(b: &[u8], r: &mut Report) {
    match manifest::decode(b) {
        Ok(body) => {
            r.header = serde_json::to_value(&body).unwrap_or(Value::Null);
        }
        Err((offset, reason)) => r.problem(offset, reason),
    }
}

fn txn_file(b: &[u8], r: &mut Report, limit: usize) {
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

/// Runs `rheo inspect FILE`.
pub fn inspect(ctx: &Ctx, a: InspectArgs) -> CliResult {
    let kind = kind_of(&a.file).ok_or_else(|| {
        CliError::new(format!(
            "{}: not a data file this tool knows (.log, .idx, .six, wal-*.log, .ckpt, MANIFEST, txn)",
            a.file.display()
        ))
    })?;
    let b = read_file(&a.file)?;
    let name = a.file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let r = check(kind, &b, name, a.limit);
    if ctx.json {
        print_json(&json!({"file": a.file.display().to_string(), "kind": kind, "bytes": b.len(),
            "header": r.header, "records": r.records, "record_count": r.count, "trailer": r.trailer,
            "problems": r.problems}))?;
    } else {
        line(format!("{} ({kind:?}, {} bytes)", a.file.display(), b.len()))?;
        line(format!("header: {}", r.header))?;
        for rec in &r.records {
            line(format!("  {rec}"))?;
        }
        if r.count > r.records.len() as u64 {
            line(format!("  ... {} more (use --limit)", r.count - r.records.len() as u64))?;
        }
        line(format!("records: {}", r.count))?;
        if !r.trailer.is_null() {
            line(format!("trailer: {}", r.trailer))?;
        }
        for p in &r.problems {
            line(format!("problem at offset {}: {}", p.offset, p.reason))?;
        }
    }
    Ok(r.problems.is_empty())
}

/// Every data file under `dir`, sorted, skipping temporary files.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), CliError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CliError::new(format!("cannot read {}: {e}", dir.display())))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            walk(&p, out)?;
        } else if kind_of(&p).is_some() {
            out.push(p);
        }
    }
    Ok(())
}

/// Runs `rheo verify [DIR]`: every problem on one line `file offset reason`
/// (or under `--json` one document); exit 1 when any was found.
pub fn verify(ctx: &Ctx, a: VerifyArgs) -> CliResult {
    let dir = match a.dir {
        Some(d) => d,
        None => native_dir(&ctx.backend)?,
    };
    if !dir.is_dir() {
        return Err(CliError::new(format!("{} is not a directory", dir.display())));
    }
    let mut files = Vec::new();
    walk(&dir, &mut files)?;
    let mut problems = Vec::new();
    let mut records = 0u64;
    for path in &files {
        let Some(kind) = kind_of(path) else { continue };
        let b = read_file(path)?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let r = check(kind, &b, name, 0);
        records += r.count;
        for p in r.problems {
            problems.push(
                json!({"file": path.display().to_string(), "kind": kind, "offset": p.offset, "reason": p.reason}),
            );
        }
    }
    let ok = problems.is_empty();
    if ctx.json {
        print_json(&json!({"dir": dir.display().to_string(), "files": files.len(), "records": records,
            "ok": ok, "problems": problems}))?;
    } else {
        for p in &problems {
            let s = |k: &str| p[k].as_str().unwrap_or("").to_owned();
            line(format!("{} {} {}", s("file"), p["offset"], s("reason")))?;
        }
        let verdict = if ok { "ok".to_owned() } else { format!("{} problem(s)", problems.len()) };
        line(format!("checked {} files, {records} records in {}: {verdict}", files.len(), dir.display()))?;
    }
    Ok(ok)
}

/// The directory of a `native:PATH[?options]` URL.
fn native_dir(backend: &str) -> Result<PathBuf, CliError> {
    let path = backend.strip_prefix("native:").ok_or_else(|| {
        CliError::new(format!("verify reads a native data directory; give DIR (the backend is {backend:?})"))
    })?;
    Ok(PathBuf::from(path.split('?').next().unwrap_or(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_kinds_by_name() {
        assert_eq!(kind_of(Path::new("a/00001/00000000000000000001.log")), Some(Kind::Segment));
        assert_eq!(kind_of(Path::new("groups/wal-00000000000000000001.log")), Some(Kind::DeliveryWal));
        assert_eq!(kind_of(Path::new("x.six")), Some(Kind::SecondaryIndex));
        assert_eq!(kind_of(Path::new("x.six.tmp")), None);
        assert_eq!(kind_of(Path::new("LOCK")), None);
    }
}
