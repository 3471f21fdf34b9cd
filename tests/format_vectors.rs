//! The on-disk format's test vectors (`format/vectors/`) and the constants the
//! spec (`format/*.md`) states.
//!
//! * `vectors_decode_as_expected`: every vector file is decoded with the
//!   engine's decoders and compared, field by field, with its `.json`.
//! * `vectors_recover_as_expected`: every segment vector is placed in a
//!   `MemVfs` data directory (with the manifest and transaction log vectors)
//!   and opened with `Engine::open` in each recovery mode: the recovered
//!   records, the truncation report, the rebuilt index or the
//!   `Error::Corrupt { file, offset, .. }` must match the `.json`.
//! * The recovery rules of `format/README.md` on data directories derived
//!   from the vectors: damage followed by valid records whatever field it
//!   hits, bad transaction log headers and a torn last entry, unknown
//!   versions, cut-short segment creation, the recovered index.
//! * `encoders_reproduce_the_vectors`: the engine's encoders still produce
//!   exactly the committed bytes (a format change cannot slip in unnoticed).
//! * `spec_tables_match_the_code`: every field table in `format/*.md` is
//!   contiguous, and every named constant has the value the spec states.
//! * The delivery table (`format/delivery-wal.md`, `format/checkpoint.md`):
//!   its vectors are built and decoded by this file's own implementation of
//!   the spec (its MessagePack payloads are private types of the crate),
//!   decoded by `wal::inspect` / `checkpoint::inspect`, opened with
//!   `Engine::open` in each recovery mode (`delivery_recovery()`, the WAL
//!   after recovery, the recovered state, or `Error::Corrupt`), and used
//!   through the public API; the engine's own encoders must write exactly
//!   what the spec's write (`engine_checkpoint_reproduces_the_vector`,
//!   `engine_writes_the_specified_records`).
//! * The secondary index (`format/secondary-index.md`): its vectors are
//!   written by the engine's own encoder from the terms of a list of events,
//!   decoded with `file::decode_all` and compared with their `.json`,
//!   re-encoded from the JSON, and the corrupt one refused for the reason
//!   its JSON names; the spec's value-key examples and always-indexed fields
//!   are checked against `term`; a `MemVfs` engine builds real files, which
//!   are then damaged, replaced by another segment's, or removed, and the
//!   planner's answers must stay those of a filtered read while the builder
//!   writes them again.
//!
//! The vectors are written once by `generate_vectors` (ignored):
//! `RHEO_WRITE_VECTORS=1 cargo test --test format_vectors generate_vectors -- --ignored`.
//! Regenerate only together with a `FORMAT_VERSION` bump and the spec.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rheo::backends::Backend;
use rheo::backends::native::NativeBackend;
use rheo::engine::delivery::{checkpoint, wal};
use rheo::engine::index::file::{
    self as six, SIX_HEADER_LEN, SIX_MAGIC, SIX_TRAILER_LEN, SIX_VERSION, SixError, SixHeader,
};
use rheo::engine::index::{FieldSet, term};
use rheo::engine::log::manifest::{self, ManifestBody, StreamEntry, StreamSettings};
use rheo::engine::log::stream::Routed;
use rheo::engine::log::txn;
use rheo::engine::segment::file::{Footer, IndexEntry, SegmentHeader, decode_index, encode_index_header};
use rheo::engine::segment::format;
use rheo::engine::segment::format::{
    BODY_DOC, ENTRY_LEN, FLAG_END, FLAG_MULTI, FOOTER_LEN, FOOTER_MAGIC, FORMAT_VERSION, FRAME_LEN, HEADER_LEN,
    IDX_HEADER_LEN, INDEX_INTERVAL_BYTES, INDEX_MAGIC, SEGMENT_MAGIC,
};
use rheo::engine::segment::record::{Decoded, DocRef, RecordHeader, decode_doc, decode_record, encode_record};
use rheo::engine::vfs::{MemVfs, Vfs};
use rheo::engine::{Durability, Engine, EngineOptions, RecoveryMode};
use rheo::{
    AppendOptions, DeadLetterOptions, Error, Event, FetchOptions, GroupOptions, Lease, LeaseRef, ManualClock, Metadata,
    NewEvent, Query, ReplayOptions, ResetOptions, Timestamp,
};
use serde_json::{Value, json};

/// Where the vectors live, relative to the crate root.
const VECTORS: &str = "format/vectors";
/// 2026-01-01T00:00:00Z in ms: every timestamp in the vectors starts here.
const T0: i64 = 1_767_225_600_000;
/// The stream every vector belongs to.
const STREAM: &str = "orders";
const STREAM_ID: u64 = 1;
const STREAM_DIR: &str = "streams/0000000000000001";
const SEGMENT_PATH: &str = "streams/0000000000000001/00000/00000000000000000001.log";
const INDEX_PATH: &str = "streams/0000000000000001/00000/00000000000000000001.idx";
const TXN_PATH: &str = "streams/0000000000000001/txn";
/// The length a preallocated vector is zero-filled to.
const PREALLOCATED_LEN: usize = 8192;

// ------------------------------------------------------------------ helpers

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(VECTORS)
}

fn read_vector(name: &str) -> Vec<u8> {
    let path = vectors_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn read_json(name: &str) -> Value {
    serde_json::from_slice(&read_vector(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).expect("fits in usize")
}

/// A JSON field that must be an unsigned integer.
fn ju(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} is not a u64 in {v}"))
}

/// A JSON field that must be a signed integer.
fn ji(v: &Value, field: &str) -> i64 {
    v[field].as_i64().unwrap_or_else(|| panic!("{field} is not an i64 in {v}"))
}

/// A JSON field that must be a string.
fn js<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_else(|| panic!("{field} is not a string in {v}"))
}

/// The offset where the run of zeros at the end of `b` starts.
fn last_nonzero_end(b: &[u8]) -> usize {
    b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1)
}

// ------------------------------------------------------------ the records

/// One event as the vectors store it.
struct Rec {
    seq: u64,
    ts: i64,
    flags: u8,
    txn: u64,
    id: String,
    key: Option<String>,
    event_type: Option<String>,
    metadata: Value,
    payload: Value,
}

impl Rec {
    fn simple(seq: u64, ts: i64, flags: u8, txn: u64) -> Rec {
        Rec {
            seq,
            ts,
            flags,
            txn,
            id: format!("evt-{seq:04}"),
            key: None,
            event_type: None,
            metadata: json!({}),
            payload: json!({ "n": seq }),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) -> usize {
        let h = RecordHeader { seq: self.seq, ts: self.ts, flags: self.flags, txn: self.txn };
        let meta: Metadata = self.metadata.as_object().cloned().unwrap_or_default();
        // The payload as an append encodes it (keys sorted in every build).
        let payload = rheo::Payload::from_value(&self.payload).bytes();
        let doc = DocRef(&self.id, self.key.as_deref(), self.event_type.as_deref(), &meta, &payload);
        encode_record(out, &h, &doc).expect("record encodes")
    }

    fn doc_json(&self) -> Value {
        json!({
            "id": self.id,
            "key": self.key,
            "type": self.event_type,
            "metadata": self.metadata,
            "payload": self.payload,
        })
    }
}

/// The eight events of the vectors. 1: a single append; 2-3: a two-record
/// batch; 4: key, type, metadata and a nested payload; 5 and 7: this
/// partition's part of multi-partition batches (transactions 1 and 2); 6: a
/// 4 KiB payload, so that the index gets a second point (at 7); 8: a
/// multi-partition batch whose transaction (3) is not committed.
fn events() -> Vec<Rec> {
    let end_multi = FLAG_END | FLAG_MULTI;
    vec![
        Rec::simple(1, T0, FLAG_END, 0),
        Rec::simple(2, T0 + 1, 0, 0),
        Rec::simple(3, T0 + 1, FLAG_END, 0),
        Rec {
            key: Some("customer-7".into()),
            event_type: Some("order_placed".into()),
            metadata: json!({"producer": "checkout", "trace": "4bf92f35"}),
            payload: json!({
                "order": {
                    "id": 42,
                    "lines": [{"sku": "A-1", "qty": 2, "price": 9.5}, {"sku": "B-2", "qty": 1, "price": null}],
                    "paid": true,
                    "discount": -3
                }
            }),
            ..Rec::simple(4, T0 + 2, FLAG_END, 0)
        },
        Rec { key: Some("customer-9".into()), ..Rec::simple(5, T0 + 3, end_multi, 1) },
        Rec {
            event_type: Some("blob".into()),
            payload: json!({ "blob": "x".repeat(4096) }),
            ..Rec::simple(6, T0 + 5, FLAG_END, 0)
        },
        Rec::simple(7, T0 + 4, end_multi, 2),
        Rec::simple(8, T0 + 6, end_multi, 3),
    ]
}

/// A segment's bytes: the header, then `recs`; and each record's offset.
fn segment_bytes(recs: &[Rec]) -> (Vec<u8>, Vec<u64>) {
    let header = SegmentHeader { partition: 0, stream_id: STREAM_ID, base_seq: 1, created_ms: T0 };
    let mut out = header.encode().to_vec();
    let mut offsets = Vec::new();
    for r in recs {
        offsets.push(out.len() as u64);
        r.encode(&mut out);
    }
    (out, offsets)
}

/// The index points the writer adds: at the first append, then at the start
/// of an append when at least `INDEX_INTERVAL_BYTES` were written since the
/// previous point.
fn index_points(recs: &[Rec], offsets: &[u64]) -> Vec<IndexEntry> {
    let headers = recs.iter().map(|r| RecordHeader { seq: r.seq, ts: r.ts, flags: r.flags, txn: r.txn });
    writer_points(headers.zip(offsets.iter().copied()))
}

/// The writer's index points over records given as (header, offset).
fn writer_points(recs: impl IntoIterator<Item = (RecordHeader, u64)>) -> Vec<IndexEntry> {
    let mut out: Vec<IndexEntry> = Vec::new();
    let (mut boundary, mut max_ts, mut max_txn) = (true, i64::MIN, 0);
    for (r, offset) in recs {
        let far = out.last().is_none_or(|p| offset - p.offset >= INDEX_INTERVAL_BYTES);
        if boundary && far {
            out.push(IndexEntry { seq: r.seq, offset, max_ts_before: max_ts, max_txn_before: max_txn });
        }
        boundary = r.flags & FLAG_END != 0;
        max_ts = max_ts.max(r.ts);
        max_txn = max_txn.max(r.txn);
    }
    out
}

/// The index file the writer would have written for the records at the start
/// of `segment` (decoded from offset 64 up to the first non-record).
fn writer_index(segment: &[u8], base_seq: u64) -> Vec<u8> {
    let mut recs = Vec::new();
    let mut at = HEADER_LEN;
    while let Decoded::Record { header, size, .. } = decode_record(&segment[at..]) {
        recs.push((header, at as u64));
        at += size;
    }
    let mut idx = encode_index_header(base_seq).to_vec();
    for p in writer_points(recs) {
        idx.extend_from_slice(&p.encode());
    }
    idx
}

fn record_json(r: &Rec, offset: u64, file: &[u8]) -> Value {
    let at = to_usize(offset);
    let body_len = le_u32(file, at);
    let size = FRAME_LEN + to_usize(u64::from(body_len));
    json!({
        "offset": offset,
        "size": size,
        "body_len": body_len,
        "body_crc": le_u32(file, at + 4),
        "seq": r.seq,
        "ts": r.ts,
        "flags": r.flags,
        "txn": r.txn,
        "doc": r.doc_json(),
        "doc_hex": hex(&file[at + FRAME_LEN + BODY_DOC..at + size]),
    })
}

fn header_json(file: &[u8]) -> Value {
    let h = SegmentHeader::decode(file).expect("header");
    json!({
        "magic_hex": hex(&SEGMENT_MAGIC),
        "version": FORMAT_VERSION,
        "flags": 0,
        "partition": h.partition,
        "stream_id": h.stream_id,
        "base_seq": h.base_seq,
        "created_ms": h.created_ms,
        "crc": le_u32(file, format::HDR_CRC),
        "hex": hex(&file[..HEADER_LEN]),
    })
}

fn footer_json(f: &Footer, bytes: &[u8]) -> Value {
    json!({
        "offset": f.records_end,
        "magic_hex": hex(&FOOTER_MAGIC),
        "records_end": f.records_end,
        "first_seq": f.first_seq,
        "last_seq": f.last_seq,
        "count": f.count,
        "max_ts": f.max_ts,
        "crc": le_u32(bytes, format::FTR_CRC),
        "hex": hex(bytes),
    })
}

fn entry_json(e: &IndexEntry) -> Value {
    let b = e.encode();
    json!({
        "seq": e.seq,
        "offset": e.offset,
        "max_ts_before": e.max_ts_before,
        "max_txn_before": e.max_txn_before,
        "crc": le_u32(&b, format::ENT_CRC),
        "hex": hex(&b),
    })
}

fn recovered(seqs: std::ops::RangeInclusive<u64>) -> Value {
    json!(seqs.collect::<Vec<u64>>())
}

/// Keys sorted, however this build's serde_json orders maps (the `mongo`
/// feature turns on its `preserve_order`).
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&m[k]))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

fn pretty(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(&sorted(v)).expect("json");
    s.push('\n');
    s.into_bytes()
}

// ------------------------------------------------------- building vectors

/// Every vector file, by name.
fn build_vectors() -> BTreeMap<&'static str, Vec<u8>> {
    let all = events();
    let mut files = BTreeMap::new();
    build_sealed(&all, &mut files);
    build_torn_record(&all, &mut files);
    build_torn_batch(&all, &mut files);
    build_corrupt_middle(&all, &mut files);
    build_damaged_length(&all, &mut files);
    build_uncommitted_multi(&all, &mut files);
    build_manifest(&mut files);
    build_manifest_v1(&mut files);
    build_txn(&mut files);
    build_delivery_wal(&mut files);
    build_delivery_wal_torn(&mut files);
    build_delivery_wal_v2(&mut files);
    build_delivery_wal_v3(&mut files);
    build_delivery_wal_v4(&mut files);
    build_delivery_wal_v5(&mut files);
    build_delivery_wal_corrupt(&mut files);
    build_checkpoint(&mut files);
    build_checkpoint_corrupt(&mut files);
    build_secondary_index(&mut files);
    files
}

/// (a) + (b): records 1-7, sealed with a footer, and the segment's index.
fn build_sealed(all: &[Rec], files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let recs = &all[..7];
    let (mut bytes, offsets) = segment_bytes(recs);
    let footer = Footer {
        records_end: bytes.len() as u64,
        first_seq: 1,
        last_seq: 7,
        count: 7,
        max_ts: recs.iter().map(|r| r.ts).max().unwrap_or(i64::MIN),
    };
    let footer_bytes = footer.encode();
    bytes.extend_from_slice(&footer_bytes);
    let points = index_points(recs, &offsets);
    let mut idx = encode_index_header(1).to_vec();
    for p in &points {
        idx.extend_from_slice(&p.encode());
    }
    let expected = json!({
        "description": "Records 1-7 (a single append; a 2-record batch; key/type/metadata/nested payload; two multi-partition parts; a 4 KiB payload), sealed with a footer.",
        "path": SEGMENT_PATH,
        "length": bytes.len(),
        "header": header_json(&bytes),
        "records": recs.iter().zip(&offsets).map(|(r, &o)| record_json(r, o, &bytes)).collect::<Vec<_>>(),
        "scan_end": {"offset": footer.records_end, "kind": "footer"},
        "footer": footer_json(&footer, &footer_bytes),
        "open": {"recovered_seqs": recovered(1..=7), "truncation": null},
    });
    let idx_expected = json!({
        "description": "The index of segment-sealed.log: a point at the first append and one at the first append starting at least 4096 bytes after it.",
        "path": INDEX_PATH,
        "length": idx.len(),
        "header": {
            "magic_hex": hex(&INDEX_MAGIC),
            "version": FORMAT_VERSION,
            "flags": 0,
            "base_seq": 1,
            "crc": le_u32(&idx, format::IDX_CRC),
            "hex": hex(&idx[..IDX_HEADER_LEN]),
        },
        "entries": points.iter().map(entry_json).collect::<Vec<_>>(),
    });
    files.insert("segment-sealed.log", bytes);
    files.insert("segment-sealed.json", pretty(&expected));
    files.insert("segment-sealed.idx", idx);
    files.insert("segment-sealed.idx.json", pretty(&idx_expected));
}

/// (e): records 1-4 and the first half of record 5; the file ends there.
fn build_torn_record(all: &[Rec], files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let (full, offsets) = segment_bytes(&all[..5]);
    let cut_at = to_usize(offsets[4]);
    let torn_size = full.len() - cut_at;
    let bytes = full[..cut_at + torn_size / 2].to_vec();
    let expected = json!({
        "description": "Records 1-4, then only the first half of record 5: the file ends inside it (a torn tail).",
        "path": SEGMENT_PATH,
        "length": bytes.len(),
        "header": header_json(&bytes),
        "records": all[..4].iter().zip(&offsets).map(|(r, &o)| record_json(r, o, &bytes)).collect::<Vec<_>>(),
        "scan_end": {"offset": offsets[4], "kind": "incomplete", "need": torn_size},
        "footer": null,
        "open": {
            "recovered_seqs": recovered(1..=4),
            "truncation": {
                "offset": offsets[4],
                "dropped_bytes": last_nonzero_end(&bytes) - cut_at,
                "reason": "record runs past the end of the file",
            },
            "length_after": bytes.len(),
            "strict_error_offset": offsets[4],
        },
    });
    files.insert("torn-record.log", bytes);
    files.insert("torn-record.json", pretty(&expected));
}

/// (e'): record 1, record 2 and half of record 3 (the end of the 2-record
/// batch), then zeros up to the preallocated length.
fn build_torn_batch(all: &[Rec], files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let (full, offsets) = segment_bytes(&all[..3]);
    let rec3 = to_usize(offsets[2]);
    let mut bytes = full[..rec3 + (full.len() - rec3) / 2].to_vec();
    bytes.resize(PREALLOCATED_LEN, 0);
    let cut = offsets[1];
    let expected = json!({
        "description": "Record 1, then the batch 2-3 with record 3 torn in the middle, then the zero-filled preallocated region. The incomplete batch is dropped whole.",
        "path": SEGMENT_PATH,
        "length": bytes.len(),
        "header": header_json(&bytes),
        "records": all[..2].iter().zip(&offsets).map(|(r, &o)| record_json(r, o, &bytes)).collect::<Vec<_>>(),
        "scan_end": {"offset": offsets[2], "kind": "invalid", "reason": "record checksum mismatch"},
        "footer": null,
        "open": {
            "recovered_seqs": recovered(1..=1),
            "truncation": {
                "offset": cut,
                "dropped_bytes": last_nonzero_end(&bytes) - to_usize(cut),
                "reason": "record checksum mismatch",
            },
            "length_after": PREALLOCATED_LEN,
            "strict_error_offset": cut,
        },
    });
    files.insert("torn-batch.log", bytes);
    files.insert("torn-batch.json", pretty(&expected));
}

/// (f): records 1-4 (not sealed), one byte of record 2's document flipped.
fn build_corrupt_middle(all: &[Rec], files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let (mut bytes, offsets) = segment_bytes(&all[..4]);
    let flipped = to_usize(offsets[1]) + FRAME_LEN + BODY_DOC + 3;
    bytes[flipped] ^= 0x01;
    let intact: Vec<Value> = [0usize, 2, 3].iter().map(|&i| record_json(&all[i], offsets[i], &bytes)).collect();
    let expected = json!({
        "description": "Records 1-4 of an active (unsealed) segment with one bit flipped inside record 2's document, followed by valid records: corruption, not a torn tail.",
        "path": SEGMENT_PATH,
        "length": bytes.len(),
        "header": header_json(&bytes),
        "records": intact,
        "damage": {"byte_offset": flipped, "xor": 1, "record_offset": offsets[1]},
        "scan_end": {"offset": offsets[1], "kind": "invalid", "reason": "record checksum mismatch"},
        "footer": null,
        "open": {
            "error": {"kind": "Corrupt", "offset": offsets[1], "reason_contains": "record checksum mismatch"},
        },
    });
    files.insert("corrupt-middle.log", bytes);
    files.insert("corrupt-middle.json", pretty(&expected));
}

/// Records 1-4 (not sealed) with record 2's length field damaged (45 -> 61,
/// still in range): the length no longer leads to record 3, which is found by
/// the search for later valid records.
fn build_damaged_length(all: &[Rec], files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let (mut bytes, offsets) = segment_bytes(&all[..4]);
    let flipped = to_usize(offsets[1]) + format::REC_LEN;
    bytes[flipped] ^= 0x10;
    let intact: Vec<Value> = [0usize, 2, 3].iter().map(|&i| record_json(&all[i], offsets[i], &bytes)).collect();
    let expected = json!({
        "description": "Records 1-4 of an active (unsealed) segment with bit 4 of record 2's length field flipped (45 becomes 61, still in range, so the damaged record frames the wrong bytes and its claimed end is not a record start); records 3 and 4 are intact: corruption, not a torn tail. TruncateAtFirstDamage cuts at record 2.",
        "path": SEGMENT_PATH,
        "length": bytes.len(),
        "header": header_json(&bytes),
        "records": intact,
        "damage": {"byte_offset": flipped, "xor": 0x10, "record_offset": offsets[1]},
        "scan_end": {"offset": offsets[1], "kind": "invalid", "reason": "record checksum mismatch"},
        "footer": null,
        "open": {
            "error": {
                "kind": "Corrupt",
                "offset": offsets[1],
                "reason_contains": format!("followed by valid records (sequence 3 at offset {})", offsets[2]),
            },
            "truncate_at_first_damage": {
                "recovered_seqs": recovered(1..=1),
                "truncation": {
                    "offset": offsets[1],
                    "dropped_bytes": last_nonzero_end(&bytes) - to_usize(offsets[1]),
                    "reason": "record checksum mismatch",
                },
                "length_after": bytes.len(),
            },
        },
    });
    files.insert("damaged-length.log", bytes);
    files.insert("damaged-length.json", pretty(&expected));
}

/// Records 1-8 (not sealed) where 8 belongs to transaction 3, which the
/// transaction log vector does not record; zeros up to the preallocated length.
fn build_uncommitted_multi(all: &[Rec], files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let (mut bytes, offsets) = segment_bytes(all);
    let end8 = bytes.len();
    bytes.resize(PREALLOCATED_LEN, 0);
    let expected = json!({
        "description": "Records 1-8 of an active segment, zero-filled to 8192 bytes; record 8 is a multi-partition batch of transaction 3, above the last committed transaction (2, txn.bin): recovery drops it.",
        "path": SEGMENT_PATH,
        "length": bytes.len(),
        "header": header_json(&bytes),
        "records": all.iter().zip(&offsets).map(|(r, &o)| record_json(r, o, &bytes)).collect::<Vec<_>>(),
        "scan_end": {"offset": end8, "kind": "zeros"},
        "footer": null,
        "open": {
            "committed_txn": 2,
            "recovered_seqs": recovered(1..=7),
            "truncation": {
                "offset": offsets[7],
                "dropped_bytes": end8 - to_usize(offsets[7]),
                "reason": "incomplete or uncommitted batch",
            },
            "length_after": PREALLOCATED_LEN,
            "strict_error_offset": offsets[7],
        },
    });
    files.insert("uncommitted-multi.log", bytes);
    files.insert("uncommitted-multi.json", pretty(&expected));
}

fn manifest_body() -> ManifestBody {
    ManifestBody {
        next_stream_id: 2,
        streams: vec![StreamEntry {
            id: STREAM_ID,
            name: STREAM.into(),
            partition_count: 1,
            indexes: vec!["customer".into()],
            created_ms: T0,
            // Limits no test reaches (the vectors' data directories open
            // with this manifest, and retention runs at open).
            settings: StreamSettings {
                max_age_ms: None,
                max_bytes: Some(1 << 40),
                max_events: None,
                policy: 0,
                dedupe_window_ms: Some(60_000),
            },
        }],
    }
}

/// The manifest header, byte by byte (`format/manifest.md#header`).
fn spec_manifest(version: u16, body: &[u8]) -> Vec<u8> {
    let mut b = manifest::MANIFEST_MAGIC.to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&[0; 6]); // flags u16, reserved u32
    b.extend_from_slice(&(body.len() as u64).to_le_bytes());
    b.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// `manifest-v1.bin`: the same stream in a version 1 manifest (each stream
/// a 5-array, no settings).
fn build_manifest_v1(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let body = rmp_serde::to_vec(&(2u64, vec![(STREAM_ID, STREAM, 1u32, vec!["customer"], T0)])).expect("v1 body");
    let bytes = spec_manifest(1, &body);
    let h = manifest::MAN_HEADER_LEN;
    let expected = json!({
        "description": "A version 1 manifest: next stream id 2, one stream (id 1, \"orders\", 1 partition, index \"customer\") without settings, read as no retention and the backend's dedupe window.",
        "path": "MANIFEST",
        "length": bytes.len(),
        "header": {
            "magic_hex": hex(&manifest::MANIFEST_MAGIC),
            "version": 1,
            "flags": 0,
            "body_len": bytes.len() - h,
            "body_crc": le_u32(&bytes, manifest::MAN_BODY_CRC),
            "header_crc": le_u32(&bytes, manifest::MAN_HEADER_CRC),
            "hex": hex(&bytes[..h]),
        },
        "body": {
            "next_stream_id": 2,
            "streams": [{
                "id": STREAM_ID,
                "name": STREAM,
                "partition_count": 1,
                "indexes": ["customer"],
                "created_ms": T0,
                "settings": [null, null, null, 0, null],
            }],
        },
        "body_hex": hex(&bytes[h..]),
    });
    files.insert("manifest-v1.bin", bytes);
    files.insert("manifest-v1.json", pretty(&expected));
}

