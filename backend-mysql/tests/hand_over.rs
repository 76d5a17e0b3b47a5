//! Hand-overs ([`DistributedLock::hand_over`]): a release through a handle that grants the lock
//! to a waiting task of the same handle in the same transaction. The trait method is called
//! directly on a connected client, with the releasing grant from `attempt` and the waiter's
//! request under an owner id of its own; what it did is read back with `inspect`, the fencing
//! counter and the grants' own release and renew. Round trips are counted by a loopback proxy
//! between one client and the server.
//!
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`); skipped
//! when `DISTLOCK_SKIP` names `mysql`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::PrivateTables;
use distlock_api::backend::wait::HandOver;
use distlock_api::backend::AcquireRequest;
use distlock_conformance::given::handoff_round_trips;
use distlock_conformance::hand_over::{self, granted, request};
use distlock_conformance::{hosts_of, reroute, Proxy};
use distlock_mysql::sqlx::{self, MySqlConnection};
use distlock_mysql::{DistributedLock, LockExt, LockName, LockOptions, MysqlConfig, MysqlLock};

async fn connect(config: MysqlConfig) -> Arc<MysqlLock> {
    Arc::new(MysqlLock::connect(config).await.unwrap_or_else(|e| {
        panic!("{e}\n  start MariaDB with `scripts/services up` or skip with DISTLOCK_SKIP=mysql")
    }))
}

fn lock_name(tag: &str) -> LockName {
    LockName::new(format!("ho-{tag}-{}", std::process::id())).unwrap()
}

/// A last hold passes to the waiter's owner with the next token, hold count 1 and the waiter's
/// own lease; the old grant holds nothing any more and the new one is a grant like any other
/// ([`hand_over::a_last_hold_passes`]); the counter holds the last token issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_hold_passes_with_the_next_token_and_the_waiters_lease() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("ho_last");
    let lock = connect(tables.config()).await;
    let name = lock_name("last");
    hand_over::a_last_hold_passes(&*lock, &name).await;
    let last = granted(&*lock, &request(&*lock, &name, Duration::from_secs(5))).await;
    assert_eq!(tables.fencing_value(name.as_str()).await, last.token.0);
    assert!(lock.release(&last).await.unwrap());
    tables.drop_all().await;
}

/// A grant with two holds gives one up and keeps the lock; a grant that no longer holds
/// changes nothing and issues no token ([`hand_over::only_a_last_hold_of_a_holding_grant_passes`]).
/// An expired grant's row, not taken over, is cleared by its hand-over as its release would
/// clear it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_last_hold_of_a_holding_grant_passes() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("ho_only");
    let lock = connect(tables.config()).await;
    let other = connect(tables.config()).await;
    let name = lock_name("only");
    let expired =
        hand_over::only_a_last_hold_of_a_holding_grant_passes(&*lock, &*other, &name).await;
    assert_eq!(tables.fencing_value(name.as_str()).await, expired.token.0);
    let mut raw = tables.raw().await;
    let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{}` WHERE name = ?",
        tables.locks
    )))
    .bind(name.as_str().as_bytes())
    .fetch_one(&mut raw)
    .await
    .unwrap();
    assert_eq!(rows, 0, "the expired grant's row is cleared");
    hand_over::next_grant_follows(&*lock, &name, &expired).await;
    tables.drop_all().await;
}

/// The round trips `op` made through `proxy`.
async fn trips<T>(proxy: &Proxy, op: impl std::future::Future<Output = T>) -> (T, u64) {
    let before = proxy.round_trips();
    let out = op.await;
    (out, proxy.round_trips() - before)
}

