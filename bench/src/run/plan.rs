//! How long each scenario runs, in the full and the quick mode.
//!
//! Each backend of the full run gets roughly a minute on a small machine that also runs the
//! servers (fourteen backends with the Redis topologies, about 25 minutes with the peers and
//! sections 9 and 10 on two cores): about 8 s of interleaved
//! uncontended/floor slices, 12 s of independent locks, 9 s of the hot lock, ~8 s of wake-ups
//! and the many-held-locks hold (whose acquiring and releasing have a budget of 30 s each, for
//! backends that cannot keep 10,000 locks renewed); RedLock adds about 11 s of slices with one of
//! three private masters paused (each healthy slice after a warm-up). The peer libraries of
//! section 8 take about 25 s each with the same plan (cycle slices against distlock's, one
//! hot-lock level, the wake-ups), about two minutes for the five. The quick mode runs every
//! scenario and the report writer in a few seconds per backend, in a debug build.
//!
//! Sections 9 and 10 add about 5 s per backend with semaphores and, per backend and election
//! peer, one leader kill per sample: the lease (2 s, the same for all) plus a process start,
//! about 3–4 s each (one sample in the quick mode, four in the full).

use std::time::Duration;

use crate::run::targets::Kind;

/// Durations and sizes of one run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Whether this is the quick mode (recorded in the report).
    pub(crate) quick: bool,
    /// Cycles run before measuring: connections, prepared statements and script caches warm up.
    pub(crate) warmup: Duration,
    /// The uncontended cycle, its try-lock variant and the floor run in turns of this length,
    /// so that all three see the same machine load (other processes, CPU frequency).
    pub(crate) slice: Duration,
    /// How many turns.
    pub(crate) slices: u32,
    /// Concurrent clients on distinct names.
    pub(crate) independent: &'static [usize],
    /// How long each level of `independent` runs.
    pub(crate) independent_for: Duration,
    /// Clients contending for one name.
    pub(crate) hot: &'static [usize],
    /// How long each level of `hot` runs.
    pub(crate) hot_for: Duration,
    /// Wake-up measurements.
    pub(crate) wake_samples: u32,
    /// The waiter waits a random time in this range before the holder releases, so polling
    /// backends are caught at every phase of their backoff, not just right after a retry.
    pub(crate) wake_delay: (Duration, Duration),
    /// Locks one client holds at once.
    pub(crate) many_locks: usize,
    /// Their watchdog TTL: short, so that renewal traffic shows within the window.
    pub(crate) many_ttl: Duration,
    /// Renewals are counted over about this long, in whole renewal periods.
    pub(crate) many_window: Duration,
    /// The most acquiring (and, separately, releasing) them may take.
    pub(crate) many_budget: Duration,
    /// Section 9: the semaphore size of the permit cycle, and of the contended run with its
    /// contenders (which runs for `hot_for`).
    pub(crate) permit_max: u32,
    pub(crate) contended_max: u32,
    pub(crate) permit_contenders: usize,
    /// Section 10: leader kills per backend and peer, and the lease every leader has.
    pub(crate) failover_samples: u32,
    pub(crate) lease: Duration,
}

impl Plan {
    /// Progress steps per backend: uncontended+floor, one per independent level, one per hot
    /// level, the hot lock on one handle, wake-up, many held locks.
    const STEPS_PER_BACKEND: usize = 1 + 4 + 3 + 1 + 1 + 1;

    /// Progress steps of `kind`: RedLock adds the run with one master paused.
    pub(crate) fn steps(kind: Kind) -> usize {
        Self::STEPS_PER_BACKEND + usize::from(kind == Kind::Redlock)
    }

    /// The full run.
    pub(crate) fn full() -> Self {
        Self {
            quick: false,
            warmup: Duration::from_millis(500),
            slice: Duration::from_millis(200),
            slices: 12,
            independent: &[1, 4, 16, 64],
            independent_for: Duration::from_secs(3),
            hot: &[2, 8, 32],
            hot_for: Duration::from_secs(3),
            wake_samples: 25,
            wake_delay: (Duration::from_millis(100), Duration::from_millis(400)),
            many_locks: 10_000,
            many_ttl: Duration::from_secs(3),
            many_window: Duration::from_secs(4),
            many_budget: Duration::from_secs(30),
            permit_max: 4,
            contended_max: 2,
            permit_contenders: 8,
            lease: Duration::from_secs(2),
            failover_samples: 8,
        }
    }

    /// A few seconds per backend, every scenario and the report writer still exercised.
    pub(crate) fn quick() -> Self {
        Self {
            quick: true,
            warmup: Duration::from_millis(50),
            slice: Duration::from_millis(100),
            slices: 3,
            independent: &[1, 4, 16, 64],
            independent_for: Duration::from_millis(300),
            hot: &[2, 8, 32],
            hot_for: Duration::from_millis(400),
            wake_samples: 3,
            wake_delay: (Duration::from_millis(50), Duration::from_millis(150)),
            many_locks: 500,
            many_ttl: Duration::from_secs(3),
            many_window: Duration::from_secs(1),
            many_budget: Duration::from_secs(10),
            permit_max: 4,
            contended_max: 2,
            permit_contenders: 8,
            lease: Duration::from_secs(2),
            failover_samples: 1,
        }
    }
}
