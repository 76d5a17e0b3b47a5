//! Several endpoints: the client uses whichever answers.

mod common;

use std::time::Duration;

use distlock_etcd::{EtcdConfig, EtcdLock, LockExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_in_the_list_is_passed_over() {
    if common::skip() {
        return;
    }
    let live = common::config();
    // A closed port first: connect, locking and the keep-alive all go to the live one.
    let endpoints = std::iter::once("127.0.0.1:1".to_string()).chain(live.endpoints().to_vec());
    let config = EtcdConfig::new(endpoints)
        .map(|c| c.default_ttl(common::SHORT_TTL))
        .map(|c| c.connect_timeout(Duration::from_secs(5)))
        .expect("config");
    let c = std::sync::Arc::new(EtcdLock::connect(config).await.unwrap_or_else(|e| {
        panic!(
            "the etcd server at {} cannot be reached: {e}\n  start it: scripts/services up",
            common::url()
        )
    }));
    let name = common::unique("endpoints");
    for _ in 0..10 {
        let g = c.try_lock(&name).await.unwrap().expect("free");
        assert!(g.release().await.unwrap());
    }
    // Held across several keep-alives of the lease.
    let g = c.try_lock(&name).await.unwrap().expect("free");
    tokio::time::sleep(common::SHORT_TTL * 2).await;
    assert!(!g.is_lost(), "{:?}", g.lost_reason());
    assert!(g.release().await.unwrap());
}
