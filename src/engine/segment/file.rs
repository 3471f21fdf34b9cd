//! Segment header and footer, and the index file's header and entries.

use super::format::*;
use crate::engine::error::DecodeError;

/// The header at the start of every segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The partition.
    pub partition: u32,
    /// The stream's id in the manifest.
    pub stream_id: u64,
    /// The sequence of the first record.
    pub base_seq: u64,
    /// When the segment was created (ms).
    pub created_ms: i64,
}

impl SegmentHeader {
    /// The 64 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[HDR_MAGIC..HDR_MAGIC + 8].copy_from_slice(&SEGMENT_MAGIC);
        b[HDR_VERSION..HDR_VERSION + 2].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[HDR_PARTITION..HDR_PARTITION + 4].copy_from_slice(&self.partition.to_le_bytes());
        b[HDR_STREAM_ID..HDR_STREAM_ID + 8].copy_from_slice(&self.stream_id.to_le_bytes());
        b[HDR_BASE_SEQ..HDR_BASE_SEQ + 8].copy_from_slice(&self.base_seq.to_le_bytes());
        b[HDR_CREATED_MS..HDR_CREATED_MS + 8].copy_from_slice(&self.created_ms.to_le_bytes());
        let crc = crc32fast::hash(&b[..HDR_CRC]);
        b[HDR_CRC..HDR_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header: magic, then version (so that a newer
    /// format is reported as such, whatever its layout), then checksum.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        if b.len() < HEADER_LEN {
            return Err(DecodeError::truncated(format!("segment header is {} bytes, expected {HEADER_LEN}", b.len())));
        }
        if b[HDR_MAGIC..HDR_MAGIC + 8] != SEGMENT_MAGIC {
            return Err(DecodeError::NotThisKind { kind: "segment file" });
        }
        let version = get_u16(b, HDR_VERSION);
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version { kind: "segment", found: version, supported: FORMAT_VERSION });
        }
        if crc32fast::hash(&b[..HDR_CRC]) != get_u32(b, HDR_CRC) {
            return Err(DecodeError::Checksum { what: "segment header" });
        }
        Ok(SegmentHeader {
            partition: get_u32(b, HDR_PARTITION),
            stream_id: get_u64(b, HDR_STREAM_ID),
            base_seq: get_u64(b, HDR_BASE_SEQ),
            created_ms: get_i64(b, HDR_CREATED_MS),
        })
    }
}

/// The footer written when a segment seals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    /// Where the records end (and the footer starts).
    pub records_end: u64,
    /// The first sequence (the base sequence).
    pub first_seq: u64,
    /// The last sequence.
    pub last_seq: u64,
    /// The number of records.
    pub count: u64,
    /// The largest timestamp.
    pub max_ts: i64,
}

impl Footer {
    /// The 64 footer bytes.
    pub fn encode(&self) -> [u8; FOOTER_LEN] {
        let mut b = [0u8; FOOTER_LEN];
        b[FTR_MAGIC..FTR_MAGIC + 8].copy_from_slice(&FOOTER_MAGIC);
        b[FTR_RECORDS_END..FTR_RECORDS_END + 8].copy_from_slice(&self.records_end.to_le_bytes());
        b[FTR_FIRST_SEQ..FTR_FIRST_SEQ + 8].copy_from_slice(&self.first_seq.to_le_bytes());
        b[FTR_LAST_SEQ..FTR_LAST_SEQ + 8].copy_from_slice(&self.last_seq.to_le_bytes());
        b[FTR_COUNT..FTR_COUNT + 8].copy_from_slice(&self.count.to_le_bytes());
        b[FTR_MAX_TS..FTR_MAX_TS + 8].copy_from_slice(&self.max_ts.to_le_bytes());
        let crc = crc32fast::hash(&b[..FTR_CRC]);
        b[FTR_CRC..FTR_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a footer.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        if b.len() < FOOTER_LEN {
            return Err(DecodeError::truncated(format!("footer is {} bytes, expected {FOOTER_LEN}", b.len())));
        }
        if b[FTR_MAGIC..FTR_MAGIC + 8] != FOOTER_MAGIC {
            return Err(DecodeError::NotThisKind { kind: "segment footer" });
        }
        if crc32fast::hash(&b[..FTR_CRC]) != get_u32(b, FTR_CRC) {
            return Err(DecodeError::Checksum { what: "footer" });
        }
        let f = Footer {
            records_end: get_u64(b, FTR_RECORDS_END),
            first_seq: get_u64(b, FTR_FIRST_SEQ),
            last_seq: get_u64(b, FTR_LAST_SEQ),
            count: get_u64(b, FTR_COUNT),
            max_ts: get_i64(b, FTR_MAX_TS),
        };
        // Sequences start at 1 and a next sequence must exist after the last.
        let consistent = f.first_seq >= 1
            && f.last_seq < u64::MAX
            && f.last_seq >= f.first_seq
            && f.count >= 1
            && f.last_seq - f.first_seq == f.count - 1
            && f.records_end >= HEADER_LEN as u64;
        if !consistent {
            return Err(DecodeError::invalid("footer sequence range is inconsistent"));
        }
        Ok(f)
    }
}

/// One sparse index point, always at the start of an append: the record
/// with sequence `seq` starts at byte `offset` of the segment; every record
/// before it has a timestamp at most `max_ts_before` (`i64::MIN` for none)
/// and a transaction id at most `max_txn_before`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// The record's sequence.
    pub seq: u64,
    /// Its byte offset in the segment.
    pub offset: u64,
    /// The largest timestamp of the records before it in the segment.
    pub max_ts_before: i64,
    /// The largest transaction id of the records before it in the segment.
    pub max_txn_before: u64,
}

