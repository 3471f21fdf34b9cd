//! Arbitrary bytes through the secondary-index decoder (`file::decode_all`)
//! and the record-document field extractor (`extract::DocParts`). Never a
//! panic. What `decode_all` accepts must keep the invariants the engine
//! relies on (terms strictly ascending, each naming a covered field, its
//! sequences strictly ascending within the segment) and be exactly what
//! `file::encode` writes for the terms it decoded to; what `encode` writes
//! for any valid terms must decode back to them. What the extractor reads
//! (field by field, and all fields at once as the index builder reads them)
//! must be what `Event::field` reads on the decoded event, whenever the
//! document decodes.
//!
//! Input layout (fields past the end of the input read as zero):
//!
//! | bytes | field |
//! | --- | --- |
//! | 1 | mode: the low two bits pick the case below; `KEEP_VERSION` (bit 2) |
//! | rest | content |
//!
//! * `AS_IS`: the content is the file.
//! * `FIXED`: the content is the file, with its magic, version (unless
//!   `KEEP_VERSION`), trailer magic and every checksum made right (header,
//!   each block the directory names, directory), so that the structural
//!   checks behind them see fuzzed fields.
//! * `BUILT`: the content describes a segment and terms (below), which
//!   `encode` writes; `decode_all` must give them back.
//! * `DOC`: the content is a record's MessagePack document, read by the
//!   extractor along fixed paths and one taken from the content.
//!
//! Every case also decodes the content as given and reads it as a
//! document, so each input exercises both decoders.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use rheo::Timestamp;
use rheo::engine::index::extract::{DocParts, Extractor, FieldPath};
use rheo::engine::index::file::{
    self, SIX_DIR_CRC_AT, SIX_DIR_LEN_AT, SIX_DIR_OFFSET_AT, SIX_HEADER_CRC_AT, SIX_HEADER_LEN, SIX_MAGIC,
    SIX_TRAILER_LEN, SIX_TRAILER_MAGIC_AT, SIX_VERSION, SIX_VERSION_AT, SixHeader, SixMeta,
};
use rheo::engine::index::term::{self, Scalar};
use rheo::engine::segment::record::decode_doc;
use rheo_fuzz::Cursor;

const AS_IS: u8 = 0;
const FIXED: u8 = 1;
const BUILT: u8 = 2;
const DOC: u8 = 3;
/// Leave the version as fuzzed in `FIXED`.
const KEEP_VERSION: u8 = 1 << 2;

/// The record offsets a decoded file holds.
fn record_offsets(bytes: &[u8], meta: &SixMeta) -> Vec<u32> {
    let at = usize::try_from(meta.offsets_at).expect("offsets_at fits");
    let n = usize::try_from(meta.offsets).expect("offsets fit");
    (0..n)
        .map(|i| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&bytes[at + 4 * i..at + 4 * i + 4]);
            u32::from_le_bytes(b)
        })
        .collect()
}

/// `decode_all`, and on success the invariants and the re-encoding.
fn check_file(bytes: &[u8]) {
    let Ok((meta, terms)) = file::decode_all(bytes) else { return };
    let h = meta.header;
    for pair in terms.windows(2) {
        assert!(pair[0].0 < pair[1].0, "terms not strictly ascending");
    }
    for (key, seqs) in &terms {
        assert!(key.len() >= 2, "a term without a field ordinal");
        assert!(usize::from(u16::from_be_bytes([key[0], key[1]])) < meta.fields.len(), "a term of no field");
        assert!(!seqs.is_empty(), "a term without sequences");
        for pair in seqs.windows(2) {
            assert!(pair[0] < pair[1], "sequences not strictly ascending");
        }
        assert!(seqs.iter().all(|s| (h.base_seq..=h.last_seq).contains(s)), "a sequence outside the segment");
    }
    // The writer takes u32 offsets from the base (the format allows more).
    let Some(offsets) = terms
        .iter()
        .map(|(k, seqs)| {
            let offs: Option<Vec<u32>> = seqs.iter().map(|s| u32::try_from(s - h.base_seq).ok()).collect();
            Some((k.as_slice(), offs?))
        })
        .collect::<Option<Vec<(&[u8], Vec<u32>)>>>()
    else {
        return;
    };
    let terms = offsets.iter().map(|(k, o)| (u16::from_be_bytes([k[0], k[1]]), &k[2..], o.as_slice()));
    let again = file::encode(&h, &meta.fields, terms, &record_offsets(bytes, &meta));
    assert!(again == bytes, "decode_all accepted bytes that encode does not write for what they decode to");
}

/// An LEB128 varint at `*at` of `b`, or `None` (no checks beyond that).
fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f).checked_shl(7 * i).unwrap_or(0);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Skips a varint length and that many bytes.
fn skip_bytes(b: &[u8], at: &mut usize) -> Option<()> {
    let n = usize::try_from(varint(b, at)?).ok()?;
    *at = at.checked_add(n).filter(|&e| e <= b.len())?;
    Some(())
}

