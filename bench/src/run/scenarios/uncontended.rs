//! Scenarios 1 and 2: one client acquiring and releasing one free name, and the raw-driver
//! floor. They run in alternating slices rather than one after the other, so that both see the
//! same machine: on a box shared with the servers a compile or a GC elsewhere would otherwise
//! land on one side of the ratio only.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::backend::AcquireRequest;
use distlock_api::{Blocking, LockExt, LockName, LockOptions, SharedLock};

use super::{lock_cycle, unique_name, ACQUIRE_WAIT};
use crate::error::Res;
use crate::model::Uncontended;
use crate::run::plan::Plan;
use crate::run::stats::{per_sec, Recorder};
use crate::run::targets::{Floor, Target};

/// Something measured one cycle at a time.
#[async_trait]
pub(crate) trait Cycle: Send {
    async fn once(&mut self) -> Res<()>;

    /// Told when the warm-up is over and the measured slices begin.
    fn measuring(&mut self) {}
}

/// Latencies of one measured operation and the time spent running it.
pub(crate) struct Measured {
    pub(crate) latencies: Recorder,
    pub(crate) busy: Duration,
}

impl Measured {
    pub(crate) fn per_sec(&self) -> f64 {
        per_sec(self.latencies.len(), self.busy)
    }
}

/// Warms each op up, then runs `slices` rounds of `slice` per op, in turn.
pub(crate) async fn measure_cycles(
    ops: &mut [&mut dyn Cycle],
    warmup: Duration,
    slice: Duration,
    slices: u32,
) -> Res<Vec<Measured>> {
    for op in ops.iter_mut() {
        run_for(*op, warmup, None).await?;
    }
    for op in ops.iter_mut() {
        op.measuring();
    }
    let mut out: Vec<Measured> = ops
        .iter()
        .map(|_| Measured {
            latencies: Recorder::new(),
            busy: Duration::ZERO,
        })
        .collect();
    for _ in 0..slices {
        for (op, m) in ops.iter_mut().zip(out.iter_mut()) {
            m.busy += run_for(*op, slice, Some(&mut m.latencies)).await?;
        }
    }
    Ok(out)
}

/// Runs `op` until `slice` has passed (at least once), recording each cycle's latency.
pub(crate) async fn run_for(
    op: &mut dyn Cycle,
    slice: Duration,
    mut rec: Option<&mut Recorder>,
) -> Res<Duration> {
    let start = Instant::now();
    let end = start + slice;
    loop {
        let t = Instant::now();
        op.once().await?;
        let now = Instant::now();
        if let Some(rec) = rec.as_deref_mut() {
            rec.record(now - t);
        }
        if now >= end {
            return Ok(now - start);
        }
    }
}

/// What applications call: `lock(name, wait)` + `release()`.
pub(crate) struct LockCycle {
    pub(crate) lock: SharedLock,
    pub(crate) name: String,
    pub(crate) opts: LockOptions,
}

#[async_trait]
impl Cycle for LockCycle {
    async fn once(&mut self) -> Res<()> {
        lock_cycle(&self.lock, &self.name, &self.opts).await
    }
}

/// `try_lock(name)` + `release()`.
pub(crate) struct TryCycle {
    pub(crate) lock: SharedLock,
    pub(crate) name: String,
}

#[async_trait]
impl Cycle for TryCycle {
    async fn once(&mut self) -> Res<()> {
        let guard = self
            .lock
            .try_lock(&self.name)
            .await?
            .ok_or_else(|| format!("{}: uncontended try_lock found it held", self.name))?;
        if !guard.release().await? {
            return Err(format!("{}: release found the lock no longer held", self.name).into());
        }
        Ok(())
    }
}

/// `try_permit(name, max)` + `release()` on a free semaphore of `max` permits.
pub(crate) struct PermitCycle {
    pub(crate) lock: SharedLock,
    pub(crate) name: String,
    pub(crate) max: u32,
    pub(crate) opts: LockOptions,
}

