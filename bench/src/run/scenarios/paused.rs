//! RedLock with one master paused: the uncontended cycle of scenario 1 on three private
//! redis-servers, healthy and with one of them stopped (`SIGSTOP`) in alternating slices; a
//! stopped server is what a hung host or a long pause looks like to a client: connected,
//! silent. Then a second one is stopped too, and `try_lock` must be refused.
//!
//! A RedLock round ends as soon as a majority has granted, so with two of three masters
//! answering the cycle should cost about what it costs healthy; this measures that promise.
//! The servers are the benchmark's own, never the shared ones other people's tests use.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::{DistributedLock, LockExt, LockOptions, SharedLock};
use distlock_redis::{RedLock, RedLockConfig};

use super::{measure_cycles, unique_name, LockCycle, Measured, ACQUIRE_WAIT};
use crate::error::Res;
use crate::model::{MajorityDown, PausedCycles, PausedMaster};
use crate::run::plan::Plan;
use crate::run::stats::Recorder;
use crate::run::targets::PrivateRedis;

const MASTERS: usize = 3;
/// The master that is paused; which one does not matter, the masters are asked in parallel.
const PAUSED: usize = MASTERS - 1;
/// `try_lock` calls timed with a majority paused: each waits out the per-master deadline.
const REFUSALS: usize = 5;

pub(super) async fn run(plan: &Plan) -> Res<PausedMaster> {
    // Dropped on every way out of here (errors, the scenario's time bound, a panic): thawed
    // and killed.
    let mut masters = Vec::with_capacity(MASTERS);
    for _ in 0..MASTERS {
        match PrivateRedis::start().await {
            Ok(m) => masters.push(m),
            Err(e) => {
                return Ok(PausedMaster::NotRun {
                    reason: e.to_string(),
                })
            }
        }
    }
    let urls: Vec<String> = masters.iter().map(PrivateRedis::url).collect();
    let redlock = RedLock::connect(RedLockConfig::from_url(&urls.join(","))?).await?;
    // The cycle takes a watchdog-managed lease of the client's default TTL.
    let ttl = redlock.core().default_ttl();
    let master_deadline = redlock.master_deadline(ttl);
    let lock: SharedLock = Arc::new(redlock);
    let opts = LockOptions::new().wait(ACQUIRE_WAIT);

    // Healthy and paused in alternating slices, like scenario 1's cycle and floor, so that
    // both see the same machine. Every paused slice uses a name of its own: the acquires the
    // paused master has buffered are carried out when it thaws and must not meet a name in
    // use. Each healthy slice starts with the plan's warm-up, which gives the thawed master
    // time to work off that backlog before the slice is timed.
    let mut healthy = empty();
    let mut paused = empty();
    let mut healthy_cycle = LockCycle {
        lock: lock.clone(),
        name: unique_name("paused-master/healthy"),
        opts: opts.clone(),
    };
    for _ in 0..plan.slices {
        slice(&mut healthy_cycle, plan.warmup, plan, &mut healthy).await?;
        masters[PAUSED].pause()?;
        let mut paused_cycle = LockCycle {
            lock: lock.clone(),
            name: unique_name("paused-master/paused"),
            opts: opts.clone(),
        };
        slice(&mut paused_cycle, Duration::ZERO, plan, &mut paused).await?;
        masters[PAUSED].resume()?;
    }
    masters[PAUSED].pause()?;

    masters[PAUSED - 1].pause()?;
    let majority_down = refusals(&lock).await?;
    masters[PAUSED - 1].resume()?;
    masters[PAUSED].resume()?;

    let (h, p) = (healthy.latencies.summary(), paused.latencies.summary());
    Ok(PausedMaster::Measured(Box::new(PausedCycles {
        masters: MASTERS,
        paused: 1,
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        master_deadline_ms: master_deadline.as_secs_f64() * 1000.0,
        healthy: h,
        healthy_per_sec: healthy.per_sec(),
        paused_cycle: p,
        paused_per_sec: paused.per_sec(),
        ratio_p50: if h.p50_us > 0.0 {
            p.p50_us / h.p50_us
        } else {
            0.0
        },
        majority_down: Some(majority_down),
    })))
}

/// Times `try_lock` on a free name with a majority paused; anything but an error is a bug.
async fn refusals(lock: &SharedLock) -> Res<MajorityDown> {
    let name = unique_name("paused-master/majority-down");
    let mut times = Recorder::new();
    let mut last = None;
    for _ in 0..REFUSALS {
        let started = Instant::now();
        let outcome = lock.try_lock(&name).await;
        times.record(started.elapsed());
        match outcome {
            Err(e) => last = Some(e),
            Ok(Some(_)) => {
                return Err(format!("{name}: try_lock granted with a majority paused").into())
            }
            Ok(None) => {
                return Err(format!(
                    "{name}: try_lock found a free name held with a majority paused"
                )
                .into())
            }
        }
    }
    let e = last.ok_or("no try_lock was timed")?;
    Ok(MajorityDown {
        refused_after: times.summary(),
        error: e.to_string(),
        kind: e.kind().to_string(),
        temporary: e.is_temporary(),
    })
}

fn empty() -> Measured {
    Measured {
        latencies: Recorder::new(),
        busy: Duration::ZERO,
    }
}

/// One slice of `cycle` after `warmup`, added to `into`.
async fn slice(
    cycle: &mut LockCycle,
    warmup: Duration,
    plan: &Plan,
    into: &mut Measured,
) -> Res<()> {
    for m in measure_cycles(&mut [cycle], warmup, plan.slice, 1).await? {
        into.latencies.merge(&m.latencies);
        into.busy += m.busy;
    }
    Ok(())
}
