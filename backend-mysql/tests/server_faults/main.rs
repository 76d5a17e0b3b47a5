//! Real server faults, on a private MariaDB server that each test starts for itself (see
//! `common/private_mariadb.rs`): a crash (SIGKILL) and restart on the same data directory while
//! a watchdog-managed lock is held (`restart.rs`), a pause (SIGSTOP) longer than the lease
//! (`pause.rs`), calls made on already-open connections to a paused server (the operation
//! timeout, `timeouts.rs`), and waits and hand-overs a paused server cuts off (`signals.rs`).
//! What these share with the other backends' server-fault tests is in
//! [`distlock_conformance::server_faults`].
//!
//! Needs `mariadbd` and `mariadb-install-db` (`scripts/services up mariadb` installs them); a
//! machine without them fails these tests with that hint. Skipped when `DISTLOCK_SKIP` names
//! `mysql`. The shared server (`DISTLOCK_MYSQL_URL`) is not used.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/private_mariadb.rs"]
mod private_mariadb;

mod pause;
mod restart;
mod signals;
mod timeouts;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::server_faults::{self, bounded, delta_ms, ms, Contender, LeaseLeft};
use distlock_conformance::watch_lost;
use distlock_mysql::{
    DistributedLock, Error, ErrorKind, FencingToken, LockExt, LockGuard, LockInfo, LockOptions,
    LostReason, MysqlConfig, MysqlLock, OwnerId, Result,
};
use private_mariadb::PrivateMariadb;

/// Connecting, and waiting for a pooled connection, give up after this: a call to a server
/// that is down answers `Unavailable` by then.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Each test as a whole; past it the test fails as hung.
const BUDGET: Duration = Duration::from_secs(60);
/// Scheduling slack allowed on a loaded two-core machine between a deadline and the task that
/// waits for it running.
const SLACK: Duration = Duration::from_millis(250);
/// The operation timeout of the clients of the paused-server test.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(1);
/// What a call to the paused server may take beyond its time limit: the timer's wake-up and
/// closing the connection, on a loaded two-core machine.
const MARGIN: Duration = Duration::from_millis(500);
/// The watchdog lease of the paused-server test: shorter than the pause, so the holder's guard
/// must report its lock lost while the server is stopped.
const PAUSED_TTL: Duration = Duration::from_secs(3);

/// A client of the private server with its own owner id and watchdog lease.
async fn client(server: &PrivateMariadb, owner: &str, ttl: Duration) -> Arc<MysqlLock> {
    connect(client_config(server, owner, ttl)).await
}

/// The config of [`client`].
fn client_config(server: &PrivateMariadb, owner: &str, ttl: Duration) -> MysqlConfig {
    MysqlConfig::from_url(&server.url())
        .expect("private server URL")
        .owner(OwnerId::new(owner).expect("owner id"))
        .default_ttl(ttl)
        .connect_timeout(CONNECT_TIMEOUT)
        // The sweeper runs through every fault too; it must never delete a live row.
        .sweep_interval(Some(Duration::from_millis(200)))
}

async fn connect(config: MysqlConfig) -> Arc<MysqlLock> {
    let lock = bounded(
        "connecting to the private server",
        CONNECT_TIMEOUT * 3,
        MysqlLock::connect(config),
    )
    .await
    .expect("connect to the private server");
    Arc::new(lock)
}

/// [`server_faults::settled`], each try bounded by three connect timeouts: right after a
/// restart a pooled connection to the old server process fails once before the pool replaces
/// it.
async fn settled<T, F, Fut>(what: &str, limit: Duration, op: F) -> (T, Vec<String>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    server_faults::settled(what, limit, CONNECT_TIMEOUT * 3, op).await
}

/// Checks that `owner` holds the lock with `token` and lease left.
fn assert_held_by(info: Option<LockInfo>, owner: &str, token: FencingToken, when: &str) {
    server_faults::assert_held_by(info, owner, token, LeaseLeft::Required, when);
}

/// [`server_faults::fails_in_time`] for this backend.
async fn fails_in_time<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    call: impl Future<Output = Result<T>>,
) -> (Error, Duration) {
    server_faults::fails_in_time(what, "mysql", limit, call).await
}
