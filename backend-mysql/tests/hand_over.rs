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
use distlock_api::Grant;
use distlock_conformance::given::handoff_round_trips;
use distlock_conformance::{hosts_of, reroute, Proxy};
use distlock_mysql::sqlx::{self, MySqlConnection};
use distlock_mysql::{
    DistributedLock, ErrorKind, LockExt, LockInfo, LockName, LockOptions, MysqlConfig, MysqlLock,
};

async fn connect(config: MysqlConfig) -> Arc<MysqlLock> {
    Arc::new(MysqlLock::connect(config).await.unwrap_or_else(|e| {
        panic!("{e}\n  start MariaDB with `scripts/services up` or skip with DISTLOCK_SKIP=mysql")
    }))
}

/// A request for `name` under a fresh owner id of `lock`'s.
fn request(lock: &MysqlLock, name: &LockName, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(name.clone(), lock.core().next_owner(), ttl).unwrap()
}

async fn granted(lock: &MysqlLock, req: &AcquireRequest) -> Grant {
    lock.attempt(req)
        .await
        .unwrap()
        .into_grant()
        .expect("the name is free")
}

async fn held(lock: &MysqlLock, name: &LockName) -> LockInfo {
    lock.inspect(name).await.unwrap().expect("the name is held")
}

fn lock_name(tag: &str) -> LockName {
    LockName::new(format!("ho-{tag}-{}", std::process::id())).unwrap()
}

/// A last hold passes to the waiter's owner with the next token, hold count 1 and the waiter's
/// own lease (shorter or longer than the releasing grant's), judged from the request's send;
/// the old grant holds nothing any more and the new one is a grant like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_hold_passes_with_the_next_token_and_the_waiters_lease() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("ho_last");
    let lock = connect(tables.config()).await;
    let name = lock_name("last");
    let mut from = granted(&lock, &request(&lock, &name, Duration::from_secs(20))).await;
    for ttl in [Duration::from_secs(5), Duration::from_secs(60)] {
        let to = request(&lock, &name, ttl);
        let counter = tables.fencing_value(name.as_str()).await;
        let before = Instant::now();
        let HandOver::Handed(g) = lock.hand_over(&from, &to).await.unwrap() else {
            panic!("a last hold was not handed over");
        };
        assert!(g.token > from.token, "{:?} after {:?}", g.token, from.token);
        assert_eq!(
            g.token.0,
            counter + 1,
            "the counter's next value, none burned"
        );
        assert_eq!(tables.fencing_value(name.as_str()).await, g.token.0);
        assert_eq!(
            (&g.name, &g.owner, g.hold_count, g.ttl),
            (&name, &to.owner, 1, ttl)
        );
        assert!(g.sent_at >= before && g.sent_at <= Instant::now());
        let info = held(&lock, &name).await;
        assert_eq!(
            (&info.owner, info.hold_count, info.token),
            (&to.owner, 1, g.token)
        );
        let left = info.remaining.expect("a lease");
        assert!(
            left <= ttl && left + Duration::from_secs(2) > ttl,
            "{left:?} left of a {ttl:?} lease"
        );
        // The old grant: nothing to release, renew or hand over.
        assert!(!lock.release(&from).await.unwrap());
        let renewed = lock.renew(&from, Duration::from_secs(5)).await;
        assert_eq!(renewed.map_err(|e| e.kind()), Err(ErrorKind::Lost));
        let again = lock
            .hand_over(&from, &request(&lock, &name, ttl))
            .await
            .unwrap();
        assert!(matches!(again, HandOver::Released(false)), "{again:?}");
        assert_eq!(held(&lock, &name).await.token, g.token, "nothing changed");
        // The new one renews like any grant.
        lock.renew(&g, Duration::from_secs(30)).await.unwrap();
        from = g;
    }
    // The last new grant releases, and the next fresh grant's token is greater still.
    assert!(lock.release(&from).await.unwrap());
    assert!(lock.inspect(&name).await.unwrap().is_none());
    let next = granted(&lock, &request(&lock, &name, Duration::from_secs(5))).await;
    assert_eq!(next.token.0, from.token.0 + 1);
    assert!(lock.release(&next).await.unwrap());
    tables.drop_all().await;
}

