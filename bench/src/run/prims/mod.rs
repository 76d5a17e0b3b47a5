//! Sections 9 and 10: the counting semaphore and leader failover, on every backend that has
//! them and on the peer libraries that have them, on the same servers in the same run.
//!
//! Section 9 reuses the lock's measurement code: the permit cycle runs in slices alternating
//! with the backend's own `try_lock` cycle ([`measure_cycles`]), and the contended run is the
//! hot-lock scenario's loop with permits ([`scenarios::permits`]). Section 10 is in
//! [`failover`]; the peers of both in [`peers`].

mod failover;
mod peers;

use std::time::Duration;

pub(crate) use self::failover::lead;
use crate::error::Res;
use crate::model::{FailoverRow, Kind, PermitRow, Primitives, ScenarioError, Who};
use crate::run::libraries::Library;
use crate::run::plan::Plan;
use crate::run::progress::Progress;
use crate::run::scenarios::{
    self, bound, bounded, measure_cycles, unique_name, Measured, PermitCycle, TryCycle,
};
use crate::run::targets::{self, Target};
use distlock_api::LockOptions;

/// Progress steps of `kinds` and `libraries` in the sections asked for.
pub(crate) fn steps(kinds: &[Kind], libraries: &[Library], permits: bool, failover: bool) -> usize {
    let permit_peers = libraries.iter().filter(|l| l.permits()).count();
    let election_peers = libraries.iter().filter(|l| l.elections()).count();
    usize::from(permits) * (kinds.len() + permit_peers)
        + usize::from(failover) * (kinds.len() + election_peers)
}

/// Runs sections 9 and/or 10.
pub(crate) async fn run(
    kinds: &[Kind],
    libraries: &[Library],
    (permits, failover): (bool, bool),
    plan: &Plan,
    progress: &Progress,
) -> Primitives {
    let mut out = Primitives {
        permit_max: plan.permit_max,
        contended_max: plan.contended_max,
        contenders: plan.permit_contenders,
        lease_ms: plan.lease.as_millis() as u64,
        permits: Vec::new(),
        failover: Vec::new(),
    };
    for &kind in kinds {
        let target = targets::open(kind).await;
        if permits {
            progress.stage(kind.id(), "permit cycle and contended semaphore");
            let mut row = permit_row(who(kind));
            match &target {
                Ok(t) => permit_backend(&**t, plan, &mut row).await,
                Err(e) => row.who.skipped = Some(format!("unavailable: {e}")),
            }
            out.permits.push(row);
            progress.step();
        }
        if failover {
            progress.stage(kind.id(), "leader failover");
            let mut row = failover_row(who(kind));
            match &target {
                Ok(t) => failover::backend(&**t, plan, &mut row).await,
                Err(e) => row.who.skipped = Some(format!("unavailable: {e}")),
            }
            out.failover.push(row);
            progress.step();
        }
        if let Ok(t) = target {
            if let Err(e) = t.cleanup().await {
                progress.note(&format!("{}: cleanup failed: {e}", kind.id()));
            }
        }
    }
    if permits {
        for &lib in libraries.iter().filter(|l| l.permits()) {
            progress.stage(lib.id(), "permit cycle, alternating with distlock's");
            out.permits.push(peers::permits(lib, plan).await);
            progress.step();
        }
    }
    if failover {
        for &lib in libraries.iter().filter(|l| l.elections()) {
            progress.stage(lib.id(), "leader failover");
            out.failover.push(peers::failover(lib, plan).await);
            progress.step();
        }
    }
    out
}

fn who(kind: Kind) -> Who {
    Who {
        id: kind.id().into(),
        label: kind.label().into(),
        against: None,
        version: None,
        skipped: None,
        errors: Vec::new(),
    }
}

fn permit_row(who: Who) -> PermitRow {
    PermitRow {
        who,
        cycle: None,
        cycles_per_sec: 0.0,
        beside: None,
        contended: None,
        peak_held: None,
    }
}

fn failover_row(who: Who) -> FailoverRow {
    FailoverRow {
        who,
        samples_ms: Vec::new(),
        failover: None,
        elected: None,
    }
}

pub(crate) fn fail(who: &mut Who, what: &str, e: crate::error::BoxError) {
    who.errors.push(ScenarioError {
        scenario: what.into(),
        error: e.to_string(),
    });
}

/// A permit cycle of `target` on a fresh name.
async fn permit_cycle(target: &dyn Target, plan: &Plan) -> Res<PermitCycle> {
    Ok(PermitCycle {
        lock: target.client().await?,
        name: unique_name("permit-cycle"),
        max: plan.permit_max,
        opts: LockOptions::new(),
    })
}

async fn permit_backend(target: &dyn Target, plan: &Plan, row: &mut PermitRow) {
    let limit = bound(plan);
    let lock = match target.client().await {
        Ok(l) => l,
        Err(e) => return fail(&mut row.who, "connect", e),
    };
    if !lock.capabilities().semaphore {
        row.who.skipped = Some("no semaphore (`Capabilities::semaphore` is false)".into());
        return;
    }
    let cycles = async {
        let mut permit = permit_cycle(target, plan).await?;
        let mut try_lock = TryCycle {
            lock: lock.clone(),
            name: unique_name("permit-beside-lock"),
        };
        let measured = measure_cycles(
            &mut [&mut permit, &mut try_lock],
            plan.warmup,
            plan.slice,
            plan.slices,
        )
        .await?;
        let [p, l] = <[Measured; 2]>::try_from(measured)
            .map_err(|_| "measure_cycles returned the wrong number of results")?;
        Res::Ok((p, l))
    };
    match bounded(limit, cycles).await {
        Ok((p, l)) => {
            row.cycles_per_sec = p.per_sec();
            row.cycle = Some(p.latencies.summary());
            row.beside = Some(l.latencies.summary());
        }
        Err(e) => fail(&mut row.who, "permit cycle", e),
    }
    let contended = scenarios::permits(target, plan, plan.permit_contenders, plan.contended_max);
    match bounded(limit, contended).await {
        Ok((level, peak)) => {
            row.contended = Some(level);
            row.peak_held = Some(peak as u64);
        }
        Err(e) => fail(&mut row.who, "contended semaphore", e),
    }
}

/// How long to wait for a failover before calling it failed: many leases.
fn failover_bound(plan: &Plan) -> Duration {
    plan.lease * 10 + Duration::from_secs(20)
}
