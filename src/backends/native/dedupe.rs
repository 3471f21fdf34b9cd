//! The native backend's dedupe window: the ids given by producers to
//! recent appends of one stream, so that an append retried with the same id
//! writes nothing and answers the original.
//!
//! Each id is kept as a 64-bit hash (seeded per window) with its event's
//! position and the second it was appended: 32 bytes per id, 40–66 with
//! the tables' spare capacity (measured in the tests below), for the
//! window's duration (`EngineOptions::dedupe_window`, default 2 minutes)
//! and at most [`MAX_IDS`] ids per stream (the oldest go first). Only ids a
//! producer gave are kept; a generated id is new by construction.
//!
//! A hash is not an id: before answering a duplicate, the backend reads
//! the stored record at the remembered position and compares ids, so two
//! ids with one hash (odds about n²/2⁶⁵ for n ids) never make an event
//! vanish; the later one is stored, and the window remembers it instead.
//!
//! Under load the cap is what bounds the window: at 70k appends with ids
//! per second, 2²⁰ ids are about 15 s, not 2 minutes.
//!
//! The window starts empty in each process and is filled, on a stream's
//! first append with a given id, from the stream's last records (at most
//! [`MAX_IDS`] in all, split between its partitions), each remembered as
//! if appended at that moment: an append retried after the writer
//! restarted is still recognised, whatever timestamp its event carries.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use crate::engine::stream::Stream;
use crate::error::Result;

/// The most ids one stream's window holds.
pub const MAX_IDS: usize = 1 << 20;

/// Where an id's event is (sequence 0: reserved by an append in flight,
/// see [`Window::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Its partition.
    pub partition: u32,
    /// Its sequence.
    pub sequence: u64,
    /// When it was appended (ms since the epoch).
    pub at_ms: i64,
}

/// What the table keeps per id: 16 bytes.
#[derive(Debug, Clone, Copy)]
struct Entry {
    sequence: u64,
    partition: u32,
    /// Seconds since the window's base.
    at_s: u32,
}

/// A hasher for keys that are already hashes.
#[derive(Debug, Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed here; fold anything else.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// One stream's window.
#[derive(Debug)]
pub struct Window {
    duration_ms: i64,
    /// The time (ms) that `Entry::at_s` counts from: a day before the
    /// window was made, so that loaded records fit.
    base_ms: i64,
    /// Seeded per window (foldhash: fast, and a hash is only a hint, see
    /// the module's docs).
    keys: foldhash::fast::RandomState,
    ids: HashMap<u64, Entry, BuildHasherDefault<Prehashed>>,
    /// Hashes in the order they were inserted, oldest first: what expires
    /// next (an entry's time is in `ids`).
    order: VecDeque<u64>,
    /// False until filled from the stream's recent records.
    pub loaded: bool,
}

impl Window {
    /// An empty window of this duration.
    pub fn new(duration: std::time::Duration, now_ms: i64) -> Self {
        Window {
            duration_ms: i64::try_from(duration.as_millis()).unwrap_or(i64::MAX),
            base_ms: now_ms.saturating_sub(86_400_000),
            keys: foldhash::fast::RandomState::default(),
            ids: HashMap::default(),
            order: VecDeque::new(),
            loaded: false,
        }
    }

    /// The key of an id (compute it once per call, then use the `_key`
    /// methods).
    pub fn key(&self, id: &str) -> u64 {
        self.keys.hash_one(id)
    }

    #[cfg(test)]
    fn hash(&self, id: &str) -> u64 {
        self.key(id)
    }

    fn seconds(&self, ms: i64) -> u32 {
        u32::try_from(ms.saturating_sub(self.base_ms).max(0) / 1000).unwrap_or(u32::MAX)
    }

    /// Drops what is older than the window at `now_ms` (to the second),
    /// and the oldest beyond [`MAX_IDS`].
    pub fn expire(&mut self, now_ms: i64) {
        let horizon = self.seconds(now_ms.saturating_sub(self.duration_ms));
        while let Some(&h) = self.order.front() {
            let at = self.ids.get(&h).map(|e| e.at_s);
            let over = self.order.len() > MAX_IDS;
            if at.is_some_and(|at| at >= horizon) && !over {
                // Still in the window (or an id inserted again since: it
                // expires with its later time, the ones behind it wait).
                break;
            }
            self.order.pop_front();
            // At the cap the oldest goes, unless an append is writing it.
            let reserved = self.ids.get(&h).is_some_and(|e| e.sequence == 0);
            if over && reserved {
                self.order.push_back(h);
            } else if over || at.is_some_and(|at| at < horizon) {
                self.ids.remove(&h);
            }
        }
    }

    /// Where the event with this id is, if it is in the window.
    #[cfg(test)]
    pub fn get(&self, id: &str) -> Option<Seen> {
        self.get_key(self.hash(id))
    }

    /// [`Window::get`] by key.
    pub fn get_key(&self, key: u64) -> Option<Seen> {
        self.ids.get(&key).map(|e| Seen {
            partition: e.partition,
            sequence: e.sequence,
            at_ms: self.base_ms + i64::from(e.at_s) * 1000,
        })
    }

    /// Reserves an id for an append about to be written: until
    /// [`Window::fill`] (or [`Window::release`]) another append of it sees
    /// it in flight and waits, so the window's lock need not be held while
    /// the events are encoded.
    pub fn reserve_key(&mut self, key: u64, at_ms: i64) {
        self.insert_key(key, Seen { partition: 0, sequence: 0, at_ms });
    }

