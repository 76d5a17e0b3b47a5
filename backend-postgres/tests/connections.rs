//! How a client uses its connections: counted as round trips through a loopback proxy in
//! front of the test server, which only this client's connections go through.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::Proxy;
use distlock_postgres::{LockExt, PostgresConfig, PostgresLock, SharedLock};

/// One lock cycle: one statement to acquire, one to release.
async fn cycle(lock: &SharedLock, name: &str) {
    let guard = lock.lock(name, Duration::from_secs(5)).await.expect("lock");
    assert!(guard.release().await.expect("release"));
}

/// sqlx pings every connection that goes back to its pool, a round trip of its own; a client
/// sets the connection of a statement that got its answer aside for its next statement
/// instead. So a run of lock cycles on one client costs the server exactly one round trip per
/// statement, where sqlx's pool would make two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consecutive_lock_operations_reuse_a_connection_without_pinging_it() {
    const CYCLES: u64 = 20;
    let options = PostgresConfig::from_url(&common::url())
        .expect("the test server's URL")
        .connect_options();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = Proxy::start(upstream.clone()).await;
    let through = common::url().replacen(&upstream, &proxy.addr(), 1);
    assert_ne!(through, common::url(), "the URL names {upstream}");
    // No listener (its notices are answers nobody asked for) and no sweeper: only the lock
    // statements go through the proxy.
    let config = PostgresConfig::from_url(&through)
        .expect("the proxied URL")
        .notices(false)
        .sweep_interval(None);
    let lock: SharedLock = Arc::new(PostgresLock::connect(config).await.expect("connect"));
    let name = common::name("connections");

    // The first cycle opens a connection in each pool and prepares the statements on them.
    cycle(&lock, name.as_str()).await;
    // A pool's ping runs in a task of its own after the hand-back: let any of them land.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = proxy.round_trips();
    for _ in 0..CYCLES {
        cycle(&lock, name.as_str()).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let trips = proxy.round_trips() - before;
    assert_eq!(
        trips,
        2 * CYCLES,
        "{CYCLES} lock cycles made {trips} round trips; each statement should take the \
         connection the last one set aside, with no ping on its way back"
    );
}
