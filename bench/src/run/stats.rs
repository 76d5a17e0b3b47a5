//! Latency histograms, and the summaries of them that the model keeps.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::model::Latency;

/// A latency histogram in nanoseconds, 3 significant digits, from 1 ns to one hour.
#[derive(Clone)]
pub(crate) struct Recorder {
    hist: Histogram<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    const MAX_NS: u64 = 3_600_000_000_000;

    pub(crate) fn new() -> Self {
        // Bounds and precision are constants that hdrhistogram accepts, so this cannot fail.
        let hist = Histogram::new_with_bounds(1, Self::MAX_NS, 3)
            .expect("constant histogram bounds are valid");
        Self { hist }
    }

    pub(crate) fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.hist.saturating_record(ns.clamp(1, Self::MAX_NS));
    }

    pub(crate) fn merge(&mut self, other: &Recorder) {
        // Same bounds on both sides, so adding cannot go out of range.
        let _ = self.hist.add(&other.hist);
    }

    pub(crate) fn len(&self) -> u64 {
        self.hist.len()
    }

    pub(crate) fn summary(&self) -> Latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        let h = &self.hist;
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// Jain's fairness index of per-client shares: 1 when every client got the same, 1/n when one
/// client got everything.
pub(crate) fn jain(shares: &[u64]) -> f64 {
    let n = shares.len() as f64;
    let sum: f64 = shares.iter().map(|&x| x as f64).sum();
    let squares: f64 = shares.iter().map(|&x| (x as f64) * (x as f64)).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (n * squares)
}

/// A rate per second, 0 for an empty interval.
pub(crate) fn per_sec(count: u64, over: Duration) -> f64 {
    let s = over.as_secs_f64();
    if s > 0.0 {
        count as f64 / s
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-12);
        assert!((jain(&[8, 0, 0, 0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[0, 0]) - 1.0).abs() < 1e-12);
        let mid = jain(&[3, 1]);
        assert!(mid > 0.5 && mid < 1.0);
    }

    #[test]
    fn summary_reports_percentiles_in_microseconds() {
        let mut r = Recorder::new();
        for us in 1..=1000u64 {
            r.record(Duration::from_micros(us));
        }
        let s = r.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_us - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_us - 990.0).abs() < 1.0, "{s:?}");
        assert!((s.max_us - 1000.0).abs() < 1.0, "{s:?}");
        let mut other = Recorder::new();
        other.record(Duration::from_millis(5));
        r.merge(&other);
        assert_eq!(r.len(), 1001);
        assert!((r.summary().max_us - 5000.0).abs() < 5.0);
    }
}