/// (c): the manifest naming stream 1, "orders", one partition.
fn build_manifest(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let bytes = manifest::encode(&manifest_body()).expect("manifest encodes");
    assert_eq!(bytes, spec_manifest(2, &bytes[manifest::MAN_HEADER_LEN..]), "the header as the spec builds it");
    let h = manifest::MAN_HEADER_LEN;
    let expected = json!({
        "description": "A version 2 manifest: next stream id 2, one stream (id 1, \"orders\", 1 partition, index \"customer\") with settings: no max_age, max_bytes 1 TiB, no max_events, policy limits, dedupe window 60 s.",
        "path": "MANIFEST",
        "length": bytes.len(),
        "header": {
            "magic_hex": hex(&manifest::MANIFEST_MAGIC),
            "version": manifest::MANIFEST_VERSION,
            "flags": 0,
            "body_len": bytes.len() - h,
            "body_crc": le_u32(&bytes, manifest::MAN_BODY_CRC),
            "header_crc": le_u32(&bytes, manifest::MAN_HEADER_CRC),
            "hex": hex(&bytes[..h]),
        },
        "body": {
            "next_stream_id": 2,
            "streams": [{
                "id": STREAM_ID,
                "name": STREAM,
                "partition_count": 1,
                "indexes": ["customer"],
                "created_ms": T0,
                "settings": [null, 1u64 << 40, null, 0, 60_000],
            }],
        },
        "body_hex": hex(&bytes[h..]),
    });
    files.insert("manifest.bin", bytes);
    files.insert("manifest.json", pretty(&expected));
}

/// The transaction log header (the engine keeps its encoder private).
fn txn_header() -> [u8; txn::TXN_RECORD_LEN] {
    let mut b = [0u8; txn::TXN_RECORD_LEN];
    b[..8].copy_from_slice(&txn::TXN_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32fast::hash(&b[..12]);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
    b
}

/// (d): a transaction log recording transactions 1 and 2.
fn build_txn(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let mut bytes = txn_header().to_vec();
    let mut entries = Vec::new();
    for t in [1u64, 2] {
        let e = txn::encode_entry(t);
        entries.push(json!({"txn": t, "crc": le_u32(&e, 12), "hex": hex(&e)}));
        bytes.extend_from_slice(&e);
    }
    let expected = json!({
        "description": "A stream's transaction log: header, then transactions 1 and 2 committed.",
        "path": TXN_PATH,
        "length": bytes.len(),
        "header": {
            "magic_hex": hex(&txn::TXN_MAGIC),
            "version": FORMAT_VERSION,
            "crc": le_u32(&bytes, 12),
            "hex": hex(&bytes[..txn::TXN_RECORD_LEN]),
        },
        "entries": entries,
        "committed": 2,
        "valid_len": bytes.len(),
    });
    files.insert("txn.bin", bytes);
    files.insert("txn.json", pretty(&expected));
}

/// The segment vectors, by stem.
const SEGMENT_VECTORS: [&str; 6] =
    ["segment-sealed", "torn-record", "torn-batch", "corrupt-middle", "damaged-length", "uncommitted-multi"];

// ------------------------------------------------------------ generation

#[test]
#[ignore = "writes format/vectors/; run explicitly with RHEO_WRITE_VECTORS=1"]
fn generate_vectors() {
    if std::env::var("RHEO_WRITE_VECTORS").as_deref() != Ok("1") {
        eprintln!("set RHEO_WRITE_VECTORS=1 to (re)write {VECTORS}");
        return;
    }
    let dir = vectors_dir();
    std::fs::create_dir_all(&dir).expect("create the vectors directory");
    for (name, bytes) in build_vectors() {
        std::fs::write(dir.join(name), bytes).expect("write a vector");
    }
}

#[test]
fn encoders_reproduce_the_vectors() {
    for (name, bytes) in build_vectors() {
        assert!(read_vector(name) == bytes, "{name}: the encoders no longer produce the committed bytes");
    }
}

// ------------------------------------------------------------- decoding

fn check_header(file: &[u8], expected: &Value, name: &str) {
    let h = SegmentHeader::decode(file).unwrap_or_else(|e| panic!("{name}: {e}"));
    let e = &expected["header"];
    assert_eq!(hex(&file[format::HDR_MAGIC..format::HDR_MAGIC + 8]), js(e, "magic_hex"), "{name}: magic");
    assert_eq!(u64::from(le_u16(file, format::HDR_VERSION)), ju(e, "version"), "{name}: version");
    assert_eq!(u64::from(le_u16(file, format::HDR_FLAGS)), ju(e, "flags"), "{name}: flags");
    assert_eq!(u64::from(h.partition), ju(e, "partition"), "{name}: partition");
    assert_eq!(h.stream_id, ju(e, "stream_id"), "{name}: stream_id");
    assert_eq!(h.base_seq, ju(e, "base_seq"), "{name}: base_seq");
    assert_eq!(h.created_ms, ji(e, "created_ms"), "{name}: created_ms");
    assert!(file[format::HDR_RESERVED..format::HDR_CRC].iter().all(|&b| b == 0), "{name}: reserved bytes");
    assert_eq!(u64::from(le_u32(file, format::HDR_CRC)), ju(e, "crc"), "{name}: header crc");
    assert_eq!(u64::from(crc32fast::hash(&file[..format::HDR_CRC])), ju(e, "crc"), "{name}: crc is CRC32 of 0..60");
    assert_eq!(hex(&file[..HEADER_LEN]), js(e, "hex"), "{name}: header bytes");
}

fn check_record(file: &[u8], e: &Value, name: &str) {
    let offset = to_usize(ju(e, "offset"));
    let Decoded::Record { header, doc, size } = decode_record(&file[offset..]) else {
        panic!("{name}: no record at {offset}: {:?}", decode_record(&file[offset..]));
    };
    let at = format!("{name} record at {offset}");
    assert_eq!(size as u64, ju(e, "size"), "{at}: size");
    assert_eq!(u64::from(le_u32(file, offset + format::REC_LEN)), ju(e, "body_len"), "{at}: body_len");
    assert_eq!(u64::from(le_u32(file, offset + format::REC_CRC)), ju(e, "body_crc"), "{at}: body_crc");
    let body = &file[offset + FRAME_LEN..offset + size];
    assert_eq!(u64::from(crc32fast::hash(body)), ju(e, "body_crc"), "{at}: crc is CRC32 of the body");
    assert_eq!(header.seq, ju(e, "seq"), "{at}: seq");
    assert_eq!(header.ts, ji(e, "ts"), "{at}: ts");
    assert_eq!(u64::from(header.flags), ju(e, "flags"), "{at}: flags");
    assert_eq!(header.txn, ju(e, "txn"), "{at}: txn");
    assert_eq!(body[format::BODY_RESERVED..format::BODY_TXN], [0, 0, 0], "{at}: reserved");
    assert_eq!(hex(doc), js(e, "doc_hex"), "{at}: document bytes");
    check_doc(doc, &e["doc"], &at);
}

fn check_doc(doc: &[u8], e: &Value, at: &str) {
    let d = decode_doc(doc).unwrap_or_else(|err| panic!("{at}: {err}"));
    check_document(&d, e, at);
}

/// A decoded document against the vector's description of it.
fn check_document(d: &rheo::engine::Document, e: &Value, at: &str) {
    assert_eq!(d.id(), js(e, "id"), "{at}: id");
    assert_eq!(d.key(), e["key"].as_str(), "{at}: key");
    assert_eq!(d.event_type(), e["type"].as_str(), "{at}: type");
    assert_eq!(&Value::Object(d.metadata().clone()), &e["metadata"], "{at}: metadata");
    assert_eq!(d.payload().json().unwrap_or_else(|err| panic!("{at}: payload: {err}")), &e["payload"], "{at}: payload");
}

/// Decodes records one after the other from the header and checks where
/// and why the scan stops.
fn check_scan_end(file: &[u8], expected: &Value, name: &str) {
    let mut at = HEADER_LEN;
    let mut seen = Vec::new();
    let stop = loop {
        if at == file.len() {
            break json!({"offset": at, "kind": "eof"});
        }
        match decode_record(&file[at..]) {
            Decoded::Record { header, size, .. } => {
                seen.push(header.seq);
                at += size;
            }
            Decoded::End => break json!({"offset": at, "kind": "zeros"}),
            Decoded::Footer => break json!({"offset": at, "kind": "footer"}),
            Decoded::Incomplete(need) => break json!({"offset": at, "kind": "incomplete", "need": need}),
            Decoded::Invalid(reason) => break json!({"offset": at, "kind": "invalid", "reason": reason}),
        }
    };
    assert_eq!(stop, expected["scan_end"], "{name}: where a sequential decode stops");
    let stop_offset = ju(&stop, "offset");
    let listed: Vec<u64> = expected["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| ju(r, "offset") < stop_offset)
        .map(|r| ju(r, "seq"))
        .collect();
    assert_eq!(seen, listed, "{name}: the records before the stop");
}

fn check_footer(file: &[u8], expected: &Value, name: &str) {
    let e = &expected["footer"];
    if e.is_null() {
        let tail = &file[file.len().saturating_sub(FOOTER_LEN)..];
        assert!(Footer::decode(tail).is_err(), "{name}: an unsealed segment has no footer");
        return;
    }
    let at = to_usize(ju(e, "offset"));
    assert_eq!(at + FOOTER_LEN, file.len(), "{name}: the footer ends the file");
    let b = &file[at..];
    let f = Footer::decode(b).unwrap_or_else(|err| panic!("{name}: {err}"));
    assert_eq!(hex(&b[format::FTR_MAGIC..format::FTR_MAGIC + 8]), js(e, "magic_hex"), "{name}: footer magic");
    assert_eq!(f.records_end, ju(e, "records_end"), "{name}: records_end");
    assert_eq!(f.records_end, at as u64, "{name}: records_end is the footer's offset");
    assert_eq!(f.first_seq, ju(e, "first_seq"), "{name}: first_seq");
    assert_eq!(f.last_seq, ju(e, "last_seq"), "{name}: last_seq");
    assert_eq!(f.count, ju(e, "count"), "{name}: count");
    assert_eq!(f.max_ts, ji(e, "max_ts"), "{name}: max_ts");
    assert!(b[format::FTR_RESERVED..format::FTR_CRC].iter().all(|&x| x == 0), "{name}: footer reserved");
    assert_eq!(u64::from(le_u32(b, format::FTR_CRC)), ju(e, "crc"), "{name}: footer crc");
    assert_eq!(u64::from(crc32fast::hash(&b[..format::FTR_CRC])), ju(e, "crc"), "{name}: footer crc over 0..60");
    assert_eq!(hex(b), js(e, "hex"), "{name}: footer bytes");
}

fn check_segment_vector(stem: &str) {
    let name = format!("{stem}.log");
    let file = read_vector(&name);
    let expected = read_json(&format!("{stem}.json"));
    assert_eq!(file.len() as u64, ju(&expected, "length"), "{name}: length");
    check_header(&file, &expected, &name);
    for r in expected["records"].as_array().expect("records") {
        check_record(&file, r, &name);
    }
    check_scan_end(&file, &expected, &name);
    check_footer(&file, &expected, &name);
    if let Some(damage) = expected.get("damage") {
        let mut repaired = file.clone();
        let byte = to_usize(ju(damage, "byte_offset"));
        repaired[byte] ^= u8::try_from(ju(damage, "xor")).expect("xor is a byte");
        let rec = to_usize(ju(damage, "record_offset"));
        assert!(
            matches!(decode_record(&repaired[rec..]), Decoded::Record { .. }),
            "{name}: undoing the flip restores the record"
        );
    }
}

fn check_index_vector() {
    let file = read_vector("segment-sealed.idx");
    let e = read_json("segment-sealed.idx.json");
    assert_eq!(file.len() as u64, ju(&e, "length"), "idx length");
    let h = &e["header"];
    assert_eq!(hex(&file[format::IDX_MAGIC..format::IDX_MAGIC + 8]), js(h, "magic_hex"), "idx magic");
    assert_eq!(u64::from(le_u16(&file, format::IDX_VERSION)), ju(h, "version"), "idx version");
    assert_eq!(u64::from(le_u16(&file, format::IDX_FLAGS)), ju(h, "flags"), "idx flags");
    assert_eq!(le_u64(&file, format::IDX_BASE_SEQ), ju(h, "base_seq"), "idx base_seq");
    assert_eq!(le_u32(&file, format::IDX_RESERVED), 0, "idx reserved");
    assert_eq!(le_u32(&file, format::IDX_RESERVED2), 0, "idx reserved2");
    assert_eq!(u64::from(le_u32(&file, format::IDX_CRC)), ju(h, "crc"), "idx header crc");
    assert_eq!(u64::from(crc32fast::hash(&file[..format::IDX_CRC])), ju(h, "crc"), "idx crc over 0..28");
    assert_eq!(hex(&file[..IDX_HEADER_LEN]), js(h, "hex"), "idx header bytes");
    let decoded = decode_index(&file, ju(h, "base_seq"));
    let listed = e["entries"].as_array().expect("entries");
    assert_eq!(decoded.len(), listed.len(), "idx entry count");
    assert_eq!((file.len() - IDX_HEADER_LEN) / ENTRY_LEN, listed.len(), "idx: nothing after the entries");
    let segment = read_vector("segment-sealed.log");
    for (i, (d, x)) in decoded.iter().zip(listed).enumerate() {
        let raw = &file[IDX_HEADER_LEN + i * ENTRY_LEN..IDX_HEADER_LEN + (i + 1) * ENTRY_LEN];
        assert_eq!(d.seq, ju(x, "seq"), "idx entry {i}: seq");
        assert_eq!(d.offset, ju(x, "offset"), "idx entry {i}: offset");
        assert_eq!(d.max_ts_before, ji(x, "max_ts_before"), "idx entry {i}: max_ts_before");
        assert_eq!(d.max_txn_before, ju(x, "max_txn_before"), "idx entry {i}: max_txn_before");
        assert_eq!(le_u32(raw, format::ENT_RESERVED), 0, "idx entry {i}: reserved");
        assert_eq!(u64::from(le_u32(raw, format::ENT_CRC)), ju(x, "crc"), "idx entry {i}: crc");
        assert_eq!(hex(raw), js(x, "hex"), "idx entry {i}: bytes");
        // It points at the start of a record with that sequence.
        match decode_record(&segment[to_usize(d.offset)..]) {
            Decoded::Record { header, .. } => assert_eq!(header.seq, d.seq, "idx entry {i}: target"),
            other => panic!("idx entry {i} points at {other:?}"),
        }
    }
}

fn check_manifest_vector(stem: &str) {
    let file = read_vector(&format!("{stem}.bin"));
    let e = read_json(&format!("{stem}.json"));
    let h = &e["header"];
    assert_eq!(file.len() as u64, ju(&e, "length"), "manifest length");
    assert_eq!(hex(&file[..8]), js(h, "magic_hex"), "manifest magic");
    assert_eq!(u64::from(le_u16(&file, manifest::MAN_VERSION)), ju(h, "version"), "manifest version");
    assert_eq!(u64::from(le_u16(&file, manifest::MAN_FLAGS)), ju(h, "flags"), "manifest flags");
    assert_eq!(le_u32(&file, manifest::MAN_RESERVED), 0, "manifest reserved");
    assert_eq!(le_u64(&file, manifest::MAN_BODY_LEN), ju(h, "body_len"), "manifest body_len");
    assert_eq!(u64::from(le_u32(&file, manifest::MAN_BODY_CRC)), ju(h, "body_crc"), "manifest body crc");
    let body = &file[manifest::MAN_HEADER_LEN..];
    assert_eq!(u64::from(crc32fast::hash(body)), ju(h, "body_crc"), "manifest body crc is CRC32 of the body");
    assert_eq!(u64::from(le_u32(&file, manifest::MAN_HEADER_CRC)), ju(h, "header_crc"), "manifest header crc");
    assert_eq!(
        u64::from(crc32fast::hash(&file[..manifest::MAN_HEADER_CRC])),
        ju(h, "header_crc"),
        "manifest header crc over 0..28"
    );
    assert_eq!(hex(&file[..manifest::MAN_HEADER_LEN]), js(h, "hex"), "manifest header bytes");
    assert_eq!(hex(body), js(&e, "body_hex"), "manifest body bytes");
    let decoded = manifest::decode(&file).unwrap_or_else(|(at, why)| panic!("manifest at {at}: {why}"));
    let b = &e["body"];
    assert_eq!(decoded.next_stream_id, ju(b, "next_stream_id"), "next_stream_id");
    let listed = b["streams"].as_array().expect("streams");
    assert_eq!(decoded.streams.len(), listed.len(), "stream count");
    for (s, x) in decoded.streams.iter().zip(listed) {
        assert_eq!(s.id, ju(x, "id"), "stream id");
        assert_eq!(s.name, js(x, "name"), "stream name");
        assert_eq!(u64::from(s.partition_count), ju(x, "partition_count"), "partition_count");
        let indexes: Vec<&str> = x["indexes"].as_array().expect("indexes").iter().filter_map(Value::as_str).collect();
        assert_eq!(s.indexes, indexes, "indexes");
        assert_eq!(s.created_ms, ji(x, "created_ms"), "created_ms");
        let st = &s.settings;
        let stated = serde_json::to_value([
            json!(st.max_age_ms),
            json!(st.max_bytes),
            json!(st.max_events),
            json!(st.policy),
            json!(st.dedupe_window_ms),
        ])
        .expect("json");
        assert_eq!(stated, x["settings"], "{stem}: settings");
    }
    // The body is positional: a 2-array, each stream a 5-array (version
    // 1) or a 6-array whose last element is the settings' 5-array.
    assert_eq!(body[0], 0x92, "the body is a MessagePack array of 2");
    let width = if le_u16(&file, manifest::MAN_VERSION) == 1 { 0x95 } else { 0x96 };
    assert_eq!(body[3], width, "{stem}: each stream an array of {}", width - 0x90);
}

fn check_txn_vector() {
    let file = read_vector("txn.bin");
    let e = read_json("txn.json");
    let h = &e["header"];
    assert_eq!(file.len() as u64, ju(&e, "length"), "txn length");
    assert_eq!(hex(&file[..8]), js(h, "magic_hex"), "txn magic");
    assert_eq!(u64::from(le_u16(&file, 8)), ju(h, "version"), "txn version");
    assert_eq!(le_u16(&file, 10), 0, "txn reserved");
    assert_eq!(u64::from(le_u32(&file, 12)), ju(h, "crc"), "txn header crc");
    assert_eq!(u64::from(crc32fast::hash(&file[..12])), ju(h, "crc"), "txn header crc over 0..12");
    assert_eq!(hex(&file[..txn::TXN_RECORD_LEN]), js(h, "hex"), "txn header bytes");
    let listed = e["entries"].as_array().expect("entries");
    for (i, x) in listed.iter().enumerate() {
        let raw = &file[(i + 1) * txn::TXN_RECORD_LEN..(i + 2) * txn::TXN_RECORD_LEN];
        assert_eq!(le_u64(raw, 0), ju(x, "txn"), "txn entry {i}: id");
        assert_eq!(le_u32(raw, 8), 0, "txn entry {i}: reserved");
        assert_eq!(u64::from(le_u32(raw, 12)), ju(x, "crc"), "txn entry {i}: crc");
        assert_eq!(u64::from(crc32fast::hash(&raw[..12])), ju(x, "crc"), "txn entry {i}: crc over 0..12");
        assert_eq!(hex(raw), js(x, "hex"), "txn entry {i}: bytes");
    }
    assert_eq!(txn::decode(&file), (ju(&e, "committed"), ju(&e, "valid_len")), "txn::decode");
}

#[test]
fn vectors_decode_as_expected() {
    for stem in SEGMENT_VECTORS {
        check_segment_vector(stem);
    }
    check_index_vector();
    check_manifest_vector("manifest");
    check_manifest_vector("manifest-v1");
    check_txn_vector();
}

// ------------------------------------------------------------- recovery

/// A data directory holding the manifest and transaction log vectors and
/// `segment` (and `index`) as partition 0's first segment.
fn data_dir(segment: &[u8], index: Option<&[u8]>) -> MemVfs {
    let mem = MemVfs::new();
    mem.create_dir_all(&format!("{STREAM_DIR}/00000")).expect("mkdir");
    for dir in ["", "streams", STREAM_DIR] {
        mem.sync_dir(dir).expect("sync dir");
    }
    mem.write_file("MANIFEST", &read_vector("manifest.bin")).expect("manifest");
    mem.write_file(TXN_PATH, &read_vector("txn.bin")).expect("txn");
    mem.write_file(SEGMENT_PATH, segment).expect("segment");
    if let Some(index) = index {
        mem.write_file(INDEX_PATH, index).expect("index");
    }
    mem
}

fn open(mem: &MemVfs, recovery: RecoveryMode) -> rheo::Result<Engine> {
    let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
    Engine::open(vfs, EngineOptions::default().recovery(recovery))
}

/// Reads every record of the vector stream through the engine and compares
/// them with the records listed in `expected` whose sequences are in `seqs`.
fn check_engine_records(engine: &Engine, expected: &Value, seqs: &[u64], name: &str) {
    let log = engine.stream(STREAM).expect("stream");
    let got = log.log.read(0, 0, 1000).unwrap_or_else(|e| panic!("{name}: read: {e}"));
    assert_eq!(got.iter().map(|r| r.header.seq).collect::<Vec<_>>(), seqs, "{name}: recovered sequences");
    let listed = expected["records"].as_array().expect("records");
    for r in got {
        let e = listed.iter().find(|e| ju(e, "seq") == r.header.seq).expect("listed");
        let at = format!("{name}: recovered record {}", r.header.seq);
        assert_eq!((r.header.ts, u64::from(r.header.flags), r.header.txn), (ji(e, "ts"), ju(e, "flags"), ju(e, "txn")));
        check_document(&r.doc, &e["doc"], &at);
    }
}

/// Every index entry the engine left points at a record with its sequence,
/// and carries the right maxima of the records before it.
fn check_derived_index(mem: &MemVfs, segment: &[u8], name: &str) {
    let idx = mem.read_file(INDEX_PATH).expect("index written");
    for e in decode_index(&idx, 1) {
        let (mut at, mut max_ts, mut max_txn) = (HEADER_LEN, i64::MIN, 0);
        while (at as u64) < e.offset {
            let Decoded::Record { header, size, .. } = decode_record(&segment[at..]) else {
                panic!("{name}: index entry {e:?} is past the records");
            };
            (max_ts, max_txn) = (max_ts.max(header.ts), max_txn.max(header.txn));
            at += size;
        }
        assert_eq!(at as u64, e.offset, "{name}: index entry {e:?} is at a record start");
        let Decoded::Record { header, .. } = decode_record(&segment[at..]) else { panic!("{name}: {e:?}") };
        assert_eq!((header.seq, e.max_ts_before, e.max_txn_before), (e.seq, max_ts, max_txn), "{name}: {e:?}");
    }
}

/// Asserts that `opened` is `Error::Corrupt` in the file ending with `path`, at
/// `offset`, with a reason containing `reason`.
fn expect_corrupt(opened: rheo::Result<Engine>, path: &str, offset: u64, reason: &str, name: &str) {
    match opened {
        Err(Error::Corrupt { file, offset: got, reason: why, .. }) => {
            assert!(file.ends_with(path), "{name}: corrupt file {}", file.display());
            assert_eq!(got, offset, "{name}: corrupt offset ({why})");
            assert!(why.contains(reason), "{name}: reason {why:?} lacks {reason:?}");
        }
        Err(other) => panic!("{name}: expected Corrupt, got {other}"),
        Ok(_) => panic!("{name}: expected Corrupt, the engine opened"),
    }
}

fn check_recovery(stem: &str, with_index: bool) {
    let name = format!("{stem}.log (index: {with_index})");
    let segment = read_vector(&format!("{stem}.log"));
    let expected = read_json(&format!("{stem}.json"));
    let want = &expected["open"];
    let index = with_index.then(|| read_vector("segment-sealed.idx"));
    if let Some(err) = want.get("error") {
        // Damage followed by valid records: refused by both modes that look for them.
        for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict] {
            let mem = data_dir(&segment, index.as_deref());
            let (offset, reason) = (ju(err, "offset"), js(err, "reason_contains"));
            expect_corrupt(open(&mem, mode), SEGMENT_PATH, offset, reason, &format!("{name} {mode:?}"));
        }
        // The operator's mode cuts at the damage instead.
        if let Some(cut) = want.get("truncate_at_first_damage") {
            check_opened(&segment, index.as_deref(), RecoveryMode::TruncateAtFirstDamage, &expected, cut, &name);
        }
        return;
    }
    // A torn tail is cut the same way whether or not recovery searched past it.
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::TruncateAtFirstDamage] {
        check_opened(&segment, index.as_deref(), mode, &expected, want, &name);
    }
    if let Some(strict_offset) = want.get("strict_error_offset") {
        let mem = data_dir(&segment, index.as_deref());
        match open(&mem, RecoveryMode::Strict) {
            Err(Error::Corrupt { offset, .. }) => {
                assert_eq!(Some(offset), strict_offset.as_u64(), "{name}: strict recovery offset");
            }
            Err(other) => panic!("{name}: strict: expected Corrupt, got {other}"),
            Ok(_) => panic!("{name}: strict recovery truncated instead of refusing"),
        }
    }
}

