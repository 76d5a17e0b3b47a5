//! A client on the application's own sqlx pool (`MysqlConfig::from_pool`), against the shared
//! server: it excludes and is excluded by a client made from a URL, its lock operations run on
//! the given pool, and a pool without a database is refused before any I/O.

mod common;
#[cfg(feature = "tls")]
#[path = "common/private_mariadb.rs"]
mod private_mariadb;

use std::sync::Arc;

use common::{skipped, PrivateTables};
use distlock_conformance::given::excludes_both_ways;
use distlock_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use distlock_mysql::{ErrorKind, MysqlConfig, MysqlLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_the_applications_pool_excludes_and_is_excluded_by_a_url_client() {
    if skipped() {
        return;
    }
    let tables = PrivateTables::new("byo");
    let by_url_config = tables.config();
    let pool = MySqlPoolOptions::new()
        .max_connections(3)
        .connect_lazy_with(by_url_config.connect_options());
    let config = MysqlConfig::from_pool(pool.clone())
        .expect("the pool names a database")
        .lock_table(&tables.locks)
        .fencing_table(&tables.fencing);
    assert_eq!(config.endpoint(), by_url_config.endpoint());
    assert_eq!(config.database(), by_url_config.database());
    let byo = Arc::new(
        MysqlLock::connect(config)
            .await
            .expect("connect on the given pool"),
    );
    assert!(
        byo.pool().options().get_max_connections() == 3,
        "lock operations run on the application's pool"
    );
    let by_url = Arc::new(MysqlLock::connect(by_url_config).await.unwrap());

    excludes_both_ways(&byo, &by_url, "byo").await;
    // The acquires went through the given pool: it has opened a connection.
    assert!(pool.size() >= 1, "the given pool was used");
    drop((byo, by_url));
    tables.drop_all().await;
}

#[test]
fn a_pool_whose_options_name_no_database_is_refused_before_any_io() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // connect_lazy_with needs a runtime, and opens nothing until used.
    let _enter = runtime.enter();
    let pool =
        MySqlPoolOptions::new().connect_lazy_with(MySqlConnectOptions::new().host("192.0.2.1"));
    let e = MysqlConfig::from_pool(pool.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("database"), "{e}");
    assert_eq!(pool.size(), 0, "nothing was connected");
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use distlock_conformance::tls::TestCerts;
    use distlock_mysql::sqlx::{self, Connection, MySqlConnection};

    use super::private_mariadb::PrivateMariadb;

    /// The cipher of the session `options` open; empty for a plain-text session.
    async fn cipher(options: &MySqlConnectOptions) -> String {
        let mut conn = MySqlConnection::connect_with(options)
            .await
            .expect("a session");
        let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .fetch_one(&mut conn)
            .await
            .expect("Ssl_cipher");
        let _ = conn.close().await;
        cipher
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_tls_by_url_and_by_pool_locks_exclude_and_an_untrusted_server_is_refused() {
        if skipped() {
            return;
        }
        // The application's part: this test connects with sqlx itself before distlock does,
        // and a build with several rustls providers (the workspace's, with the ZooKeeper
        // client's aws-lc-rs) needs one chosen first. distlock's own connect does the same.
        distlock_api::backend::ensure_crypto_provider();
        let certs = TestCerts::new("mariadb");
        let server = PrivateMariadb::start_with(vec![
            format!("--ssl-cert={}", certs.cert().display()),
            format!("--ssl-key={}", certs.key().display()),
            format!("--ssl-ca={}", certs.ca().display()),
        ])
        .await;
        let ca = certs.ca().display().to_string();

        // By URL: ssl-mode and ssl-ca.
        let by_url_config =
            MysqlConfig::from_url(&format!("{}?ssl-mode=verify_ca&ssl-ca={ca}", server.url()))
                .expect("TLS options are accepted with the tls feature");
        let options = by_url_config.connect_options();
        assert!(
            !cipher(&options).await.is_empty(),
            "the URL's session is encrypted"
        );
        let by_url = Arc::new(MysqlLock::connect(by_url_config).await.expect("TLS by URL"));

        // By pool: the application's options with its own TLS settings.
        let pool = MySqlPoolOptions::new()
            .max_connections(2)
            .connect_lazy_with(options.clone());
        let byo = Arc::new(
            MysqlLock::connect(MysqlConfig::from_pool(pool).unwrap())
                .await
                .expect("TLS by pool"),
        );
        excludes_both_ways(&byo, &by_url, "tls").await;

        // Verifying the CA without trusting the test CA fails the handshake, within the
        // connect timeout, and is not taken for bad input.
        let untrusted = MysqlConfig::from_url(&format!(
            "{}?ssl-mode=verify_ca&connect_timeout=3s",
            server.url()
        ))
        .unwrap();
        let e = MysqlLock::connect(untrusted)
            .await
            .expect_err("an untrusted certificate must not connect");
        // Reached but not trusted: not the temporary Unavailable of a server that is down.
        assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
        assert!(!e.is_temporary(), "{e}");
        assert!(e.to_string().contains("certificate"), "{e}");
        // A bad mode is refused before any I/O.
        let e = MysqlConfig::from_url(&format!("{}?ssl-mode=sometimes", server.url())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
}
