//! TLS to ZooKeeper (feature `tls`), against a private server of the test's own with a TLS
//! client port serving a certificate of a throw-away test CA (`TestCerts`): clients made from
//! a `tls_ca` URL (with digest credentials too) and from the `tls_ca` setter lock and exclude
//! each other over TLS; a client that does not trust the server's certificate and a plaintext
//! client are refused as `Unavailable` within the connect timeout; an unreadable CA file is
//! `InvalidArgument` before any I/O.
#![cfg(feature = "tls")]

mod private_zk;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::given::{excludes_both_ways, skip_printed, unique_name};
use distlock_conformance::tls::TestCerts;
use distlock_zk::{ErrorKind, LockExt, NodeAcl, ZkConfig, ZkLock};
use private_zk::PrivateZk;
use tokio::task::block_in_place;

const CONNECT: Duration = Duration::from_secs(3);
/// The connect timeout plus room for a loaded machine.
const REFUSED_WITHIN: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_tls_and_untrusting_or_plaintext_clients_are_refused() {
    if skip_printed("zk") {
        return;
    }
    let certs = TestCerts::new("zk");
    let server = block_in_place(|| PrivateZk::start_tls(&certs));
    let hosts = server.tls_hosts();

    // From a URL: TLS trusting the test CA, with digest credentials over it.
    let url = format!(
        "zk://app:pw@{hosts}?tls_ca={}&connect_timeout=3s",
        certs.ca().display()
    );
    let by_url = ZkConfig::from_url(&url).unwrap();
    assert!(by_url.uses_tls());
    assert_eq!(by_url.get_node_acl(), NodeAcl::Creator);
    let by_url = Arc::new(
        ZkLock::connect(by_url)
            .await
            .expect("a TLS session from the URL"),
    );
    // From the setters.
    let by_setters = ZkConfig::new(&hosts)
        .unwrap()
        .tls_ca(certs.ca())
        .digest_auth("app", "pw")
        .connect_timeout(CONNECT);
    let by_setters = Arc::new(ZkLock::connect(by_setters).await.expect("a TLS session"));
    excludes_both_ways(&by_url, &by_setters, &unique_name("tls")).await;
    let guard = by_url
        .lock(&unique_name("tls-held"), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!guard.is_lost());
    assert!(guard.release().await.unwrap());

    // A client that trusts another CA is refused, within the connect timeout.
    let other = TestCerts::new("zk-other");
    let untrusting = ZkConfig::new(&hosts)
        .unwrap()
        .tls_ca(other.ca())
        .connect_timeout(CONNECT);
    let started = Instant::now();
    let Err(e) = ZkLock::connect(untrusting).await else {
        panic!("must be refused")
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("TLS"), "the error says TLS: {e}");
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "{:?}",
        started.elapsed()
    );

    // So is a client speaking plaintext to the TLS port.
    let plain = ZkConfig::new(&hosts).unwrap().connect_timeout(CONNECT);
    let started = Instant::now();
    let Err(e) = ZkLock::connect(plain).await else {
        panic!("must be refused")
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "{:?}",
        started.elapsed()
    );
    drop(server);
}

#[tokio::test]
async fn an_unreadable_or_empty_ca_file_is_invalid_argument_before_any_io() {
    let dir = std::env::temp_dir().join(unique_name("distlock-zk-tls-files"));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    // Port 1 on a TEST-NET address: any I/O would fail as Unavailable, not InvalidArgument.
    for ca in [dir.join("missing.pem"), empty] {
        let config = ZkConfig::new("192.0.2.1:1").unwrap().tls_ca(&ca);
        let started = Instant::now();
        let Err(e) = ZkLock::connect(config).await else {
            panic!("must be refused")
        };
        assert_eq!(
            e.kind(),
            ErrorKind::InvalidArgument,
            "{}: {e}",
            ca.display()
        );
        assert!(e.to_string().contains(&*ca.to_string_lossy()), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
