//! Waiters are woken by the release message, not by timers: with the holder's lease 30 s long,
//! a waiter must acquire within a few milliseconds of the release.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, Notices};
use distlock_api::backend::{AcquireRequest, ClientCore};
use distlock_api::Profile;
use distlock_api::{DistributedLock, Grant, LockInfo};
use distlock_redis::redis;
use distlock_redis::{LockExt, LockName, LockOptions, RedLock, RedLockConfig, RedisConfig};

const ROUNDS: usize = 5;
/// Generous on purpose: a release-driven wake takes a few ms; a timer-driven one would take the
/// holder's 30 s lease (or the 5 s re-check at best).
const BOUND: Duration = Duration::from_millis(250);

async fn numsub(channel: &str) -> u64 {
    let mut con = common::raw(&common::redis_url()).await.expect("raw");
    let counts: Vec<(String, u64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut con)
        .await
        .expect("PUBSUB NUMSUB");
    counts.first().map_or(0, |c| c.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_acquires_within_milliseconds_of_the_release_while_the_lease_is_long() {
    if distlock_conformance::skipped_by_env("redis") {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
        return;
    }
    let (holder, waiter) = (common::client().await, common::client().await);
    let config = RedisConfig::from_url(&common::redis_url()).unwrap();
    let name = format!("wake-{}", uuid_like());
    let channel = config.release_channel(&LockName::new(&name).unwrap());
    let mut delays = Vec::new();
    for round in 0..ROUNDS {
        let g = holder
            .try_lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("free");
        let w = {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move {
                let g = waiter.lock(&name, Duration::from_secs(20)).await;
                (Instant::now(), g)
            })
        };
        // Let the waiter subscribe and settle into its wait.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(numsub(&channel).await, 1, "the waiter is not subscribed");
        let pttl = holder
            .holder(&name)
            .await
            .unwrap()
            .unwrap()
            .remaining
            .unwrap();
        assert!(pttl > Duration::from_secs(29), "holder lease only {pttl:?}");
        let released_at = Instant::now();
        assert!(g.release().await.unwrap());
        let (granted_at, g2) = w.await.unwrap();
        let g2 = g2.expect("waiter failed");
        let delay = granted_at.saturating_duration_since(released_at);
        println!(
            "round {round}: waiter acquired {delay:?} after the release (holder PTTL was {pttl:?})"
        );
        delays.push(delay);
        assert!(g2.release().await.unwrap());
    }
    delays.sort();
    println!(
        "wake latency over {ROUNDS} rounds: min {:?}, median {:?}, max {:?}",
        delays[0],
        delays[ROUNDS / 2],
        delays[ROUNDS - 1]
    );
    assert!(
        delays[ROUNDS - 1] < BOUND,
        "slowest wake {:?} (bound {BOUND:?})",
        delays[ROUNDS - 1]
    );
    // The waiters are gone: so is the subscription.
    let deadline = Instant::now() + Duration::from_secs(5);
    while numsub(&channel).await > 0 {
        assert!(Instant::now() < deadline, "subscription left behind");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn uuid_like() -> String {
    format!(
        "{:x}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// A RedLock client that counts the attempts (rounds) it sends.
struct Counted {
    inner: RedLock,
    attempts: AtomicUsize,
    hand_overs: AtomicUsize,
}

#[distlock_api::backend::async_trait]
impl DistributedLock for Counted {
    fn profile(&self) -> Profile {
        self.inner.profile()
    }

    async fn force_release(
        &self,
        name: &distlock_api::LockName,
        token: distlock_api::FencingToken,
    ) -> distlock_api::Result<bool> {
        distlock_api::backend::force_release_by_releases(self, name, token).await
    }

    async fn give_back(
        &self,
        surplus: &distlock_api::backend::Surplus,
    ) -> distlock_api::Result<bool> {
        distlock_api::backend::give_back_by_release(self, surplus).await
    }

    fn core(&self) -> &ClientCore {
        self.inner.core()
    }
    async fn subscribe(&self, name: &LockName) -> distlock_redis::Result<Box<dyn Notices>> {
        self.inner.subscribe(name).await
    }
    async fn attempt(&self, req: &AcquireRequest) -> distlock_redis::Result<Attempt> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        self.inner.attempt(req).await
    }
    async fn release(&self, grant: &Grant) -> distlock_redis::Result<bool> {
        self.inner.release(grant).await
    }
    async fn renew(&self, grant: &Grant, ttl: Duration) -> distlock_redis::Result<Duration> {
        self.inner.renew(grant, ttl).await
    }
    async fn proclaim(
        &self,
        grant: &distlock_api::Grant,
        value: &str,
    ) -> distlock_api::Result<bool> {
        self.inner.proclaim(grant, value).await
    }
    async fn inspect(&self, name: &LockName) -> distlock_redis::Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
    fn capabilities(&self) -> distlock_api::Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(
        &self,
        req: &distlock_api::backend::AcquireRequest,
        wait: std::time::Duration,
    ) -> distlock_api::Result<distlock_api::Grant> {
        self.inner.acquire(req, wait).await
    }
    async fn hand_over(
        &self,
        from: &distlock_api::Grant,
        to: &distlock_api::backend::AcquireRequest,
    ) -> distlock_api::Result<distlock_api::backend::wait::HandOver> {
        self.hand_overs.fetch_add(1, Ordering::SeqCst);
        self.inner.hand_over(from, to).await
    }
    fn keeper(&self) -> &dyn distlock_api::backend::LeaseKeeper {
        self.inner.keeper()
    }
    async fn renew_many(
        &self,
        grants: &[(distlock_api::Grant, std::time::Duration)],
    ) -> Vec<distlock_api::Result<std::time::Duration>> {
        self.inner.renew_many(grants).await
    }
    async fn list(
        &self,
        prefix: &str,
    ) -> distlock_api::Result<Vec<(distlock_api::LockName, distlock_api::LockInfo)>> {
        self.inner.list(prefix).await
    }
}

/// RedLock waiters listen to the masters' release channels instead of polling: while a holder
/// keeps the lock for a second, a waiter of another client sends two rounds (the first, and
/// one more after subscribing on every master) where its backoff (2 ms doubling to 100 ms)
/// would have sent about fifteen; a message from one master alone does not wake it, one from a
/// majority does; and the release wakes it for one or two more rounds (a release publishes on
/// each master, and a copy may arrive during the retry) well before the 5 s re-check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waiters_are_woken_by_the_masters_release_messages_not_by_polling() {
    if distlock_conformance::skipped_by_env("redlock") {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redlock");
        return;
    }
    let connect = || async {
        RedLock::connect(RedLockConfig::from_url(&common::redlock_url()).unwrap())
            .await
            .expect("the RedLock masters (scripts/services up)")
    };
    let holder = Arc::new(connect().await);
    let waiter = Arc::new(Counted {
        inner: connect().await,
        attempts: AtomicUsize::new(0),
        hand_overs: AtomicUsize::new(0),
    });
    assert_eq!(
        waiter.capabilities().blocking,
        distlock_api::Blocking::Signal
    );
    // The masters, as single-server URLs (the test masters have no password).
    let urls: Vec<String> = distlock_conformance::hosts_of(&common::redlock_url())
        .into_iter()
        .map(|h| format!("redis://{h}"))
        .collect();
    for round in 0..3 {
        let name = format!("redlock-wake-{round}-{}", uuid_like());
        let held = holder
            .lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(30)))
            .await
            .unwrap();
        let before = waiter.attempts.load(Ordering::SeqCst);
        let task = {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move { waiter.lock(&name, Duration::from_secs(20)).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let waiting = waiter.attempts.load(Ordering::SeqCst) - before;
        assert_eq!(waiting, 2, "rounds sent while the lock was held");
        for url in &urls {
            let n = common::subscribers(url, &LockName::new(&name).unwrap())
                .await
                .unwrap();
            assert_eq!(n, 1, "not subscribed on {url}");
        }
        if round == 0 && urls.len() >= 3 {
            // A message from one master (as a failed round's give-back on a minority sends)
            // wakes nobody; one from a second master makes a majority, and the waiter looks.
            let publish = |url: &String| {
                let url = url.clone();
                let name = name.clone();
                async move {
                    let config = RedisConfig::from_url(&url).unwrap();
                    let channel = config.release_channel(&LockName::new(&name).unwrap());
                    let mut con = common::raw(&url).await.unwrap();
                    let _: i64 = redis::cmd("PUBLISH")
                        .arg(channel)
                        .arg("released")
                        .query_async(&mut con)
                        .await
                        .unwrap();
                }
            };
            publish(&urls[0]).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                waiter.attempts.load(Ordering::SeqCst) - before,
                2,
                "woken by one master's message"
            );
            publish(&urls[1]).await;
            let until = Instant::now() + Duration::from_secs(3);
            while waiter.attempts.load(Ordering::SeqCst) - before < 3 {
                assert!(Instant::now() < until, "not woken by a majority's messages");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(waiter.attempts.load(Ordering::SeqCst) - before, 3);
        }
        let waiting = waiter.attempts.load(Ordering::SeqCst) - before;
        assert!(held.release().await.unwrap());
        let got = tokio::time::timeout(Duration::from_secs(3), task)
            .await
            .expect("woken by the release, not the 5 s re-check")
            .unwrap()
            .unwrap();
        let woken = waiter.attempts.load(Ordering::SeqCst) - before - waiting;
        assert!((1..=2).contains(&woken), "{woken} rounds after the release");
        assert!(got.release().await.unwrap());
    }
    // Turned off, the client says it polls and has no notices.
    let config = RedLockConfig::from_url(&common::redlock_url()).unwrap();
    let quiet = RedLock::connect(config.release_signals(false))
        .await
        .unwrap();
    assert_eq!(quiet.capabilities().blocking, distlock_api::Blocking::Poll);
    let refused = quiet.subscribe(&LockName::new("x").unwrap()).await;
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(distlock_api::ErrorKind::Unsupported)
    );
}

/// Only an owner's last release hands the lock to a waiting task of the handle: a release of
/// one of several holds is a plain release (the owner keeps the lock, so there is nothing to
/// pass on), and the last one passes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_owners_last_release_hands_the_lock_over() {
    if distlock_conformance::skipped_by_env("redlock") {
        return;
    }
    let lock = Arc::new(Counted {
        inner: RedLock::connect(RedLockConfig::from_url(&common::redlock_url()).unwrap())
            .await
            .unwrap(),
        attempts: AtomicUsize::new(0),
        hand_overs: AtomicUsize::new(0),
    });
    let name = common::unique("last-release-hands-over");
    let outer = lock.try_lock(&name).await.unwrap().expect("free");
    let inner = outer.reenter().await.unwrap();
    let waiter = tokio::spawn({
        let (lock, name) = (lock.clone(), name.clone());
        async move {
            let opts = LockOptions::new().wait(Duration::from_secs(10));
            lock.lock_with(&name, &opts).await
        }
    });
    // The waiting task has tried once and offers to take the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(inner.release().await.unwrap());
    assert_eq!(
        lock.hand_overs.load(Ordering::SeqCst),
        0,
        "an inner release"
    );
    assert!(!waiter.is_finished(), "the owner still holds the lock");
    // The inner release's hold stays counted until its last master has answered (then the
    // outer one is the last).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let outer_token = outer.token();
    assert!(outer.release().await.unwrap());
    let taken = waiter.await.unwrap().unwrap();
    assert!(taken.token() > outer_token);
    assert_eq!(
        lock.hand_overs.load(Ordering::SeqCst),
        1,
        "the last release"
    );
    assert!(taken.release().await.unwrap());
}
