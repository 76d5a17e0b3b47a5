use super::*;

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
