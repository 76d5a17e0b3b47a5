//! Scenario 4: N clients contending for one name, each releasing as soon as it holds it. The
//! critical section is empty on purpose: what is left is the cost of handing the lock over.
//!
//! Hand-off latency runs from the holder *calling* release to the next holder's acquire
//! returning — the time the lock protects nothing — whoever that next holder is (the releaser
//! itself, on a backend that lets it barge back in, which the fairness index and the
//! self-regrant share then show).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use distlock_api::{LockExt, LockOptions};
use futures::future::try_join_all;
use tokio::sync::Barrier;

use super::{lock_cycle, unique_name, ACQUIRE_WAIT};
use crate::error::Res;
use crate::model::HotLevel;
use crate::run::contention::HotRecord;
use crate::run::plan::Plan;
use crate::run::stats::Recorder;
use crate::run::targets::Target;

/// What the contending clients share.
struct Shared {
    name: String,
    opts: LockOptions,
    stop: AtomicBool,
    start: Barrier,
    /// When the last holder called release, and which client it was; taken by the next
    /// holder.
    released_at: Mutex<Option<(Instant, usize)>>,
    handoff: Mutex<Recorder>,
    /// From calling release to its return.
    release: Mutex<Recorder>,
    /// Hand-offs that went back to the client that had just released.
    self_regrants: AtomicU64,
    /// How many benchmark clients believe they hold the lock: more than `max` is a violation.
    holders: AtomicUsize,
    violations: AtomicUsize,
    /// The most holders at once.
    peak: AtomicUsize,
    /// `None` for the lock, `Some(max)` for permits of a semaphore of `max`.
    permits: Option<u32>,
}

struct ClientStats {
    grants: u64,
    waits: Recorder,
}

pub(super) async fn run(target: &dyn Target, plan: &Plan, clients: usize) -> Res<HotLevel> {
    let locks = try_join_all((0..clients).map(|_| target.client())).await?;
    counted(target, contend(locks, plan)).await
}

/// `scenario`'s result with the server's own count of requests per grant, where it keeps one
/// (the counts include whatever else reached the server meanwhile: renewals, sweeps, pings).
async fn counted(
    target: &dyn Target,
    scenario: impl std::future::Future<Output = Res<HotLevel>>,
) -> Res<HotLevel> {
    let before = target.server_requests().await.ok().flatten();
    let syncs_before = target.server_syncs().await.ok().flatten();
    let cpu_before = cpu_times();
    let mut level = scenario.await?;
    let cpu_after = cpu_times();
    let after = target.server_requests().await.ok().flatten();
    let syncs_after = target.server_syncs().await.ok().flatten();
    if let (Some((busy0, all0)), Some((busy1, all1))) = (cpu_before, cpu_after) {
        if all1 > all0 {
            level.cpu_busy = Some((busy1 - busy0) as f64 / (all1 - all0) as f64);
        }
    }
    if let (Some(b), Some(a)) = (before, after) {
        if level.grants > 0 && a >= b {
            level.server_requests_per_grant = Some((a - b) as f64 / level.grants as f64);
        }
    }
    if let (Some((n0, slow0)), Some((n1, slow1))) = (syncs_before, syncs_after) {
        level.server_syncs = Some((n1.saturating_sub(n0), slow1.saturating_sub(slow0)));
    }
    Ok(level)
}

/// The same with `tasks` tasks of one process sharing one client handle, as the tasks of a
/// service do: a hand-off between them can skip the server's help (each acquisition is still
/// its own owner, so they exclude each other as separate clients do).
pub(super) async fn run_one_handle(
    target: &dyn Target,
    plan: &Plan,
    tasks: usize,
) -> Res<HotLevel> {
    let lock = target.client().await?;
    counted(target, contend(vec![lock; tasks], plan)).await
}

/// Section 9's contended run: `clients` clients on a semaphore of `max` permits, releasing as
/// soon as they hold one; a violation is a grant while `max` others held. Also returns the
/// most permits held at once.
pub(crate) async fn permits(
    target: &dyn Target,
    plan: &Plan,
    clients: usize,
    max: u32,
) -> Res<(HotLevel, usize)> {
    let locks = try_join_all((0..clients).map(|_| target.client())).await?;
    contend_as(locks, plan, Some(max)).await
}

