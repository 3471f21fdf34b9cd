//! The delivery WAL's byte layout (`format/delivery-wal.md`).
//!
//! A file `wal-<generation: 20 digits>.log` starts with a 32-byte header:
//! magic `RHEOWAL\0`, version u16, reserved u16 and u32 (zero), the
//! generation u64, reserved u32 (zero), CRC32 of bytes 0..28. Records
//! follow, each framed like a segment record: body length u32, CRC32 of the
//! body u32, body. A length of zero ends the log (the file is zero-filled
//! ahead of writes). The body: LSN u64, kind u8 (1 = group created, 2 =
//! transitions), group name length u16, the name (UTF-8), then MessagePack:
//! a `GroupSnapshot` for kind 1, a list of `Transition` for kind 2.

use crate::engine::error::DecodeError;
use crate::engine::segment::format::{get_u16, get_u32, get_u64};
use crate::groups::journal::{GroupSnapshot, Transition};

/// Magic of a delivery WAL file.
pub const WAL_MAGIC: [u8; 8] = *b"RHEOWAL\0";
/// Version of the delivery WAL layout written. Bump with the spec.
/// Version 2 added the `Pass` transition; version 3 the `Drop` transition
/// (retention) and a group snapshot's `skipped` count per partition;
/// version 4 the `Park` transition (scheduled delivery); version 5 a group
/// summary's trailing `ordered_by_key` (written only when true: per-key
/// order, which an older build must not open as an unordered group). Older
/// files (which never hold them) are read as they are.
pub const WAL_VERSION: u16 = 5;
/// The oldest version this build reads.
pub const WAL_MIN_VERSION: u16 = 1;
/// Size of the header.
pub const WAL_HEADER_LEN: usize = 32;
/// Offset of the generation in the header.
pub const WAL_HDR_GEN: usize = 16;
/// Offset of the header CRC32 (over bytes 0..28).
pub const WAL_HDR_CRC: usize = 28;
/// Size of a record's frame (length, CRC32).
pub const WAL_FRAME_LEN: usize = 8;
/// Offset in the body of the kind byte.
pub const WAL_BODY_KIND: usize = 8;
/// Offset in the body of the group name's length.
pub const WAL_BODY_NAME_LEN: usize = 9;
/// Offset in the body of the group name.
pub const WAL_BODY_NAME: usize = 11;
/// Kind of a group-creation record.
pub const KIND_CREATE: u8 = 1;
/// Kind of a transitions record.
pub const KIND_OPS: u8 = 2;
/// The largest body a record may have (64 MiB).
pub const WAL_MAX_BODY: u32 = 64 << 20;

/// What one record says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    /// A group was created with this state.
    Create(GroupSnapshot),
    /// A group made these transitions.
    Ops(Vec<Transition>),
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WalRecord {
    /// Where its frame starts in the file.
    pub(crate) offset: u64,
    pub(crate) lsn: u64,
    pub(crate) group: String,
    pub(crate) body: Body,
}

