//! What one hot-lock run recorded, and the one function that turns it into the report's
//! [`HotLevel`]: distlock's backends (scenario 4) and every peer library (section 8) are
//! summarised by the same code, whoever measured them.

use std::time::Duration;

use crate::model::HotLevel;
use crate::run::stats::{jain, per_sec, Recorder};

/// The raw measurements of N contenders on one name, before any statistics.
#[derive(Default)]
pub(crate) struct HotRecord {
    /// Grants per contender, one entry per contender (zeros included).
    pub(crate) grants: Vec<u64>,
    /// From a holder calling release to the next grant, whoever got it.
    pub(crate) handoff: Recorder,
    /// From a holder calling release to that call returning (empty where not measured).
    pub(crate) release: Recorder,
    /// From calling acquire to holding the lock.
    pub(crate) wait: Recorder,
    /// Hand-offs whose next holder was the contender that had just released.
    pub(crate) self_regrants: u64,
    /// Grants made while another contender believed it held the lock.
    pub(crate) violations: u64,
    /// From the start signal to the last contender stopping.
    pub(crate) elapsed: Duration,
}

impl HotRecord {
    /// Checks that the numbers can describe one run: a hand-off ends in a grant, a self-regrant
    /// is a hand-off. A harness whose output breaks these has a bug, and its numbers would lie.
    pub(crate) fn check(&self) -> Result<(), String> {
        let total: u64 = self.grants.iter().sum();
        if self.grants.is_empty() {
            return Err("no contenders".into());
        }
        if self.handoff.len() > total {
            return Err(format!(
                "{} hand-offs but only {total} grants",
                self.handoff.len()
            ));
        }
        if self.self_regrants > self.handoff.len() {
            return Err(format!(
                "{} self-regrants but only {} hand-offs",
                self.self_regrants,
                self.handoff.len()
            ));
        }
        if self.wait.len() != total {
            return Err(format!(
                "{} waits recorded for {total} grants",
                self.wait.len()
            ));
        }
        Ok(())
    }

    /// The report's numbers.
    pub(crate) fn summary(&self) -> HotLevel {
        let total: u64 = self.grants.iter().sum();
        let handoffs = self.handoff.len();
        let wait = self.wait.summary();
        HotLevel {
            clients: self.grants.len(),
            grants: total,
            grants_per_sec: per_sec(total, self.elapsed),
            handoff: self.handoff.summary(),
            release: (self.release.len() > 0).then(|| self.release.summary()),
            wait,
            longest_wait_ms: wait.max_us / 1000.0,
            jain: jain(&self.grants),
            grants_min: self.grants.iter().copied().min().unwrap_or(0),
            grants_max: self.grants.iter().copied().max().unwrap_or(0),
            exclusion_violations: self.violations,
            self_regrant_share: (handoffs > 0).then(|| self.self_regrants as f64 / handoffs as f64),
            server_requests_per_grant: None,
            server_syncs: None,
            cpu_busy: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(grants: &[u64], handoffs_us: &[u64], self_regrants: u64) -> HotRecord {
        let mut r = HotRecord {
            grants: grants.to_vec(),
            self_regrants,
            elapsed: Duration::from_secs(2),
            ..HotRecord::default()
        };
        for &us in handoffs_us {
            r.handoff.record(Duration::from_micros(us));
        }
        for _ in 0..grants.iter().sum::<u64>() {
            r.wait.record(Duration::from_micros(10));
        }
        r
    }

    #[test]
    fn summary_counts_grants_fairness_and_self_regrants() {
        // 4 contenders, 10 grants, 9 hand-offs of which 3 went back to the releaser.
        let r = record(
            &[4, 2, 2, 2],
            &[100, 100, 100, 200, 200, 200, 300, 300, 300],
            3,
        );
        r.check().unwrap();
        let h = r.summary();
        assert_eq!(h.clients, 4);
        assert_eq!(h.grants, 10);
        assert!((h.grants_per_sec - 5.0).abs() < 1e-9);
        // Jain: 10² / (4 × (16 + 4 + 4 + 4)) = 100 / 112.
        assert!((h.jain - 100.0 / 112.0).abs() < 1e-12, "{}", h.jain);
        assert_eq!((h.grants_min, h.grants_max), (2, 4));
        assert_eq!(h.handoff.count, 9);
        assert!((h.handoff.p50_us - 200.0).abs() < 1.0, "{:?}", h.handoff);
        assert!((h.handoff.p99_us - 300.0).abs() < 1.0, "{:?}", h.handoff);
        assert_eq!(h.self_regrant_share, Some(1.0 / 3.0));
        assert_eq!(h.exclusion_violations, 0);
        assert!((h.longest_wait_ms - 0.01).abs() < 1e-4);
    }

    #[test]
    fn no_handoff_means_no_self_regrant_share() {
        let r = record(&[1, 0], &[], 0);
        r.check().unwrap();
        let h = r.summary();
        assert_eq!(h.self_regrant_share, None);
        assert!((h.jain - 0.5).abs() < 1e-12);
    }

    #[test]
    fn inconsistent_records_are_refused() {
        assert!(record(&[1, 1], &[5, 5, 5], 0).check().is_err());
        assert!(record(&[2, 2], &[5, 5], 3).check().is_err());
        assert!(record(&[], &[], 0).check().is_err());
        let mut r = record(&[2, 2], &[5], 1);
        r.wait.record(Duration::from_micros(1));
        assert!(r.check().is_err());
    }
}
