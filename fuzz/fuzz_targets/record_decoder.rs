//! Arbitrary bytes through the record decoder: one record at the start of
//! the buffer, then a walk over the whole buffer advancing by each record's
//! size; then the same walk over a copy whose record checksums were fixed,
//! so that the body checks and the document decoder see fuzzed bodies.
//! Every answer must be a typed `Decoded` value or a `decode_doc` error,
//! never a panic; a decoded document must survive a re-encode.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rheo::engine::segment::format::{BODY_DOC, BODY_MIN, FRAME_LEN, KNOWN_FLAGS, MAX_BODY_LEN};
use rheo::engine::segment::record::{Decoded, DocRef, decode_doc, decode_record, encode_record};
use rheo_fuzz::fix_record_crcs;

/// Checks one decoded record against the decoder's documented contract and
/// returns how many bytes it occupies (None when no record starts here).
fn check(buf: &[u8]) -> Option<usize> {
    match decode_record(buf) {
        Decoded::Record { header, doc, size } => {
            assert!(size <= buf.len(), "record size {size} beyond the {} given bytes", buf.len());
            assert!(size >= FRAME_LEN + BODY_MIN, "record size {size} below the minimum");
            assert!(size - FRAME_LEN <= MAX_BODY_LEN as usize, "record body above the maximum");
            assert_eq!(doc.len(), size - FRAME_LEN - BODY_DOC, "document length");
            assert_ne!(header.seq, 0, "a record with sequence 0");
            assert_eq!(header.flags & !KNOWN_FLAGS, 0, "unknown flags accepted");
            if let Ok(d) = decode_doc(doc) {
                // The payload is decoded lazily: an answer, never a panic.
                let _ = d.payload().json();
                // What the decoder accepts, the encoder writes back to the
                // same document.
                let mut out = Vec::new();
                let doc_ref = DocRef(d.id(), d.key(), d.event_type(), d.metadata(), d.payload().as_bytes());
                if encode_record(&mut out, &header, &doc_ref).is_ok() {
                    match decode_record(&out) {
                        Decoded::Record { header: h2, doc: d2, size: s2 } => {
                            assert_eq!(h2, header, "header after a re-encode");
                            assert_eq!(s2, out.len(), "size after a re-encode");
                            let again = decode_doc(d2).expect("a re-encoded document decodes");
                            assert_eq!(again, d, "document after a re-encode");
                        }
                        other => panic!("a re-encoded record decodes as {other:?}"),
                    }
                }
            }
            Some(size)
        }
        Decoded::Incomplete(n) => {
            assert!(n > buf.len(), "Incomplete({n}) with {} bytes given", buf.len());
            assert!(n <= FRAME_LEN + MAX_BODY_LEN as usize, "Incomplete({n}) above the largest record");
            None
        }
        Decoded::End | Decoded::Footer | Decoded::Invalid(_) => None,
    }
}

/// Decodes the records of `buf` one after the other.
fn walk(buf: &[u8]) {
    let mut at = 0;
    while at < buf.len() {
        match check(&buf[at..]) {
            Some(size) => at += size,
            None => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // A document on its own.
    let _ = decode_doc(data);
    // The bytes as given.
    walk(data);
    // The same bytes with every plausible frame's checksum made right.
    let mut fixed = data.to_vec();
    fix_record_crcs(&mut fixed, 0);
    walk(&fixed);
});
