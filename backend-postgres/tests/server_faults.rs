//! Real server faults, on a private PostgreSQL server that each test starts for itself (see
//! `common/private_postgres.rs`): in table mode a crash (SIGKILL of every server process) and
//! restart on the same data directory while a watchdog-managed lock is held, and a pause
//! (SIGSTOP) longer than the lease; in advisory mode the holder's lock session terminated by an
//! operator, and a crash and restart.
//!
//! Needs PostgreSQL's server binaries (`scripts/services up postgres` installs them); a machine
//! without them fails these tests with that hint. Skipped when `DISTLOCK_SKIP` names
//! `postgres`. The shared server (`DISTLOCK_POSTGRES_URL`) is not used.

#[path = "common/private_postgres.rs"]
mod private_postgres;

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

// ---------------------------------------------------------------------------------------------
// Table mode: a crash and restart within the lease.

/// The watchdog lease of the restart test: renewals every 2 s, so one falls into the outage,
/// with seconds to spare for the restart (crash recovery included) before the holder's
/// safe-until.
const RESTART_TTL: Duration = Duration::from_secs(6);
/// How long the server stays down before the restart begins: longer than a few renewal
/// retries (TTL/10 apart), far shorter than the lease.
const DOWN_FOR: Duration = Duration::from_millis(1500);

/// A holder keeps its lock through a crash (SIGKILL of every server process) and restart that
/// is shorter than its lease: the row and its token survive (WAL recovery), the watchdog's
/// renewals fail while the server is down and succeed again on the restarted server before
/// the holder's safe-until, so `lost()` never fires and the lock is held past the lease it had
/// at the crash; nobody else is granted it meanwhile; the release succeeds; and the next
/// grant's token is greater than every token issued before the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_crash_and_restart_within_the_lease_keeps_the_lock_renewals_and_rising_tokens() {
    if skipped() {
        return;
    }
    bounded("the table-mode restart test", BUDGET, table_restart()).await;
}

