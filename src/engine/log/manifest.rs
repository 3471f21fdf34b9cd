//! The manifest: the registry of streams, replaced atomically.
//!
//! Layout (`format/manifest.md`): a 32-byte header (magic, version, body
//! length, body CRC, header CRC) then a MessagePack body. Written to
//! `MANIFEST.tmp`, synced, renamed over `MANIFEST`, then the directory synced.

use serde::{Deserialize, Serialize};

use crate::engine::error::{DecodeError, corrupt, io_err, sync_err};
use crate::engine::segment::format::{get_u16, get_u32, get_u64};
use crate::engine::vfs::Vfs;
use crate::error::{Error, Result};

/// Magic of the manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"RHEOMAN\0";
/// The manifest file name.
pub const MANIFEST: &str = "MANIFEST";
const MANIFEST_TMP: &str = "MANIFEST.tmp";
/// Offset of the version (u16).
pub const MAN_VERSION: usize = 8;
/// Offset of the flags (u16).
pub const MAN_FLAGS: usize = MAN_VERSION + 2;
/// Offset of the reserved bytes (u32).
pub const MAN_RESERVED: usize = MAN_FLAGS + 2;
/// Offset of the body length (u64).
pub const MAN_BODY_LEN: usize = MAN_RESERVED + 4;
/// Offset of the body CRC32 (u32).
pub const MAN_BODY_CRC: usize = MAN_BODY_LEN + 8;
/// Offset of the header CRC32 (over 0..MAN_HEADER_CRC).
pub const MAN_HEADER_CRC: usize = MAN_BODY_CRC + 4;
/// Size of the manifest header.
pub const MAN_HEADER_LEN: usize = MAN_HEADER_CRC + 4;
/// The manifest version written: 2 added each stream's options
/// ([`StreamSettings`]).
pub const MANIFEST_VERSION: u16 = 2;
/// The oldest manifest version read (version 1: streams without options,
/// read as no retention and the backend's dedupe window).
pub const MANIFEST_MIN_VERSION: u16 = 1;
/// The largest manifest body accepted (64 MiB).
pub const MAX_MANIFEST_BODY: u64 = 64 << 20;

/// One stream in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamEntry {
    /// Its id: the name of its directory (16 hex digits).
    pub id: u64,
    /// Its user-given name.
    pub name: String,
    /// Its partition count.
    pub partition_count: u32,
    /// Its declared payload indexes.
    pub indexes: Vec<String>,
    /// When it was created (ms).
    pub created_ms: i64,
    /// Its retention and dedupe window (version 2; absent in version 1).
    #[serde(default)]
    pub settings: StreamSettings,
}

/// A stream's changeable options, as the manifest stores them (version 2).
/// Every field is always written (the body is positional).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSettings {
    /// Drop events older than this many ms (None: no age limit).
    pub max_age_ms: Option<u64>,
    /// Keep at most this many bytes per partition.
    pub max_bytes: Option<u64>,
    /// Keep at most this many events per partition.
    pub max_events: Option<u64>,
    /// 0: `limits`, 1: `interest` (other values are read as `limits`).
    pub policy: u8,
    /// The dedupe window in ms (None: the backend's setting).
    pub dedupe_window_ms: Option<u64>,
}

impl StreamSettings {
    /// The settings of a stream's options.
    pub fn of(retention: &crate::model::retention::Retention, dedupe_window: Option<std::time::Duration>) -> Self {
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        StreamSettings {
            max_age_ms: retention.max_age.map(ms),
            max_bytes: retention.max_bytes,
            max_events: retention.max_events,
            policy: match retention.policy {
                crate::model::retention::RetentionPolicy::Limits => 0,
                crate::model::retention::RetentionPolicy::Interest => 1,
            },
            dedupe_window_ms: dedupe_window.map(ms),
        }
    }

    /// The retention they describe.
    pub fn retention(&self) -> crate::model::retention::Retention {
        use crate::model::retention::{Retention, RetentionPolicy};
        let mut r =
            Retention::new().policy(if self.policy == 1 { RetentionPolicy::Interest } else { RetentionPolicy::Limits });
        r.max_age = self.max_age_ms.map(std::time::Duration::from_millis);
        r.max_bytes = self.max_bytes;
        r.max_events = self.max_events;
        r
    }

    /// The dedupe window (None: the backend's setting).
    pub fn dedupe_window(&self) -> Option<std::time::Duration> {
        self.dedupe_window_ms.map(std::time::Duration::from_millis)
    }
}

/// The manifest body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestBody {
    /// The id the next stream gets.
    pub next_stream_id: u64,
    /// Every stream, in creation order.
    pub streams: Vec<StreamEntry>,
}

