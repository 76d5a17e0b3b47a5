//! Real server faults, on a private MariaDB server that each test starts for itself (see
//! `common/private_mariadb.rs`): a crash (SIGKILL) and restart on the same data directory while
//! a watchdog-managed lock is held, a pause (SIGSTOP) longer than the lease, and calls made
//! on already-open connections to a paused server (the operation timeout).
//!
//! Needs `mariadbd` and `mariadb-install-db` (`scripts/services up mariadb` installs them); a
//! machine without them fails these tests with that hint. Skipped when `DISTLOCK_SKIP` names
//! `mysql`. The shared server (`DISTLOCK_MYSQL_URL`) is not used.

mod common;
#[path = "common/private_mariadb.rs"]
mod private_mariadb;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Awaits `fut`, failing the test if it does not finish within `limit` (a hang is a defect).
async fn bounded<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {limit:?}: it hangs"),
    }
}

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

/// Runs `op` until it answers without a temporary error, for up to `limit`: right after a
/// restart a pooled connection to the old server process fails once before the pool replaces
/// it. Returns the answer and the temporary errors seen on the way. A permanent error fails.
async fn settled<T, F, Fut>(what: &str, limit: Duration, mut op: F) -> (T, Vec<String>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + limit;
    let mut errors = Vec::new();
    loop {
        match bounded(what, CONNECT_TIMEOUT * 3, op()).await {
            Ok(v) => return (v, errors),
            Err(e) if e.is_temporary() && Instant::now() < deadline => {
                errors.push(format!("{:?}: {e}", e.kind()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: {e:?} (temporary errors before it: {errors:?})"),
        }
    }
}

fn assert_held_by(info: Option<LockInfo>, owner: &str, token: FencingToken, when: &str) {
    let info = info.unwrap_or_else(|| panic!("{when}: the lock row is gone (holder() = None)"));
    assert_eq!(info.owner.label(), owner, "{when}: wrong holder: {info:?}");
    assert_eq!(info.token, token, "{when}: wrong token: {info:?}");
    assert!(
        info.remaining.is_some_and(|r| !r.is_zero()),
        "{when}: no lease left: {info:?}"
    );
}

/// What a contender that keeps trying a held lock saw.
#[derive(Default)]
struct Attempts {
    /// Grants it won (each one a second holder): (token, when).
    grants: Vec<(FencingToken, Instant)>,
    answered_held: u32,
    /// Errors, with their kind and whether they were marked temporary.
    errors: Vec<(ErrorKind, bool, String)>,
    /// The longest a single try_lock took.
    slowest: Duration,
}

/// Tries `name` every 100 ms until `stop` is set, recording every answer.
fn keep_trying(
    contender: Arc<MysqlLock>,
    name: &'static str,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (Arc<Mutex<Attempts>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Attempts::default()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let sent = Instant::now();
            let answer = contender.try_lock(name).await;
            let took = sent.elapsed();
            {
                let mut s = log.lock().unwrap();
                s.slowest = s.slowest.max(took);
                match answer {
                    Ok(Some(g)) => {
                        s.grants.push((g.token(), Instant::now()));
                        // Keep it: releasing would hide the overlap from the holder's checks.
                        std::mem::forget(g);
                    }
                    Ok(None) => s.answered_held += 1,
                    Err(e) => s.errors.push((e.kind(), e.is_temporary(), e.to_string())),
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (seen, task)
}

// ---------------------------------------------------------------------------------------------

/// The watchdog lease of the restart test: renewals every 2 s, so one falls into the outage.
const RESTART_TTL: Duration = Duration::from_secs(6);
/// How long the server stays down: longer than a renewal period's retry step, far shorter than
/// the lease.
const DOWN_FOR: Duration = Duration::from_millis(1500);

/// A holder keeps its lock through a crash and restart of the server that is shorter than its
/// lease: the row and its token survive (InnoDB), the watchdog's renewals fail while the server
/// is down and succeed again after it is back, before the holder's safe-until, so `lost()` never
/// fires; nobody else gets the lock meanwhile; and after the release the next grant's token is
/// greater than every token issued before the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_and_restart_within_the_lease_keeps_the_lock_its_renewals_and_its_tokens() {
    if common::skipped() {
        return;
    }
    bounded("the restart test", BUDGET, restart_test()).await;
}

async fn restart_test() {
    let began = Instant::now();
    let mut server = PrivateMariadb::start().await;
    let holder = client(&server, "holder", RESTART_TTL).await;
    let contender = client(&server, "contender", RESTART_TTL).await;
    let name = "survives-a-restart";

    // Tokens issued before the crash: three grants released at once, then the one kept.
    let mut issued = Vec::new();
    for _ in 0..3 {
        let g = holder
            .try_lock(name)
            .await
            .expect("try_lock")
            .expect("free");
        issued.push(g.token());
        assert!(g.release().await.expect("release"), "lost a fresh grant");
    }
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
    assert_eq!(guard.ttl(), RESTART_TTL, "watchdog lease");
    let granted_at = guard.grant().sent_at;
    let first_until = guard.safe_until().expect("a leased lock has a safe-until");
    let lost_watch = watch_lost(&guard);
    assert!(
        contender.try_lock(name).await.expect("try_lock").is_none(),
        "the contender got a held lock"
    );
    assert_held_by(
        contender.holder(name).await.expect("holder"),
        "holder",
        guard.token(),
        "before the crash",
    );

    // From now until the release, the contender keeps trying.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (attempts, trying) = keep_trying(contender.clone(), name, stop.clone());

    // Crash shortly before the first renewal is due, so that it meets a dead server.
    tokio::time::sleep_until((granted_at + RESTART_TTL / 3 - Duration::from_millis(300)).into())
        .await;
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

    // The row survived the crash: same holder, same token.
    let (info, errors) = settled("holder() after the restart", Duration::from_secs(3), || {
        contender.holder(name)
    })
    .await;
    eprintln!(
        "holder() after the restart: {info:?} (temporary errors first: {})",
        errors.len()
    );
    assert_held_by(info, "holder", guard.token(), "right after the restart");
    let (taken, _) = settled("try_lock after the restart", Duration::from_secs(3), || {
        contender.try_lock(name)
    })
    .await;
    assert!(
        taken.is_none(),
        "the contender was granted the lock that survived the restart (token {:?})",
        taken.map(|g| g.token())
    );

    // Renewals resume before the safe-until the holder had at the crash: a renewal sent after
    // the kill can only have been answered by the restarted server.
    let ttl_after_kill = killed_at + RESTART_TTL - distlock_api::backend::drift(RESTART_TTL);
    let resumed_at = loop {
        if guard.safe_until().is_some_and(|u| u > ttl_after_kill) {
            break Instant::now();
        }
        assert!(
            !guard.is_lost(),
            "lost before renewals resumed: {:?} (restart took {} ms, safe-until was {} ms after \
             the kill)",
            guard.lost_reason(),
            ms(restart_took),
            delta_ms(killed_at, first_until)
        );
        assert!(
            Instant::now() < first_until + SLACK,
            "no renewal succeeded after the restart before the holder's safe-until"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "renewals resumed {} ms after the server was back, {} ms before the safe-until at the \
         crash",
        delta_ms(back_at, resumed_at),
        delta_ms(resumed_at, first_until)
    );

    // Hold on past the lease the holder had at the crash: only renewals on the restarted server
    // can keep the row live now.
    tokio::time::sleep_until((first_until + Duration::from_millis(500)).into()).await;
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
    let (info, _) = settled(
        "holder() past the old lease",
        Duration::from_secs(2),
        || contender.holder(name),
    )
    .await;
    assert_held_by(
        info,
        "holder",
        guard.token(),
        "past the safe-until at the crash",
    );

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    bounded("the contender's loop", CONNECT_TIMEOUT * 4, trying)
        .await
        .expect("contender task");
    let attempts = std::mem::take(&mut *attempts.lock().unwrap());
    eprintln!(
        "contender while held: {} answered held, {} errors, slowest try_lock {} ms; errors: {:?}",
        attempts.answered_held,
        attempts.errors.len(),
        ms(attempts.slowest),
        attempts.errors
    );
    assert!(
        attempts.grants.is_empty(),
        "the contender was granted the held lock: {:?}",
        attempts.grants
    );
    assert!(
        attempts.answered_held > 0,
        "the contender never got an answer"
    );
    for (kind, temporary, e) in &attempts.errors {
        assert!(
            *kind == ErrorKind::Unavailable && *temporary,
            "an outage must be a temporary Unavailable, got {kind:?}: {e}"
        );
    }
    assert!(
        attempts.slowest <= CONNECT_TIMEOUT * 2 + SLACK,
        "a try_lock during the outage took {} ms, more than the connect timeout allows",
        ms(attempts.slowest)
    );

    // Tokens never go back across the restart.
    assert!(
        bounded("release", CONNECT_TIMEOUT * 3, guard.release())
            .await
            .expect("release"),
        "the holder's release found its lock gone"
    );
    let (next, _) = settled("try_lock after the release", Duration::from_secs(2), || {
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
    eprintln!("restart test took {} ms", ms(began.elapsed()));
}

// ---------------------------------------------------------------------------------------------

/// The watchdog lease of the pause test.
const PAUSE_TTL: Duration = Duration::from_secs(2);

/// A server paused (SIGSTOP) for longer than the lease: the holder's renewals cannot get an
/// answer, so its `lost()` fires by its safe-until; after the server resumes, another client
/// takes the expired lock with a greater token, the old holder's late release does not claim
/// it, and the new holder still holds it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_expires_the_holder_who_then_cannot_release_the_next_grant() {
    if common::skipped() {
        return;
    }
    bounded("the pause test", BUDGET, pause_test()).await;
}

async fn pause_test() {
    let began = Instant::now();
    let server = PrivateMariadb::start().await;
    let holder = client(&server, "holder", PAUSE_TTL).await;
    let contender = client(&server, "contender", PAUSE_TTL).await;
    let name = "outlives-a-pause";

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
    assert!(!guard.is_lost());
    assert!(
        contender.try_lock(name).await.expect("try_lock").is_none(),
        "the contender got a held lock"
    );
    let lost_watch = watch_lost(&guard);

    server.signal("STOP");
    let stopped_at = Instant::now();
    let until_at_stop = guard.safe_until().expect("safe-until");
    let (fired_at, reason) = bounded(
        "lost() while the server is paused",
        PAUSE_TTL + SLACK * 4,
        lost_watch,
    )
    .await
    .expect("lost watcher");
    // A renewal answered just before the stop may still have moved safe-until after we read it.
    let until = guard.safe_until().expect("safe-until");
    eprintln!(
        "paused: lost() fired {} ms after SIGSTOP, {} ms after the holder's safe-until (which \
         was {} ms after SIGSTOP; {} ms at the stop); reason: {reason}",
        delta_ms(stopped_at, fired_at),
        delta_ms(until, fired_at),
        delta_ms(stopped_at, until),
        delta_ms(stopped_at, until_at_stop),
    );
    assert_eq!(
        reason,
        LostReason::Expired,
        "no renewal could be answered while the server was paused"
    );
    assert!(
        fired_at >= until,
        "lost() fired as Expired {} ms before safe-until",
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

    // Keep the server stopped until the row has certainly expired by the server's clock: the
    // last renewal it answered ran before the stop, so its lease ends before stop + TTL.
    tokio::time::sleep_until((stopped_at + PAUSE_TTL + Duration::from_millis(500)).into()).await;
    server.signal("CONT");
    let resumed_at = Instant::now();
    eprintln!(
        "resumed after a pause of {} ms",
        ms(resumed_at - stopped_at)
    );

    // Another client takes the expired lock, with a greater token.
    let next = bounded(
        "the contender's acquire after the pause",
        Duration::from_secs(10),
        contender.lock(name, Duration::from_secs(5)),
    )
    .await
    .expect("the expired lock is taken after the server resumes");
    let taken_at = Instant::now();
    eprintln!(
        "the contender acquired {} ms after SIGCONT, token {} (old {old_token})",
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
        "the lock was taken before the old holder's safe-until"
    );

    // The old holder's late release must not claim the lock, nor free it.
    let late = bounded(
        "the old holder's late release",
        CONNECT_TIMEOUT * 3,
        guard.release(),
    )
    .await;
    eprintln!("the old holder's late release answered {late:?}");
    assert!(
        !matches!(late, Ok(true)),
        "the old holder's release claims it still held the lock"
    );
    assert!(
        !next.is_lost(),
        "the new holder lost its lock: {:?}",
        next.lost_reason()
    );
    assert_held_by(
        holder.holder(name).await.expect("holder"),
        "contender",
        next.token(),
        "after the old holder's late release",
    );
    assert!(
        holder.try_lock(name).await.expect("try_lock").is_none(),
        "the old holder's client took the new holder's lock"
    );
    assert!(
        next.release().await.expect("release"),
        "the new holder's release found its lock gone"
    );
    drop((holder, contender));
    drop(server);
    eprintln!("pause test took {} ms", ms(began.elapsed()));
}

// ---------------------------------------------------------------------------------------------

/// The operation timeout of the clients of the paused-server test.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(1);
/// What a call to the paused server may take beyond its time limit: the timer's wake-up and
/// closing the connection, on a loaded two-core machine.
const MARGIN: Duration = Duration::from_millis(500);
/// The watchdog lease of the paused-server test: shorter than the pause, so the holder's guard
/// must report its lock lost while the server is stopped.
const PAUSED_TTL: Duration = Duration::from_secs(3);

/// Calls that find an already-open pooled connection to a server that stopped answering
/// (SIGSTOP: the kernel still accepts and buffers, nobody reads) fail with a temporary
/// `Unavailable` within the operation timeout instead of waiting for the server to resume (or,
/// behind a network that silently drops packets, for TCP to give up after many minutes): the
/// release of a held guard, a `try_lock` of a free name, `holder()`, an explicit renewal and a
/// sweep. A watchdog-managed guard reports its lock lost by its safe-until; a contender is
/// granted nothing while the server is stopped; and after SIGCONT the same client works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_paused_server_fail_within_the_operation_timeout() {
    if common::skipped() {
        return;
    }
    bounded("the paused-server test", BUDGET, operation_timeout_test()).await;
}

/// Opens several connections in both of the client's pools (acquiring; renewing and
/// releasing) by running operations at once, and lets them all go back to the pool (sqlx
/// returns a connection in a task of its own, after a ping).
async fn warm_up(client: &Arc<MysqlLock>, tag: &str) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let client = client.clone();
        let name = format!("{tag}-warm-up-{i}");
        tasks.spawn(async move {
            let g = client
                .try_lock(&name)
                .await
                .expect("warm-up try_lock")
                .expect("warm-up name is free");
            client.holder(&name).await.expect("warm-up holder");
            assert!(g.release().await.expect("warm-up release"));
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("warm-up task");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Runs one call against the paused server and checks that it fails with a temporary
/// `Unavailable` within `limit`; returns the error and how long the call took.
async fn fails_in_time<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    call: impl Future<Output = Result<T>>,
) -> (Error, Duration) {
    let sent = Instant::now();
    // Three times the limit: a call that is still waiting then is taken to hang.
    let answer = bounded(what, limit * 3, call).await;
    let took = sent.elapsed();
    eprintln!("paused: {what} answered in {} ms: {answer:?}", ms(took));
    let e = match answer {
        Err(e) => e,
        Ok(v) => panic!("{what} answered {v:?} while the server was stopped"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{what}: {e}");
    assert!(e.is_temporary(), "{what}: not temporary: {e}");
    assert_eq!(e.backend(), Some("mysql"), "{what}: {e}");
    assert!(
        took <= limit,
        "{what} took {} ms, more than the {} ms allowed",
        ms(took),
        ms(limit)
    );
    (e, took)
}

async fn operation_timeout_test() {
    let began = Instant::now();
    let server = PrivateMariadb::start().await;
    let config =
        |owner| client_config(&server, owner, PAUSED_TTL).operation_timeout(OPERATION_TIMEOUT);
    let holder = connect(config("holder")).await;
    let contender = connect(config("contender")).await;
    let kept_name = "kept-through-a-pause";
    let released_name = "released-during-a-pause";
    let free_name = "free-during-a-pause";

    // A watchdog-managed lock that must be reported lost, and one to release while paused.
    let kept = holder
        .try_lock(kept_name)
        .await
        .expect("try_lock")
        .expect("free");
    let released = holder
        .try_lock(released_name)
        .await
        .expect("try_lock")
        .expect("free");
    let lost_watch = watch_lost(&kept);
    // The pools hold open connections, used less than 5 s ago (older ones are pinged before
    // use, which the connect timeout bounds): the calls below take one and send on it.
    warm_up(&holder, "holder").await;
    warm_up(&contender, "contender").await;
    assert!(!kept.is_lost(), "lost before the pause");

    server.signal("STOP");
    let stopped_at = Instant::now();
    // The contender keeps trying the held lock all through the pause.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (attempts, trying) = keep_trying(contender.clone(), kept_name, stop.clone());

    let limit = OPERATION_TIMEOUT + MARGIN;
    let mut on_open_connections = Vec::new();
    let (e, _) = fails_in_time("the release of a held guard", limit, released.release()).await;
    on_open_connections.push(("release", e));
    let (e, _) = fails_in_time("try_lock of a free name", limit, holder.try_lock(free_name)).await;
    on_open_connections.push(("try_lock", e));
    let (e, _) = fails_in_time("holder()", limit, holder.holder(free_name)).await;
    on_open_connections.push(("holder()", e));
    // Each of these found an idle connection that was used just before the stop, so it was the
    // operation timeout, not the wait for a connection, that ended it.
    for (what, e) in &on_open_connections {
        assert!(
            e.to_string().contains("operation timeout"),
            "{what} did not run into the operation timeout: {e}"
        );
    }
    // A renewal may queue behind the watchdog's batch in flight (two flushers), and the
    // sweeper's connection may have to be opened (connect timeout) or pinged first.
    fails_in_time(
        "an explicit renewal",
        OPERATION_TIMEOUT * 2 + MARGIN,
        DistributedLock::renew(&*holder, kept.grant(), PAUSED_TTL),
    )
    .await;
    fails_in_time(
        "sweep_now()",
        OPERATION_TIMEOUT.max(CONNECT_TIMEOUT) + MARGIN,
        holder.sweep_now(),
    )
    .await;

    // The holder's guard reports its lock lost by its safe-until, while still paused.
    let (fired_at, reason) = bounded(
        "lost() while the server is paused",
        PAUSED_TTL + SLACK * 4,
        lost_watch,
    )
    .await
    .expect("lost watcher");
    let until = kept.safe_until().expect("safe-until");
    eprintln!(
        "paused: lost() fired {} ms after SIGSTOP, {} ms after the safe-until ({} ms after \
         SIGSTOP); reason: {reason}",
        delta_ms(stopped_at, fired_at),
        delta_ms(until, fired_at),
        delta_ms(stopped_at, until)
    );
    assert_eq!(
        reason,
        LostReason::Expired,
        "no renewal could be answered while the server was paused"
    );
    assert!(
        fired_at <= until + SLACK,
        "lost() fired {} ms after the holder's safe-until",
        delta_ms(until, fired_at)
    );
    assert!(
        kept.is_lost(),
        "a guard past its safe-until claims the lock"
    );

    // Stay stopped until the kept row has expired by the server's clock too.
    tokio::time::sleep_until((stopped_at + PAUSED_TTL + MARGIN).into()).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    server.signal("CONT");
    let resumed_at = Instant::now();
    eprintln!(
        "resumed after a pause of {} ms",
        ms(resumed_at - stopped_at)
    );
    bounded("the contender's loop", limit * 3, trying)
        .await
        .expect("contender task");
    let attempts = std::mem::take(&mut *attempts.lock().unwrap());
    eprintln!(
        "contender while paused: {} answered held, grants at {:?} ms after SIGCONT, {} errors, \
         slowest try_lock {} ms; errors: {:?}",
        attempts.answered_held,
        attempts
            .grants
            .iter()
            .map(|(_, at)| delta_ms(resumed_at, *at))
            .collect::<Vec<_>>(),
        attempts.errors.len(),
        ms(attempts.slowest),
        attempts.errors
    );
    let during: Vec<_> = attempts
        .grants
        .iter()
        .filter(|(_, at)| *at < resumed_at)
        .collect();
    assert!(
        during.is_empty(),
        "the contender was granted the lock while the server was stopped: {during:?}"
    );
    assert!(
        !attempts.errors.is_empty(),
        "the contender's calls to the stopped server never failed"
    );
    for (kind, temporary, e) in &attempts.errors {
        assert!(
            *kind == ErrorKind::Unavailable && *temporary,
            "a call to a stopped server must fail with a temporary Unavailable, got {kind:?}: {e}"
        );
    }
    assert!(
        attempts.slowest <= OPERATION_TIMEOUT.max(CONNECT_TIMEOUT) + MARGIN,
        "a try_lock of the contender took {} ms while the server was stopped",
        ms(attempts.slowest)
    );

    // The same client works again, soon.
    let (grant, errors) = settled("try_lock after SIGCONT", Duration::from_secs(5), || {
        holder.try_lock("taken-after-a-pause")
    })
    .await;
    let worked_at = Instant::now();
    let grant = grant.expect("a free name is granted after the pause");
    eprintln!(
        "after SIGCONT: a try_lock succeeded {} ms after the resume (temporary errors first: \
         {errors:?})",
        ms(worked_at - resumed_at)
    );
    assert!(
        worked_at - resumed_at <= Duration::from_secs(3),
        "the client took {} ms to work again after the server resumed",
        ms(worked_at - resumed_at)
    );
    assert!(grant.release().await.expect("release"));
    // The try_lock that timed out left nothing behind.
    let (info, _) = settled("holder() after SIGCONT", Duration::from_secs(3), || {
        holder.holder(free_name)
    })
    .await;
    assert!(
        info.is_none(),
        "the try_lock that timed out during the pause holds {free_name}: {info:?}"
    );
    // Nor an open transaction: the grant's statements went out as one request, which the
    // stopped server had not read when the client gave up on it and closed the connection, so
    // the server either ran it whole later (a grant, given back above) or not at all; what a
    // half-read batch left open ends with its connection. No transaction has been open for a
    // second by the time the server has had a few seconds to run.
    let mut raw = {
        use sqlx::Connection;
        let options = client_config(&server, "inspector", PAUSED_TTL).connect_options();
        sqlx::MySqlConnection::connect_with(&options)
            .await
            .expect("a raw connection to the private server")
    };
    let mut open = i64::MAX;
    for _ in 0..30 {
        open = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.innodb_trx \
             WHERE trx_started < NOW() - INTERVAL 1 SECOND",
        )
        .fetch_one(&mut raw)
        .await
        .expect("reading innodb_trx");
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        open, 0,
        "transactions left open by the calls cut off by the pause"
    );
    // The guard reported lost cannot claim its lock back.
    let late = bounded("the late release", limit * 2, kept.release()).await;
    eprintln!("the lost guard's release after SIGCONT answered {late:?}");
    assert!(
        !matches!(late, Ok(true)),
        "the guard reported lost claims it still held the lock"
    );
    drop((holder, contender));
    drop(server);
    eprintln!("operation timeout test took {} ms", ms(began.elapsed()));
}

/// A waiter of another client blocked in `GET_LOCK` on the holder's release signal when the
/// server stops: its acquire ends at its wait bound (plus the operation timeout of the wait
/// and of the last attempt), not hanging on the silent session; once the server resumes, the
/// holder's release signals the next waiter, whose backoff (20 s) could not have found the
/// lock free within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_blocked_on_a_release_signal_of_a_paused_server_ends_at_its_bound() {
    if common::skipped() {
        return;
    }
    bounded("the signal-pause test", BUDGET, async {
        let server = PrivateMariadb::start().await;
        let slow = Duration::from_secs(20);
        let config = |owner| {
            client_config(&server, owner, Duration::from_secs(30))
                .operation_timeout(OPERATION_TIMEOUT)
                .backoff(slow, slow)
        };
        let holder = connect(config("holder")).await;
        let waiter = connect(config("waiter")).await;
        let name = "signal-through-a-pause";
        let long = distlock_mysql::LockOptions::new().ttl(Duration::from_secs(60));
        let held = holder.lock_with(name, &long).await.expect("lock");
        // The holder's companion lock is taken a moment after the grant.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let wait = Duration::from_secs(2);
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.lock(name, wait).await })
        };
        // Blocked in GET_LOCK by now.
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.signal("STOP");
        let limit = wait + OPERATION_TIMEOUT * 2 + MARGIN;
        let ended = bounded("the waiter on a paused server", limit, waiting).await;
        let e = ended
            .expect("task")
            .expect_err("granted while held and paused");
        assert!(
            matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
            "{e}"
        );
        server.signal("CONT");

        let next = {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.lock(name, Duration::from_secs(20)).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!next.is_finished(), "granted while held");
        assert!(held.release().await.expect("release after the pause"));
        let got = bounded("the signalled waiter", Duration::from_millis(3500), next)
            .await
            .expect("task")
            .expect("granted after the release");
        assert!(got.release().await.expect("release"));
    })
    .await;
}

/// A release that hands the lock to a waiting task of its handle, sent to a paused server: the
/// answer is lost, so neither the release nor the new grant is known to have happened, and the
/// task's own attempts fail too. Both are settled after the server resumes: no hold is left
/// without a guard (another client gets the lock long before the 10-minute leases would end),
/// and no transaction of the cut-off batch (it may have stopped at its guard) stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_a_paused_server_applies_late_leaves_nothing_held() {
    if common::skipped() {
        return;
    }
    bounded("the paused hand-over test", BUDGET, async {
        let server = PrivateMariadb::start().await;
        let config =
            |owner| client_config(&server, owner, PAUSED_TTL).operation_timeout(OPERATION_TIMEOUT);
        let (a, b) = (connect(config("a")).await, connect(config("b")).await);
        let name = "paused-mid-hand-over";
        let long = LockOptions::new()
            .ttl(Duration::from_secs(600))
            .wait(Duration::from_secs(10));
        let g = a.try_lock_with(name, &long).await.unwrap().expect("free");
        let waiter = tokio::spawn({
            let (a, long) = (a.clone(), long.clone());
            async move { a.lock_with(name, &long).await }
        });
        // Waiting: it has offered to take the lock from a release of `a`.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished());
        server.signal("STOP");
        let e = g.release().await.expect_err("released on a paused server");
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.signal("CONT");
        // The task either became the holder after the resume, or gave up.
        if let Ok(g2) = waiter.await.unwrap() {
            assert!(g2.release().await.unwrap());
        }
        let (g3, _) = settled("another client's lock", Duration::from_secs(20), || {
            b.lock(name, Duration::from_secs(15))
        })
        .await;
        assert!(g3.release().await.unwrap());
        let mut raw = {
            use sqlx::Connection;
            let options = client_config(&server, "inspector", PAUSED_TTL).connect_options();
            sqlx::MySqlConnection::connect_with(&options)
                .await
                .expect("a raw connection to the private server")
        };
        let mut open = i64::MAX;
        for _ in 0..30 {
            open = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.innodb_trx \
                 WHERE trx_started < NOW() - INTERVAL 1 SECOND",
            )
            .fetch_one(&mut raw)
            .await
            .expect("reading innodb_trx");
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(open, 0, "transactions left open by the cut-off hand-over");
    })
    .await;
}