/// Makes each block's checksum in the directory at `dir` right, as far as
/// the directory can be walked.
fn fix_block_crcs(file: &mut [u8], dir: std::ops::Range<usize>) -> Option<()> {
    let d = file[dir.clone()].to_vec();
    let mut at = 0;
    let fields = varint(&d, &mut at)?.min(1024);
    for _ in 0..fields {
        for _ in 0..3 {
            skip_bytes(&d, &mut at)?;
        }
    }
    let blocks = varint(&d, &mut at)?.min(d.len() as u64);
    for _ in 0..blocks {
        skip_bytes(&d, &mut at)?;
        let offset = usize::try_from(varint(&d, &mut at)?).ok()?;
        let len = usize::try_from(varint(&d, &mut at)?).ok()?;
        let crc_at = dir.start + at;
        at = at.checked_add(4).filter(|&e| e <= d.len())?;
        if let Some(block) = offset.checked_add(len).and_then(|end| file.get(offset..end)) {
            let crc = crc32fast::hash(block);
            file[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        }
        varint(&d, &mut at)?;
    }
    Some(())
}

/// The content as a file with its magics, version and checksums made right.
fn fixed(content: &[u8], keep_version: bool) -> Vec<u8> {
    let mut b = content.to_vec();
    if b.len() < SIX_HEADER_LEN + SIX_TRAILER_LEN {
        b.resize(SIX_HEADER_LEN + SIX_TRAILER_LEN, 0);
    }
    b[..8].copy_from_slice(&SIX_MAGIC);
    if !keep_version {
        b[SIX_VERSION_AT..SIX_VERSION_AT + 2].copy_from_slice(&SIX_VERSION.to_le_bytes());
    }
    let crc = crc32fast::hash(&b[..SIX_HEADER_CRC_AT]);
    b[SIX_HEADER_CRC_AT..SIX_HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    let t = b.len() - SIX_TRAILER_LEN;
    b[t + SIX_TRAILER_MAGIC_AT..].copy_from_slice(&SIX_MAGIC);
    // The directory ends where the trailer starts; its length as fuzzed,
    // within the bytes after the header.
    let mut len = [0u8; 4];
    len.copy_from_slice(&b[t + SIX_DIR_LEN_AT..t + SIX_DIR_LEN_AT + 4]);
    let dir_len = usize::try_from(u32::from_le_bytes(len)).unwrap_or(0) % (t - SIX_HEADER_LEN + 1);
    let dir_offset = t - dir_len;
    b[t + SIX_DIR_OFFSET_AT..t + SIX_DIR_OFFSET_AT + 8].copy_from_slice(&(dir_offset as u64).to_le_bytes());
    b[t + SIX_DIR_LEN_AT..t + SIX_DIR_LEN_AT + 4].copy_from_slice(&(dir_len as u32).to_le_bytes());
    let _ = fix_block_crcs(&mut b, dir_offset..t);
    let crc = crc32fast::hash(&b[dir_offset..t]);
    b[t + SIX_DIR_CRC_AT..t + SIX_DIR_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A value key from the input: any tag, and for strings a value that may
/// be long (a repeated byte), as an event of 1 MiB may hold.
fn value_key(c: &mut Cursor<'_>) -> Vec<u8> {
    let pick = c.u8();
    let mut k = Vec::new();
    match pick % 8 {
        0 => term::scalar_key(&Scalar::Null, &mut k),
        1 => term::scalar_key(&Scalar::Bool(pick & 0x80 != 0), &mut k),
        2 => term::scalar_key(&Scalar::Int(i128::from(c.u64().cast_signed())), &mut k),
        3 => term::scalar_key(&Scalar::Float(f64::from_bits(c.u64())), &mut k),
        4 => term::scalar_key(&Scalar::Other, &mut k),
        5 => {
            let n = usize::from(c.u8() % 24);
            term::scalar_key(&Scalar::Str(c.take(n)), &mut k);
        }
        6 => term::scalar_key(&Scalar::Int(i128::from(c.u64())), &mut k),
        _ => {
            // Up to 128 KiB of one byte.
            let n = usize::from(c.u8()) << 9 | usize::from(c.u8());
            let s = vec![b'x' ^ pick; n];
            term::scalar_key(&Scalar::Str(&s), &mut k);
        }
    }
    k
}

/// Encodes a segment and terms described by the input and requires
/// `decode_all` to give them back exactly.
fn check_built(content: &[u8]) {
    let mut c = Cursor::new(content);
    let base_seq = 1 + u64::from(c.u8()) * 1000 + u64::from(c.u8());
    let count = 1 + u64::from(c.u8()) * 4 + u64::from(c.u8() % 4);
    let nfields = 1 + usize::from(c.u8() % 8);
    let fields: Vec<String> = (0..nfields).map(|i| format!("f{i}")).collect();
    let mut terms: BTreeMap<Vec<u8>, Vec<u32>> = BTreeMap::new();
    let nterms = usize::from(c.u8());
    for _ in 0..nterms {
        let ordinal = u16::from(c.u8()) % u16::try_from(nfields).expect("few fields");
        let mut key = ordinal.to_be_bytes().to_vec();
        key.extend_from_slice(&value_key(&mut c));
        let mut offs = Vec::new();
        let mut next = u64::from(c.u8() % 8);
        for _ in 0..1 + c.u8() % 16 {
            if next >= count {
                break;
            }
            offs.push(u32::try_from(next).expect("small"));
            next += 1 + u64::from(c.u8() % 32);
        }
        // A term names at least one record.
        if !offs.is_empty() {
            terms.insert(key, offs);
        }
    }
    let header = SixHeader {
        partition: u32::from(c.u8()),
        stream_id: c.u64(),
        base_seq,
        last_seq: base_seq + count - 1,
        records_end: 64 + count * 300,
        max_ts: c.u64().cast_signed(),
    };
    // Every record's offset, or none (the writer keeps all or nothing).
    let records: Vec<u32> = if c.u8() & 1 == 0 {
        (0..count).map(|i| u32::try_from(64 + i * 300).expect("small")).collect()
    } else {
        Vec::new()
    };
    let encoded = terms.iter().map(|(k, o)| (u16::from_be_bytes([k[0], k[1]]), &k[2..], o.as_slice()));
    let bytes = file::encode(&header, &fields, encoded, &records);
    let (meta, got) = match file::decode_all(&bytes) {
        Ok(d) => d,
        Err(e) => panic!("decode_all refuses what encode wrote: {e}"),
    };
    assert_eq!(meta.header, header, "header round trip");
    assert_eq!(meta.fields, fields, "fields round trip");
    assert_eq!(record_offsets(&bytes, &meta), records, "record offsets round trip");
    let want: Vec<(Vec<u8>, Vec<u64>)> =
        terms.into_iter().map(|(k, o)| (k, o.into_iter().map(|x| base_seq + u64::from(x)).collect())).collect();
    assert!(got == want, "terms round trip");
}

/// Paths read from every document: the fixed fields, metadata, payload,
/// nesting, array indexes, and one path spelled by the input.
const PATHS: [&str; 16] = [
    "id",
    "key",
    "type",
    "producer",
    "correlation_id",
    "metadata.a",
    "metadata.a.b",
    "a",
    "b",
    "a.b",
    "a.0",
    "a.1.b",
    "0",
    "payload.",
    "a.b.c.d",
    "metadata.producer",
];

/// The key of an extracted value.
fn key_of(s: &Scalar<'_>) -> Vec<u8> {
    let mut k = Vec::new();
    term::scalar_key(s, &mut k);
    k
}

/// The extractor on a document, field by field (`DocParts::get`) and all at
/// once as the index builder reads them (`Extractor`); both compared with
/// `Event::field` when the document decodes as the engine decodes records.
fn check_doc(doc: &[u8], extra: &[u8]) {
    let Some(parts) = DocParts::split(doc) else { return };
    let _ = parts.id();
    let decoded = decode_doc(doc).ok().map(|d| d.into_event(&"s".into(), 0, 1, Timestamp::from_millis(0)));
    let spelled: String = extra.iter().take(12).map(|&b| char::from(b"ab01.c"[usize::from(b % 6)])).collect();
    let paths: Vec<(&str, FieldPath)> = PATHS
        .iter()
        .copied()
        .chain([spelled.as_str()])
        .filter_map(|p| Some((p, FieldPath::parse(&term::canonical(p)?))))
        .collect();
    let one_by_one: Vec<Option<Vec<u8>>> = paths.iter().map(|(_, f)| parts.get(f).map(|s| key_of(&s))).collect();
    let extractor = Extractor::new(paths.iter().map(|(_, f)| f.clone()).collect());
    let mut at_once: Vec<Option<Vec<u8>>> = vec![None; paths.len()];
    extractor.extract(&parts, |i, s| at_once[i] = Some(key_of(&s)));
    let Some(event) = &decoded else { return };
    for (i, (path, _)) in paths.iter().enumerate() {
        let want = event.field(path).map(|v| term::json_key(&v));
        assert_eq!(one_by_one[i], want, "path {path:?}: DocParts::get and Event::field disagree");
        assert_eq!(at_once[i], want, "path {path:?}: Extractor and Event::field disagree");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let mode = c.u8();
    let content = c.rest();
    check_file(data);
    check_file(content);
    check_doc(content, data);
    match mode & 3 {
        AS_IS => {}
        FIXED => check_file(&fixed(content, mode & KEEP_VERSION != 0)),
        BUILT => check_built(content),
        DOC => {} // read above, as every input is
        _ => unreachable!("two bits"),
    }
});
