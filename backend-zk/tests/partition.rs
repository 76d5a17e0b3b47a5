//! A holder cut off from ZooKeeper (a loopback proxy that stops forwarding, as a network
//! partition would): its guard stops claiming the lock before the server lets anyone else
//! have it, `lost()` fires once the disconnection outlasts the session timeout, and after the
//! partition heals the client works again in a new session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::Proxy;
use distlock_zk::{DistributedLock, LockExt, LostReason, ZkConfig, ZkLock};

const SESSION: Duration = Duration::from_secs(1);
const BOUND: Duration = Duration::from_secs(10);

fn url() -> String {
    std::env::var("DISTLOCK_ZK_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181".into())
}

/// A proxy in front of the first server, with a config (of `SESSION`) straight to the server
/// and one through the proxy.
async fn behind_proxy() -> (ZkConfig, Proxy, ZkConfig) {
    let direct = ZkConfig::from_url(&url())
        .and_then(|c| c.session_timeout(SESSION))
        .unwrap();
    let upstream = direct.hosts().split(',').next().unwrap().to_string();
    let proxy = Proxy::start(upstream).await;
    let proxied = ZkConfig::from_url(&format!("zk://{}", proxy.addr()))
        .and_then(|c| c.session_timeout(SESSION))
        .unwrap();
    (direct, proxy, proxied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_holder_is_lost_before_anyone_else_acquires() {
    let (direct, proxy, proxied) = behind_proxy().await;
    let proxied = proxied.connect_timeout(Duration::from_secs(1)).unwrap();
    let holder = Arc::new(
        ZkLock::connect(proxied)
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start ZooKeeper: scripts/services up zookeeper")),
    );
    let waiter = Arc::new(ZkLock::connect(direct).await.unwrap());
    let name = format!("partition-{}", uuid::Uuid::new_v4().simple());

    let g = holder.lock(&name, BOUND).await.unwrap();
    let old_session = holder.session_id();
    let first = g.token();
    let lost = g.lost();
    // A few renewals go through before the cut.
    tokio::time::sleep(SESSION).await;
    assert!(!g.is_lost());
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let g = waiter.lock(&name, Duration::from_secs(30)).await;
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let cut_at = Instant::now();
    proxy.cut();
    let reason = tokio::time::timeout(BOUND, lost)
        .await
        .expect("lost() did not fire while partitioned");
    let lost_after = cut_at.elapsed();
    let (acquired_at, g2) = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the server never expired the partitioned holder's session")
        .expect("waiter task");
    let g2 = g2.expect("waiter");
    assert!(g2.token() > first);
    // The safety promise: the server frees the lock only after the holder's session timeout,
    // counted from the last request it heard, so the holder's safe-until (counted from the
    // last renewal it *sent*) has passed by then.
    let until = g
        .safe_until()
        .expect("session-bound leases have a safe-until");
    assert!(
        until <= acquired_at,
        "the partitioned holder could claim the lock {:?} after another client acquired it",
        until - acquired_at
    );
    assert!(g.is_lost());
    assert!(
        matches!(reason, LostReason::Expired | LostReason::Session(_)),
        "{reason:?}"
    );
    eprintln!(
        "cut at 0: holder's safe-until {:?}, lost() {lost_after:?} ({reason}), waiter acquired {:?}",
        until.saturating_duration_since(cut_at),
        acquired_at.saturating_duration_since(cut_at)
    );

    // Heal: the holder's client gets a new session and works again.
    proxy.heal();
    assert!(!g.release().await.unwrap_or(false));
    let renewed_by = Instant::now() + BOUND;
    while holder.session_id() == old_session {
        assert!(
            Instant::now() < renewed_by,
            "no new session after the partition healed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = format!("{name}-healed");
    let g3 = holder
        .lock(&other, BOUND)
        .await
        .expect("no working session after the partition healed");
    assert!(g3.release().await.unwrap());
    assert_eq!(
        waiter
            .holder(&name)
            .await
            .unwrap()
            .map(|i| i.owner)
            .as_ref(),
        Some(waiter.core().owner())
    );
    assert!(g2.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_whose_answer_is_lost_leaves_no_orphan() {
    let (direct, proxy, proxied) = behind_proxy().await;
    let contender = Arc::new(
        ZkLock::connect(proxied)
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start ZooKeeper: scripts/services up zookeeper")),
    );
    let holder = Arc::new(ZkLock::connect(direct).await.unwrap());
    let name = format!("lost-create-{}", uuid::Uuid::new_v4().simple());
    let path = holder.lock_path(&name).unwrap();
    let queue = || async {
        holder
            .client()
            .list_children(&path)
            .await
            .unwrap_or_default()
    };
    let g = holder.lock(&name, BOUND).await.unwrap();

    // The contender's create reaches the server, its answer never comes back: the client sees
    // a connection loss, reconnects, and must find the node it made instead of making another.
    proxy.mute(true);
    let waiting = {
        let (contender, name) = (contender.clone(), name.clone());
        tokio::spawn(async move { contender.lock(&name, Duration::from_secs(30)).await })
    };
    let created_by = Instant::now() + BOUND;
    while queue().await.len() < 2 {
        assert!(
            Instant::now() < created_by,
            "the contender's create never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.mute(false);
    // Long enough for the lost answer to be noticed and the queue re-read.
    tokio::time::sleep(SESSION).await;
    let nodes = queue().await;
    if nodes.len() != 2 {
        let r = waiting.await;
        panic!("an orphan or a missing node: {nodes:?}; contender: {r:?}");
    }

    assert!(g.release().await.unwrap());
    let g2 = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the contender never acquired")
        .expect("contender task")
        .expect("contender");
    assert_eq!(queue().await, [g2.grant().key.rsplit('/').next().unwrap()]);
    assert!(g2.release().await.unwrap());
    assert!(queue().await.is_empty());
}
