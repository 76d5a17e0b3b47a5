//! Destructive tests on private redis-servers (ports 20000-20999): restarts, masters going
//! down, and the derived RedLock fencing token across different majorities.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::private::PrivateRedis;
use distlock_redis::redis::AsyncCommands;
use distlock_redis::{
    ErrorKind, LockExt, LockName, LockOptions, RedLock, RedLockConfig, RedisConfig, RedisLock,
};

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redis");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
    }
    skip
}

/// Retries `f` until it succeeds, for up to 5 s: the first call after a restart may find the
/// old connection broken (Unavailable), the next reconnects.
async fn eventually<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = distlock_redis::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                assert!(e.is_temporary());
                assert!(Instant::now() < deadline, "still failing: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_loses_locks_and_restarts_tokens_but_the_client_recovers() {
    if skipped() {
        return;
    }
    let mut server = PrivateRedis::start_free();
    let config = RedisConfig::from_url(&server.url()).unwrap();
    let locks = Arc::new(RedisLock::connect(config).await.unwrap());
    let mut last = 0;
    for _ in 0..3 {
        let g = locks.try_lock("restart").await.unwrap().expect("free");
        assert!(g.token().0 > last);
        last = g.token().0;
        assert!(g.release().await.unwrap());
    }
    assert_eq!(last, 3);
    // Held across the restart with a watchdog lease: its next renewal finds the lock gone.
    let held = locks
        .try_lock_with(
            "held",
            &LockOptions::new().watchdog_ttl(Duration::from_millis(600)),
        )
        .await
        .unwrap()
        .expect("free");
    let lost = held.lost();
    server.restart();
    let reason = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("lost() did not fire after the server lost the lock");
    println!("guard across restart: {reason}");
    // The same client works again (reconnect, scripts reloaded on NOSCRIPT), and the counter
    // starts again at 1: fencing is only as durable as Redis persistence.
    let g = eventually(|| async { locks.try_lock("restart").await })
        .await
        .expect("free");
    assert_eq!(g.token().0, 1, "tokens restart after a restart without AOF");
    assert!(g.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_when_the_pubsub_connection_drops() {
    if skipped() {
        return;
    }
    let mut server = PrivateRedis::start_free();
    let connect = || async {
        let config = RedisConfig::from_url(&server.url()).unwrap();
        Arc::new(RedisLock::connect(config).await.unwrap())
    };
    let (a, b) = (connect().await, connect().await);
    let g = a
        .try_lock_with("w", &LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("w", Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted_at = Instant::now();
    server.restart();
    // The restart dropped both the lock and the waiter's subscription: the waiter must not sit
    // out the 60 s lease nor miss the lock being free. It either gets the lock or, if it retried
    // while the server was down, a temporary error at once.
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("waiter stuck after its pub/sub connection dropped")
        .unwrap();
    println!(
        "waiter after restart: {:?} in {:?}",
        outcome.as_ref().map(|g| g.token()),
        restarted_at.elapsed()
    );
    match outcome {
        Ok(g2) => assert!(g2.release().await.unwrap()),
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
    }
    drop(g);
}

async fn redlock(servers: &[&PrivateRedis]) -> distlock_redis::Result<Arc<RedLock>> {
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let config = RedLockConfig::from_urls(&urls)?.connect_timeout(Duration::from_millis(500));
    Ok(Arc::new(RedLock::connect(config).await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_works_with_one_master_down_and_is_unavailable_with_two() {
    if skipped() {
        return;
    }
    let (mut a, b, mut c) = (
        PrivateRedis::start_free(),
        PrivateRedis::start_free(),
        PrivateRedis::start_free(),
    );
    a.stop();
    // One of three down at start-up: still a majority.
    let locks = redlock(&[&a, &b, &c]).await.unwrap();
    let g = locks.try_lock("one-down").await.unwrap().expect("free");
    assert_eq!(
        locks.holder("one-down").await.unwrap().unwrap().token,
        g.token()
    );
    assert!(g.release().await.unwrap());
    c.stop();
    let e = locks.try_lock("one-down").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_temporary());
    let e = redlock(&[&a, &b, &c]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_tokens_increase_across_different_majorities() {
    if skipped() {
        return;
    }
    let (mut a, b, mut c) = (
        PrivateRedis::start_free(),
        PrivateRedis::start_free(),
        PrivateRedis::start_free(),
    );
    let locks = redlock(&[&a, &b, &c]).await.unwrap();
    let name = LockName::new("fence").unwrap();
    // Master A has seen many more grants of this name than B and C.
    let config = RedisConfig::from_url(&a.url()).unwrap();
    let mut raw_a = common::raw(&a.url()).await.unwrap();
    let _: () = raw_a.set(config.fence_key(&name), 100).await.unwrap();
    // A round ends at the first majority to answer; with C down that majority is {A, B}.
    c.stop();
    let g = locks.try_lock("fence").await.unwrap().expect("free");
    assert_eq!(
        g.token().0,
        101,
        "the token is the maximum over the majority"
    );
    assert!(g.release().await.unwrap());
    // Without A, the next majority is {B, C}, whose own counters were at 1: the write-back of
    // 101 is what keeps the next token above it.
    a.stop();
    c.restart();
    let g2 = eventually(|| locks.try_lock("fence")).await.expect("free");
    assert!(g2.token().0 > 101, "token went back to {}", g2.token());
    // Re-entry keeps the token.
    let g3 = g2.reenter().await.expect("held by us");
    assert_eq!((g3.token(), g3.hold_count()), (g2.token(), 2));
    assert!(g3.release().await.unwrap());
    assert!(g2.release().await.unwrap());
}

/// When the granting majority's counters agree, the derived token needs no write-back round
/// (nothing is written on the masters); when they do not, it is written back, and tokens keep
/// increasing across majorities either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_writes_the_token_back_only_when_the_majority_disagrees() {
    if skipped() {
        return;
    }
    let (mut a, b, mut c) = (
        PrivateRedis::start_free(),
        PrivateRedis::start_free(),
        PrivateRedis::start_free(),
    );
    let locks = redlock(&[&a, &b, &c]).await.unwrap();
    let name = LockName::new("agree").unwrap();
    let key = RedisConfig::from_url(&a.url()).unwrap().lock_key(&name);
    async fn fence_on(server: &PrivateRedis, key: &str) -> Option<u64> {
        let mut raw = common::raw(&server.url()).await.unwrap();
        raw.hget(key, "#fence").await.unwrap()
    }
    // {A, B}, both counters at 0: both answer 1, so the grant's token is 1 with no write-back.
    c.stop();
    let g = locks.try_lock("agree").await.unwrap().expect("free");
    assert_eq!(g.token().0, 1);
    assert_eq!(
        (fence_on(&a, &key).await, fence_on(&b, &key).await),
        (None, None),
        "a majority agreeing on the token needs no write-back"
    );
    assert!(g.release().await.unwrap());
    // {B, C}: B's counter is ahead of C's (C was down for the first grant, and every attempt
    // while C comes back counts on B only), so the token, B's, is written back to both, and
    // re-entry and the next grant keep to the order.
    a.stop();
    c.restart();
    let g2 = eventually(|| locks.try_lock("agree")).await.expect("free");
    let t2 = g2.token().0;
    assert!(t2 > 1, "token went back to {t2}");
    assert_eq!(
        (fence_on(&b, &key).await, fence_on(&c, &key).await),
        (Some(t2), Some(t2)),
        "counters that disagree get the derived token written back"
    );
    let g3 = g2.reenter().await.expect("held by us");
    assert_eq!((g3.token(), g3.hold_count()), (g2.token(), 2));
    assert!(g3.release().await.unwrap());
    assert!(g2.release().await.unwrap());
    let g4 = eventually(|| locks.try_lock("agree")).await.expect("free");
    assert!(g4.token().0 > t2, "token went back to {}", g4.token());
    assert!(g4.release().await.unwrap());
}

/// With the `tls` feature, `rediss://` to a server that does not speak TLS is an error (no
/// crypto provider installed, or a failed handshake), never a panic or a hang.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_to_a_plain_server_is_an_error_not_a_panic() {
    if skipped() {
        return;
    }
    let url = common::redis_url().replacen("redis://", "rediss://", 1);
    let config = RedisConfig::from_url(&url)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2));
    let started = Instant::now();
    let e = RedisLock::connect(config).await.unwrap_err();
    println!("rediss:// to a plain server: {e}");
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Unavailable | ErrorKind::InvalidArgument | ErrorKind::Backend
        ),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_makes_the_holder_report_lost_before_its_lease_ends_on_the_server() {
    if skipped() {
        return;
    }
    let server = PrivateRedis::start_free();
    let ttl = Duration::from_millis(1500);
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .response_timeout(Duration::from_millis(200));
    let holder = Arc::new(RedisLock::connect(config.clone()).await.unwrap());
    let name = "paused-server";
    let guard = holder
        .try_lock_with(name, &LockOptions::new().watchdog_ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    // Let a renewal or two succeed first: the watchdog works while the server answers.
    tokio::time::sleep(ttl).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());

    server.signal("STOP");
    let paused = Instant::now();
    let lost = tokio::time::timeout(ttl * 3, guard.lost()).await;
    let noticed = paused.elapsed();
    server.signal("CONT");
    let reason = lost.expect("a holder whose server froze never reported the lock lost");
    // Renewals time out, so only safe-until can end the claim: at most one lease after the
    // last successful renewal, which was at most a third of a lease before the pause.
    assert!(
        noticed <= ttl + ttl / 3 + Duration::from_millis(300),
        "noticed after {noticed:?}"
    );
    assert!(guard.is_lost(), "{reason:?}");

    // The server's own lease ends no earlier than the guard's safe-until: until then nobody
    // else can have it, after it the next client takes it and the old guard releases nothing.
    let other = Arc::new(RedisLock::connect(config).await.unwrap());
    let next = eventually(|| other.lock(name, Duration::from_secs(5))).await;
    assert!(next.token() > guard.token());
    assert!(
        !guard.release().await.unwrap(),
        "a lost guard's release reported held"
    );
    assert_eq!(
        other.holder(name).await.unwrap().map(|i| i.owner).as_ref(),
        Some(next.owner())
    );
    assert!(next.release().await.unwrap());
}
