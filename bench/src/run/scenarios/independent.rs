//! Scenario 3: N clients, each cycling its own name. Nothing contends in the lock sense, so
//! this shows how the backend and its server scale with concurrent independent work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use distlock_api::LockOptions;
use futures::future::try_join_all;
use tokio::sync::Barrier;

use super::{lock_cycle, unique_name, ACQUIRE_WAIT};
use crate::error::Res;
use crate::model::IndependentLevel;
use crate::run::plan::Plan;
use crate::run::stats::{per_sec, Recorder};
use crate::run::targets::Target;

pub(super) async fn run(target: &dyn Target, plan: &Plan, clients: usize) -> Res<IndependentLevel> {
    // Separate handles (connections, sessions), as separate processes would have.
    let locks = try_join_all((0..clients).map(|_| target.client())).await?;
    let opts = LockOptions::new().wait(ACQUIRE_WAIT);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(clients + 1));
    let tasks: Vec<_> = locks
        .into_iter()
        .map(|lock| {
            let (opts, stop, start) = (opts.clone(), stop.clone(), start.clone());
            let name = unique_name("independent");
            tokio::spawn(async move {
                // One unmeasured cycle: connection set-up, statement preparation.
                let warm = lock_cycle(&lock, &name, &opts).await;
                start.wait().await;
                warm?;
                let mut rec = Recorder::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    lock_cycle(&lock, &name, &opts).await?;
                    rec.record(t.elapsed());
                    // Always-ready futures (in-memory) would otherwise hog a worker and starve
                    // the timer that ends the level.
                    tokio::task::coop::consume_budget().await;
                }
                Res::Ok(rec)
            })
        })
        .collect();
    start.wait().await;
    let began = Instant::now();
    tokio::time::sleep(plan.independent_for).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Recorder::new();
    for task in tasks {
        all.merge(&task.await??);
    }
    let elapsed = began.elapsed();
    Ok(IndependentLevel {
        clients,
        cycles: all.len(),
        cycles_per_sec: per_sec(all.len(), elapsed),
        latency: all.summary(),
    })
}
