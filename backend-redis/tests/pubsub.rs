//! The pub/sub side of waiting: one connection per client shared by all its waiters, one
//! subscription per channel however many waiters, nothing left once they are gone; and the
//! fencing counter outliving release and expiry.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use distlock_redis::redis::{self, AsyncCommands};
use distlock_redis::{LockExt, LockName, LockOptions, RedisConfig};

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redis");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
    }
    skip
}

/// `id → subscription count` of every pub/sub connection on the server.
async fn pubsub_clients() -> Vec<(String, u64)> {
    let mut con = common::raw(&common::redis_url()).await.unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .unwrap();
    list.lines()
        .filter_map(|line| {
            let field = |k: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(k).map(str::to_string))
            };
            Some((field("id=")?, field("sub=")?.parse().ok()?))
        })
        .collect()
}

async fn numsub(channels: &[String]) -> Vec<u64> {
    let mut con = common::raw(&common::redis_url()).await.unwrap();
    let counts: Vec<(String, u64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channels)
        .query_async(&mut con)
        .await
        .unwrap();
    counts.into_iter().map(|c| c.1).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_waiters_of_a_client_share_one_pubsub_connection_and_leave_nothing() {
    if skipped() {
        return;
    }
    let prefix = common::unique("share");
    let config = RedisConfig::from_url(&common::redis_url()).unwrap();
    let (holder, waiter) = (common::client().await, common::client().await);
    let names: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|s| format!("{prefix}{s}"))
        .collect();
    let channels: Vec<String> = names
        .iter()
        .map(|n| config.release_channel(&LockName::new(n).unwrap()))
        .collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(
            holder
                .try_lock_with(n, &LockOptions::new().ttl(Duration::from_secs(60)))
                .await
                .unwrap()
                .expect("free"),
        );
    }
    let before: HashSet<String> = pubsub_clients().await.into_iter().map(|c| c.0).collect();
    // Three waiters on the first name, one on each of the others: six waiters, four channels.
    let mut tasks = Vec::new();
    for n in [0, 0, 0, 1, 2, 3].map(|i| &names[i]) {
        let (w, n) = (waiter.clone(), n.clone());
        tasks.push(tokio::spawn(async move {
            w.lock(&n, Duration::from_secs(60)).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        numsub(&channels).await,
        vec![1, 1, 1, 1],
        "one subscription per channel"
    );
    let new: Vec<(String, u64)> = pubsub_clients()
        .await
        .into_iter()
        .filter(|c| !before.contains(&c.0))
        .collect();
    assert_eq!(
        new.iter().filter(|c| c.1 == 4).count(),
        1,
        "expected one new pub/sub connection holding all four channels, got {new:?}"
    );
    // The suite's leftover check sees exactly this state: four lock keys, four subscriptions.
    let left = common::leftovers(&common::redis_url(), &prefix)
        .await
        .unwrap();
    assert_eq!(
        left.iter().filter(|l| l.starts_with("key ")).count(),
        4,
        "{left:?}"
    );
    assert_eq!(
        left.iter().filter(|l| l.contains("subscription")).count(),
        4,
        "{left:?}"
    );
    assert!(!left.iter().any(|l| l.contains(":fence")), "{left:?}");
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while numsub(&channels).await.iter().any(|&n| n > 0) {
        assert!(
            Instant::now() < deadline,
            "cancelled waiters left subscriptions"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for g in guards {
        assert!(g.release().await.unwrap());
    }
    assert!(common::leftovers(&common::redis_url(), &prefix)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_counter_outlives_release_and_expiry() {
    if skipped() {
        return;
    }
    let name = format!("{}n", common::unique("fence"));
    let config = RedisConfig::from_url(&common::redis_url()).unwrap();
    let fence_key = config.fence_key(&LockName::new(&name).unwrap());
    let locks = common::client().await;
    let mut con = common::raw(&common::redis_url()).await.unwrap();
    let g = locks.try_lock(&name).await.unwrap().expect("free");
    let first = g.token().0;
    assert!(g.release().await.unwrap());
    let counter: u64 = con.get(&fence_key).await.unwrap();
    assert_eq!(counter, first, "counter gone or wrong after release");
    let g = locks
        .try_lock_with(&name, &LockOptions::new().ttl(Duration::from_millis(50)))
        .await
        .unwrap()
        .expect("free");
    let second = g.token().0;
    assert!(second > first);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(locks.holder(&name).await.unwrap().is_none(), "not expired");
    let counter: u64 = con.get(&fence_key).await.unwrap();
    assert_eq!(counter, second, "counter gone or wrong after expiry");
    let g3 = locks.try_lock(&name).await.unwrap().expect("free");
    assert!(g3.token().0 > second);
    assert!(g3.release().await.unwrap());
    drop(g);
    // Tidy: the counter is the one key distlock never deletes.
    let _: i64 = con.del(&fence_key).await.unwrap();
}
