//! Scenario 6: one client holds many locks while its watchdog keeps them alive. Reports the
//! process's resident memory (before, while holding) and the renew calls per second, counted by
//! a wrapper around the backend, next to what the watchdog aims for: one renewal per lock per
//! TTL/3. Locks lost during the hold mean the watchdog could not keep up.
//!
//! Acquiring and releasing run under a time budget each: on a backend whose renewals of the
//! locks already held crowd out the acquisitions, the scenario reports how many it got within
//! the budget instead of running past the ten-minute bound of the whole report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::{LockExt, LockGuard, LockOptions, SharedLock};
use futures::stream::{self, StreamExt};

use super::unique_name;
use crate::error::Res;
use crate::model::ManyHeld;
use crate::run::counting::Counting;
use crate::run::machine::rss_bytes;
use crate::run::plan::Plan;
use crate::run::stats::per_sec;
use crate::run::targets::Target;

/// Acquires and releases in flight at once: enough to keep a round trip busy, few enough not
/// to swamp the server's connection handling.
const CONCURRENCY: usize = 32;

pub(super) async fn run(target: &dyn Target, plan: &Plan) -> Res<ManyHeld> {
    let counting = Arc::new(Counting::new(target.client().await?));
    let lock: SharedLock = counting.clone();
    let opts = LockOptions::new().watchdog_ttl(plan.many_ttl);
    let prefix = unique_name("many");

    let rss_before = rss_bytes();
    let began = Instant::now();
    let guards = acquire_all(&lock, &opts, &prefix, plan.many_locks, plan.many_budget).await?;
    let acquire = began.elapsed();
    let held = guards.len();
    // Only guards in the watchdog's care are renewed: the in-memory store keeps a
    // watchdog-managed lease itself while its guard lives, and there the target is zero.
    let renews = lock.capabilities().renewal && lock.core().guards_watched() > 0;
    let granted = guards.first().map_or(plan.many_ttl, LockGuard::ttl);

    // Locks acquired together renew together, in waves one period apart. Counting from the
    // middle of a period over a whole number of periods sees each lock's renewals exactly
    // once per period, however bunched the waves are.
    let period = granted / 3;
    tokio::time::sleep(period + period / 2).await;
    let periods = (plan.many_window.as_secs_f64() / period.as_secs_f64().max(1e-3))
        .round()
        .max(1.0);
    let (before, requests_before) = (counting.renewals(), counting.requests());
    let window_start = Instant::now();
    tokio::time::sleep(period.mul_f64(periods)).await;
    let renewals = counting.renewals() - before;
    let requests = counting.requests() - requests_before;
    let window = window_start.elapsed();
    // Snapshot now: a renewal racing a release below fails harmlessly and must not count.
    let (renew_errors, first_renew_error) = (counting.renew_errors(), counting.first_error());
    let rss_holding = rss_bytes();
    let lost = guards.iter().filter(|g| g.is_lost()).count();

    let released = Instant::now();
    let released_count = release_all(guards, plan.many_budget).await?;
    let release = released.elapsed();

    Ok(ManyHeld {
        locks_requested: plan.many_locks,
        locks: held,
        ttl_ms: millis(plan.many_ttl),
        granted_ttl_ms: millis(granted),
        acquire_s: acquire.as_secs_f64(),
        release_s: release.as_secs_f64(),
        released: Some(released_count),
        rss_before_bytes: rss_before,
        rss_holding_bytes: rss_holding,
        bytes_per_lock: rss_holding.saturating_sub(rss_before) as f64 / held.max(1) as f64,
        renewals_per_sec: per_sec(renewals, window),
        requests_per_sec: Some(per_sec(requests, window)),
        interval_s: if renewals > 0 {
            held as f64 * window.as_secs_f64() / renewals as f64
        } else {
            0.0
        },
        expected_per_sec: if renews {
            held as f64 / (granted / 3).as_secs_f64().max(1e-3)
        } else {
            0.0
        },
        renew_errors,
        first_renew_error,
        lost,
    })
}

/// Takes `count` fresh names, `CONCURRENCY` at a time, until done or `budget` is spent.
/// Acquires still in flight then are dropped, which the contract says leaves nothing behind.
async fn acquire_all(
    lock: &SharedLock,
    opts: &LockOptions,
    prefix: &str,
    count: usize,
    budget: Duration,
) -> Res<Vec<LockGuard>> {
    let deadline = tokio::time::Instant::now() + budget;
    let mut acquiring = stream::iter(0..count)
        .map(|i| {
            let (lock, opts, name) = (lock.clone(), opts.clone(), format!("{prefix}/{i}"));
            async move {
                let guard = lock.try_lock_with(&name, &opts).await?;
                guard.ok_or_else(|| {
                    crate::error::BoxError::from(format!("{name}: a fresh name was held"))
                })
            }
        })
        .buffer_unordered(CONCURRENCY);
    let mut guards = Vec::with_capacity(count);
    while let Ok(next) = tokio::time::timeout_at(deadline, acquiring.next()).await {
        match next {
            Some(guard) => guards.push(guard?),
            None => break,
        }
    }
    Ok(guards)
}

/// Releases every guard, `CONCURRENCY` at a time, within `budget`, and returns how many it
/// released; guards left after it are dropped, which releases them in the background.
async fn release_all(guards: Vec<LockGuard>, budget: Duration) -> Res<usize> {
    let mut releasing = stream::iter(guards)
        .map(|g| g.release())
        .buffer_unordered(CONCURRENCY);
    let deadline = tokio::time::Instant::now() + budget;
    let mut count = 0;
    while let Ok(Some(released)) = tokio::time::timeout_at(deadline, releasing.next()).await {
        released?;
        count += 1;
    }
    Ok(count)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
