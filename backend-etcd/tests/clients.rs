//! A client on the application's own `etcd_client::Client` (`EtcdConfig::from_client`),
//! against the shared server: it excludes and is excluded by a client made from a URL, and its
//! lease is granted and kept through the given connection.

mod common;

use std::sync::Arc;

use distlock_conformance::given::{excludes_both_ways, unique_name};
use distlock_etcd::{EtcdConfig, EtcdLock, LockExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_the_applications_etcd_client_excludes_and_is_excluded_by_a_url_client() {
    if common::skip() {
        return;
    }
    let theirs = common::raw().await;
    let config = EtcdConfig::from_client(theirs).default_ttl(common::SHORT_TTL);
    assert_eq!(config.endpoints(), ["the application's etcd client"]);
    let byo = Arc::new(
        EtcdLock::connect(config)
            .await
            .expect("a lease through the given client"),
    );
    assert!(byo.lease_id().is_some(), "the client's lease was granted");
    let by_url = Arc::new(EtcdLock::connect(common::config()).await.unwrap());
    let name = unique_name("byo");
    excludes_both_ways(&byo, &by_url, &name).await;

    // Held across several lease periods: the keep-alive runs on the given client.
    let guard = byo.try_lock(&name).await.unwrap().expect("free");
    tokio::time::sleep(common::SHORT_TTL * 2).await;
    assert!(!guard.is_lost(), "the lease was kept alive");
    assert!(by_url.try_lock(&name).await.unwrap().is_none());
    assert!(guard.release().await.unwrap());
}