#[async_trait]
impl Cycle for PermitCycle {
    async fn once(&mut self) -> Res<()> {
        let guard = self
            .lock
            .try_permit(&self.name, self.max, &self.opts)
            .await?
            .ok_or_else(|| format!("{}: uncontended try_permit found none free", self.name))?;
        if !guard.release().await? {
            return Err(format!("{}: release found the permit no longer held", self.name).into());
        }
        Ok(())
    }
}

/// The backend's primitives alone, without the guard and the watchdog the conveniences add:
/// the split shows where the overhead over the floor lives.
struct PrimitiveCycle {
    lock: SharedLock,
    req: AcquireRequest,
}

#[async_trait]
impl Cycle for PrimitiveCycle {
    async fn once(&mut self) -> Res<()> {
        let grant = self
            .lock
            .attempt(&self.req)
            .await?
            .into_grant()
            .ok_or_else(|| format!("{}: uncontended attempt found it held", self.req.name))?;
        if !self.lock.release(&grant).await? {
            return Err(format!("{}: release found the lock no longer held", self.req.name).into());
        }
        Ok(())
    }
}

struct FloorCycle {
    floor: Box<dyn Floor>,
    name: String,
    /// The release step of each measured cycle.
    release: Recorder,
    measuring: bool,
}

#[async_trait]
impl Cycle for FloorCycle {
    async fn once(&mut self) -> Res<()> {
        let release = self.floor.cycle(&self.name).await?;
        if self.measuring {
            self.release.record(release);
        }
        // The in-memory floor's future is always ready and never yields: without this a tight
        // loop would never let the runtime run its timers or other tasks. The in-memory backend
        // spends one unit of the task's budget per acquire for the same reason, so both sides
        // yield to the runtime equally often (on a multi-threaded runtime each yield wakes an
        // idle worker, which costs microseconds). Networked ops yield on I/O anyway.
        tokio::task::coop::consume_budget().await;
        Ok(())
    }

    fn measuring(&mut self) {
        self.measuring = true;
    }
}

pub(super) async fn run(target: &dyn Target, plan: &Plan) -> Res<(Uncontended, Blocking)> {
    let lock = target.client().await?;
    let blocking = lock.capabilities().blocking;
    let mut cycle = LockCycle {
        lock: lock.clone(),
        name: unique_name("cycle"),
        opts: LockOptions::new().wait(ACQUIRE_WAIT),
    };
    let mut try_cycle = TryCycle {
        lock: lock.clone(),
        name: unique_name("try-cycle"),
    };
    let core = lock.core();
    let req = AcquireRequest::new(
        LockName::new(unique_name("primitive-cycle"))?,
        core.owner().clone(),
        core.default_ttl(),
    )?;
    let mut primitive = PrimitiveCycle { lock, req };
    let mut floor = FloorCycle {
        floor: target.floor().await?,
        name: unique_name("floor"),
        release: Recorder::new(),
        measuring: false,
    };
    let measured = measure_cycles(
        &mut [&mut floor, &mut cycle, &mut try_cycle, &mut primitive],
        plan.warmup,
        plan.slice,
        plan.slices,
    )
    .await?;
    let [floor_m, cycle_m, try_m, prim_m] = <[Measured; 4]>::try_from(measured)
        .map_err(|_| "measure_cycles returned the wrong number of results")?;
    let (c, f) = (cycle_m.latencies.summary(), floor_m.latencies.summary());
    let ops = target.floor_ops();
    Ok((
        Uncontended {
            cycle: c,
            cycles_per_sec: cycle_m.per_sec(),
            try_cycle: try_m.latencies.summary(),
            try_cycles_per_sec: try_m.per_sec(),
            primitive_cycle: prim_m.latencies.summary(),
            primitive_per_sec: prim_m.per_sec(),
            floor: f,
            floor_release: (floor.release.len() > 0).then(|| floor.release.summary()),
            floor_per_sec: floor_m.per_sec(),
            floor_ops: ops.what.into(),
            floor_round_trips: ops.round_trips,
            ratio_p50: if f.p50_us > 0.0 {
                c.p50_us / f.p50_us
            } else {
                0.0
            },
            overhead_p50_us: c.p50_us - f.p50_us,
        },
        blocking,
    ))
}
