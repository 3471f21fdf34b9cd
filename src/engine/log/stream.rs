//! A stream's log: its partitions, its transaction log, and the append path.

use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::manifest::StreamEntry;
use super::partition::{Location, Partition, StoredRecord, Truncation};
use super::txn::TxnLog;
use crate::engine::commit::{Committer, Deferred, Job, Poison, Ticket, TxnRecord};
use crate::engine::options::{Durability, EngineOptions};
use crate::engine::segment::format::{FLAG_END, FLAG_MULTI};
use crate::engine::segment::record::{DocRef, RecordHeader, encode_record};
use crate::engine::vfs::Vfs;
use crate::error::{Error, Result};
use crate::model::append::NewEvent;
use crate::model::event::Event;

/// An event routed to a partition with its final timestamp.
#[derive(Debug)]
pub struct Routed<'a> {
    /// The partition.
    pub partition: u32,
    /// The timestamp (ms).
    pub ts: i64,
    /// The event.
    pub event: &'a NewEvent,
}

/// Where an append put each of its events: (partition, sequence), in the
/// order given; inline for a single event.
pub type Assigned = SmallVec<[(u32, u64); 1]>;

/// One entry per partition an append touches: inline for the usual one to
/// four, so a single event's append allocates none of these lists.
type PerPartition<T> = SmallVec<[T; 4]>;

