//! Latency histograms (microseconds) and their summary.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use rheo_cli::error::CliError;

/// The largest latency recorded: one hour, in microseconds (longer ones are
/// clamped to it).
const MAX_MICROS: u64 = 3_600_000_000;

/// A latency histogram with three significant digits, whatever the count.
#[derive(Debug, Clone)]
pub struct Latencies(Histogram<u64>);

impl Latencies {
    /// An empty histogram.
    pub fn new() -> Result<Self, CliError> {
        Histogram::new_with_bounds(1, MAX_MICROS, 3)
            .map(Latencies)
            .map_err(|e| CliError::new(format!("cannot make a latency histogram: {e}")))
    }

    /// Records one latency of `micros` (at least 1, at most an hour).
    pub fn record(&mut self, micros: u64) {
        self.record_n(micros, 1);
    }

    /// Records `count` latencies of `micros`.
    pub fn record_n(&mut self, micros: u64, count: u64) {
        // In bounds by the clamp, so it cannot fail.
        let _ = self.0.record_n(micros.clamp(1, MAX_MICROS), count);
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides, so it cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// How many latencies it holds.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// The recorded values as (micros, count) pairs, for another process.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.0.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect()
    }

    /// A histogram from [`Latencies::buckets`].
    pub fn from_buckets(buckets: &[(u64, u64)]) -> Result<Self, CliError> {
        let mut h = Latencies::new()?;
        for &(v, n) in buckets {
            h.record_n(v, n);
        }
        Ok(h)
    }

    /// p50, p99 and max, in microseconds (zeros when empty).
    pub fn summary(&self) -> Summary {
        if self.0.is_empty() {
            return Summary::default();
        }
        Summary { p50_us: self.0.value_at_quantile(0.50), p99_us: self.0.value_at_quantile(0.99), max_us: self.0.max() }
    }
}

/// Latency percentiles of one case, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The median.
    pub p50_us: u64,
    /// The 99th percentile.
    pub p99_us: u64,
    /// The largest.
    pub max_us: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_spread() {
        let mut h = Latencies::new().unwrap();
        for v in 1..=1000 {
            h.record(v);
        }
        let s = h.summary();
        assert_eq!((s.p50_us, s.p99_us, s.max_us), (500, 990, 1000));
        let copy = Latencies::from_buckets(&h.buckets()).unwrap();
        assert_eq!(copy.summary(), s);
        assert_eq!(copy.len(), 1000);
    }

    #[test]
    fn merged_histograms_hold_both() {
        let mut a = Latencies::new().unwrap();
        a.record(10);
        let mut b = Latencies::new().unwrap();
        b.record_n(7_000_000_000, 2);
        a.merge(&b);
        assert_eq!(a.len(), 3);
        assert!(a.summary().max_us >= MAX_MICROS);
    }
}
