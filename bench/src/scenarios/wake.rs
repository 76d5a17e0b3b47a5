//! Scenario 5: one holder with a long lease, one waiter; how long after the release the waiter
//! holds the lock. A backend the server notifies should answer in a few round trips; a polling
//! one in about half its current backoff step on average.

use std::time::{Duration, Instant};

use distlock_api::{LockExt, LockOptions};

use super::{unique_name, ACQUIRE_WAIT};
use crate::plan::Plan;
use crate::results::Wake;
use crate::stats::Recorder;
use crate::targets::Target;
use crate::Res;

/// Long enough that the holder's lease never ends the wait: only the release may.
const HOLD_TTL: Duration = Duration::from_secs(60);

pub(super) async fn run(target: &dyn Target, plan: &Plan, round_trip_us: Option<f64>) -> Res<Wake> {
    let holder = target.client().await?;
    let waiter = target.client().await?;
    let hold = LockOptions::new().watchdog_ttl(HOLD_TTL);
    let wait = LockOptions::new().wait(ACQUIRE_WAIT);
    let mut rec = Recorder::new();
    let (lo, hi) = plan.wake_delay;
    for _ in 0..plan.wake_samples {
        // A fresh name each time: nothing from the previous sample (queue nodes, channels)
        // can help or hurt this one.
        let name = unique_name("wake");
        let held = holder.lock_with(&name, &hold).await?;
        let task = {
            let (waiter, name, wait) = (waiter.clone(), name.clone(), wait.clone());
            tokio::spawn(async move {
                let guard = waiter.lock_with(&name, &wait).await?;
                let granted = Instant::now();
                guard.release().await?;
                Res::Ok(granted)
            })
        };
        let delay = lo + (hi.saturating_sub(lo)).mul_f64(fastrand::f64());
        tokio::time::sleep(delay).await;
        if task.is_finished() {
            return Err(format!("{name}: the waiter got the lock while it was held").into());
        }
        let released = Instant::now();
        held.release().await?;
        let granted = task.await??;
        rec.record(granted.saturating_duration_since(released));
    }
    let latency = rec.summary();
    Ok(Wake {
        latency,
        round_trips_p50: round_trip_us
            .filter(|&rt| rt > 0.0)
            .map(|rt| latency.p50_us / rt),
    })
}
