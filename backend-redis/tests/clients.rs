//! Clients the application built itself (`RedisConfig::from_client`,
//! `RedLockConfig::from_clients`) and TLS (`rediss://`, feature `tls`) against real servers: a
//! lock taken through one is held against clients made from URLs, and the other way round.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{redis_url, redlock_urls};
use distlock_conformance::given::{excludes_both_ways, skip_printed, unique_name};
use distlock_redis::redis;
use distlock_redis::{ErrorKind, LockExt, RedLock, RedLockConfig, RedisConfig, RedisLock};

#[tokio::test]
async fn a_client_of_the_applications_redis_client_excludes_and_is_excluded_by_a_url_client() {
    if skip_printed("redis") {
        return;
    }
    let theirs = redis::Client::open(redis_url()).expect("the test URL is valid");
    let config = RedisConfig::from_client(theirs);
    assert_eq!(
        config.endpoint(),
        RedisConfig::from_url(&redis_url()).unwrap().endpoint(),
        "the same server, named alike"
    );
    let byo = Arc::new(
        RedisLock::connect(config)
            .await
            .expect("connect through the given client"),
    );
    let by_url = Arc::new(
        RedisLock::connect(RedisConfig::from_url(&redis_url()).unwrap())
            .await
            .unwrap(),
    );
    excludes_both_ways(&byo, &by_url, &unique_name("byo")).await;
}

#[tokio::test]
async fn a_redlock_of_the_applications_clients_takes_a_majority_that_url_clients_see() {
    if skip_printed("redlock") {
        return;
    }
    // The masters as plain URLs, whichever form the test setting takes.
    let urls: Vec<String> = RedLockConfig::from_url(&redlock_urls())
        .expect("the test masters")
        .endpoints()
        .iter()
        .map(|e| format!("redis://{e}"))
        .collect();
    let clients = urls
        .iter()
        .map(|u| redis::Client::open(u.as_str()).expect("valid master URL"));
    let byo = Arc::new(
        RedLock::connect(RedLockConfig::from_clients(clients).unwrap())
            .await
            .expect("connect through the given clients"),
    );
    let by_url = Arc::new(
        RedLock::connect(RedLockConfig::from_urls(&urls).unwrap())
            .await
            .unwrap(),
    );
    excludes_both_ways(&byo, &by_url, &unique_name("byo")).await;

    // Fewer than three, or one twice, is refused before any I/O.
    let two = urls[..2]
        .iter()
        .map(|u| redis::Client::open(u.as_str()).unwrap());
    let e = RedLockConfig::from_clients(two).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let twice = [&urls[0], &urls[0], &urls[1]]
        .into_iter()
        .map(|u| redis::Client::open(u.as_str()).unwrap());
    let e = RedLockConfig::from_clients(twice).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("twice"), "{e}");
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use common::private::PrivateRedis;
    use distlock_conformance::tls::TestCerts;

    fn tls_server(certs: &TestCerts) -> PrivateRedis {
        PrivateRedis::start_free_tls(certs.cert(), certs.key(), certs.ca())
    }

    #[tokio::test]
    async fn a_lock_over_tls_with_the_applications_trusted_ca_works_and_excludes() {
        if skip_printed("redis") {
            return;
        }
        let certs = TestCerts::new("redis");
        let server = tls_server(&certs);
        let trusted = || {
            redis::Client::build_with_tls(
                server.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(certs.ca_pem()),
                },
            )
            .expect("a TLS client")
        };
        let a = Arc::new(
            RedisLock::connect(RedisConfig::from_client(trusted()))
                .await
                .expect("TLS handshake with the test CA trusted"),
        );
        let b = Arc::new(
            RedisLock::connect(RedisConfig::from_client(trusted()))
                .await
                .unwrap(),
        );
        let name = "tls-held";
        let guard = a.try_lock(name).await.unwrap().expect("a free lock");
        assert!(
            b.try_lock(name).await.unwrap().is_none(),
            "held over TLS too"
        );
        // A waiter over TLS is woken by the release notice (pub/sub over TLS as well).
        let waiter = tokio::spawn(async move {
            let g = b.lock(name, Duration::from_secs(10)).await;
            (b, g)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let (_b, g) = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter is granted")
            .unwrap();
        let g = g.expect("granted after the release");
        assert!(released.elapsed() < Duration::from_secs(10));
        g.release().await.unwrap();
    }

    #[tokio::test]
    async fn rediss_url_to_a_server_whose_certificate_is_not_trusted_fails_fast_without_locking() {
        if skip_printed("redis") {
            return;
        }
        let certs = TestCerts::new("redis-untrusted");
        let server = tls_server(&certs);
        // The URL path trusts the system's store, which does not hold the test CA.
        let config = RedisConfig::from_url(&server.url())
            .unwrap()
            .connect_timeout(Duration::from_secs(2));
        let started = Instant::now();
        let e = RedisLock::connect(config)
            .await
            .expect_err("an untrusted certificate must not connect");
        // Reached but not trusted: not the temporary Unavailable of a server that is down.
        assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
        assert!(!e.is_temporary(), "{e}");
        assert!(e.to_string().contains("certificate"), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "bounded by the connect timeout, took {:?}",
            started.elapsed()
        );
        // And a plain-text client cannot talk to the TLS port either.
        let plain = format!("redis://127.0.0.1:{}", server.port);
        let e = RedisLock::connect(
            RedisConfig::from_url(&plain)
                .unwrap()
                .connect_timeout(Duration::from_secs(1))
                .operation_timeout(Duration::from_secs(1)),
        )
        .await
        .expect_err("plain text to a TLS port");
        assert!(
            matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Backend),
            "{e}"
        );
    }
}