/// Opens `segment` with `mode` and checks the recovered records, the
/// truncation, the file and its index after recovery against `want`.
fn check_opened(segment: &[u8], index: Option<&[u8]>, mode: RecoveryMode, expected: &Value, want: &Value, name: &str) {
    let name = format!("{name} {mode:?}");
    let mem = data_dir(segment, index);
    let engine = open(&mem, mode).unwrap_or_else(|e| panic!("{name}: open: {e}"));
    let seqs: Vec<u64> = want["recovered_seqs"].as_array().expect("seqs").iter().filter_map(Value::as_u64).collect();
    check_engine_records(&engine, expected, &seqs, &name);
    let report = engine.recovery_report();
    match &want["truncation"] {
        Value::Null => assert!(report.is_empty(), "{name}: nothing truncated: {report:?}"),
        t => {
            assert_eq!(report.len(), 1, "{name}: one truncation: {report:?}");
            let (path, got) = &report[0];
            assert_eq!(path, SEGMENT_PATH, "{name}: truncated file");
            assert_eq!(got.offset, ju(t, "offset"), "{name}: truncation offset");
            assert_eq!(got.dropped_bytes, ju(t, "dropped_bytes"), "{name}: dropped bytes");
            assert_eq!(got.reason, js(t, "reason"), "{name}: truncation reason");
            let after = mem.read_file(SEGMENT_PATH).expect("segment");
            assert_eq!(after.len() as u64, ju(want, "length_after"), "{name}: length after recovery");
            assert!(after[to_usize(got.offset)..].iter().all(|&b| b == 0), "{name}: zeros after the cut");
            assert_eq!(after[..to_usize(got.offset)], segment[..to_usize(got.offset)], "{name}: kept bytes");
            check_derived_index(&mem, &after, &name);
            // Recovery rewrites the active segment's index to exactly what the
            // writer would have written for the kept records.
            let idx = mem.read_file(INDEX_PATH).expect("index");
            assert_eq!(hex(&idx), hex(&writer_index(&after, 1)), "{name}: the recovered index is the writer's");
        }
    }
}

#[test]
fn vectors_recover_as_expected() {
    for stem in SEGMENT_VECTORS {
        check_recovery(stem, false);
    }
    // The sealed segment's index and the first records of the others agree,
    // so recovery may start from its points.
    check_recovery("segment-sealed", true);
    check_recovery("uncommitted-multi", true);
}

#[test]
fn a_sealed_segment_index_is_kept_or_rebuilt_byte_for_byte() {
    let segment = read_vector("segment-sealed.log");
    let index = read_vector("segment-sealed.idx");
    // A valid index is used as it is.
    let mem = data_dir(&segment, Some(&index));
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
    engine.stream(STREAM).expect("stream").log.read(0, 2, 10).expect("read");
    assert_eq!(mem.read_file(INDEX_PATH).as_deref(), Some(&index[..]), "a valid index is kept");
    // The next segment starts after the footer's last sequence.
    assert!(mem.read_file(&format!("{STREAM_DIR}/00000/00000000000000000008.log")).is_some());
    drop(engine);
    // A missing or damaged index is rebuilt to the same bytes.
    for damaged in [None, Some(b"RHEOIDX\0garbage".to_vec())] {
        let mem = data_dir(&segment, damaged.as_deref());
        let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
        engine.stream(STREAM).expect("stream").log.read(0, 0, 10).expect("read");
        assert_eq!(mem.read_file(INDEX_PATH).as_deref(), Some(&index[..]), "the rebuilt index");
    }
}

