//! Answers lost to a *paused server* (SIGSTOP mid-request), not to a proxy: the request sits in
//! the paused server's socket buffer, the client gives up after its response timeout, and the
//! server applies the request when it resumes, with nobody left to hear the answer. Every test
//! runs its own redis-server on a free port; dropping it (on panic too) thaws and kills it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::private::PrivateRedis;
use distlock_redis::{ErrorKind, LockExt, LockOptions, OwnerId, RedisConfig, RedisLock};

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redis");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
    }
    skip
}

async fn client(server: &PrivateRedis) -> Arc<RedisLock> {
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .response_timeout(Duration::from_millis(300));
    Arc::new(RedisLock::connect(config).await.unwrap())
}

/// The acquire goes out to a paused server and times out; the server applies it on resuming.
/// The hold nobody has a guard for is given back: another client gets the lock long before
/// the 10-minute lease would end. `owner` is the acquire's explicit owner, if any.
async fn late_acquire_is_given_back(owner: Option<&str>) {
    let server = PrivateRedis::start_free();
    let (a, b) = (client(&server).await, client(&server).await);
    let name = "paused-mid-acquire";
    // Warm connections, so the paused request is the acquire itself.
    assert!(a.holder(name).await.unwrap().is_none());
    let mut long = LockOptions::new().ttl(Duration::from_secs(600));
    if let Some(owner) = owner {
        long = long.owner(OwnerId::new(owner).unwrap());
    }
    server.signal("STOP");
    let e = a
        .try_lock_with(name, &long)
        .await
        .expect_err("granted by a paused server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    server.signal("CONT");
    let g = b
        .lock(name, Duration::from_secs(30))
        .await
        .expect("the acquire the server applied late was never given back");
    let holder = b.holder(name).await.unwrap().expect("held");
    assert_eq!(&holder.owner, g.owner());
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn an_acquire_a_paused_server_applies_late_is_given_back() {
    if skipped() {
        return;
    }
    late_acquire_is_given_back(None).await;
}

#[tokio::test]
async fn an_explicit_owners_acquire_a_paused_server_applies_late_is_given_back() {
    if skipped() {
        return;
    }
    late_acquire_is_given_back(Some("nightly-report")).await;
}

/// A re-entry sent to a paused server and applied late adds a hold that no guard has: it is
/// given back, and the guard's own hold stays, so the lock is free right after the guard's
/// release rather than 10 minutes later.
#[tokio::test]
async fn a_reentry_a_paused_server_applies_late_leaves_only_the_guards_hold() {
    if skipped() {
        return;
    }
    let server = PrivateRedis::start_free();
    let (a, b) = (client(&server).await, client(&server).await);
    let name = "paused-mid-reentry";
    let long = LockOptions::new().ttl(Duration::from_secs(600));
    let outer = a.try_lock_with(name, &long).await.unwrap().expect("free");
    server.signal("STOP");
    let e = outer
        .reenter_with(&long)
        .await
        .expect_err("re-entered on a paused server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    server.signal("CONT");
    let mut holds = 0;
    for _ in 0..600 {
        let info = b
            .holder(name)
            .await
            .unwrap()
            .expect("the guard's hold ended");
        assert_eq!(&info.owner, outer.owner());
        holds = info.hold_count;
        if holds == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(holds, 1, "the late re-entry's hold was never given back");
    assert!(
        b.try_lock(name).await.unwrap().is_none(),
        "the guard's hold went too"
    );
    assert!(outer.release().await.unwrap());
    assert!(
        b.try_lock(name).await.unwrap().is_some(),
        "still held after the guard's release"
    );
}

/// The release of a re-entered hold, sent to a paused server: its answer is lost, and the server
/// applies it when it resumes. The client settles the release in the background, and must not
/// take a second hold with it: the outer guard's hold stays (hold count 1, another client
/// refused) until the outer guard's release frees the lock.
#[tokio::test]
async fn an_inner_release_a_paused_server_applies_late_leaves_the_outer_hold() {
    if skipped() {
        return;
    }
    let server = PrivateRedis::start_free();
    let (a, b) = (client(&server).await, client(&server).await);
    let name = "paused-mid-inner-release";
    let long = LockOptions::new().ttl(Duration::from_secs(600));
    let outer = a.try_lock_with(name, &long).await.unwrap().expect("free");
    let inner = outer.reenter_with(&long).await.unwrap();
    assert_eq!(inner.hold_count(), 2);
    server.signal("STOP");
    let e = inner
        .release()
        .await
        .expect_err("released on a paused server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    server.signal("CONT");
    // Time for the background settlement's first tries (50 ms, then 100, 200, ...).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let info = b
        .holder(name)
        .await
        .unwrap()
        .expect("the outer hold went too");
    assert_eq!((&info.owner, info.hold_count), (outer.owner(), 1));
    assert!(b.try_lock(name).await.unwrap().is_none());
    assert!(outer.release().await.unwrap());
    assert!(b.try_lock(name).await.unwrap().is_some());
}

/// A release that hands the lock to a waiting task of its handle, sent to a paused server: the
/// answer is lost, so neither the release nor the new grant is known to have happened. The
/// server applies the hand-over when it resumes; the task's own attempt meanwhile fails too.
/// Both are settled: no hold is left without a guard, and another client gets the lock long
/// before the 10-minute leases would end.
#[tokio::test]
async fn a_hand_over_a_paused_server_applies_late_leaves_nothing_held() {
    if skipped() {
        return;
    }
    let server = PrivateRedis::start_free();
    let (a, b) = (client(&server).await, client(&server).await);
    let name = "paused-mid-hand-over";
    let long = LockOptions::new()
        .ttl(Duration::from_secs(600))
        .wait(Duration::from_secs(60));
    let g = a.try_lock_with(name, &long).await.unwrap().expect("free");
    let waiter = tokio::spawn({
        let (a, long) = (a.clone(), long.clone());
        async move { a.lock_with(name, &long).await }
    });
    // Subscribed and waiting: it has offered to take the lock from a release of `a`.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    server.signal("STOP");
    let e = g.release().await.expect_err("released on a paused server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let waited = waiter.await.unwrap();
    server.signal("CONT");
    // The task's own attempt went to the paused server too: it failed, or (the server resumed
    // in time) it is the holder now.
    let held = match waited {
        Ok(g2) => Some(g2),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            None
        }
    };
    if let Some(g2) = held {
        assert!(g2.release().await.unwrap());
    }
    let g3 = b
        .lock(name, Duration::from_secs(30))
        .await
        .expect("a hold the late hand-over left was never given back");
    assert!(g3.release().await.unwrap());
    assert!(b.holder(name).await.unwrap().is_none());
}

/// An observer whose server pauses past the leader's lease (its reads time out, its
/// subscription goes quiet) comes back to the truth once the server answers: it shows the
/// leader that took over, under a later epoch, and never the deposed leader again.
#[tokio::test]
async fn an_observer_reads_again_after_a_paused_server_and_shows_the_new_leader() {
    if skipped() {
        return;
    }
    let server = PrivateRedis::start_free();
    let ttl = Duration::from_millis(1000);
    let with_ttl = |owner: &str| {
        RedisConfig::from_url(&server.url())
            .unwrap()
            .response_timeout(Duration::from_millis(300))
            .default_ttl(ttl)
            .owner(OwnerId::new(owner).unwrap())
    };
    let old = Arc::new(RedisLock::connect(with_ttl("old-leader")).await.unwrap());
    let new = Arc::new(RedisLock::connect(with_ttl("new-leader")).await.unwrap());
    let watcher = client(&server).await;
    let name = "observed-through-a-pause";
    let wait = LockOptions::new().wait(Duration::from_secs(10));
    let first = old
        .election(name)
        .unwrap()
        .campaign("old", &wait)
        .await
        .unwrap();
    let mut observer = watcher
        .election(name)
        .unwrap()
        .observe()
        .every(Duration::from_millis(50));
    let shown = observer.next().await.unwrap().expect("a leader");
    assert_eq!(
        (shown.epoch, shown.value.as_deref()),
        (first.epoch(), Some("old"))
    );

    // Past the lease: the leader's renewals fail, so does every read of the observer.
    server.signal("STOP");
    tokio::time::sleep(ttl * 2).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(1), observer.next())
            .await
            .is_ok_and(|r| r.is_err()),
        "a read of a paused server answered"
    );
    server.signal("CONT");
    tokio::time::timeout(Duration::from_secs(5), first.lost())
        .await
        .expect("the leader never learned its lease ran out during the pause");
    let second = new
        .election(name)
        .unwrap()
        .campaign("new", &wait)
        .await
        .unwrap();
    assert!(second.epoch() > first.epoch());

    let mut seen = Vec::new();
    let latest = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match observer.next().await {
                Ok(Some(l)) if l.epoch == second.epoch() && l.value.is_some() => break l,
                Ok(state) => seen.push(state),
                Err(_) => {} // a read at the edge of the pause; the next call reads again
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the observer never showed the new leader; it showed {seen:?}"));
    assert_eq!(latest.value.as_deref(), Some("new"));
    assert_eq!(&latest.owner, second.guard().owner());
    assert!(
        seen.iter().flatten().all(|l| l.epoch > first.epoch()),
        "the deposed leader was shown again after the pause: {seen:?}"
    );
    assert!(second.resign().await.unwrap());
}
