//! Helpers shared by the fuzz targets: a forgiving byte cursor, checksum
//! fix-ups so that the fuzzer gets past the CRCs and reaches the checks
//! behind them, and the delivery-table helpers ([`delivery`]).

pub mod delivery;

use rheo::engine::segment::format::{BODY_MIN, ENT_CRC, ENTRY_LEN, FRAME_LEN, MAX_BODY_LEN, REC_CRC, REC_LEN};

/// Reads fixed-size fields from the front of the fuzz input; past its end
/// every field reads as zero.
#[derive(Debug)]
pub struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// A cursor over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { rest: data }
    }

    /// The next `n` bytes (fewer at the end).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.rest.len());
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        head
    }

    /// The next byte.
    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    /// The next little-endian u64.
    pub fn u64(&mut self) -> u64 {
        let mut a = [0u8; 8];
        let b = self.take(8);
        a[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(a)
    }

    /// Whatever is left.
    pub fn rest(self) -> &'a [u8] {
        self.rest
    }
}

/// Rewrites the CRC of each record frame from `at` on, as long as the
/// frames' lengths are in range and inside the buffer, so that the bodies
/// are checked field by field. Returns where the fixed records end.
pub fn fix_record_crcs(b: &mut [u8], mut at: usize) -> usize {
    while at + FRAME_LEN <= b.len() {
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[at + REC_LEN..at + REC_LEN + 4]);
        let len = u32::from_le_bytes(len);
        if (len as usize) < BODY_MIN || len > MAX_BODY_LEN || b.len() - at - FRAME_LEN < len as usize {
            break;
        }
        let end = at + FRAME_LEN + len as usize;
        let crc = crc32fast::hash(&b[at + FRAME_LEN..end]);
        b[at + REC_CRC..at + REC_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
    at
}

/// Rewrites the CRC of every whole 40-byte index entry from `at` on.
pub fn fix_entry_crcs(b: &mut [u8], at: usize) {
    let Some(entries) = b.get_mut(at..) else { return };
    for e in entries.chunks_exact_mut(ENTRY_LEN) {
        let crc = crc32fast::hash(&e[..ENT_CRC]);
        e[ENT_CRC..ENT_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Rewrites the CRC (over the first 12 bytes, stored in bytes 12..16) of
/// every whole 16-byte transaction-log entry from `at` on.
pub fn fix_txn_crcs(b: &mut [u8], at: usize) {
    let Some(entries) = b.get_mut(at..) else { return };
    for e in entries.chunks_exact_mut(16) {
        let crc = crc32fast::hash(&e[..12]);
        e[12..16].copy_from_slice(&crc.to_le_bytes());
    }
}
