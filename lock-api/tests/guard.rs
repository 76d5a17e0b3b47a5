//! Guard behaviour that needs no server: drop paths, the lost signal after release.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{DistributedLock, LockExt, LockOptions, LostReason, MemoryStore};

mod support;

use support::{runtime, two_clients};

#[test]
fn guard_dropped_outside_a_runtime_leaves_the_lease_to_expire() {
    let store = MemoryStore::new();
    let (a, b) = (Remote::new(&store), Arc::new(store.client()));
    let ttl = Duration::from_millis(300);
    let guard = runtime().block_on(async {
        a.try_lock_with("offline", &LockOptions::new().ttl(ttl))
            .await
            .unwrap()
            .expect("free")
    });
    // No runtime here, and the one the guard was made on has shut down: dropping must neither
    // block nor panic, and there is nothing left to release on.
    drop(guard);
    runtime().block_on(async {
        let info = b
            .holder("offline")
            .await
            .unwrap()
            .expect("still held by the lease");
        assert_eq!(info.owner.label(), a.core().owner().label());
        let g = b
            .lock("offline", Duration::from_secs(5))
            .await
            .expect("lease expired and freed the lock");
        assert!(g.release().await.unwrap());
    });
}

#[test]
fn in_process_guard_dropped_outside_a_runtime_is_released_on_the_clients_runtime() {
    let (_store, a, b) = two_clients();
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let rt = runtime();
    let (guard, token) = rt.block_on(async {
        let g = a
            .try_lock_with("local", &opts)
            .await
            .unwrap()
            .expect("free");
        let token = g.token();
        (g, token)
    });
    // No runtime on this thread: the release goes to the runtime the guard was made on, as on
    // every backend.
    drop(guard);
    rt.block_on(async {
        let freed = async {
            while b.holder("local").await.unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), freed)
            .await
            .expect("released by the drop, not left to its 60 s lease");
        let g = b
            .try_lock_with("local", &opts)
            .await
            .unwrap()
            .expect("free");
        assert!(g.token() > token);
        assert!(g.release().await.unwrap());
        assert_eq!(a.core().guards_watched(), 0);
    });
}

#[test]
fn guard_dropped_inside_a_runtime_releases_in_the_background() {
    let store = MemoryStore::new();
    let (a, b) = (Remote::new(&store), Arc::new(store.client()));
    runtime().block_on(async {
        let g = a
            .try_lock_with("bg", &LockOptions::new().ttl(Duration::from_secs(60)))
            .await
            .unwrap()
            .expect("free");
        drop(g);
        let g2 = b
            .lock("bg", Duration::from_secs(2))
            .await
            .expect("released on drop");
        assert!(g2.release().await.unwrap());
    });
}

#[test]
fn lost_future_outliving_its_released_guard_resolves_to_released() {
    runtime().block_on(async {
        let store = MemoryStore::new();
        let local: Arc<dyn DistributedLock> = Arc::new(store.client());
        let remote: Arc<dyn DistributedLock> = Remote::new(&store);
        for (path, a) in [("in-process", local), ("watchdog", remote)] {
            for released in [true, false] {
                let g = a.try_lock("watched").await.unwrap().expect("free");
                let lost = tokio::spawn(g.lost());
                tokio::time::sleep(Duration::from_millis(20)).await;
                assert!(!lost.is_finished(), "{path}: fired while held");
                if released {
                    assert!(g.release().await.unwrap());
                } else {
                    drop(g);
                }
                let reason = tokio::time::timeout(Duration::from_secs(2), lost)
                    .await
                    .unwrap_or_else(|_| panic!("{path}: lost() never resolved"))
                    .unwrap();
                assert_eq!(reason, LostReason::Released, "{path}, released {released}");
                // The drop's release may run in the background on the watchdog path.
                let g = a.lock("watched", Duration::from_secs(2)).await.unwrap();
                assert!(g.release().await.unwrap());
            }
        }
    });
}

