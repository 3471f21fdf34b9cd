//! The in-memory index of a partition's active segment: per field, a map
//! from term to the sequences holding it, caught up as records are appended.

use super::*;

/// A fast hasher for term keys, a word at a time, started from a random
/// per-process seed ([`hash_seed`]).
pub(super) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(w) ^ (rest.len() as u64) << 56).wrapping_mul(K);
        }
        // Spread the high bits (hashbrown uses the top 7 for its tags).
        self.0 = h ^ (h >> 29);
    }
}

/// The record offsets (from the segment's base) holding one term: most
/// terms of a unique field (ids) hold one, without an allocation.
#[derive(Debug)]
pub(super) enum SeqList {
    One(u32),
    Many(Vec<u32>),
}

impl SeqList {
    /// Adds the next record (ascending; a repeat is ignored).
    pub(super) fn push(&mut self, off: u32) {
        match self {
            SeqList::One(o) if *o != off => *self = SeqList::Many(vec![*o, off]),
            SeqList::One(_) => {}
            SeqList::Many(v) => {
                if v.last() != Some(&off) {
                    v.push(off);
                }
            }
        }
    }

    pub(super) fn as_slice(&self) -> &[u32] {
        match self {
            SeqList::One(o) => std::slice::from_ref(o),
            SeqList::Many(v) => v,
        }
    }
}

/// A hasher for keys that already are hashes.
#[derive(Default)]
pub(super) struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The seed of every term hash in this process, random: producers choose
/// ids and values, and must not be able to make keys collide on purpose.
pub(super) fn hash_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64) | 1
    })
}

pub(super) fn hash_key(key: &[u8]) -> u64 {
    let mut h = WordHasher(hash_seed());
    h.write(key);
    h.finish()
}

/// One field's terms in insertion order (so a field whose values grow with
/// the sequence, like time-ordered ids, is nearly sorted already), their
/// keys in one arena, found by hash.
#[derive(Debug, Default)]
pub(super) struct TermMap {
    pub(super) arena: Vec<u8>,
    /// (key start in the arena, key length, records).
    pub(super) terms: Vec<(usize, usize, SeqList)>,
    /// Key hash -> the first term with that hash; `chain` links the others.
    pub(super) by_hash: HashMap<u64, u32, BuildHasherDefault<Prehashed>>,
    pub(super) chain: Vec<u32>,
}

pub(super) const NO_TERM: u32 = u32::MAX;

impl TermMap {
    pub(super) fn with_capacity(terms: usize) -> TermMap {
        TermMap {
            arena: Vec::with_capacity(terms * 40),
            terms: Vec::with_capacity(terms),
            by_hash: HashMap::with_capacity_and_hasher(terms, Default::default()),
            chain: Vec::with_capacity(terms),
        }
    }

    pub(super) fn key(&self, i: usize) -> &[u8] {
        let (start, len, _) = self.terms[i];
        &self.arena[start..start + len]
    }

    pub(super) fn find(&self, key: &[u8], h: u64) -> Option<usize> {
        let mut i = *self.by_hash.get(&h)?;
        while i != NO_TERM {
            let idx = i as usize;
            if self.key(idx) == key {
                return Some(idx);
            }
            i = self.chain[idx];
        }
        None
    }

    pub(super) fn get(&self, key: &[u8]) -> Option<&SeqList> {
        self.find(key, hash_key(key)).map(|i| &self.terms[i].2)
    }

    /// Adds record `off` to the term `key`.
    pub(super) fn add(&mut self, key: &[u8], off: u32) {
        let h = hash_key(key);
        if let Some(i) = self.find(key, h) {
            self.terms[i].2.push(off);
            return;
        }
        let Ok(idx) = u32::try_from(self.terms.len()) else { return };
        if idx == NO_TERM {
            return;
        }
        let start = self.arena.len();
        self.arena.extend_from_slice(key);
        self.terms.push((start, key.len(), SeqList::One(off)));
        let prev = self.by_hash.insert(h, idx).unwrap_or(NO_TERM);
        self.chain.push(prev);
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &SeqList)> {
        self.terms.iter().map(|(start, len, list)| (&self.arena[*start..*start + *len], list))
    }
}

