//! Record framing: encode one event as a record, decode records from bytes.
//!
//! Decoding never panics and never allocates more than the bytes given; a
//! bad record is a typed [`Decoded`] answer, not an error string from deep
//! inside.

use bytes::Bytes;

use super::format::*;
use crate::model::event::Document;
use crate::model::payload::{Metadata, SortedMap};

/// The fixed-size part of a record body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Sequence in the partition.
    pub seq: u64,
    /// Timestamp, ms since the Unix epoch.
    pub ts: i64,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Transaction id of a multi-partition batch, else 0.
    pub txn: u64,
}

/// The document part of a record, borrowed for encoding: id, key, type,
/// metadata, and the payload already encoded as one MessagePack value.
#[derive(Debug)]
pub struct DocRef<'a>(pub &'a str, pub Option<&'a str>, pub Option<&'a str>, pub &'a Metadata, pub &'a [u8]);

impl DocRef<'_> {
    /// Writes the MessagePack array `[id, key, type, metadata, payload]`,
    /// the payload's bytes as they are.
    pub fn write(&self, out: &mut Vec<u8>) -> Result<(), String> {
        out.push(0x95);
        let e = |e: rmp_serde::encode::Error| e.to_string();
        rmp_serde::encode::write(out, self.0).map_err(e)?;
        rmp_serde::encode::write(out, &self.1).map_err(e)?;
        rmp_serde::encode::write(out, &self.2).map_err(e)?;
        rmp_serde::encode::write_named(out, &SortedMap(self.3)).map_err(e)?;
        out.extend_from_slice(self.4);
        Ok(())
    }
}

/// What the bytes at a record position hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, checksummed record: its header, its MessagePack document and
    /// its total size (frame + body).
    Record {
        /// The fixed fields.
        header: RecordHeader,
        /// The MessagePack `[id, key, type, metadata, payload]`.
        doc: &'a [u8],
        /// Bytes this record occupies.
        size: usize,
    },
    /// Zeros: the end of the written data (segments are zero-preallocated).
    End,
    /// A sealed segment's footer starts here.
    Footer,
    /// More bytes are needed: at least this many from the record start.
    Incomplete(usize),
    /// Not a valid record.
    Invalid(&'static str),
}

/// What a record takes beyond its event's charged size
/// ([`NewEvent::encoded_len`](crate::model::append::NewEvent::encoded_len)):
/// its frame, its header, and the MessagePack heads of its document's
/// five parts.
pub const RECORD_OVERHEAD: usize = FRAME_LEN + BODY_DOC + 16;

/// Appends the record for one event to `out`. Fails only when the body would
/// exceed [`MAX_BODY_LEN`] or the document can't be encoded.
pub fn encode_record(out: &mut Vec<u8>, h: &RecordHeader, doc: &DocRef<'_>) -> Result<usize, String> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_LEN]);
    out.extend_from_slice(&h.seq.to_le_bytes());
    out.extend_from_slice(&h.ts.to_le_bytes());
    out.push(h.flags);
    out.extend_from_slice(&[0u8; 3]);
    out.extend_from_slice(&h.txn.to_le_bytes());
    if let Err(e) = doc.write(out) {
        out.truncate(start);
        return Err(format!("encoding event {:?}: {e}", doc.0));
    }
    let body_len = out.len() - start - FRAME_LEN;
    let Ok(body_len32) = u32::try_from(body_len) else {
        out.truncate(start);
        return Err(format!("record of {body_len} bytes is too large"));
    };
    if body_len32 > MAX_BODY_LEN {
        out.truncate(start);
        return Err(format!("record of {body_len} bytes is above the maximum {MAX_BODY_LEN}"));
    }
    let crc = crc32fast::hash(&out[start + FRAME_LEN..]);
    out[start + REC_LEN..start + REC_LEN + 4].copy_from_slice(&body_len32.to_le_bytes());
    out[start + REC_CRC..start + REC_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    Ok(out.len() - start)
}

/// Decodes the record starting at `buf[0]`.
pub fn decode_record(buf: &[u8]) -> Decoded<'_> {
    if buf.len() < FRAME_LEN {
        if buf.iter().all(|&b| b == 0) && !buf.is_empty() {
            return Decoded::End;
        }
        if !buf.is_empty() && FOOTER_MAGIC.starts_with(buf) {
            return Decoded::Footer;
        }
        return Decoded::Incomplete(FRAME_LEN);
    }
    if buf[..FRAME_LEN] == FOOTER_MAGIC {
        return Decoded::Footer;
    }
    let len = get_u32(buf, REC_LEN);
    if len == 0 && get_u32(buf, REC_CRC) == 0 {
        return Decoded::End;
    }
    if (len as usize) < BODY_MIN || len > MAX_BODY_LEN {
        return Decoded::Invalid("record length out of range");
    }
    let size = FRAME_LEN + len as usize;
    if buf.len() < size {
        return Decoded::Incomplete(size);
    }
    let body = &buf[FRAME_LEN..size];
    if crc32fast::hash(body) != get_u32(buf, REC_CRC) {
        return Decoded::Invalid("record checksum mismatch");
    }
    let flags = body[BODY_FLAGS];
    if flags & !KNOWN_FLAGS != 0 {
        return Decoded::Invalid("unknown record flags");
    }
    if body[BODY_RESERVED..BODY_RESERVED + 3] != [0, 0, 0] {
        return Decoded::Invalid("reserved record bytes are not zero");
    }
    let header =
        RecordHeader { seq: get_u64(body, BODY_SEQ), ts: get_i64(body, BODY_TS), flags, txn: get_u64(body, BODY_TXN) };
    if header.seq == 0 || header.seq == u64::MAX {
        return Decoded::Invalid("record sequence out of range");
    }
    Decoded::Record { header, doc: &body[BODY_DOC..], size }
}

