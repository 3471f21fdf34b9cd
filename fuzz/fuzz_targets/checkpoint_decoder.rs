//! Arbitrary bytes through the checkpoint decoder (`checkpoint::inspect`),
//! then as `checkpoint-00000000000000000001.ckpt` in the groups directory of
//! a data directory written by a real engine session (stream `s`, groups `g`
//! and `h`, their WAL of generation 1 kept or removed), reopened with
//! `Engine::open`. Decoding and opening answer `Ok` or a typed
//! `rheo::Error`, never panic; a checkpoint that does not decode, or names
//! another generation, never opens. A directory that opened must reopen to
//! the same groups, and what a few calls on its groups write must reopen
//! too (`rheo_fuzz::delivery`).
//!
//! Input layout (fields past the end of the input read as zero):
//!
//! | bytes | field |
//! | --- | --- |
//! | 1 | mode bits (below) |
//! | 8 | LSN of a forged header (`FORGE`), or added to the real one (`REAL`) |
//! | 2 | splice offset (`REAL`, little-endian) |
//! | rest | content |
//!
//! The file is: the content (no mode); a valid header (generation 1, the
//! LSN, the content's length and checksum) then the content as body
//! (`FORGE`); the body of a checkpoint the engine wrote for the same state,
//! with the content written over it at the splice offset, in a valid header
//! (`REAL`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use rheo::engine::delivery::checkpoint::{
    self, CKPT_HDR_BODY_CRC, CKPT_HDR_BODY_LEN, CKPT_HDR_CRC, CKPT_HDR_GEN, CKPT_HDR_LSN, CKPT_HEADER_LEN, CKPT_MAGIC,
    CKPT_VERSION,
};
use rheo::engine::vfs::Vfs;
use rheo::engine::RecoveryMode;
use rheo_fuzz::Cursor;
use rheo_fuzz::delivery::{CKPT1, WAL1, base, open_and_exercise, restore_tree, small_options};

/// A valid header around the content.
const FORGE: u8 = 1;
/// The engine's checkpoint body with the content spliced in.
const REAL: u8 = 1 << 1;
/// Keep the WAL of generation 1 (its records after the LSN replay).
const KEEP_WAL: u8 = 1 << 2;
/// Open with `RecoveryMode::Strict`.
const STRICT: u8 = 1 << 3;

/// A checkpoint file of generation 1 around `body`.
fn around(lsn: u64, body: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; CKPT_HEADER_LEN];
    b[..8].copy_from_slice(&CKPT_MAGIC);
    b[8..10].copy_from_slice(&CKPT_VERSION.to_le_bytes());
    b[CKPT_HDR_GEN..CKPT_HDR_GEN + 8].copy_from_slice(&1u64.to_le_bytes());
    b[CKPT_HDR_LSN..CKPT_HDR_LSN + 8].copy_from_slice(&lsn.to_le_bytes());
    b[CKPT_HDR_BODY_LEN..CKPT_HDR_BODY_LEN + 8].copy_from_slice(&(body.len() as u64).to_le_bytes());
    b[CKPT_HDR_BODY_CRC..CKPT_HDR_BODY_CRC + 4].copy_from_slice(&crc32fast::hash(body).to_le_bytes());
    let crc = crc32fast::hash(&b[..CKPT_HDR_CRC]);
    b[CKPT_HDR_CRC..CKPT_HDR_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(body);
    b
}

fn build(data: &[u8]) -> (u8, Option<u64>, Vec<u8>) {
    let mut c = Cursor::new(data);
    let mode = c.u8();
    let lsn = c.u64();
    let off = usize::from(c.u8()) | usize::from(c.u8()) << 8;
    let content = c.rest();
    if mode & REAL != 0 {
        let real = &base().checkpoint;
        let (_, real_lsn, _) = checkpoint::inspect(real).expect("the engine's checkpoint decodes");
        let mut body = real[CKPT_HEADER_LEN..].to_vec();
        let at = off % (body.len() + 1);
        let end = at + content.len();
        if body.len() < end {
            body.resize(end, 0);
        }
        body[at..end].copy_from_slice(content);
        let lsn = real_lsn.wrapping_add(lsn);
        (mode, Some(lsn), around(lsn, &body))
    } else if mode & FORGE != 0 {
        (mode, Some(lsn), around(lsn, content))
    } else {
        (mode, None, content.to_vec())
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = checkpoint::inspect(data);
    let (mode, forged_lsn, file) = build(data);
    let decoded = checkpoint::inspect(&file);
    if let (Some(lsn), Ok((generation, got, _))) = (forged_lsn, &decoded) {
        assert_eq!((*generation, *got), (1, lsn), "a forged header decodes to other values");
    }

    let vfs = restore_tree(&base().tree);
    vfs.write_file(CKPT1, &file).expect("write the checkpoint");
    if mode & KEEP_WAL == 0 {
        vfs.remove_file(WAL1).expect("remove the WAL");
    }
    let recovery = if mode & STRICT != 0 { RecoveryMode::Strict } else { RecoveryMode::TolerateTornTail };
    let opts = small_options().recovery(recovery);
    let opened = open_and_exercise(&vfs, &opts);
    // The newest checkpoint is the only copy of the state it covers: one
    // that does not decode, or names another generation, must not open.
    match decoded {
        Err(reason) => assert!(!opened, "opened over a checkpoint that does not decode: {reason}"),
        Ok((generation, _, _)) => {
            assert!(generation == 1 || !opened, "opened over a checkpoint of generation {generation} named 1");
        }
    }
});
