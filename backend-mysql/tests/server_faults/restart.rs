use super::*;

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
    let trying = Contender::spawn(contender.clone(), name);

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

    let attempts = trying.finish(CONNECT_TIMEOUT * 4).await;
    eprintln!(
        "contender while held: {} answered held, {} errors, slowest try_lock {} ms; errors: {:?}",
        attempts.refused,
        attempts.errors.len(),
        ms(attempts.slowest),
        attempts.errors
    );
    assert!(
        attempts.grants.is_empty(),
        "the contender was granted the held lock: {:?}",
        attempts.grants
    );
    assert!(attempts.refused > 0, "the contender never got an answer");
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
