//! Waiters are woken by the release message, not by timers: with the holder's lease 30 s long,
//! a waiter must acquire within a few milliseconds of the release.

mod common;

use std::time::{Duration, Instant};

use distlock_redis::redis;
use distlock_redis::{LockExt, LockName, LockOptions, RedisConfig};

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
