//! Arbitrary bytes through the delivery WAL decoder (`wal::inspect`), then
//! as the WAL (generation 1) of a data directory written by a real engine
//! session (stream `s`, groups `g` and `h`), reopened with `Engine::open`.
//! Decoding and opening answer `Ok` or a typed `rheo::Error`, never panic.
//! A directory that opened must reopen to the same groups, and what a few
//! calls on its groups write must reopen too (`rheo_fuzz::delivery`).
//!
//! Input layout (fields past the end of the input read as zero):
//!
//! | bytes | field |
//! | --- | --- |
//! | 1 | mode bits (below) |
//! | 2 | splice offset (mode `SPLICE`, little-endian) |
//! | rest | content |
//!
//! The WAL file is: the content (no mode); a valid header of generation 1
//! then the content (`HEADER`); the engine-written WAL then the content
//! (`BASE`); the engine-written WAL with the content written over it at the
//! splice offset (`SPLICE`). `FIX_CRCS` then fixes the checksum of every
//! record frame that fits.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rheo::engine::delivery::wal::{self, End};
use rheo::engine::RecoveryMode;
use rheo_fuzz::Cursor;
use rheo_fuzz::delivery::{RECORDS_AT, WAL1, base, fix_wal_crcs, open_and_exercise, restore_tree, small_options};

/// A valid header of generation 1 before the content.
const HEADER: u8 = 1;
/// The engine-written WAL (header and records) before the content.
const BASE: u8 = 1 << 1;
/// The content written over the engine-written WAL at the splice offset.
const SPLICE: u8 = 1 << 2;
/// Fix every record frame's checksum.
const FIX_CRCS: u8 = 1 << 3;
/// Open with `RecoveryMode::Strict`.
const STRICT: u8 = 1 << 4;
/// Open with `RecoveryMode::TruncateAtFirstDamage`.
const TRUNCATE: u8 = 1 << 5;
/// Remove the WAL instead when the content is empty (a directory without one).
const REMOVE_EMPTY: u8 = 1 << 6;

fn check_inspect(b: &[u8]) {
    if let Ok((_, records, _, end)) = wal::inspect(b) {
        // Each record takes at least a frame and the body's fixed 11 bytes.
        assert!(records <= b.len().saturating_sub(RECORDS_AT) / 19, "{records} records in {} bytes", b.len());
        if let End::Damaged(reason) = end {
            assert!(!reason.to_string().is_empty(), "damage without a reason");
        }
    }
}

fn build(data: &[u8]) -> (u8, Vec<u8>) {
    let mut c = Cursor::new(data);
    let mode = c.u8();
    let off = usize::from(c.u8()) | usize::from(c.u8()) << 8;
    let content = c.rest();
    let base = &base().wal;
    let mut file = Vec::with_capacity(base.len() + content.len() + 32);
    if mode & SPLICE != 0 {
        file.extend_from_slice(base);
        let at = off % (base.len() + 1);
        let end = at + content.len();
        if file.len() < end {
            file.resize(end, 0);
        }
        file[at..end].copy_from_slice(content);
    } else {
        if mode & BASE != 0 {
            file.extend_from_slice(base);
        } else if mode & HEADER != 0 {
            file.extend_from_slice(&wal::header(1));
        }
        file.extend_from_slice(content);
    }
    if mode & FIX_CRCS != 0 {
        let at = RECORDS_AT.min(file.len());
        fix_wal_crcs(&mut file, at);
    }
    (mode, file)
}

fuzz_target!(|data: &[u8]| {
    check_inspect(data);
    let (mode, file) = build(data);
    check_inspect(&file);

    let vfs = restore_tree(&base().tree);
    if file.is_empty() && mode & REMOVE_EMPTY != 0 {
        rheo::engine::vfs::Vfs::remove_file(&vfs, WAL1).expect("remove the WAL");
    } else {
        vfs.write_file(WAL1, &file).expect("write the WAL");
    }
    let recovery = if mode & STRICT != 0 {
        RecoveryMode::Strict
    } else if mode & TRUNCATE != 0 {
        RecoveryMode::TruncateAtFirstDamage
    } else {
        RecoveryMode::TolerateTornTail
    };
    let opts = small_options().recovery(recovery);
    let opened = open_and_exercise(&vfs, &opts);
    if recovery == RecoveryMode::Strict && opened {
        // Strict accepts only a whole, undamaged WAL of the right generation.
        match wal::inspect(&file) {
            Ok((generation, _, _, end)) => {
                assert_eq!(generation, 1, "strict open accepted a WAL of generation {generation}");
                assert_eq!(end, End::Clean, "strict open accepted a damaged WAL");
            }
            // Only when the file was removed (a directory without a WAL).
            Err(reason) => assert!(
                mode & REMOVE_EMPTY != 0 && file.is_empty(),
                "strict open accepted a WAL whose header fails ({reason}), {} bytes",
                file.len()
            ),
        }
    }
});