/// An in-memory index of one segment's records `base..=upto`, per field.
#[derive(Debug)]
pub struct MemIndex {
    pub(super) base: u64,
    pub(super) upto: u64,
    pub(super) fields: Arc<FieldSet>,
    pub(super) maps: Vec<TermMap>,
    /// The byte offset of each record `base + i` (emptied for good if one
    /// does not fit u32: such a segment is read through its sparse index).
    pub(super) offsets: Vec<u32>,
    pub(super) offsets_ok: bool,
}

impl MemIndex {
    /// An empty index of the segment starting at `base`, sized for about
    /// `records` records (the id field gets a term per record).
    pub(super) fn new(base: u64, fields: Arc<FieldSet>, records: usize) -> MemIndex {
        let maps = fields.names.iter().map(|n| TermMap::with_capacity(if n == "id" { records } else { 16 })).collect();
        MemIndex { base, upto: base - 1, fields, maps, offsets: Vec::with_capacity(records), offsets_ok: true }
    }

    /// Indexes the visible records of its segment after `upto`, up to
    /// `until` (never past the segment's end).
    pub(super) fn extend(&mut self, part: &Partition, until: u64) -> Result<()> {
        if self.upto >= until {
            return Ok(());
        }
        let mut key = Vec::new();
        let base = self.base;
        part.scan_raw(self.upto, until, |off, h, doc, seg| {
            if seg.base_seq != base || h.seq != self.upto + 1 {
                return Ok(false);
            }
            self.add(h.seq, off, &doc, &mut key);
            Ok(true)
        })
    }

    /// The byte offset of record `seq`, when known.
    pub(super) fn offset_of(&self, seq: u64) -> Option<u64> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.offsets.get(i).map(|&o| u64::from(o))
    }

    /// Indexes the record `seq` (the next one), at byte `offset`, from its
    /// raw document.
    pub(super) fn add(&mut self, seq: u64, offset: u64, doc: &[u8], key: &mut Vec<u8>) {
        self.upto = seq;
        match u32::try_from(offset) {
            Ok(o) if self.offsets_ok => self.offsets.push(o),
            _ => {
                self.offsets_ok = false;
                self.offsets = Vec::new();
            }
        }
        let Some(parts) = DocParts::split(doc) else { return };
        let Ok(off) = u32::try_from(seq - self.base) else { return };
        let maps = &mut self.maps;
        self.fields.extractor.extract(&parts, |i, v| {
            key.clear();
            scalar_key(&v, key);
            maps[i].add(key, off);
        });
    }

    pub(super) fn lookup(&self, field: &str, ranges: &[KeyRange], cap: u64) -> Option<Vec<u64>> {
        let i = self.fields.names.binary_search_by(|n| n.as_str().cmp(field)).ok()?;
        let map = &self.maps[i];
        let mut out: Vec<u64> = Vec::new();
        let mut add = |list: &SeqList| -> bool {
            out.extend(list.as_slice().iter().map(|&o| self.base + u64::from(o)));
            out.len() as u64 <= cap
        };
        for r in ranges {
            if r.is_point() {
                if let std::ops::Bound::Included(k) = &r.lo
                    && let Some(list) = map.get(k.as_slice())
                    && !add(list)
                {
                    return None;
                }
            } else {
                for (k, list) in map.iter() {
                    if r.contains(k) && !add(list) {
                        return None;
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// The index file of this (complete, sealed) segment.
    pub(super) fn encode(&self, header: &SixHeader) -> Vec<u8> {
        // Fields are in name order (= ordinal order); each field's terms sorted.
        let per_field: Vec<Vec<(&[u8], &[u32])>> = self
            .maps
            .iter()
            .map(|map| {
                let mut terms: Vec<(&[u8], &[u32])> = map.iter().map(|(k, l)| (k, l.as_slice())).collect();
                // Stable sort: runs already in order (insertion order) are cheap.
                terms.sort_by(|a, b| a.0.cmp(b.0));
                terms
            })
            .collect();
        let terms = per_field.iter().enumerate().flat_map(|(i, terms)| {
            let ord = u16::try_from(i).unwrap_or(u16::MAX);
            terms.iter().map(move |&(k, l)| (ord, k, l))
        });
        file::encode(header, &self.fields.names, terms, &self.offsets)
    }
}
