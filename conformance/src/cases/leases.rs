//! Leases: fixed leases run out, `extend` and the watchdog keep them, and `lost()` fires when a lock goes.

use super::*;

pub(super) async fn fixed_lease_expires_without_renewal(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("exp");
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "held within its lease"
    );
    tokio::time::sleep(ttl + ttl / 2 + Duration::from_millis(50)).await;
    assert!(g.is_lost(), "guard past its lease still claims the lock");
    assert!(holder_of(&b, &name).await.is_none(), "lease did not expire");
    let g2 = must_lock(&b, &name).await;
    assert!(
        !g.release().await.unwrap(),
        "expired grant's release reported held"
    );
    assert_eq!(holder_of(&b, &name).await.as_ref(), Some(g2.owner()));
    assert!(g2.release().await.unwrap());
}

pub(super) async fn fixed_lease_guard_reports_lost_at_safe_until(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let c = cx.client().await;
    let sent = Instant::now();
    let g = c
        .try_lock_with(&cx.name("safe"), &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let until = g.safe_until().expect("leased");
    assert!(until <= Instant::now() + ttl, "safe-until beyond the lease");
    assert!(until > sent, "safe-until before the request");
    let reason = tokio::time::timeout(ttl * 3 + Duration::from_secs(1), g.lost())
        .await
        .expect("lost() did not fire after the fixed lease ran out");
    assert_eq!(reason, LostReason::Expired);
    assert!(Instant::now() >= until, "lost fired before safe-until");
    assert!(g.is_lost());
    assert_eq!(g.lost_reason(), Some(LostReason::Expired));
}

pub(super) async fn takeover_after_expiry_gets_a_greater_token(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("take");
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let g2 = b
        .lock(&name, ttl * 10 + Duration::from_secs(2))
        .await
        .expect("waiter takes over after the lease");
    assert!(g2.token() > g.token(), "{} !> {}", g2.token(), g.token());
    assert!(!g.release().await.unwrap());
    assert!(g2.release().await.unwrap());
}

pub(super) async fn extend_keeps_a_fixed_lease_alive(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("ext");
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let first_until = g.safe_until().unwrap();
    tokio::time::sleep(ttl / 2).await;
    g.extend(ttl * 4).await.expect("extend within the lease");
    assert!(
        g.safe_until().unwrap() > first_until,
        "safe-until not moved"
    );
    tokio::time::sleep(ttl).await; // past the original lease
    assert!(!g.is_lost());
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "extended lock was free"
    );
    assert!(g.release().await.unwrap());
}

