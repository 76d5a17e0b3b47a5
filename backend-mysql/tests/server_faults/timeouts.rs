use super::*;

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
    let trying = Contender::spawn(contender.clone(), kept_name);

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
    trying.stop();
    // The instant is taken before the signal is sent: kill(1) takes milliseconds to spawn, and
    // the server may answer a queued acquire before it returns. A grant observed before this
    // instant was answered by a stopped server.
    let resumed_at = Instant::now();
    server.signal("CONT");
    eprintln!(
        "resumed after a pause of {} ms",
        ms(resumed_at - stopped_at)
    );
    let attempts = trying.finish(limit * 3).await;
    eprintln!(
        "contender while paused: {} answered held, grants at {:?} ms after SIGCONT, {} errors, \
         slowest try_lock {} ms; errors: {:?}",
        attempts.refused,
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
