//! The in-memory backend's guards, which its store looks after instead of the watchdog: kept
//! leases, the lost signal straight from the store, reentrant holds mixing kept and fixed
//! leases, and a release future dropped unpolled.

use std::time::{Duration, Instant};

use distlock_api::{DistributedLock, LockExt, LockName, LockOptions, LostReason};

mod support;

use support::{runtime, two_clients};

#[test]
fn a_kept_lease_outlives_many_ttls_with_no_watchdog_and_no_renewal() {
    runtime().block_on(async {
        let (_store, a, b) = two_clients();
        let ttl = Duration::from_millis(50);
        let g = a
            .try_lock_with("kept", &LockOptions::new().watchdog_ttl(ttl))
            .await
            .unwrap()
            .expect("free");
        assert_eq!(a.core().guards_watched(), 0, "enrolled with the watchdog");
        let first_until = g.safe_until().expect("leased");
        tokio::time::sleep(ttl * 5).await;
        assert_eq!(g.lost_reason(), None);
        assert!(
            b.try_lock("kept").await.unwrap().is_none(),
            "free while kept"
        );
        let info = b.holder("kept").await.unwrap().expect("held");
        assert_eq!(info.owner, *g.owner());
        assert_eq!(info.owner.label(), a.core().owner().label());
        assert_eq!(
            info.remaining,
            Some(ttl),
            "a kept lease always has a full lease left"
        );
        let until = g.safe_until().unwrap();
        assert!(
            until > first_until + ttl * 4,
            "{until:?} vs {first_until:?}"
        );
        assert!(until <= Instant::now() + ttl);
        assert!(g.release().await.unwrap());
        assert_eq!(b.holder("kept").await.unwrap(), None);
    });
}

#[test]
fn removing_the_lock_fires_lost_at_once() {
    runtime().block_on(async {
        let (store, a, b) = two_clients();
        let g = a.try_lock("removed").await.unwrap().expect("free");
        let lost = tokio::spawn(g.lost());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!lost.is_finished());
        store.remove(&LockName::new("removed").unwrap());
        // No renewal to wait for: the store itself says so.
        let why = g.lost_reason().expect("lost right after the removal");
        assert!(matches!(why, LostReason::Taken(_)), "{why:?}");
        let fired = tokio::time::timeout(Duration::from_secs(1), lost)
            .await
            .expect("lost() did not resolve")
            .unwrap();
        assert_eq!(fired, why);
        let g2 = b
            .try_lock("removed")
            .await
            .unwrap()
            .expect("free after removal");
        assert!(g2.token() > g.token());
        assert!(!g.release().await.unwrap(), "the removed grant's release");
        assert!(g2.release().await.unwrap());
    });
}

#[test]
fn a_fixed_lease_reports_expired_and_a_taker_does_not_change_that() {
    runtime().block_on(async {
        let (_store, a, b) = two_clients();
        let ttl = Duration::from_millis(40);
        let g = a
            .try_lock_with("fixed", &LockOptions::new().ttl(ttl))
            .await
            .unwrap()
            .expect("free");
        let until = g.safe_until().unwrap();
        let fired = tokio::time::timeout(Duration::from_secs(2), g.lost())
            .await
            .expect("lost() did not fire at the lease's end");
        assert_eq!(fired, LostReason::Expired);
        assert!(Instant::now() >= until);
        let g2 = b.lock("fixed", Duration::from_secs(1)).await.unwrap();
        assert_eq!(g.lost_reason(), Some(LostReason::Expired));
        assert!(!g.release().await.unwrap());
        assert!(g2.release().await.unwrap());
    });
}

#[test]
fn reentrant_holds_mixing_kept_and_fixed_leases() {
    runtime().block_on(async {
        let (_store, a, b) = two_clients();
        let kept_ttl = Duration::from_millis(300);
        let kept = a
            .try_lock_with("mixed", &LockOptions::new().watchdog_ttl(kept_ttl))
            .await
            .unwrap()
            .expect("free");
        let fixed = kept
            .reenter_with(&LockOptions::new().ttl(Duration::from_millis(50)))
            .await
            .expect("reentrant");
        assert_eq!((fixed.hold_count(), fixed.token()), (2, kept.token()));
        // The kept hold keeps the whole holder alive past the fixed hold's own lease.
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(fixed.lost_reason(), None);
        assert!(b.try_lock("mixed").await.unwrap().is_none());
        // Once the kept hold goes, the rest has the lease it was last renewed to: a full one.
        assert!(kept.release().await.unwrap());
        let left = b
            .holder("mixed")
            .await
            .unwrap()
            .expect("still held")
            .remaining;
        let left = left.expect("leased");
        assert!(
            left > Duration::from_millis(200) && left <= kept_ttl,
            "{left:?} left"
        );
        tokio::time::sleep(kept_ttl + Duration::from_millis(50)).await;
        assert_eq!(fixed.lost_reason(), Some(LostReason::Expired));
        assert_eq!(b.holder("mixed").await.unwrap(), None);
        assert!(!fixed.release().await.unwrap());
    });
}

#[test]
fn a_waiter_granted_from_the_queue_gets_a_kept_lease() {
    runtime().block_on(async {
        let (store, a, b) = two_clients();
        let ttl = Duration::from_millis(60);
        let opts = LockOptions::new()
            .watchdog_ttl(ttl)
            .wait(Duration::from_secs(5));
        let g = a.lock_with("queued", &opts).await.unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            let opts = opts.clone();
            async move { b.lock_with("queued", &opts).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(store.waiters_for(&LockName::new("queued").unwrap()), 1);
        assert!(g.release().await.unwrap());
        let g2 = waiter.await.unwrap().unwrap();
        tokio::time::sleep(ttl * 4).await;
        assert_eq!(
            g2.lost_reason(),
            None,
            "a queued grant's lease was not kept"
        );
        let info = a.holder("queued").await.unwrap().expect("held");
        assert_eq!(info.owner, *g2.owner());
        assert_eq!(info.owner.label(), b.core().owner().label());
        assert!(g2.release().await.unwrap());
    });
}

#[test]
fn a_release_dropped_unpolled_releases_as_a_dropped_guard() {
    runtime().block_on(async {
        let (_store, a, b) = two_clients();
        let g = a.try_lock("unpolled").await.unwrap().expect("free");
        drop(g.release());
        let freed = async {
            while b.holder("unpolled").await.unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), freed)
            .await
            .expect("the dropped release future's guard released the lock");
    });
}

#[test]
fn each_new_holder_of_a_name_is_its_own_owner_whoever_held_it_last() {
    runtime().block_on(async {
        let (_store, a, b) = two_clients();
        for (taker, other) in [(&a, &b), (&a, &b), (&b, &a), (&a, &b), (&b, &a)] {
            let g = taker.try_lock("turns").await.unwrap().expect("free");
            assert_eq!(g.owner().label(), taker.core().owner().label());
            let info = other.holder("turns").await.unwrap().expect("held");
            assert_eq!(info.owner, *g.owner(), "the store's holder");
            assert!(other.try_lock("turns").await.unwrap().is_none());
            // The taker asking again is another acquisition: excluded; re-entry is explicit.
            assert!(taker.try_lock("turns").await.unwrap().is_none());
            let again = g.reenter().await.expect("reentrant");
            assert_eq!(again.hold_count(), 2);
            assert!(again.release().await.unwrap());
            assert!(g.release().await.unwrap(), "released by its own owner");
            assert_eq!(other.holder("turns").await.unwrap(), None);
        }
    });
}