/// The 32-byte header of an index file.
pub fn encode_index_header(base_seq: u64) -> [u8; IDX_HEADER_LEN] {
    let mut b = [0u8; IDX_HEADER_LEN];
    b[IDX_MAGIC..IDX_MAGIC + 8].copy_from_slice(&INDEX_MAGIC);
    b[IDX_VERSION..IDX_VERSION + 2].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[IDX_BASE_SEQ..IDX_BASE_SEQ + 8].copy_from_slice(&base_seq.to_le_bytes());
    let crc = crc32fast::hash(&b[..IDX_CRC]);
    b[IDX_CRC..IDX_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

impl IndexEntry {
    /// The 40 entry bytes.
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[ENT_SEQ..ENT_SEQ + 8].copy_from_slice(&self.seq.to_le_bytes());
        b[ENT_OFFSET..ENT_OFFSET + 8].copy_from_slice(&self.offset.to_le_bytes());
        b[ENT_MAX_TS_BEFORE..ENT_MAX_TS_BEFORE + 8].copy_from_slice(&self.max_ts_before.to_le_bytes());
        b[ENT_MAX_TXN_BEFORE..ENT_MAX_TXN_BEFORE + 8].copy_from_slice(&self.max_txn_before.to_le_bytes());
        let crc = crc32fast::hash(&b[..ENT_CRC]);
        b[ENT_CRC..ENT_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes one entry; None when its checksum fails (a torn or stale entry).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < ENTRY_LEN || crc32fast::hash(&b[..ENT_CRC]) != get_u32(b, ENT_CRC) {
            return None;
        }
        Some(IndexEntry {
            seq: get_u64(b, ENT_SEQ),
            offset: get_u64(b, ENT_OFFSET),
            max_ts_before: get_i64(b, ENT_MAX_TS_BEFORE),
            max_txn_before: get_u64(b, ENT_MAX_TXN_BEFORE),
        })
    }
}

/// Decodes an index file for the segment starting at `base_seq`: the longest
/// prefix of valid entries with strictly increasing sequences and offsets.
/// An index is derived data, so a bad header or entry is never fatal: the
/// caller rebuilds what is missing from the log.
pub fn decode_index(b: &[u8], base_seq: u64) -> Vec<IndexEntry> {
    if b.len() < IDX_HEADER_LEN
        || b[IDX_MAGIC..IDX_MAGIC + 8] != INDEX_MAGIC
        || crc32fast::hash(&b[..IDX_CRC]) != get_u32(b, IDX_CRC)
        || get_u16(b, IDX_VERSION) != FORMAT_VERSION
        || get_u64(b, IDX_BASE_SEQ) != base_seq
    {
        return Vec::new();
    }
    let mut out: Vec<IndexEntry> = Vec::new();
    for chunk in b[IDX_HEADER_LEN..].chunks_exact(ENTRY_LEN) {
        let Some(e) = IndexEntry::decode(chunk) else { break };
        let increasing = out.last().is_none_or(|p| e.seq > p.seq && e.offset > p.offset);
        if !increasing || e.seq < base_seq || e.offset < HEADER_LEN as u64 {
            break;
        }
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_version_check() {
        let h = SegmentHeader { partition: 3, stream_id: 9, base_seq: 1001, created_ms: -5 };
        let mut b = h.encode();
        assert_eq!(SegmentHeader::decode(&b), Ok(h));
        b[HDR_VERSION] = 2;
        let crc = crc32fast::hash(&b[..HDR_CRC]);
        b[HDR_CRC..HDR_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(SegmentHeader::decode(&b), Err(DecodeError::Version { kind: "segment", found: 2, supported: 1 }));
    }

    #[test]
    fn footer_round_trip_and_consistency() {
        let f = Footer { records_end: 4096, first_seq: 10, last_seq: 19, count: 10, max_ts: 77 };
        assert_eq!(Footer::decode(&f.encode()), Ok(f));
        let bad = Footer { count: 3, ..f };
        assert!(Footer::decode(&bad.encode()).is_err());
        // Values a fuzzer found: they must be refused, not overflow.
        let max = Footer { first_seq: 0, last_seq: u64::MAX, count: 1, ..f };
        assert!(Footer::decode(&max.encode()).is_err());
        let last = Footer { first_seq: 1, last_seq: u64::MAX, count: u64::MAX, ..f };
        assert!(Footer::decode(&last.encode()).is_err());
    }

    #[test]
    fn index_stops_at_the_first_bad_entry() {
        let mut b = encode_index_header(1).to_vec();
        for i in 0..4u64 {
            b.extend_from_slice(
                &IndexEntry { seq: 1 + i * 10, offset: 64 + i * 5000, max_ts_before: 0, max_txn_before: i }.encode(),
            );
        }
        assert_eq!(decode_index(&b, 1).len(), 4);
        let third = IDX_HEADER_LEN + 2 * ENTRY_LEN;
        b[third] ^= 1;
        assert_eq!(decode_index(&b, 1).len(), 2);
        assert!(decode_index(&b, 2).is_empty(), "another segment's index");
        assert!(decode_index(&b[..10], 1).is_empty());
    }
}
