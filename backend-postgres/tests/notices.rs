//! `LISTEN/NOTIFY`: a waiter of another client wakes at the holder's release, long before the
//! holder's lease or the 5 s re-check would wake it; with notices off it polls.

mod common;

use std::time::{Duration, Instant};

use distlock_api::backend::wait::Waiting;
use distlock_postgres::{DistributedLock, LockExt, LockOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_another_client_wakes_at_the_release() {
    let holder = common::client_with(|c| c).await;
    // A backoff this long would make a polling waiter late by seconds.
    let waiter =
        common::client_with(|c| c.backoff(Duration::from_secs(10), Duration::from_secs(10))).await;
    assert!(matches!(waiter.profile().waiting, Waiting::Notify));
    let name = common::name("wake");
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = holder
        .try_lock_with(name.as_str(), &long)
        .await
        .unwrap()
        .expect("free");
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let g = waiter
                .lock(name.as_str(), Duration::from_secs(20))
                .await
                .unwrap();
            let at = Instant::now();
            assert!(g.release().await.unwrap());
            at
        })
    };
    // Let the waiter find the lock held and subscribe.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(waiter.listening(), "the waiter's client listens");
    let released = Instant::now();
    assert!(guard.release().await.unwrap());
    let granted = waiting.await.unwrap();
    let late = granted.saturating_duration_since(released);
    assert!(
        late < Duration::from_millis(500),
        "woken {late:?} after the release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_notices_off_waiters_poll_and_still_get_the_lock() {
    let holder = common::client_with(|c| c).await;
    let waiter = common::client_with(|c| c.notices(false)).await;
    assert!(matches!(waiter.profile().waiting, Waiting::Poll(_)));
    assert!(waiter.subscribe(&common::name("x")).await.is_err());
    let name = common::name("poll");
    let guard = holder.try_lock(name.as_str()).await.unwrap().expect("free");
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            waiter
                .lock(name.as_str(), Duration::from_secs(10))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(guard.release().await.unwrap());
    let g = waiting.await.unwrap();
    assert!(g.release().await.unwrap());
}
