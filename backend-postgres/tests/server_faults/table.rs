//! Table mode: a crash and restart within the lease, and a pause longer than it.

use super::*;

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

    let tries = trying.finish(OPERATION_TIMEOUT * 5).await;
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

// A pause longer than the lease.

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
