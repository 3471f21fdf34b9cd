//! The checkpoint's byte layout (`format/checkpoint.md`).
//!
//! A file `checkpoint-<generation: 20 digits>.ckpt`, written whole to a
//! temporary name, synced, and renamed into place. A 48-byte header: magic
//! `RHEOCKP\0`, version u16, reserved u16 and u32 (zero), generation u64,
//! LSN u64 (the last WAL record it includes), body length u64, body CRC32
//! u32, header CRC32 u32 (over bytes 0..44). The body is MessagePack: the
//! list of every group's `GroupSnapshot`.

use crate::engine::error::DecodeError;
use crate::engine::segment::format::{get_u16, get_u32, get_u64};
use crate::groups::journal::GroupSnapshot;

/// Magic of a checkpoint file.
pub const CKPT_MAGIC: [u8; 8] = *b"RHEOCKP\0";
/// Version of the checkpoint layout written. Bump with the spec. Version 2
/// added each group partition's `skipped` count (retention); version 3 a
/// group summary's trailing `ordered_by_key` (written only when true).
/// Version 1 files are read with `skipped` 0, older ones unordered.
pub const CKPT_VERSION: u16 = 3;
/// The oldest version this build reads.
pub const CKPT_MIN_VERSION: u16 = 1;
/// Offset of the generation.
pub const CKPT_HDR_GEN: usize = 16;
/// Offset of the LSN.
pub const CKPT_HDR_LSN: usize = 24;
/// Offset of the body length.
pub const CKPT_HDR_BODY_LEN: usize = 32;
/// Offset of the body CRC32.
pub const CKPT_HDR_BODY_CRC: usize = 40;
/// Offset of the header CRC32 (over bytes 0..44).
pub const CKPT_HDR_CRC: usize = 44;
/// Size of the header.
pub const CKPT_HEADER_LEN: usize = 48;

/// A decoded checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Checkpoint {
    pub(crate) generation: u64,
    pub(crate) lsn: u64,
    pub(crate) groups: Vec<GroupSnapshot>,
}

/// Encodes a checkpoint.
pub(crate) fn encode(generation: u64, lsn: u64, groups: &[GroupSnapshot]) -> Result<Vec<u8>, String> {
    let body = rmp_serde::to_vec(groups).map_err(|e| format!("encoding a checkpoint: {e}"))?;
    let mut b = vec![0u8; CKPT_HEADER_LEN];
    b[..8].copy_from_slice(&CKPT_MAGIC);
    b[8..10].copy_from_slice(&CKPT_VERSION.to_le_bytes());
    b[CKPT_HDR_GEN..CKPT_HDR_GEN + 8].copy_from_slice(&generation.to_le_bytes());
    b[CKPT_HDR_LSN..CKPT_HDR_LSN + 8].copy_from_slice(&lsn.to_le_bytes());
    b[CKPT_HDR_BODY_LEN..CKPT_HDR_BODY_LEN + 8].copy_from_slice(&(body.len() as u64).to_le_bytes());
    b[CKPT_HDR_BODY_CRC..CKPT_HDR_BODY_CRC + 4].copy_from_slice(&crc32fast::hash(&body).to_le_bytes());
    let crc = crc32fast::hash(&b[..CKPT_HDR_CRC]);
    b[CKPT_HDR_CRC..].copy_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(&body);
    Ok(b)
}

/// The version of a checkpoint whose magic is right, if it is not this
/// build's (for `Error::UnsupportedVersion`).
pub fn other_version(b: &[u8]) -> Option<u16> {
    (b.len() >= 10 && b[..8] == CKPT_MAGIC)
        .then(|| get_u16(b, 8))
        .filter(|v| !(CKPT_MIN_VERSION..=CKPT_VERSION).contains(v))
}

/// Checks the header (magic, version, checksum, reserved bytes):
/// (generation, LSN, body length).
pub fn check_header(b: &[u8]) -> Result<(u64, u64, u64), DecodeError> {
    if b.len() < CKPT_HEADER_LEN || b[..8] != CKPT_MAGIC {
        return Err(DecodeError::NotThisKind { kind: "checkpoint" });
    }
    let version = get_u16(b, 8);
    if !(CKPT_MIN_VERSION..=CKPT_VERSION).contains(&version) {
        return Err(DecodeError::Version { kind: "checkpoint", found: version, supported: CKPT_VERSION });
    }
    if crc32fast::hash(&b[..CKPT_HDR_CRC]) != get_u32(b, CKPT_HDR_CRC) {
        return Err(DecodeError::Checksum { what: "checkpoint header" });
    }
    if b[10..CKPT_HDR_GEN].iter().any(|&x| x != 0) {
        return Err("checkpoint header reserved bytes are not zero".into());
    }
    Ok((get_u64(b, CKPT_HDR_GEN), get_u64(b, CKPT_HDR_LSN), get_u64(b, CKPT_HDR_BODY_LEN)))
}

/// Decodes a whole checkpoint file.
pub(crate) fn decode(b: &[u8]) -> Result<Checkpoint, DecodeError> {
    let (generation, lsn, body_len) = check_header(b)?;
    let body = &b[CKPT_HEADER_LEN..];
    if body.len() as u64 != body_len {
        return Err(DecodeError::truncated(format!(
            "checkpoint body is {} bytes, its header says {body_len}",
            body.len()
        )));
    }
    if crc32fast::hash(body) != get_u32(b, CKPT_HDR_BODY_CRC) {
        return Err(DecodeError::Checksum { what: "checkpoint body" });
    }
    let groups = rmp_serde::from_slice(body).map_err(|e| DecodeError::invalid(format!("checkpoint body: {e}")))?;
    Ok(Checkpoint { generation, lsn, groups })
}

/// A summary of a checkpoint file's bytes, for tools and fuzzing:
/// (generation, LSN, group count). Never panics on any input.
pub fn inspect(b: &[u8]) -> Result<(u64, u64, usize), DecodeError> {
    decode(b).map(|c| (c.generation, c.lsn, c.groups.len()))
}
