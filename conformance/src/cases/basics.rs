//! Acquire, inspect and release: who holds, with which token, and who may free it.

use super::*;

pub(super) async fn try_acquire_free_lock_grants_with_holder_and_token(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("free");
    assert!(c.holder(&name).await.unwrap().is_none());
    let sent = Instant::now();
    let g = must_lock(&c, &name).await;
    assert_eq!(g.name().as_str(), name);
    assert_eq!(g.owner().label(), c.core().owner().label());
    assert_eq!(g.hold_count(), 1);
    assert!(!g.is_lost());
    if c.capabilities().fencing_tokens() {
        assert!(
            g.token() > FencingToken(0),
            "a fencing backend issued token 0"
        );
    }
    let info = c.holder(&name).await.unwrap().expect("held");
    assert_eq!(&info.owner, g.owner());
    assert_eq!(info.hold_count, 1);
    assert_eq!(info.token, g.token());
    if let Some(until) = g.safe_until() {
        assert!(
            until > Instant::now(),
            "fresh grant already past safe-until"
        );
        assert!(until <= sent + g.ttl() + Duration::from_millis(50) + (Instant::now() - sent));
    }
    if c.capabilities().per_lock_ttl() {
        let rem = info
            .remaining
            .expect("per-lock leases report the remaining lease");
        assert!(rem <= g.ttl(), "remaining {rem:?} > granted {:?}", g.ttl());
    }
    assert!(g.release().await.unwrap());
}

/// What a client handle says about itself is one value: how it waits must match the blocking
/// it promises, a fair backend must not hand over, and it promises what its descriptor says
/// (the descriptor may say less only of how waiters are woken: a client without notices
/// configured polls).
pub(super) async fn the_profile_agrees_with_itself_and_with_the_descriptor(cx: Ctx) {
    let c = cx.client().await;
    let p = c.profile();
    assert_eq!(p.disagreement(), None, "{p:?}");
    assert!(p.renew_batch >= 1, "{p:?}");
    let mut declared = cx.harness().capabilities();
    declared.blocking = p.capabilities.blocking;
    let mut said = p.capabilities;
    said.ttl.min = declared.ttl.min;
    assert_eq!(
        said, declared,
        "the client's capabilities are not the descriptor's"
    );
}

pub(super) async fn try_acquire_held_lock_returns_none(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("held");
    let g = must_lock(&a, &name).await;
    assert!(b.try_lock(&name).await.unwrap().is_none());
    let e = b.lock(&name, Duration::ZERO).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(holder_of(&b, &name).await.as_ref(), Some(g.owner()));
    assert!(g.release().await.unwrap());
}

pub(super) async fn caller_supplied_owner_is_the_holder(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("own");
    let me = OwnerId::new(format!("worker-{}", std::process::id())).unwrap();
    let g = c
        .try_lock_with(&name, &LockOptions::new().owner(me.clone()))
        .await
        .unwrap()
        .expect("free");
    // The label is the caller's; the id the server stores is qualified by the handle.
    assert_eq!(g.owner().label(), me.label());
    assert_eq!(holder_of(&c, &name).await.as_ref(), Some(g.owner()));
    // An acquisition without that owner is someone else for this lock.
    assert!(c.try_lock(&name).await.unwrap().is_none());
    assert!(g.release().await.unwrap());
}

pub(super) async fn release_by_holder_frees_the_lock(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("rel");
    let g = must_lock(&a, &name).await;
    assert!(
        g.release().await.unwrap(),
        "holder's release must report held"
    );
    assert!(holder_of(&b, &name).await.is_none());
    let g2 = must_lock(&b, &name).await;
    assert!(g2.release().await.unwrap());
}

pub(super) async fn release_by_other_owner_is_not_held_and_keeps_the_lock(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("foreign");
    let g = must_lock(&a, &name).await;
    let mut forged = g.grant().clone();
    forged.owner = b.core().owner().clone();
    assert!(
        !b.release(&forged).await.unwrap(),
        "foreign release reported held"
    );
    assert!(
        !a.release(&forged).await.unwrap(),
        "foreign release reported held"
    );
    assert_eq!(holder_of(&a, &name).await.as_ref(), Some(g.owner()));
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "foreign release freed the lock"
    );
    assert!(g.release().await.unwrap());
}

pub(super) async fn release_twice_is_not_held_the_second_time(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("twice");
    let g = must_lock(&c, &name).await;
    let grant = g.grant().clone();
    assert!(g.release().await.unwrap());
    assert!(
        !c.release(&grant).await.unwrap(),
        "second release reported held"
    );
    assert!(holder_of(&c, &name).await.is_none());
}

pub(super) async fn stale_release_never_frees_a_newer_holder(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("stale");
    let old = must_lock(&a, &name).await;
    let stale = old.grant().clone();
    assert!(old.release().await.unwrap());
    let newer = must_lock(&b, &name).await;
    // The stale grant, and the same owner's id with the newer grant's token, both fail.
    assert!(!a.release(&stale).await.unwrap());
    let mut mixed = newer.grant().clone();
    mixed.owner = stale.owner.clone();
    assert!(!a.release(&mixed).await.unwrap());
    assert_eq!(holder_of(&a, &name).await.as_ref(), Some(newer.owner()));
    assert!(!newer.is_lost());
    assert!(newer.release().await.unwrap());
}
