//! Sessions opened with the application's own driver `Connector` (`ZkConfig::connector`),
//! against the shared server: a digest-authenticated client excludes and is excluded by a
//! client made from a URL, with the session timeout still the config's.

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::given::{excludes_both_ways, skip_printed, unique_name};
use distlock_zk::{zookeeper_client as zk, ZkConfig, ZkLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_the_applications_connector_excludes_and_is_excluded_by_a_url_client() {
    if skip_printed("zk") {
        return;
    }
    let by_url_config = ZkConfig::from_url(&distlock_zk::DESCRIPTOR.test_url()).unwrap();
    let connector = zk::Client::connector().with_auth("digest", b"distlock-test:secret");
    let config = by_url_config
        .clone()
        .connector(connector)
        .default_ttl(Duration::from_secs(6));
    let byo = Arc::new(
        ZkLock::connect(config)
            .await
            .expect("a session through the connector"),
    );
    assert_eq!(
        byo.session_timeout(),
        Duration::from_secs(6),
        "the session timeout is still the config's default_ttl"
    );
    let by_url = Arc::new(ZkLock::connect(by_url_config).await.unwrap());
    excludes_both_ways(&byo, &by_url, &unique_name("byo")).await;
}
