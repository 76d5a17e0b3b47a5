//! Scenario 5: one holder with a long lease, one waiter; how long after the release the waiter
//! holds the lock. A backend the server notifies should answer in a few round trips; a polling
//! one in about half its current backoff step on average.
//!
//! Both sides have been idle when the release comes, and waking idle threads (client and
//! server) costs more than a round trip in a busy loop does. So the round trips are also counted
//! against an *idle* round trip, measured the same way: after each sample, the raw-driver floor
//! cycle runs once after the same kind of idle delay.

use std::time::{Duration, Instant};

use distlock_api::{Blocking, LockExt, LockOptions};

use super::{unique_name, ACQUIRE_WAIT};
use crate::error::Res;
use crate::model::Wake;
use crate::run::plan::Plan;
use crate::run::stats::Recorder;
use crate::run::targets::Target;

/// Long enough that the holder's lease never ends the wait: only the release may.
const HOLD_TTL: Duration = Duration::from_secs(60);

pub(super) async fn run(target: &dyn Target, plan: &Plan, round_trip_us: Option<f64>) -> Res<Wake> {
    let holder = target.client().await?;
    // Only notified (or signalled) waiting is judged in round trips; in-process there are none
    // to count.
    let notified = matches!(
        holder.capabilities().blocking,
        Blocking::Notify | Blocking::Signal
    );
    let mut idle_floor = match notified && target.kind() != crate::run::targets::Kind::Memory {
        true => Some(target.floor().await?),
        false => None,
    };
    let mut idle = Recorder::new();
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
        if let Some(floor) = idle_floor.as_mut() {
            let delay = lo + (hi.saturating_sub(lo)).mul_f64(fastrand::f64());
            tokio::time::sleep(delay).await;
            let t = Instant::now();
            floor.cycle(&unique_name("wake-idle-floor")).await?;
            idle.record(t.elapsed());
        }
    }
    let latency = rec.summary();
    let idle_floor = (idle.len() > 0).then(|| idle.summary());
    let floor_round_trips = target.floor_ops().round_trips.max(1);
    let idle_round_trip_us = idle_floor.map(|f| f.p50_us / f64::from(floor_round_trips));
    Ok(Wake {
        latency,
        round_trips_p50: round_trip_us
            .filter(|&rt| rt > 0.0)
            .map(|rt| latency.p50_us / rt),
        idle_floor,
        idle_round_trips_p50: idle_round_trip_us
            .filter(|&rt| rt > 0.0)
            .map(|rt| latency.p50_us / rt),
    })
}