#[test]
fn watchdog_stops_renewing_a_released_guard() {
    runtime().block_on(async {
        let a = Remote::new(&MemoryStore::new());
        let opts = LockOptions::new().watchdog_ttl(Duration::from_millis(100));
        let g1 = a.try_lock_with("w1", &opts).await.unwrap().unwrap();
        let g2 = a.try_lock_with("w2", &opts).await.unwrap().unwrap();
        assert_eq!(a.core().guards_watched(), 2);
        assert!(g1.release().await.unwrap());
        assert_eq!(a.core().guards_watched(), 1);
        drop(g2);
        assert_eq!(a.core().guards_watched(), 0);
    });
}

/// A renewal answered after the guard's safe-until passed does not bring the guard back: it
/// said it was lost (`is_lost()` saw safe-until in the past) and stays lost, as `lost()`
/// promises, even when the renewal's answer reaches the watchdog before its own check of that
/// safe-until does (the answer's task holds the only worker thread until after it).
#[test]
fn a_renewal_answered_after_safe_until_passed_leaves_the_guard_lost() {
    runtime().block_on(async {
        let ttl = Duration::from_millis(300);
        // The first renewal is due at TTL/3 (100 ms); safe-until is about 295 ms in. The
        // renewal is applied at about 250 ms and its answer held, with the worker, until
        // about 400 ms.
        let a = Remote::stalling(
            &MemoryStore::new(),
            Duration::from_millis(150),
            Duration::from_millis(150),
        );
        let g = a
            .try_lock_with("late", &LockOptions::new().watchdog_ttl(ttl))
            .await
            .unwrap()
            .unwrap();
        let first_until = g.safe_until().unwrap();
        tokio::time::sleep_until((first_until + Duration::from_millis(250)).into()).await;
        assert!(g.is_lost(), "safe-until passed without a renewal in time");
        assert_eq!(g.lost_reason(), Some(LostReason::Expired));
        assert!(
            g.safe_until().unwrap() <= first_until,
            "the late renewal moved safe-until on: {:?} after {:?}",
            g.safe_until(),
            first_until
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(g.is_lost(), "lost, then held again");
        drop(g);
    });
}

/// A lease whose first renewal is due beyond the watchdog's two-tick horizon is not queued at
/// enrolment; a later sweep must still bring it in and renew it on time.
#[test]
fn watchdog_renews_a_lease_whose_renewal_is_beyond_the_first_sweep() {
    runtime().block_on(async {
        let a = Remote::new(&MemoryStore::new());
        // Starts the watchdog task, so the next guard is enrolled against a running sweep.
        let warm = a.try_lock("far-warm").await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let ttl = Duration::from_secs(9);
        let g = a
            .try_lock_with("far", &LockOptions::new().watchdog_ttl(ttl))
            .await
            .unwrap()
            .unwrap();
        let first_until = g.safe_until().unwrap();
        // Renewal is due at TTL/3 = 3 s; without it, 3.8 s in, 5.2 s of lease would be left.
        tokio::time::sleep(Duration::from_millis(3800)).await;
        let left = a.holder("far").await.unwrap().unwrap().remaining.unwrap();
        assert!(
            left > Duration::from_millis(7500),
            "not renewed: {left:?} left"
        );
        assert!(
            g.safe_until().unwrap() > first_until,
            "safe-until not moved"
        );
        assert!(!g.is_lost());
        assert!(g.release().await.unwrap());
        assert!(warm.release().await.unwrap());
        assert_eq!(a.core().guards_watched(), 0);
    });
}

/// A memory client seen as a networked backend would be: every call goes through the async
/// primitives, with no in-process shortcut, so the drop tests reach the generic paths.
struct Remote {
    inner: distlock_api::MemoryLock,
    /// Each renewal is sent after the first span, and its answer held for the second, holding
    /// the thread that runs it (an overloaded machine: nothing else on that thread runs).
    stall: Option<(Duration, Duration)>,
}

impl Remote {
    fn new(store: &MemoryStore) -> Arc<Self> {
        Self::with_stall(store, None)
    }

    fn stalling(store: &MemoryStore, wait: Duration, block: Duration) -> Arc<Self> {
        Self::with_stall(store, Some((wait, block)))
    }

    fn with_stall(store: &MemoryStore, stall: Option<(Duration, Duration)>) -> Arc<Self> {
        Arc::new(Remote {
            inner: store.client(),
            stall,
        })
    }

    /// Runs `renewal` after the stall's wait, and holds the thread for the stall's block once
    /// the server has applied it: the answer is late, the renewal not.
    async fn stalled<T>(&self, renewal: impl std::future::Future<Output = T>) -> T {
        let Some((wait, block)) = self.stall else {
            return renewal.await;
        };
        tokio::time::sleep(wait).await;
        let answer = renewal.await;
        std::thread::sleep(block);
        answer
    }
}

#[distlock_api::backend::async_trait]
impl DistributedLock for Remote {
    fn profile(&self) -> distlock_api::Profile {
        distlock_api::Profile::new(self.inner.capabilities())
    }

    async fn force_release(
        &self,
        name: &distlock_api::LockName,
        token: distlock_api::FencingToken,
    ) -> distlock_api::Result<bool> {
        distlock_api::backend::force_release_by_releases(self, name, token).await
    }
    async fn give_back(
        &self,
        surplus: &distlock_api::backend::Surplus,
    ) -> distlock_api::Result<bool> {
        distlock_api::backend::give_back_by_release(self, surplus).await
    }
    fn core(&self) -> &distlock_api::backend::ClientCore {
        self.inner.core()
    }
    async fn attempt(
        &self,
        req: &distlock_api::backend::AcquireRequest,
    ) -> distlock_api::Result<distlock_api::backend::wait::Attempt> {
        self.inner.attempt(req).await
    }
    async fn release(&self, grant: &distlock_api::Grant) -> distlock_api::Result<bool> {
        self.inner.release(grant).await
    }
    async fn renew(
        &self,
        grant: &distlock_api::Grant,
        ttl: Duration,
    ) -> distlock_api::Result<Duration> {
        self.stalled(self.inner.renew(grant, ttl)).await
    }
    async fn proclaim(
        &self,
        grant: &distlock_api::Grant,
        value: &str,
    ) -> distlock_api::Result<bool> {
        self.inner.proclaim(grant, value).await
    }
    async fn inspect(
        &self,
        name: &distlock_api::LockName,
    ) -> distlock_api::Result<Option<distlock_api::LockInfo>> {
        self.inner.inspect(name).await
    }
    fn capabilities(&self) -> distlock_api::Capabilities {
        self.inner.capabilities()
    }
    async fn subscribe(
        &self,
        name: &distlock_api::LockName,
    ) -> distlock_api::Result<Box<dyn distlock_api::backend::wait::Notices>> {
        self.inner.subscribe(name).await
    }
    async fn acquire(
        &self,
        req: &distlock_api::backend::AcquireRequest,
        wait: std::time::Duration,
    ) -> distlock_api::Result<distlock_api::Grant> {
        self.inner.acquire(req, wait).await
    }
    async fn hand_over(
        &self,
        from: &distlock_api::Grant,
        to: &distlock_api::backend::AcquireRequest,
    ) -> distlock_api::Result<distlock_api::backend::wait::HandOver> {
        self.inner.hand_over(from, to).await
    }
    /// The watchdog's, not the wrapped backend's: this wrapper's guards take the networked
    /// backends' path.
    fn keeper(&self) -> &dyn distlock_api::backend::LeaseKeeper {
        self.core().watchdog_keeper()
    }
    async fn renew_many(
        &self,
        grants: &[(distlock_api::Grant, std::time::Duration)],
    ) -> Vec<distlock_api::Result<std::time::Duration>> {
        self.stalled(self.inner.renew_many(grants)).await
    }
    async fn list(
        &self,
        prefix: &str,
    ) -> distlock_api::Result<Vec<(distlock_api::LockName, distlock_api::LockInfo)>> {
        self.inner.list(prefix).await
    }
}

/// A memory client that confirms grants in batches of up to `BATCH`, recording each batch's
/// size, and answers "lost" for names ending in `-gone`.
struct Batching {
    inner: distlock_api::MemoryLock,
    batch: usize,
    batches: std::sync::Mutex<Vec<usize>>,
}

const BATCH: usize = 4;

impl Batching {
    fn new() -> Arc<Self> {
        Self::with_batch(BATCH)
    }

    fn with_batch(batch: usize) -> Arc<Self> {
        Arc::new(Batching {
            inner: MemoryStore::new().client(),
            batch,
            batches: std::sync::Mutex::new(Vec::new()),
        })
    }
}

#[distlock_api::backend::async_trait]
impl DistributedLock for Batching {
    async fn force_release(
        &self,
        name: &distlock_api::LockName,
        token: distlock_api::FencingToken,
    ) -> distlock_api::Result<bool> {
        distlock_api::backend::force_release_by_releases(self, name, token).await
    }
    async fn give_back(
        &self,
        surplus: &distlock_api::backend::Surplus,
    ) -> distlock_api::Result<bool> {
        distlock_api::backend::give_back_by_release(self, surplus).await
    }
    fn profile(&self) -> distlock_api::Profile {
        distlock_api::Profile::new(self.inner.capabilities()).renew_batch(self.batch)
    }
    fn core(&self) -> &distlock_api::backend::ClientCore {
        self.inner.core()
    }
    async fn attempt(
        &self,
        req: &distlock_api::backend::AcquireRequest,
    ) -> distlock_api::Result<distlock_api::backend::wait::Attempt> {
        self.inner.attempt(req).await
    }
    async fn release(&self, grant: &distlock_api::Grant) -> distlock_api::Result<bool> {
        self.inner.release(grant).await
    }
    async fn renew(
        &self,
        grant: &distlock_api::Grant,
        ttl: Duration,
    ) -> distlock_api::Result<Duration> {
        self.renew_many(&[(grant.clone(), ttl)])
            .await
            .pop()
            .expect("one result")
    }
    async fn renew_many(
        &self,
        grants: &[(distlock_api::Grant, Duration)],
    ) -> Vec<distlock_api::Result<Duration>> {
        self.batches.lock().unwrap().push(grants.len());
        let mut out = Vec::new();
        for (g, ttl) in grants {
            out.push(if g.name.as_str().ends_with("-gone") {
                Err(distlock_api::Error::new(
                    distlock_api::ErrorKind::Lost,
                    "gone behind the holder's back",
                ))
            } else {
                self.inner.renew(g, *ttl).await
            });
        }
        out
    }
    async fn proclaim(
        &self,
        grant: &distlock_api::Grant,
        value: &str,
    ) -> distlock_api::Result<bool> {
        self.inner.proclaim(grant, value).await
    }
    async fn inspect(
        &self,
        name: &distlock_api::LockName,
    ) -> distlock_api::Result<Option<distlock_api::LockInfo>> {
        self.inner.inspect(name).await
    }
    fn capabilities(&self) -> distlock_api::Capabilities {
        self.inner.capabilities()
    }
    async fn subscribe(
        &self,
        name: &distlock_api::LockName,
    ) -> distlock_api::Result<Box<dyn distlock_api::backend::wait::Notices>> {
        self.inner.subscribe(name).await
    }
    async fn acquire(
        &self,
        req: &distlock_api::backend::AcquireRequest,
        wait: std::time::Duration,
    ) -> distlock_api::Result<distlock_api::Grant> {
        self.inner.acquire(req, wait).await
    }
    async fn hand_over(
        &self,
        from: &distlock_api::Grant,
        to: &distlock_api::backend::AcquireRequest,
    ) -> distlock_api::Result<distlock_api::backend::wait::HandOver> {
        self.inner.hand_over(from, to).await
    }
    /// The watchdog's, not the wrapped backend's: this wrapper's guards take the networked
    /// backends' path.
    fn keeper(&self) -> &dyn distlock_api::backend::LeaseKeeper {
        self.core().watchdog_keeper()
    }
    async fn list(
        &self,
        prefix: &str,
    ) -> distlock_api::Result<Vec<(distlock_api::LockName, distlock_api::LockInfo)>> {
        self.inner.list(prefix).await
    }
}

/// Grants that come due together go to `renew_many` in batches no larger than the backend's
/// `renew_batch`, and each grant's own result decides its guard: one lost grant in a batch
/// fires only its own guard, the rest stay held past their first lease.
#[test]
fn watchdog_renews_grants_due_together_in_batches_and_settles_each() {
    runtime().block_on(async {
        let b = Batching::new();
        let ttl = Duration::from_millis(600);
        let opts = LockOptions::new().watchdog_ttl(ttl);
        let mut guards = Vec::new();
        for i in 0..10 {
            let name = if i == 3 {
                "batch-3-gone".to_string()
            } else {
                format!("batch-{i}")
            };
            guards.push(b.try_lock_with(&name, &opts).await.unwrap().unwrap());
        }
        // Past the first lease: only renewals keep these held.
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        for g in &guards {
            let gone = g.name().as_str().ends_with("-gone");
            assert_eq!(g.is_lost(), gone, "{}: {:?}", g.name(), g.lost_reason());
            if gone {
                assert!(
                    matches!(g.lost_reason(), Some(LostReason::Taken(_))),
                    "{:?}",
                    g.lost_reason()
                );
            } else {
                let left = b.holder(g.name().as_str()).await.unwrap().unwrap();
                assert!(left.remaining.unwrap() > Duration::ZERO);
            }
        }
        let batches = b.batches.lock().unwrap().clone();
        assert!(
            batches.iter().all(|&n| (1..=BATCH).contains(&n)),
            "{batches:?}"
        );
        assert!(
            batches.iter().any(|&n| n > 1),
            "ten grants due together never shared a request: {batches:?}"
        );
        // The first wave confirms all ten; the lost one is never renewed again.
        assert!(batches.iter().sum::<usize>() >= 10, "{batches:?}");
        for g in guards {
            let gone = g.name().as_str().ends_with("-gone");
            assert_eq!(g.release().await.unwrap(), !gone);
        }
        assert_eq!(b.core().guards_watched(), 0);
    });
}

/// A backend's batch size is honoured as it is, beyond the 64 renewal requests a client keeps in
/// flight: 200 grants due together go out in batches larger than 64 (no more than the backend's
/// 300), and every guard stays held past its first lease.
#[test]
fn watchdog_batches_as_many_grants_as_the_backend_confirms_at_once() {
    runtime().block_on(async {
        let b = Batching::with_batch(300);
        let ttl = Duration::from_millis(600);
        let opts = LockOptions::new().watchdog_ttl(ttl);
        let mut guards = Vec::new();
        for i in 0..200 {
            guards.push(
                b.try_lock_with(&format!("wide-{i}"), &opts)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        for g in &guards {
            assert!(!g.is_lost(), "{}: {:?}", g.name(), g.lost_reason());
        }
        let batches = b.batches.lock().unwrap().clone();
        assert!(
            batches.iter().all(|&n| (1..=300).contains(&n)),
            "{batches:?}"
        );
        assert!(
            batches.iter().any(|&n| n > 64),
            "200 grants due together were split into batches of 64 or fewer: {batches:?}"
        );
        for g in guards {
            assert!(g.release().await.unwrap());
        }
        assert_eq!(b.core().guards_watched(), 0);
    });
}

/// Renewals due a little apart are brought forward to share a batch: locks taken 20 ms apart
/// (so never due at the same instant) still reach `renew_many` together, and stay held.
#[test]
fn watchdog_coalesces_renewals_due_within_a_short_window() {
    runtime().block_on(async {
        let b = Batching::new();
        let ttl = Duration::from_millis(900);
        let opts = LockOptions::new().watchdog_ttl(ttl);
        let mut guards = Vec::new();
        for i in 0..8 {
            guards.push(
                b.try_lock_with(&format!("spread-{i}"), &opts)
                    .await
                    .unwrap()
                    .unwrap(),
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(ttl).await;
        let batches = b.batches.lock().unwrap().clone();
        assert!(
            batches.iter().any(|&n| n > 1),
            "renewals 20 ms apart never shared a request: {batches:?}"
        );
        for g in guards {
            assert!(!g.is_lost(), "{:?}", g.lost_reason());
            assert!(g.release().await.unwrap());
        }
    });
}