/// A grant with two holds gives one up and keeps the lock, token and all; a grant that no
/// longer holds (a wrong token, or expired and taken over by another client) changes nothing.
/// Neither issues a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_last_hold_of_a_holding_grant_passes() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("ho_only");
    let lock = connect(tables.config()).await;
    let other = connect(tables.config()).await;
    let name = lock_name("only");
    let first = request(&lock, &name, Duration::from_secs(30));
    let from = granted(&lock, &first).await;
    let twice = granted(&lock, &first).await;
    assert_eq!((twice.token, twice.hold_count), (from.token, 2));
    let counter = tables.fencing_value(name.as_str()).await;

    let to = request(&lock, &name, Duration::from_secs(5));
    let kept = lock.hand_over(&twice, &to).await.unwrap();
    assert!(matches!(kept, HandOver::Released(true)), "{kept:?}");
    let info = held(&lock, &name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&first.owner, 1, from.token)
    );
    assert!(
        info.remaining.unwrap() > Duration::from_secs(20),
        "lease kept"
    );

    // A wrong token: nothing changes.
    let mut wrong = from.clone();
    wrong.token.0 += 1;
    let stale = lock.hand_over(&wrong, &to).await.unwrap();
    assert!(matches!(stale, HandOver::Released(false)), "{stale:?}");
    let info = held(&lock, &name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&first.owner, 1, from.token)
    );
    assert_eq!(
        tables.fencing_value(name.as_str()).await,
        counter,
        "no token issued"
    );
    assert!(lock.release(&from).await.unwrap());

    // Expired and taken over by another client: nothing changes.
    let short = granted(&lock, &request(&lock, &name, Duration::from_millis(200))).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taker = request(&other, &name, Duration::from_secs(30));
    let taken = granted(&other, &taker).await;
    assert!(taken.token > short.token);
    let stale = lock.hand_over(&short, &to).await.unwrap();
    assert!(matches!(stale, HandOver::Released(false)), "{stale:?}");
    let info = held(&lock, &name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&taker.owner, 1, taken.token)
    );
    assert_eq!(tables.fencing_value(name.as_str()).await, taken.token.0);
    assert!(other.release(&taken).await.unwrap());

    // Expired and not taken over: not held either (and its row is cleared, as its release
    // would clear it).
    let short = granted(&lock, &request(&lock, &name, Duration::from_millis(200))).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stale = lock.hand_over(&short, &to).await.unwrap();
    assert!(matches!(stale, HandOver::Released(false)), "{stale:?}");
    assert!(lock.inspect(&name).await.unwrap().is_none());
    assert_eq!(tables.fencing_value(name.as_str()).await, short.token.0);
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
    tables.drop_all().await;
}

/// The round trips `op` made through `proxy`.
async fn trips<T>(proxy: &Proxy, op: impl std::future::Future<Output = T>) -> (T, u64) {
    let before = proxy.round_trips();
    let out = op.await;
    (out, proxy.round_trips() - before)
}

/// Every outcome is one request: handed over, one hold of several given up, not held.
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
    let g = granted(&lock, &request(&lock, &name, ttl)).await;
    let HandOver::Handed(g) = lock
        .hand_over(&g, &request(&lock, &name, ttl))
        .await
        .unwrap()
    else {
        panic!("not handed over");
    };

    let (done, n) = trips(&proxy, lock.hand_over(&g, &request(&lock, &name, ttl))).await;
    let HandOver::Handed(h) = done.unwrap() else {
        panic!("not handed over");
    };
    assert_eq!(n, 1, "a hand-over of a last hold is one request");
    assert_eq!(h.token.0, g.token.0 + 1);
    let again = granted(
        &lock,
        &AcquireRequest::new(name.clone(), h.owner.clone(), ttl).unwrap(),
    )
    .await;
    assert_eq!(again.hold_count, 2);
    let (done, n) = trips(&proxy, lock.hand_over(&again, &request(&lock, &name, ttl))).await;
    assert!(matches!(done.unwrap(), HandOver::Released(true)));
    assert_eq!(n, 1, "one hold of several given up is one request");
    let (done, n) = trips(&proxy, lock.hand_over(&g, &request(&lock, &name, ttl))).await;
    assert!(matches!(done.unwrap(), HandOver::Released(false)));
    assert_eq!(n, 1, "a grant that no longer holds is one request");
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
    let from = granted(&lock, &request(&lock, &name, Duration::from_secs(120))).await;
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

    let to = request(&lock, &name, Duration::from_secs(120));
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
