//! Leader election on Redis and RedLock, through the public API: the value a leader proclaims
//! is the one `leader()` shows under its epoch; a deposed leader's proclaim is refused and its
//! value never shows for a later leader; at most one campaigner believes it leads; an observer
//! sees every change. The single server runs every case; RedLock the value, deposition and
//! succession cases against the masters the crate's tests use.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{Leader, Observer};
use distlock_redis::{DistributedLock, ErrorKind, LockExt, LockName, LockOptions};

type Shared = Arc<dyn DistributedLock>;

fn skipped(backend: &str) -> bool {
    let skip = distlock_conformance::skipped_by_env(backend);
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names {backend}");
    }
    skip
}

async fn redis() -> Shared {
    common::client().await
}

async fn redlock() -> Shared {
    common::redlock_client(&common::redlock_url()).await
}

fn opts() -> LockOptions {
    LockOptions::new().wait(Duration::from_secs(10))
}

async fn leader(locks: &Shared, name: &str) -> Option<Leader> {
    locks.election(name).unwrap().leader().await.unwrap()
}

/// (a) The leader's value is what it proclaimed; a second proclaim replaces it, same epoch.
async fn value_is_proclaimed_and_replaced(a: Shared, b: Shared) {
    let name = format!("{}e", common::unique("elect-value"));
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("v1", &opts())
        .await
        .unwrap();
    let seen = leader(&b, &name).await.expect("led");
    assert_eq!(seen.epoch, leading.epoch());
    assert_eq!(seen.owner, *leading.guard().owner());
    assert_eq!(seen.value.as_deref(), Some("v1"));
    // Any UTF-8, colons and newlines included, and the empty value.
    for v in ["10.0.0.7:9090\nshard: 3 🔒", ""] {
        leading.proclaim(v).await.unwrap();
        let seen = leader(&b, &name).await.expect("led");
        assert_eq!(
            (seen.epoch, seen.value.as_deref()),
            (leading.epoch(), Some(v))
        );
    }
    assert!(leading.resign().await.unwrap());
    assert_eq!(leader(&b, &name).await, None);
}

/// (b) After an operator's force release, the deposed leader's proclaim is `Lost` and its
/// value never shows again.
async fn deposed_leader_cannot_proclaim(a: Shared, b: Shared) {
    let name = format!("{}e", common::unique("elect-deposed"));
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("old", &opts())
        .await
        .unwrap();
    let epoch = leading.epoch();
    assert!(b.force_release(&name, epoch).await.unwrap());
    let err = leading.proclaim("late").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    // The backend itself refuses the grant, not only the guard.
    assert!(!a.proclaim(leading.guard().grant(), "late").await.unwrap());
    assert_eq!(leader(&b, &name).await, None);
    let next = b
        .election(&name)
        .unwrap()
        .campaign("new", &opts())
        .await
        .unwrap();
    assert!(!a.proclaim(leading.guard().grant(), "late").await.unwrap());
    let seen = leader(&a, &name).await.expect("led");
    assert!(seen.epoch > epoch);
    assert_eq!(seen.value.as_deref(), Some("new"));
    assert!(next.resign().await.unwrap());
    drop(leading);
}

/// (c) The next leader shows its own epoch and value, never the previous one's; between its
/// grant and its proclaim it shows no value at all.
async fn successor_never_shows_the_old_value(a: Shared, b: Shared) {
    let name = format!("{}e", common::unique("elect-next"));
    let election = a.election(&name).unwrap();
    let first = election.campaign("first", &opts()).await.unwrap();
    let first_epoch = first.epoch();
    assert!(first.resign().await.unwrap());

    // A bare grant of the name: the lock hash is new, and the old value is not there.
    let bare = b
        .try_lock_with(&name, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    let info = b.holder(&name).await.unwrap().expect("held");
    assert!(info.token > first_epoch);
    assert_eq!(info.value, None, "a value shown before any proclaim");
    assert!(bare.release().await.unwrap());

    let second = b
        .election(&name)
        .unwrap()
        .campaign("second", &opts())
        .await
        .unwrap();
    let seen = leader(&a, &name).await.expect("led");
    assert!(seen.epoch > first_epoch);
    assert_eq!(
        (seen.epoch, seen.value.as_deref()),
        (second.epoch(), Some("second"))
    );
    assert!(second.resign().await.unwrap());
}

/// (d) A fixed lease left to expire: the server refuses the proclaim.
async fn expired_lease_cannot_proclaim(a: Shared) {
    let name = format!("{}e", common::unique("elect-expired"));
    let short = opts().ttl(Duration::from_millis(300));
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("v", &short)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!a.proclaim(leading.guard().grant(), "late").await.unwrap());
    let err = leading.proclaim("late").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(leader(&a, &name).await, None);
}

#[tokio::test]
async fn redis_value_is_proclaimed_and_replaced() {
    if !skipped("redis") {
        value_is_proclaimed_and_replaced(redis().await, redis().await).await;
    }
}

#[tokio::test]
async fn redis_deposed_leader_cannot_proclaim() {
    if !skipped("redis") {
        deposed_leader_cannot_proclaim(redis().await, redis().await).await;
    }
}

#[tokio::test]
async fn redis_successor_never_shows_the_old_value() {
    if !skipped("redis") {
        successor_never_shows_the_old_value(redis().await, redis().await).await;
    }
}

#[tokio::test]
async fn redis_expired_lease_cannot_proclaim() {
    if !skipped("redis") {
        expired_lease_cannot_proclaim(redis().await).await;
    }
}

