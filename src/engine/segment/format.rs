//! On-disk constants of segment (`.log`) and index (`.idx`) files.
//! Mirrors `format/segment.md` and `format/index.md`: each offset is the
//! previous offset plus the previous field's size. Integers little-endian.

/// The format version written in every file header. Bump with the spec.
pub const FORMAT_VERSION: u16 = 1;

/// Magic of a segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"RHEOLOG\0";
/// Magic of a sealed segment's footer.
pub const FOOTER_MAGIC: [u8; 8] = *b"RHEOSEAL";
/// Magic of an index file.
pub const INDEX_MAGIC: [u8; 8] = *b"RHEOIDX\0";

// Segment header (64 bytes).
/// Offset of the magic.
pub const HDR_MAGIC: usize = 0;
/// Offset of the format version (u16).
pub const HDR_VERSION: usize = HDR_MAGIC + 8;
/// Offset of the flags (u16, zero).
pub const HDR_FLAGS: usize = HDR_VERSION + 2;
/// Offset of the partition (u32).
pub const HDR_PARTITION: usize = HDR_FLAGS + 2;
/// Offset of the stream id (u64).
pub const HDR_STREAM_ID: usize = HDR_PARTITION + 4;
/// Offset of the base sequence (u64): the first record's sequence.
pub const HDR_BASE_SEQ: usize = HDR_STREAM_ID + 8;
/// Offset of the creation time (i64, ms since the Unix epoch).
pub const HDR_CREATED_MS: usize = HDR_BASE_SEQ + 8;
/// Offset of the reserved zero bytes.
pub const HDR_RESERVED: usize = HDR_CREATED_MS + 8;
/// Offset of the header CRC32 (over bytes 0..HDR_CRC).
pub const HDR_CRC: usize = HDR_RESERVED + 20;
/// Size of the segment header.
pub const HEADER_LEN: usize = HDR_CRC + 4;

// Record frame.
/// Offset of the body length (u32).
pub const REC_LEN: usize = 0;
/// Offset of the body CRC32 (u32).
pub const REC_CRC: usize = REC_LEN + 4;
/// Size of the frame before the body.
pub const FRAME_LEN: usize = REC_CRC + 4;

// Record body.
/// Offset of the sequence (u64).
pub const BODY_SEQ: usize = 0;
/// Offset of the timestamp (i64 ms).
pub const BODY_TS: usize = BODY_SEQ + 8;
/// Offset of the flags (u8).
pub const BODY_FLAGS: usize = BODY_TS + 8;
/// Offset of the reserved bytes (3, zero).
pub const BODY_RESERVED: usize = BODY_FLAGS + 1;
/// Offset of the transaction id (u64; 0 unless `FLAG_MULTI`).
pub const BODY_TXN: usize = BODY_RESERVED + 3;
/// Offset of the MessagePack document `[id, key, type, metadata, payload]`.
pub const BODY_DOC: usize = BODY_TXN + 8;
/// The smallest valid body.
pub const BODY_MIN: usize = BODY_DOC + 1;
/// [`BODY_MIN`] as the u32 of a record's length field.
pub const BODY_MIN_U32: u32 = 29;
const _: () = assert!(BODY_MIN_U32 as usize == BODY_MIN);

/// Flag: the last record of an append (single or batch) in this partition.
pub const FLAG_END: u8 = 0b0000_0001;
/// Flag: part of a batch spanning several partitions, committed by the
/// stream's transaction log.
pub const FLAG_MULTI: u8 = 0b0000_0010;
/// Every flag this version knows.
pub const KNOWN_FLAGS: u8 = FLAG_END | FLAG_MULTI;

/// The largest record body accepted (16 MiB).
pub const MAX_BODY_LEN: u32 = 16 << 20;