#[test]
fn a_flipped_byte_in_a_sealed_segment_is_reported_on_read() {
    // The same damage as corrupt-middle.log, in the sealed segment: a sealed
    // segment is trusted by its footer at open, and checked when read.
    let mut segment = read_vector("segment-sealed.log");
    let damage = &read_json("corrupt-middle.json")["damage"];
    segment[to_usize(ju(damage, "byte_offset"))] ^= 0x01;
    let mem = data_dir(&segment, None);
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("a sealed segment is not scanned at open");
    match engine.stream(STREAM).expect("stream").log.read(0, 0, 10) {
        Err(Error::Corrupt { file, offset, reason, .. }) => {
            assert!(file.ends_with(SEGMENT_PATH), "{}", file.display());
            assert_eq!(offset, ju(damage, "record_offset"), "{reason}");
            assert!(reason.contains("record checksum mismatch"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn the_recovered_index_keeps_its_first_point() {
    // Records 1-7 of uncommitted-multi.log are those of segment-sealed.log:
    // without an index, recovery rebuilds exactly the writer's index for them.
    let mem = data_dir(&read_vector("uncommitted-multi.log"), None);
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
    assert_eq!(mem.read_file(INDEX_PATH).map(|b| hex(&b)), Some(hex(&read_vector("segment-sealed.idx"))));
    drop(engine);
}

#[test]
fn damage_followed_by_valid_records_is_found_whatever_field_it_hits() {
    let damaged = read_vector("corrupt-middle.log");
    let damage = &read_json("corrupt-middle.json")["damage"];
    let rec2 = to_usize(ju(damage, "record_offset"));
    let mut clean = damaged.clone();
    clean[to_usize(ju(damage, "byte_offset"))] ^= u8::try_from(ju(damage, "xor")).expect("a byte");
    // Every single-bit flip of record 2's length field: in range, out of
    // range, or past the end of the file, record 3 is still found after it.
    let mut cases: Vec<(String, Vec<u8>)> = (0..32)
        .map(|bit| {
            let mut b = clean.clone();
            b[rec2 + format::REC_LEN + bit / 8] ^= 1 << (bit % 8);
            (format!("record 2 length bit {bit}"), b)
        })
        .collect();
    cases.push(("corrupt-middle.log".into(), damaged));
    for (name, bytes) in &cases {
        for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict] {
            let opened = open(&data_dir(bytes, None), mode);
            expect_corrupt(opened, SEGMENT_PATH, rec2 as u64, "followed by valid records", &format!("{name} {mode:?}"));
        }
        // The same bytes with the operator's mode: cut at record 2.
        let mem = data_dir(bytes, None);
        let engine = open(&mem, RecoveryMode::TruncateAtFirstDamage).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = engine.stream(STREAM).expect("stream").log.read(0, 0, 10).expect("read");
        assert_eq!(got.iter().map(|r| r.header.seq).collect::<Vec<_>>(), [1], "{name}: recovered");
        let report = engine.recovery_report();
        assert_eq!(report.len(), 1, "{name}: {report:?}");
        assert_eq!((report[0].1.offset, report[0].1.dropped_bytes), (rec2 as u64, (bytes.len() - rec2) as u64));
        let after = mem.read_file(SEGMENT_PATH).expect("segment");
        assert_eq!(after[..rec2], bytes[..rec2], "{name}: kept bytes");
        assert!(after[rec2..].iter().all(|&b| b == 0), "{name}: zeros after the cut");
        assert_eq!(mem.read_file(INDEX_PATH).map(|b| hex(&b)), Some(hex(&writer_index(&after, 1))), "{name}");
    }
}

/// The vectors' data directory with `txn_bytes` as the stream's `txn`.
fn with_txn(segment: &[u8], txn_bytes: &[u8]) -> MemVfs {
    let mem = data_dir(segment, None);
    mem.write_file(TXN_PATH, txn_bytes).expect("txn");
    mem
}

#[test]
fn a_bad_transaction_log_header_is_corruption() {
    let good = read_vector("txn.bin");
    let segment = read_vector("uncommitted-multi.log");
    let changed = |at: usize, value: u8, fix_crc: bool| {
        let mut b = good.clone();
        b[at] = value;
        if fix_crc {
            let crc = crc32fast::hash(&b[..12]);
            b[12..16].copy_from_slice(&crc.to_le_bytes());
        }
        b
    };
    let cases = [
        ("magic", changed(3, b'X', true), "bad magic"),
        ("version", changed(8, 2, true), "transaction log version 2 is not supported"),
        ("version before checksum", changed(8, 2, false), "transaction log version 2 is not supported"),
        ("checksum", changed(12, good[12] ^ 1, false), "checksum mismatch"),
        ("shorter than its header", good[..10].to_vec(), "bad magic"),
    ];
    for (name, bytes, reason) in cases {
        expect_corrupt(open(&with_txn(&segment, &bytes), RecoveryMode::TolerateTornTail), TXN_PATH, 0, reason, name);
    }
}

#[test]
fn a_torn_last_transaction_entry_is_dropped() {
    let mut bytes = read_vector("txn.bin");
    bytes.extend_from_slice(&txn::encode_entry(3)[..7]);
    let mem = with_txn(&read_vector("uncommitted-multi.log"), &bytes);
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
    let got = engine.stream(STREAM).expect("stream").log.read(0, 0, 10).expect("read");
    assert_eq!(got.iter().map(|r| r.header.seq).collect::<Vec<_>>(), (1..=7).collect::<Vec<_>>(), "batch 3 dropped");
    // Rewritten to the committed state: the header and the last id.
    let mut rewritten = txn_header().to_vec();
    rewritten.extend_from_slice(&txn::encode_entry(2));
    assert_eq!(mem.read_file(TXN_PATH), Some(rewritten));
    drop(engine);
}

#[test]
fn an_unknown_version_is_a_typed_error_checked_before_the_checksum() {
    // The version is changed and the CRC left as it was.
    let mut segment = read_vector("segment-sealed.log");
    segment[format::HDR_VERSION] = 2;
    match open(&data_dir(&segment, None), RecoveryMode::TolerateTornTail) {
        Err(Error::UnsupportedVersion { file, found: 2, supported: 1 }) if file.ends_with(SEGMENT_PATH) => {}
        other => panic!("segment: expected UnsupportedVersion, got {:?}", other.err()),
    }
    let mem = data_dir(&read_vector("segment-sealed.log"), None);
    let mut man = read_vector("manifest.bin");
    man[manifest::MAN_VERSION] = 3;
    mem.write_file("MANIFEST", &man).expect("manifest");
    match open(&mem, RecoveryMode::TolerateTornTail) {
        Err(Error::UnsupportedVersion { file, found: 3, supported: 2 }) if file.ends_with("MANIFEST") => {}
        other => panic!("manifest: expected UnsupportedVersion, got {:?}", other.err()),
    }
}

#[test]
fn a_cut_short_segment_creation_is_removed() {
    let sealed = read_vector("segment-sealed.log");
    let mut bad_header = sealed[..HEADER_LEN].to_vec();
    bad_header[format::HDR_CRC] ^= 1;
    bad_header.resize(PREALLOCATED_LEN, 0);
    // The partition's only segment: it is removed and created again, empty.
    let only = [
        ("empty", Vec::new()),
        ("shorter than a header", vec![0; 40]),
        ("zeros", vec![0; PREALLOCATED_LEN]),
        ("a bad header, then zeros", bad_header.clone()),
    ];
    for (name, bytes) in only {
        let mem = data_dir(&bytes, Some(b"RHEOIDX\0torn"));
        let engine = open(&mem, RecoveryMode::Strict).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(engine.stream(STREAM).expect("stream").log.read(0, 0, 10).expect("read").is_empty(), "{name}");
        assert!(engine.recovery_report().is_empty(), "{name}");
        let created = mem.read_file(SEGMENT_PATH).expect("segment created again");
        let h = SegmentHeader::decode(&created).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((h.stream_id, h.partition, h.base_seq), (STREAM_ID, 0, 1), "{name}");
        assert_eq!(mem.read_file(INDEX_PATH), Some(encode_index_header(1).to_vec()), "{name}: its index");
        drop(engine);
        mem.crash();
        open(&mem, RecoveryMode::Strict).unwrap_or_else(|e| panic!("{name}: reopen after a crash: {e}"));
    }
    // After a sealed segment: the segment the roll was creating.
    let next_log = format!("{STREAM_DIR}/00000/00000000000000000008.log");
    let next_idx = format!("{STREAM_DIR}/00000/00000000000000000008.idx");
    let mem = data_dir(&sealed, Some(&read_vector("segment-sealed.idx")));
    mem.write_file(&next_log, &vec![0; PREALLOCATED_LEN]).expect("torn segment");
    mem.write_file(&next_idx, b"").expect("torn index");
    let engine = open(&mem, RecoveryMode::Strict).expect("open");
    let got = engine.stream(STREAM).expect("stream").log.read(0, 0, 10).expect("read");
    assert_eq!(got.iter().map(|r| r.header.seq).collect::<Vec<_>>(), (1..=7).collect::<Vec<_>>());
    let created = mem.read_file(&next_log).expect("created again");
    assert_eq!(SegmentHeader::decode(&created).map(|h| h.base_seq), Ok(8));
    drop(engine);
    // A bad header with records after it is not a cut-short creation.
    let mut damaged = read_vector("torn-record.log");
    damaged[format::HDR_CRC] ^= 1;
    let opened = open(&data_dir(&damaged, None), RecoveryMode::TolerateTornTail);
    expect_corrupt(opened, SEGMENT_PATH, 0, "segment header checksum mismatch", "a damaged header");
}

// -------------------------------------------------------- spec vs. code

/// A constant the spec states.
enum Stated {
    Int(u64),
    Bytes(&'static [u8]),
}

fn int(n: usize) -> Stated {
    Stated::Int(n as u64)
}

/// Every constant the spec names, with its value in the code.
fn code_constants() -> BTreeMap<&'static str, Stated> {
    use format::*;
    use manifest::*;
    let mut m = BTreeMap::new();
    m.insert("FORMAT_VERSION", Stated::Int(u64::from(FORMAT_VERSION)));
    m.insert("SEGMENT_MAGIC", Stated::Bytes(&SEGMENT_MAGIC));
    m.insert("FOOTER_MAGIC", Stated::Bytes(&FOOTER_MAGIC));
    m.insert("INDEX_MAGIC", Stated::Bytes(&INDEX_MAGIC));
    m.insert("MANIFEST_MAGIC", Stated::Bytes(&MANIFEST_MAGIC));
    m.insert("TXN_MAGIC", Stated::Bytes(&txn::TXN_MAGIC));
    for (name, value) in [
        ("HDR_MAGIC", HDR_MAGIC),
        ("HDR_VERSION", HDR_VERSION),
        ("HDR_FLAGS", HDR_FLAGS),
        ("HDR_PARTITION", HDR_PARTITION),
        ("HDR_STREAM_ID", HDR_STREAM_ID),
        ("HDR_BASE_SEQ", HDR_BASE_SEQ),
        ("HDR_CREATED_MS", HDR_CREATED_MS),
        ("HDR_RESERVED", HDR_RESERVED),
        ("HDR_CRC", HDR_CRC),
        ("HEADER_LEN", HEADER_LEN),
        ("REC_LEN", REC_LEN),
        ("REC_CRC", REC_CRC),
        ("FRAME_LEN", FRAME_LEN),
        ("BODY_SEQ", BODY_SEQ),
        ("BODY_TS", BODY_TS),
        ("BODY_FLAGS", BODY_FLAGS),
        ("BODY_RESERVED", BODY_RESERVED),
        ("BODY_TXN", BODY_TXN),
        ("BODY_DOC", BODY_DOC),
        ("BODY_MIN", BODY_MIN),
        ("BODY_MIN_U32", BODY_MIN_U32 as usize),
        ("FTR_MAGIC", FTR_MAGIC),
        ("FTR_RECORDS_END", FTR_RECORDS_END),
        ("FTR_FIRST_SEQ", FTR_FIRST_SEQ),
        ("FTR_LAST_SEQ", FTR_LAST_SEQ),
        ("FTR_COUNT", FTR_COUNT),
        ("FTR_MAX_TS", FTR_MAX_TS),
        ("FTR_RESERVED", FTR_RESERVED),
        ("FTR_CRC", FTR_CRC),
        ("FOOTER_LEN", FOOTER_LEN),
        ("IDX_MAGIC", IDX_MAGIC),
        ("IDX_VERSION", IDX_VERSION),
        ("IDX_FLAGS", IDX_FLAGS),
        ("IDX_RESERVED", IDX_RESERVED),
        ("IDX_BASE_SEQ", IDX_BASE_SEQ),
        ("IDX_RESERVED2", IDX_RESERVED2),
        ("IDX_CRC", IDX_CRC),
        ("IDX_HEADER_LEN", IDX_HEADER_LEN),
        ("ENT_SEQ", ENT_SEQ),
        ("ENT_OFFSET", ENT_OFFSET),
        ("ENT_MAX_TS_BEFORE", ENT_MAX_TS_BEFORE),
        ("ENT_MAX_TXN_BEFORE", ENT_MAX_TXN_BEFORE),
        ("ENT_RESERVED", ENT_RESERVED),
        ("ENT_CRC", ENT_CRC),
        ("ENTRY_LEN", ENTRY_LEN),
        ("MAN_VERSION", MAN_VERSION),
        ("MAN_FLAGS", MAN_FLAGS),
        ("MAN_RESERVED", MAN_RESERVED),
        ("MAN_BODY_LEN", MAN_BODY_LEN),
        ("MAN_BODY_CRC", MAN_BODY_CRC),
        ("MAN_HEADER_CRC", MAN_HEADER_CRC),
        ("MAN_HEADER_LEN", MAN_HEADER_LEN),
        ("TXN_RECORD_LEN", txn::TXN_RECORD_LEN),
    ] {
        m.insert(name, int(value));
    }
    m.insert("FLAG_END", Stated::Int(u64::from(FLAG_END)));
    m.insert("FLAG_MULTI", Stated::Int(u64::from(FLAG_MULTI)));
    m.insert("KNOWN_FLAGS", Stated::Int(u64::from(KNOWN_FLAGS)));
    m.insert("MAX_BODY_LEN", Stated::Int(u64::from(MAX_BODY_LEN)));
    m.insert("INDEX_INTERVAL_BYTES", Stated::Int(INDEX_INTERVAL_BYTES));
    m.insert("MAX_MANIFEST_BODY", Stated::Int(MAX_MANIFEST_BODY));
    m.insert("MANIFEST_VERSION", Stated::Int(u64::from(manifest::MANIFEST_VERSION)));
    m.insert("MANIFEST_MIN_VERSION", Stated::Int(u64::from(manifest::MANIFEST_MIN_VERSION)));
    // The delivery table (format/delivery-wal.md, format/checkpoint.md).
    m.insert("WAL_MAGIC", Stated::Bytes(&wal::WAL_MAGIC));
    m.insert("WAL_VERSION", Stated::Int(u64::from(wal::WAL_VERSION)));
    m.insert("WAL_MIN_VERSION", Stated::Int(u64::from(wal::WAL_MIN_VERSION)));
    m.insert("KIND_CREATE", Stated::Int(u64::from(wal::KIND_CREATE)));
    m.insert("KIND_OPS", Stated::Int(u64::from(wal::KIND_OPS)));
    m.insert("WAL_MAX_BODY", Stated::Int(u64::from(wal::WAL_MAX_BODY)));
    m.insert("CKPT_MAGIC", Stated::Bytes(&checkpoint::CKPT_MAGIC));
    m.insert("CKPT_VERSION", Stated::Int(u64::from(checkpoint::CKPT_VERSION)));
    m.insert("CKPT_MIN_VERSION", Stated::Int(u64::from(checkpoint::CKPT_MIN_VERSION)));
    for (name, value) in [
        ("WAL_HEADER_LEN", wal::WAL_HEADER_LEN),
        ("WAL_HDR_GEN", wal::WAL_HDR_GEN),
        ("WAL_HDR_CRC", wal::WAL_HDR_CRC),
        ("WAL_FRAME_LEN", wal::WAL_FRAME_LEN),
        ("WAL_BODY_KIND", wal::WAL_BODY_KIND),
        ("WAL_BODY_NAME_LEN", wal::WAL_BODY_NAME_LEN),
        ("WAL_BODY_NAME", wal::WAL_BODY_NAME),
        ("CKPT_HDR_GEN", checkpoint::CKPT_HDR_GEN),
        ("CKPT_HDR_LSN", checkpoint::CKPT_HDR_LSN),
        ("CKPT_HDR_BODY_LEN", checkpoint::CKPT_HDR_BODY_LEN),
        ("CKPT_HDR_BODY_CRC", checkpoint::CKPT_HDR_BODY_CRC),
        ("CKPT_HDR_CRC", checkpoint::CKPT_HDR_CRC),
        ("CKPT_HEADER_LEN", checkpoint::CKPT_HEADER_LEN),
    ] {
        m.insert(name, int(value));
    }
    // The secondary index (format/secondary-index.md).
    m.insert("SIX_MAGIC", Stated::Bytes(&SIX_MAGIC));
    m.insert("SIX_VERSION", Stated::Int(u64::from(SIX_VERSION)));
    for (name, value) in [
        ("SIX_MAGIC_AT", six::SIX_MAGIC_AT),
        ("SIX_VERSION_AT", six::SIX_VERSION_AT),
        ("SIX_FLAGS_AT", six::SIX_FLAGS_AT),
        ("SIX_PARTITION_AT", six::SIX_PARTITION_AT),
        ("SIX_STREAM_AT", six::SIX_STREAM_AT),
        ("SIX_BASE_AT", six::SIX_BASE_AT),
        ("SIX_LAST_AT", six::SIX_LAST_AT),
        ("SIX_RECORDS_END_AT", six::SIX_RECORDS_END_AT),
        ("SIX_MAX_TS_AT", six::SIX_MAX_TS_AT),
        ("SIX_RESERVED_AT", six::SIX_RESERVED_AT),
        ("SIX_HEADER_CRC_AT", six::SIX_HEADER_CRC_AT),
        ("SIX_HEADER_LEN", SIX_HEADER_LEN),
        ("SIX_DIR_OFFSET_AT", six::SIX_DIR_OFFSET_AT),
        ("SIX_DIR_LEN_AT", six::SIX_DIR_LEN_AT),
        ("SIX_DIR_CRC_AT", six::SIX_DIR_CRC_AT),
        ("SIX_TRAILER_MAGIC_AT", six::SIX_TRAILER_MAGIC_AT),
        ("SIX_TRAILER_LEN", SIX_TRAILER_LEN),
        ("BLOCK_TARGET", six::BLOCK_TARGET),
        ("MAX_FIELDS", six::MAX_FIELDS),
        ("MAX_KEY_LEN", six::MAX_KEY_LEN),
    ] {
        m.insert(name, int(value));
    }
    for (name, tag) in [
        ("TAG_NULL", term::TAG_NULL),
        ("TAG_BOOL", term::TAG_BOOL),
        ("TAG_NUMBER", term::TAG_NUMBER),
        ("TAG_STRING", term::TAG_STRING),
        ("TAG_OTHER", term::TAG_OTHER),
    ] {
        m.insert(name, Stated::Int(u64::from(tag)));
    }
    m
}

/// The cells of each row of each Markdown table in `text`, header first.
fn tables(text: &str) -> Vec<Vec<Vec<String>>> {
    let mut out: Vec<Vec<Vec<String>>> = Vec::new();
    let mut current: Vec<Vec<String>> = Vec::new();
    let mut fenced = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if line.starts_with('|') && !fenced {
            let cells: Vec<String> = line.trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect::<Vec<_>>();
            if !cells.iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':')) {
                current.push(cells);
            }
        } else if !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// `NAME` from a cell written as `` `NAME` ``.
fn code_name(cell: &str) -> Option<&str> {
    cell.strip_prefix('`')?
        .strip_suffix('`')
        .filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit()))
}

/// The bytes of a cell written as `` `b"RHEOLOG\0"` `` (only `\0` escapes).
fn byte_literal(cell: &str) -> Option<Vec<u8>> {
    let s = cell.strip_prefix("`b\"")?.strip_suffix("\"`")?;
    Some(s.replace("\\0", "\0").into_bytes())
}

/// A decimal number at the start of a cell (`64`, `16777216 (16 MiB)`).
fn leading_number(cell: &str) -> Option<u64> {
    let digits: String = cell.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[test]
fn spec_tables_match_the_code() {
    let constants = code_constants();
    let mut stated: BTreeMap<String, usize> = BTreeMap::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("format");
    for doc in
        ["README.md", "segment.md", "index.md", "manifest.md", "delivery-wal.md", "checkpoint.md", "secondary-index.md"]
    {
        let text = std::fs::read_to_string(dir.join(doc)).unwrap_or_else(|e| panic!("format/{doc}: {e}"));
        for table in tables(&text) {
            let head: Vec<&str> = table[0].iter().map(String::as_str).collect();
            match head.as_slice() {
                ["Offset", "Size", "Type", "Field", "Constant", "Meaning"] => {
                    let mut next = 0u64;
                    let rows = &table[1..];
                    for (i, row) in rows.iter().enumerate() {
                        let at = format!("format/{doc}: row {row:?}");
                        let offset = leading_number(&row[0]).unwrap_or_else(|| panic!("{at}: offset"));
                        assert_eq!(offset, next, "{at}: fields are contiguous");
                        // Only the last field may have a variable size.
                        let size = leading_number(&row[1]);
                        assert!(size.is_some() || i + 1 == rows.len(), "{at}: size");
                        next = offset + size.unwrap_or(0);
                        if let Some(name) = code_name(&row[4]) {
                            match constants.get(name) {
                                Some(Stated::Int(v)) => assert_eq!(*v, offset, "{at}: {name} in the code"),
                                _ => panic!("{at}: {name} is not an offset constant of the code"),
                            }
                            *stated.entry(name.to_owned()).or_default() += 1;
                        }
                    }
                }
                ["Constant", "Value", "Meaning"] => {
                    for row in &table[1..] {
                        let at = format!("format/{doc}: constant {row:?}");
                        let name = code_name(&row[0]).unwrap_or_else(|| panic!("{at}: name"));
                        match constants.get(name) {
                            Some(Stated::Int(v)) => {
                                assert_eq!(leading_number(&row[1]), Some(*v), "{at}: {name} in the code");
                            }
                            Some(Stated::Bytes(b)) => {
                                assert_eq!(byte_literal(&row[1]).as_deref(), Some(*b), "{at}: {name} in the code");
                            }
                            None => panic!("{at}: {name} is not a constant of the code"),
                        }
                        *stated.entry(name.to_owned()).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
    }
    let missing: Vec<&&str> = constants.keys().filter(|k| !stated.contains_key(**k)).collect();
    assert!(missing.is_empty(), "constants the spec does not state: {missing:?}");
}

#[test]
fn the_stated_sizes_hold() {
    assert_eq!(FORMAT_VERSION, 1);
    assert_eq!((HEADER_LEN, FOOTER_LEN, IDX_HEADER_LEN, ENTRY_LEN), (64, 64, 32, 40));
    assert_eq!((FRAME_LEN, BODY_DOC, format::BODY_MIN, format::BODY_MIN_U32), (8, 28, 29, 29));
    assert_eq!((manifest::MAN_HEADER_LEN, txn::TXN_RECORD_LEN), (32, 16));
    assert_eq!(
        [&SEGMENT_MAGIC, &FOOTER_MAGIC, &INDEX_MAGIC, &manifest::MANIFEST_MAGIC, &txn::TXN_MAGIC],
        [b"RHEOLOG\0", b"RHEOSEAL", b"RHEOIDX\0", b"RHEOMAN\0", b"RHEOTXN\0"]
    );
    assert_eq!((FLAG_END, FLAG_MULTI, format::KNOWN_FLAGS), (1, 2, 3));
    assert_eq!(format::MAX_BODY_LEN, 16 << 20);
    assert_eq!(INDEX_INTERVAL_BYTES, 4096);
    assert_eq!(manifest::MAX_MANIFEST_BODY, 64 << 20);
    assert_eq!((wal::WAL_MIN_VERSION, wal::WAL_VERSION, checkpoint::CKPT_VERSION), (1, 5, 3));
    assert_eq!(checkpoint::CKPT_MIN_VERSION, 1);
    assert_eq!((manifest::MANIFEST_MIN_VERSION, manifest::MANIFEST_VERSION), (1, 2));
    assert_eq!((wal::WAL_MAGIC, checkpoint::CKPT_MAGIC), (*b"RHEOWAL\0", *b"RHEOCKP\0"));
    assert_eq!(
        (wal::WAL_HEADER_LEN, wal::WAL_FRAME_LEN, wal::WAL_BODY_NAME, checkpoint::CKPT_HEADER_LEN),
        (32, 8, 11, 48)
    );
    assert_eq!((wal::KIND_CREATE, wal::KIND_OPS, wal::WAL_MAX_BODY), (1, 2, 64 << 20));
    assert_eq!((SIX_MAGIC, SIX_VERSION, SIX_HEADER_LEN, SIX_TRAILER_LEN), (*b"RHEOSIX\0", 1, 64, 24));
    assert_eq!((six::BLOCK_TARGET, six::MAX_FIELDS, six::MAX_KEY_LEN), (4096, 1024, (16 << 20) + 3));
    // CRC32 is IEEE (reflected 0xEDB88320, init and xorout 0xFFFFFFFF).
    assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
}

// ============================================================ delivery table
//
// The delivery WAL (`format/delivery-wal.md`) and the checkpoint
// (`format/checkpoint.md`). Their MessagePack payloads are private types of
// the crate (`Transition`, `GroupSnapshot`), so this file carries its own
// implementation of the spec: a MessagePack reader and writer, and the schema
// of every payload. The vectors are built with it, byte by byte; the tests
// check that the engine decodes them as the spec says (`Engine::open` and the
// public API) and that the engine's own encoders write exactly what this
// implementation writes (`engine_writes_the_specified_records`,
// `engine_checkpoint_reproduces_the_vector`).

/// The groups directory of the vector stream.
const GROUPS_DIR: &str = "streams/0000000000000001/groups";
/// The length the preallocated delivery vectors are zero-filled to.
const WAL_PREALLOCATED_LEN: usize = 4096;

fn wal_path(generation: u64) -> String {
    format!("{GROUPS_DIR}/wal-{generation:020}.log")
}

fn ckpt_path(generation: u64) -> String {
    format!("{GROUPS_DIR}/checkpoint-{generation:020}.ckpt")
}

// ------------------------------------------------------------ MessagePack

/// A MessagePack value, as far as the delivery payloads use the format.
#[derive(Debug, Clone, PartialEq)]
enum Mp {
    Nil,
    Bool(bool),
    /// Any non-negative integer (positive fixint, uint 8/16/32/64).
    UInt(u64),
    /// A negative integer (negative fixint, int 8/16/32/64).
    NInt(i64),
    Str(String),
    Bin(Vec<u8>),
    Arr(Vec<Mp>),
    Map(Vec<(Mp, Mp)>),
}

/// Writes `v` in its smallest encoding, as `rmp` does.
fn mp_write(out: &mut Vec<u8>, v: &Mp) {
    fn len_prefix(out: &mut Vec<u8>, n: usize, fix: Option<(u8, usize)>, tags: [u8; 3]) {
        match fix {
            Some((base, max)) if n <= max => out.push(base | u8::try_from(n).expect("fix length")),
            _ if n <= 0xff && tags[0] != 0 => out.extend_from_slice(&[tags[0], u8::try_from(n).expect("u8")]),
            _ if n <= 0xffff => {
                out.push(tags[1]);
                out.extend_from_slice(&u16::try_from(n).expect("u16").to_be_bytes());
            }
            _ => {
                out.push(tags[2]);
                out.extend_from_slice(&u32::try_from(n).expect("u32").to_be_bytes());
            }
        }
    }
    match v {
        Mp::Nil => out.push(0xc0),
        Mp::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Mp::UInt(n) => match *n {
            0..=0x7f => out.push(u8::try_from(*n).expect("fixint")),
            0x80..=0xff => out.extend_from_slice(&[0xcc, u8::try_from(*n).expect("u8")]),
            0x100..=0xffff => {
                out.push(0xcd);
                out.extend_from_slice(&u16::try_from(*n).expect("u16").to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                out.push(0xce);
                out.extend_from_slice(&u32::try_from(*n).expect("u32").to_be_bytes());
            }
            _ => {
                out.push(0xcf);
                out.extend_from_slice(&n.to_be_bytes());
            }
        },
        Mp::NInt(n) => {
            assert!(*n < 0, "NInt holds negative integers");
            match *n {
                -32..=-1 => out.push(i8::try_from(*n).expect("fixint").to_be_bytes()[0]),
                -128..=-33 => {
                    out.push(0xd0);
                    out.extend_from_slice(&i8::try_from(*n).expect("i8").to_be_bytes());
                }
                -32768..=-129 => {
                    out.push(0xd1);
                    out.extend_from_slice(&i16::try_from(*n).expect("i16").to_be_bytes());
                }
                -2_147_483_648..=-32769 => {
                    out.push(0xd2);
                    out.extend_from_slice(&i32::try_from(*n).expect("i32").to_be_bytes());
                }
                _ => {
                    out.push(0xd3);
                    out.extend_from_slice(&n.to_be_bytes());
                }
            }
        }
        Mp::Str(s) => {
            len_prefix(out, s.len(), Some((0xa0, 31)), [0xd9, 0xda, 0xdb]);
            out.extend_from_slice(s.as_bytes());
        }
        Mp::Bin(b) => {
            len_prefix(out, b.len(), None, [0xc4, 0xc5, 0xc6]);
            out.extend_from_slice(b);
        }
        Mp::Arr(items) => {
            len_prefix(out, items.len(), Some((0x90, 15)), [0, 0xdc, 0xdd]);
            for i in items {
                mp_write(out, i);
            }
        }
        Mp::Map(pairs) => {
            len_prefix(out, pairs.len(), Some((0x80, 15)), [0, 0xde, 0xdf]);
            for (k, v) in pairs {
                mp_write(out, k);
                mp_write(out, v);
            }
        }
    }
}

fn mp_bytes(v: &Mp) -> Vec<u8> {
    let mut out = Vec::new();
    mp_write(&mut out, v);
    out
}

/// Reads one value at `*at` (any encoding of the kinds `Mp` holds; floats,
/// booleans and extensions are refused: no delivery payload has them).
fn mp_read(b: &[u8], at: &mut usize) -> Result<Mp, String> {
    fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], String> {
        let s = b.get(*at..*at + n).ok_or_else(|| format!("MessagePack cut short at {}", *at))?;
        *at += n;
        Ok(s)
    }
    fn be(b: &[u8], at: &mut usize, n: usize) -> Result<u64, String> {
        Ok(take(b, at, n)?.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)))
    }
    fn len(b: &[u8], at: &mut usize, n: usize) -> Result<usize, String> {
        be(b, at, n).map(to_usize)
    }
    let tag = *take(b, at, 1)?.first().expect("one byte");
    let n = |x: u8, mask: u8| usize::from(x & mask);
    let items =
        |b: &[u8], at: &mut usize, count: usize| (0..count).map(|_| mp_read(b, at)).collect::<Result<Vec<_>, _>>();
    let pairs = |b: &[u8], at: &mut usize, count: usize| {
        (0..count).map(|_| Ok((mp_read(b, at)?, mp_read(b, at)?))).collect::<Result<Vec<_>, String>>()
    };
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).map_err(|_| "str is not UTF-8".to_owned());
    Ok(match tag {
        0x00..=0x7f => Mp::UInt(u64::from(tag)),
        0x80..=0x8f => Mp::Map(pairs(b, at, n(tag, 0x0f))?),
        0x90..=0x9f => Mp::Arr(items(b, at, n(tag, 0x0f))?),
        0xa0..=0xbf => Mp::Str(text(take(b, at, n(tag, 0x1f))?)?),
        0xc0 => Mp::Nil,
        0xc2 => Mp::Bool(false),
        0xc3 => Mp::Bool(true),
        0xc4..=0xc6 => {
            let l = len(b, at, 1 << (tag - 0xc4))?;
            Mp::Bin(take(b, at, l)?.to_vec())
        }
        0xcc..=0xcf => Mp::UInt(be(b, at, 1 << (tag - 0xcc))?),
        0xd0..=0xd3 => {
            let width = 1usize << (tag - 0xd0);
            let raw = be(b, at, width)?;
            let shift = 64 - 8 * width;
            #[allow(clippy::cast_possible_wrap)]
            let v = ((raw << shift) as i64) >> shift;
            if v < 0 { Mp::NInt(v) } else { Mp::UInt(raw) }
        }
        0xd9..=0xdb => {
            let l = len(b, at, 1 << (tag - 0xd9))?;
            Mp::Str(text(take(b, at, l)?)?)
        }
        0xdc | 0xdd => {
            let l = len(b, at, 2 << (tag - 0xdc))?;
            Mp::Arr(items(b, at, l)?)
        }
        0xde | 0xdf => {
            let l = len(b, at, 2 << (tag - 0xde))?;
            Mp::Map(pairs(b, at, l)?)
        }
        0xe0..=0xff => Mp::NInt(i64::from(i8::from_be_bytes([tag]))),
        other => return Err(format!("MessagePack type 0x{other:02x} is not used by the delivery payloads")),
    })
}

/// Reads exactly one value filling `b`.
fn mp_parse(b: &[u8]) -> Result<Mp, String> {
    let mut at = 0;
    let v = mp_read(b, &mut at)?;
    if at != b.len() {
        return Err(format!("{} bytes after the MessagePack value", b.len() - at));
    }
    Ok(v)
}

// ----------------------------------------------------------------- schema

/// A payload type of the spec (`format/delivery-wal.md#messagepack-payloads`).
#[derive(Debug, Clone)]
enum Ty {
    U64,
    U32,
    /// `Timestamp`: i64 ms.
    I64,
    Str,
    /// A lease id: a UUID, as MessagePack bin 16 holding its 16 bytes in
    /// order (the u128 big-endian); in JSON its hyphenated form.
    LeaseId,
    Opt(Box<Ty>),
    /// A struct's last field, a bool written only when true (`true`, c3)
    /// and left out when false; in JSON `true` or absent.
    Flag,
    List(Box<Ty>),
    Tuple(Vec<Ty>),
    /// A struct: an array of its fields in this order; in JSON an object.
    Struct(Vec<(&'static str, Ty)>),
    /// An enum, externally tagged: a unit variant is its name (str); a
    /// newtype variant {name: value}; a struct variant {name: [fields]}.
    Enum(Vec<(&'static str, Variant)>),
}

#[derive(Debug, Clone)]
enum Variant {
    Unit,
    Newtype(Ty),
    Struct(Vec<(&'static str, Ty)>),
}

fn ty_duration() -> Ty {
    Ty::Struct(vec![("secs", Ty::U64), ("nanos", Ty::U32)])
}

fn ty_backoff() -> Ty {
    Ty::Enum(vec![
        ("None", Variant::Unit),
        ("Fixed", Variant::Newtype(ty_duration())),
        ("Exponential", Variant::Struct(vec![("base", ty_duration()), ("max", ty_duration())])),
    ])
}

/// A group snapshot as the current WAL and checkpoint versions hold it.
fn ty_group_snapshot() -> Ty {
    ty_group_snapshot_v(true, true)
}

/// A group snapshot; `skipped`: with each partition's `skipped` count (WAL
/// version 3, checkpoint version 2); `keyed`: with the summary's
/// `ordered_by_key` flag (WAL version 5, checkpoint version 3).
fn ty_group_snapshot_v(skipped: bool, keyed: bool) -> Ty {
    let mut summary = vec![
        ("name", Ty::Str),
        ("max_attempts", Ty::U32),
        ("partitions", Ty::Opt(Box::new(Ty::List(Box::new(Ty::U32))))),
        ("created_at", Ty::I64),
    ];
    if keyed {
        summary.push(("ordered_by_key", Ty::Flag));
    }
    let summary = Ty::Struct(summary);
    let holding = Ty::Enum(vec![
        ("Available", Variant::Unit),
        ("Leased", Variant::Struct(vec![("lease_id", Ty::LeaseId), ("consumer_id", Ty::Str), ("expires_at", Ty::I64)])),
        ("Waiting", Variant::Struct(vec![("ready_at", Ty::I64)])),
    ]);
    let delivery = Ty::Struct(vec![("seq", Ty::U64), ("attempt", Ty::U32), ("holding", holding)]);
    let dead = Ty::Struct(vec![
        ("seq", Ty::U64),
        ("reason", Ty::Str),
        ("attempts", Ty::U32),
        ("at", Ty::I64),
        ("order", Ty::U64),
    ]);
    let mut part = vec![
        ("p", Ty::U32),
        ("frontier", Ty::U64),
        ("floor", Ty::U64),
        ("cursor", Ty::U64),
        ("done", Ty::List(Box::new(Ty::Tuple(vec![Ty::U64, Ty::U64])))),
        ("deliveries", Ty::List(Box::new(delivery))),
        ("dead", Ty::List(Box::new(dead))),
    ];
    if skipped {
        part.push(("skipped", Ty::U64));
    }
    let part = Ty::Struct(part);
    Ty::Struct(vec![
        ("summary", summary),
        ("backoff", ty_backoff()),
        ("next_dead_order", Ty::U64),
        ("parts", Ty::List(Box::new(part))),
    ])
}

fn ty_op() -> Ty {
    let list = |t: Ty| Ty::List(Box::new(t));
    Ty::Enum(vec![
        (
            "Claim",
            Variant::Struct(vec![
                ("p", Ty::U32),
                ("consumer", Ty::Str),
                ("expires_at", Ty::I64),
                ("leases", list(Ty::Tuple(vec![Ty::U64, Ty::LeaseId]))),
            ]),
        ),
        ("Cursor", Variant::Struct(vec![("p", Ty::U32), ("cursor", Ty::U64)])),
        ("Renew", Variant::Struct(vec![("p", Ty::U32), ("seq", Ty::U64), ("expires_at", Ty::I64)])),
        ("Ack", Variant::Struct(vec![("p", Ty::U32), ("seqs", list(Ty::U64))])),
        (
            "Reschedule",
            Variant::Struct(vec![("p", Ty::U32), ("seq", Ty::U64), ("now", Ty::I64), ("ready_at", Ty::I64)]),
        ),
        ("DeadLetter", Variant::Struct(vec![("p", Ty::U32), ("seq", Ty::U64), ("reason", Ty::Str), ("at", Ty::I64)])),
        ("ReopenAfter", Variant::Struct(vec![("p", Ty::U32), ("after", Ty::U64)])),
        ("ReopenOne", Variant::Struct(vec![("p", Ty::U32), ("seqs", list(Ty::U64))])),
        ("Reset", Variant::Struct(vec![("p", Ty::U32), ("frontier", Ty::U64)])),
        ("Pass", Variant::Struct(vec![("p", Ty::U32), ("seqs", list(Ty::U64))])),
        ("Drop", Variant::Struct(vec![("p", Ty::U32), ("start", Ty::U64)])),
        ("Park", Variant::Struct(vec![("p", Ty::U32), ("seqs", list(Ty::Tuple(vec![Ty::U64, Ty::I64])))])),
    ])
}

fn ty_list(t: Ty) -> Ty {
    Ty::List(Box::new(t))
}

/// The MessagePack of a JSON value of type `ty`.
fn to_mp(ty: &Ty, v: &Value) -> Mp {
    let fields = |fs: &[(&str, Ty)], v: &Value| {
        Mp::Arr(
            fs.iter()
                .filter(|(name, t)| !matches!(t, Ty::Flag) || v.get(*name) == Some(&Value::Bool(true)))
                .map(|(name, t)| to_mp(t, v.get(*name).unwrap_or_else(|| panic!("no {name} in {v}"))))
                .collect(),
        )
    };
    match ty {
        Ty::U64 | Ty::U32 => Mp::UInt(v.as_u64().unwrap_or_else(|| panic!("{v} is not unsigned"))),
        Ty::I64 => {
            let n = v.as_i64().unwrap_or_else(|| panic!("{v} is not an i64"));
            if n < 0 { Mp::NInt(n) } else { Mp::UInt(n.unsigned_abs()) }
        }
        Ty::Str => Mp::Str(v.as_str().unwrap_or_else(|| panic!("{v} is not a string")).to_owned()),
        Ty::Flag => Mp::Bool(true),
        Ty::LeaseId => {
            let id = uuid::Uuid::parse_str(v.as_str().unwrap_or_default()).unwrap_or_else(|e| panic!("{v}: {e}"));
            Mp::Bin(id.as_bytes().to_vec())
        }
        Ty::Opt(t) => {
            if v.is_null() {
                Mp::Nil
            } else {
                to_mp(t, v)
            }
        }
        Ty::List(t) => {
            Mp::Arr(v.as_array().unwrap_or_else(|| panic!("{v} is not a list")).iter().map(|x| to_mp(t, x)).collect())
        }
        Ty::Tuple(ts) => {
            let xs = v.as_array().unwrap_or_else(|| panic!("{v} is not a tuple"));
            assert_eq!(xs.len(), ts.len(), "tuple {v}");
            Mp::Arr(ts.iter().zip(xs).map(|(t, x)| to_mp(t, x)).collect())
        }
        Ty::Struct(fs) => fields(fs, v),
        Ty::Enum(variants) => {
            if let Some(name) = v.as_str() {
                assert!(variants.iter().any(|(n, k)| *n == name && matches!(k, Variant::Unit)), "unit variant {name}");
                return Mp::Str(name.to_owned());
            }
            let (name, inner) = v.as_object().and_then(|o| o.iter().next()).unwrap_or_else(|| panic!("variant {v}"));
            let (_, kind) = variants.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no variant {name}"));
            let value = match kind {
                Variant::Unit => panic!("{name} is a unit variant"),
                Variant::Newtype(t) => to_mp(t, inner),
                Variant::Struct(fs) => fields(fs, inner),
            };
            Mp::Map(vec![(Mp::Str(name.clone()), value)])
        }
    }
}

/// The JSON value of MessagePack of type `ty`; refuses anything the spec does
/// not allow there (another MessagePack type, a map as a struct, a wrong
/// field count, an unknown variant, a bin of another length).
fn from_mp(ty: &Ty, v: &Mp) -> Result<Value, String> {
    let fields = |fs: &[(&str, Ty)], v: &Mp| -> Result<Value, String> {
        let Mp::Arr(items) = v else { return Err(format!("a struct must be an array, got {v:?}")) };
        // A trailing flag is left out when false.
        let flag_left_out = matches!(fs.last(), Some((_, Ty::Flag))) && items.len() + 1 == fs.len();
        if items.len() != fs.len() && !flag_left_out {
            return Err(format!("a struct of {} fields is an array of {}", fs.len(), items.len()));
        }
        let mut o = serde_json::Map::new();
        for ((name, t), x) in fs.iter().zip(items) {
            o.insert((*name).to_owned(), from_mp(t, x).map_err(|e| format!("{name}: {e}"))?);
        }
        Ok(Value::Object(o))
    };
    Ok(match (ty, v) {
        (Ty::U64, Mp::UInt(n)) => json!(n),
        (Ty::U32, Mp::UInt(n)) if u32::try_from(*n).is_ok() => json!(n),
        (Ty::I64, Mp::UInt(n)) if i64::try_from(*n).is_ok() => json!(n),
        (Ty::I64, Mp::NInt(n)) => json!(n),
        (Ty::Str, Mp::Str(s)) => json!(s),
        // Written only when true.
        (Ty::Flag, Mp::Bool(true)) => json!(true),
        (Ty::LeaseId, Mp::Bin(b)) if b.len() == 16 => {
            json!(uuid::Uuid::from_slice(b).map_err(|e| e.to_string())?.hyphenated().to_string())
        }
        (Ty::Opt(_), Mp::Nil) => Value::Null,
        (Ty::Opt(t), x) => from_mp(t, x)?,
        (Ty::List(t), Mp::Arr(xs)) => Value::Array(xs.iter().map(|x| from_mp(t, x)).collect::<Result<_, _>>()?),
        (Ty::Tuple(ts), Mp::Arr(xs)) if xs.len() == ts.len() => {
            Value::Array(ts.iter().zip(xs).map(|(t, x)| from_mp(t, x)).collect::<Result<_, _>>()?)
        }
        (Ty::Struct(fs), x) => fields(fs, x)?,
        (Ty::Enum(variants), Mp::Str(name)) => match variants.iter().find(|(n, _)| n == name) {
            Some((_, Variant::Unit)) => json!(name),
            _ => return Err(format!("{name:?} is not a unit variant")),
        },
        (Ty::Enum(variants), Mp::Map(pairs)) if pairs.len() == 1 => {
            let Mp::Str(name) = &pairs[0].0 else { return Err("a variant name must be a str".into()) };
            let inner = match variants.iter().find(|(n, _)| n == name) {
                Some((_, Variant::Newtype(t))) => from_mp(t, &pairs[0].1)?,
                Some((_, Variant::Struct(fs))) => fields(fs, &pairs[0].1)?,
                _ => return Err(format!("{name:?} is not a variant with fields")),
            };
            let mut o = serde_json::Map::new();
            o.insert(name.clone(), inner);
            Value::Object(o)
        }
        (t, x) => return Err(format!("{x:?} is not a {t:?}")),
    })
}

fn encode_payload(ty: &Ty, v: &Value) -> Vec<u8> {
    let bytes = mp_bytes(&to_mp(ty, v));
    // What the spec writes, the spec reads back to the same value (the
    // fields `ty` holds: an older version's type leaves newer ones out).
    let back = from_mp(ty, &mp_parse(&bytes).expect("parses")).unwrap_or_else(|e| panic!("{v}: {e}"));
    assert_eq!(mp_bytes(&to_mp(ty, &back)), bytes, "round trip of {v}");
    if !matches!(ty, Ty::Struct(_) | Ty::List(_)) || v.to_string().len() == back.to_string().len() {
        assert_eq!(&back, v, "round trip of {v}");
    }
    bytes
}

fn decode_payload(ty: &Ty, b: &[u8]) -> Result<Value, String> {
    from_mp(ty, &mp_parse(b)?)
}

// ------------------------------------------------ the delivery vectors

/// When `billing` is created (all delivery times are T0-based ms).
const T_BILLING: i64 = T0 + 60_000;
/// The claim of `billing`'s transitions record: leases until `E1`.
const E1: i64 = T0 + 150_000;
/// The renewed lease's expiry.
const E2: i64 = T0 + 180_000;
/// The retry: at `N1`, claimable again at `R`.
const N1: i64 = T0 + 125_000;
const R: i64 = T0 + 135_000;
/// The dead letter's time.
const N2: i64 = T0 + 126_000;
/// When `audit` is created.
const T_AUDIT: i64 = T0 + 130_000;
/// When the tests look at the recovered state: after every time in the
/// records, before `R`, `E1` and `E2`.
const T_CHECK: i64 = T0 + 131_000;

/// Lease id `n` of the vectors: UUIDs whose 16 bytes all differ from their
/// mirror image, so that a byte-order mistake shows.
fn lease_id(n: u16) -> String {
    format!("1f2e3d4c-5b6a-4978-8a9b-0c0d0e0f{n:04x}")
}

fn empty_part(p: u32, frontier: u64) -> Value {
    json!({"p": p, "frontier": frontier, "floor": frontier, "cursor": frontier, "done": [], "deliveries": [], "dead": [], "skipped": 0})
}

fn billing_summary() -> Value {
    json!({"name": "billing", "max_attempts": 3, "partitions": null, "created_at": T_BILLING})
}

fn billing_backoff() -> Value {
    json!({"Exponential": {"base": {"secs": 0, "nanos": 500_000_000}, "max": {"secs": 60, "nanos": 0}}})
}

/// `billing` as created: start at the beginning, 3 attempts, exponential backoff.
fn billing_created() -> Value {
    json!({"summary": billing_summary(), "backoff": billing_backoff(), "next_dead_order": 0, "parts": [empty_part(0, 0)]})
}

/// One transitions record with every `Transition` variant, in an order a live group
/// could not produce in one call but each step consistent with the state
/// before it (see `format/vectors/README.md`).
fn billing_ops() -> Value {
    let leases: Vec<Value> = (2u16..=7).map(|s| json!([s, lease_id(s)])).collect();
    json!([
        {"Reset": {"p": 0, "frontier": 1}},
        {"Claim": {"p": 0, "consumer": "worker-1", "expires_at": E1, "leases": leases}},
        {"Renew": {"p": 0, "seq": 5, "expires_at": E2}},
        {"Ack": {"p": 0, "seqs": [2, 3, 7]}},
        {"Reschedule": {"p": 0, "seq": 4, "now": N1, "ready_at": R}},
        {"ReopenAfter": {"p": 0, "after": 5}},
        {"Cursor": {"p": 0, "cursor": 6}},
        {"DeadLetter": {"p": 0, "seq": 6, "reason": "bad payload", "at": N2}},
        {"ReopenOne": {"p": 0, "seqs": [2]}},
    ])
}

/// `billing` after its transitions.
fn billing_after() -> Value {
    json!({
        "summary": billing_summary(),
        "backoff": billing_backoff(),
        "next_dead_order": 1,
        "parts": [{
            "p": 0, "frontier": 1, "floor": 1, "cursor": 6,
            "done": [[3, 3], [6, 6]],
            "deliveries": [
                {"seq": 2, "attempt": 0, "holding": "Available"},
                {"seq": 4, "attempt": 1, "holding": {"Waiting": {"ready_at": R}}},
                {"seq": 5, "attempt": 1, "holding": {"Leased": {"lease_id": lease_id(5), "consumer_id": "worker-1", "expires_at": E2}}},
            ],
            "dead": [{"seq": 6, "reason": "bad payload", "attempts": 1, "at": N2, "order": 0}],
            "skipped": 0,
        }],
    })
}

/// `audit` as created: one attempt, partitions `[0]`, start after 3, fixed backoff.
fn audit_created() -> Value {
    json!({
        "summary": {"name": "audit", "max_attempts": 1, "partitions": [0], "created_at": T_AUDIT},
        "backoff": {"Fixed": {"secs": 2, "nanos": 500_000_000}},
        "next_dead_order": 0,
        "parts": [empty_part(0, 3)],
    })
}

fn shipping_created() -> Value {
    json!({
        "summary": {"name": "shipping", "max_attempts": 5, "partitions": null, "created_at": T0 + 60_000},
        "backoff": "None",
        "next_dead_order": 0,
        "parts": [empty_part(0, 0)],
    })
}

fn shipping_claimed() -> Value {
    let leased = |s: u16| json!({"seq": s, "attempt": 1, "holding": {"Leased": {"lease_id": lease_id(0x10 + s), "consumer_id": "worker-2", "expires_at": T0 + 90_000}}});
    json!({
        "summary": shipping_created()["summary"],
        "backoff": "None",
        "next_dead_order": 0,
        "parts": [{"p": 0, "frontier": 0, "floor": 0, "cursor": 2, "done": [], "deliveries": [leased(1), leased(2)], "dead": [], "skipped": 0}],
    })
}

/// The records of the version 2 vector: `shipping` created, two claims, a
/// pass, an ack.
fn shipping_records_v2() -> Vec<Value> {
    let mut records = shipping_records();
    records[2] = json!({"lsn": 3, "group": "shipping", "ops": [{"Pass": {"p": 0, "seqs": [3]}}]});
    records.push(json!({"lsn": 4, "group": "shipping", "ops": [{"Ack": {"p": 0, "seqs": [1]}}]}));
    records
}

/// `shipping` after the version 2 vector: 1 acked, 2 leased, 3 passed over
/// (claimable, no attempt counted).
fn shipping_passed() -> Value {
    let mut state = shipping_claimed();
    let part = &mut state["parts"][0];
    part["frontier"] = json!(1);
    part["cursor"] = json!(3);
    let leased_2 = part["deliveries"][1].clone();
    part["deliveries"] = json!([leased_2, {"seq": 3, "attempt": 0, "holding": "Available"}]);
    state
}

/// The records of the torn and corrupt vectors: `shipping` created, two
/// claims, an ack.
fn shipping_records() -> Vec<Value> {
    let leases: Vec<Value> = (1u16..=2).map(|s| json!([s, lease_id(0x10 + s)])).collect();
    vec![
        json!({"lsn": 1, "group": "shipping", "create": shipping_created()}),
        json!({"lsn": 2, "group": "shipping", "ops": [{"Claim": {"p": 0, "consumer": "worker-2", "expires_at": T0 + 90_000, "leases": leases}}]}),
        json!({"lsn": 3, "group": "shipping", "ops": [{"Ack": {"p": 0, "seqs": [1]}}]}),
    ]
}

/// A delivery WAL header of the current version.
fn spec_wal_header(generation: u64) -> Vec<u8> {
    spec_wal_header_v(generation, 5)
}

/// A delivery WAL header, byte by byte (`format/delivery-wal.md#header`).
fn spec_wal_header_v(generation: u64, version: u16) -> Vec<u8> {
    let mut b = b"RHEOWAL\0".to_vec();
    b.extend_from_slice(&version.to_le_bytes()); // version
    b.extend_from_slice(&[0; 6]); // reserved u16, reserved u32
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(&[0; 4]); // reserved u32
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// A record's kind and payload.
fn spec_wal_payload(r: &Value, version: u16) -> (u8, Vec<u8>) {
    match (r.get("create"), r.get("ops")) {
        (Some(snap), None) => (1, encode_payload(&ty_group_snapshot_v(version >= 3, version >= 5), snap)),
        (None, Some(ops)) => (2, encode_payload(&ty_list(ty_op()), ops)),
        _ => panic!("a record is a create or a list of ops: {r}"),
    }
}

/// A framed WAL record, byte by byte (`format/delivery-wal.md#records`).
fn spec_wal_record(r: &Value, version: u16) -> Vec<u8> {
    let (kind, payload) = spec_wal_payload(r, version);
    let group = js(r, "group");
    let mut body = ju(r, "lsn").to_le_bytes().to_vec();
    body.push(kind);
    body.extend_from_slice(&u16::try_from(group.len()).expect("short name").to_le_bytes());
    body.extend_from_slice(group.as_bytes());
    body.extend_from_slice(&payload);
    let mut out = u32::try_from(body.len()).expect("small body").to_le_bytes().to_vec();
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A WAL file of the current version: the header, then `records`; and
/// each record's offset.
fn spec_wal(generation: u64, records: &[Value]) -> (Vec<u8>, Vec<usize>) {
    spec_wal_v(generation, 5, records)
}

/// A WAL file of `version`.
fn spec_wal_v(generation: u64, version: u16, records: &[Value]) -> (Vec<u8>, Vec<usize>) {
    let mut b = spec_wal_header_v(generation, version);
    let mut offsets = Vec::new();
    for r in records {
        offsets.push(b.len());
        b.extend_from_slice(&spec_wal_record(r, version));
    }
    (b, offsets)
}

/// A checkpoint, byte by byte (`format/checkpoint.md`).
fn spec_checkpoint(generation: u64, lsn: u64, groups: &Value) -> Vec<u8> {
    spec_checkpoint_v(3, generation, lsn, groups)
}

/// A checkpoint of `version`.
fn spec_checkpoint_v(version: u16, generation: u64, lsn: u64, groups: &Value) -> Vec<u8> {
    let body = encode_payload(&ty_list(ty_group_snapshot_v(version >= 2, version >= 3)), groups);
    let mut b = b"RHEOCKP\0".to_vec();
    b.extend_from_slice(&version.to_le_bytes()); // version
    b.extend_from_slice(&[0; 6]); // reserved u16, reserved u32
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(&lsn.to_le_bytes());
    b.extend_from_slice(&(body.len() as u64).to_le_bytes());
    b.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(&body);
    b
}

fn wal_header_json(file: &[u8], generation: u64) -> Value {
    json!({
        "magic_hex": hex(b"RHEOWAL\0"),
        "version": le_u16(file, 8),
        "generation": generation,
        "crc": le_u32(file, 28),
        "hex": hex(&file[..32]),
    })
}

fn wal_record_json(r: &Value, offset: usize, file: &[u8]) -> Value {
    let body_len = le_u32(file, offset);
    let (kind, payload) = spec_wal_payload(r, le_u16(file, 8));
    let mut out = json!({
        "offset": offset,
        "size": 8 + body_len,
        "body_len": body_len,
        "body_crc": le_u32(file, offset + 4),
        "lsn": r["lsn"],
        "kind": kind,
        "group": r["group"],
        "payload_hex": hex(&payload),
    });
    if let Some(ops) = r.get("ops") {
        out["ops"] = ops.clone();
    }
    if r.get("create").is_some() {
        // As this version holds it (before 3: without `skipped`; before 5,
        // without `ordered_by_key`).
        let v = le_u16(file, 8);
        let ty = ty_group_snapshot_v(v >= 3, v >= 5);
        out["create"] = decode_payload(&ty, &payload).expect("the create record decodes");
    }
    out
}

fn recovery_json(checkpoint: Option<(u64, u64)>, replayed: u64, torn_bytes: usize, clamped: usize) -> Value {
    json!({"checkpoint": checkpoint.map(|(g, l)| json!([g, l])), "replayed": replayed, "torn_bytes": torn_bytes, "clamped": clamped})
}

/// `delivery-wal.log`: generation 1 with `billing` created, its transitions
/// (every `Transition` variant), and `audit` created.
fn build_delivery_wal(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let records = [
        json!({"lsn": 1, "group": "billing", "create": billing_created()}),
        json!({"lsn": 2, "group": "billing", "ops": billing_ops()}),
        json!({"lsn": 3, "group": "audit", "create": audit_created()}),
    ];
    let (bytes, offsets) = spec_wal_v(1, 1, &records);
    let expected = json!({
        "description": "Delivery WAL version 1, generation 1: group billing created (kind 1), one transitions record of billing holding every Op variant (kind 2), group audit created (kind 1). The file ends after the last record.",
        "path": wal_path(1),
        "length": bytes.len(),
        "header": wal_header_json(&bytes, 1),
        "records": records.iter().zip(&offsets).map(|(r, &o)| wal_record_json(r, o, &bytes)).collect::<Vec<_>>(),
        "scan_end": {"offset": bytes.len(), "kind": "eof"},
        "inspect": {"generation": 1, "records": 3, "last_lsn": 3, "end": "clean"},
        "open": {
            "recovery": recovery_json(None, 3, 0, 0),
            "length_after": bytes.len(),
            "state_after": [audit_created(), billing_after()],
        },
    });
    files.insert("delivery-wal.log", bytes);
    files.insert("delivery-wal.json", pretty(&expected));
}

/// `delivery-wal-v2.log`: version 2, `shipping` created, a claim of 1 and
/// 2, a pass over 3 (a fetch that could not read it), an ack of 1.
fn build_delivery_wal_v2(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let records = shipping_records_v2();
    let (bytes, offsets) = spec_wal_v(1, 2, &records);
    let expected = json!({
        "description": "Delivery WAL version 2, generation 1: group shipping created, a claim of sequences 1 and 2, a Pass of sequence 3 (a fetch passed over it: its record could not be read), an ack of 1. The file ends after the last record.",
        "path": wal_path(1),
        "length": bytes.len(),
        "header": wal_header_json(&bytes, 1),
        "records": records.iter().zip(&offsets).map(|(r, &o)| wal_record_json(r, o, &bytes)).collect::<Vec<_>>(),
        "scan_end": {"offset": bytes.len(), "kind": "eof"},
        "inspect": {"generation": 1, "records": 4, "last_lsn": 4, "end": "clean"},
        "open": {
            "recovery": recovery_json(None, 4, 0, 0),
            "length_after": bytes.len(),
            "state_after": [shipping_passed()],
        },
    });
    files.insert("delivery-wal-v2.log", bytes);
    files.insert("delivery-wal-v2.json", pretty(&expected));
}

/// The records of the version 3 vector: `shipping` created, two claims,
/// an ack of 1, and retention dropping sequences 1 to 2 (a `Drop` with
/// start 3): 2 was leased and is counted as skipped.
fn shipping_records_v3() -> Vec<Value> {
    let mut records = shipping_records();
    records.push(json!({"lsn": 4, "group": "shipping", "ops": [{"Drop": {"p": 0, "start": 3}}]}));
    records
}

/// `shipping` after the version 3 vector: the frontier at 2, nothing in
/// flight, one event skipped.
fn shipping_dropped() -> Value {
    let mut state = shipping_claimed();
    let part = &mut state["parts"][0];
    part["frontier"] = json!(2);
    part["cursor"] = json!(2);
    part["deliveries"] = json!([]);
    part["skipped"] = json!(1);
    state
}

/// `delivery-wal-v3.log`: version 3, `shipping` created, a claim of 1 and
/// 2, an ack of 1, retention's `Drop` of everything below 3.
fn build_delivery_wal_v3(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let description = "Delivery WAL version 3, generation 1: group shipping created, a claim of sequences 1 and 2, an ack of 1, and a Drop with start 3 (retention deleted sequences 1 and 2): the frontier moves to 2, the lease of 2 is gone and counted as skipped. The file ends after the last record.";
    build_shipping_wal(files, 3, &shipping_records_v3(), description, shipping_dropped());
}

/// The records of the version 4 vector: `shipping` created, two claims,
/// an ack of 1, and a fetch that met sequence 3 before its scheduled time
/// (a `Park` until T0 + 120 s).
fn shipping_records_v4() -> Vec<Value> {
    let mut records = shipping_records();
    records.push(json!({"lsn": 4, "group": "shipping", "ops": [
        {"Park": {"p": 0, "seqs": [[3, T0 + 120_000]]}},
        {"Cursor": {"p": 0, "cursor": 4}},
    ]}));
    records
}

/// `shipping` after the version 4 vector: 1 acked, 2 leased, 3 waiting
/// for its time with no attempt used, the cursor past 4.
fn shipping_parked() -> Value {
    let mut state = shipping_claimed();
    let part = &mut state["parts"][0];
    part["frontier"] = json!(1);
    part["cursor"] = json!(4);
    let leased_2 = part["deliveries"][1].clone();
    part["deliveries"] =
        json!([leased_2, {"seq": 3, "attempt": 0, "holding": {"Waiting": {"ready_at": T0 + 120_000}}}]);
    state
}

/// `delivery-wal-v4.log`: version 4, `shipping` created, a claim of 1 and
/// 2, an ack of 1, a fetch that set 3 aside until its scheduled time.
fn build_delivery_wal_v4(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let description = "Delivery WAL version 4, generation 1: group shipping created, a claim of sequences 1 and 2, an ack of 1, and a fetch that met sequence 3 before its scheduled delivery time (a Park until T0 + 120 s: a waiting delivery with no attempt used) and moved its cursor over 4. The file ends after the last record.";
    build_shipping_wal(files, 4, &shipping_records_v4(), description, shipping_parked());
}

/// `delivery-wal-v5.log`: version 5, `shipping` created with per-key
/// order (its summary's trailing `true`), a claim of 1 and 2, an ack of 1.
fn build_delivery_wal_v5(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let keyed = |mut v: Value| {
        v["summary"]["ordered_by_key"] = json!(true);
        v
    };
    let mut records = shipping_records();
    records[0]["create"] = keyed(records[0]["create"].clone());
    let description = "Delivery WAL version 5, generation 1: group shipping created with per-key order (a 5-element summary ending in true), a claim of sequences 1 and 2, and an ack of 1. Reopened, the group is keyed: its materialized deliveries' keys are learned from the log, not stored. The file ends after the last record.";
    let mut after = keyed(shipping_claimed());
    let part = &mut after["parts"][0];
    part["frontier"] = json!(1);
    part["deliveries"] = json!([part["deliveries"][1].clone()]);
    build_shipping_wal(files, 5, &records, description, after);
}

/// `delivery-wal-v<version>.log` holding `records` (generation 1,
/// records, the file ending after the last), and its JSON: opened, it
/// leaves `shipping` as `state_after`.
fn build_shipping_wal(
    files: &mut BTreeMap<&'static str, Vec<u8>>,
    version: u16,
    records: &[Value],
    description: &str,
    state_after: Value,
) {
    let (bytes, offsets) = spec_wal_v(1, version, records);
    let expected = json!({
        "description": description,
        "path": wal_path(1),
        "length": bytes.len(),
        "header": wal_header_json(&bytes, 1),
        "records": records.iter().zip(&offsets).map(|(r, &o)| wal_record_json(r, o, &bytes)).collect::<Vec<_>>(),
        "scan_end": {"offset": bytes.len(), "kind": "eof"},
        "inspect": {"generation": 1, "records": records.len(), "last_lsn": records.len(), "end": "clean"},
        "open": {
            "recovery": recovery_json(None, records.len() as u64, 0, 0),
            "length_after": bytes.len(),
            "state_after": [state_after],
        },
    });
    let (log, json) = match version {
        3 => ("delivery-wal-v3.log", "delivery-wal-v3.json"),
        4 => ("delivery-wal-v4.log", "delivery-wal-v4.json"),
        5 => ("delivery-wal-v5.log", "delivery-wal-v5.json"),
        _ => panic!("no vector of version {version}"),
    };
    files.insert(log, bytes);
    files.insert(json, pretty(&expected));
}

/// `delivery-wal-torn.log`: `shipping`'s records 1 and 2, the first half of
/// record 3, zeros to 4096 bytes.
fn build_delivery_wal_torn(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let records = shipping_records();
    let (full, offsets) = spec_wal_v(1, 1, &records);
    let cut = offsets[2];
    let mut bytes = full[..cut + (full.len() - cut) / 2].to_vec();
    bytes.resize(WAL_PREALLOCATED_LEN, 0);
    let reason = "record checksum mismatch";
    let expected = json!({
        "description": "Delivery WAL generation 1: group shipping created, a claim, then the first half of an ack record (LSN 3) and zeros to 4096 bytes (preallocated): a torn tail.",
        "path": wal_path(1),
        "length": bytes.len(),
        "header": wal_header_json(&bytes, 1),
        "records": records[..2].iter().zip(&offsets).map(|(r, &o)| wal_record_json(r, o, &bytes)).collect::<Vec<_>>(),
        "scan_end": {"offset": cut, "kind": "damaged", "reason": reason},
        "inspect": {"generation": 1, "records": 2, "last_lsn": 2, "end": {"damaged": reason}},
        "open": {
            "recovery": recovery_json(None, 2, last_nonzero_end(&bytes) - cut, 0),
            "length_after": cut,
            "state_after": [shipping_claimed()],
            "strict_error": {"offset": cut, "reason_contains": format!("damaged record: {reason}")},
        },
    });
    files.insert("delivery-wal-torn.log", bytes);
    files.insert("delivery-wal-torn.json", pretty(&expected));
}

/// `delivery-wal-corrupt.log`: `shipping`'s three records, one bit of record
/// 2's payload flipped.
fn build_delivery_wal_corrupt(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let records = shipping_records();
    let (mut bytes, offsets) = spec_wal_v(1, 1, &records);
    let flipped = offsets[1] + 8 + 11 + "shipping".len() + 4;
    bytes[flipped] ^= 0x01;
    let reason = "record checksum mismatch";
    let rec2 = offsets[1];
    let intact: Vec<Value> = [0usize, 2].iter().map(|&i| wal_record_json(&records[i], offsets[i], &bytes)).collect();
    let expected = json!({
        "description": "Delivery WAL generation 1: group shipping created, a claim with one bit flipped in its payload, then a valid ack record (LSN 3): damage followed by a valid record, not a torn tail.",
        "path": wal_path(1),
        "length": bytes.len(),
        "header": wal_header_json(&bytes, 1),
        "records": intact,
        "damage": {"byte_offset": flipped, "xor": 1, "record_offset": rec2},
        "scan_end": {"offset": rec2, "kind": "damaged", "reason": reason},
        "inspect": {"generation": 1, "records": 1, "last_lsn": 1, "end": {"damaged": reason}},
        "open": {
            "error": {"offset": rec2, "reason_contains": format!("damage followed by valid records: {reason}")},
            "truncate_at_first_damage": {
                "recovery": recovery_json(None, 1, last_nonzero_end(&bytes) - rec2, 0),
                "length_after": rec2,
                "state_after": [shipping_created()],
            },
        },
    });
    files.insert("delivery-wal-corrupt.log", bytes);
    files.insert("delivery-wal-corrupt.json", pretty(&expected));
}

/// The checkpoint of `delivery-wal.log`'s state: generation 2, LSN 3.
fn build_checkpoint(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    build_checkpoint_v(files, 3, "checkpoint.ckpt", "checkpoint.json");
    build_checkpoint_v(files, 2, "checkpoint-v2.ckpt", "checkpoint-v2.json");
    build_checkpoint_v(files, 1, "checkpoint-v1.ckpt", "checkpoint-v1.json");
}

/// The checkpoint of `version` (1: without the partitions' `skipped` counts).
/// No group of it is keyed (the state of a version 1 WAL): the flag's bytes
/// are those of `delivery-wal-v5.log`'s create record, the same type.
fn build_checkpoint_v(
    files: &mut BTreeMap<&'static str, Vec<u8>>,
    version: u16,
    file: &'static str,
    json_file: &'static str,
) {
    let state = json!([audit_created(), billing_after()]);
    let bytes = spec_checkpoint_v(version, 2, 3, &state);
    // As this version holds them (version 1: without `skipped`).
    let groups =
        decode_payload(&ty_list(ty_group_snapshot_v(version >= 2, version >= 3)), &bytes[48..]).expect("decodes");
    let h = 48;
    let expected = json!({
        "description": format!("Checkpoint version {version}, generation 2 at LSN 3: the state delivery-wal.log leaves (groups audit and billing, by name), as Engine::checkpoint writes it after replaying that WAL{}.", match version {
            1 => " (version 1: without each partition's skipped count, read as 0)",
            2 => " (version 2: no group summary holds ordered_by_key)",
            _ => "",
        }),
        "path": ckpt_path(2),
        "length": bytes.len(),
        "header": {
            "magic_hex": hex(b"RHEOCKP\0"),
            "version": version,
            "generation": 2,
            "lsn": 3,
            "body_len": bytes.len() - h,
            "body_crc": le_u32(&bytes, 40),
            "header_crc": le_u32(&bytes, 44),
            "hex": hex(&bytes[..h]),
        },
        "groups": groups,
        "body_hex": hex(&bytes[h..]),
        "inspect": {"generation": 2, "lsn": 3, "groups": 2},
        "open": {
            "recovery": recovery_json(Some((2, 3)), 0, 0, 0),
            "state_after": state,
        },
    });
    files.insert(file, bytes);
    files.insert(json_file, pretty(&expected));
}

/// `checkpoint.ckpt` with one bit of its body flipped.
fn build_checkpoint_corrupt(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let mut bytes = spec_checkpoint(2, 3, &json!([audit_created(), billing_after()]));
    let flipped = 48 + 10;
    bytes[flipped] ^= 0x01;
    let reason = "checkpoint body checksum mismatch";
    let expected = json!({
        "description": "checkpoint.ckpt with bit 0 of body byte 10 flipped: the header is intact, the body checksum fails. Every recovery mode refuses it.",
        "path": ckpt_path(2),
        "length": bytes.len(),
        "damage": {"byte_offset": flipped, "xor": 1},
        "inspect": {"error": reason},
        "open": {"error": {"offset": 0, "reason_contains": reason}},
    });
    files.insert("checkpoint-corrupt.ckpt", bytes);
    files.insert("checkpoint-corrupt.json", pretty(&expected));
}

/// The delivery vectors, by stem.
const WAL_VECTORS: [&str; 7] = [
    "delivery-wal",
    "delivery-wal-torn",
    "delivery-wal-corrupt",
    "delivery-wal-v2",
    "delivery-wal-v3",
    "delivery-wal-v4",
    "delivery-wal-v5",
];

// ------------------------------------------------- decoding (delivery)

/// Reads a WAL file record by record as the spec says: the records (in the
/// vectors' JSON form) and where and why the reading stops.
fn spec_scan_wal(file: &[u8]) -> (Vec<Value>, Value) {
    let mut at = 32;
    let mut out = Vec::new();
    let damaged = |at: usize, reason: String| json!({"offset": at, "kind": "damaged", "reason": reason});
    let stop = loop {
        if at == file.len() {
            break json!({"offset": at, "kind": "eof"});
        }
        if file.len() - at < 8 {
            break damaged(at, "a frame cut short by the end of the file".into());
        }
        let len = to_usize(u64::from(le_u32(file, at)));
        if len == 0 {
            break json!({"offset": at, "kind": "zeros"});
        }
        if len > 64 << 20 {
            break damaged(at, format!("record length {len} exceeds {}", 64 << 20));
        }
        let Some(body) = file.get(at + 8..at + 8 + len) else {
            break damaged(at, "a record cut short by the end of the file".into());
        };
        if crc32fast::hash(body) != le_u32(file, at + 4) {
            break damaged(at, "record checksum mismatch".into());
        }
        let decoded = (|| -> Result<Value, String> {
            let fixed = body.get(..11).ok_or("body shorter than its fixed fields")?;
            let name_len = usize::from(le_u16(fixed, 9));
            let name = body.get(11..11 + name_len).ok_or("group name runs past the record")?;
            let group = std::str::from_utf8(name).map_err(|e| e.to_string())?;
            let payload = &body[11 + name_len..];
            let mut r = json!({
                "offset": at, "size": 8 + len, "body_len": len, "body_crc": le_u32(file, at + 4),
                "lsn": le_u64(body, 0), "kind": body[8], "group": group, "payload_hex": hex(payload),
            });
            match body[8] {
                1 => {
                    r["create"] = {
                        let v = le_u16(file, 8);
                        decode_payload(&ty_group_snapshot_v(v >= 3, v >= 5), payload)?
                    }
                }
                2 => r["ops"] = decode_payload(&ty_list(ty_op()), payload)?,
                k => return Err(format!("unknown record kind {k}")),
            }
            Ok(r)
        })();
        match decoded {
            Ok(r) => out.push(r),
            Err(why) => break damaged(at, why),
        }
        at += 8 + len;
    };
    (out, stop)
}

fn check_wal_vector(stem: &str) {
    let name = format!("{stem}.log");
    let file = read_vector(&name);
    let e = read_json(&format!("{stem}.json"));
    assert_eq!(file.len() as u64, ju(&e, "length"), "{name}: length");
    // The header, field by field.
    let h = &e["header"];
    let generation = ju(h, "generation");
    assert_eq!(hex(&file[..8]), js(h, "magic_hex"), "{name}: magic");
    assert_eq!(file[..8], wal::WAL_MAGIC, "{name}: WAL_MAGIC");
    assert_eq!(u64::from(le_u16(&file, 8)), ju(h, "version"), "{name}: version");
    let version = le_u16(&file, 8);
    assert!((wal::WAL_MIN_VERSION..=wal::WAL_VERSION).contains(&version), "{name}: a version this build reads");
    assert_eq!((le_u16(&file, 10), le_u32(&file, 12), le_u32(&file, 24)), (0, 0, 0), "{name}: reserved");
    assert_eq!(le_u64(&file, wal::WAL_HDR_GEN), generation, "{name}: generation");
    assert_eq!(u64::from(le_u32(&file, wal::WAL_HDR_CRC)), ju(h, "crc"), "{name}: header crc");
    assert_eq!(u64::from(crc32fast::hash(&file[..28])), ju(h, "crc"), "{name}: crc is CRC32 of 0..28");
    assert_eq!(hex(&file[..wal::WAL_HEADER_LEN]), js(h, "hex"), "{name}: header bytes");
    assert_eq!(wal::check_header(&file), Ok(generation), "{name}: wal::check_header");
    if version == wal::WAL_VERSION {
        assert_eq!(wal::header(generation)[..], file[..32], "{name}: wal::header writes these bytes");
    }
    // Record by record, with the spec's decoder.
    let (records, stop) = spec_scan_wal(&file);
    assert_eq!(stop, e["scan_end"], "{name}: where the records end");
    let stop_at = ju(&stop, "offset");
    let listed: Vec<&Value> =
        e["records"].as_array().expect("records").iter().filter(|r| ju(r, "offset") < stop_at).collect();
    assert_eq!(records.iter().collect::<Vec<_>>(), listed, "{name}: the records before the end");
    // Every listed record, wherever it is (after damage too).
    for r in e["records"].as_array().expect("records") {
        let at = to_usize(ju(r, "offset"));
        let size = to_usize(ju(r, "size"));
        let mut alone = spec_wal_header_v(generation, version);
        alone.extend_from_slice(&file[at..at + size]);
        let (mut found, _) = spec_scan_wal(&alone);
        assert_eq!(found.len(), 1, "{name}: record at {at}");
        found[0]["offset"] = json!(at);
        assert_eq!(&found[0], r, "{name}: record at {at}");
        assert_eq!(spec_wal_record(r, version), file[at..at + size], "{name}: record at {at} re-encoded");
    }
    // The engine's summary.
    let i = &e["inspect"];
    let end = match &i["end"] {
        Value::String(s) if s == "clean" => None,
        d => Some(js(d, "damaged").to_owned()),
    };
    let expected = (generation, to_usize(ju(i, "records")), ju(i, "last_lsn"), end);
    let got = wal::inspect(&file).map(|(g, n, last, end)| match end {
        wal::End::Clean => (g, n, last, None),
        wal::End::Damaged(e) => (g, n, last, Some(e.to_string())),
        wal::End::Undecodable(e) => (g, n, last, Some(format!("undecodable: {e}"))),
    });
    assert_eq!(got, Ok(expected), "{name}: wal::inspect");
    if let Some(damage) = e.get("damage") {
        let mut repaired = file.clone();
        repaired[to_usize(ju(damage, "byte_offset"))] ^= u8::try_from(ju(damage, "xor")).expect("a byte");
        let (found, stop) = spec_scan_wal(&repaired);
        assert!(
            found.iter().any(|r| r["offset"] == damage["record_offset"]),
            "{name}: undoing the flip restores the record"
        );
        assert_eq!(stop["kind"], "eof", "{name}: and every record after it");
    }
}

fn check_checkpoint_vector(stem: &str) {
    let file = read_vector(&format!("{stem}.ckpt"));
    let e = read_json(&format!("{stem}.json"));
    let version = le_u16(&file, 8);
    let h = &e["header"];
    assert_eq!(file.len() as u64, ju(&e, "length"), "checkpoint length");
    assert_eq!(hex(&file[..8]), js(h, "magic_hex"), "checkpoint magic");
    assert_eq!(file[..8], checkpoint::CKPT_MAGIC, "CKPT_MAGIC");
    assert_eq!(u64::from(le_u16(&file, 8)), ju(h, "version"), "checkpoint version");
    if stem == "checkpoint" {
        assert_eq!(u64::from(checkpoint::CKPT_VERSION), ju(h, "version"), "CKPT_VERSION");
    }
    assert_eq!((le_u16(&file, 10), le_u32(&file, 12)), (0, 0), "checkpoint reserved");
    assert_eq!(le_u64(&file, checkpoint::CKPT_HDR_GEN), ju(h, "generation"), "checkpoint generation");
    assert_eq!(le_u64(&file, checkpoint::CKPT_HDR_LSN), ju(h, "lsn"), "checkpoint lsn");
    assert_eq!(le_u64(&file, checkpoint::CKPT_HDR_BODY_LEN), ju(h, "body_len"), "checkpoint body_len");
    let body = &file[checkpoint::CKPT_HEADER_LEN..];
    assert_eq!(body.len() as u64, ju(h, "body_len"), "body_len is the rest of the file");
    assert_eq!(u64::from(le_u32(&file, checkpoint::CKPT_HDR_BODY_CRC)), ju(h, "body_crc"), "checkpoint body crc");
    assert_eq!(u64::from(crc32fast::hash(body)), ju(h, "body_crc"), "body crc is CRC32 of the body");
    assert_eq!(u64::from(le_u32(&file, checkpoint::CKPT_HDR_CRC)), ju(h, "header_crc"), "checkpoint header crc");
    assert_eq!(u64::from(crc32fast::hash(&file[..44])), ju(h, "header_crc"), "header crc is CRC32 of 0..44");
    assert_eq!(hex(&file[..48]), js(h, "hex"), "checkpoint header bytes");
    assert_eq!(hex(body), js(&e, "body_hex"), "checkpoint body bytes");
    let ty = ty_list(ty_group_snapshot_v(version >= 2, version >= 3));
    assert_eq!(decode_payload(&ty, body).as_ref(), Ok(&e["groups"]), "{stem}: checkpoint body");
    assert_eq!(
        checkpoint::check_header(&file),
        Ok((ju(h, "generation"), ju(h, "lsn"), ju(h, "body_len"))),
        "checkpoint::check_header"
    );
    let i = &e["inspect"];
    assert_eq!(checkpoint::inspect(&file), Ok((ju(i, "generation"), ju(i, "lsn"), to_usize(ju(i, "groups")))));
    if stem != "checkpoint" {
        return;
    }

    let bad = read_vector("checkpoint-corrupt.ckpt");
    let e = read_json("checkpoint-corrupt.json");
    assert_eq!(bad.len() as u64, ju(&e, "length"), "corrupt checkpoint length");
    let got = checkpoint::inspect(&bad).map_err(|e| e.to_string());
    assert_eq!(got, Err(js(&e["inspect"], "error").to_owned()), "corrupt checkpoint");
    assert!(checkpoint::check_header(&bad).is_ok(), "its header is intact");
    let mut repaired = bad.clone();
    repaired[to_usize(ju(&e["damage"], "byte_offset"))] ^= u8::try_from(ju(&e["damage"], "xor")).expect("a byte");
    assert!(repaired == file, "undoing the flip gives checkpoint.ckpt");
}

#[test]
fn delivery_vectors_decode_as_expected() {
    for stem in WAL_VECTORS {
        check_wal_vector(stem);
    }
    check_checkpoint_vector("checkpoint");
    check_checkpoint_vector("checkpoint-v2");
    check_checkpoint_vector("checkpoint-v1");
}

#[test]
fn the_message_pack_payloads_are_as_specified() {
    // Hand-checked encodings of the spec's rules (format/delivery-wal.md).
    let op = ty_op();
    let cases = [
        // A struct variant: map(1) {name: array of its fields}; a u128 lease
        // id: bin 8 of 16 bytes, the UUID's bytes in order.
        (
            json!({"Claim": {"p": 0, "consumer": "c", "expires_at": 1, "leases": [[2, "00112233-4455-6677-8899-aabbccddeeff"]]}}),
            "81a5436c61696d9400a16301919202c41000112233445566778899aabbccddeeff",
        ),
        (json!({"Ack": {"p": 1, "seqs": [300, 70000]}}), "81a341636b920192cd012cce00011170"),
        (json!({"Reset": {"p": 0, "frontier": 0}}), "81a55265736574920000"),
    ];
    for (v, want) in cases {
        assert_eq!(hex(&encode_payload(&op, &v)), want, "{v}");
    }
    let backoff = ty_backoff();
    // A unit variant is its name; a newtype variant {name: value}; a
    // Duration the array [secs, nanos].
    assert_eq!(hex(&encode_payload(&backoff, &json!("None"))), "a44e6f6e65");
    assert_eq!(hex(&encode_payload(&backoff, &json!({"Fixed": {"secs": 2, "nanos": 0}}))), "81a54669786564920200");
    // Timestamps are i64: negative ones use the signed encodings.
    let renew = json!({"Renew": {"p": 0, "seq": 1, "expires_at": -1}});
    assert_eq!(hex(&encode_payload(&op, &renew)), "81a552656e6577930001ff");
    // The reader refuses what the spec does not allow.
    for (bytes, what) in [
        (
            &[0x81, 0xa3, b'A', b'c', b'k', 0x82, 0xa1, b'p', 0x00, 0xa4, b's', b'e', b'q', b's', 0x90][..],
            "a struct as a map",
        ),
        (&[0x81, 0xa3, b'A', b'c', b'k', 0x91, 0x00][..], "a struct missing a field"),
        (&[0x81, 0xa3, b'N', b'a', b'k', 0x92, 0x00, 0x90][..], "an unknown variant"),
    ] {
        assert!(decode_payload(&op, bytes).is_err(), "{what}");
    }
}

// ------------------------------------------------- recovery (delivery)

/// A data directory with the manifest, the transaction log and the sealed
/// segment of the vectors (partition 0 holds sequences 1-7), and `files` in
/// the stream's groups directory.
fn delivery_dir(files: &[(String, Vec<u8>)]) -> MemVfs {
    let mem = data_dir(&read_vector("segment-sealed.log"), Some(&read_vector("segment-sealed.idx")));
    mem.create_dir_all(GROUPS_DIR).expect("mkdir");
    mem.sync_dir(STREAM_DIR).expect("sync dir");
    for (path, bytes) in files {
        mem.write_file(path, bytes).expect("write");
    }
    mem
}

fn delivery_report(engine: &Engine) -> Value {
    let reports = engine.delivery_recovery();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].0, STREAM);
    let r = &reports[0].1;
    recovery_json(r.checkpoint, r.replayed, to_usize(r.torn_bytes), r.clamped)
}

fn group_files(mem: &MemVfs) -> Vec<String> {
    let mut names = mem.list(GROUPS_DIR).expect("list");
    names.sort();
    names
}

/// The recovered state of every group, as the engine's own checkpoint writes
/// it (checked byte for byte by `engine_checkpoint_reproduces_the_vector`),
/// decoded by the spec.
fn recovered_state(engine: &Engine, mem: &MemVfs) -> Value {
    engine.checkpoint(STREAM).expect("checkpoint");
    let name = group_files(mem).into_iter().rfind(|n| n.starts_with("checkpoint-")).expect("a checkpoint");
    let bytes = mem.read_file(&format!("{GROUPS_DIR}/{name}")).expect("checkpoint");
    checkpoint::check_header(&bytes).expect("checkpoint header");
    decode_payload(&ty_list(ty_group_snapshot()), &bytes[48..]).expect("checkpoint body")
}

/// Opens `files` with `mode` and checks the delivery recovery report, the
/// WAL after recovery and the recovered state against `want`.
fn check_wal_opened(file: &[u8], mode: RecoveryMode, want: &Value, name: &str) {
    let name = format!("{name} {mode:?}");
    let mem = delivery_dir(&[(wal_path(1), file.to_vec())]);
    let engine = open(&mem, mode).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(delivery_report(&engine), want["recovery"], "{name}: delivery_recovery()");
    let after = mem.read_file(&wal_path(1)).expect("the WAL");
    let kept = to_usize(ju(want, "length_after"));
    assert_eq!(after.len(), kept, "{name}: length after recovery");
    assert_eq!(after[..], file[..kept], "{name}: kept bytes");
    assert_eq!(recovered_state(&engine, &mem), want["state_after"], "{name}: recovered state");
}

fn check_wal_recovery(stem: &str) {
    let name = format!("{stem}.log");
    let file = read_vector(&name);
    let e = read_json(&format!("{stem}.json"));
    let want = &e["open"];
    if let Some(err) = want.get("error") {
        for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict] {
            let opened = open(&delivery_dir(&[(wal_path(1), file.clone())]), mode);
            expect_corrupt(
                opened,
                &wal_path(1),
                ju(err, "offset"),
                js(err, "reason_contains"),
                &format!("{name} {mode:?}"),
            );
        }
        if let Some(cut) = want.get("truncate_at_first_damage") {
            check_wal_opened(&file, RecoveryMode::TruncateAtFirstDamage, cut, &name);
        }
        return;
    }
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::TruncateAtFirstDamage] {
        check_wal_opened(&file, mode, want, &name);
    }
    match want.get("strict_error") {
        Some(err) => {
            let opened = open(&delivery_dir(&[(wal_path(1), file.clone())]), RecoveryMode::Strict);
            expect_corrupt(
                opened,
                &wal_path(1),
                ju(err, "offset"),
                js(err, "reason_contains"),
                &format!("{name} Strict"),
            );
        }
        None => check_wal_opened(&file, RecoveryMode::Strict, want, &name),
    }
}

#[test]
fn delivery_vectors_recover_as_expected() {
    for stem in WAL_VECTORS {
        check_wal_recovery(stem);
    }
    // The checkpoint alone: loaded, nothing replayed; a new WAL generation
    // (its own) is created for the records after it.
    for stem in ["checkpoint", "checkpoint-v2", "checkpoint-v1"] {
        let e = read_json(&format!("{stem}.json"));
        for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::TruncateAtFirstDamage] {
            let mem = delivery_dir(&[(ckpt_path(2), read_vector(&format!("{stem}.ckpt")))]);
            let engine = open(&mem, mode).unwrap_or_else(|err| panic!("{stem} {mode:?}: {err}"));
            assert_eq!(delivery_report(&engine), e["open"]["recovery"], "{stem} {mode:?}");
            assert_eq!(
                mem.read_file(&wal_path(2)),
                Some(spec_wal_header(2)),
                "{stem} {mode:?}: WAL generation 2 created"
            );
            assert_eq!(recovered_state(&engine, &mem), e["open"]["state_after"], "{stem} {mode:?}");
        }
    }
    // A damaged checkpoint is refused in every mode.
    let e = read_json("checkpoint-corrupt.json");
    let err = &e["open"]["error"];
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::TruncateAtFirstDamage] {
        let mem = delivery_dir(&[(ckpt_path(2), read_vector("checkpoint-corrupt.ckpt"))]);
        let (offset, reason) = (ju(err, "offset"), js(err, "reason_contains"));
        expect_corrupt(open(&mem, mode), &ckpt_path(2), offset, reason, &format!("checkpoint-corrupt {mode:?}"));
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(f)
}

fn lease_ref(group: &str, seq: u64, id: &str) -> LeaseRef {
    LeaseRef {
        stream: STREAM.into(),
        group: group.into(),
        partition: 0,
        sequence: seq,
        lease_id: id.parse().expect("a lease id"),
        receipt: None,
    }
}

#[test]
fn the_replayed_groups_behave_as_the_vector_says() {
    // delivery-wal.log, and checkpoint.ckpt (the same state), through the
    // public API.
    let inputs = [(wal_path(1), read_vector("delivery-wal.log")), (ckpt_path(2), read_vector("checkpoint.ckpt"))];
    for input in inputs {
        let name = input.0.clone();
        let mem = delivery_dir(&[input]);
        let engine = open(&mem, RecoveryMode::Strict).expect("open");
        let clock = ManualClock::new(Timestamp::from_millis(T_CHECK));
        let b = NativeBackend::with_engine(engine, Arc::new(clock.clone()));
        block_on(async {
            let groups = b.list_groups(STREAM).await.expect("groups");
            let summaries: Vec<_> = groups
                .iter()
                .map(|g| {
                    (g.name.as_str(), g.max_attempts, g.partitions.clone(), g.created_at.as_millis(), g.ordered_by_key)
                })
                .collect();
            assert_eq!(
                summaries,
                [("audit", 1, Some(vec![0]), T_AUDIT, false), ("billing", 3, None, T_BILLING, false)],
                "{name}"
            );
            let info = b.group_info(STREAM, "billing").await.expect("info");
            let p = &info.lag.partitions[0];
            assert_eq!(
                (p.frontier, p.high_watermark, info.inflight, info.retry_waiting, info.dead_letters),
                (1, 7, 1, 1, 1),
                "{name}"
            );
            let dead = b.dead_letters(STREAM, "billing", &DeadLetterOptions::default()).await.expect("dead letters");
            let dead: Vec<_> = dead
                .iter()
                .map(|d| (d.sequence, d.reason.as_str(), d.attempts, d.dead_lettered_at.as_millis()))
                .collect();
            assert_eq!(dead, [(6, "bad payload", 1, N2)], "{name}");
            // The lease id is the UUID whose bytes the bin holds.
            b.ack(&lease_ref("billing", 5, &lease_id(5))).await.unwrap_or_else(|e| panic!("{name}: ack 5: {e}"));
            assert!(b.ack(&lease_ref("billing", 4, &lease_id(4))).await.is_err(), "{name}: 4 waits for a retry");
            // 2 was reopened, 7 is above the cursor; 3 and 6 are settled, 4 waits until R.
            let fetch = FetchOptions::new().limit(10).consumer("c");
            let got = b.fetch(STREAM, "billing", &fetch).await.expect("fetch").leases;
            assert_eq!(got.iter().map(|l| (l.sequence(), l.attempt)).collect::<Vec<_>>(), [(2, 1), (7, 1)], "{name}");
            clock.set(Timestamp::from_millis(R));
            let got = b.fetch(STREAM, "billing", &fetch).await.expect("fetch").leases;
            assert_eq!(got.iter().map(|l| (l.sequence(), l.attempt)).collect::<Vec<_>>(), [(4, 2)], "{name}");
            // audit starts after 3.
            let got = b.fetch(STREAM, "audit", &fetch).await.expect("fetch").leases;
            assert_eq!(got.iter().map(Lease::sequence).collect::<Vec<_>>(), [4, 5, 6, 7], "{name}");
        });
    }
}

#[test]
fn engine_checkpoint_reproduces_the_vector() {
    // The engine's checkpoint encoder, after replaying delivery-wal.log,
    // writes exactly checkpoint.ckpt; the procedure leaves WAL generation 2
    // (a bare header) and deletes generation 1.
    let mem = delivery_dir(&[(wal_path(1), read_vector("delivery-wal.log"))]);
    let engine = open(&mem, RecoveryMode::Strict).expect("open");
    engine.checkpoint(STREAM).expect("checkpoint");
    assert!(
        mem.read_file(&ckpt_path(2)) == Some(read_vector("checkpoint.ckpt")),
        "the engine's checkpoint is checkpoint.ckpt"
    );
    assert_eq!(mem.read_file(&wal_path(2)), Some(spec_wal_header(2)));
    assert_eq!(group_files(&mem), ["checkpoint-00000000000000000002.ckpt", "wal-00000000000000000002.log"]);
    drop(engine);
    // What is on disk after a power loss is the same.
    mem.crash();
    assert_eq!(group_files(&mem), ["checkpoint-00000000000000000002.ckpt", "wal-00000000000000000002.log"]);
    let engine = open(&mem, RecoveryMode::Strict).expect("reopen");
    assert_eq!(delivery_report(&engine), recovery_json(Some((2, 3)), 0, 0, 0));
}

/// Live calls through the public API, each making known transitions: the
/// engine's WAL must be, byte for byte, what the spec's encoder writes for
/// them (with the lease ids the engine chose).
#[test]
fn engine_writes_the_specified_records() {
    let mem = delivery_dir(&[]);
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
    let t = T0 + 200_000;
    let clock = ManualClock::new(Timestamp::from_millis(t));
    let b = NativeBackend::with_engine(engine, Arc::new(clock));
    let leases = |ls: &[Lease]| ls.iter().map(|l| json!([l.sequence(), l.lease_id])).collect::<Vec<_>>();
    let claim = |consumer: &str, ls: &[Lease]| json!([{"Claim": {"p": 0, "consumer": consumer, "expires_at": t + 30_000, "leases": leases(ls)}}]);
    let mut expected = Vec::new();
    block_on(async {
        b.create_group(STREAM, "live", &GroupOptions::new()).await.expect("create");
        let created = json!({
            "summary": {"name": "live", "max_attempts": 5, "partitions": null, "created_at": t},
            "backoff": "None", "next_dead_order": 0, "parts": [empty_part(0, 0)],
        });
        expected.push(json!({"group": "live", "create": created}));
        let fetch = |n: usize, c: &str| FetchOptions::new().limit(n).consumer(c).lease(Duration::from_secs(30));
        let l = b.fetch(STREAM, "live", &fetch(3, "c1")).await.expect("fetch").leases;
        expected.push(json!({"group": "live", "ops": claim("c1", &l)}));
        b.renew(&l[0].to_ref(), Duration::from_secs(10)).await.expect("renew");
        expected.push(json!({"group": "live", "ops": [{"Renew": {"p": 0, "seq": 1, "expires_at": t + 10_000}}]}));
        b.ack(&l[0].to_ref()).await.expect("ack");
        expected.push(json!({"group": "live", "ops": [{"Ack": {"p": 0, "seqs": [1]}}]}));
        b.retry(&l[1].to_ref(), "later", Some(Duration::from_secs(5))).await.expect("retry");
        expected.push(
            json!({"group": "live", "ops": [{"Reschedule": {"p": 0, "seq": 2, "now": t, "ready_at": t + 5_000}}]}),
        );
        b.reject(&l[2].to_ref(), "bad").await.expect("reject");
        expected.push(json!({"group": "live", "ops": [{"DeadLetter": {"p": 0, "seq": 3, "reason": "bad", "at": t}}]}));
        let q = Query::new(STREAM).eq("id", "evt-0001");
        assert_eq!(
            b.replay(STREAM, "live", &ReplayOptions::query(q).validate(STREAM, "live").expect("valid"))
                .await
                .expect("replay"),
            1
        );
        expected.push(json!({"group": "live", "ops": [{"ReopenOne": {"p": 0, "seqs": [1]}}]}));
        b.replay(STREAM, "live", &ReplayOptions::from_sequence(0).validate(STREAM, "live").expect("valid"))
            .await
            .expect("replay");
        expected.push(json!({"group": "live", "ops": [{"ReopenAfter": {"p": 0, "after": 0}}]}));
        let l = b.fetch(STREAM, "live", &fetch(10, "c2")).await.expect("fetch").leases;
        assert_eq!(l.iter().map(Lease::sequence).collect::<Vec<_>>(), [1, 3, 4, 5, 6, 7], "2 waits for its retry");
        expected.push(json!({"group": "live", "ops": claim("c2", &l)}));
        // Everything in flight: a fetch moves the cursor over it and claims nothing.
        b.replay(STREAM, "live", &ReplayOptions::from_sequence(0).validate(STREAM, "live").expect("valid"))
            .await
            .expect("replay");
        expected.push(json!({"group": "live", "ops": [{"ReopenAfter": {"p": 0, "after": 0}}]}));
        assert!(b.fetch(STREAM, "live", &fetch(10, "c2")).await.expect("fetch").leases.is_empty());
        expected.push(json!({"group": "live", "ops": [{"Cursor": {"p": 0, "cursor": 7}}]}));
        b.reset_group(
            STREAM,
            "live",
            &ResetOptions::confirmed().start_after(2).confirmed_for(STREAM, "live").expect("confirmed"),
        )
        .await
        .expect("reset");
        expected.push(json!({"group": "live", "ops": [{"Reset": {"p": 0, "frontier": 2}}]}));
        let l = b.fetch(STREAM, "live", &fetch(2, "c3")).await.expect("fetch").leases;
        expected.push(json!({"group": "live", "ops": claim("c3", &l)}));
        let refs: Vec<LeaseRef> = l.iter().map(Lease::to_ref).collect();
        assert!(b.ack_many(&refs).await.expect("ack_many").iter().all(Result::is_ok));
        expected.push(json!({"group": "live", "ops": [{"Ack": {"p": 0, "seqs": [3, 4]}}]}));
    });
    for (i, r) in expected.iter_mut().enumerate() {
        r["lsn"] = json!(i + 1);
    }
    let (want, _) = spec_wal(1, &expected);
    let got = mem.read_file(&wal_path(1)).expect("the WAL");
    let (records, stop) = spec_scan_wal(&got);
    assert_eq!(stop["kind"], "zeros", "the WAL is zero-filled after its records: {stop}");
    let end = to_usize(ju(&stop, "offset"));
    for (r, e) in records.iter().zip(&expected) {
        for key in ["lsn", "group", "create", "ops"] {
            assert_eq!(r.get(key), e.get(key), "record {}: {key}", e["lsn"]);
        }
    }
    assert_eq!(records.len(), expected.len(), "record count");
    assert!(got[..end] == want[..], "the engine's WAL is byte for byte the spec's");
    assert!(got[end..].iter().all(|&x| x == 0), "zeros after the records");
}

/// Runs `calls` on a fresh group under `durability`, then loses power and
/// reopens: how many WAL records survived.
fn records_after_power_loss(durability: Durability, calls: usize) -> u64 {
    let mem = delivery_dir(&[]);
    let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
    let engine = Engine::open(vfs.clone(), EngineOptions::default().durability(durability)).expect("open");
    let clock = ManualClock::new(Timestamp::from_millis(T0 + 200_000));
    let b = NativeBackend::with_engine(engine, Arc::new(clock));
    block_on(async {
        b.create_group(STREAM, "g", &GroupOptions::new()).await.expect("create");
        let l = b.fetch(STREAM, "g", &FetchOptions::new().limit(2)).await.expect("fetch").leases;
        if calls >= 3 {
            b.renew(&l[0].to_ref(), Duration::from_secs(60)).await.expect("renew");
        }
        if calls >= 4 {
            b.ack(&l[1].to_ref()).await.expect("ack");
        }
    });
    mem.crash();
    drop(b);
    let engine = open(&mem, RecoveryMode::Strict).expect("reopen");
    engine.delivery_recovery()[0].1.replayed
}

#[test]
fn what_is_synced_before_a_call_returns() {
    // Sync: creation and settles are synced before they return; claims and
    // renewals ride on the next sync.
    assert_eq!(records_after_power_loss(Durability::Sync, 2), 1, "create synced, claim not");
    assert_eq!(records_after_power_loss(Durability::Sync, 3), 1, "renew not synced");
    assert_eq!(records_after_power_loss(Durability::Sync, 4), 4, "the ack's sync covers the claim and renew before it");
    // None: nothing until a checkpoint.
    assert_eq!(records_after_power_loss(Durability::None, 4), 0, "nothing synced");
}

/// `billing_after()` with the lease of 5 acknowledged.
fn billing_after_ack_5() -> Value {
    let mut g = billing_after();
    let part = &mut g["parts"][0];
    part["done"] = json!([[3, 3], [5, 6]]);
    part["deliveries"].as_array_mut().expect("deliveries").retain(|d| d["seq"] != 5);
    g
}

#[test]
fn wal_generations_replay_after_the_newest_checkpoint() {
    // checkpoint-2 (LSN 3) is the newest: checkpoint-1 and WAL generation 1
    // are older and deleted unread (even garbage); generation 2 replays
    // what follows LSN 3 and skips what the checkpoint covers.
    let (wal2, _) = spec_wal(
        2,
        &[
            json!({"lsn": 3, "group": "audit", "create": audit_created()}),
            json!({"lsn": 4, "group": "billing", "ops": [{"Ack": {"p": 0, "seqs": [5]}}]}),
        ],
    );
    let files = [
        (ckpt_path(1), b"garbage".to_vec()),
        (wal_path(1), b"garbage".to_vec()),
        (ckpt_path(2), read_vector("checkpoint.ckpt")),
        (wal_path(2), wal2),
        (format!("{GROUPS_DIR}/checkpoint-00000000000000000003.ckpt.tmp"), b"a checkpoint cut short".to_vec()),
    ];
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::TruncateAtFirstDamage] {
        let mem = delivery_dir(&files);
        let engine = open(&mem, mode).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(delivery_report(&engine), recovery_json(Some((2, 3)), 1, 0, 0), "{mode:?}");
        assert_eq!(
            group_files(&mem),
            ["checkpoint-00000000000000000002.ckpt", "wal-00000000000000000002.log"],
            "{mode:?}"
        );
        assert_eq!(recovered_state(&engine, &mem), json!([audit_created(), billing_after_ack_5()]), "{mode:?}");
    }
}

#[test]
fn a_damaged_older_wal_generation_is_corruption_in_every_mode() {
    // A torn tail is tolerated in the newest generation only: an older one
    // was synced before the next was created.
    let torn = read_vector("delivery-wal-torn.log");
    let cut = ju(&read_json("delivery-wal-torn.json")["scan_end"], "offset");
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::TruncateAtFirstDamage] {
        let mem = delivery_dir(&[(wal_path(1), torn.clone()), (wal_path(2), spec_wal_header(2))]);
        expect_corrupt(
            open(&mem, mode),
            &wal_path(1),
            cut,
            "damaged record: record checksum mismatch",
            &format!("{mode:?}"),
        );
    }
}

#[test]
fn a_wal_creation_cut_short_is_removed() {
    let wal = read_vector("delivery-wal.log");
    let mut bad_crc = spec_wal_header(2);
    bad_crc[28] ^= 1;
    let mut bad_crc_40 = bad_crc.clone();
    bad_crc_40.resize(40, 0);
    let cut_short = [
        ("empty", Vec::new()),
        ("zeros", vec![0; 32]),
        ("a partial header", spec_wal_header(2)[..20].to_vec()),
        ("a bad header", bad_crc.clone()),
        ("a bad header and 8 zero bytes", bad_crc_40),
    ];
    for (name, bytes) in cut_short {
        // The newest generation: removed (not in Strict mode).
        for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::TruncateAtFirstDamage] {
            let mem = delivery_dir(&[(wal_path(1), wal.clone()), (wal_path(2), bytes.clone())]);
            let engine = open(&mem, mode).unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
            assert_eq!(delivery_report(&engine), recovery_json(None, 3, 0, 0), "{name} {mode:?}");
            assert!(mem.read_file(&wal_path(2)).is_none(), "{name} {mode:?}: removed");
        }
        let mem = delivery_dir(&[(wal_path(1), wal.clone()), (wal_path(2), bytes.clone())]);
        expect_corrupt(open(&mem, RecoveryMode::Strict), &wal_path(2), 0, "", &format!("{name} Strict"));
        // The only generation: removed and created again.
        let mem = delivery_dir(&[(wal_path(1), bytes.clone())]);
        let engine = open(&mem, RecoveryMode::TolerateTornTail).unwrap_or_else(|e| panic!("{name} alone: {e}"));
        assert_eq!(delivery_report(&engine), recovery_json(None, 0, 0, 0), "{name} alone");
        assert_eq!(mem.read_file(&wal_path(1)), Some(spec_wal_header(1)), "{name} alone: created again");
        // Not the newest generation: corruption.
        let mem = delivery_dir(&[(wal_path(1), bytes.clone()), (wal_path(2), spec_wal_header(2))]);
        expect_corrupt(open(&mem, RecoveryMode::TolerateTornTail), &wal_path(1), 0, "", &format!("{name} older"));
    }
    // Longer than a header and a frame (40 bytes), a bad header is damage:
    // a creation writes the header alone.
    let mut bad = wal.clone();
    bad[28] ^= 1;
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::TruncateAtFirstDamage] {
        let mem = delivery_dir(&[(wal_path(1), bad.clone())]);
        expect_corrupt(
            open(&mem, mode),
            &wal_path(1),
            0,
            "delivery WAL header checksum mismatch",
            &format!("{mode:?}"),
        );
    }
}

#[test]
fn a_wal_creation_cut_short_keeps_the_generation_before_it() {
    let wal = read_vector("delivery-wal.log");
    let mem = delivery_dir(&[(wal_path(1), wal.clone()), (wal_path(2), Vec::new())]);
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
    assert_eq!(delivery_report(&engine), recovery_json(None, 3, 0, 0));
    drop(engine);
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("reopen");
    assert_eq!(delivery_report(&engine), recovery_json(None, 3, 0, 0), "the groups survive a second open");
}

#[test]
fn wal_headers_and_records_are_checked() {
    let wal = read_vector("delivery-wal.log");
    let with_version = |v: u16, fix_crc: bool| {
        let mut b = wal.clone();
        b[8..10].copy_from_slice(&v.to_le_bytes());
        if fix_crc {
            let crc = crc32fast::hash(&b[..28]);
            b[28..32].copy_from_slice(&crc.to_le_bytes());
        }
        b
    };
    let mut bad_magic = wal.clone();
    bad_magic[0] = b'X';
    let create = |lsn: u64, group: &str| json!({"lsn": lsn, "group": group, "create": billing_created()});
    let ack = |lsn: u64, group: &str| json!({"lsn": lsn, "group": group, "ops": [{"Ack": {"p": 0, "seqs": [1]}}]});
    // Another version, well-formed or not, is a typed error (checked before
    // the checksum), in every mode.
    for (name, bytes) in [("another version", with_version(6, true)), ("before the checksum", with_version(6, false))] {
        for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::TruncateAtFirstDamage] {
            let mem = delivery_dir(&[(wal_path(1), bytes.clone())]);
            match open(&mem, mode) {
                Err(Error::UnsupportedVersion { file, found: 6, supported: 5 }) if file.ends_with(wal_path(1)) => {}
                other => panic!("{name} {mode:?}: expected UnsupportedVersion, got {:?}", other.err()),
            }
        }
    }
    let lsn_twice = spec_wal(1, &[create(1, "billing"), ack(2, "billing"), ack(2, "billing")]);
    let lsn_gap = spec_wal(1, &[create(1, "billing"), ack(3, "billing")]);
    let twice = spec_wal(1, &[create(1, "billing"), create(2, "billing")]);
    let ghost = spec_wal(1, &[ack(1, "ghost")]);
    let cases: Vec<(&str, String, Vec<u8>, usize, &str)> = vec![
        ("bad magic", wal_path(1), bad_magic, 0, "not a delivery WAL (bad magic"),
        ("another generation in the header", wal_path(3), wal.clone(), 0, "header says generation 1"),
        ("an LSN that does not increase", wal_path(1), lsn_twice.0, lsn_twice.1[2], "LSN 2 where 3 was expected"),
        ("a gap in the LSNs", wal_path(1), lsn_gap.0, lsn_gap.1[1], "LSN 3 where 2 was expected"),
        ("a group created twice", wal_path(1), twice.0, twice.1[1], "group \"billing\" created twice"),
        ("transitions of an unknown group", wal_path(1), ghost.0, ghost.1[0], "transitions of unknown group \"ghost\""),
    ];
    for (name, path, bytes, offset, reason) in cases {
        for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict, RecoveryMode::TruncateAtFirstDamage] {
            let mem = delivery_dir(&[(path.clone(), bytes.clone())]);
            expect_corrupt(open(&mem, mode), &path, offset as u64, reason, &format!("{name} {mode:?}"));
        }
    }
    // The checkpoint's header: magic, version (before the checksum), checksum,
    // the generation of its name, the body length.
    let ckpt = read_vector("checkpoint.ckpt");
    let mut other_version = ckpt.clone();
    other_version[8] = 4;
    let mut header_crc = ckpt.clone();
    header_crc[44] ^= 1;
    let mut longer = ckpt.clone();
    longer.push(0);
    let cases = [
        ("header checksum", ckpt_path(2), header_crc, "checkpoint header checksum mismatch"),
        (
            "shorter than its header",
            ckpt_path(2),
            ckpt[..40].to_vec(),
            "not a checkpoint (bad magic or shorter than its header)",
        ),
        ("a byte more than the body", ckpt_path(2), longer, "checkpoint body is 1015 bytes, its header says 1014"),
        ("another generation in the header", ckpt_path(3), ckpt.clone(), "header says generation 2"),
    ];
    let mem = delivery_dir(&[(ckpt_path(2), other_version)]);
    match open(&mem, RecoveryMode::TolerateTornTail) {
        Err(Error::UnsupportedVersion { file, found: 4, supported: 3 }) if file.ends_with(ckpt_path(2)) => {}
        other => panic!("checkpoint of another version: expected UnsupportedVersion, got {:?}", other.err()),
    }
    let body_len = ckpt.len() - 48;
    for (name, path, bytes, reason) in cases {
        let reason = reason.replace("1015", &(body_len + 1).to_string()).replace("1014", &body_len.to_string());
        let mem = delivery_dir(&[(path.clone(), bytes)]);
        expect_corrupt(open(&mem, RecoveryMode::TolerateTornTail), &path, 0, &reason, name);
    }
}