/// Encodes a manifest file.
pub fn encode(body: &ManifestBody) -> Result<Vec<u8>> {
    let payload = rmp_serde::to_vec(body).map_err(|e| Error::failed("write manifest", e.to_string()))?;
    let mut out = vec![0u8; MAN_HEADER_LEN];
    out[..8].copy_from_slice(&MANIFEST_MAGIC);
    out[MAN_VERSION..MAN_VERSION + 2].copy_from_slice(&MANIFEST_VERSION.to_le_bytes());
    out[MAN_BODY_LEN..MAN_BODY_LEN + 8].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    out[MAN_BODY_CRC..MAN_BODY_CRC + 4].copy_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    let crc = crc32fast::hash(&out[..MAN_HEADER_CRC]);
    out[MAN_HEADER_CRC..MAN_HEADER_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Decodes a manifest file; the error says what is wrong and at which offset.
pub fn decode(b: &[u8]) -> Result<ManifestBody, (u64, DecodeError)> {
    if b.len() < MAN_HEADER_LEN {
        return Err((0, DecodeError::truncated(format!("manifest is {} bytes, shorter than its header", b.len()))));
    }
    if b[..8] != MANIFEST_MAGIC {
        return Err((0, DecodeError::NotThisKind { kind: "manifest" }));
    }
    let version = get_u16(b, MAN_VERSION);
    if !(MANIFEST_MIN_VERSION..=MANIFEST_VERSION).contains(&version) {
        return Err((
            MAN_VERSION as u64,
            DecodeError::Version { kind: "manifest", found: version, supported: MANIFEST_VERSION },
        ));
    }
    if crc32fast::hash(&b[..MAN_HEADER_CRC]) != get_u32(b, MAN_HEADER_CRC) {
        return Err((MAN_HEADER_CRC as u64, DecodeError::Checksum { what: "manifest header" }));
    }
    let len = get_u64(b, MAN_BODY_LEN);
    if len > MAX_MANIFEST_BODY || len != (b.len() - MAN_HEADER_LEN) as u64 {
        return Err((
            MAN_BODY_LEN as u64,
            DecodeError::invalid(format!("manifest body length {len} does not match the file")),
        ));
    }
    let body = &b[MAN_HEADER_LEN..];
    if crc32fast::hash(body) != get_u32(b, MAN_BODY_CRC) {
        return Err((MAN_HEADER_LEN as u64, DecodeError::Checksum { what: "manifest body" }));
    }
    rmp_serde::from_slice(body)
        .map_err(|e| (MAN_HEADER_LEN as u64, DecodeError::invalid(format!("manifest body: {e}"))))
}

/// Reads the manifest; None when the data directory has none yet.
pub fn load(vfs: &dyn Vfs) -> Result<Option<ManifestBody>> {
    if !vfs.exists(MANIFEST).map_err(|e| io_err(vfs, MANIFEST, "stat", e))? {
        return Ok(None);
    }
    let f = vfs.open(MANIFEST, false).map_err(|e| io_err(vfs, MANIFEST, "open", e))?;
    let len = f.len().map_err(|e| io_err(vfs, MANIFEST, "stat", e))?;
    if len > MAX_MANIFEST_BODY + MAN_HEADER_LEN as u64 {
        return Err(corrupt(vfs, MANIFEST, 0, format!("manifest of {len} bytes is too large")));
    }
    let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
    let n = f.read_at(&mut buf, 0).map_err(|e| io_err(vfs, MANIFEST, "read", e))?;
    buf.truncate(n);
    if buf.len() >= MAN_HEADER_LEN && buf[..8] == MANIFEST_MAGIC {
        let found = get_u16(&buf, MAN_VERSION);
        if !(MANIFEST_MIN_VERSION..=MANIFEST_VERSION).contains(&found) {
            return Err(Error::UnsupportedVersion { file: vfs.describe(MANIFEST), found, supported: MANIFEST_VERSION });
        }
    }
    decode(&buf).map(Some).map_err(|(offset, reason)| corrupt(vfs, MANIFEST, offset, reason))
}

/// Replaces the manifest atomically and durably.
pub fn store(vfs: &dyn Vfs, body: &ManifestBody) -> Result<()> {
    let bytes = encode(body)?;
    let tmp = vfs.open(MANIFEST_TMP, true).map_err(|e| io_err(vfs, MANIFEST_TMP, "create", e))?;
    tmp.set_len(0).map_err(|e| io_err(vfs, MANIFEST_TMP, "truncate", e))?;
    tmp.write_all_at(&bytes, 0).map_err(|e| io_err(vfs, MANIFEST_TMP, "write", e))?;
    tmp.sync_data().map_err(|e| sync_err(vfs, MANIFEST_TMP, e))?;
    vfs.rename(MANIFEST_TMP, MANIFEST).map_err(|e| io_err(vfs, MANIFEST, "rename", e))?;
    vfs.sync_dir("").map_err(|e| sync_err(vfs, "", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::vfs::MemVfs;

    #[test]
    fn round_trip_and_every_bit_flip_is_caught() {
        let body = ManifestBody {
            next_stream_id: 3,
            streams: vec![StreamEntry {
                id: 1,
                name: "../x".into(),
                partition_count: 4,
                indexes: vec!["a".into()],
                created_ms: 5,
                settings: StreamSettings {
                    max_age_ms: Some(60_000),
                    max_bytes: None,
                    max_events: Some(7),
                    policy: 1,
                    dedupe_window_ms: Some(0),
                },
            }],
        };
        let bytes = encode(&body).expect("encode");
        assert_eq!(decode(&bytes), Ok(body));
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn store_then_load_survives_a_crash() {
        let vfs = MemVfs::new();
        assert_eq!(load(&vfs).expect("load"), None);
        let body = ManifestBody { next_stream_id: 1, streams: vec![] };
        store(&vfs, &body).expect("store");
        vfs.crash();
        assert_eq!(load(&vfs).expect("load"), Some(body));
    }
}
