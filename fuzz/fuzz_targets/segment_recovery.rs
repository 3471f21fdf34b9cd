//! Arbitrary bytes as the only segment of a one-stream, one-partition data
//! directory in a `MemVfs`, then `Engine::open` (recovery) and a read of
//! every record of the partition. Opening and reading must answer `Ok` or
//! a typed `rheo::Error`, never panic; a directory that opened and read
//! back without error must open again after its own recovery and read the
//! same records.
//!
//! Input layout (fields past the end of the input read as zero):
//!
//! | bytes | field |
//! | --- | --- |
//! | 1 | mode bits (below) |
//! | 8 | footer `last_seq` (mode `FOOTER`; its count follows from it) |
//! | 8 | footer `max_ts` (mode `FOOTER`) |
//! | 8 | committed transaction id (mode `TXN`) |
//! | 1 | index entry count n (mode `INDEX`) |
//! | 40 n | index entries, checksums fixed (mode `INDEX`) |
//! | rest | the segment file's content |

#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use rheo::engine::log::manifest::{self, ManifestBody, StreamEntry};
use rheo::engine::log::txn::{TXN_MAGIC, TXN_RECORD_LEN, encode_entry};
use rheo::engine::segment::file::{Footer, SegmentHeader, encode_index_header};
use rheo::engine::segment::format::{ENTRY_LEN, FORMAT_VERSION, HEADER_LEN, IDX_HEADER_LEN};
use rheo::engine::vfs::{MemVfs, Vfs};
use rheo::engine::{Engine, EngineOptions, RecoveryMode};
use rheo_fuzz::{Cursor, fix_entry_crcs, fix_record_crcs};

/// Prepend a valid segment header (stream 1, partition 0, base 1).
const HEADER: u8 = 1;
/// Fix the checksums of the records after the header.
const FIX_CRCS: u8 = 1 << 1;
/// Append a valid footer (sealing the segment).
const FOOTER: u8 = 1 << 2;
/// Write an index file with a valid header.
const INDEX: u8 = 1 << 3;
/// Write a transaction log with a committed id.
const TXN: u8 = 1 << 4;
/// Open with `RecoveryMode::Strict`.
const STRICT: u8 = 1 << 5;
/// The footer (mode `FOOTER`) claims first sequence 0, not the segment's
/// base 1, and a count of `last_seq + 1` (wrapping, at least 1).
const FOOTER_FROM_ZERO: u8 = 1 << 6;

const STREAM: &str = "s";
const STREAM_DIR: &str = "streams/0000000000000001";
const PARTITION_DIR: &str = "streams/0000000000000001/00000";
const LOG: &str = "streams/0000000000000001/00000/00000000000000000001.log";
const IDX: &str = "streams/0000000000000001/00000/00000000000000000001.idx";
const TXN_PATH: &str = "streams/0000000000000001/txn";

/// Pages of this many records.
const PAGE: usize = 256;

/// Every record of partition 0, or the typed error that stopped the read.
fn read_all(engine: &Engine) -> rheo::Result<Vec<(u64, String)>> {
    let stream = engine.stream(STREAM)?;
    let mut out: Vec<(u64, String)> = Vec::new();
    let mut after = 0;
    loop {
        let page = stream.log.read(0, after, PAGE)?;
        assert!(page.len() <= PAGE, "a page of {} records", page.len());
        let Some(last) = page.last() else { return Ok(out) };
        for r in &page {
            assert!(r.header.seq > after, "sequence {} after {after}", r.header.seq);
            after = r.header.seq;
        }
        assert!(last.header.seq <= stream.log.high_watermark(0), "a record above the high watermark");
        out.extend(page.into_iter().map(|r| (r.header.seq, r.doc.id().to_owned())));
    }
}