/// A hand-over of a last hold is one request; one hold of several given up, or a grant that
/// no longer holds, is two (the common case's statements, then the full hand-over with the
/// rollback of the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_is_one_request() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("ho_trips");
    let url = common::url();
    let proxy = Proxy::start(hosts_of(&url)[0].clone()).await;
    let proxied = reroute(&url, &hosts_of(&url), &[proxy.addr()]);
    // As in round_trips.rs: two connections per pool (each operation finds the one the last
    // set aside) and no release signals (their session would add requests of its own).
    let config = MysqlConfig::from_url(&proxied)
        .unwrap()
        .lock_table(&tables.locks)
        .fencing_table(&tables.fencing)
        .pool_size(2)
        .release_signals(false);
    let lock = connect(config).await;
    let name = lock_name("trips");
    let ttl = Duration::from_secs(60);
    // Warm up: both pools' connections open.
    let g = granted(&*lock, &request(&*lock, &name, ttl)).await;
    let HandOver::Handed(g) = lock
        .hand_over(&g, &request(&*lock, &name, ttl))
        .await
        .unwrap()
    else {
        panic!("not handed over");
    };

    let (done, n) = trips(&proxy, lock.hand_over(&g, &request(&*lock, &name, ttl))).await;
    let HandOver::Handed(h) = done.unwrap() else {
        panic!("not handed over");
    };
    assert_eq!(n, 1, "a hand-over of a last hold is one request");
    assert_eq!(h.token.0, g.token.0 + 1);
    let again = granted(
        &*lock,
        &AcquireRequest::new(name.clone(), h.owner.clone(), ttl).unwrap(),
    )
    .await;
    assert_eq!(again.hold_count, 2);
    let (done, n) = trips(&proxy, lock.hand_over(&again, &request(&*lock, &name, ttl))).await;
    assert!(matches!(done.unwrap(), HandOver::Released(true)));
    assert_eq!(n, 2, "one hold of several given up is two requests");
    let (done, n) = trips(&proxy, lock.hand_over(&g, &request(&*lock, &name, ttl))).await;
    assert!(matches!(done.unwrap(), HandOver::Released(false)));
    assert_eq!(n, 2, "a grant that no longer holds is two requests");
    assert!(lock.release(&h).await.unwrap());

    // Through the conveniences: a guard's release hands the lock to a task of the same client
    // waiting for it, in the release's own request.
    let opts = LockOptions::new().ttl(ttl).wait(Duration::from_secs(30));
    let counts = handoff_round_trips(&lock, &lock, &proxy, name.as_str(), &opts, 1, 3).await;
    assert_eq!(
        counts.iter().min(),
        Some(&1),
        "round trips from release to the waiting task's grant: {counts:?}"
    );
    drop(lock);
    tables.drop_all().await;
}

async fn is_free(raw: &mut MySqlConnection, companion: &str) -> bool {
    let free: Option<i64> = sqlx::query_scalar("SELECT IS_FREE_LOCK(?)")
        .bind(companion)
        .fetch_one(raw)
        .await
        .unwrap();
    free == Some(1)
}

/// The lock never comes free in a hand-over, so the holder's release signal is kept (moved to
/// the new grant): a waiter of another client, blocked on it, sleeps through the hand-over and
/// is woken by the new grant's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_keeps_the_release_signal_for_the_new_grant() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("ho_signal");
    let mut raw = tables.raw().await;
    let lock = connect(tables.config()).await;
    // A waiter that polls only every 20 s: only the signal can wake it within the bounds.
    let slow = Duration::from_secs(20);
    let waiter = connect(tables.config().backoff(slow, slow)).await;
    let name = lock_name("signal");
    let companion = lock.signal_name(&name).unwrap();
    let from = granted(&*lock, &request(&*lock, &name, Duration::from_secs(120))).await;
    let until = Instant::now() + Duration::from_secs(5);
    while is_free(&mut raw, &companion).await {
        assert!(Instant::now() < until, "the companion lock was never taken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(name.as_str(), Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "granted while held");

    let to = request(&*lock, &name, Duration::from_secs(120));
    let HandOver::Handed(g) = lock.hand_over(&from, &to).await.unwrap() else {
        panic!("not handed over");
    };
    // Give the signal task time to send a give, if it (wrongly) did.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !is_free(&mut raw, &companion).await,
        "the hand-over let go of the release signal"
    );
    assert!(!task.is_finished(), "granted while handed over");

    // The new grant's release wakes the waiter (signalled, well before its 10-20 s poll).
    let released = Instant::now();
    assert!(lock.release(&g).await.unwrap());
    let got = tokio::time::timeout(Duration::from_millis(3500), task)
        .await
        .expect("the new grant's release signals the waiter")
        .unwrap()
        .unwrap();
    assert!(got.token() > g.token);
    assert!(released.elapsed() < Duration::from_millis(3500));
    assert!(got.release().await.unwrap());
    tables.drop_all().await;
}
