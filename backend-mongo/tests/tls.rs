//! TLS to MongoDB through the driver's own URL options (`tls=true&tlsCAFile=…`, passed through
//! unchanged), against a private `secantusd-rs` of the test's own serving a certificate of a
//! throw-away test CA (`TestCerts`): two clients lock and exclude each other over TLS; a client
//! that trusts another CA, and one speaking plaintext to the TLS port, are refused as
//! `Unavailable` within the connect timeout.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::private_server::PrivateServer;
use distlock_conformance::given::{excludes_both_ways, skip_printed, unique_name};
use distlock_conformance::tls::TestCerts;
use distlock_mongo::{ErrorKind, LockExt, MongoConfig, MongoLock};

/// Ports of this test's servers (the restart test in fencing.rs uses 20000-20999).
const PORTS: std::ops::Range<u16> = 21000..21500;
/// The connect timeout of the clients that must be refused, and a bound on their refusal.
const CONNECT: Duration = Duration::from_secs(3);
const REFUSED_WITHIN: Duration = Duration::from_secs(10);

/// A private `secantusd-rs` with TLS on its only port.
struct TlsServer(PrivateServer);

impl TlsServer {
    fn start(certs: &TestCerts) -> Self {
        let (cert, key) = (certs.cert(), certs.key());
        Self(PrivateServer::start(
            "tls",
            PORTS,
            &[
                "--tls-cert-file".as_ref(),
                cert.as_os_str(),
                "--tls-key-file".as_ref(),
                key.as_os_str(),
            ],
        ))
    }

    fn url(&self, options: &str) -> String {
        format!("mongodb://127.0.0.1:{}/?{options}", self.0.port)
    }
}

async fn refused(url: &str) -> distlock_mongo::Error {
    let config = MongoConfig::from_url(url)
        .expect("a valid URL")
        .connect_timeout(CONNECT);
    let started = Instant::now();
    let Err(e) = MongoLock::connect(config).await else {
        panic!("must be refused")
    };
    eprintln!("refused after {:?}: {e}", started.elapsed());
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "refused only after {:?}",
        started.elapsed()
    );
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_the_drivers_tls_and_untrusting_or_plaintext_clients_are_refused() {
    if skip_printed("mongo") {
        return;
    }
    let certs = TestCerts::new("mongo");
    let server = tokio::task::block_in_place(|| TlsServer::start(&certs));
    let url = server.url(&format!(
        "tls=true&tlsCAFile={}&connect_timeout=10s",
        certs.ca().display()
    ));
    let a = Arc::new(
        MongoLock::connect(MongoConfig::from_url(&url).unwrap())
            .await
            .expect("a TLS connection trusting the test CA"),
    );
    let b = Arc::new(
        MongoLock::connect(MongoConfig::from_url(&url).unwrap())
            .await
            .unwrap(),
    );
    excludes_both_ways(&a, &b, &unique_name("tls")).await;
    let guard = a
        .lock(&unique_name("tls-held"), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!guard.is_lost());
    assert!(guard.release().await.unwrap());

    // Trusting another CA: the server's certificate is refused.
    let other = TestCerts::new("mongo-other");
    let e = refused(&server.url(&format!("tls=true&tlsCAFile={}", other.ca().display()))).await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Plaintext to the TLS port.
    let e = refused(&server.url("directConnection=true")).await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    drop(server);
}
