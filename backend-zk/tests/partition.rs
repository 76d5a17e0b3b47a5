//! ZooKeeper behind a loopback proxy that loses the server's answers: a create whose answer
//! never came back must not leave an orphan node. (The partitioned holder and the server
//! outage are conformance cases, run on every server backend.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::Proxy;
use distlock_zk::{LockExt, ZkConfig, ZkLock};

const SESSION: Duration = Duration::from_secs(1);
const BOUND: Duration = Duration::from_secs(10);

fn url() -> String {
    distlock_zk::DESCRIPTOR.test_url()
}

/// A proxy in front of the first server, with a config (of `SESSION`) straight to the server
/// and one through the proxy.
async fn behind_proxy() -> (ZkConfig, Proxy, ZkConfig) {
    let direct = ZkConfig::from_url(&url())
        .map(|c| c.default_ttl(SESSION))
        .unwrap();
    let upstream = direct.hosts().split(',').next().unwrap().to_string();
    let proxy = Proxy::start(upstream).await;
    let proxied = ZkConfig::from_url(&format!("zk://{}", proxy.addr()))
        .map(|c| c.default_ttl(SESSION))
        .unwrap();
    (direct, proxy, proxied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_whose_answer_is_lost_leaves_no_orphan() {
    if distlock_conformance::skipped_by_env("zk") {
        eprintln!("SKIPPING create_whose_answer_is_lost_leaves_no_orphan: DISTLOCK_SKIP names zk");
        return;
    }
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
