//! Semaphores: a name that admits up to `max` holders, each permit a grant of its own.

use super::*;

/// How many permits the semaphore cases use.
const MAX: u32 = 3;

pub(super) async fn permits_out_of_range_are_invalid_argument(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("sem-range");
    let opts = LockOptions::new();
    for bad in [0, MAX_PERMITS + 1] {
        let e = c.try_permit(&name, bad, &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "max {bad}: {e}");
        let e = c.permit(&name, bad, &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "max {bad}: {e}");
        if let Some(Ok(dead)) = cx.harness().unreachable_client().await {
            let e = dead.try_permit(&name, bad, &opts).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "before any I/O: {e}");
        }
    }
    // A semaphore of one permit is the lock of the same name.
    let g = c.try_permit(&name, 1, &opts).await.unwrap().expect("free");
    assert!(
        c.try_lock(&name).await.unwrap().is_none(),
        "the lock is held"
    );
    assert!(g.release().await.unwrap());
}

pub(super) async fn permits_are_unsupported_without_a_semaphore(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("sem-none");
    let e = c
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    if let Some(Ok(dead)) = cx.harness().unreachable_client().await {
        let e = dead
            .try_permit(&name, 2, &LockOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "before any I/O: {e}");
    }
    assert!(holder_of(&c, &name).await.is_none(), "nothing was granted");
}

/// It admits `MAX` holders and no more; then separate clients, and tasks sharing one handle,
/// take and give back permits, and a count of who believes it holds one (from its grant to just
/// before its release) never passes `MAX`.
pub(super) async fn never_more_than_max_permits_are_held_at_once(cx: Ctx) {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 3;
    const ROUNDS: usize = 6;
    let name = cx.name("sem-max");
    // It admits max holders: every permit, then no more (taken one after another, so that a
    // slow server cannot make this look like a mutex).
    let c = cx.client().await;
    let opts = LockOptions::new();
    let mut all = Vec::new();
    for i in 0..MAX {
        let g = c.try_permit(&name, MAX, &opts).await.unwrap();
        all.push(g.unwrap_or_else(|| panic!("permit {} of {MAX} refused", i + 1)));
    }
    let extra = cx.client().await.try_permit(&name, MAX, &opts).await;
    assert!(
        extra.unwrap().is_none(),
        "a permit beyond {MAX} was granted"
    );
    for g in all {
        assert!(g.release().await.unwrap());
    }
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let c = cx.client().await;
        for _ in 0..TASKS_PER_CLIENT {
            let (c, name) = (c.clone(), name.clone());
            let (inside, peak, tokens) = (inside.clone(), peak.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                let opts = LockOptions::new().wait(LONG_WAIT);
                for _ in 0..ROUNDS {
                    let g = c.permit(&name, MAX, &opts).await.expect("permit");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().unwrap().push(g.token());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    assert!(!g.is_lost(), "lost while held: {:?}", g.lost_reason());
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(g.release().await.unwrap(), "permit lost while held");
                    assert!(now <= MAX, "{now} permits of {MAX} believed held at once");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("contender panicked");
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= MAX, "{peak} permits of {MAX} held at once");
    let mut tokens = tokens.lock().unwrap().clone();
    let all = tokens.len();
    assert_eq!(all, CLIENTS * TASKS_PER_CLIENT * ROUNDS);
    if cx.harness().capabilities().fencing_tokens() {
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), all, "two permits shared a token");
    }
    assert!(holder_of(&cx.client().await, &name).await.is_none());
}

/// Every permit's token is greater than every token issued before it, whichever permit it was.
pub(super) async fn permit_tokens_rise_across_all_permits(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("sem-tok");
    let opts = LockOptions::new();
    let mut last = FencingToken(0);
    let mut held = Vec::new();
    for i in 0..12 {
        let c = if i % 2 == 0 { &a } else { &b };
        if held.len() == MAX as usize {
            let g: LockGuard = held.remove(i % MAX as usize);
            assert!(g.release().await.unwrap());
        }
        let g = c
            .try_permit(&name, MAX, &opts)
            .await
            .unwrap()
            .expect("a permit is free");
        assert!(
            g.token() > last,
            "permit {i}: token {} after {last}",
            g.token()
        );
        last = g.token();
        held.push(g);
    }
    for g in held {
        assert!(g.release().await.unwrap());
    }
}