/// The header of generation `generation`.
pub fn header(generation: u64) -> [u8; WAL_HEADER_LEN] {
    let mut b = [0u8; WAL_HEADER_LEN];
    b[..8].copy_from_slice(&WAL_MAGIC);
    b[8..10].copy_from_slice(&WAL_VERSION.to_le_bytes());
    b[WAL_HDR_GEN..WAL_HDR_GEN + 8].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32fast::hash(&b[..WAL_HDR_CRC]);
    b[WAL_HDR_CRC..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The version a header states (unchecked), when it has the magic.
pub fn version_of(b: &[u8]) -> Option<u16> {
    (b.len() >= WAL_HEADER_LEN && b[..8] == WAL_MAGIC).then(|| get_u16(b, 8))
}

/// Checks a header (magic, then version, then checksum, then reserved
/// bytes); returns its generation. Versions `WAL_MIN_VERSION..=WAL_VERSION`
/// are read.
pub fn check_header(b: &[u8]) -> Result<u64, DecodeError> {
    if b.len() < WAL_HEADER_LEN || b[..8] != WAL_MAGIC {
        return Err(DecodeError::NotThisKind { kind: "delivery WAL" });
    }
    let version = get_u16(b, 8);
    if !(WAL_MIN_VERSION..=WAL_VERSION).contains(&version) {
        return Err(DecodeError::Version { kind: "delivery WAL", found: version, supported: WAL_VERSION });
    }
    if crc32fast::hash(&b[..WAL_HDR_CRC]) != get_u32(b, WAL_HDR_CRC) {
        return Err(DecodeError::Checksum { what: "delivery WAL header" });
    }
    if b[10..WAL_HDR_GEN].iter().chain(&b[WAL_HDR_GEN + 8..WAL_HDR_CRC]).any(|&x| x != 0) {
        return Err(DecodeError::invalid("delivery WAL header reserved bytes are not zero"));
    }
    Ok(get_u64(b, WAL_HDR_GEN))
}

/// Appends one framed record to `out`.
pub(crate) fn encode(out: &mut Vec<u8>, lsn: u64, group: &str, body: &Body) -> Result<(), String> {
    let start = out.len();
    let encoded = encode_at(out, start, lsn, group, body);
    if encoded.is_err() {
        // Nothing of a record that failed stays behind.
        out.truncate(start);
    }
    encoded
}

/// [`encode`], leaving what it wrote on failure.
fn encode_at(out: &mut Vec<u8>, start: usize, lsn: u64, group: &str, body: &Body) -> Result<(), String> {
    out.extend_from_slice(&[0u8; WAL_FRAME_LEN]);
    out.extend_from_slice(&lsn.to_le_bytes());
    let kind = match body {
        Body::Create(_) => KIND_CREATE,
        Body::Ops(_) => KIND_OPS,
    };
    out.push(kind);
    let name_len = u16::try_from(group.len()).map_err(|_| format!("group name of {} bytes", group.len()))?;
    out.extend_from_slice(&name_len.to_le_bytes());
    out.extend_from_slice(group.as_bytes());
    // Serialized in place, after the name (no buffer of its own).
    let written = match body {
        Body::Create(snap) => rmp_serde::encode::write(out, snap),
        Body::Ops(ops) => rmp_serde::encode::write(out, ops),
    };
    written.map_err(|e| format!("encoding a delivery record of group {group:?}: {e}"))?;
    let body_len = out.len() - start - WAL_FRAME_LEN;
    let len = u32::try_from(body_len)
        .ok()
        .filter(|&l| l <= WAL_MAX_BODY)
        .ok_or_else(|| format!("a delivery record of {body_len} bytes for group {group:?} exceeds {WAL_MAX_BODY}"))?;
    let crc = crc32fast::hash(&out[start + WAL_FRAME_LEN..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// What stopped a scan of the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The end of the bytes, or a zero length followed only by zeros (the
    /// zero-filled space ahead of the writes): the log ends cleanly.
    Clean,
    /// A frame that does not check out (torn or damaged), and why.
    Damaged(DecodeError),
    /// A frame whose checksum is right but whose body this build can't
    /// decode (written whole, so not a torn write), and why.
    Undecodable(DecodeError),
}

/// Decodes one record's body (its CRC already checked).
pub(crate) fn decode_body(body: &[u8]) -> Result<WalRecord, DecodeError> {
    if body.len() < WAL_BODY_NAME {
        return Err(DecodeError::truncated(format!(
            "record body of {} bytes is shorter than its fixed fields",
            body.len()
        )));
    }
    let lsn = get_u64(body, 0);
    let kind = body[WAL_BODY_KIND];
    let name_len = usize::from(get_u16(body, WAL_BODY_NAME_LEN));
    let name_end = WAL_BODY_NAME + name_len;
    let name =
        body.get(WAL_BODY_NAME..name_end).ok_or_else(|| DecodeError::truncated("group name runs past the record"))?;
    let group = std::str::from_utf8(name).map_err(|_| DecodeError::invalid("group name is not UTF-8"))?.to_owned();
    let payload = &body[name_end..];
    let body = match kind {
        KIND_CREATE => Body::Create(
            rmp_serde::from_slice(payload).map_err(|e| DecodeError::invalid(format!("group snapshot: {e}")))?,
        ),
        KIND_OPS => {
            Body::Ops(rmp_serde::from_slice(payload).map_err(|e| DecodeError::invalid(format!("transitions: {e}")))?)
        }
        k => return Err(DecodeError::invalid(format!("unknown record kind {k}"))),
    };
    Ok(WalRecord { offset: 0, lsn, group, body })
}

/// Why a frame does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// Cut short or its checksum is wrong.
    Damaged(DecodeError),
    /// Checksum right, body not understood.
    Undecodable(DecodeError),
}

/// Checks the frame at `off`: Ok(None) at a clean end (a zero length or
/// fewer bytes than a frame, zeros only, to the end), Ok(Some((body, next
/// offset))) when its checksum is right, Err when damaged.
fn frame_at(b: &[u8], off: usize) -> Result<Option<(&[u8], usize)>, DecodeError> {
    let rest = b.get(off..).unwrap_or(&[]);
    let Some(frame) = rest.get(..WAL_FRAME_LEN) else {
        return if rest.iter().all(|&x| x == 0) {
            Ok(None)
        } else {
            Err(DecodeError::truncated("a frame cut short by the end of the file"))
        };
    };
    let len = get_u32(frame, 0);
    if len == 0 {
        return match rest.iter().position(|&x| x != 0) {
            None => Ok(None),
            Some(i) => Err(DecodeError::invalid(format!("non-zero bytes at offset {} after the log's end", off + i))),
        };
    }
    if len > WAL_MAX_BODY {
        return Err(DecodeError::invalid(format!("record length {len} exceeds {WAL_MAX_BODY}")));
    }
    let start = off + WAL_FRAME_LEN;
    let end = start + len as usize;
    let body = b.get(start..end).ok_or_else(|| DecodeError::truncated("a record cut short by the end of the file"))?;
    if crc32fast::hash(body) != get_u32(rest, 4) {
        return Err(DecodeError::Checksum { what: "record" });
    }
    Ok(Some((body, end)))
}

/// Decodes the frame at `off`: Ok(None) at a clean end, Ok(Some((record,
/// next offset))), or why it does not decode.
pub(crate) fn decode_at(b: &[u8], off: usize) -> Result<Option<(WalRecord, usize)>, FrameError> {
    let Some((body, next)) = frame_at(b, off).map_err(FrameError::Damaged)? else { return Ok(None) };
    let mut r = decode_body(body).map_err(FrameError::Undecodable)?;
    r.offset = off as u64;
    Ok(Some((r, next)))
}

/// Decodes every record of a whole WAL file after the header: the records,
/// the length of the valid prefix, and how the scan ended.
pub(crate) fn decode_records(b: &[u8]) -> (Vec<WalRecord>, usize, End) {
    let mut out = Vec::new();
    let mut off = WAL_HEADER_LEN;
    loop {
        match decode_at(b, off) {
            Ok(Some((r, next))) => {
                out.push(r);
                off = next;
            }
            Ok(None) => return (out, off, End::Clean),
            Err(FrameError::Damaged(why)) => return (out, off, End::Damaged(why)),
            Err(FrameError::Undecodable(why)) => return (out, off, End::Undecodable(why)),
        }
    }
}

/// True when a frame with a right checksum and an LSN above `after` starts
/// after the damaged frame at `from`: damage followed by valid records is
/// not a torn tail. Looks at the end the damaged frame's length names and at
/// every offset of the next 1 MiB (a cheap length check rejects most).
pub(crate) fn valid_record_after(b: &[u8], from: usize, after: u64) -> bool {
    // O(1) for a zero or impossible length: no scan of what follows.
    let valid_at = |off: usize| {
        let Some(frame) = b.get(off..off + WAL_FRAME_LEN) else { return false };
        let len = get_u32(frame, 0) as usize;
        if len < 8 || len > WAL_MAX_BODY as usize {
            return false;
        }
        let Some(body) = b.get(off + WAL_FRAME_LEN..off + WAL_FRAME_LEN + len) else { return false };
        crc32fast::hash(body) == get_u32(frame, 4) && get_u64(body, 0) > after
    };
    let declared = b.get(from..from + 4).map(|l| from + WAL_FRAME_LEN + get_u32(l, 0) as usize);
    if declared.is_some_and(|d| d < b.len() && valid_at(d)) {
        return true;
    }
    let end = b.len().min(from.saturating_add(1 << 20));
    (from + 1..end).any(valid_at)
}

/// A summary of a delivery WAL file's bytes, for tools and fuzzing: the
/// generation, how many records decode, the last LSN, and the damage that
/// stopped the scan, if any. Never panics on any input.
pub fn inspect(b: &[u8]) -> Result<(u64, usize, u64, End), DecodeError> {
    let generation = check_header(b)?;
    let (records, _, end) = decode_records(b);
    let last = records.last().map_or(0, |r| r.lsn);
    Ok((generation, records.len(), last, end))
}
