//! `distlock::connect(url)` reaches every compiled-in backend's real server and hands back a
//! working lock; a closed port is `Unavailable`, not a hang.

use std::time::{Duration, Instant};

use distlock::{ErrorKind, LockExt};

/// (DISTLOCK_SKIP name, test URL) of every server backend this build has, from their
/// descriptors.
fn servers() -> Vec<(&'static str, String)> {
    distlock::backends()
        .into_iter()
        .filter(|d| d.id != "memory")
        .map(|d| (d.id, d.test_url()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_compiled_in_backend_connects_by_url_and_locks() {
    let name = format!("facade-connect-{}", std::process::id());
    for (backend, url) in servers() {
        if distlock_conformance::skipped_by_env(backend) {
            eprintln!("SKIPPING {backend}: DISTLOCK_SKIP names it");
            continue;
        }
        let (a, b) = match (distlock::connect(&url).await, distlock::connect(&url).await) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => panic!(
                "{backend} at {url}: {e}\n  start it with scripts/services up, or set DISTLOCK_SKIP={backend}"
            ),
        };
        let g = a
            .lock(&name, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{backend}: {e}"));
        assert!(
            b.try_lock(&name).await.unwrap().is_none(),
            "{backend}: not exclusive"
        );
        let info = b.holder(&name).await.unwrap().expect("held");
        assert_eq!(&info.owner, g.owner(), "{backend}");
        assert!(g.release().await.unwrap(), "{backend}: lost before release");
        let g2 = b
            .try_lock(&name)
            .await
            .unwrap()
            .expect("free after release");
        if a.capabilities().fencing_tokens() {
            assert!(g2.token() > info.token, "{backend}: token did not increase");
        }
        assert!(g2.release().await.unwrap());
    }
}

#[tokio::test]
async fn closed_port_is_unavailable_within_the_connect_timeout() {
    let urls = [
        ("redis", "redis://127.0.0.1:1?connect_timeout_ms=1000"),
        (
            "redis",
            "redis+cluster://127.0.0.1:1?connect_timeout_ms=1000",
        ),
        (
            "redis",
            "redis+sentinel://127.0.0.1:1/distlock?connect_timeout_ms=1000",
        ),
        (
            "mysql",
            "mysql://u:p@127.0.0.1:1/db?connect_timeout_ms=1000",
        ),
        (
            "mongo",
            "mongodb://127.0.0.1:1/?connectTimeoutMS=1000&serverSelectionTimeoutMS=1000",
        ),
        ("zk", "zk://127.0.0.1:1?connect_timeout_ms=1000"),
        ("etcd", "etcd://127.0.0.1:1?connect_timeout_ms=1000"),
    ];
    for (feature, url) in urls {
        let enabled = distlock::schemes()
            .iter()
            .any(|&(_, f, on)| f == Some(feature) && on);
        if !enabled {
            continue;
        }
        let started = Instant::now();
        let outcome = match distlock::connect(url).await {
            Err(e) => Err(e),
            Ok(lock) => lock.try_lock("x").await.map(|_| ()),
        };
        let e = outcome.expect_err(url);
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{url}: {e}");
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "{url} took {took:?}");
    }
}

/// `mongodb+srv://` is the MongoDB backend's: an SRV name that does not resolve is a server
/// that cannot be reached, not an unknown scheme.
#[cfg(feature = "mongo")]
#[tokio::test]
async fn mongodb_srv_urls_reach_the_mongo_backend() {
    let url = "mongodb+srv://cluster0.distlock-test.invalid/locks?connect_timeout=1s";
    let e = match distlock::connect(url).await {
        Err(e) => e,
        Ok(_) => panic!("{url} connected"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{url}: {e}");
}
