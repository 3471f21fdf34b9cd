//! The per-stream transaction log: the commit point of batches that span
//! several partitions.
//!
//! A multi-partition batch writes its records (flagged `FLAG_MULTI` with a
//! transaction id) to every partition, syncs them, and only then appends the
//! transaction id here and syncs this file. Recovery drops a trailing
//! multi-partition batch whose id is above the last id recorded here, so a
//! batch is visible in all its partitions or in none.
//!
//! Layout (`format/segment.md`, "Transaction log"): a 16-byte header (magic
//! `RHEOTXN\0`, version u16, reserved u16, CRC32 of the first 12 bytes), then
//! 16-byte entries (txn id u64, reserved u32, CRC32 of the first 12 bytes).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::engine::error::{DecodeError, corrupt, io_err, sync_err};
use crate::engine::segment::format::{FORMAT_VERSION, get_u16, get_u32, get_u64};
use crate::engine::vfs::{Vfs, VfsFile};
use crate::error::Result;

/// Magic of a transaction log.
pub const TXN_MAGIC: [u8; 8] = *b"RHEOTXN\0";
/// Size of the header and of each entry.
pub const TXN_RECORD_LEN: usize = 16;
/// Rewrite the file once it grows past this size.
const COMPACT_BYTES: u64 = 64 << 10;
/// Zero-filled room kept ahead of the entries (see [`TxnLog::prepare`]).
const ZEROED_AHEAD: u64 = 4 << 10;