fn build(data: &[u8]) -> (MemVfs, RecoveryMode) {
    let mut c = Cursor::new(data);
    let mode = c.u8();
    let last_seq = c.u64();
    let max_ts = c.u64();
    let committed = c.u64();
    let n = usize::from(c.u8());
    let entries = c.take(n * ENTRY_LEN);
    let content = c.rest();

    let vfs = MemVfs::new();
    let body = ManifestBody {
        next_stream_id: 2,
        streams: vec![StreamEntry {
            id: 1,
            name: STREAM.into(),
            partition_count: 1,
            indexes: Vec::new(),
            created_ms: 0,
            settings: Default::default(),
        }],
    };
    let bytes = manifest::encode(&body).expect("encode the manifest");
    vfs.create_dir_all(PARTITION_DIR).expect("mkdir");
    for dir in ["", "streams", STREAM_DIR, PARTITION_DIR] {
        vfs.sync_dir(dir).expect("sync dir");
    }
    vfs.write_file(manifest::MANIFEST, &bytes).expect("write the manifest");

    let mut log = Vec::with_capacity(HEADER_LEN + content.len() + 64);
    if mode & HEADER != 0 {
        log.extend_from_slice(&SegmentHeader { partition: 0, stream_id: 1, base_seq: 1, created_ms: 0 }.encode());
    }
    log.extend_from_slice(content);
    if mode & FIX_CRCS != 0 {
        let at = HEADER_LEN.min(log.len());
        fix_record_crcs(&mut log, at);
    }
    if mode & FOOTER != 0 {
        let (first_seq, last_seq, count) = if mode & FOOTER_FROM_ZERO != 0 {
            (0, last_seq, last_seq.wrapping_add(1).max(1))
        } else {
            (1, last_seq.max(1), last_seq.max(1))
        };
        #[allow(clippy::cast_possible_wrap)]
        let footer = Footer { records_end: log.len() as u64, first_seq, last_seq, count, max_ts: max_ts as i64 };
        log.extend_from_slice(&footer.encode());
    }
    vfs.write_file(LOG, &log).expect("write the segment");

    if mode & INDEX != 0 {
        let mut idx = encode_index_header(1).to_vec();
        idx.extend_from_slice(entries);
        fix_entry_crcs(&mut idx, IDX_HEADER_LEN);
        vfs.write_file(IDX, &idx).expect("write the index");
    }
    if mode & TXN != 0 {
        let mut t = vec![0u8; TXN_RECORD_LEN];
        t[..8].copy_from_slice(&TXN_MAGIC);
        t[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        let crc = crc32fast::hash(&t[..12]);
        t[12..16].copy_from_slice(&crc.to_le_bytes());
        if committed > 0 {
            t.extend_from_slice(&encode_entry(committed));
        }
        vfs.write_file(TXN_PATH, &t).expect("write the transaction log");
    }
    let recovery = if mode & STRICT != 0 { RecoveryMode::Strict } else { RecoveryMode::TolerateTornTail };
    (vfs, recovery)
}

fuzz_target!(|data: &[u8]| {
    let (vfs, recovery) = build(data);
    let opts = EngineOptions::default().recovery(recovery).background_indexing(false);
    // Any `Err` here is a typed `rheo::Error`; a panic fails the target.
    let Ok(engine) = Engine::open(Arc::new(vfs.clone()), opts.clone()) else { return };
    // Index the recovered segments (hostile footers and records included):
    // errors are typed, queries through the indexes answer like a read.
    let _ = engine.build_indexes();
    let first = read_all(&engine);
    if let (Ok(records), Ok(log)) = (&first, engine.stream(STREAM)) {
        let q = rheo::Query::new(STREAM).exists("id").limit(rheo::MAX_LIMIT);
        if let Ok(page) = log.query_page(&q) {
            let got: Vec<u64> = page.events.iter().map(|e| e.sequence()).collect();
            let want: Vec<u64> = records.iter().map(|r| r.0).take(rheo::MAX_LIMIT).collect();
            assert_eq!(got, want, "an indexed query differs from a read");
        }
    }
    drop(engine);
    // Damage that recovery did not have to look at (behind a trusted index
    // point) may surface on read and on the next open, as `Error::Corrupt`.
    // When every record read back, recovery left a directory it accepts
    // again, with the same records.
    let second = Engine::open(Arc::new(vfs), opts).map(|engine| read_all(&engine));
    if let Ok(first) = first {
        match second {
            Ok(Ok(second)) => assert_eq!(first, second, "records differ between two opens"),
            Ok(Err(e)) => {
                panic!("read {} records after the first open, then failed after the second: {e}", first.len())
            }
            Err(e) => panic!("opened and read {} records, then failed to reopen: {e}", first.len()),
        }
    }
});