#[test]
fn wal_damage_is_found_whatever_it_hits() {
    // Every single-bit flip in the middle record of delivery-wal.log (frame or
    // body) is damage followed by a valid record; the same flips in its last
    // record are a torn tail.
    let wal = read_vector("delivery-wal.log");
    let e = read_json("delivery-wal.json");
    let offsets: Vec<usize> =
        e["records"].as_array().expect("records").iter().map(|r| to_usize(ju(r, "offset"))).collect();
    let (rec2, rec3) = (offsets[1], offsets[2]);
    for byte in (rec2..rec3).step_by(7).chain([rec2, rec2 + 1, rec2 + 3, rec2 + 4, rec3 - 1]) {
        for bit in [0, 5, 7] {
            let mut b = wal.clone();
            b[byte] ^= 1 << bit;
            let name = format!("byte {byte} bit {bit}");
            let mem = delivery_dir(&[(wal_path(1), b.clone())]);
            expect_corrupt(
                open(&mem, RecoveryMode::TolerateTornTail),
                &wal_path(1),
                rec2 as u64,
                "damage followed by valid records",
                &name,
            );
            let mem = delivery_dir(&[(wal_path(1), b)]);
            let engine = open(&mem, RecoveryMode::TruncateAtFirstDamage).unwrap_or_else(|e| panic!("{name}: {e}"));
            let r = &engine.delivery_recovery()[0].1;
            assert_eq!((r.replayed, r.torn_bytes), (1, (wal.len() - rec2) as u64), "{name}");
        }
    }
    for byte in [rec3, rec3 + 2, rec3 + 6, rec3 + 20, wal.len() - 1] {
        let mut b = wal.clone();
        b[byte] ^= 0x01;
        let mem = delivery_dir(&[(wal_path(1), b)]);
        let engine = open(&mem, RecoveryMode::TolerateTornTail).unwrap_or_else(|e| panic!("byte {byte}: {e}"));
        let r = &engine.delivery_recovery()[0].1;
        assert_eq!((r.replayed, r.torn_bytes), (2, (wal.len() - rec3) as u64), "byte {byte}");
        assert_eq!(mem.read_file(&wal_path(1)).map(|f| f.len()), Some(rec3), "byte {byte}: truncated");
    }
    // A record cut by the end of the file, and a frame cut short.
    for keep in [rec3 + 4, rec3 + 20] {
        let mem = delivery_dir(&[(wal_path(1), wal[..keep].to_vec())]);
        let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
        let torn = last_nonzero_end(&wal[..keep]) - rec3;
        assert_eq!(delivery_report(&engine), recovery_json(None, 2, torn, 0), "cut at {keep}");
        assert_eq!(mem.read_file(&wal_path(1)).map(|f| f.len()), Some(rec3), "cut at {keep}: truncated");
        let reason = if keep - rec3 < 8 {
            "a frame cut short by the end of the file"
        } else {
            "a record cut short by the end of the file"
        };
        let mem = delivery_dir(&[(wal_path(1), wal[..keep].to_vec())]);
        expect_corrupt(open(&mem, RecoveryMode::Strict), &wal_path(1), rec3 as u64, reason, &format!("cut at {keep}"));
    }
    // Fewer than 8 bytes after the last record, all zeros, are the clean
    // end of the log (zero-filled space), in every mode, and stay.
    let mut short_zeros = wal.clone();
    short_zeros.extend_from_slice(&[0; 4]);
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict] {
        let mem = delivery_dir(&[(wal_path(1), short_zeros.clone())]);
        let engine = open(&mem, mode).expect("open");
        assert_eq!(delivery_report(&engine), recovery_json(None, 3, 0, 0), "4 zeros {mode:?}");
        assert_eq!(mem.read_file(&wal_path(1)).map(|f| f.len()), Some(short_zeros.len()), "4 zeros {mode:?}: kept");
    }
    // Non-zero bytes after a zero length (a record whose first page was
    // lost while a later one was written) are damage, never skipped: a
    // torn tail when no valid record follows.
    let mut stale = wal.clone();
    stale.extend_from_slice(&[0; 8]);
    stale.extend_from_slice(&[7; 5]);
    let mem = delivery_dir(&[(wal_path(1), stale.clone())]);
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
    assert_eq!(delivery_report(&engine), recovery_json(None, 3, 13, 0), "stale bytes after zeros");
    assert_eq!(mem.read_file(&wal_path(1)).map(|f| f.len()), Some(wal.len()), "stale bytes after zeros: truncated");
    let mem = delivery_dir(&[(wal_path(1), stale)]);
    let reason = "non-zero bytes at offset";
    expect_corrupt(open(&mem, RecoveryMode::Strict), &wal_path(1), wal.len() as u64, reason, "stale bytes Strict");
}

