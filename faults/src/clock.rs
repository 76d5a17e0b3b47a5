//! Timestamps every process of a run can compare: CLOCK_MONOTONIC in nanoseconds. All the
//! processes run on one machine, so one process's reading orders against another's.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::time::{clock_gettime, ClockId};

/// Now, on CLOCK_MONOTONIC, in nanoseconds.
pub(crate) fn now() -> u64 {
    let t = clock_gettime(ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// An `Instant` and a CLOCK_MONOTONIC reading taken back to back, once per process: the offset
/// that turns a guard's `safe_until` into a timestamp of the history.
fn anchor() -> &'static (Instant, u64) {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        // The pair is read twice and the tighter reading kept, so a preemption between the two
        // calls does not skew every conversion of the process.
        let mut best: Option<(Instant, u64, u64)> = None;
        for _ in 0..3 {
            let before = now();
            let instant = Instant::now();
            let after = now();
            let width = after - before;
            if best.is_none_or(|b| width < b.2) {
                best = Some((instant, before + width / 2, width));
            }
        }
        let (instant, mono, _) = best.expect("three readings");
        (instant, mono)
    })
}

/// `at` as a CLOCK_MONOTONIC timestamp in nanoseconds.
pub(crate) fn of_instant(at: Instant) -> u64 {
    let (base, mono) = *anchor();
    if at >= base {
        mono + (at - base).as_nanos() as u64
    } else {
        mono.saturating_sub((base - at).as_nanos() as u64)
    }
}

/// Milliseconds between two timestamps, for reports (negative when `b` is before `a`).
pub(crate) fn ms_between(a: u64, b: u64) -> f64 {
    (b as f64 - a as f64) / 1e6
}

/// A duration in nanoseconds.
pub(crate) fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_conversion_agrees_with_the_clock() {
        let later = Instant::now() + Duration::from_millis(250);
        let converted = of_instant(later);
        let direct = now() + 250_000_000;
        let diff = converted.abs_diff(direct);
        assert!(diff < 5_000_000, "conversion off by {diff} ns");
    }
}
