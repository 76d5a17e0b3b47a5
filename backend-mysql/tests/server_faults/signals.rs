use super::*;

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
