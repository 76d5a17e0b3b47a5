//! etcd semaphores beyond the conformance suite: a waiter beyond `max` is granted by the delete
//! event of a release, with no request of its own; a release wakes one waiter, and the others
//! send nothing; a conflicting `max`, a lock on a semaphore's name and a permit on a locked
//! name are refused and leave nothing behind; and a holder whose lease ends gives its permit
//! to a waiter.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_etcd::{ErrorKind, EtcdLock, LockExt, LockGuard, LockName, LockOptions};
use tokio::task::JoinHandle;

async fn client() -> Arc<EtcdLock> {
    Arc::new(
        EtcdLock::connect(common::config())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the etcd server at {} cannot be reached: {e}\n  start it: scripts/services up",
                    common::url()
                )
            }),
    )
}

fn waiting() -> LockOptions {
    LockOptions::new().wait(Duration::from_secs(30))
}

/// How many entries (holders and waiters) `name` has on the server.
async fn entries(raw: &distlock_etcd::etcd_client::Client, name: &str) -> usize {
    common::entries_of(raw, &LockName::new(name).unwrap())
        .await
        .len()
}

/// Waits until `name` has `n` entries.
async fn until_entries(raw: &distlock_etcd::etcd_client::Client, name: &str, n: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while entries(raw, name).await != n {
        assert!(Instant::now() < until, "{name} never had {n} entries");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A waiter for a permit of `max` on `c`, reporting when it was granted and how many requests
/// its client had sent by then.
fn wait_for_permit(
    c: &Arc<EtcdLock>,
    name: &str,
    max: u32,
) -> JoinHandle<(Instant, u64, LockGuard)> {
    let (c, name) = (c.clone(), name.to_string());
    tokio::spawn(async move {
        let g = c.permit(&name, max, &waiting()).await.expect("permit");
        (Instant::now(), c.requests_sent(), g)
    })
}

/// Lets the waiters settle: subscribed, counted, waiting.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_beyond_max_is_granted_by_the_release_event() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let name = common::unique("sem-event");
    let (holder, other) = (client().await, client().await);
    let opts = LockOptions::new();
    let first = holder.try_permit(&name, 2, &opts).await.unwrap().unwrap();
    let second = holder.try_permit(&name, 2, &opts).await.unwrap().unwrap();
    let waiter = wait_for_permit(&other, &name, 2);
    until_entries(&raw, &name, 3).await;
    settle().await;
    assert!(
        !waiter.is_finished(),
        "granted while both permits were held"
    );
    // Its queueing, its look at the queue after subscribing, and nothing since.
    let before = other.requests_sent();
    assert!(before <= 3, "{before} requests to queue and wait");
    // Past the waiter's periodic look (5 s) it would poll: the grant must come well before.
    let released = Instant::now();
    let second_token = second.token();
    assert!(second.release().await.unwrap());
    let (granted, requests, g) = waiter.await.unwrap();
    assert!(granted >= released);
    let took = granted - released;
    assert!(
        took < Duration::from_secs(1),
        "granted {took:?} after the release"
    );
    assert_eq!(
        requests, before,
        "the waiter sent a request to take its permit: granted by the event alone"
    );
    assert!(g.token() > second_token);
    assert_eq!(holder.holder(&name).await.unwrap().unwrap().permits, (2, 2));
    assert!(g.release().await.unwrap());
    assert!(first.release().await.unwrap());
    assert_eq!(entries(&raw, &name).await, 0);
}

/// Waiters on separate clients (each subscribes and counts the queue itself) and on one client
/// (the later ones count from their queueing, on the watch the first one made).
async fn one_release_wakes_one_waiter(shared_client: bool) {
    const MAX: u32 = 2;
    const WAITERS: usize = 4;
    let raw = common::raw().await;
    let name = common::unique(if shared_client {
        "sem-herd1"
    } else {
        "sem-herdn"
    });
    let holder = client().await;
    let mut held = Vec::new();
    for _ in 0..MAX {
        held.push(
            holder
                .try_permit(&name, MAX, &LockOptions::new())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let one = client().await;
    let mut clients = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let c = if shared_client {
            one.clone()
        } else {
            client().await
        };
        waiters.push(Some(wait_for_permit(&c, &name, MAX)));
        clients.push(c);
        // Queued in this order.
        until_entries(&raw, &name, MAX as usize + i + 1).await;
    }
    settle().await;
    let mut granted = Vec::new();
    for turn in 0..WAITERS {
        let before: Vec<u64> = clients.iter().map(|c| c.requests_sent()).collect();
        // A holder gives its permit back: the oldest waiter, and only it, takes it.
        let g = held.remove(0);
        assert!(g.release().await.unwrap());
        let (_, requests, g) = waiters[turn].take().unwrap().await.unwrap();
        if !shared_client {
            // (On one client, the permits granted before renew meanwhile.)
            assert_eq!(
                requests, before[turn],
                "waiter {turn} sent a request at its grant"
            );
        }
        settle().await;
        for (i, w) in waiters.iter().enumerate() {
            if let Some(w) = w {
                assert!(
                    !w.is_finished(),
                    "waiter {i} was granted at waiter {turn}'s turn"
                );
            }
        }
        if !shared_client {
            for (i, c) in clients.iter().enumerate().skip(turn + 1) {
                assert_eq!(
                    c.requests_sent(),
                    before[i],
                    "waiter {i} sent a request at a release that did not make it first"
                );
            }
        }
        assert_eq!(
            entries(&raw, &name).await,
            MAX as usize + WAITERS - turn - 1
        );
        granted.push(g.token());
        held.push(g);
    }
    assert!(
        granted.windows(2).all(|w| w[0] < w[1]),
        "granted in queue order"
    );
    for g in held {
        assert!(g.release().await.unwrap());
    }
    assert_eq!(entries(&raw, &name).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_of_separate_clients() {
    if common::skip() {
        return;
    }
    one_release_wakes_one_waiter(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_of_one_client() {
    if common::skip() {
        return;
    }
    one_release_wakes_one_waiter(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_max_is_refused_and_leaves_nothing() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let name = common::unique("sem-size");
    let (a, b) = (client().await, client().await);
    let g = a
        .try_permit(&name, 3, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    for max in [2, 4, 30, 10_000] {
        let e = b
            .try_permit(&name, max, &LockOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "max {max}: {e}");
        assert!(e.to_string().contains("semaphore of 3"), "{e}");
        let e = b.permit(&name, max, &waiting()).await.unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::InvalidArgument,
            "max {max}, waiting: {e}"
        );
    }
    assert_eq!(entries(&raw, &name).await, 1, "only the holder's entry");
    assert!(g.release().await.unwrap());
    // Free again: the next holder sets the size.
    let g = b
        .try_permit(&name, 4, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.holder(&name).await.unwrap().unwrap().permits, (1, 4));
    assert!(g.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_semaphore_of_one_name_refuse_each_other() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let (a, b) = (client().await, client().await);

    let name = common::unique("sem-vs-lock");
    let permit = a
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let e = b.try_lock(&name).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = b.lock(&name, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "waiting: {e}");
    assert_eq!(entries(&raw, &name).await, 1);
    assert!(permit.release().await.unwrap());

    let name = common::unique("lock-vs-sem");
    let lock = a.try_lock(&name).await.unwrap().unwrap();
    let e = b
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("as a lock"), "{e}");
    let e = b.permit(&name, 5, &waiting()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "waiting: {e}");
    // A lock with waiters: still refused.
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.lock(&name, Duration::from_secs(30)).await })
    };
    until_entries(&raw, &name, 2).await;
    let e = a
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(entries(&raw, &name).await, 2);
    assert!(lock.release().await.unwrap());
    let next = waiter.await.unwrap().expect("the lock's waiter");
    assert!(next.release().await.unwrap());
    assert_eq!(entries(&raw, &name).await, 0);
}

/// A lock and a semaphore asked for at once on a free name: one kind wins, never both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_permit_racing_for_a_free_name_never_both_hold() {
    if common::skip() {
        return;
    }
    let (a, b, c) = (client().await, client().await, client().await);
    for round in 0..20 {
        let name = format!("{}{round}", common::unique("sem-race"));
        let opts = LockOptions::new();
        let (lock, permit, other) = tokio::join!(
            a.try_lock(&name),
            b.try_permit(&name, 3, &opts),
            c.try_permit(&name, 2, &opts),
        );
        let won = |r: &distlock_etcd::Result<Option<LockGuard>>| match r {
            Ok(g) => g.is_some(),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
                false
            }
        };
        let winners = [won(&lock), won(&permit), won(&other)];
        assert_eq!(
            winners.iter().filter(|&&w| w).count(),
            1,
            "round {round}: {winners:?}"
        );
        for g in [lock, permit, other]
            .into_iter()
            .flat_map(|r| r.ok().flatten())
        {
            assert!(g.release().await.unwrap());
        }
    }
}

/// A holder whose lease ends (revoked here, as the server does when a client dies and its
/// lease expires) gives its permit to the waiter at once; the other permit stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_returns_when_its_holders_lease_ends() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let name = common::unique("sem-lease");
    let (live, dying, other) = (client().await, client().await, client().await);
    let kept = live
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let doomed = dying
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let waiter = wait_for_permit(&other, &name, 2);
    until_entries(&raw, &name, 3).await;
    settle().await;
    let revoked = Instant::now();
    raw.lease_client()
        .revoke(dying.lease_id().unwrap())
        .await
        .unwrap();
    let (granted, _, g) = waiter.await.unwrap();
    assert!(granted - revoked < Duration::from_secs(1));
    assert!(g.token() > doomed.token());
    tokio::time::timeout(Duration::from_secs(5), doomed.lost())
        .await
        .expect("the revoked holder learns it lost its permit");
    assert!(!kept.is_lost());
    assert!(kept.release().await.unwrap());
    assert!(g.release().await.unwrap());
}

/// The operator's view: `holder` shows the oldest permit and the count, `list` the name once,
/// and `force_release` frees the permit of the token it is given, whichever permit that is,
/// but not a waiter's entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_and_free_single_permits() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let name = common::unique("sem-op");
    let (a, b, w) = (client().await, client().await, client().await);
    let first = a
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let second = b
        .try_permit(&name, 2, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let waiter = wait_for_permit(&w, &name, 2);
    until_entries(&raw, &name, 3).await;
    let info = a.holder(&name).await.unwrap().unwrap();
    assert_eq!(
        (info.token, info.permits, &info.owner),
        (first.token(), (2, 2), first.owner())
    );
    let listed = a.list(&name).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.permits, (2, 2));
    // The waiter's entry holds nothing: its token, were it one, is not force-released.
    let waiter_rev = {
        let keys = common::entries_of(&raw, &LockName::new(&name).unwrap()).await;
        let mut revs = Vec::new();
        for k in keys {
            let resp = raw.kv_client().get(k, None).await.unwrap();
            revs.push(resp.kvs()[0].create_revision());
        }
        revs.into_iter().max().unwrap()
    };
    let not_held = distlock_etcd::FencingToken(waiter_rev as u64);
    assert!(!a.force_release(&name, not_held).await.unwrap());
    // The second permit, not the oldest.
    assert!(a.force_release(&name, second.token()).await.unwrap());
    let (_, _, g) = waiter.await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), second.lost())
        .await
        .expect("the force-released holder learns it");
    assert!(!first.is_lost());
    assert!(!a.force_release(&name, second.token()).await.unwrap());
    assert!(first.release().await.unwrap());
    assert!(g.release().await.unwrap());
    assert_eq!(entries(&raw, &name).await, 0);
}