async fn contend(locks: Vec<distlock_api::SharedLock>, plan: &Plan) -> Res<HotLevel> {
    Ok(contend_as(locks, plan, None).await?.0)
}

/// A lock or a permit of `name`, waiting.
async fn take(
    lock: &distlock_api::SharedLock,
    name: &str,
    opts: &LockOptions,
    permits: Option<u32>,
) -> Res<distlock_api::LockGuard> {
    Ok(match permits {
        None => lock.lock_with(name, opts).await?,
        Some(max) => lock.permit(name, max, opts).await?,
    })
}

async fn contend_as(
    locks: Vec<distlock_api::SharedLock>,
    plan: &Plan,
    permits: Option<u32>,
) -> Res<(HotLevel, usize)> {
    let clients = locks.len();
    let name = unique_name(if permits.is_some() { "permits" } else { "hot" });
    // Steady state, as in every other scenario: the name's server-side state (a counter
    // document, a container node) exists before the contenders arrive.
    if let Some(first) = locks.first() {
        let opts = LockOptions::new().wait(ACQUIRE_WAIT);
        match permits {
            None => lock_cycle(first, &name, &opts).await?,
            Some(_) => {
                take(first, &name, &opts, permits).await?.release().await?;
            }
        }
    }
    let shared = Arc::new(Shared {
        name,
        opts: LockOptions::new().wait(ACQUIRE_WAIT),
        stop: AtomicBool::new(false),
        start: Barrier::new(clients + 1),
        released_at: Mutex::new(None),
        handoff: Mutex::new(Recorder::new()),
        release: Mutex::new(Recorder::new()),
        self_regrants: AtomicU64::new(0),
        holders: AtomicUsize::new(0),
        violations: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
        permits,
    });
    let max = permits.map_or(1, |m| m as usize);
    let tasks: Vec<_> = locks
        .into_iter()
        .enumerate()
        .map(|(me, lock)| {
            let s = shared.clone();
            tokio::spawn(async move {
                s.start.wait().await;
                let mut stats = ClientStats {
                    grants: 0,
                    waits: Recorder::new(),
                };
                while !s.stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let guard = take(&lock, &s.name, &s.opts, s.permits).await?;
                    let granted = Instant::now();
                    let others = s.holders.fetch_add(1, Ordering::SeqCst);
                    if others >= max {
                        s.violations.fetch_add(1, Ordering::SeqCst);
                    }
                    s.peak.fetch_max(others + 1, Ordering::SeqCst);
                    stats.waits.record(granted - asked);
                    stats.grants += 1;
                    let released = lock_ok(&s.released_at).take();
                    if let Some((released, releaser)) = released {
                        lock_ok(&s.handoff).record(granted - released);
                        if releaser == me {
                            s.self_regrants.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    s.holders.fetch_sub(1, Ordering::SeqCst);
                    let releasing = Instant::now();
                    *lock_ok(&s.released_at) = Some((releasing, me));
                    guard.release().await?;
                    lock_ok(&s.release).record(releasing.elapsed());
                    // See independent.rs: in-memory futures never yield by themselves.
                    tokio::task::coop::consume_budget().await;
                }
                Res::Ok(stats)
            })
        })
        .collect();
    shared.start.wait().await;
    let began = Instant::now();
    tokio::time::sleep(plan.hot_for).await;
    shared.stop.store(true, Ordering::Relaxed);
    let mut record = HotRecord::default();
    for task in tasks {
        let stats = task.await??;
        record.wait.merge(&stats.waits);
        record.grants.push(stats.grants);
    }
    record.elapsed = began.elapsed();
    record.handoff = lock_ok(&shared.handoff).clone();
    record.release = lock_ok(&shared.release).clone();
    record.self_regrants = shared.self_regrants.load(Ordering::Relaxed);
    record.violations = shared.violations.load(Ordering::SeqCst) as u64;
    record.check()?;
    Ok((record.summary(), shared.peak.load(Ordering::SeqCst)))
}

/// These mutexes guard plain values updated in one step; a poisoned one is still consistent.
fn lock_ok<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The machine's CPU time so far, busy and in all, in clock ticks summed over its CPUs (the
/// first line of Linux's `/proc/stat`: idle and iowait count as not busy); `None` elsewhere.
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is counted in user already).
    let all: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some((all.saturating_sub(idle), all))
}
