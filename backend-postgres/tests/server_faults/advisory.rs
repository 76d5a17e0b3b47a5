//! Advisory mode: the holder's lock session ended by an operator, and a crash and restart.

use super::*;

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
        matches!(reason, LostReason::Session(_)),
        "a probe must find the session gone (not the lease running out, nor the lock taken): \
         {reason:?}"
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
        matches!(reason, LostReason::Session(_)),
        "a probe must find the session gone (not the lease running out, nor the lock taken): \
         {reason:?}"
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