#[tokio::test]
async fn redlock_value_is_proclaimed_and_replaced() {
    if !skipped("redlock") {
        value_is_proclaimed_and_replaced(redlock().await, redlock().await).await;
    }
}

#[tokio::test]
async fn redlock_deposed_leader_cannot_proclaim() {
    if !skipped("redlock") {
        deposed_leader_cannot_proclaim(redlock().await, redlock().await).await;
    }
}

#[tokio::test]
async fn redlock_successor_never_shows_the_old_value() {
    if !skipped("redlock") {
        successor_never_shows_the_old_value(redlock().await, redlock().await).await;
    }
}

#[tokio::test]
async fn redlock_expired_lease_cannot_proclaim() {
    if !skipped("redlock") {
        expired_lease_cannot_proclaim(redlock().await).await;
    }
}

/// The value is a field of the lock hash, stored with its epoch: it goes with the hold.
#[tokio::test]
async fn redis_value_lives_in_the_lock_hash() {
    if skipped("redis") {
        return;
    }
    use distlock_redis::redis::AsyncCommands;
    let a = redis().await;
    let name = format!("{}e", common::unique("elect-hash"));
    let leading = a
        .election(&name)
        .unwrap()
        .campaign("here", &opts())
        .await
        .unwrap();
    let key = distlock_redis::RedisConfig::from_url(&common::redis_url())
        .unwrap()
        .lock_key(&LockName::new(&name).unwrap());
    let mut con = common::raw(&common::redis_url()).await.unwrap();
    let stored: Option<String> = con.hget(&key, "#value").await.unwrap();
    assert_eq!(stored, Some(format!("{}:here", leading.epoch().0)));
    // A value written under another epoch is not shown.
    let forged = format!("{}:forged", leading.epoch().0 + 1);
    let _: () = con.hset(&key, "#value", forged).await.unwrap();
    assert_eq!(leader(&a, &name).await.expect("led").value, None);
    assert!(leading.resign().await.unwrap());
    let exists: bool = con.exists(&key).await.unwrap();
    assert!(!exists, "the value outlived the hold");
}

/// (e) Two clients and two tasks sharing a third campaign in rounds: at most one believes it
/// leads at any moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_at_most_one_leader_believes() {
    if skipped("redis") {
        return;
    }
    let name = format!("{}e", common::unique("elect-one"));
    let shared = redis().await;
    let handles = [redis().await, redis().await, shared.clone(), shared];
    let believing = Arc::new(AtomicUsize::new(0));
    let led = Arc::new(AtomicUsize::new(0));
    let tasks = handles.into_iter().enumerate().map(|(i, locks)| {
        let (name, believing, led) = (name.clone(), believing.clone(), led.clone());
        tokio::spawn(async move {
            let election = locks.election(&name).unwrap();
            let opts = LockOptions::new().wait(Duration::from_secs(30));
            for round in 0..20 {
                let value = format!("c{i}-r{round}");
                let leading = election.campaign(&value, &opts).await.unwrap();
                assert_eq!(believing.fetch_add(1, Ordering::SeqCst), 0, "two leaders");
                let seen = election.leader().await.unwrap().expect("led");
                assert_eq!((seen.epoch, seen.value), (leading.epoch(), Some(value)));
                tokio::time::sleep(Duration::from_millis(2)).await;
                believing.fetch_sub(1, Ordering::SeqCst);
                led.fetch_add(1, Ordering::SeqCst);
                assert!(leading.resign().await.unwrap());
            }
        })
    });
    for t in futures::future::join_all(tasks).await {
        t.unwrap();
    }
    assert_eq!(led.load(Ordering::SeqCst), 80);
}

/// The observer's next change within a bound. A leader between its grant and its first
/// proclaim (no value yet) is passed over: the observer may read in that moment.
async fn next(observer: &mut Observer) -> Option<Leader> {
    loop {
        let seen = tokio::time::timeout(Duration::from_secs(5), observer.next())
            .await
            .expect("no change seen in time")
            .unwrap();
        if seen.as_ref().is_none_or(|l| l.value.is_some()) {
            return seen;
        }
    }
}

/// (f) An observer sees the first leader, its new value, nobody, then the next leader.
#[tokio::test]
async fn redis_observer_sees_every_change() {
    if skipped("redis") {
        return;
    }
    let (a, b, watcher) = (redis().await, redis().await, redis().await);
    let name = format!("{}e", common::unique("elect-observe"));
    let mut observer = watcher
        .election(&name)
        .unwrap()
        .observe()
        .every(Duration::from_millis(50));
    assert_eq!(next(&mut observer).await, None);
    let mut first = a
        .election(&name)
        .unwrap()
        .campaign("one", &opts())
        .await
        .unwrap();
    let seen = next(&mut observer).await.expect("led");
    assert_eq!(
        (seen.epoch, seen.value.as_deref()),
        (first.epoch(), Some("one"))
    );
    first.proclaim("one-b").await.unwrap();
    let seen = next(&mut observer).await.expect("led");
    assert_eq!(
        (seen.epoch, seen.value.as_deref()),
        (first.epoch(), Some("one-b"))
    );
    let first_epoch = first.epoch();
    assert!(first.resign().await.unwrap());
    assert_eq!(next(&mut observer).await, None);
    let second = b
        .election(&name)
        .unwrap()
        .campaign("two", &opts())
        .await
        .unwrap();
    let seen = next(&mut observer).await.expect("led");
    assert!(seen.epoch > first_epoch);
    assert_eq!(
        (seen.epoch, seen.value.as_deref()),
        (second.epoch(), Some("two"))
    );
    assert!(second.resign().await.unwrap());
}
