//! Arbitrary bytes through the index, segment-header and footer decoders:
//! first as given, then with their magic and checksums made right so that
//! the checks behind them see fuzzed fields. Never a panic; whatever
//! decodes must encode back to the same value, and a decoded index must
//! keep the invariants the engine relies on.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rheo::engine::segment::file::{Footer, IndexEntry, SegmentHeader, decode_index, encode_index_header};
use rheo::engine::segment::format::{
    ENTRY_LEN, FOOTER_LEN, FOOTER_MAGIC, FTR_CRC, HDR_CRC, HEADER_LEN, IDX_HEADER_LEN, SEGMENT_MAGIC,
};
use rheo_fuzz::{Cursor, fix_entry_crcs};

/// The invariants of a decoded index.
fn check_index(b: &[u8], base_seq: u64) {
    let entries = decode_index(b, base_seq);
    assert!(entries.len() <= b.len().saturating_sub(IDX_HEADER_LEN) / ENTRY_LEN, "more entries than bytes");
    for pair in entries.windows(2) {
        assert!(pair[0].seq < pair[1].seq && pair[0].offset < pair[1].offset, "index not increasing");
    }
    for e in &entries {
        assert!(e.seq >= base_seq && e.offset >= HEADER_LEN as u64, "index entry before its segment");
        assert_eq!(IndexEntry::decode(&e.encode()), Some(*e), "entry round trip");
    }
}

fn check_entry(b: &[u8]) {
    if let Some(e) = IndexEntry::decode(b) {
        assert_eq!(IndexEntry::decode(&e.encode()), Some(e), "entry round trip");
    }
}

fn check_header(b: &[u8]) {
    if let Ok(h) = SegmentHeader::decode(b) {
        assert_eq!(SegmentHeader::decode(&h.encode()), Ok(h), "header round trip");
    }
}

fn check_footer(b: &[u8]) {
    if let Ok(f) = Footer::decode(b) {
        assert!(f.count > 0 && f.first_seq <= f.last_seq, "inconsistent footer accepted");
        assert_eq!(Footer::decode(&f.encode()), Ok(f), "footer round trip");
    }
}

/// `b` (at least `len` bytes, zero-padded) with `magic` in front and its
/// CRC over `..crc_at` stored at `crc_at`.
fn forged(b: &[u8], len: usize, magic: &[u8; 8], crc_at: usize) -> Vec<u8> {
    let mut v = b.to_vec();
    if v.len() < len {
        v.resize(len, 0);
    }
    v[..8].copy_from_slice(magic);
    let crc = crc32fast::hash(&v[..crc_at]);
    v[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    v
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let base_seq = c.u64();
    let rest = c.rest();

    // As given.
    check_index(rest, base_seq);
    check_entry(rest);
    check_header(rest);
    check_footer(rest);
    check_index(data, base_seq);

    // An index with a valid header for `base_seq` and entries whose
    // checksums are right: only the ordering and range checks remain.
    let mut idx = encode_index_header(base_seq).to_vec();
    idx.extend_from_slice(rest);
    fix_entry_crcs(&mut idx, IDX_HEADER_LEN);
    check_index(&idx, base_seq);
    for e in idx[IDX_HEADER_LEN..].chunks(ENTRY_LEN) {
        check_entry(e);
    }

    // A segment header and a footer with the right magic and checksum.
    check_header(&forged(rest, HEADER_LEN, &SEGMENT_MAGIC, HDR_CRC));
    check_footer(&forged(rest, FOOTER_LEN, &FOOTER_MAGIC, FTR_CRC));
});