#[test]
fn group_state_above_the_high_watermark_is_dropped() {
    // delivery-wal.log over a partition holding only 1-4 (torn-record.log):
    // billing's cursor (6), its delivery 5 and its dead letter 6 are above the
    // log's end; audit (frontier 3) is not.
    let mem = data_dir(&read_vector("torn-record.log"), None);
    mem.create_dir_all(GROUPS_DIR).expect("mkdir");
    mem.write_file(&wal_path(1), &read_vector("delivery-wal.log")).expect("wal");
    let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
    assert_eq!(delivery_report(&engine), recovery_json(None, 3, 0, 1));
    let mut billing = billing_after();
    let part = &mut billing["parts"][0];
    part["cursor"] = json!(4);
    part["done"] = json!([[3, 3]]);
    part["deliveries"].as_array_mut().expect("deliveries").retain(|d| ju(d, "seq") <= 4);
    part["dead"] = json!([]);
    assert_eq!(recovered_state(&engine, &mem), json!([audit_created(), billing]));
}

// ========================================================= secondary index
//
// The index file of a sealed segment (`format/secondary-index.md`): the
// vectors are written by the engine's own encoder (`file::encode`) from the
// terms of a list of events, each value's key made by `term::json_key`; the
// engine-level test builds, refuses and rebuilds real files.

