//! Ids made without a system call: event ids (time-ordered UUIDv7) and
//! lease ids (128-bit fencing tokens in UUIDv4 layout).
//!
//! `Uuid::now_v7` and `Uuid::new_v4` read the operating system's random
//! source for every id (a `getrandom` system call): measured, that was
//! 29 % of the calling thread's CPU in `append_batch(1000)` and a tenth of
//! a fetch. Both generators here read it once per process, for a random
//! part that tells processes apart, and count the rest.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// 64 random bits, drawn once per process.
fn process_random() -> u64 {
    static RANDOM: OnceLock<u64> = OnceLock::new();
    *RANDOM.get_or_init(|| (uuid::Uuid::new_v4().as_u128() >> 64) as u64)
}

/// Milliseconds since the Unix epoch (0 before it; saturated far after).
fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Bits of the per-millisecond counter of event ids.
const COUNTER_BITS: u32 = 16;

/// A new event id: a UUIDv7 (RFC 9562) whose 48-bit Unix-millisecond
/// timestamp is followed by a 16-bit counter (12 bits in `rand_a`, the top
/// 4 of `rand_b`) and 58 bits random per process. Ids of one process are
/// strictly increasing, also when the clock steps back (the last
/// millisecond is kept and counted on) or more than 65,536 ids fall in one
/// millisecond (the timestamp is borrowed from the next one, as RFC 9562
/// allows); ids of two processes differ but with probability 2^-58 per
/// pair of ids made in the same millisecond with the same count.
pub(crate) fn new_event_id() -> uuid::Uuid {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let now_ms = unix_ms() & ((1 << 48) - 1);
    let mut cur = STATE.load(Ordering::Relaxed);
    let next = loop {
        let next = if now_ms > cur >> COUNTER_BITS { now_ms << COUNTER_BITS } else { cur.wrapping_add(1) };
        match STATE.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break next,
            Err(seen) => cur = seen,
        }
    };
    let ms = next >> COUNTER_BITS;
    let counter = next & ((1 << COUNTER_BITS) - 1);
    // unix_ts_ms (48) | ver 7 (4) | counter high 12 | var 0b10 (2) | counter low 4 | random 58
    let high = (ms << 16) | 0x7000 | (counter >> 4);
    let low = (0b10 << 62) | ((counter & 0xf) << 58) | (process_random() >> 6);
    uuid::Uuid::from_u64_pair(high, low)
}

/// A new lease id: a UUID (version 4 layout) whose upper half is random per
/// process and whose lower half counts, so ids never repeat within a
/// process nor, but with negligible probability (2^-58 per pair of
/// processes), across restarts.
pub(crate) fn new_lease_id() -> u128 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // Version 4 in bits 76..80 of the UUID (bits 12..16 of this half).
    let prefix = (process_random() & !0xf000) | 0x4000;
    // The variant (0b10) in the top bits of the lower half.
    let low = (COUNTER.fetch_add(1, Ordering::Relaxed) & (u64::MAX >> 2)) | (1 << 63);
    (u128::from(prefix) << 64) | u128::from(low)
}

/// The fencing token of one claim: 128 bits, unique per claim, written in
/// UUID form (`Display`, `FromStr`, serde). Copying and comparing one costs
/// nothing; settles compare the bits, never text.
///
/// ```
/// use rheo::LeaseId;
/// let id: LeaseId = "0193a5b2-7c1d-4e8f-9a0b-1c2d3e4f5a6b".parse()?;
/// assert_eq!(id.to_string(), "0193a5b2-7c1d-4e8f-9a0b-1c2d3e4f5a6b");
/// assert_eq!(LeaseId::from_u128(id.as_u128()), id);
/// # Ok::<(), rheo::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(u128);

impl LeaseId {
    /// The id with these bits.
    pub const fn from_u128(bits: u128) -> Self {
        LeaseId(bits)
    }
    /// Its bits.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut buf = uuid::Uuid::encode_buffer();
        f.write_str(uuid::Uuid::from_u128(self.0).hyphenated().encode_lower(&mut buf))
    }
}

impl std::fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

impl Serialize for LeaseId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = uuid::Uuid::encode_buffer();
        s.serialize_str(uuid::Uuid::from_u128(self.0).hyphenated().encode_lower(&mut buf))
    }
}

impl<'de> Deserialize<'de> for LeaseId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_are_increasing_version_7_uuids_with_the_current_time() {
        let before = unix_ms();
        let ids: Vec<uuid::Uuid> = (0..200_000).map(|_| new_event_id()).collect();
        let after = unix_ms();
        for w in ids.windows(2) {
            assert!(w[0] < w[1], "{} then {}", w[0], w[1]);
        }
        for id in [ids[0], ids[ids.len() - 1]] {
            assert_eq!(id.get_version_num(), 7, "{id}");
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122, "{id}");
            let (secs, nanos) = id.get_timestamp().expect("a v7 timestamp").to_unix();
            let ms = secs * 1000 + u64::from(nanos) / 1_000_000;
            // 200,000 ids may borrow up to 3 milliseconds past the clock.
            assert!(ms >= before && ms <= after + 4, "{ms} outside {before}..={after}");
        }
    }

    #[test]
    fn event_ids_stay_unique_across_threads() {
        let per = 20_000;
        let handles: Vec<_> =
            (0..4).map(|_| std::thread::spawn(move || (0..per).map(|_| new_event_id()).collect::<Vec<_>>())).collect();
        let mut all: Vec<uuid::Uuid> = handles.into_iter().flat_map(|h| h.join().expect("thread")).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4 * per);
    }

    #[test]
    fn lease_ids_are_distinct_version_4_uuids() {
        let ids: Vec<uuid::Uuid> = (0..1000).map(|_| uuid::Uuid::from_u128(new_lease_id())).collect();
        for id in &ids {
            assert_eq!(id.get_version_num(), 4, "{id}");
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122, "{id}");
        }
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
    }
}
