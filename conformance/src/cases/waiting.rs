//! Waiting: the wait bound, wake-ups, takeover after expiry, cancellation and FIFO order.

use super::*;

pub(super) async fn wait_bound_is_honoured_with_timeout(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("wb");
    let g = must_lock(&a, &name).await;
    let wait = Duration::from_millis(600);
    let started = Instant::now();
    let e = b.lock(&name, wait).await.expect_err("acquired a held lock");
    let took = started.elapsed();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.is_temporary());
    assert!(
        took >= wait,
        "gave up after {took:?}, before the bound of {wait:?}"
    );
    assert!(
        took < wait + Duration::from_secs(3),
        "overran the bound: {took:?}"
    );
    assert!(g.release().await.unwrap());
}

pub(super) async fn waiter_is_woken_promptly_by_release(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("wake");
    // A long lease, so that only the release can explain a prompt grant.
    let g = a
        .try_lock_with(&name, &watchdog(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let g = b.lock(&name, LONG_WAIT).await;
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = g.token();
    let released_at = Instant::now();
    assert!(g.release().await.unwrap());
    let (granted_at, g2) = waiter.await.expect("waiter panicked");
    let g2 = g2.expect("waiter failed");
    let delay = granted_at.saturating_duration_since(released_at);
    let bound = cx.harness().wake_bound();
    assert!(
        delay < bound,
        "waiter took {delay:?} after the release (bound {bound:?})"
    );
    if a.capabilities().fencing_tokens() {
        assert!(g2.token() > first);
    }
    assert!(g2.release().await.unwrap());
}

pub(super) async fn waiter_takes_over_when_holder_lease_expires(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("crash");
    // A holder that never releases: a crashed process. Its lease must free the lock.
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let started = Instant::now();
    let g2 = b
        .lock(&name, ttl * 10 + Duration::from_secs(5))
        .await
        .expect("waiter stuck behind an expired holder");
    assert!(
        started.elapsed() >= ttl / 2,
        "granted while the holder's lease was live"
    );
    assert_eq!(holder_of(&b, &name).await.as_ref(), Some(g2.owner()));
    std::mem::forget(g);
    assert!(g2.release().await.unwrap());
}

pub(super) async fn cancelled_acquire_leaves_nothing_behind(cx: Ctx) {
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let name = cx.name("cancel");
    let lock_name = LockName::new(&name).unwrap();
    let g = must_lock(&a, &name).await;
    // Several waiters, each cancelled at a different point of its wait.
    for delay_ms in [0u64, 5, 50, 300] {
        let b = b.clone();
        let n = name.clone();
        let waiter = tokio::spawn(async move { b.lock(&n, LONG_WAIT).await });
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
    }
    // While the lock is still held, the server keeps no queue entry of theirs.
    let mut queued = None;
    for _ in 0..50 {
        queued = cx
            .harness()
            .waiters(&lock_name)
            .await
            .expect("waiters hook");
        if queued.unwrap_or(0) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        queued.unwrap_or(0) == 0,
        "cancelled waiters left {queued:?} queue entries"
    );
    assert!(g.release().await.unwrap());
    // No phantom holder or queue entry stands in the way of the next contender.
    let g2 = c
        .lock(&name, Duration::from_secs(5))
        .await
        .expect("a cancelled waiter left something that blocks the lock");
    assert_eq!(holder_of(&c, &name).await.as_ref(), Some(g2.owner()));
    assert!(g2.release().await.unwrap());
}

pub(super) async fn grant_racing_a_cancellation_is_given_back(cx: Ctx) {
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let name = cx.name("race");
    let g = must_lock(&a, &name).await;
    // The waiter asks for a long lease: only giving the grant back, not its expiry, can free
    // the lock in time for the last contender.
    let long = watchdog(Duration::from_secs(60)).wait(LONG_WAIT);
    let mut waiting = Box::pin(b.lock_with(&name, &long));
    for _ in 0..5 {
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "acquired a held lock"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    // Hand the lock over while the waiter is not being polled, then drop the waiter unpolled:
    // whatever the server granted it must be given back.
    assert!(g.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(waiting);
    let g2 = c
        .lock(&name, Duration::from_secs(10))
        .await
        .expect("a grant that raced a cancellation was kept without a guard");
    assert_eq!(holder_of(&c, &name).await.as_ref(), Some(g2.owner()));
    assert!(g2.release().await.unwrap());
}

pub(super) async fn waiters_are_granted_in_fifo_order(cx: Ctx) {
    const WAITERS: usize = 8;
    let holder = cx.client().await;
    let name = cx.name("fifo");
    let g = must_lock(&holder, &name).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let c = cx.client().await;
        let (n, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = c.lock(&n, Duration::from_secs(60)).await.expect("waiter");
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(g.release().await.unwrap());
        }));
        // Let each waiter queue before the next starts, so arrival order is defined.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(g.release().await.unwrap());
    for t in tasks {
        t.await.expect("waiter panicked");
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "not FIFO");
}