/// The fields the secondary-index vector's stream declares.
const SIX_DECLARED: [&str; 4] = ["amount", "customer", "flag", "lines"];
/// Records in the secondary-index vector's segment: sequences 1..=120.
const SIX_RECORDS: u64 = 120;
/// The size of each record of the vector's (imagined) segment.
const SIX_RECORD_BYTES: u32 = 220;

/// The vector's record offsets: record `base_seq + i` at `64 + 220 i`.
fn six_record_offsets() -> Vec<u32> {
    (0..u32::try_from(SIX_RECORDS).expect("small")).map(|i| 64 + SIX_RECORD_BYTES * i).collect()
}

/// The segment the vector describes. `records_end` and `max_ts` are what a
/// footer would say (no segment vector goes with it): record `i` is
/// `SIX_RECORD_BYTES` long, the first at offset 64.
fn six_header() -> SixHeader {
    SixHeader {
        partition: 0,
        stream_id: STREAM_ID,
        base_seq: 1,
        last_seq: SIX_RECORDS,
        records_end: 26_464,
        max_ts: T0 + 119,
    }
}

/// Event `i` (its sequence) of the secondary-index vector: a string, an
/// integer, a negative integer, non-integral and integral floats, booleans,
/// null, arrays and objects, in the declared fields and the fixed ones.
fn six_event(i: u64) -> Event {
    let amount = match i % 6 {
        0 => json!(100),
        1 => json!(250),
        2 => json!(-5),
        3 => json!(2.5),
        4 => json!(19.99),
        _ => json!(100.0),
    };
    let event_type = if i.is_multiple_of(3) { "order_paid" } else { "order_placed" };
    let mut payload = json!({"type": event_type, "customer": format!("customer-{:02}", i % 7), "amount": amount});
    match i % 4 {
        0 => payload["flag"] = json!(true),
        1 => payload["flag"] = json!(false),
        2 => payload["flag"] = Value::Null,
        _ => {}
    }
    if i.is_multiple_of(2) {
        payload["lines"] = json!([{"sku": "a", "qty": 1}]);
    } else if i.is_multiple_of(7) {
        payload["lines"] = json!({"sku": "b"});
    }
    Event::from(rheo::EventParts {
        id: format!("0190a3c2-7b00-7000-8000-{i:012x}"),
        stream: STREAM.into(),
        partition: 0,
        sequence: i,
        timestamp: Timestamp::from_millis(T0 + i64::try_from(i).expect("small") - 1),
        key: Some(format!("k{}", i % 5)),
        event_type: Some(event_type.to_owned()),
        metadata: Metadata::new(),
        payload: payload.into(),
    })
}

fn six_declared() -> Vec<String> {
    SIX_DECLARED.iter().map(|s| (*s).to_owned()).collect()
}

/// A term of an index file: its key, the field ordinal, the first value
/// that gave it, and its sequences.
struct SixTerm {
    key: Vec<u8>,
    ordinal: usize,
    value: Value,
    seqs: Vec<u64>,
}

/// The terms an index of `names` holds for `events`, sorted by key: the
/// value of each field as `Event::field` reads it (absent: no term).
fn six_terms(events: &[Event], names: &[String]) -> Vec<SixTerm> {
    let mut terms: BTreeMap<Vec<u8>, SixTerm> = BTreeMap::new();
    for e in events {
        for (ordinal, name) in names.iter().enumerate() {
            let Some(value) = e.field(name) else { continue };
            let mut key = u16::try_from(ordinal).expect("ordinal").to_be_bytes().to_vec();
            key.extend_from_slice(&term::json_key(&value));
            let t = terms.entry(key.clone()).or_insert(SixTerm { key, ordinal, value, seqs: Vec::new() });
            t.seqs.push(e.sequence());
        }
    }
    terms.into_values().collect()
}

/// The index file of `terms` (sequences as offsets from the base) and
/// `records` (each record's byte offset).
fn six_encode(h: &SixHeader, names: &[String], terms: &[(Vec<u8>, Vec<u64>)], records: &[u32]) -> Vec<u8> {
    let offsets: Vec<(&[u8], Vec<u32>)> = terms
        .iter()
        .map(|(k, seqs)| (k.as_slice(), seqs.iter().map(|&s| u32::try_from(s - h.base_seq).expect("u32")).collect()))
        .collect();
    // Term keys are the field ordinal (2 bytes, big-endian) + the value key.
    six::encode(
        h,
        names,
        offsets.iter().map(|(k, o)| (u16::from_be_bytes([k[0], k[1]]), &k[2..], o.as_slice())),
        records,
    )
}

/// The record offsets a decoded file holds (`meta.offsets` u32 from
/// `meta.offsets_at`).
fn six_offsets_of(file: &[u8], meta: &six::SixMeta) -> Vec<u32> {
    let at = to_usize(meta.offsets_at);
    (0..to_usize(meta.offsets)).map(|i| le_u32(file, at + 4 * i)).collect()
}

/// The name of a value key's tag.
fn six_kind(tag: u8) -> &'static str {
    match tag {
        term::TAG_NULL => "null",
        term::TAG_BOOL => "bool",
        term::TAG_NUMBER => "number",
        term::TAG_STRING => "string",
        term::TAG_OTHER => "array or object",
        _ => panic!("unknown tag {tag}"),
    }
}

/// The byte the corrupt vector flips: inside the first block's first key.
const SIX_DAMAGED_BYTE: usize = SIX_HEADER_LEN + 10;

