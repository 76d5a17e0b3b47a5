//! Ownership: every acquisition is its own owner, so tasks sharing one client handle exclude
//! each other as separate clients do; re-entry is explicit and stays on the handle that holds;
//! a guard is released wherever it is dropped.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::{DistributedLock, ErrorKind, LockExt, LockOptions, OwnerId};

use crate::case::Ctx;

const LONG_WAIT: Duration = Duration::from_secs(30);

async fn must_lock(c: &Arc<dyn DistributedLock>, name: &str) -> distlock_api::LockGuard {
    c.try_lock(name)
        .await
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {e}"))
        .unwrap_or_else(|| panic!("{name:?} should be free"))
}

/// An owner label unique to this case run.
fn label(cx: &Ctx, what: &str) -> OwnerId {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    OwnerId::new(format!("{what}-{}-{nanos:x}", std::process::id()))
        .unwrap_or_else(|e| panic!("{}: {e}", cx.prefix()))
}

pub(crate) async fn two_tasks_on_one_handle_exclude_each_other(cx: Ctx) {
    let a = cx.client().await;
    let name = cx.name("tasks");
    let first = tokio::spawn({
        let (a, name) = (a.clone(), name.clone());
        async move { a.try_lock(&name).await }
    });
    let g = first.await.unwrap().unwrap().expect("free");
    // Another task on the same handle: held, whether it tries or waits.
    let second = tokio::spawn({
        let (a, name) = (a.clone(), name.clone());
        async move {
            let tried = a.try_lock(&name).await.map(|g| g.is_some());
            let waited = a.lock(&name, Duration::from_millis(300)).await.map(|_| ());
            (tried, waited)
        }
    });
    let (tried, waited) = second.await.unwrap();
    assert!(
        !tried.unwrap(),
        "a second task on one handle got a held lock"
    );
    let e = waited.expect_err("a second task on one handle waited its way into a held lock");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    // A waiting task on the same handle gets it once the first lets go, as its own owner.
    let waiter = tokio::spawn({
        let (a, name) = (a.clone(), name.clone());
        async move { a.lock(&name, LONG_WAIT).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "the waiter was granted a held lock");
    let (first_owner, first_token) = (g.owner().clone(), g.token());
    assert!(g.release().await.unwrap());
    let g2 = tokio::time::timeout(LONG_WAIT, waiter)
        .await
        .expect("the waiting task was not granted after the release")
        .unwrap()
        .unwrap();
    assert_ne!(g2.owner(), &first_owner);
    assert_eq!(g2.owner().label(), first_owner.label());
    if a.capabilities().fencing_tokens() {
        assert!(g2.token() > first_token);
    }
    assert_eq!(g2.hold_count(), 1);
    assert!(g2.release().await.unwrap());
}

pub(crate) async fn the_same_task_asking_twice_is_excluded(cx: Ctx) {
    let a = cx.client().await;
    let name = cx.name("twice");
    let g = must_lock(&a, &name).await;
    assert!(a.try_lock(&name).await.unwrap().is_none());
    let opts = LockOptions::new().watchdog_ttl(cx.harness().short_ttl());
    assert!(a.try_lock_with(&name, &opts).await.unwrap().is_none());
    let e = a.lock(&name, Duration::from_millis(200)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let info = a.holder(&name).await.unwrap().expect("held");
    assert_eq!((&info.owner, info.hold_count), (g.owner(), 1));
    assert!(g.release().await.unwrap());
    assert!(a.holder(&name).await.unwrap().is_none());
}

pub(crate) async fn reentered_holds_share_the_token_and_free_after_the_last_release(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("reenter");
    let outer = must_lock(&a, &name).await;
    let inner = outer.reenter().await.expect("re-enter through the guard");
    assert_eq!(inner.token(), outer.token());
    assert_eq!(inner.owner(), outer.owner());
    assert_eq!((outer.hold_count(), inner.hold_count()), (1, 2));
    assert_eq!(a.holder(&name).await.unwrap().unwrap().hold_count, 2);
    // Re-entered or not, the hold excludes everyone else, this handle's other acquisitions too.
    assert!(a.try_lock(&name).await.unwrap().is_none());
    assert!(b.try_lock(&name).await.unwrap().is_none());
    // The outer guard goes first: the inner one still holds.
    assert!(outer.release().await.unwrap());
    assert!(!inner.is_lost(), "{:?}", inner.lost_reason());
    let info = b
        .holder(&name)
        .await
        .unwrap()
        .expect("still held by the inner hold");
    assert_eq!((&info.owner, info.hold_count), (inner.owner(), 1));
    assert!(b.try_lock(&name).await.unwrap().is_none());
    assert!(inner.release().await.unwrap());
    assert!(b.holder(&name).await.unwrap().is_none());
    assert!(must_lock(&b, &name).await.release().await.unwrap());
}

/// Re-entered holds of one grant, each on a watchdog lease of its own, come due for renewal
/// together: every one is renewed (a batch that holds one grant more than once must answer for
/// each), and none reports the lock lost.
pub(crate) async fn reentered_watchdog_holds_are_all_renewed(cx: Ctx) {
    let a = cx.client().await;
    let name = cx.name("reenter-renewed");
    let ttl = cx.harness().short_ttl();
    let outer = a
        .try_lock_with(&name, &LockOptions::new().watchdog_ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let second = outer.reenter().await.expect("re-enter");
    let third = second.reenter().await.expect("re-enter");
    let first_until = [&outer, &second, &third].map(|g| g.safe_until());
    // Six renewal rounds (one every third of the lease).
    tokio::time::sleep(ttl * 2).await;
    for (i, g) in [&outer, &second, &third].into_iter().enumerate() {
        assert!(!g.is_lost(), "hold {i} reports lost: {:?}", g.lost_reason());
        if let Some(first) = first_until[i] {
            let now = g.safe_until().expect("still leased");
            assert!(
                now > first,
                "hold {i} was not renewed: safe-until still {first:?}"
            );
        }
    }
    assert_eq!(a.holder(&name).await.unwrap().expect("held").hold_count, 3);
    for g in [third, second, outer] {
        assert!(g.release().await.unwrap());
    }
    assert!(a.holder(&name).await.unwrap().is_none());
}

pub(crate) async fn guards_of_one_hold_release_in_any_order(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("order");
    let g1 = must_lock(&a, &name).await;
    let g2 = g1.reenter().await.unwrap();
    let g3 = g2.reenter().await.unwrap();
    assert_eq!(g3.hold_count(), 3);
    // Middle, then first (dropped, not released), then last.
    assert!(g2.release().await.unwrap());
    assert_eq!(b.holder(&name).await.unwrap().unwrap().hold_count, 2);
    drop(g1);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let count = b.holder(&name).await.unwrap().expect("held").hold_count;
        if count == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a dropped guard's hold was never given up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(b.try_lock(&name).await.unwrap().is_none());
    assert!(!g3.is_lost());
    assert!(g3.release().await.unwrap());
    assert!(must_lock(&b, &name).await.release().await.unwrap());
}

pub(crate) async fn reentering_a_hold_that_ended_fails_cleanly(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("ended");
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let taker = b
        .lock(&name, ttl * 3 + Duration::from_secs(5))
        .await
        .expect("the fixed lease ran out");
    let e = g.reenter().await.expect_err("re-entered a hold that ended");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    // The failed re-entry took nothing from the new holder.
    let info = a.holder(&name).await.unwrap().expect("held by the taker");
    assert_eq!((&info.owner, info.hold_count), (taker.owner(), 1));
    assert!(!taker.is_lost());
    assert!(!g.release().await.unwrap());
    assert!(taker.release().await.unwrap());
}

pub(crate) async fn explicit_owner_reenters_only_on_its_own_handle(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("explicit");
    let job = label(&cx, "job");
    let as_job = LockOptions::new().owner(job.clone());
    let g1 = a
        .try_lock_with(&name, &as_job)
        .await
        .unwrap()
        .expect("free");
    let g2 = a
        .try_lock_with(&name, &as_job)
        .await
        .unwrap()
        .expect("the same owner on the same handle re-enters");
    assert_eq!((g2.token(), g2.hold_count()), (g1.token(), 2));
    assert_eq!(g1.owner().label(), job.label());
    // The same label on another handle is another owner.
    assert!(b.try_lock_with(&name, &as_job).await.unwrap().is_none());
    let e = b
        .lock_with(&name, &as_job.clone().wait(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    // An id another handle made cannot be borrowed to slip in.
    let borrowed = LockOptions::new().owner(g1.owner().clone());
    let e = b.try_lock_with(&name, &borrowed).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(b.holder(&name).await.unwrap().unwrap().hold_count, 2);
    assert!(g1.release().await.unwrap());
    assert!(g2.release().await.unwrap());
    let gb = b
        .try_lock_with(&name, &as_job)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(gb.owner().label(), job.label());
    assert_ne!(gb.owner(), &a.core().owner_for(Some(&job)).unwrap());
    assert!(gb.release().await.unwrap());
}

/// 8 tasks on one handle and 8 on another increment a read-sleep-write counter under the lock:
/// the count is exact, no two tasks are ever inside at once, and (with fencing) each grant's
/// token is greater than the one before it, whether it came from a release of another handle or
/// of its own (a hand-over, where the backend makes them).
pub(crate) async fn tasks_sharing_two_handles_keep_a_counter_exact(cx: Ctx) {
    const TASKS: usize = 8;
    const ROUNDS: u64 = 4;
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU32::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let fencing = a.capabilities().fencing_tokens();
    let mut tasks = Vec::new();
    for i in 0..2 * TASKS {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (name, counter, inside) = (name.clone(), counter.clone(), inside.clone());
        let last_token = last_token.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = c
                    .lock(&name, Duration::from_secs(60))
                    .await
                    .unwrap_or_else(|e| panic!("task {i}: {e}"));
                let others = inside.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    others, 0,
                    "task {i} entered while {others} others were inside"
                );
                let before = last_token.swap(g.token().0, Ordering::SeqCst);
                assert!(
                    !fencing || g.token().0 > before,
                    "task {i} was granted token {} after token {before}",
                    g.token()
                );
                let seen = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(g.release().await.unwrap(), "task {i} lost the lock inside");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 2 * TASKS as u64 * ROUNDS);
    assert!(a.holder(&name).await.unwrap().is_none());
}

pub(crate) async fn guard_dropped_on_a_plain_thread_frees_the_lock(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("thread");
    // A long fixed lease where the backend has one, so that only a release can free the lock
    // within the bound below; session-bound backends hold until released or the session ends.
    let opts = if a.capabilities().per_lock_ttl() {
        LockOptions::new().ttl(Duration::from_secs(120))
    } else {
        LockOptions::new()
    };
    let g = a.try_lock_with(&name, &opts).await.unwrap().expect("free");
    let token = g.token();
    std::thread::spawn(move || drop(g)).join().unwrap();
    let started = Instant::now();
    let g2 = b
        .lock(&name, Duration::from_secs(10))
        .await
        .expect("a guard dropped on a plain thread was never released");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "freed only after {:?}",
        started.elapsed()
    );
    if a.capabilities().fencing_tokens() {
        assert!(g2.token() > token);
    }
    assert!(g2.release().await.unwrap());
}

/// A task of the handle that is granted the lock at its handle's release holds it under its
/// own lease, shorter or longer than the releasing guard's: the server's expiry and the guard's
/// safe-until are the new grant's, not left over from the release (on a backend that hands the
/// lock over in the release's own request, too).
pub(crate) async fn a_task_granted_at_its_handles_release_holds_its_own_lease(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("own-lease");
    let fixed = |secs| {
        LockOptions::new()
            .ttl(Duration::from_secs(secs))
            .wait(LONG_WAIT)
    };
    // (the releasing guard's lease, the waiting task's lease), in seconds.
    for (held, asked) in [(120, 3), (2, 60)] {
        let g = a
            .try_lock_with(&name, &fixed(held))
            .await
            .unwrap()
            .expect("free");
        let waiter = tokio::spawn({
            let (a, name, opts) = (a.clone(), name.clone(), fixed(asked));
            async move { a.lock_with(&name, &opts).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!waiter.is_finished(), "granted while held");
        let released = Instant::now();
        assert!(g.release().await.unwrap());
        let g2 = waiter.await.unwrap().unwrap();
        let lease = Duration::from_secs(asked);
        let safe_until = g2.safe_until().expect("a fixed lease has a safe-until");
        assert!(
            safe_until <= Instant::now() + lease,
            "safe-until {:?} past the task's own lease of {lease:?}",
            safe_until.saturating_duration_since(Instant::now())
        );
        assert!(safe_until > released, "safe-until before the grant");
        let seen = b.holder(&name).await.unwrap().expect("held by the task");
        assert_eq!(
            (&seen.owner, seen.token, seen.hold_count),
            (g2.owner(), g2.token(), 1)
        );
        let remaining = seen.remaining.expect("a per-lock lease");
        assert!(
            remaining <= lease && remaining + Duration::from_millis(1500) >= lease,
            "the server's lease {remaining:?}, the task asked for {lease:?} (the releasing guard \
             had {held} s)"
        );
        if asked > held {
            // Past the releasing guard's lease, the task's holds on.
            tokio::time::sleep(Duration::from_secs(held) + Duration::from_millis(500)).await;
            assert!(
                b.try_lock(&name).await.unwrap().is_none(),
                "the lock expired with the releasing guard's lease, not the task's"
            );
            assert!(!g2.is_lost());
        }
        assert!(g2.release().await.unwrap());
    }
}

/// A waiting task that leaves (its acquire dropped) just as its handle releases the lock never
/// leaves it held without a guard: at every moment of leaving, another client gets the lock
/// at once, long before the lease (two minutes) could free it. On a backend that hands the lock
/// over, this is the task leaving while the hand-over is on its way.
pub(crate) async fn a_task_leaving_as_its_handle_releases_leaves_the_lock_free(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("leaving");
    let opts = if a.capabilities().per_lock_ttl() {
        LockOptions::new().ttl(Duration::from_secs(120))
    } else {
        LockOptions::new()
    }
    .wait(LONG_WAIT);
    for round in 0u64..12 {
        let g = a.try_lock_with(&name, &opts).await.unwrap().expect("free");
        let waiter = tokio::spawn({
            let (a, name, opts) = (a.clone(), name.clone(), opts.clone());
            async move { a.lock_with(&name, &opts).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let release = tokio::spawn(g.release());
        // From before the release is sent to well after it is answered.
        tokio::time::sleep(Duration::from_micros(round * round * 20)).await;
        waiter.abort();
        if let Ok(granted) = waiter.await {
            // Granted before it could leave: its guard lets go here.
            drop(granted.unwrap());
        }
        assert!(
            release.await.unwrap().unwrap(),
            "round {round}: the release"
        );
        let started = Instant::now();
        let g2 = b
            .lock(&name, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("round {round}: left held without a guard: {e}"));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "round {round}: free only after {:?}",
            started.elapsed()
        );
        assert!(g2.release().await.unwrap());
    }
}

/// A holder's guard dropped on a plain thread (no runtime there) while a task of the same
/// handle waits: the drop's release reaches the waiting task, which gets the lock as its own
/// owner with a greater token, long before the holder's lease could end; another client is
/// excluded until the task lets go. (On a backend that hands the lock over, the dropped guard's
/// release is the hand-over; on a queue, the task is next in it.)
pub(crate) async fn a_guard_dropped_on_a_plain_thread_passes_the_lock_to_a_waiting_task(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("thread-handoff");
    let opts = if a.capabilities().per_lock_ttl() {
        LockOptions::new().ttl(Duration::from_secs(120))
    } else {
        LockOptions::new()
    }
    .wait(LONG_WAIT);
    for round in 0..3 {
        let g = a.try_lock_with(&name, &opts).await.unwrap().expect("free");
        let (owner, token) = (g.owner().clone(), g.token());
        let waiter = tokio::spawn({
            let (a, name, opts) = (a.clone(), name.clone(), opts.clone());
            async move { a.lock_with(&name, &opts).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!waiter.is_finished(), "round {round}: granted while held");
        let started = Instant::now();
        std::thread::spawn(move || drop(g)).join().unwrap();
        let g2 = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the dropped guard never let go"))
            .unwrap()
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "round {round}: passed on only after {:?}",
            started.elapsed()
        );
        assert_ne!(g2.owner(), &owner);
        if a.capabilities().fencing_tokens() {
            assert!(
                g2.token() > token,
                "round {round}: {:?} after {token:?}",
                g2.token()
            );
        }
        assert!(
            b.try_lock(&name).await.unwrap().is_none(),
            "round {round}: another client got the task's lock"
        );
        let seen = b.holder(&name).await.unwrap().expect("held by the task");
        assert_eq!((&seen.owner, seen.token), (g2.owner(), g2.token()));
        assert!(g2.release().await.unwrap());
    }
}