    /// Gives a reserved id its event's position.
    pub fn fill_key(&mut self, key: u64, partition: u32, sequence: u64) {
        if let Some(e) = self.ids.get_mut(&key) {
            e.partition = partition;
            e.sequence = sequence;
        }
    }

    /// Drops a reservation whose append failed (nothing was written).
    pub fn release_key(&mut self, key: u64) {
        if self.ids.get(&key).is_some_and(|e| e.sequence == 0) {
            self.ids.remove(&key);
        }
    }

    /// Records an id (appended at `seen.at_ms`).
    #[cfg(test)]
    pub fn insert(&mut self, id: &str, seen: Seen) {
        self.insert_key(self.hash(id), seen);
    }

    /// [`Window::insert`] by key.
    pub fn insert_key(&mut self, h: u64, seen: Seen) {
        let entry = Entry { sequence: seen.sequence, partition: seen.partition, at_s: self.seconds(seen.at_ms) };
        self.ids.insert(h, entry);
        self.order.push_back(h);
        if self.order.len() > MAX_IDS {
            self.expire(i64::MIN);
        }
    }

    /// How many ids it holds.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Bytes it holds (its tables' capacity), for the docs' figure.
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        self.ids.capacity() * (std::mem::size_of::<(u64, Entry)>() + 1)
            + self.order.capacity() * std::mem::size_of::<u64>()
    }

    /// Fills the window from the stream's last records (at most
    /// [`MAX_IDS`], split between its partitions), each remembered as
    /// appended at `now_ms`: records carry the producer's timestamp, not
    /// the time they were appended, so time can't choose them. Blocking: it
    /// reads the log (about a second for 2²⁰ records).
    pub fn load(&mut self, stream: &Stream, now_ms: i64) -> Result<()> {
        let log = &stream.log;
        let partitions = log.partition_count().max(1);
        let per_partition = (MAX_IDS / partitions as usize) as u64;
        for p in 0..partitions {
            let end = log.high_watermark(p);
            let mut after = end.saturating_sub(per_partition);
            while after < end {
                let records = log.read(p, after, 1024)?;
                let Some(last) = records.last() else { break };
                after = last.header.seq;
                for r in records {
                    let key = self.key(r.doc.id());
                    self.insert_key(key, Seen { partition: p, sequence: r.header.seq, at_ms: now_ms });
                }
            }
        }
        self.loaded = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T0: i64 = 1_800_000_000_000;

    fn seen(sequence: u64, at_ms: i64) -> Seen {
        Seen { partition: 0, sequence, at_ms }
    }

    #[test]
    fn ids_expire_after_the_window() {
        let mut w = Window::new(Duration::from_secs(10), T0);
        w.insert("a", seen(1, T0));
        w.insert("b", seen(2, T0 + 5_000));
        w.expire(T0 + 9_000);
        assert_eq!(w.get("a"), Some(seen(1, T0)));
        w.expire(T0 + 11_000);
        assert_eq!(w.get("a"), None, "a is older than the window");
        assert_eq!(w.get("b"), Some(seen(2, T0 + 5_000)));
        w.expire(T0 + 60_000);
        assert_eq!(w.len(), 0);
        assert_eq!(w.get("never"), None);
    }

    #[test]
    fn a_reservation_is_filled_or_released() {
        let mut w = Window::new(Duration::from_secs(10), T0);
        let (a, b) = (w.key("a"), w.key("b"));
        w.reserve_key(a, T0);
        w.reserve_key(b, T0);
        assert_eq!(w.get("a").map(|s| s.sequence), Some(0), "in flight");
        w.fill_key(a, 2, 9);
        w.release_key(b);
        assert_eq!(w.get("a"), Some(Seen { partition: 2, sequence: 9, at_ms: T0 }));
        assert_eq!(w.get("b"), None);
        w.release_key(a);
        assert!(w.get("a").is_some(), "a filled id is not released");
    }

    #[test]
    fn a_reinserted_id_outlives_its_first_entry() {
        let mut w = Window::new(Duration::from_secs(10), T0);
        w.insert("a", seen(1, T0));
        w.insert("a", seen(7, T0 + 8_000));
        w.expire(T0 + 15_000);
        assert_eq!(w.get("a"), Some(seen(7, T0 + 8_000)), "the first entry's expiry must not drop the second");
        w.expire(T0 + 19_000);
        assert_eq!(w.get("a"), None);
    }

    #[test]
    fn the_window_holds_at_most_max_ids_in_at_most_66_bytes_each() {
        let mut w = Window::new(Duration::from_secs(3600), T0);
        for i in 0..(MAX_IDS as u64 + 10) {
            w.insert(&format!("id-{i}"), seen(i + 1, T0));
        }
        assert_eq!(w.len(), MAX_IDS);
        assert_eq!(w.get("id-0"), None, "the oldest went first");
        assert!(w.get(&format!("id-{}", MAX_IDS + 9)).is_some());
        let per_id = w.heap_bytes() as f64 / w.len() as f64;
        assert!(per_id <= 66.0, "{per_id:.1} bytes per id");
        println!("dedupe window: {per_id:.1} bytes per id at {} ids", w.len());
    }
}
