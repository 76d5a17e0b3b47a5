//! A client connected through Redis Sentinel follows a failover: on a private topology of its
//! own (a master, one replica, three sentinels; see `common/sentinel.rs`), the master is killed
//! and the sentinels promote the replica. The grant was acknowledged by the replica first
//! (`WAIT 1`), so this is about following the new master, not about asynchronous replication's
//! hazard (see the crate docs).

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sentinel::{query, SentinelTopology, MASTER_NAME};
use distlock_redis::redis;
use distlock_redis::{LockExt, LockName, RedisConfig, RedisLock};

/// How long the client may take to reach the new master once the sentinels name it.
const FOLLOW_BOUND: Duration = Duration::from_secs(15);

async fn client(url: &str) -> Arc<RedisLock> {
    let config = RedisConfig::from_url(url).expect("sentinel URL");
    Arc::new(
        RedisLock::connect(config)
            .await
            .expect("connect through the sentinels"),
    )
}

/// Polls `check` every 50 ms until it gives `Some`, for at most `bound`.
async fn within<T, F, Fut>(bound: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + bound;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How the master goes away.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Failover {
    /// Killed, and the sentinels told to fail over at once.
    Kill,
    /// `SENTINEL FAILOVER` with the master up: it keeps accepting writes until Sentinel demotes
    /// it, seconds later, so the client must hear the sentinels' `+switch-master`.
    Manual,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_failover_and_its_waiter_is_woken_on_the_new_master() {
    follows(Failover::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_manual_failover_before_the_old_master_is_demoted() {
    follows(Failover::Manual).await;
}

async fn follows(how: Failover) {
    let mut topo = SentinelTopology::start().await;
    // A lease long enough to outlast the failover on the replica's copy without renewals.
    let url = topo.url("connect_timeout=1s&operation_timeout=1s&default_ttl=15s");
    let holder = client(&url).await;
    let waiter = client(&url).await;
    let config = RedisConfig::from_url(&url).unwrap();
    let name = format!("{}lock", common::unique("failover"));
    let lock_name = LockName::new(&name).unwrap();

    let g = holder.lock(&name, Duration::from_secs(5)).await.unwrap();
    let token = g.token().0;
    let acked: i64 = query(topo.master, redis::cmd("WAIT").arg(1).arg(1000))
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica did not acknowledge the grant");
    let on_replica: i64 = query(
        topo.replica,
        redis::cmd("EXISTS").arg(config.lock_key(&lock_name)),
    )
    .await
    .unwrap();
    assert_eq!(on_replica, 1, "the replica lacks the lock key");

    // A waiter of another client, blocked on the lock across the failover.
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move { waiter.lock(&name, Duration::from_secs(60)).await }
    });
    let channel = config.release_channel(&lock_name);
    let (master, channel) = (topo.master, &channel);
    within(
        Duration::from_secs(5),
        "the waiter subscribed",
        move || async move {
            let counts: Vec<(String, u64)> =
                query(master, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel))
                    .await
                    .ok()?;
            (counts.iter().map(|c| c.1).sum::<u64>() >= 1).then_some(())
        },
    )
    .await;

    // The master dies; the sentinels are told to fail over at once rather than after their
    // down-after period.
    let killed_at = Instant::now();
    if how == Failover::Kill {
        topo.kill_master();
    }
    let first_sentinel = topo.sentinels[0];
    within(
        Duration::from_secs(10),
        "SENTINEL FAILOVER accepted",
        move || async move {
            query::<String>(
                first_sentinel,
                redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME),
            )
            .await
            .ok()
        },
    )
    .await;
    let (replica, t) = (topo.replica, &topo);
    for port in topo.sentinels {
        within(
            Duration::from_secs(20),
            "every sentinel names the replica",
            move || async move { (t.master_of(port).await == Some(replica)).then_some(()) },
        )
        .await;
    }
    let promoted = killed_at.elapsed();

    // The holder's calls reach the new master: it still holds the lock, under its token.
    let (h, n) = (&holder, name.as_str());
    let info = within(
        FOLLOW_BOUND,
        "the holder's calls reach the new master",
        move || async move { h.holder(n).await.ok() },
    )
    .await
    .expect("the lock is held on the new master");
    let followed = killed_at.elapsed();
    assert_eq!(&info.owner, g.owner());
    assert_eq!(info.token.0, token);
    assert!(!g.is_lost(), "the guard reported lost across the failover");

    // Its watchdog renews it there: the lease on the new master rises. After a manual
    // failover this must happen before Sentinel demotes the old master (not sooner than 8 s
    // after the promotion), which the old master's connections would otherwise wait for.
    let renewed_before = g.safe_until().expect("a watchdog-kept lease");
    let key = config.lock_key(&lock_name);
    let last = AtomicI64::new(i64::MAX);
    let (key, last) = (&key, &last);
    let bound = match how {
        Failover::Kill => FOLLOW_BOUND,
        Failover::Manual => Duration::from_secs(7),
    };
    within(
        bound,
        "a renewal written on the new master",
        move || async move {
            let pttl: i64 = query(replica, redis::cmd("PTTL").arg(key)).await.ok()?;
            let before = last.swap(pttl, Ordering::SeqCst);
            (pttl > before.saturating_add(300)).then_some(())
        },
    )
    .await;
    let renewed = killed_at.elapsed();
    // The server wrote the renewal; its answer may still be on its way to the guard.
    let guard = &g;
    within(
        Duration::from_secs(2),
        "the guard saw its renewal",
        move || async move { (guard.safe_until().expect("lease") > renewed_before).then_some(()) },
    )
    .await;
    assert!(!g.is_lost());
    let old_role: Option<Vec<redis::Value>> =
        query(topo.master, &mut redis::cmd("ROLE")).await.ok();
    let old_role = old_role
        .and_then(|r| r.into_iter().next())
        .and_then(|v| redis::from_redis_value::<String>(v).ok());
    if waiting.is_finished() {
        panic!("the waiter ended across the failover: {:?}", waiting.await);
    }

    // The release on the new master wakes the waiter, whose grant has a greater token.
    let released_at = Instant::now();
    assert!(
        g.release().await.unwrap(),
        "the release found the lock not held"
    );
    let g2 = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter was not woken within 5 s of the release")
        .expect("the waiter's task panicked")
        .expect("the waiter's lock failed");
    let woken = released_at.elapsed();
    assert!(g2.token().0 > token, "token {} after {token}", g2.token());
    let holder_now = holder
        .holder(&name)
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(&holder_now.owner, g2.owner());
    eprintln!(
        "{how:?}: promoted {promoted:?} after the failover began; holder's next call at \
         {followed:?}, its renewal on the new master at {renewed:?} (the old master then: \
         {old_role:?}); waiter woken {woken:?} after the release"
    );
    assert!(g2.release().await.unwrap());
}