/// Bytes [`plausible_frame`] reads: the frame and the sequence.
pub const PROBE: usize = FRAME_LEN + BODY_SEQ + 8;

/// Whether `b` (at least [`PROBE`] bytes) could start the record of a
/// sequence in `lo..hi`: a length in range and such a sequence. Cheap, so
/// that a byte-by-byte search after damage checksums only plausible starts.
pub fn plausible_frame(b: &[u8], lo: u64, hi: u64) -> bool {
    if b.len() < PROBE {
        return false;
    }
    let len = get_u32(b, REC_LEN);
    let seq = get_u64(b, FRAME_LEN + BODY_SEQ);
    (BODY_MIN_U32..=MAX_BODY_LEN).contains(&len) && seq >= lo && seq < hi
}

/// The first whole, checksummed record at or after `from` in `buf` with a
/// sequence in `lo..hi`: (its offset, its header). For reports that go on
/// past damage (`rheo verify`); reads use the stricter chained search of
/// `Partition::resync`.
pub fn find_record(buf: &[u8], from: usize, lo: u64, hi: u64) -> Option<(usize, RecordHeader)> {
    (from..buf.len().saturating_sub(PROBE - 1)).find_map(|at| {
        if !plausible_frame(&buf[at..], lo, hi) {
            return None;
        }
        match decode_record(&buf[at..]) {
            Decoded::Record { header, .. } => Some((at, header)),
            _ => None,
        }
    })
}

/// Reads a record's MessagePack document (a copy of its bytes; see
/// [`Document::parse`]).
pub fn decode_doc(doc: &[u8]) -> Result<Document, crate::decode::DecodeError> {
    Document::parse(Bytes::copy_from_slice(doc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Vec<u8> {
        let meta: Metadata = serde_json::from_value(json!({"producer": "p"})).expect("map");
        let mut out = Vec::new();
        let h = RecordHeader { seq: 7, ts: 1_000, flags: FLAG_END, txn: 0 };
        let payload = rmp_serde::to_vec(&json!({"a": [1, 2.5, "x"]})).expect("payload");
        encode_record(&mut out, &h, &DocRef("id-1", Some("k"), Some("t"), &meta, &payload)).expect("encode");
        out
    }

    #[test]
    fn round_trip() {
        let bytes = sample();
        let Decoded::Record { header, doc, size } = decode_record(&bytes) else { panic!("not a record") };
        assert_eq!(size, bytes.len());
        assert_eq!(header, RecordHeader { seq: 7, ts: 1_000, flags: FLAG_END, txn: 0 });
        let d = decode_doc(doc).expect("doc");
        assert_eq!((d.id(), d.key(), d.event_type()), ("id-1", Some("k"), Some("t")));
        assert_eq!(d.metadata().get("producer"), Some(&json!("p")));
        assert_eq!(d.payload().json().expect("json"), &json!({"a": [1, 2.5, "x"]}));
        // The same bytes as the whole document encoded in one go.
        let meta: Metadata = serde_json::from_value(json!({"producer": "p"})).expect("map");
        let whole = rmp_serde::to_vec(&("id-1", "k", "t", &meta, json!({"a": [1, 2.5, "x"]}))).expect("whole");
        assert_eq!(doc, &whole[..]);
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let bytes = sample();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                match decode_record(&b) {
                    Decoded::Record { .. } => panic!("flip at byte {i} bit {bit} went unnoticed"),
                    Decoded::Invalid(_) | Decoded::Incomplete(_) | Decoded::End | Decoded::Footer => {}
                }
            }
        }
    }

    #[test]
    fn every_prefix_is_incomplete_not_a_record() {
        let bytes = sample();
        for n in 1..bytes.len() {
            assert!(!matches!(decode_record(&bytes[..n]), Decoded::Record { .. }), "prefix {n}");
        }
    }

    #[test]
    fn zeros_and_footers_end_the_records() {
        assert_eq!(decode_record(&[0u8; 16]), Decoded::End);
        assert_eq!(decode_record(&FOOTER_MAGIC), Decoded::Footer);
    }
}