/// While permits are held the semaphore's size is fixed: another `max` (the lock's 1 included)
/// is refused; once all are released, the next holder sets it anew.
pub(super) async fn a_conflicting_max_is_refused_while_permits_are_held(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("sem-size");
    let opts = LockOptions::new();
    let g = a.try_permit(&name, 2, &opts).await.unwrap().expect("free");
    let info = a.holder(&name).await.unwrap().expect("held");
    assert_eq!(info.permits, (1, 2), "held as one permit of two");
    assert_eq!(info.owner, *g.owner());
    for (max, what) in [(3, "a larger max"), (1, "the lock")] {
        let e = b.try_permit(&name, max, &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
        let e = b
            .permit(
                &name,
                max,
                &LockOptions::new().wait(Duration::from_millis(200)),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}, waiting: {e}");
    }
    let e = b.try_lock(&name).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidArgument,
        "the lock of a semaphore's name: {e}"
    );
    let g2 = b
        .try_permit(&name, 2, &opts)
        .await
        .unwrap()
        .expect("one left");
    assert_eq!(
        a.holder(&name).await.unwrap().expect("held").permits,
        (2, 2)
    );
    assert!(g.release().await.unwrap());
    assert!(g2.release().await.unwrap());
    let g3 = b
        .try_permit(&name, 3, &opts)
        .await
        .unwrap()
        .expect("free again");
    assert_eq!(
        a.holder(&name).await.unwrap().expect("held").permits,
        (1, 3)
    );
    assert!(g3.release().await.unwrap());
}

/// A waiter for a full semaphore gets a permit when one is released, not before.
pub(super) async fn a_release_wakes_a_permit_waiter(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("sem-wake");
    let opts = LockOptions::new();
    let held = [
        a.try_permit(&name, 2, &opts).await.unwrap().expect("free"),
        a.try_permit(&name, 2, &opts)
            .await
            .unwrap()
            .expect("one left"),
    ];
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let g = b
                .permit(&name, 2, &LockOptions::new().wait(LONG_WAIT))
                .await
                .expect("permit after a release");
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "granted while both permits were held"
    );
    let [first, second] = held;
    let released = Instant::now();
    assert!(first.release().await.unwrap());
    let (granted, g) = waiter.await.expect("waiter panicked");
    assert!(granted >= released, "granted before the release");
    assert!(g.token() > second.token());
    assert!(second.release().await.unwrap());
    assert!(g.release().await.unwrap());
}

/// A holder that stops without releasing (its guard forgotten, as a killed process's is)
/// keeps its permit only until its lease ends.
pub(super) async fn a_dead_holders_permit_returns_by_its_lease(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("sem-dead");
    let fixed = LockOptions::new().ttl(ttl);
    let live = a
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    let dead = a
        .try_permit(&name, 2, &fixed)
        .await
        .unwrap()
        .expect("one left");
    let started = Instant::now();
    std::mem::forget(dead);
    assert!(
        b.try_permit(&name, 2, &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "both permits are held"
    );
    let g = b
        .permit(
            &name,
            2,
            &LockOptions::new().wait(ttl * 10 + Duration::from_secs(5)),
        )
        .await
        .expect("the dead holder's permit returns");
    assert!(
        started.elapsed() + Duration::from_millis(5) >= ttl - ttl / 10,
        "returned after {:?}, before its lease of {ttl:?}",
        started.elapsed()
    );
    assert!(
        !live.is_lost(),
        "the live permit was taken: {:?}",
        live.lost_reason()
    );
    assert!(live.release().await.unwrap());
    assert!(g.release().await.unwrap());
}

/// A permit's guard re-enters its own permit: same token, one more hold; the semaphore's other
/// permits are unaffected.
pub(super) async fn a_permit_reenters_its_own_grant(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("sem-reenter");
    let opts = LockOptions::new();
    let g = a.try_permit(&name, 2, &opts).await.unwrap().expect("free");
    let inner = g.reenter().await.unwrap();
    assert_eq!((inner.token(), inner.hold_count()), (g.token(), 2));
    let other = b
        .try_permit(&name, 2, &opts)
        .await
        .unwrap()
        .expect("one left");
    assert!(
        b.try_permit(&name, 2, &opts).await.unwrap().is_none(),
        "full"
    );
    assert!(g.release().await.unwrap());
    assert!(
        b.try_permit(&name, 2, &opts).await.unwrap().is_none(),
        "the re-entered permit is still held"
    );
    assert!(inner.release().await.unwrap());
    let last = b.try_permit(&name, 2, &opts).await.unwrap().expect("freed");
    assert!(other.release().await.unwrap());
    assert!(last.release().await.unwrap());
}
