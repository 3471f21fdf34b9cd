//! The on-disk format's test vectors (`format/vectors/`) and the constants the
//! spec (`format/*.md`) states.
//!
//! * `vectors_decode_as_expected`: every vector file is decoded with the
//!   engine's decoders and compared, field by field, with its `.json`.
//! * `vectors_recover_as_expected`: every segment vector is placed in a
//!   `MemVfs` data directory (with the manifest and transaction log vectors)
//!   and opened with `Engine::open` in each recovery mode: the recovered
//!   records, the truncation report, the rebuilt index or the
//!   `Error::Corrupt { file, offset }` must match the `.json`.
//! * The recovery rules of `format/README.md` on data directories derived
//!   from the vectors: damage followed by valid records whatever field it
//!   hits, bad transaction log headers and a torn last entry, unknown
//!   versions, cut-short segment creation, the recovered index.
//! * `encoders_reproduce_the_vectors`: the engine's encoders still produce
//!   exactly the committed bytes (a format change cannot slip in unnoticed).
//! * `spec_tables_match_the_code`: every field table in `format/*.md` is
//!   contiguous, and every named constant has the value the spec states.
//!
//! The vectors are written once by `generate_vectors` (ignored):
//! `RHEO_WRITE_VECTORS=1 cargo test --test format_vectors generate_vectors -- --ignored`.
//! Regenerate only together with a `FORMAT_VERSION` bump and the spec.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rheo::engine::log::manifest::{self, ManifestBody, StreamEntry};
use rheo::engine::log::txn;
use rheo::engine::segment::file::{Footer, IndexEntry, SegmentHeader, decode_index, encode_index_header};
use rheo::engine::segment::format;
use rheo::engine::segment::format::{
    BODY_DOC, ENTRY_LEN, FLAG_END, FLAG_MULTI, FOOTER_LEN, FOOTER_MAGIC, FORMAT_VERSION, FRAME_LEN, HEADER_LEN,
    IDX_HEADER_LEN, INDEX_INTERVAL_BYTES, INDEX_MAGIC, SEGMENT_MAGIC,
};
use rheo::engine::segment::record::{Decoded, DocRef, RecordHeader, decode_doc, decode_record, encode_record};
use rheo::engine::vfs::{MemVfs, Vfs};
use rheo::engine::{Engine, EngineOptions, RecoveryMode};
use rheo::{Error, Metadata};
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
        let doc = DocRef(&self.id, self.key.as_deref(), self.event_type.as_deref(), &meta, &self.payload);
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

fn pretty(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).expect("json");
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
    build_txn(&mut files);
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
        }],
    }
}

/// (c): the manifest naming stream 1, "orders", one partition.
fn build_manifest(files: &mut BTreeMap<&'static str, Vec<u8>>) {
    let bytes = manifest::encode(&manifest_body()).expect("manifest encodes");
    let h = manifest::MAN_HEADER_LEN;
    let expected = json!({
        "description": "A manifest: next stream id 2, one stream (id 1, \"orders\", 1 partition, index \"customer\").",
        "path": "MANIFEST",
        "length": bytes.len(),
        "header": {
            "magic_hex": hex(&manifest::MANIFEST_MAGIC),
            "version": FORMAT_VERSION,
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
    let (id, key, event_type, metadata, payload) = decode_doc(doc).unwrap_or_else(|err| panic!("{at}: {err}"));
    assert_eq!(id, js(e, "id"), "{at}: id");
    assert_eq!(key.as_deref(), e["key"].as_str(), "{at}: key");
    assert_eq!(event_type.as_deref(), e["type"].as_str(), "{at}: type");
    assert_eq!(Value::Object(metadata), e["metadata"], "{at}: metadata");
    assert_eq!(payload, e["payload"], "{at}: payload");
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

fn check_manifest_vector() {
    let file = read_vector("manifest.bin");
    let e = read_json("manifest.json");
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
    }
    // The body is positional: a 2-array, each stream a 5-array.
    assert_eq!(body[0], 0x92, "the body is a MessagePack array of 2");
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
    check_manifest_vector();
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
    Engine::open(vfs, EngineOptions { recovery, ..EngineOptions::default() })
}

/// Reads every record of the vector stream through the engine and compares
/// them with the records listed in `expected` whose sequences are in `seqs`.
fn check_engine_records(engine: &Engine, expected: &Value, seqs: &[u64], name: &str) {
    let log = engine.stream(STREAM).expect("stream");
    let got = log.read(0, 0, 1000).unwrap_or_else(|e| panic!("{name}: read: {e}"));
    assert_eq!(got.iter().map(|r| r.header.seq).collect::<Vec<_>>(), seqs, "{name}: recovered sequences");
    let listed = expected["records"].as_array().expect("records");
    for r in got {
        let e = listed.iter().find(|e| ju(e, "seq") == r.header.seq).expect("listed");
        let at = format!("{name}: recovered record {}", r.header.seq);
        assert_eq!((r.header.ts, u64::from(r.header.flags), r.header.txn), (ji(e, "ts"), ju(e, "flags"), ju(e, "txn")));
        let (id, key, event_type, metadata, payload) = r.doc;
        let d = &e["doc"];
        assert_eq!(id, js(d, "id"), "{at}: id");
        assert_eq!(key.as_deref(), d["key"].as_str(), "{at}: key");
        assert_eq!(event_type.as_deref(), d["type"].as_str(), "{at}: type");
        assert_eq!(Value::Object(metadata), d["metadata"], "{at}: metadata");
        assert_eq!(payload, d["payload"], "{at}: payload");
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
        Err(Error::Corrupt { file, offset: got, reason: why }) => {
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
    engine.stream(STREAM).expect("stream").read(0, 2, 10).expect("read");
    assert_eq!(mem.read_file(INDEX_PATH).as_deref(), Some(&index[..]), "a valid index is kept");
    // The next segment starts after the footer's last sequence.
    assert!(mem.read_file(&format!("{STREAM_DIR}/00000/00000000000000000008.log")).is_some());
    drop(engine);
    // A missing or damaged index is rebuilt to the same bytes.
    for damaged in [None, Some(b"RHEOIDX\0garbage".to_vec())] {
        let mem = data_dir(&segment, damaged.as_deref());
        let engine = open(&mem, RecoveryMode::TolerateTornTail).expect("open");
        engine.stream(STREAM).expect("stream").read(0, 0, 10).expect("read");
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
    match engine.stream(STREAM).expect("stream").read(0, 0, 10) {
        Err(Error::Corrupt { file, offset, reason }) => {
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
        let got = engine.stream(STREAM).expect("stream").read(0, 0, 10).expect("read");
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
    let got = engine.stream(STREAM).expect("stream").read(0, 0, 10).expect("read");
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
    man[manifest::MAN_VERSION] = 2;
    mem.write_file("MANIFEST", &man).expect("manifest");
    match open(&mem, RecoveryMode::TolerateTornTail) {
        Err(Error::UnsupportedVersion { file, found: 2, supported: 1 }) if file.ends_with("MANIFEST") => {}
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
        assert!(engine.stream(STREAM).expect("stream").read(0, 0, 10).expect("read").is_empty(), "{name}");
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
    let got = engine.stream(STREAM).expect("stream").read(0, 0, 10).expect("read");
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
    for doc in ["README.md", "segment.md", "index.md", "manifest.md"] {
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
    // CRC32 is IEEE (reflected 0xEDB88320, init and xorout 0xFFFFFFFF).
    assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
}
