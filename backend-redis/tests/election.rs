//! Leader election on Redis and RedLock, through the public API: the value a leader proclaims
//! is the one `leader()` shows under its epoch; a deposed leader's proclaim is refused and its
//! value never shows for a later leader; the value lives in the lock hash. The single server
//! runs every case; RedLock the value, deposition and succession cases against the masters the
//! crate's tests use. (At most one leader, observers and `run` are the conformance suite's.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock_api::Leader;
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
