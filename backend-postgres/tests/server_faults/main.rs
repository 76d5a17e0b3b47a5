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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// Signed milliseconds from `from` to `to`.
fn delta_ms(from: Instant, to: Instant) -> i128 {
    if to >= from {
        to.duration_since(from).as_millis() as i128
    } else {
        -(from.duration_since(to).as_millis() as i128)
    }
}

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("postgres");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names postgres");
    }
    skip
}

/// Awaits `fut`, failing the test if it does not finish within `limit` (a hang is a defect).
async fn bounded<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {limit:?}: it hangs"),
    }
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

/// Runs `op` until it answers without a temporary error, for up to `limit`: right after a
/// restart, a connection to the old server process fails before it is replaced. Returns the
/// answer and the temporary errors seen on the way; a permanent error fails the test.
async fn settled<T, F, Fut>(what: &str, limit: Duration, mut op: F) -> (T, Vec<String>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + limit;
    let mut errors = Vec::new();
    loop {
        match bounded(what, OPERATION_TIMEOUT * 5, op()).await {
            Ok(v) => return (v, errors),
            Err(e) if e.is_temporary() && Instant::now() < deadline => {
                errors.push(format!("{:?}: {e}", e.kind()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: {e:?} (temporary errors before it: {errors:?})"),
        }
    }
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
    let info = info.unwrap_or_else(|| panic!("{when}: nobody holds the lock (holder() = None)"));
    assert_eq!(info.owner.label(), owner, "{when}: wrong holder: {info:?}");
    assert_eq!(info.token, token, "{when}: wrong token: {info:?}");
    match mode {
        Mode::Table => assert!(
            info.remaining.is_some_and(|r| !r.is_zero()),
            "{when}: no lease left: {info:?}"
        ),
        _ => assert!(
            info.remaining.is_none_or(|r| !r.is_zero()),
            "{when}: no lease left: {info:?}"
        ),
    }
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

/// What a contender that kept trying a held lock saw.
#[derive(Default, Debug)]
struct Tries {
    /// Grants it won (each a second holder), with when.
    grants: Vec<(FencingToken, Instant)>,
    refused: u32,
    /// Errors: kind, whether temporary, text.
    errors: Vec<(ErrorKind, bool, String)>,
    /// The longest a single try_lock took.
    slowest: Duration,
}

/// A task that tries `name` every 100 ms until stopped, recording every answer; a grant is
/// kept (not released), so that an overlap stays visible.
struct Contender {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Tries>>,
    task: tokio::task::JoinHandle<()>,
}

impl Contender {
    fn spawn(client: Arc<PostgresLock>, name: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Tries::default()));
        let task = tokio::spawn({
            let (stop, seen) = (stop.clone(), seen.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let sent = Instant::now();
                    let answer = client.try_lock(name).await;
                    {
                        let mut s = seen.lock().unwrap();
                        s.slowest = s.slowest.max(sent.elapsed());
                        match answer {
                            Ok(Some(g)) => {
                                s.grants.push((g.token(), Instant::now()));
                                // Kept: a release would hide the overlap.
                                std::mem::forget(g);
                            }
                            Ok(None) => s.refused += 1,
                            Err(e) => s.errors.push((e.kind(), e.is_temporary(), e.to_string())),
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Self { stop, seen, task }
    }

    async fn finish(self) -> Tries {
        self.stop.store(true, Ordering::SeqCst);
        bounded("the contender's loop", OPERATION_TIMEOUT * 5, self.task)
            .await
            .expect("contender task");
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// Runs one call against a server that does not answer and checks that it fails with a
/// temporary `Unavailable` within `limit`; returns the error.
async fn fails_in_time<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    call: impl Future<Output = Result<T>>,
) -> Error {
    let sent = Instant::now();
    // Three times the limit: a call still waiting then is taken to hang.
    let answer = bounded(what, limit * 3, call).await;
    let took = sent.elapsed();
    eprintln!("paused: {what} answered in {} ms: {answer:?}", ms(took));
    let e = match answer {
        Err(e) => e,
        Ok(v) => panic!("{what} answered {v:?} while the server was stopped"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{what}: {e}");
    assert!(e.is_temporary(), "{what}: not temporary: {e}");
    assert!(
        took <= limit,
        "{what} took {} ms, more than the {} ms the operation timeout allows",
        ms(took),
        ms(limit)
    );
    e
}