/// Room for the records of `items`: their charged size plus each record's
/// frame and header, so that encoding them does not grow the buffer (an
/// estimate: the metadata is counted as JSON, stored as MessagePack).
fn room_for(items: &[Routed<'_>]) -> usize {
    use crate::engine::segment::record::RECORD_OVERHEAD;
    items.iter().map(|r| r.event.encoded_len() + RECORD_OVERHEAD).sum()
}

thread_local! {
    /// The record buffer an append encodes into ([`RecordBuffer`]).
    static RECORDS: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest record buffer a thread keeps between appends.
const RECORDS_KEEP: usize = 256 * 1024;

/// This thread's record buffer, taken for one append and given back when
/// dropped (emptied; unless huge), so that an append does not allocate
/// one. A nested take (none today) would get an empty buffer of its own.
struct RecordBuffer(Vec<u8>);

impl RecordBuffer {
    fn take() -> RecordBuffer {
        let mut buf = RECORDS.try_with(std::cell::Cell::take).unwrap_or_default();
        buf.clear();
        RecordBuffer(buf)
    }
}

impl std::ops::Deref for RecordBuffer {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl std::ops::DerefMut for RecordBuffer {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl Drop for RecordBuffer {
    fn drop(&mut self) {
        if self.0.capacity() <= RECORDS_KEEP {
            let buf = std::mem::take(&mut self.0);
            // A thread being torn down keeps nothing.
            let _ = RECORDS.try_with(|cell| cell.set(buf));
        }
    }
}

/// A stream's partitions and write path.
#[derive(Debug)]
pub struct StreamLog {
    /// The manifest id.
    pub id: u64,
    /// The user-given name.
    pub name: Arc<str>,
    dir: String,
    partitions: Vec<Arc<Partition>>,
    txn: Arc<TxnLog>,
    /// Serializes appends; holds the next transaction id.
    write: Mutex<u64>,
}

/// The directory of a stream.
pub fn stream_dir(id: u64) -> String {
    format!("streams/{id:016x}")
}

impl StreamLog {
    /// Opens (recovering) or creates a stream's files.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        opts: &EngineOptions,
        entry: &StreamEntry,
        now_ms: i64,
        truncations: &mut Vec<(String, Truncation)>,
    ) -> Result<StreamLog> {
        let StreamEntry { id, ref name, partition_count, .. } = *entry;
        let dir = stream_dir(id);
        vfs.create_dir_all(&dir).map_err(|e| crate::engine::error::io_err(&*vfs, &dir, "create", e))?;
        let txn = Arc::new(TxnLog::open(vfs.clone(), &dir)?);
        let committed = txn.committed();
        let partitions = (0..partition_count)
            .map(|p| {
                let at = Location { dir: format!("{dir}/{p:05}"), stream_id: id, partition: p };
                Partition::open(vfs.clone(), opts, at, now_ms, committed, truncations).map(Arc::new)
            })
            .collect::<Result<Vec<_>>>()?;
        vfs.sync_dir(&dir).map_err(|e| crate::engine::error::sync_err(&*vfs, &dir, e))?;
        let Some(next_txn) = committed.checked_add(1) else {
            let file = vfs.describe(&format!("{dir}/txn"));
            return Err(Error::Corrupt {
                file,
                offset: 0,
                reason: "the last transaction id is the largest possible".into(),
                source: None,
            });
        };
        Ok(StreamLog { id, name: Arc::from(name.as_str()), dir, partitions, txn, write: Mutex::new(next_txn) })
    }

    /// The stream's directory.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The partition count.
    pub fn partition_count(&self) -> u32 {
        u32::try_from(self.partitions.len()).unwrap_or(u32::MAX)
    }

    /// A partition (callers check the range).
    pub fn partition(&self, p: u32) -> Result<&Arc<Partition>> {
        self.partitions.get(p as usize).ok_or_else(|| Error::InvalidPartition {
            stream: self.name.to_string(),
            partition: p,
            partition_count: self.partition_count(),
        })
    }

    /// The last visible sequence of a partition (0 when empty).
    pub fn high_watermark(&self, p: u32) -> u64 {
        self.partitions.get(p as usize).map_or(0, |part| part.visible())
    }

    /// The log start of a partition: its first kept sequence (see
    /// [`Partition::log_start`]; 1 for a partition out of range).
    pub fn log_start(&self, p: u32) -> u64 {
        self.partitions.get(p as usize).map_or(1, |part| part.log_start())
    }

    /// The first sequence of a partition with a timestamp at or after `t`
    /// (ms), through the time index.
    pub fn seek_time(&self, p: u32, t: i64) -> Result<Option<u64>> {
        self.partition(p)?.seek_time(t)
    }

    /// Reads records of a partition after a sequence.
    pub fn read(&self, p: u32, after: u64, limit: usize) -> Result<Vec<StoredRecord>> {
        self.partition(p)?.read(after, limit)
    }

    /// As [`StreamLog::read`], as events of stream `name`.
    pub fn read_events(&self, name: &Arc<str>, p: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.partition(p)?.read_events(after, limit, name, p)
    }

    /// Appends events atomically. Returns the assigned (partition, sequence)
    /// of each, in input order, and the ticket that resolves when durable.
    pub fn append(
        &self,
        items: &[Routed<'_>],
        opts: &EngineOptions,
        committer: &Committer,
        poison: &Poison,
    ) -> Result<(Assigned, Ticket)> {
        let mut next_txn = self.write.lock();
        poison.check(&self.name)?;
        let mut touched: PerPartition<u32> = items.iter().map(|r| r.partition).collect();
        touched.sort_unstable();
        touched.dedup();
        let multi = touched.len() > 1;
        let txn = if multi { *next_txn } else { 0 };
        if multi {
            // Room for the commit entry, before anything is written.
            self.txn.prepare().map_err(|e| poison.absorb(e))?;
        }
        let mut writers: PerPartition<(u32, Arc<Partition>)> = SmallVec::with_capacity(touched.len());
        for &p in &touched {
            writers.push((p, self.partition(p)?.clone()));
        }
        let mut guards: PerPartition<_> = writers.iter().map(|(_, part)| part.lock_writer()).collect();

        // Encode each partition's records with their sequences, one
        // partition after the other, into this thread's record buffer
        // (sized for the records, so encoding does not grow it).
        let mut buf = RecordBuffer::take();
        buf.reserve(room_for(items));
        // Each partition's records: where in `buf`, how many, their largest timestamp.
        let mut bufs: PerPartition<(std::ops::Range<usize>, u64, i64)> = SmallVec::with_capacity(touched.len());
        let mut assigned: Assigned = smallvec::smallvec![(0u32, 0u64); items.len()];
        for (slot, &p) in touched.iter().enumerate() {
            let start = buf.len();
            let records = items.iter().filter(|r| r.partition == p).count() as u64;
            let mut max_ts = i64::MIN;
            let mut count = 0;
            let first_seq = guards[slot].next_seq;
            let last_seq = first_seq + records - 1;
            let multi_flag = if multi { FLAG_MULTI } else { 0 };
            for (seq, (i, r)) in (first_seq..).zip(items.iter().enumerate().filter(|(_, r)| r.partition == p)) {
                let e = r.event;
                // The partition's last record of the append ends it.
                let flags = multi_flag | if seq == last_seq { FLAG_END } else { 0 };
                let h = RecordHeader { seq, ts: r.ts, flags, txn };
                let payload = e.payload.to_msgpack()?;
                let doc = DocRef(&e.id, e.key.as_deref(), e.event_type.as_deref(), &e.metadata, &payload);
                encode_record(&mut buf, &h, &doc).map_err(|reason| Error::invalid("event", reason))?;
                assigned[i] = (p, seq);
                max_ts = max_ts.max(r.ts);
                count += 1;
            }
            bufs.push((start..buf.len(), count, max_ts));
        }

        // Segments seal only with every multi-partition batch in them committed.
        let rolls: PerPartition<usize> =
            (0..touched.len()).filter(|&i| writers[i].1.needs_roll(&guards[i], bufs[i].0.len() as u64)).collect();
        if !rolls.is_empty() {
            self.commit_barrier(*next_txn - 1, &touched, &mut guards, poison)?;
            for &i in &rolls {
                writers[i].1.roll(&mut guards[i], now_ms()).map_err(|e| poison.absorb(e))?;
            }
        }

        // Under Sync, into zero-filled space, the commit thread writes what
        // its round collected, one write per partition. Otherwise records
        // go to the OS at once, here, where a failed write (a full disk)
        // can still be undone and fail the append cleanly.
        let defer = matches!(opts.durability, Durability::Sync) && opts.preallocate_bytes > 0;
        // Write every partition; on failure undo the ones already written.
        let mut files: PerPartition<_> = SmallVec::with_capacity(touched.len());
        let marks: PerPartition<_> = guards.iter().map(|g| Partition::mark(g)).collect();
        for i in 0..touched.len() {
            let (range, count, max_ts) = &bufs[i];
            match writers[i].1.write(&mut guards[i], &buf[range.clone()], *count, *max_ts, txn, defer) {
                Ok(f) => files.push(f),
                Err(e) => {
                    // Never reuse the id of a batch that may have left bytes behind.
                    if multi {
                        *next_txn += 1;
                    }
                    for j in 0..i {
                        if let Err(undo) = writers[j].1.rollback(&mut guards[j], marks[j]) {
                            poison.set(undo.to_string());
                        }
                    }
                    return Err(poison.absorb(e));
                }
            }
        }
        if multi {
            *next_txn += 1;
        }
        let publish: PerPartition<(Arc<dyn Deferred>, u64)> = writers
            .iter()
            .zip(&guards)
            .map(|((_, part), g)| (part.clone() as Arc<dyn Deferred>, g.next_seq - 1))
            .collect();
        let ticket = match opts.durability {
            Durability::Sync => {
                let txn = multi.then(|| (self.txn.clone() as Arc<dyn TxnRecord>, txn));
                let (files, flush) = if defer {
                    (SmallVec::new(), writers.iter().map(|(_, part)| part.clone() as Arc<dyn Deferred>).collect())
                } else {
                    (files, SmallVec::new())
                };
                committer.submit(Job { files, flush, txn, publish })
            }
            Durability::Batched { .. } | Durability::None => {
                if multi && let Err(e) = self.txn.commit(txn, false) {
                    // The records are written but not visible: take them
                    // back (their transaction id is used up).
                    for (j, (_, part)) in writers.iter().enumerate() {
                        if let Err(undo) = part.rollback(&mut guards[j], marks[j]) {
                            poison.set(undo.to_string());
                        }
                    }
                    return Err(poison.absorb(e));
                }
                for (part, seq) in &publish {
                    part.publish(*seq);
                }
                if matches!(opts.durability, Durability::Batched { .. }) {
                    let txn_job = multi.then(|| (self.txn.clone() as Arc<dyn TxnRecord>, txn));
                    let _ =
                        committer.submit(Job { files, flush: SmallVec::new(), txn: txn_job, publish: SmallVec::new() });
                }
                Ticket::ready()
            }
        };
        drop(guards);
        drop(next_txn);
        Ok((assigned, ticket))
    }

    /// Makes every batch written so far durable and committed: syncs the
    /// active segment of every partition, then records `last_txn`.
    fn commit_barrier(
        &self,
        last_txn: u64,
        held: &[u32],
        guards: &mut [parking_lot::MutexGuard<'_, super::partition::Writer>],
        poison: &Poison,
    ) -> Result<()> {
        for (i, part) in self.partitions.iter().enumerate() {
            let file = match held.iter().position(|&p| p as usize == i) {
                Some(slot) => part.flush_locked(&mut guards[slot]),
                None => part.flush(),
            }
            .inspect_err(|e| poison.set(e.to_string()))?;
            if let Err(e) = file.sync_data() {
                let reason = format!("fdatasync before a segment roll failed: {e}");
                poison.set(reason.clone());
                return Err(Error::Poisoned { scope: self.name.to_string(), reason, source: None });
            }
        }
        if last_txn > 0 {
            self.txn.commit(last_txn, true).inspect_err(|e| poison.set(e.to_string()))?;
        }
        Ok(())
    }
}

/// The wall clock in ms, for segment headers (informational only).
pub(crate) fn now_ms() -> i64 {
    crate::model::time::Timestamp::now().as_millis()
}
