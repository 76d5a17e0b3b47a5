//! Real server faults, on a private PostgreSQL server that each test starts for itself (see
//! `tests/common/private_postgres.rs`): in table mode a crash (SIGKILL of every server process) and
//! restart on the same data directory while a watchdog-managed lock is held, and a pause
//! (SIGSTOP) longer than the lease; in advisory mode the holder's lock session terminated by an
//! operator, and a crash and restart.
//!
//! Needs PostgreSQL's server binaries (`scripts/services up postgres` installs them); a machine
//! without them fails these tests with that hint. Skipped when `DISTLOCK_SKIP` names
//! `postgres`. The shared server (`DISTLOCK_POSTGRES_URL`) is not used.

#[path = "../common/private_postgres.rs"]
mod private_postgres;

mod advisory;
mod table;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::server_faults::{self, bounded, delta_ms, ms, Contender, LeaseLeft};
use distlock_conformance::watch_lost;
use distlock_postgres::sqlx;
use distlock_postgres::{
    advisory_key, DistributedLock, Error, ErrorKind, FencingToken, LockExt, LockGuard, LockInfo,
    LostReason, Mode, OwnerId, PostgresConfig, PostgresLock, Result,
};
use private_postgres::PrivatePostgres;

/// Connecting, and waiting for a pooled connection, give up after this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One server operation gives up after this (the shared `operation_timeout` option): shorter
/// than the connect timeout, so that a call to a paused server is ended by this limit, not by
/// the pool's wait for a connection.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(1);
/// Each test as a whole; past it the test fails as hung.
const BUDGET: Duration = Duration::from_secs(30);
/// Scheduling slack allowed on a loaded two-core machine between a deadline and the task that
/// acts on it.
const SLACK: Duration = Duration::from_millis(500);

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("postgres");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names postgres");
    }
    skip
}

/// A table-mode client of the private server with its own owner label and watchdog lease.
fn table_config(server: &PrivatePostgres, owner: &str, ttl: Duration) -> PostgresConfig {
    PostgresConfig::from_url(&server.url())
        .expect("private server URL")
        .owner(OwnerId::new(owner).expect("owner id"))
        .default_ttl(ttl)
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .pool_size(4)
        // The sweeper runs through every fault too; it must never delete a live row.
        .sweep_interval(Some(Duration::from_millis(200)))
}

/// An advisory-mode client whose session bound (and so every grant's lease) is `bound`.
fn advisory_config(server: &PrivatePostgres, owner: &str, bound: Duration) -> PostgresConfig {
    table_config(server, owner, bound)
        .mode(Mode::Advisory)
        .session_timeout(bound)
}

async fn connect(config: PostgresConfig) -> Arc<PostgresLock> {
    let lock = bounded(
        "connecting to the private server",
        CONNECT_TIMEOUT * 5,
        PostgresLock::connect(config),
    )
    .await
    .expect("connect to the private server");
    Arc::new(lock)
}

/// [`server_faults::settled`], each try bounded by five operation timeouts: right after a
/// restart, a connection to the old server process fails before it is replaced.
async fn settled<T, F, Fut>(what: &str, limit: Duration, op: F) -> (T, Vec<String>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    server_faults::settled(what, limit, OPERATION_TIMEOUT * 5, op).await
}

/// Checks who holds the lock: `owner` with `token`, and in table mode with some lease left (an
/// advisory lock's lease is its session: no remaining time).
fn assert_held_by(
    info: Option<LockInfo>,
    mode: Mode,
    owner: &str,
    token: FencingToken,
    when: &str,
) {
    let lease = match mode {
        Mode::Table => LeaseLeft::Required,
        _ => LeaseLeft::IfKnown,
    };
    server_faults::assert_held_by(info, owner, token, lease, when);
}

/// Takes `count` grants of `name` and releases each at once; their tokens, checked to rise.
async fn release_cycles(client: &Arc<PostgresLock>, name: &str, count: usize) -> Vec<FencingToken> {
    let mut tokens = Vec::new();
    for _ in 0..count {
        let g = client
            .try_lock(name)
            .await
            .expect("try_lock")
            .expect("the name is free");
        tokens.push(g.token());
        assert!(g.release().await.expect("release"), "lost a fresh grant");
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
    tokens
}

/// [`server_faults::fails_in_time`] for this backend.
async fn fails_in_time<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    call: impl Future<Output = Result<T>>,
) -> Error {
    server_faults::fails_in_time(what, "postgres", limit, call)
        .await
        .0
}
