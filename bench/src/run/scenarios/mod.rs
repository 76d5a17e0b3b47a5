//! The scenarios, one module each, run in order against one backend. A scenario that fails or
//! overruns its bound records its error in the result and the next one still runs: a report
//! with one hole is more useful than none.

mod hot;
mod independent;
mod many;
mod paused;
mod uncontended;
mod wake;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use distlock_api::{Blocking, LockExt, LockOptions, SharedLock};

use crate::error::Res;
use crate::model::{BackendResult, ScenarioError};
use crate::run::plan::Plan;
use crate::run::progress::Progress;
use crate::run::targets::{run_id, Kind, Target};

pub(crate) use hot::permits;
pub(crate) use uncontended::{
    measure_cycles, run_for, Cycle, LockCycle, Measured, PermitCycle, TryCycle,
};

/// How long acquires in the scenarios may wait: far beyond any hand-off, so a timeout means a
/// stuck backend, not a slow one.
pub(crate) const ACQUIRE_WAIT: Duration = Duration::from_secs(30);

/// The most one scenario may take before it is abandoned and reported as failed.
pub(crate) fn bound(plan: &Plan) -> Duration {
    if plan.quick {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(180)
    }
}

/// Tasks sharing one client handle in the hot-lock scenario's one-handle level.
pub(crate) const SAME_HANDLE_TASKS: usize = 8;

/// Runs scenarios 1–6 on `target`, filling `result`; on RedLock also the cycle with one of
/// three private masters paused.
pub(crate) async fn run_all(
    target: &dyn Target,
    plan: &Plan,
    progress: &Progress,
    result: &mut BackendResult,
) {
    let id = target.kind().id();
    let limit = bound(plan);

    progress.stage(id, "uncontended cycle and floor");
    match bounded(limit, uncontended::run(target, plan)).await {
        Ok((u, blocking)) => {
            result.uncontended = Some(u);
            result.blocking = Some(match blocking {
                Blocking::Notify => "notify".to_string(),
                Blocking::Poll => "poll".to_string(),
                Blocking::Signal => "signal".to_string(),
                other => format!("{other:?}").to_lowercase(),
            });
        }
        Err(e) => fail(result, "uncontended", e),
    }
    progress.step();

    for &clients in plan.independent {
        progress.stage(id, &format!("independent locks, {clients} clients"));
        match bounded(limit, independent::run(target, plan, clients)).await {
            Ok(level) => result.independent.push(level),
            Err(e) => fail(result, &format!("independent/{clients}"), e),
        }
        progress.step();
    }

    for &clients in plan.hot {
        progress.stage(id, &format!("one hot lock, {clients} clients"));
        match bounded(limit, hot::run(target, plan, clients)).await {
            Ok(level) => result.hot.push(level),
            Err(e) => fail(result, &format!("hot/{clients}"), e),
        }
        progress.step();
    }

    progress.stage(
        id,
        &format!("one hot lock, {SAME_HANDLE_TASKS} tasks on one handle"),
    );
    match bounded(limit, hot::run_one_handle(target, plan, SAME_HANDLE_TASKS)).await {
        Ok(level) => result.hot_one_handle = Some(level),
        Err(e) => fail(result, &format!("hot-one-handle/{SAME_HANDLE_TASKS}"), e),
    }
    progress.step();

    progress.stage(id, "wake-up");
    let round_trip = result.uncontended.as_ref().map(|u| u.round_trip_us());
    match bounded(limit, wake::run(target, plan, round_trip)).await {
        Ok(w) => result.wake = Some(w),
        Err(e) => fail(result, "wake", e),
    }
    progress.step();

    progress.stage(id, &format!("{} held locks", plan.many_locks));
    match bounded(limit, many::run(target, plan)).await {
        Ok(m) => result.many = Some(m),
        Err(e) => fail(result, "many", e),
    }
    progress.step();

    // Last, so that what the thawed master does with its backlog cannot touch the scenarios
    // above; its servers are private, so it does not touch `target` either.
    if target.kind() == Kind::Redlock {
        progress.stage(id, "one of three private masters paused");
        match bounded(limit, paused::run(plan)).await {
            Ok(p) => result.paused_master = Some(p),
            Err(e) => fail(result, "paused-master", e),
        }
        progress.step();
    }
}

fn fail(result: &mut BackendResult, scenario: &str, error: crate::error::BoxError) {
    result.errors.push(ScenarioError {
        scenario: scenario.into(),
        error: error.to_string(),
    });
}

pub(crate) async fn bounded<T>(limit: Duration, fut: impl Future<Output = Res<T>>) -> Res<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("did not finish within {limit:?}"))?
}

/// Scenario 4 at one level, alone (section 8 uses it when scenario 4 did not run), bounded.
pub(crate) async fn hot_level(
    target: &dyn Target,
    plan: &Plan,
    clients: usize,
) -> Res<crate::model::HotLevel> {
    bounded(bound(plan), hot::run(target, plan, clients)).await
}

/// Scenario 5's latency alone (section 8 uses it when scenario 5 did not run), bounded.
pub(crate) async fn wake_latency(target: &dyn Target, plan: &Plan) -> Res<crate::model::Latency> {
    Ok(bounded(bound(plan), wake::run(target, plan, None))
        .await?
        .latency)
}

/// A lock name no earlier run or other scenario uses, so leftovers of a crashed run (or of a
/// concurrent test) never make a scenario contended by accident.
pub(crate) fn unique_name(scenario: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("distlock-bench/{}/{scenario}/{n}", run_id())
}

/// One application-level cycle: wait for the lock (it is free), then release it.
pub(crate) async fn lock_cycle(lock: &SharedLock, name: &str, opts: &LockOptions) -> Res<()> {
    let guard = lock.lock_with(name, opts).await?;
    if !guard.release().await? {
        return Err(format!("{name}: release found the lock no longer held").into());
    }
    Ok(())
}