// Footer (64 bytes), written at the end of the records when a segment seals.
/// Offset of the footer magic.
pub const FTR_MAGIC: usize = 0;
/// Offset of the end of the records (u64) = the footer's own offset.
pub const FTR_RECORDS_END: usize = FTR_MAGIC + 8;
/// Offset of the first sequence (u64).
pub const FTR_FIRST_SEQ: usize = FTR_RECORDS_END + 8;
/// Offset of the last sequence (u64).
pub const FTR_LAST_SEQ: usize = FTR_FIRST_SEQ + 8;
/// Offset of the record count (u64).
pub const FTR_COUNT: usize = FTR_LAST_SEQ + 8;
/// Offset of the largest timestamp (i64).
pub const FTR_MAX_TS: usize = FTR_COUNT + 8;
/// Offset of the reserved zero bytes.
pub const FTR_RESERVED: usize = FTR_MAX_TS + 8;
/// Offset of the footer CRC32 (over bytes 0..FTR_CRC).
pub const FTR_CRC: usize = FTR_RESERVED + 12;
/// Size of the footer.
pub const FOOTER_LEN: usize = FTR_CRC + 4;

// Index file header (32 bytes) and entries (40 bytes each).
/// Offset of the magic.
pub const IDX_MAGIC: usize = 0;
/// Offset of the version (u16).
pub const IDX_VERSION: usize = IDX_MAGIC + 8;
/// Offset of the flags (u16).
pub const IDX_FLAGS: usize = IDX_VERSION + 2;
/// Offset of the reserved bytes.
pub const IDX_RESERVED: usize = IDX_FLAGS + 2;
/// Offset of the segment's base sequence (u64).
pub const IDX_BASE_SEQ: usize = IDX_RESERVED + 4;
/// Offset of the reserved bytes before the CRC.
pub const IDX_RESERVED2: usize = IDX_BASE_SEQ + 8;
/// Offset of the header CRC32 (over 0..IDX_CRC).
pub const IDX_CRC: usize = IDX_RESERVED2 + 4;
/// Size of the index header.
pub const IDX_HEADER_LEN: usize = IDX_CRC + 4;
/// Offset in an entry of the sequence (u64) of the record it points at.
pub const ENT_SEQ: usize = 0;
/// Offset in an entry of the record's byte offset in the segment (u64).
pub const ENT_OFFSET: usize = ENT_SEQ + 8;
/// Offset in an entry of the largest timestamp of all records before it (i64).
pub const ENT_MAX_TS_BEFORE: usize = ENT_OFFSET + 8;
/// Offset in an entry of the largest transaction id of the records before
/// it in the segment (u64, 0 for none).
pub const ENT_MAX_TXN_BEFORE: usize = ENT_MAX_TS_BEFORE + 8;
/// Offset in an entry of the reserved bytes.
pub const ENT_RESERVED: usize = ENT_MAX_TXN_BEFORE + 8;
/// Offset in an entry of its CRC32 (over 0..ENT_CRC).
pub const ENT_CRC: usize = ENT_RESERVED + 4;
/// Size of an index entry.
pub const ENTRY_LEN: usize = ENT_CRC + 4;

/// An index entry is added at an append boundary when at least this many
/// bytes were written since the previous entry.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;

const _: () = assert!(HEADER_LEN == 64);
const _: () = assert!(FOOTER_LEN == 64);
const _: () = assert!(IDX_HEADER_LEN == 32);
const _: () = assert!(ENTRY_LEN == 40);
const _: () = assert!(FRAME_LEN == 8);
const _: () = assert!(BODY_DOC == 28);
// A copy into a mapped segment stores whole chunks in order: the torn part
// of one chunk must not be able to hold a whole record (ADR 0035).
const _: () = assert!(crate::engine::vfs::COPY_CHUNK < FRAME_LEN + BODY_MIN);

/// Reads a little-endian u16 at `at` (callers check bounds).
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(a)
}

/// Reads a little-endian u32 at `at`.
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Reads a little-endian u64 at `at`.
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads a little-endian i64 at `at`.
pub(crate) fn get_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_le_bytes(a)
}
