//! A set of `u64` kept as disjoint inclusive ranges: memory proportional to
//! the number of gaps, not the number of members.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent inclusive ranges, keyed by start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RangeSet {
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// True when `x` is a member.
    pub(crate) fn contains(&self, x: u64) -> bool {
        self.ranges.range(..=x).next_back().is_some_and(|(_, &end)| end >= x)
    }

    /// The end of the range holding `x`, when `x` is a member.
    pub(crate) fn end_of(&self, x: u64) -> Option<u64> {
        self.ranges.range(..=x).next_back().map(|(_, &end)| end).filter(|&end| end >= x)
    }

    /// Adds every member of `start..=end`.
    pub(crate) fn insert_range(&mut self, start: u64, end: u64) {
        if start > end {
            return;
        }
        let (mut lo, mut hi) = (start, end);
        // Merge with a range that ends at or after start - 1.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back()
            && e.saturating_add(1) >= start
        {
            lo = s;
            hi = hi.max(e);
            self.ranges.remove(&s);
        }
        // Swallow ranges that start within lo..=hi+1.
        let upper = hi.saturating_add(1);
        let swallowed: Vec<(u64, u64)> = self.ranges.range(lo..=upper).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in swallowed {
            hi = hi.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(lo, hi);
    }

    /// Adds `x`.
    pub(crate) fn insert(&mut self, x: u64) {
        self.insert_range(x, x);
    }

    /// Removes `x`; true when it was a member.
    pub(crate) fn remove(&mut self, x: u64) -> bool {
        let Some((&s, &e)) = self.ranges.range(..=x).next_back() else { return false };
        if e < x {
            return false;
        }
        self.ranges.remove(&s);
        if s < x {
            self.ranges.insert(s, x - 1);
        }
        if x < e {
            self.ranges.insert(x + 1, e);
        }
        true
    }

    /// Removes every member >= `x`; returns how many were removed.
    pub(crate) fn remove_from(&mut self, x: u64) -> u64 {
        let mut removed = 0;
        if let Some((&s, &e)) = self.ranges.range(..x).next_back()
            && e >= x
        {
            removed += e - x + 1;
            self.ranges.insert(s, x - 1);
        }
        for (s, e) in self.ranges.split_off(&x) {
            removed += e - s + 1;
        }
        removed
    }

    /// Removes every member <= `x`; returns how many were removed.
    pub(crate) fn remove_to(&mut self, x: u64) -> u64 {
        let Some(above) = x.checked_add(1) else {
            let n = self.ranges.iter().map(|(s, e)| e - s + 1).sum();
            self.ranges.clear();
            return n;
        };
        let kept = self.ranges.split_off(&above);
        let below = std::mem::replace(&mut self.ranges, kept);
        let mut removed = 0;
        for (s, e) in below {
            if e > x {
                removed += x - s + 1;
                self.ranges.insert(above, e);
            } else {
                removed += e - s + 1;
            }
        }
        removed
    }

    /// How many members are in `lo..=hi`.
    pub(crate) fn count_in(&self, lo: u64, hi: u64) -> u64 {
        if lo > hi {
            return 0;
        }
        let first = self.ranges.range(..lo).next_back().map(|(&s, &e)| (s, e)).filter(|&(_, e)| e >= lo);
        first
            .into_iter()
            .chain(self.ranges.range(lo..=hi).map(|(&s, &e)| (s, e)))
            .map(|(s, e)| e.min(hi) - s.max(lo) + 1)
            .sum()
    }

    /// Removes and returns the range starting exactly at `start`.
    pub(crate) fn take_range_at(&mut self, start: u64) -> Option<u64> {
        self.ranges.remove(&start)
    }

    /// The ranges (start, end inclusive), ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    /// How many members.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s + 1).sum()
    }

    /// How many disjoint ranges (the memory cost).
    #[cfg(test)]
    pub(crate) fn range_count(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_in_counts_members_of_a_range() {
        let mut r = RangeSet::new();
        r.insert_range(3, 5);
        r.insert_range(10, 20);
        assert_eq!(r.count_in(1, 100), 14);
        assert_eq!(r.count_in(4, 12), 5);
        assert_eq!(r.count_in(6, 9), 0);
        assert_eq!(r.count_in(20, 20), 1);
        assert_eq!(r.count_in(21, 2), 0);
    }
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn merges_adjacent_members() {
        let mut r = RangeSet::new();
        r.insert(3);
        r.insert(5);
        assert_eq!(r.range_count(), 2);
        r.insert(4);
        assert_eq!(r.range_count(), 1);
        assert_eq!(r.len(), 3);
        assert!(r.remove(4));
        assert_eq!(r.range_count(), 2);
        assert_eq!(r.remove_from(5), 1);
        assert_eq!(r.len(), 1);
        assert_eq!(r.take_range_at(3), Some(3));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64),
        RemoveFrom(u64),
        RemoveTo(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..200, 0u64..8).prop_map(|(a, n)| Op::Insert(a, a + n)),
            (0u64..200).prop_map(Op::Remove),
            (0u64..220).prop_map(Op::RemoveFrom),
            (0u64..220).prop_map(Op::RemoveTo),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec(op(), 0..200)) {
            let mut r = RangeSet::new();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(a, b) => { r.insert_range(a, b); model.extend(a..=b); }
                    Op::Remove(x) => prop_assert_eq!(r.remove(x), model.remove(&x)),
                    Op::RemoveFrom(x) => {
                        let gone = model.split_off(&x).len() as u64;
                        prop_assert_eq!(r.remove_from(x), gone);
                    }
                    Op::RemoveTo(x) => {
                        let kept = model.split_off(&(x + 1));
                        let gone = std::mem::replace(&mut model, kept).len() as u64;
                        prop_assert_eq!(r.remove_to(x), gone);
                    }
                }
                prop_assert_eq!(r.len(), model.len() as u64);
            }
            for x in 0..230 {
                prop_assert_eq!(r.contains(x), model.contains(&x));
            }
            // ranges are disjoint and never adjacent
            let v: Vec<_> = r.ranges.iter().map(|(&s, &e)| (s, e)).collect();
            for w in v.windows(2) {
                prop_assert!(w[0].1 + 1 < w[1].0);
            }
        }
    }
}