fn build_secondary_index(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let h = six_header();
    let names = FieldSet::new(&six_declared()).names().to_vec();
    let events: Vec<Event> = (1..=SIX_RECORDS).map(six_event).collect();
    let terms = six_terms(&events, &names);
    let pairs: Vec<(Vec<u8>, Vec<u64>)> = terms.iter().map(|t| (t.key.clone(), t.seqs.clone())).collect();
    let bytes = six_encode(&h, &names, &pairs, &six_record_offsets());
    let (meta, _) = six::decode_all(&bytes).expect("the vector decodes");
    assert!(meta.blocks.len() >= 2, "the vector has several blocks");
    assert_eq!(six_offsets_of(&bytes, &meta), six_record_offsets(), "the record offsets");
    let trailer = &bytes[bytes.len() - SIX_TRAILER_LEN..];
    let (dir_offset, dir_len, dir_crc) = six::decode_trailer(trailer, bytes.len() as u64).expect("trailer");
    let expected = json!({
        "length": bytes.len(),
        "header": {
            "magic_hex": hex(&SIX_MAGIC),
            "version": SIX_VERSION,
            "flags": 0,
            "partition": h.partition,
            "stream_id": h.stream_id,
            "base_seq": h.base_seq,
            "last_seq": h.last_seq,
            "records_end": h.records_end,
            "max_ts": h.max_ts,
            "crc": le_u32(&bytes, six::SIX_HEADER_CRC_AT),
            "hex": hex(&bytes[..SIX_HEADER_LEN]),
        },
        "declared": SIX_DECLARED,
        "fields": names,
        "blocks": meta.blocks.iter().map(|b| json!({
            "offset": b.offset,
            "len": b.len,
            "crc": b.crc,
            "terms": b.terms,
            "first_key_hex": hex(&b.first),
        })).collect::<Vec<_>>(),
        "record_offsets": {"at": meta.offsets_at, "count": meta.offsets, "values": six_record_offsets()},
        "directory": {"offset": dir_offset, "len": dir_len, "crc": dir_crc},
        "last_key_hex": hex(&meta.last),
        "trailer_hex": hex(trailer),
        "terms": terms.iter().map(|t| json!({
            "field": names[t.ordinal],
            "kind": six_kind(t.key[2]),
            "value": t.value,
            "key_hex": hex(&t.key),
            "sequences": t.seqs,
        })).collect::<Vec<_>>(),
    });
    let mut corrupt = bytes.clone();
    corrupt[SIX_DAMAGED_BYTE] ^= 0x01;
    let refused = six::decode_all(&corrupt).expect_err("the corrupt vector is refused");
    let first = &meta.blocks[0];
    let expected_corrupt = json!({
        "length": corrupt.len(),
        "damage": {"byte_offset": SIX_DAMAGED_BYTE, "xor": 1, "block": 0, "block_offset": first.offset},
        "refused_by": "block checksum: CRC32 of block 0's bytes differs from its directory entry (SixMeta::block)",
        "error": {"kind": "Damaged", "reason": refused.to_string()},
    });
    files.insert("secondary-index.six", bytes);
    files.insert("secondary-index.json", pretty(&expected));
    files.insert("secondary-index-corrupt.six", corrupt);
    files.insert("secondary-index-corrupt.json", pretty(&expected_corrupt));
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex {s}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// What an index file holds: its header, fields, terms (key, sequences)
/// and record offsets.
type SixContent = (SixHeader, Vec<String>, six::Terms, Vec<u32>);

/// The header, fields, terms and record offsets the vector's JSON lists.
fn six_from_json(e: &Value) -> SixContent {
    let h = &e["header"];
    let header = SixHeader {
        partition: u32::try_from(ju(h, "partition")).expect("u32"),
        stream_id: ju(h, "stream_id"),
        base_seq: ju(h, "base_seq"),
        last_seq: ju(h, "last_seq"),
        records_end: ju(h, "records_end"),
        max_ts: ji(h, "max_ts"),
    };
    let fields = e["fields"].as_array().expect("fields").iter().map(|f| f.as_str().expect("name").to_owned()).collect();
    let terms = e["terms"]
        .as_array()
        .expect("terms")
        .iter()
        .map(|t| {
            let seqs = t["sequences"].as_array().expect("sequences").iter().map(|s| s.as_u64().expect("u64"));
            (unhex(js(t, "key_hex")), seqs.collect())
        })
        .collect();
    let offsets = e["record_offsets"]["values"].as_array().expect("record offsets");
    let offsets = offsets.iter().map(|o| u32::try_from(o.as_u64().expect("u64")).expect("u32")).collect();
    (header, fields, terms, offsets)
}

#[test]
fn the_secondary_index_vector_decodes_as_expected() {
    let file = read_vector("secondary-index.six");
    let e = read_json("secondary-index.json");
    assert_eq!(file.len() as u64, ju(&e, "length"), "length");
    let (meta, terms) = six::decode_all(&file).expect("the vector decodes");
    let (header, fields, listed, records) = six_from_json(&e);
    let h = &e["header"];
    assert_eq!(meta.header, header, "header fields");
    assert_eq!(hex(&file[..8]), js(h, "magic_hex"), "magic");
    assert_eq!(u64::from(le_u16(&file, six::SIX_VERSION_AT)), ju(h, "version"), "version");
    assert_eq!(u64::from(le_u16(&file, six::SIX_FLAGS_AT)), ju(h, "flags"), "flags");
    assert_eq!(le_u32(&file, six::SIX_RESERVED_AT), 0, "reserved");
    assert_eq!(u64::from(le_u32(&file, six::SIX_HEADER_CRC_AT)), ju(h, "crc"), "header crc");
    assert_eq!(u64::from(crc32fast::hash(&file[..six::SIX_HEADER_CRC_AT])), ju(h, "crc"), "crc over 0..60");
    assert_eq!(hex(&file[..SIX_HEADER_LEN]), js(h, "hex"), "header bytes");
    assert_eq!(meta.fields, fields, "fields");
    assert_eq!(FieldSet::new(&six_declared()).names(), fields.as_slice(), "fixed and declared fields, canonical");
    let blocks = e["blocks"].as_array().expect("blocks");
    assert!(blocks.len() >= 2, "several blocks");
    assert_eq!(meta.blocks.len(), blocks.len(), "block count");
    for (i, (b, x)) in meta.blocks.iter().zip(blocks).enumerate() {
        assert_eq!(b.offset, ju(x, "offset"), "block {i}: offset");
        assert_eq!(u64::from(b.len), ju(x, "len"), "block {i}: len");
        assert_eq!(u64::from(b.crc), ju(x, "crc"), "block {i}: crc");
        assert_eq!(u64::from(b.terms), ju(x, "terms"), "block {i}: terms");
        assert_eq!(hex(&b.first), js(x, "first_key_hex"), "block {i}: first key");
        let bytes = &file[to_usize(b.offset)..to_usize(b.offset) + b.len as usize];
        assert_eq!(crc32fast::hash(bytes), b.crc, "block {i}: CRC of its bytes");
        let closed_early = i + 1 < meta.blocks.len() && (b.len as usize) < six::BLOCK_TARGET;
        assert!(!closed_early, "block {i}: only the last block is shorter than BLOCK_TARGET");
    }
    assert_eq!(hex(&meta.last), js(&e, "last_key_hex"), "last key");
    let o = &e["record_offsets"];
    assert_eq!((meta.offsets_at, meta.offsets), (ju(o, "at"), ju(o, "count")), "record offsets: place");
    assert_eq!(six_offsets_of(&file, &meta), records, "record offsets");
    let blocks_end = meta.blocks.last().map_or(SIX_HEADER_LEN as u64, |b| b.offset + u64::from(b.len));
    assert_eq!(meta.offsets_at, blocks_end, "the record offsets follow the blocks");
    let trailer = &file[file.len() - SIX_TRAILER_LEN..];
    assert_eq!(hex(trailer), js(&e, "trailer_hex"), "trailer bytes");
    let d = &e["directory"];
    let (offset, len, crc) = six::decode_trailer(trailer, file.len() as u64).expect("trailer");
    assert_eq!((offset, u64::from(len), u64::from(crc)), (ju(d, "offset"), ju(d, "len"), ju(d, "crc")), "directory");
    assert_eq!(&trailer[six::SIX_TRAILER_MAGIC_AT..], &SIX_MAGIC, "closing magic");
    assert_eq!(terms.len(), listed.len(), "term count");
    let described = e["terms"].as_array().expect("terms");
    for (i, ((key, seqs), (k, s))) in terms.iter().zip(&listed).enumerate() {
        assert_eq!(hex(key), hex(k), "term {i}: key");
        assert_eq!(seqs, s, "term {i}: sequences");
        // The key is the field's ordinal and the listed value's key.
        let x = &described[i];
        let ordinal = usize::from(u16::from_be_bytes([key[0], key[1]]));
        assert_eq!(fields[ordinal], js(x, "field"), "term {i}: field");
        assert_eq!(term::json_key(&x["value"]), key[2..], "term {i}: value key of {}", x["value"]);
        assert_eq!(six_kind(key[2]), js(x, "kind"), "term {i}: kind");
    }
    // The terms are those of the vector's events.
    let events: Vec<Event> = (1..=SIX_RECORDS).map(six_event).collect();
    let from_events: Vec<(Vec<u8>, Vec<u64>)> =
        six_terms(&events, &fields).into_iter().map(|t| (t.key, t.seqs)).collect();
    assert!(from_events == listed, "the listed terms are the events' terms");
    // The vector holds every kind of value key.
    let kinds: std::collections::BTreeSet<u8> = terms.iter().map(|(k, _)| k[2]).collect();
    assert_eq!(kinds.len(), 5, "every value-key tag appears");
}

#[test]
fn the_secondary_index_vector_re_encodes_from_its_json() {
    let e = read_json("secondary-index.json");
    let (header, fields, terms, records) = six_from_json(&e);
    let encoded = six_encode(&header, &fields, &terms, &records);
    assert!(encoded == read_vector("secondary-index.six"), "encode(JSON) = the file");
}

#[test]
fn the_corrupt_secondary_index_vector_is_refused_by_the_block_checksum() {
    let file = read_vector("secondary-index-corrupt.six");
    let e = read_json("secondary-index-corrupt.json");
    assert_eq!(file.len() as u64, ju(&e, "length"), "length");
    let err = &e["error"];
    assert_eq!(js(err, "kind"), "Damaged");
    match six::decode_all(&file) {
        Err(SixError::Damaged(reason)) => assert_eq!(reason.to_string(), js(err, "reason"), "refused"),
        other => panic!("refused as damaged: {:?}", other.map(|_| ())),
    }
    // One flipped byte in the block: header, directory and trailer still check.
    let damage = &e["damage"];
    let good = read_vector("secondary-index.six");
    let at = to_usize(ju(damage, "byte_offset"));
    let diff: Vec<usize> = (0..good.len()).filter(|&i| good[i] != file[i]).collect();
    assert_eq!(diff, vec![at], "only the damaged byte differs");
    assert_eq!(u64::from(good[at] ^ file[at]), ju(damage, "xor"), "the flip");
    let header = SixHeader::decode(&file).expect("the header still checks");
    let trailer = &file[file.len() - SIX_TRAILER_LEN..];
    let (offset, len, crc) = six::decode_trailer(trailer, file.len() as u64).expect("trailer");
    let dir = &file[to_usize(offset)..to_usize(offset) + len as usize];
    let meta = six::decode_dir(header, dir, offset, crc).expect("the directory still checks");
    let b = &meta.blocks[to_usize(ju(damage, "block"))];
    assert_eq!(b.offset, ju(damage, "block_offset"), "damaged block");
    assert!(to_usize(b.offset) <= at && at < to_usize(b.offset) + b.len as usize, "the byte is inside the block");
}

/// Queries that use the vector stream's indexes in every way the planner
/// knows (equality, `in`, ranges, `exists`, several filters, descending,
/// paging) and some that cannot.
fn six_queries() -> Vec<Query> {
    let q = || Query::new(STREAM).limit(rheo::MAX_LIMIT);
    vec![
        q().eq("customer", "customer-03"),
        q().eq("type", "order_paid").eq("amount", 100),
        q().eq("amount", 2.5),
        q().eq("payload.amount", -5).descending().limit(7),
        q().gte("amount", 19.99),
        q().lt("amount", 0),
        q().eq("flag", Value::Null),
        q().eq("flag", true).eq("key", "k2"),
        q().exists("lines"),
        q().eq("lines", json!([{"sku": "a", "qty": 1}])),
        q().is_in("key", ["k1", "k4"]).limit(9),
        q().eq("id", "0190a3c2-7b00-7000-8000-00000000002a"),
        q().eq("customer", "nobody"),
        q().missing("flag"),
    ]
}

/// Every event of the vector stream, read record by record.
fn six_all_events(log: &rheo::engine::stream::Stream) -> Vec<Event> {
    let records = log.log.read(0, 0, 100_000).expect("read");
    records.into_iter().map(|r| r.into_event(&STREAM.into(), 0)).collect()
}

/// The queries through the planner give what a filtered read of every event
/// gives; returns, per query, the explain of its page.
fn six_check_queries(log: &rheo::engine::stream::Stream, when: &str) -> Vec<Vec<rheo::Explain>> {
    let all = six_all_events(log);
    assert_eq!(all.len() as u64, SIX_RECORDS, "{when}: every event is there");
    six_queries()
        .into_iter()
        .map(|q| {
            let got = log.query_page(&q).unwrap_or_else(|e| panic!("{when}: {q:?}: {e}"));
            let want = q.page_from(all.iter().cloned());
            assert_eq!(got.events, want.events, "{when}: events of {q:?}");
            assert_eq!(got.next_cursor, want.next_cursor, "{when}: cursor of {q:?}");
            got.explain
        })
        .collect()
}

/// How a page read the sealed segment starting at `base` (`None`: the page
/// was full before it).
fn six_access(explain: &[rheo::Explain], base: u64) -> Option<&rheo::Access> {
    explain.iter().find(|x| x.first == base).map(|x| &x.access)
}

fn six_options() -> EngineOptions {
    EngineOptions::default().segment_bytes(4096).background_indexing(false)
}

#[test]
fn secondary_index_files_are_built_refused_and_rebuilt() {
    let mem = MemVfs::new();
    let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
    let engine = Engine::open(vfs.clone(), six_options()).expect("open");
    engine.create_stream(STREAM, 1, &six_declared(), T0).expect("create");
    let log = engine.stream(STREAM).expect("stream");
    let news: Vec<NewEvent> = (1..=SIX_RECORDS)
        .map(|i| {
            let e = six_event(i);
            NewEvent::prepare(e.payload().clone(), AppendOptions::new().id(e.id()).key(e.key().expect("key")))
        })
        .collect();
    for (i, chunk) in news.chunks(3).enumerate() {
        let ts = T0 + i64::try_from(i).expect("small");
        let routed: Vec<Routed<'_>> = chunk.iter().map(|event| Routed { partition: 0, ts, event }).collect();
        let (_, ticket) = engine.append(&log, &routed).expect("append");
        ticket.wait().expect("durable");
    }
    engine.build_indexes().expect("build");

    // Every sealed segment has its index file, describing it, with exactly
    // the terms of its records.
    let names = FieldSet::new(&six_declared()).names().to_vec();
    let all = six_all_events(&log);
    let sealed: Vec<_> =
        log.log.partition(0).expect("p0").segments().into_iter().filter(|s| s.footer().is_some()).collect();
    assert!(sealed.len() >= 4, "several sealed segments: {}", sealed.len());
    let mut built = Vec::new();
    for seg in &sealed {
        let path = seg.six_path();
        assert!(path.ends_with(&format!("{:020}.six", seg.base_seq)), "{path}");
        let bytes = mem.read_file(&path).unwrap_or_else(|| panic!("{path} was not written"));
        let (meta, terms) = six::decode_all(&bytes).unwrap_or_else(|e| panic!("{path}: {e}"));
        let f = seg.footer().expect("sealed");
        let header = SixHeader {
            partition: 0,
            stream_id: STREAM_ID,
            base_seq: seg.base_seq,
            last_seq: f.last_seq,
            records_end: f.records_end,
            max_ts: f.max_ts,
        };
        assert_eq!(meta.header, header, "{path}: header = the segment's footer");
        assert_eq!(meta.fields, names, "{path}: fields");
        let mine: Vec<Event> =
            all.iter().filter(|e| (seg.base_seq..=f.last_seq).contains(&e.sequence())).cloned().collect();
        let want: Vec<(Vec<u8>, Vec<u64>)> = six_terms(&mine, &names).into_iter().map(|t| (t.key, t.seqs)).collect();
        assert!(terms == want, "{path}: the terms of the segment's records");
        // Each record offset is where that record starts in the segment.
        let log_bytes = mem.read_file(seg.path()).expect("segment");
        let offsets = six_offsets_of(&bytes, &meta);
        assert_eq!(offsets.len() as u64, f.last_seq - seg.base_seq + 1, "{path}: one offset per record");
        for (seq, &o) in (seg.base_seq..).zip(&offsets) {
            match decode_record(&log_bytes[o as usize..]) {
                Decoded::Record { header, .. } => assert_eq!(header.seq, seq, "{path}: offset {o}"),
                other => panic!("{path}: offset {o} of {seq}: {other:?}"),
            }
        }
        built.push(bytes);
    }
    let dir = format!("{STREAM_DIR}/00000");
    let listed = mem.list(&dir).expect("list");
    assert!(!listed.iter().any(|n| n.ends_with(".tmp")), "no temporary file left: {listed:?}");
    for explain in six_check_queries(&log, "built") {
        for seg in &sealed {
            match six_access(&explain, seg.base_seq) {
                Some(rheo::Access::Index { source, .. }) => assert_eq!(source, "file", "{explain:?}"),
                Some(rheo::Access::Scan { reason }) => {
                    assert!(!reason.starts_with("the segment's index"), "{reason}");
                }
                _ => {}
            }
        }
    }

    // Garbage, a valid file of another segment, and a missing file.
    let (garbage, other, gone) = (&sealed[0], &sealed[1], &sealed[2]);
    mem.write_file(
        &garbage.six_path(),
        b"not an index file at all, but longer than a header and a trailer: 0123456789",
    )
    .expect("write");
    mem.write_file(&other.six_path(), &built[3]).expect("write");
    vfs.remove_file(&gone.six_path()).expect("remove");
    drop(log);
    drop(engine);
    let engine = Engine::open(vfs.clone(), six_options()).expect("reopen");
    let log = engine.stream(STREAM).expect("stream");
    let point = six_queries()[0].clone();
    for explain in six_check_queries(&log, "refused") {
        for seg in [garbage, other, gone] {
            if let Some(rheo::Access::Index { .. }) = six_access(&explain, seg.base_seq) {
                panic!("segment {}: a refused index file was used: {explain:?}", seg.base_seq);
            }
        }
    }
    let explain = log.query_page(&point).expect("query").explain;
    for seg in [garbage, other, gone] {
        let reason = "the segment's index is not built yet";
        let want = rheo::Access::Scan { reason: reason.into() };
        assert_eq!(six_access(&explain, seg.base_seq), Some(&want), "{explain:?}");
    }
    assert!(matches!(six_access(&explain, sealed[3].base_seq), Some(rheo::Access::Index { .. })), "{explain:?}");

    // The builder writes them again, byte for byte.
    engine.build_indexes().expect("rebuild");
    for (seg, bytes) in sealed.iter().zip(&built) {
        assert!(mem.read_file(&seg.six_path()).as_ref() == Some(bytes), "{}: rebuilt as built", seg.six_path());
    }
    for explain in six_check_queries(&log, "rebuilt") {
        for seg in &sealed {
            if let Some(rheo::Access::Scan { reason }) = six_access(&explain, seg.base_seq) {
                assert!(!reason.starts_with("the segment's index"), "segment {}: {reason}", seg.base_seq);
            }
        }
    }

    // A file covering other fields than the stream now declares is rebuilt.
    engine.create_index(STREAM, "note").expect("create index");
    engine.build_indexes().expect("rebuild for the new field");
    let wider = {
        let mut d = six_declared();
        d.push("note".into());
        FieldSet::new(&d).names().to_vec()
    };
    for seg in &sealed {
        let bytes = mem.read_file(&seg.six_path()).expect("index file");
        let (meta, _) = six::decode_all(&bytes).expect("valid");
        assert_eq!(meta.fields, wider, "{}: covers the new field", seg.six_path());
    }
    six_check_queries(&log, "new field");
}

/// A cell written as `` `text` ``.
fn code_cell(cell: &str) -> &str {
    cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')).unwrap_or_else(|| panic!("not a code cell: {cell}"))
}

#[test]
fn the_secondary_index_spec_examples_hold() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("format/secondary-index.md");
    let text = std::fs::read_to_string(&path).expect("format/secondary-index.md");
    let (mut keys, mut always) = (0, Vec::new());
    for table in tables(&text) {
        let head: Vec<&str> = table[0].iter().map(String::as_str).collect();
        match head.as_slice() {
            ["Value", "Key", "Note"] => {
                for row in &table[1..] {
                    let value: Value = serde_json::from_str(code_cell(&row[0])).expect("a JSON value");
                    let key = code_cell(&row[1]).replace(' ', "");
                    assert_eq!(hex(&term::json_key(&value)), key, "the key of {value}");
                    keys += 1;
                }
            }
            ["Always indexed", "Reads"] => always.extend(table[1..].iter().map(|r| code_cell(&r[0]).to_owned())),
            _ => {}
        }
    }
    assert!(keys >= 15, "the value-key examples table");
    assert_eq!(always, term::ALWAYS_INDEXED, "the always-indexed fields");
    // The canonical names the spec gives as examples.
    for (path, name) in [
        ("currency", Some("payload.currency")),
        ("payload.order.customer_id", Some("payload.order.customer_id")),
        ("metadata.producer", Some("producer")),
        ("metadata.region.name", Some("metadata.region.name")),
        ("correlation_id", Some("correlation_id")),
        ("type", Some("type")),
        ("sequence", None),
        ("timestamp", None),
    ] {
        assert_eq!(term::canonical(path).as_deref(), name, "canonical({path})");
    }
}

/// The vector with its directory replaced by `dir` (trailer remade).
fn six_with_dir(file: &[u8], dir: &[u8]) -> Vec<u8> {
    let trailer = &file[file.len() - SIX_TRAILER_LEN..];
    let (offset, _, _) = six::decode_trailer(trailer, file.len() as u64).expect("trailer");
    let mut out = file[..to_usize(offset)].to_vec();
    out.extend_from_slice(dir);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&u32::try_from(dir.len()).expect("u32").to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(dir).to_le_bytes());
    out.extend_from_slice(&SIX_MAGIC);
    out
}

#[test]
fn the_secondary_index_reader_accepts_exactly_what_the_writer_writes() {
    // A string value longer than 64 KiB (an event may hold 1 MiB) reads back.
    let h = six_header();
    let names = vec!["payload.note".to_owned()];
    let mut long = vec![0, 0];
    long.extend_from_slice(&term::json_key(&json!("n".repeat(100_000))));
    let terms = vec![(long, vec![1, 7]), (vec![0, 0, term::TAG_OTHER], vec![2])];
    let bytes = six_encode(&h, &names, &terms, &six_record_offsets());
    let (meta, got) = six::decode_all(&bytes).unwrap_or_else(|e| panic!("a 100 KB value: {e}"));
    assert!(got == terms && meta.spans[0].0.len() == 100_001, "a 100 KB value round trips");
    // One encoding per file: a varint longer than its shortest form is
    // refused (here the directory's record count, 120 as `f8 00`).
    let file = read_vector("secondary-index.six");
    let (offset, len, _) =
        six::decode_trailer(&file[file.len() - SIX_TRAILER_LEN..], file.len() as u64).expect("trailer");
    let mut dir = file[to_usize(offset)..to_usize(offset) + len as usize].to_vec();
    assert_eq!(dir.pop(), Some(120), "the directory ends with the record count");
    dir.extend_from_slice(&[0xf8, 0x00]);
    let reason = "varint longer than its shortest form";
    assert_eq!(six::decode_all(&six_with_dir(&file, &dir)).map(|_| ()), Err(SixError::Damaged(reason.into())));
}

#[test]
fn fields_of_a_payload_that_is_an_array_are_indexed() {
    // A payload may be any JSON value; `0.sku` reads into an array payload.
    let mem = MemVfs::new();
    let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
    let engine = Engine::open(vfs, six_options()).expect("open");
    engine.create_stream(STREAM, 1, &["0.sku".to_owned(), "1".to_owned()], T0).expect("create");
    let log = engine.stream(STREAM).expect("stream");
    for i in 0..60u32 {
        let payload = json!([{"sku": format!("s{}", i % 3), "pad": "p".repeat(100)}, i % 2 == 0]);
        let event = NewEvent::prepare(payload, AppendOptions::new());
        let (_, ticket) = engine.append(&log, &[Routed { partition: 0, ts: T0, event: &event }]).expect("append");
        ticket.wait().expect("durable");
    }
    engine.build_indexes().expect("build");
    let sealed = log.log.partition(0).expect("p0").segments().iter().filter(|s| s.footer().is_some()).count();
    assert!(sealed >= 2, "sealed segments: {sealed}");
    let all = six_all_events(&log);
    for q in [Query::new(STREAM).eq("0.sku", "s1"), Query::new(STREAM).eq("1", true), Query::new(STREAM).exists("0")] {
        let q = q.limit(rheo::MAX_LIMIT);
        let got = log.query_page(&q).unwrap_or_else(|e| panic!("{q:?}: {e}"));
        let want = q.page_from(all.iter().cloned());
        assert!(!want.events.is_empty(), "{q:?} matches some events");
        assert_eq!(got.events, want.events, "{q:?}: the planner and a filtered read");
    }
}
