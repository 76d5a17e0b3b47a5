//! rslock, in this process: the same three measures the harness programs take, recorded the
//! same way (one monotonic clock, hand-off from the release call to the next grant) into the
//! same [`HotRecord`], so that it goes through the same summary as every other library.
//!
//! rslock is used as its documentation shows, with its defaults: `LockManager::acquire`, which
//! loops over `lock` (three tries, a random 0–200 ms pause between them) until it holds the
//! lock, and `unlock`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rslock::LockManager;
use tokio::sync::Barrier;

use super::protocol::Hello;
use super::Driver;
use crate::error::Res;
use crate::run::contention::HotRecord;
use crate::run::scenarios::Measured;
use crate::run::stats::Recorder;

/// rslock's lease per lock; long enough that nothing expires mid-measurement.
const TTL: Duration = Duration::from_secs(30);

pub(crate) struct Rslock {
    url: String,
    /// The cycle's manager, kept across slices as an application keeps its client.
    cycle: LockManager,
    version: String,
}

impl Rslock {
    pub(crate) fn new(url: &str, version: String) -> Self {
        Self {
            url: url.to_string(),
            cycle: LockManager::new(vec![url.to_string()]),
            version,
        }
    }

    fn manager(&self) -> LockManager {
        LockManager::new(vec![self.url.clone()])
    }
}

async fn cycle_once(manager: &LockManager, name: &str) -> Res<()> {
    let lock = manager
        .acquire_no_guard(name, TTL)
        .await
        .map_err(|e| format!("rslock: {e}"))?;
    manager.unlock(&lock).await;
    Ok(())
}

/// When the last holder called release, and which contender it was.
#[derive(Default)]
struct Handoff {
    last: Option<(Instant, usize)>,
    rec: Recorder,
    self_regrants: u64,
}

#[async_trait]
impl Driver for Rslock {
    fn hello(&self) -> Hello {
        Hello {
            library: "rslock".into(),
            version: self.version.clone(),
            runtime: "Rust, Tokio (this process)".into(),
            contenders: "Tokio tasks, one LockManager (connection) each".into(),
        }
    }

    async fn cycle(&mut self, name: &str, run: Duration) -> Res<Measured> {
        let mut latencies = Recorder::new();
        let start = Instant::now();
        loop {
            let t = Instant::now();
            cycle_once(&self.cycle, name).await?;
            let now = Instant::now();
            latencies.record(now - t);
            if now - start >= run {
                return Ok(Measured {
                    latencies,
                    busy: now - start,
                });
            }
        }
    }

    async fn hot(&mut self, name: &str, clients: usize, run: Duration) -> Res<HotRecord> {
        let stop = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(clients + 1));
        let handoff = Arc::new(Mutex::new(Handoff::default()));
        let holders = Arc::new(AtomicUsize::new(0));
        let violations = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..clients)
            .map(|me| {
                let manager = self.manager();
                let (name, stop, start) = (name.to_string(), stop.clone(), start.clone());
                let (handoff, holders, violations) =
                    (handoff.clone(), holders.clone(), violations.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    let (mut grants, mut waits) = (0u64, Recorder::new());
                    while !stop.load(Ordering::Relaxed) {
                        let asked = Instant::now();
                        let lock = manager
                            .acquire_no_guard(name.as_str(), TTL)
                            .await
                            .map_err(|e| format!("rslock: {e}"))?;
                        let granted = Instant::now();
                        if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        grants += 1;
                        waits.record(granted - asked);
                        {
                            let mut h = handoff.lock().unwrap_or_else(|p| p.into_inner());
                            if let Some((released, releaser)) = h.last.take() {
                                h.rec.record(granted - released);
                                h.self_regrants += u64::from(releaser == me);
                            }
                        }
                        holders.fetch_sub(1, Ordering::SeqCst);
                        handoff.lock().unwrap_or_else(|p| p.into_inner()).last =
                            Some((Instant::now(), me));
                        manager.unlock(&lock).await;
                    }
                    Res::Ok((grants, waits))
                })
            })
            .collect();
        start.wait().await;
        let began = Instant::now();
        tokio::time::sleep(run).await;
        stop.store(true, Ordering::Relaxed);
        let mut record = HotRecord::default();
        for task in tasks {
            let (grants, waits) = task.await??;
            record.grants.push(grants);
            record.wait.merge(&waits);
        }
        record.elapsed = began.elapsed();
        let h = handoff.lock().unwrap_or_else(|p| p.into_inner());
        record.handoff = h.rec.clone();
        record.self_regrants = h.self_regrants;
        record.violations = violations.load(Ordering::SeqCst);
        record.check()?;
        Ok(record)
    }

    async fn wake(
        &mut self,
        prefix: &str,
        samples: u32,
        (lo, hi): (Duration, Duration),
    ) -> Res<Recorder> {
        let (holder, waiter) = (self.manager(), self.manager());
        let mut rec = Recorder::new();
        for s in 0..samples {
            let name = format!("{prefix}-{s}");
            let held = holder
                .acquire_no_guard(name.as_str(), TTL)
                .await
                .map_err(|e| format!("rslock: {e}"))?;
            let task = {
                let (waiter, name) = (waiter.clone(), name.clone());
                tokio::spawn(async move {
                    let lock = waiter
                        .acquire_no_guard(name.as_str(), TTL)
                        .await
                        .map_err(|e| format!("rslock: {e}"))?;
                    let granted = Instant::now();
                    waiter.unlock(&lock).await;
                    Res::Ok(granted)
                })
            };
            tokio::time::sleep(lo + hi.saturating_sub(lo).mul_f64(fastrand::f64())).await;
            if task.is_finished() {
                return Err(format!("{name}: the waiter got the lock while it was held").into());
            }
            let released = Instant::now();
            holder.unlock(&held).await;
            let granted = task.await??;
            rec.record(granted.saturating_duration_since(released));
        }
        Ok(rec)
    }

    async fn close(self: Box<Self>) {}
}
