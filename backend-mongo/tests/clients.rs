//! A client on the application's own `mongodb::Client` (`MongoConfig::from_client`), against
//! the shared server: it excludes and is excluded by a client made from a URL, so its lock
//! documents live where a URL client with the same database and collection finds them.

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::given::{excludes_both_ways, skip_printed, unique_name};
use distlock_mongo::{mongodb, MongoConfig, MongoLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_the_applications_mongodb_client_excludes_and_is_excluded_by_a_url_client() {
    if skip_printed("mongo") {
        return;
    }
    let url = distlock_mongo::DESCRIPTOR.test_url();
    let by_url_config = MongoConfig::from_url(&url).unwrap();
    let theirs = mongodb::Client::with_uri_str(url.split('?').next().unwrap())
        .await
        .expect("the test URL is valid");
    let config = MongoConfig::from_client(theirs)
        .database(by_url_config.get_database())
        .connect_timeout(Duration::from_secs(5));
    assert_eq!(config.get_collection(), by_url_config.get_collection());
    assert_eq!(config.endpoint(), "the application's MongoDB client");
    let byo = Arc::new(
        MongoLock::connect(config)
            .await
            .expect("connect through the given client"),
    );
    let by_url = Arc::new(MongoLock::connect(by_url_config).await.unwrap());
    excludes_both_ways(&byo, &by_url, &unique_name("byo")).await;
}