fn header() -> [u8; TXN_RECORD_LEN] {
    let mut b = [0u8; TXN_RECORD_LEN];
    b[..8].copy_from_slice(&TXN_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32fast::hash(&b[..12]);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Encodes one committed transaction id.
pub fn encode_entry(txn: u64) -> [u8; TXN_RECORD_LEN] {
    let mut b = [0u8; TXN_RECORD_LEN];
    b[..8].copy_from_slice(&txn.to_le_bytes());
    let crc = crc32fast::hash(&b[..12]);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The last committed transaction id in a transaction log's bytes (0 for
/// none), and the length of its valid prefix (0 when the header is bad).
pub fn decode(b: &[u8]) -> (u64, u64) {
    if check_header(b).is_err() {
        return (0, 0);
    }
    let mut last = 0;
    let mut valid = TXN_RECORD_LEN as u64;
    for e in b[TXN_RECORD_LEN..].chunks_exact(TXN_RECORD_LEN) {
        let txn = get_u64(e, 0);
        if crc32fast::hash(&e[..12]) != get_u32(e, 12) || txn <= last {
            break;
        }
        last = txn;
        valid += TXN_RECORD_LEN as u64;
    }
    (last, valid)
}

/// Checks the 16-byte header: magic, then version, then checksum.
pub fn check_header(b: &[u8]) -> Result<(), DecodeError> {
    if b.len() < TXN_RECORD_LEN || b[..8] != TXN_MAGIC {
        return Err(DecodeError::NotThisKind { kind: "transaction log" });
    }
    let version = get_u16(b, 8);
    if version != FORMAT_VERSION {
        // Corrupt, not UnsupportedVersion (format/README.md): this file is
        // only ever written by the build that wrote its stream's segments,
        // whose own versions are checked first.
        return Err(DecodeError::invalid(format!(
            "transaction log version {version} is not supported (this build reads {FORMAT_VERSION})"
        )));
    }
    if crc32fast::hash(&b[..12]) != get_u32(b, 12) {
        return Err(DecodeError::Checksum { what: "transaction log header" });
    }
    Ok(())
}

#[derive(Debug)]
struct TxnState {
    file: Arc<dyn VfsFile>,
    len: u64,
    /// Zero-filled up to here (entries are written into this space).
    zeroed_to: u64,
    /// The largest id written (durable or not).
    committed: u64,
    /// The largest id known durable.
    synced: u64,
}

/// A stream's transaction log.
#[derive(Debug)]
pub struct TxnLog {
    vfs: Arc<dyn Vfs>,
    path: String,
    dir: String,
    state: Mutex<TxnState>,
}

impl crate::engine::commit::TxnRecord for TxnLog {
    fn commit(&self, txn: u64) -> Result<()> {
        TxnLog::commit(self, txn, true)
    }
}

impl TxnLog {
    /// Opens (creating when missing) the log at `dir/txn`.
    pub fn open(vfs: Arc<dyn Vfs>, dir: &str) -> Result<Self> {
        let path = format!("{dir}/txn");
        let file = vfs.open(&path, true).map_err(|e| io_err(&*vfs, &path, "open", e))?;
        let len = file.len().map_err(|e| io_err(&*vfs, &path, "stat", e))?;
        let mut buf = vec![0u8; usize::try_from(len.min(COMPACT_BYTES * 2)).unwrap_or(0)];
        let n = file.read_at(&mut buf, 0).map_err(|e| io_err(&*vfs, &path, "read", e))?;
        if len > COMPACT_BYTES * 2 {
            return Err(corrupt(&*vfs, &path, 0, format!("transaction log of {len} bytes is too large")));
        }
        if n > 0
            && let Err(reason) = check_header(&buf[..n])
        {
            // Created only by an atomic rename, so a bad header is damage,
            // not a torn write: refuse rather than forget committed batches.
            return Err(corrupt(&*vfs, &path, 0, reason));
        }
        let (committed, valid) = decode(&buf[..n]);
        let state = TxnState { file, len: valid, zeroed_to: len.max(valid), committed, synced: committed };
        let log = TxnLog { vfs, path, dir: dir.to_owned(), state: Mutex::new(state) };
        if valid == 0 || valid != len {
            // New, or with a torn last entry: rewrite it to the committed state.
            let committed = log.state.lock().committed;
            log.rewrite(&mut log.state.lock(), committed)?;
        }
        Ok(log)
    }

    /// The last committed transaction id.
    pub fn committed(&self) -> u64 {
        self.state.lock().committed
    }

    /// Rewrites the file with the committed id alone. Nothing changes on
    /// failure (the old file stays in place).
    fn rewrite(&self, s: &mut TxnState, committed: u64) -> Result<()> {
        let tmp = format!("{}.tmp", self.path);
        let vfs = &*self.vfs;
        let f = vfs.open(&tmp, true).map_err(|e| io_err(vfs, &tmp, "create", e))?;
        let mut bytes = header().to_vec();
        if committed > 0 {
            bytes.extend_from_slice(&encode_entry(committed));
        }
        f.set_len(0).map_err(|e| io_err(vfs, &tmp, "truncate", e))?;
        f.write_all_at(&bytes, 0).map_err(|e| io_err(vfs, &tmp, "write", e))?;
        f.sync_data().map_err(|e| sync_err(vfs, &tmp, e))?;
        vfs.rename(&tmp, &self.path).map_err(|e| io_err(vfs, &self.path, "rename", e))?;
        vfs.sync_dir(&self.dir).map_err(|e| sync_err(vfs, &self.dir, e))?;
        s.file = f;
        s.len = bytes.len() as u64;
        s.zeroed_to = s.len;
        s.committed = committed;
        s.synced = committed;
        Ok(())
    }

    /// Makes the next [`TxnLog::commit`] unable to fail for want of space:
    /// compacts a long file, and keeps zero-filled room ahead of the last
    /// entry (zeros read as the end of the entries). Called by an append
    /// before it writes anything, so that a full disk fails it cleanly.
    pub fn prepare(&self) -> Result<()> {
        let mut s = self.state.lock();
        if s.len >= COMPACT_BYTES {
            let committed = s.committed;
            self.rewrite(&mut s, committed)?;
        }
        // Two entries: a commit round in progress and the next one.
        if s.len + 2 * TXN_RECORD_LEN as u64 > s.zeroed_to {
            let (from, to) = (s.zeroed_to.max(s.len), s.len + ZEROED_AHEAD);
            let zeros = vec![0u8; usize::try_from(to - from).unwrap_or(0)];
            s.file.write_all_at(&zeros, from).map_err(|e| io_err(&*self.vfs, &self.path, "reserve space in", e))?;
            s.zeroed_to = to;
        }
        Ok(())
    }

    /// Records `txn` as committed (if it is not yet); makes every recorded
    /// id durable when `sync`. A failed write changes nothing.
    pub fn commit(&self, txn: u64, sync: bool) -> Result<()> {
        let mut s = self.state.lock();
        let vfs = &*self.vfs;
        if txn > s.committed {
            // Appends compact in `prepare`; this is for callers that don't.
            if s.len >= COMPACT_BYTES + ZEROED_AHEAD {
                return self.rewrite(&mut s, txn);
            }
            s.file.write_all_at(&encode_entry(txn), s.len).map_err(|e| io_err(vfs, &self.path, "write", e))?;
            s.len += TXN_RECORD_LEN as u64;
            s.zeroed_to = s.zeroed_to.max(s.len);
            s.committed = txn;
        }
        if sync && s.synced < s.committed {
            s.file.sync_data().map_err(|e| sync_err(vfs, &self.path, e))?;
            s.synced = s.committed;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::vfs::MemVfs;

    #[test]
    fn committed_ids_survive_a_crash_only_when_synced() {
        let mem = MemVfs::new();
        mem.create_dir_all("s").expect("mkdir");
        mem.sync_dir("").expect("sync");
        let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
        let log = TxnLog::open(vfs.clone(), "s").expect("open");
        log.commit(1, true).expect("commit");
        log.commit(2, false).expect("commit unsynced");
        mem.crash();
        assert_eq!(TxnLog::open(vfs, "s").expect("reopen").committed(), 1);
    }

    #[test]
    fn compaction_keeps_the_last_id() {
        let vfs: Arc<dyn Vfs> = Arc::new(MemVfs::new());
        let log = TxnLog::open(vfs.clone(), "").expect("open");
        for t in 1..=10_000 {
            log.commit(t, false).expect("commit");
        }
        assert_eq!(TxnLog::open(vfs, "").expect("reopen").committed(), 10_000);
    }

    #[test]
    fn an_unsynced_id_is_synced_by_a_later_commit_of_the_same_id() {
        let mem = MemVfs::new();
        let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
        let log = TxnLog::open(vfs.clone(), "").expect("open");
        log.commit(4, false).expect("record");
        log.commit(4, true).expect("sync");
        mem.crash();
        assert_eq!(TxnLog::open(vfs, "").expect("reopen").committed(), 4);
    }

    #[test]
    fn a_damaged_header_is_corruption_not_an_empty_log() {
        let mem = MemVfs::new();
        let vfs: Arc<dyn Vfs> = Arc::new(mem.clone());
        TxnLog::open(vfs.clone(), "").expect("open").commit(2, true).expect("commit");
        let mut bytes = mem.read_file("/txn").expect("file");
        bytes[3] ^= 1;
        mem.write_file("/txn", &bytes).expect("write");
        assert!(matches!(TxnLog::open(vfs, ""), Err(crate::error::Error::Corrupt { offset: 0, .. })));
    }

    #[test]
    fn decode_stops_at_a_torn_entry() {
        let mut b = header().to_vec();
        b.extend_from_slice(&encode_entry(5));
        b.extend_from_slice(&encode_entry(9)[..7]);
        assert_eq!(decode(&b), (5, 32));
        assert_eq!(decode(b"garbage"), (0, 0));
    }
}
