//! Arbitrary bytes through the manifest and transaction-log decoders:
//! first as given, then wrapped in a valid header (and, for the
//! transaction log, with every entry's checksum made right) so that the
//! MessagePack body and the entry checks see fuzzed bytes. Never a panic;
//! a decoded manifest must encode back to the same body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rheo::engine::log::manifest::{
    self, MAN_BODY_CRC, MAN_BODY_LEN, MAN_HEADER_CRC, MAN_HEADER_LEN, MAN_VERSION, MANIFEST_MAGIC,
};
use rheo::engine::log::txn::{self, TXN_MAGIC, TXN_RECORD_LEN};
use rheo::engine::segment::format::FORMAT_VERSION;
use rheo_fuzz::fix_txn_crcs;

fn check_manifest(b: &[u8]) {
    if let Ok(body) = manifest::decode(b) {
        let again = manifest::encode(&body).expect("a decoded manifest encodes");
        assert_eq!(manifest::decode(&again), Ok(body), "manifest round trip");
    }
}

fn check_txn(b: &[u8]) {
    let (last, valid) = txn::decode(b);
    assert!(valid <= b.len() as u64, "valid prefix {valid} beyond {} bytes", b.len());
    assert_eq!(valid % TXN_RECORD_LEN as u64, 0, "valid prefix {valid} not a whole number of entries");
    assert!(valid == 0 || valid >= TXN_RECORD_LEN as u64, "valid prefix without a header");
    assert!(valid > TXN_RECORD_LEN as u64 || last == 0, "a committed id without an entry");
}

/// A manifest file whose header is valid for `body`.
fn manifest_around(body: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; MAN_HEADER_LEN];
    out[..8].copy_from_slice(&MANIFEST_MAGIC);
    out[MAN_VERSION..MAN_VERSION + 2].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[MAN_BODY_LEN..MAN_BODY_LEN + 8].copy_from_slice(&(body.len() as u64).to_le_bytes());
    out[MAN_BODY_CRC..MAN_BODY_CRC + 4].copy_from_slice(&crc32fast::hash(body).to_le_bytes());
    let crc = crc32fast::hash(&out[..MAN_HEADER_CRC]);
    out[MAN_HEADER_CRC..MAN_HEADER_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// A transaction log with a valid header and `entries` (checksums fixed).
fn txn_around(entries: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; TXN_RECORD_LEN];
    out[..8].copy_from_slice(&TXN_MAGIC);
    out[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32fast::hash(&out[..12]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(entries);
    fix_txn_crcs(&mut out, TXN_RECORD_LEN);
    out
}

fuzz_target!(|data: &[u8]| {
    check_manifest(data);
    check_manifest(&manifest_around(data));
    check_txn(data);
    check_txn(&txn_around(data));
});
