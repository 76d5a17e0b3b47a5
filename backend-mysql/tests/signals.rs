//! Release signals across clients (separate `MysqlLock` handles, as separate processes would
//! be): a waiter whose polling backoff is 20 s (first step 10–20 s) gets the lock within a few
//! seconds of another client's release only if the server woke it. Without a signal it would
//! look again at the 5 s re-check at the earliest (`NOTICE_RECHECK`, counted from its last
//! attempt, 300 ms before the release here), so the bound is 3.5 s. The bounds tell a signal
//! from a poll; they do not measure how fast the signal is (the benchmark does).
//!
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`); skipped
//! when `DISTLOCK_SKIP` names `mysql`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::PrivateTables;
use distlock_api::backend::wait::Waiting;
use distlock_api::Blocking;
use distlock_mysql::sqlx::{self, MySqlConnection};
use distlock_mysql::{DistributedLock, ErrorKind, LockExt, LockName, LockOptions, MysqlLock};

/// A polling step no hand-off within the bounds below can come from.
const SLOW: Duration = Duration::from_secs(20);
/// Longer than any signalled hand-off takes, shorter than what is left of the 5 s re-check
/// when the release comes (≥ 4.7 s), far shorter than [`SLOW`]'s first step (≥ 10 s).
const WOKEN_WITHIN: Duration = Duration::from_millis(3500);

async fn client(tables: &PrivateTables, signals: bool, backoff: Duration) -> Arc<MysqlLock> {
    let config = tables
        .config()
        .release_signals(signals)
        .backoff(backoff, backoff);
    Arc::new(MysqlLock::connect(config).await.unwrap_or_else(|e| {
        panic!("{e}\n  start MariaDB with `scripts/services up` or skip with DISTLOCK_SKIP=mysql")
    }))
}

/// A fixed lease far longer than the test: only a release frees the lock.
fn long_lease() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(120))
}

async fn is_free(raw: &mut MySqlConnection, companion: &str) -> bool {
    let free: Option<i64> = sqlx::query_scalar("SELECT IS_FREE_LOCK(?)")
        .bind(companion)
        .fetch_one(raw)
        .await
        .unwrap();
    free == Some(1)
}

/// Waits up to 5 s for the companion lock to be `free` or held (its take and give are sent
/// off the acquire's and release's paths).
async fn companion_becomes(raw: &mut MySqlConnection, companion: &str, free: bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while is_free(raw, companion).await != free {
        assert!(
            Instant::now() < until,
            "the companion lock {companion} is still {}",
            if free { "held" } else { "free" }
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn name(tag: &str) -> String {
    format!(
        "signals-{tag}-{}-{}",
        std::process::id(),
        common::seed() % 100_000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_another_client_is_woken_by_the_release_not_by_its_backoff() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("signals_wake");
    let mut raw = tables.raw().await;
    let holder = client(&tables, true, Duration::from_millis(2)).await;
    let waiter = client(&tables, true, SLOW).await;
    assert_eq!(waiter.capabilities().blocking, Blocking::Signal);
    assert!(matches!(waiter.profile().waiting, Waiting::Poll(_)));
    for round in 0..3 {
        let name = name(&format!("wake{round}"));
        let companion = holder.signal_name(&LockName::new(&name).unwrap()).unwrap();
        let held = holder.lock_with(&name, &long_lease()).await.unwrap();
        companion_becomes(&mut raw, &companion, false).await;
        let task = {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move {
                let g = waiter.lock(&name, Duration::from_secs(60)).await;
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!task.is_finished(), "granted while held");
        let released = Instant::now();
        assert!(held.release().await.unwrap());
        let (granted, got) = tokio::time::timeout(WOKEN_WITHIN, task)
            .await
            .expect("the release signal hands the lock over, not the 20 s backoff")
            .unwrap();
        let got = got.unwrap();
        assert!(granted >= released);
        assert!(got.release().await.unwrap());
        // Neither the holder's signal nor the waiter's wait leaves the companion lock held.
        companion_becomes(&mut raw, &companion, true).await;
    }
    assert!(waiter.wait_sessions() >= 1, "the waits used a wait session");
    tables.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signal_stays_until_the_last_hold_of_a_reentered_grant_is_released() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("signals_reenter");
    let mut raw = tables.raw().await;
    let holder = client(&tables, true, Duration::from_millis(2)).await;
    let waiter = client(&tables, true, SLOW).await;
    let name = name("reenter");
    let companion = holder.signal_name(&LockName::new(&name).unwrap()).unwrap();
    let first = holder.lock_with(&name, &long_lease()).await.unwrap();
    let second = first.reenter().await.unwrap();
    assert_eq!(second.hold_count(), 2);
    companion_becomes(&mut raw, &companion, false).await;
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "granted while one hold was left");
    assert!(
        !is_free(&mut raw, &companion).await,
        "signal given with a hold left"
    );
    assert!(second.release().await.unwrap());
    let got = tokio::time::timeout(WOKEN_WITHIN, task)
        .await
        .expect("the last release signals")
        .unwrap()
        .unwrap();
    assert!(got.release().await.unwrap());
    companion_becomes(&mut raw, &companion, true).await;
    tables.drop_all().await;
}

/// Waiters that give up (their bound runs out, or their task is dropped mid-wait) leave
/// neither the companion lock nor a stuck session: the holder's release frees the companion
/// lock, and the waiter's client acquires at once afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_nothing_held() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("signals_cancel");
    let mut raw = tables.raw().await;
    let holder = client(&tables, true, Duration::from_millis(2)).await;
    let waiter = client(&tables, true, SLOW).await;
    let name = name("cancel");
    let companion = holder.signal_name(&LockName::new(&name).unwrap()).unwrap();
    let held = holder.lock_with(&name, &long_lease()).await.unwrap();
    companion_becomes(&mut raw, &companion, false).await;

    let started = Instant::now();
    let timed_out = waiter.lock(&name, Duration::from_millis(400)).await;
    assert_eq!(timed_out.unwrap_err().kind(), ErrorKind::Timeout);
    assert!(started.elapsed() < WOKEN_WITHIN, "the wait kept its bound");

    let dropped = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());

    assert!(
        !is_free(&mut raw, &companion).await,
        "the holder's signal is still there"
    );
    assert!(held.release().await.unwrap());
    companion_becomes(&mut raw, &companion, true).await;
    let got = waiter.try_lock(&name).await.unwrap().expect("free");
    assert!(got.release().await.unwrap());
    tables.drop_all().await;
}

/// A holder with signals off keeps no companion lock, so a waiter with signals on finds the
/// channel free and polls with its backoff (50 ms here) instead of blocking on it; a client
/// with signals off says it polls and has no notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_holders_signal_a_waiter_polls() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("signals_off");
    let mut raw = tables.raw().await;
    let quiet = client(&tables, false, Duration::from_millis(50)).await;
    assert_eq!(quiet.capabilities().blocking, Blocking::Poll);
    assert_eq!(quiet.signal_name(&LockName::new("x").unwrap()), None);
    let refused = quiet.subscribe(&LockName::new("x").unwrap()).await;
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(ErrorKind::Unsupported)
    );

    let waiter = client(&tables, true, Duration::from_millis(50)).await;
    let name = name("off");
    let companion = waiter.signal_name(&LockName::new(&name).unwrap()).unwrap();
    let held = quiet.lock_with(&name, &long_lease()).await.unwrap();
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "granted while held");
    assert!(
        is_free(&mut raw, &companion).await,
        "nobody keeps the channel"
    );
    assert!(held.release().await.unwrap());
    let got = tokio::time::timeout(WOKEN_WITHIN, task)
        .await
        .expect("found free by polling")
        .unwrap()
        .unwrap();
    assert!(got.release().await.unwrap());
    tables.drop_all().await;
}

/// Tasks sharing one client hand the lock over through the client (its release wakes its own
/// waiter) and never wait on the server for a lock their own client holds: no wait session is
/// opened, so none is cut short and reopened at each hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_client_hand_over_without_waiting_on_the_server() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("signals_local");
    let lock = client(&tables, true, SLOW).await;
    let name = name("local");
    for _ in 0..5 {
        let held = lock.lock_with(&name, &long_lease()).await.unwrap();
        let task = {
            let (lock, name) = (lock.clone(), name.clone());
            tokio::spawn(async move { lock.lock(&name, Duration::from_secs(60)).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!task.is_finished(), "granted while held");
        assert!(held.release().await.unwrap());
        let got = tokio::time::timeout(WOKEN_WITHIN, task)
            .await
            .expect("handed over through the client")
            .unwrap()
            .unwrap();
        assert!(got.release().await.unwrap());
    }
    assert_eq!(
        lock.wait_sessions(),
        0,
        "waited on the server for its own lock"
    );
    tables.drop_all().await;
}

/// A guard dropped on a plain thread (no runtime there) still releases through its client's
/// runtime, and that release signals a waiter of another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_on_a_plain_thread_signals_a_waiter_of_another_client() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("signals_thread");
    let mut raw = tables.raw().await;
    let holder = client(&tables, true, Duration::from_millis(2)).await;
    let waiter = client(&tables, true, SLOW).await;
    let name = name("thread");
    let companion = holder.signal_name(&LockName::new(&name).unwrap()).unwrap();
    let held = holder.lock_with(&name, &long_lease()).await.unwrap();
    companion_becomes(&mut raw, &companion, false).await;
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "granted while held");
    std::thread::spawn(move || drop(held)).join().unwrap();
    let got = tokio::time::timeout(WOKEN_WITHIN, task)
        .await
        .expect("the drop's release signals the waiter")
        .unwrap()
        .unwrap();
    assert!(got.release().await.unwrap());
    companion_becomes(&mut raw, &companion, true).await;
    tables.drop_all().await;
}