async fn table_restart() {
    let began = Instant::now();
    let mut server = PrivatePostgres::start().await;
    let holder = connect(table_config(&server, "holder", RESTART_TTL)).await;
    let contender = connect(table_config(&server, "contender", RESTART_TTL)).await;
    let name = "table/survives-a-restart";

    let mut issued = release_cycles(&holder, name, 3).await;
    let guard: LockGuard = holder
        .try_lock(name)
        .await
        .expect("try_lock")
        .expect("free");
    issued.push(guard.token());
    assert!(
        issued.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {issued:?}"
    );
    let max_before = *issued.iter().max().expect("tokens");
    assert_eq!(guard.ttl(), RESTART_TTL, "the watchdog lease");
    let granted_at = guard.grant().sent_at;
    let first_until = guard.safe_until().expect("a leased lock has a safe-until");
    let lost_watch = watch_lost(&guard);
    assert!(
        contender.try_lock(name).await.expect("try_lock").is_none(),
        "the contender was granted a held lock"
    );
    assert_held_by(
        contender.holder(name).await.expect("holder"),
        Mode::Table,
        "holder",
        guard.token(),
        "before the crash",
    );

    let trying = Contender::spawn(contender.clone(), name);

    // Crash shortly before the first renewal is due (TTL/3 after the grant), so that it meets
    // a dead server.
    tokio::time::sleep_until((granted_at + RESTART_TTL / 3 - Duration::from_millis(300)).into())
        .await;
    let postmaster_before = server.pid();
    let killed_at = Instant::now();
    server.kill();
    tokio::time::sleep(DOWN_FOR).await;
    let restart_took = server.restart().await;
    let back_at = Instant::now();
    eprintln!(
        "killed {} ms after the grant; restart took {} ms; down {} ms in all",
        delta_ms(granted_at, killed_at),
        ms(restart_took),
        ms(back_at - killed_at)
    );
    assert_ne!(server.pid(), postmaster_before, "a new postmaster");
    let log = server.log();
    assert!(
        log.contains("not properly shut down"),
        "the restart did not recover from a crash (no `not properly shut down` in its log):\n{log}"
    );

    // The row survived the crash: same holder, same token; the contender is refused.
    let (info, errors) = settled("holder() after the restart", Duration::from_secs(5), || {
        contender.holder(name)
    })
    .await;
    eprintln!(
        "holder() after the restart: {info:?} (temporary errors first: {})",
        errors.len()
    );
    assert_held_by(
        info,
        Mode::Table,
        "holder",
        guard.token(),
        "right after the restart",
    );
    let (taken, _) = settled("try_lock after the restart", Duration::from_secs(5), || {
        contender.try_lock(name)
    })
    .await;
    assert!(
        taken.is_none(),
        "the contender was granted the lock that survived the restart (token {:?})",
        taken.map(|g| g.token())
    );

    // Renewals resume before the safe-until the holder had at the crash. A safe-until later
    // than `killed_at + TTL - drift` comes from a renewal sent after the kill, which only the
    // restarted server can have answered.
    let sent_after_kill = killed_at + RESTART_TTL - distlock_api::backend::drift(RESTART_TTL);
    let resumed_at = bounded("the first renewal after the restart", RESTART_TTL, async {
        loop {
            if guard.safe_until().is_some_and(|u| u > sent_after_kill) {
                break Instant::now();
            }
            assert!(
                !guard.is_lost(),
                "lost before renewals resumed: {:?} (restart took {} ms, the safe-until \
                     was {} ms after the kill)",
                guard.lost_reason(),
                ms(restart_took),
                delta_ms(killed_at, first_until)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    eprintln!(
        "renewals resumed {} ms after the server was back, {} ms before the safe-until at the \
         crash",
        delta_ms(back_at, resumed_at),
        delta_ms(resumed_at, first_until)
    );
    assert!(
        resumed_at < first_until,
        "no renewal succeeded on the restarted server before the holder's safe-until ({} ms \
         late)",
        delta_ms(first_until, resumed_at)
    );

    // Hold on past the lease the holder had at the crash: only renewals answered by the
    // restarted server keep the row live now.
    tokio::time::sleep_until((first_until + SLACK).into()).await;
    assert!(
        !guard.is_lost(),
        "the holder reports its lock lost: {:?}",
        guard.lost_reason()
    );
    assert!(
        !lost_watch.is_finished(),
        "lost() fired although renewals resumed in time: {:?}",
        lost_watch.await
    );
    let until_now = guard.safe_until().expect("safe-until");
    assert!(
        until_now > first_until + SLACK,
        "safe-until did not move past the lease at the crash: {} ms after it",
        delta_ms(first_until, until_now)
    );
    let (info, _) = settled(
        "holder() past the old lease",
        Duration::from_secs(3),
        || contender.holder(name),
    )
    .await;
    assert_held_by(
        info,
        Mode::Table,
        "holder",
        guard.token(),
        "past the safe-until at the crash",
    );

    let tries = trying.finish().await;
    eprintln!(
        "contender while held: {} refused, {} errors, slowest try_lock {} ms; errors: {:?}",
        tries.refused,
        tries.errors.len(),
        ms(tries.slowest),
        tries.errors
    );
    assert!(
        tries.grants.is_empty(),
        "the contender was granted the held lock: {:?}",
        tries.grants
    );
    assert!(tries.refused > 0, "the contender never got an answer");
    for (kind, temporary, e) in &tries.errors {
        assert!(
            *kind == ErrorKind::Unavailable && *temporary,
            "an outage must be a temporary Unavailable, got {kind:?}: {e}"
        );
    }

    // The release succeeds, and tokens never go back across the restart.
    assert!(
        bounded("release", OPERATION_TIMEOUT * 3, guard.release())
            .await
            .expect("release"),
        "the holder's release found its lock gone"
    );
    let (next, _) = settled("try_lock after the release", Duration::from_secs(3), || {
        contender.try_lock(name)
    })
    .await;
    let next = next.expect("the released lock is free");
    eprintln!(
        "tokens before the crash {issued:?}; after the restart {}",
        next.token()
    );
    assert!(
        next.token() > max_before,
        "token {} after the restart, but {max_before} was issued before it",
        next.token()
    );
    assert!(next.release().await.expect("release"));
    drop((holder, contender));
    drop(server);
    eprintln!("table restart test took {} ms", ms(began.elapsed()));
}

// ---------------------------------------------------------------------------------------------
// Table mode: a pause longer than the lease.

/// The watchdog lease of the pause test: shorter than the pause.
const PAUSE_TTL: Duration = Duration::from_secs(2);
/// What a call to the paused server may take beyond the operation timeout: the timer's
/// wake-up and dropping the connection, on a loaded two-core machine.
const MARGIN: Duration = Duration::from_millis(500);

/// A server paused (SIGSTOP of every server process) for longer than the lease: the holder's
/// calls fail with a temporary `Unavailable` within the operation timeout instead of hanging,
/// its renewals get no answer, so its guard reports the lock lost (`Expired`) by its
/// safe-until; no one is granted the lock while the server is stopped; after the server
/// resumes, another client is granted it with a greater token, and the first holder's late
/// release answers `Ok(false)` and leaves the new holder's lock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_pause_beyond_the_lease_times_out_calls_loses_the_guard_and_the_stale_release_frees_nothing(
) {
    if skipped() {
        return;
    }
    bounded("the table-mode pause test", BUDGET, table_pause()).await;
}

async fn table_pause() {
    let began = Instant::now();
    let server = PrivatePostgres::start().await;
    let holder = connect(table_config(&server, "holder", PAUSE_TTL)).await;
    let contender = connect(table_config(&server, "contender", PAUSE_TTL)).await;
    let name = "table/outlives-a-pause";

    let guard = holder
        .try_lock(name)
        .await
        .expect("try_lock")
        .expect("free");
    let old_token = guard.token();
    let first_until = guard.safe_until().expect("safe-until");
    // The watchdog works before the pause: a renewal moves safe-until on.
    bounded("the first renewal", PAUSE_TTL, async {
        while guard.safe_until().is_some_and(|u| u <= first_until) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(!guard.is_lost(), "lost before the pause");
    assert!(
        contender.try_lock(name).await.expect("try_lock").is_none(),
        "the contender was granted a held lock"
    );
    let lost_watch = watch_lost(&guard);

    server.pause();
    let stopped_at = Instant::now();
    let limit = OPERATION_TIMEOUT + MARGIN;
    let e = fails_in_time("the holder's holder()", limit, holder.holder(name)).await;
    assert!(
        e.to_string().contains("operation timeout"),
        "holder() did not run into the operation timeout: {e}"
    );
    // May queue behind the watchdog's renewal on the holders' pool: two timeouts.
    fails_in_time(
        "an explicit renewal",
        OPERATION_TIMEOUT * 2 + MARGIN,
        DistributedLock::renew(&*holder, guard.grant(), PAUSE_TTL),
    )
    .await;
    fails_in_time("the contender's try_lock", limit, contender.try_lock(name)).await;

    // The holder's guard reports its lock lost by its safe-until, while still paused.
    let (fired_at, reason) = bounded(
        "lost() while the server is paused",
        PAUSE_TTL + SLACK * 2,
        lost_watch,
    )
    .await
    .expect("lost watcher");
    let until = guard.safe_until().expect("safe-until");
    eprintln!(
        "paused: lost() fired {} ms after SIGSTOP, {} ms after the holder's safe-until (which \
         was {} ms after SIGSTOP); reason: {reason}",
        delta_ms(stopped_at, fired_at),
        delta_ms(until, fired_at),
        delta_ms(stopped_at, until),
    );
    assert_eq!(
        reason,
        LostReason::Expired,
        "no renewal could be answered while the server was paused"
    );
    assert!(
        fired_at >= until,
        "lost() fired as Expired {} ms before the safe-until",
        delta_ms(fired_at, until)
    );
    assert!(
        fired_at <= until + SLACK,
        "lost() fired {} ms after the holder's safe-until",
        delta_ms(until, fired_at)
    );
    assert!(
        guard.is_lost(),
        "a guard past its safe-until claims the lock"
    );

    // Stay stopped until the row has expired by the server's clock too: the last renewal it
    // answered read its clock before the stop.
    tokio::time::sleep_until((stopped_at + PAUSE_TTL + MARGIN).into()).await;
    server.resume();
    let resumed_at = Instant::now();
    eprintln!(
        "resumed after a pause of {} ms",
        ms(resumed_at - stopped_at)
    );

    // Another client is granted the expired lock, with a greater token.
    let next = bounded(
        "the contender's acquire after the pause",
        Duration::from_secs(10),
        contender.lock(name, Duration::from_secs(8)),
    )
    .await
    .expect("the expired lock is granted after the server resumes");
    let taken_at = Instant::now();
    eprintln!(
        "the contender was granted {} ms after SIGCONT, token {} (the holder's: {old_token})",
        ms(taken_at - resumed_at),
        next.token()
    );
    assert!(
        next.token() > old_token,
        "token {} after the takeover, but {old_token} was issued before it",
        next.token()
    );
    assert!(
        taken_at > until,
        "the lock was granted again before the old holder's safe-until"
    );

    // The old holder's late release is told the lock was not held, and frees nothing.
    let late = bounded(
        "the old holder's late release",
        OPERATION_TIMEOUT * 3,
        guard.release(),
    )
    .await;
    eprintln!("the old holder's late release answered {late:?}");
    assert!(
        matches!(late, Ok(false)),
        "the old holder's release after losing its lock must answer Ok(false), got {late:?}"
    );
    assert!(
        !next.is_lost(),
        "the new holder lost its lock: {:?}",
        next.lost_reason()
    );
    let (info, _) = settled(
        "holder() after the late release",
        Duration::from_secs(3),
        || holder.holder(name),
    )
    .await;
    assert_held_by(
        info,
        Mode::Table,
        "contender",
        next.token(),
        "after the old holder's release",
    );
    assert!(
        holder.try_lock(name).await.expect("try_lock").is_none(),
        "the old holder's client was granted the new holder's lock"
    );
    assert!(
        next.release().await.expect("release"),
        "the new holder's release found its lock gone"
    );
    drop((holder, contender));
    drop(server);
    eprintln!("table pause test took {} ms", ms(began.elapsed()));
}

// ---------------------------------------------------------------------------------------------
// Advisory mode.

/// The session bound of the advisory tests: the server ends a session idle this long, the
/// client probes its session every third of it, and each grant's lease is this.
const SESSION_BOUND: Duration = Duration::from_secs(3);

/// The pids of the server sessions holding `name`'s advisory key (`pg_locks`: a `bigint` key
/// is its high half in `classid`, its low half in `objid`, with `objsubid` 1).
async fn sessions_holding(admin: &mut sqlx::PgConnection, name: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid::bigint = (($1::bigint >> 32) & 4294967295) \
         AND objid::bigint = ($1::bigint & 4294967295) AND objsubid = 1 ORDER BY pid",
    )
    .bind(advisory_key(name))
    .fetch_all(admin)
    .await
    .expect("reading pg_locks")
}

/// How late the holder may learn that its session is gone: the next probe (every third of the
/// bound), and the probe's round trip.
fn probe_bound() -> Duration {
    SESSION_BOUND / 3 + OPERATION_TIMEOUT + SLACK
}

/// An operator terminates the holder's lock session (`pg_terminate_backend`, as an idle-session
/// kill or a connection reset would end it): the server frees the key at once, so another
/// client is granted the lock, with a strictly greater token (the docs' window: it may be
/// before the holder knows); the holder's `lost()` fires within a probe period (well inside the
/// session bound); its late release answers `Ok(false)` and frees nothing; and the holder's
/// client opens a new session and works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_terminated_session_fires_lost_within_a_probe_and_the_next_grant_has_a_larger_token(
) {
    if skipped() {
        return;
    }
    bounded("the advisory terminate test", BUDGET, advisory_terminate()).await;
}

async fn advisory_terminate() {
    let began = Instant::now();
    let server = PrivatePostgres::start().await;
    let holder = connect(advisory_config(&server, "holder", SESSION_BOUND)).await;
    let contender = connect(advisory_config(&server, "contender", SESSION_BOUND)).await;
    let name = "advisory/terminated";

    let earlier = release_cycles(&holder, name, 2).await;
    let guard = holder
        .try_lock(name)
        .await
        .expect("try_lock")
        .expect("free");
    let old_token = guard.token();
    assert!(
        earlier.iter().all(|t| *t < old_token),
        "tokens must rise: {earlier:?} then {old_token}"
    );
    assert_eq!(
        guard.ttl(),
        SESSION_BOUND,
        "an advisory grant's lease is the bound"
    );
    assert!(
        contender.try_lock(name).await.expect("try_lock").is_none(),
        "the contender was granted a held lock"
    );
    assert_held_by(
        contender.holder(name).await.expect("holder"),
        Mode::Advisory,
        "holder",
        old_token,
        "before the termination",
    );

    let mut admin = server.admin().await;
    let pids = sessions_holding(&mut admin, name).await;
    assert_eq!(pids.len(), 1, "one session holds the key: {pids:?}");
    let lost_watch = watch_lost(&guard);
    // Waits (up to 5 s) until the backend has exited, so its locks are free when it answers.
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pids[0])
        .fetch_one(&mut admin)
        .await
        .expect("pg_terminate_backend");
    let cut_at = Instant::now();
    assert!(terminated, "the holder's session {} did not end", pids[0]);
    assert!(
        sessions_holding(&mut admin, name).await.is_empty(),
        "the key is still held after its session ended"
    );
    // The first statement on the ended session finds it gone: the server's FATAL answer ends
    // the session on the client too, so the grant is lost there and then (not "temporarily
    // unavailable" until a later call finds the socket closed).
    let renewed = holder.renew(guard.grant(), SESSION_BOUND).await;
    assert_eq!(
        renewed.as_ref().map_err(|e| e.kind()),
        Err(ErrorKind::Lost),
        "the first renewal on the terminated session: {renewed:?}"
    );

    // Another client is granted the freed key, with a greater token.
    let next = bounded(
        "the contender's acquire after the termination",
        Duration::from_secs(10),
        contender.lock(name, Duration::from_secs(8)),
    )
    .await
    .expect("the freed lock is granted");
    let granted_at = Instant::now();
    assert!(
        next.token() > old_token,
        "token {} after the holder's session ended, but {old_token} was issued before it",
        next.token()
    );

    let (fired_at, reason) = bounded("the holder's lost()", SESSION_BOUND + SLACK * 2, lost_watch)
        .await
        .expect("lost watcher");
    eprintln!(
        "session terminated: the contender was granted token {} {} ms later (old token \
         {old_token}); the holder's lost() fired {} ms after the termination ({} ms after that \
         grant): {reason}",
        next.token(),
        ms(granted_at - cut_at),
        delta_ms(cut_at, fired_at),
        delta_ms(granted_at, fired_at),
    );
    assert!(
        matches!(reason, LostReason::Taken(_) | LostReason::Session(_)),
        "a probe must find the session gone (not the lease running out): {reason:?}"
    );
    assert!(
        fired_at <= cut_at + probe_bound(),
        "lost() fired {} ms after the session ended, later than a probe period allows ({} ms)",
        delta_ms(cut_at, fired_at),
        ms(probe_bound())
    );
    assert!(
        guard.is_lost(),
        "a guard whose session ended claims the lock"
    );

    let late = bounded(
        "the holder's late release",
        OPERATION_TIMEOUT * 3,
        guard.release(),
    )
    .await;
    assert!(
        matches!(late, Ok(false)),
        "the release of a lock whose session ended must answer Ok(false), got {late:?}"
    );
    assert!(
        !next.is_lost(),
        "the new holder lost its lock: {:?}",
        next.lost_reason()
    );
    assert_held_by(
        holder.holder(name).await.expect("holder"),
        Mode::Advisory,
        "contender",
        next.token(),
        "after the old holder's release",
    );
    let held_by = sessions_holding(&mut admin, name).await;
    assert_eq!(held_by.len(), 1, "one session holds the key: {held_by:?}");
    assert_ne!(held_by[0], pids[0], "the key is the new holder's session's");

    // The holder's client opens a new session and is granted other names.
    let (other, errors) = settled("the holder's next grant", Duration::from_secs(5), || {
        holder.try_lock("advisory/after-the-termination")
    })
    .await;
    let other = other.expect("a free name is granted");
    eprintln!("the holder's client works again (temporary errors first: {errors:?})");
    assert!(other.release().await.expect("release"));
    assert!(
        next.release().await.expect("release"),
        "the new holder's release found its lock gone"
    );
    let _ = sqlx::Connection::close(admin).await;
    drop((holder, contender));
    drop(server);
    eprintln!("advisory terminate test took {} ms", ms(began.elapsed()));
}

/// A crash (SIGKILL of every server process) ends every session, so the holder's session lock
/// is gone: its `lost()` fires within a probe period of the kill (not held on to until the
/// bound); after the restart another client is granted the lock with a token greater than
/// every token issued before the crash (the counter is a table row); the old holder's release
/// answers `Ok(false)`, and its client works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_crash_and_restart_loses_the_session_lock_and_the_next_grant_has_a_larger_token() {
    if skipped() {
        return;
    }
    bounded("the advisory restart test", BUDGET, advisory_restart()).await;
}

async fn advisory_restart() {
    let began = Instant::now();
    let mut server = PrivatePostgres::start().await;
    let holder = connect(advisory_config(&server, "holder", SESSION_BOUND)).await;
    let contender = connect(advisory_config(&server, "contender", SESSION_BOUND)).await;
    let name = "advisory/through-a-crash";

    let mut issued = release_cycles(&holder, name, 3).await;
    let guard = holder
        .try_lock(name)
        .await
        .expect("try_lock")
        .expect("free");
    issued.push(guard.token());
    let max_before = *issued.iter().max().expect("tokens");
    let lost_watch = watch_lost(&guard);

    let killed_at = Instant::now();
    server.kill();
    let (fired_at, reason) = bounded(
        "the holder's lost() after the crash",
        SESSION_BOUND + SLACK * 2,
        lost_watch,
    )
    .await
    .expect("lost watcher");
    eprintln!(
        "crashed: the holder's lost() fired {} ms after the kill: {reason}",
        delta_ms(killed_at, fired_at)
    );
    assert!(
        matches!(reason, LostReason::Taken(_) | LostReason::Session(_)),
        "a probe must find the session gone (not the lease running out): {reason:?}"
    );
    assert!(
        fired_at <= killed_at + probe_bound(),
        "lost() fired {} ms after the crash, later than a probe period allows ({} ms)",
        delta_ms(killed_at, fired_at),
        ms(probe_bound())
    );
    let restart_took = server.restart().await;
    eprintln!("restarted in {} ms", ms(restart_took));

    let (next, errors) = settled("the contender's acquire", Duration::from_secs(8), || {
        contender.lock(name, Duration::from_secs(3))
    })
    .await;
    eprintln!(
        "after the restart: the contender was granted token {} (before the crash: {issued:?}; \
         temporary errors first: {errors:?})",
        next.token()
    );
    assert!(
        next.token() > max_before,
        "token {} after the restart, but {max_before} was issued before it",
        next.token()
    );
    let late = bounded(
        "the holder's late release",
        OPERATION_TIMEOUT * 3,
        guard.release(),
    )
    .await;
    assert!(
        matches!(late, Ok(false)),
        "the release of a lock the crash ended must answer Ok(false), got {late:?}"
    );
    let (info, _) = settled("holder() after the restart", Duration::from_secs(3), || {
        holder.holder(name)
    })
    .await;
    assert_held_by(
        info,
        Mode::Advisory,
        "contender",
        next.token(),
        "after the restart",
    );
    let (other, _) = settled("the holder's next grant", Duration::from_secs(5), || {
        holder.try_lock("advisory/after-the-crash")
    })
    .await;
    assert!(other
        .expect("a free name is granted")
        .release()
        .await
        .expect("release"));
    assert!(next.release().await.expect("release"));
    drop((holder, contender));
    drop(server);
    eprintln!("advisory restart test took {} ms", ms(began.elapsed()));
}
