//! The sweeper deletes expired rows in batches and nothing else: never a live row, never the
//! fencing counter, whose next grant's token is still greater. Each test has a lock table of
//! its own, which no other client sweeps.

mod common;

use std::time::Duration;

use distlock_api::backend::AcquireRequest;
use distlock_postgres::{DistributedLock, LockExt, OwnerId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeping_deletes_expired_rows_in_batches_and_keeps_live_rows_and_counters() {
    let c = common::client_with(|c| {
        c.sweep_interval(None)
            .sweep_batch(2)
            .lock_table("sweep_batch_test_locks")
    })
    .await;
    let owner = OwnerId::new("sweeper-test").unwrap();
    let expired: Vec<_> = (0..5).map(|i| common::name(&format!("gone-{i}"))).collect();
    let mut tokens = Vec::new();
    for name in &expired {
        let req =
            AcquireRequest::new(name.clone(), owner.clone(), Duration::from_millis(50)).unwrap();
        let grant = c.attempt(&req).await.unwrap().into_grant().expect("free");
        tokens.push(grant.token);
    }
    let live = common::name("live");
    let guard = c.try_lock(live.as_str()).await.unwrap().expect("free");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let rows = |names: Vec<String>| {
        let pool = c.pool().clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM sweep_batch_test_locks WHERE name = ANY($1)",
            )
            .bind(names)
            .fetch_one(&pool)
            .await
            .unwrap();
            n
        }
    };
    let all: Vec<String> = expired.iter().map(|n| n.as_str().to_string()).collect();
    assert_eq!(rows(all.clone()).await, 5, "expired rows stay until swept");
    // Batches of 2: the sweep goes on until a batch comes back short (rows an earlier run
    // left behind are swept too).
    let swept = c.sweep_now().await.unwrap();
    assert!(swept >= 5, "swept {swept}");
    assert!(c.rows_swept() >= 5);
    assert_eq!(rows(all).await, 0, "every expired row is gone");
    assert_eq!(
        rows(vec![live.as_str().to_string()]).await,
        1,
        "the live row stays"
    );
    assert_eq!(
        c.inspect(&live).await.unwrap().unwrap().token,
        guard.token()
    );

    // The counters were not swept: the next grant of each name has a greater token.
    for (name, old) in expired.iter().zip(tokens) {
        let g = c.try_lock(name.as_str()).await.unwrap().expect("free");
        assert!(g.token() > old, "{name}: {:?} after {old:?}", g.token());
        assert!(g.release().await.unwrap());
    }
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_sweeper_runs_on_its_interval() {
    let c = common::client_with(|c| {
        c.sweep_interval(Some(Duration::from_millis(100)))
            .lock_table("sweep_bg_test_locks")
    })
    .await;
    let name = common::name("background");
    let req = AcquireRequest::new(
        name.clone(),
        OwnerId::new("bg").unwrap(),
        Duration::from_millis(20),
    )
    .unwrap();
    c.attempt(&req).await.unwrap().into_grant().expect("free");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sweep_bg_test_locks WHERE name = $1")
            .bind(name.as_str())
            .fetch_one(c.pool())
            .await
            .unwrap();
        if n == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not swept within 3 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
