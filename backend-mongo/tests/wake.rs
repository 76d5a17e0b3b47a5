//! How soon a waiter on another client gets the lock after the holder releases it (woken by the
//! change stream, or by polling where there is none), measured over several hand-offs on the
//! server at `DISTLOCK_MONGO_URL` (default `mongodb://127.0.0.1:27017`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_mongo::{LockExt, LockOptions, MongoConfig, MongoLock, POLL_CAP};

async fn client() -> Arc<MongoLock> {
    let url = distlock_mongo::DESCRIPTOR.test_url();
    match MongoLock::connect(MongoConfig::from_url(&url).unwrap()).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("{e}\n  start the server: scripts/services up"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_within_the_backoff_cap_of_a_release() {
    let (holder, waiter) = (client().await, client().await);
    let name = format!("wake-{}-{}", std::process::id(), line!());
    let mut delays = Vec::new();
    for _ in 0..12 {
        // A long lease, so only the release can explain a prompt grant.
        let g = holder
            .try_lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(60)))
            .await
            .unwrap()
            .expect("free");
        let w = waiter.clone();
        let n = name.clone();
        let task = tokio::spawn(async move {
            let g = w.lock(&n, Duration::from_secs(30)).await;
            (Instant::now(), g)
        });
        // Long enough for the waiter's backoff to reach its cap.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let released = Instant::now();
        assert!(g.release().await.unwrap());
        let (granted, g2) = task.await.unwrap();
        delays.push(granted.saturating_duration_since(released));
        assert!(g2.unwrap().release().await.unwrap());
    }
    delays.sort();
    let (median, max) = (delays[delays.len() / 2], delays[delays.len() - 1]);
    eprintln!("release-to-grant: median {median:?}, max {max:?} (poll cap {POLL_CAP:?})");
    // A correctness bound, generous on purpose: one capped sleep plus round trips on a loaded
    // machine; a waiter stuck until the 60 s lease would be far past it.
    assert!(max < POLL_CAP + Duration::from_millis(900), "{delays:?}");
}