pub(super) async fn extend_after_expiry_fails_with_lost(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let c = cx.client().await;
    let g = c
        .try_lock_with(&cx.name("late"), &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    tokio::time::sleep(ttl + ttl / 2 + Duration::from_millis(50)).await;
    let e = g.extend(ttl).await.expect_err("extended an expired lease");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert!(g.is_lost());
}

pub(super) async fn fixed_ttl_on_session_backend_is_unsupported(cx: Ctx) {
    let c = cx.client().await;
    let e = c
        .try_lock_with(
            &cx.name("fx"),
            &LockOptions::new().ttl(Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
}

pub(super) async fn watchdog_keeps_the_lock_for_several_ttls(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("wd");
    let g = a
        .try_lock_with(&name, &watchdog(ttl))
        .await
        .unwrap()
        .expect("free");
    let first_until = g.safe_until();
    for _ in 0..4 {
        tokio::time::sleep(ttl).await;
        assert!(
            !g.is_lost(),
            "watchdog let the lock go: {:?}",
            g.lost_reason()
        );
        assert!(
            b.try_lock(&name).await.unwrap().is_none(),
            "lock free while renewed"
        );
    }
    assert!(
        g.safe_until() > first_until,
        "renewals did not move safe-until"
    );
    assert!(g.release().await.unwrap());
    assert!(holder_of(&b, &name).await.is_none());
}

pub(super) async fn lost_fires_when_lock_is_removed_behind_the_holders_back(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("gone");
    let g = a
        .try_lock_with(&name, &watchdog(ttl))
        .await
        .unwrap()
        .expect("free");
    // Already waiting when the lock goes: it must be woken, not just answer when first polled.
    let lost = tokio::spawn(g.lost());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!lost.is_finished(), "lost() fired while the lock was held");
    cx.harness()
        .remove_behind_back(&LockName::new(&name).unwrap())
        .await
        .expect("remove hook");
    let reason = tokio::time::timeout(ttl * 3 + Duration::from_secs(2), lost)
        .await
        .expect("lost() did not fire after the lock was removed")
        .expect("the lost() task");
    assert!(
        matches!(
            reason,
            LostReason::Taken(_) | LostReason::Session(_) | LostReason::Expired
        ),
        "{reason:?}"
    );
    assert!(g.is_lost());
    // Someone else can take it, and the old guard's release does not touch them.
    let g2 = b.lock(&name, Duration::from_secs(10)).await.unwrap();
    assert!(
        !g.release().await.unwrap(),
        "lost guard's release reported held"
    );
    assert_eq!(holder_of(&b, &name).await.as_ref(), Some(g2.owner()));
    assert!(g2.release().await.unwrap());
}

/// Locks acquired together are renewed together (in one request where the backend batches
/// renewals); one of them removed behind the holder's back fires that guard alone, and the
/// others stay held past several leases.
pub(super) async fn one_lock_removed_among_many_fires_only_its_own_guard(cx: Ctx) {
    const LOCKS: usize = 12;
    const GONE: usize = 5;
    let ttl = cx.harness().short_ttl();
    let a = cx.client().await;
    let mut guards = Vec::new();
    for i in 0..LOCKS {
        let g = a
            .try_lock_with(&cx.name(&format!("among-{i}")), &watchdog(ttl))
            .await
            .unwrap()
            .expect("free");
        guards.push(g);
    }
    let lost = guards[GONE].lost();
    cx.harness()
        .remove_behind_back(guards[GONE].name())
        .await
        .expect("remove hook");
    tokio::time::timeout(ttl * 3 + Duration::from_secs(2), lost)
        .await
        .expect("lost() did not fire after the lock was removed");
    // Two more leases: every other lock must have been renewed meanwhile.
    tokio::time::sleep(ttl * 2).await;
    for (i, g) in guards.iter().enumerate() {
        if i == GONE {
            continue;
        }
        assert!(!g.is_lost(), "{}: {:?}", g.name(), g.lost_reason());
        assert_eq!(
            holder_of(&a, g.name().as_str()).await.as_ref(),
            Some(g.owner()),
            "{} is no longer held",
            g.name()
        );
    }
    for (i, g) in guards.into_iter().enumerate() {
        assert_eq!(g.release().await.unwrap(), i != GONE, "release of lock {i}");
    }
}

pub(super) async fn renew_by_other_owner_fails_with_lost(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("rn");
    let g = must_lock(&a, &name).await;
    let mut forged = g.grant().clone();
    forged.owner = b.core().owner().clone();
    let e = b
        .renew(&forged, Duration::from_secs(5))
        .await
        .expect_err("foreign renew succeeded");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert_eq!(holder_of(&a, &name).await.as_ref(), Some(g.owner()));
    assert!(g.release().await.unwrap());
    let e = a
        .renew(
            g_grant_after_release(&a, &name).await.grant(),
            Duration::from_secs(5),
        )
        .await;
    drop(e);
}

/// Re-acquires `name` so the renew case ends holding nothing but its own fresh grant.
pub(super) async fn g_grant_after_release(c: &Arc<dyn DistributedLock>, name: &str) -> LockGuard {
    let g = must_lock(c, name).await;
    let grant = g.grant().clone();
    assert!(g.release().await.unwrap());
    let e = c.renew(&grant, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "renew after release: {e}");
    must_lock(c, name).await
}
