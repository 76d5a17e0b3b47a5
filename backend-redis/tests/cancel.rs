//! An acquire dropped while its script is on the wire: the server grants the lock to a caller
//! that is gone, and the client must give that grant back at once rather than leave it to its
//! lease. (The conformance suite drops a waiter that was never polled again; these drop it
//! right after the acquire script was sent, which is the window the attempt runs in the
//! caller's own task.)

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use distlock_redis::redis::AsyncCommands;
use distlock_redis::{LockExt, LockName, LockOptions, RedisConfig, RedisLock};

/// The leases here are long: only a give-back frees the lock within this.
const GIVE_BACK: Duration = Duration::from_secs(3);

/// The name's fencing counter: how many fresh grants the server has made.
async fn grants(name: &str) -> u64 {
    let config = RedisConfig::from_url(&common::redis_url()).unwrap();
    let mut con = common::raw(&common::redis_url()).await.expect("raw");
    let n: Option<u64> = con
        .get(config.fence_key(&LockName::new(name).unwrap()))
        .await
        .expect("GET");
    n.unwrap_or(0)
}

async fn free_soon(c: &Arc<RedisLock>, name: &str) {
    let deadline = Instant::now() + GIVE_BACK;
    while c.holder(name).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "{name}: a grant whose caller was dropped is still held after {GIVE_BACK:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn poll_once<F: Future>(f: &mut Pin<Box<F>>) -> Poll<F::Output> {
    futures::poll!(f.as_mut())
}

/// Rounds in which the drop really happened mid-flight. One poll sends the script and its
/// answer is normally not back within that poll; a thread descheduled inside the poll can
/// see it back, and such a round proves nothing, so it is done over (up to a limit).
const ROUNDS: usize = 3;
const TRIES: usize = 20;

/// How long the proxy holds each chunk back, each way.
const IN_FLIGHT: Duration = Duration::from_millis(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_dropped_while_its_script_is_in_flight_gives_the_grant_back() {
    if distlock_conformance::skipped_by_env("redis") {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
        return;
    }
    // Through a proxy that holds every chunk back: the answer cannot be back within the one
    // poll that sends the script (on a loaded machine, without the delay, a poll descheduled
    // mid-way often saw it back, and such a round proves nothing).
    let (c, proxy) = common::client_behind_proxy().await;
    proxy.delay(IN_FLIGHT);
    let long = LockOptions::new().ttl(Duration::from_secs(60));
    let mut dropped = 0;
    for round in 0..TRIES {
        let name = common::unique(&format!("try-{round}"));
        let mut acquiring = Box::pin(c.try_lock_with(&name, &long));
        if let Poll::Ready(answer) = poll_once(&mut acquiring).await {
            let g = answer.unwrap().expect("a fresh name is free");
            assert!(g.release().await.unwrap());
            continue;
        }
        drop(acquiring);
        free_soon(&c, &name).await;
        assert_eq!(grants(&name).await, 1, "{name}: the script was not sent");
        dropped += 1;
        if dropped == ROUNDS {
            return;
        }
    }
    panic!("only {dropped} of {TRIES} acquires were still in flight after one poll");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_dropped_right_after_its_wake_up_retry_was_sent_gives_the_grant_back() {
    if distlock_conformance::skipped_by_env("redis") {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
        return;
    }
    let (holder, waiter) = (common::client().await, common::client().await);
    let long = LockOptions::new()
        .watchdog_ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(30));
    let mut dropped = 0;
    for round in 0..TRIES {
        let name = common::unique(&format!("wait-{round}"));
        let g = holder.lock_with(&name, &long).await.unwrap();
        let mut waiting = Box::pin(waiter.lock_with(&name, &long));
        // Until it has subscribed, retried and settled into its wait.
        for _ in 0..5 {
            assert!(
                poll_once(&mut waiting).await.is_pending(),
                "acquired a held lock"
            );
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        assert!(g.release().await.unwrap());
        // Let the release notice reach the client, then poll once: the waiter wakes and sends
        // its retry.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Poll::Ready(answer) = poll_once(&mut waiting).await {
            assert!(answer.unwrap().release().await.unwrap());
            continue;
        }
        drop(waiting);
        free_soon(&holder, &name).await;
        // 2: the holder's grant and the waiter's, given back. 1: the notice had not reached the
        // client by that poll, so no retry was sent and the round proves nothing.
        if grants(&name).await == 2 {
            dropped += 1;
            if dropped == ROUNDS {
                return;
            }
        }
    }
    panic!("only {dropped} of {TRIES} waiters were dropped with their retry in flight");
}
