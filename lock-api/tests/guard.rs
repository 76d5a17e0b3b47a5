//! Guard behaviour that needs no server: drop paths, the lost signal after release.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{DistributedLock, LockExt, LockOptions, LostReason, MemoryStore};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn guard_dropped_outside_a_runtime_leaves_the_lease_to_expire() {
    let store = MemoryStore::new();
    let (a, b) = (Arc::new(store.client()), Arc::new(store.client()));
    let ttl = Duration::from_millis(300);
    let guard = runtime().block_on(async {
        a.try_lock_with("offline", &LockOptions::new().ttl(ttl))
            .await
            .unwrap()
            .expect("free")
    });
    // No runtime here: dropping must neither block nor panic, and cannot release.
    drop(guard);
    runtime().block_on(async {
        let info = b
            .holder("offline")
            .await
            .unwrap()
            .expect("still held by the lease");
        assert_eq!(&info.owner, a.core().owner());
        let g = b
            .lock("offline", Duration::from_secs(5))
            .await
            .expect("lease expired and freed the lock");
        assert!(g.release().await.unwrap());
    });
}

#[test]
fn guard_dropped_inside_a_runtime_releases_in_the_background() {
    let store = MemoryStore::new();
    let (a, b) = (Arc::new(store.client()), Arc::new(store.client()));
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
        let a = Arc::new(MemoryStore::new().client());
        let g = a.try_lock("watched").await.unwrap().expect("free");
        let lost = tokio::spawn(g.lost());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!lost.is_finished());
        assert!(g.release().await.unwrap());
        let reason = tokio::time::timeout(Duration::from_secs(2), lost)
            .await
            .expect("lost() never resolved after release")
            .unwrap();
        assert_eq!(reason, LostReason::Released);
    });
}

#[test]
fn watchdog_stops_renewing_a_released_guard() {
    runtime().block_on(async {
        let a = Arc::new(MemoryStore::new().client());
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

/// A lease whose first renewal is due beyond the watchdog's two-tick horizon is not queued at
/// enrolment; a later sweep must still bring it in and renew it on time.
#[test]
fn watchdog_renews_a_lease_whose_renewal_is_beyond_the_first_sweep() {
    runtime().block_on(async {
        let a = Arc::new(MemoryStore::new().client());
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
