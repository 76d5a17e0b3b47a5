//! Reentrancy: holds counted by owner, one token, contention where the backend is not reentrant.

use super::*;

pub(super) async fn reentrant_acquire_counts_holds_and_keeps_the_token(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("re");
    let g1 = must_lock(&a, &name).await;
    let g2 = g1.reenter().await.expect("re-enter through the guard");
    let g3 = g2
        .reenter()
        .await
        .expect("re-enter through the second guard");
    assert_eq!(
        (g1.hold_count(), g2.hold_count(), g3.hold_count()),
        (1, 2, 3)
    );
    assert_eq!(g2.token(), g1.token());
    assert_eq!(g3.token(), g1.token());
    assert_eq!(a.holder(&name).await.unwrap().unwrap().hold_count, 3);
    assert!(g3.release().await.unwrap());
    assert!(g2.release().await.unwrap());
    assert_eq!(a.holder(&name).await.unwrap().unwrap().hold_count, 1);
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "freed before the count hit zero"
    );
    assert!(g1.release().await.unwrap());
    assert!(holder_of(&b, &name).await.is_none());
    assert!(must_lock(&b, &name).await.release().await.unwrap());
}

pub(super) async fn reacquire_by_holder_is_contended_without_reentrancy(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("nre");
    let g = must_lock(&c, &name).await;
    assert!(c.try_lock(&name).await.unwrap().is_none());
    let e = c.lock(&name, Duration::from_millis(200)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    // Explicit re-entry is refused, not left to deadlock.
    let e = g.reenter().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(g.release().await.unwrap());
}

/// Holds of one grant given up at the same moment (two tasks releasing their guards together)
/// each count: after the last, the lock is free at once, not only when its lease runs out.
/// Repeated, so that the two releases meet on the server many times.
pub(super) async fn concurrent_releases_of_reentrant_holds_free_the_lock(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("re-race");
    for round in 0..20 {
        let g1 = must_lock(&a, &name).await;
        let g2 = g1.reenter().await.expect("re-enter through the guard");
        let (r1, r2) = tokio::join!(
            tokio::spawn(async move { g1.release().await }),
            tokio::spawn(async move { g2.release().await })
        );
        assert!(
            r1.unwrap().unwrap() && r2.unwrap().unwrap(),
            "round {round}"
        );
        assert!(
            holder_of(&b, &name).await.is_none(),
            "round {round}: two holds released together left the lock held"
        );
    }
}
