//! Contention against a real server: every transition is one conditional statement or one
//! transaction, so racing clients can never hold a lock together, tokens follow the order of the
//! grants, a failed attempt issues no token, and reentrant holds count exactly.
//!
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`); skipped
//! when `DISTLOCK_SKIP` names `mysql`.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Audit, PrivateTables};
use distlock_mysql::{LockExt, LockOptions, MysqlLock, OwnerId};

async fn client(tables: &PrivateTables) -> Arc<MysqlLock> {
    Arc::new(
        MysqlLock::connect(tables.config())
            .await
            .unwrap_or_else(|e| {
                panic!("{e}\n  start MariaDB with `scripts/services up` or skip with DISTLOCK_SKIP=mysql")
            }),
    )
}

/// One grant as a contender saw it: when its answer arrived and until when it could act.
#[derive(Clone, Copy, Debug)]
struct Held {
    token: u64,
    granted_at: Instant,
    /// The earlier of its safe-until and the moment it sent its release.
    until: Instant,
}

/// Eight clients fight over one name with 40 ms fixed leases for a few seconds: fresh inserts,
/// takeovers of expired rows and releases all race. No two holders' times overlap, tokens follow
/// the order of the grants, and the fencing counter moved exactly once per grant (a failed
/// attempt rolled its bump back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_storm_never_overlaps_and_burns_no_token() {
    if common::skipped() {
        return;
    }
    common::with_tables(Arc::new(PrivateTables::new("storm")), storm).await;
}

async fn storm(tables: Arc<PrivateTables>) {
    const CLIENTS: usize = 8;
    let ttl = Duration::from_millis(40);
    let name = "storm".to_string();
    let first = client(&tables).await; // creates the tables
    let audited = tables.install_audit(&[Audit::LiveTakeovers]).await;
    let log = Arc::new(Mutex::new(Vec::<Held>::new()));
    let stop_at = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let c = client(&tables).await;
        let (name, log) = (name.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let mut round = i;
            while Instant::now() < stop_at {
                round += 1;
                // A new owner each time: a forgotten grant of this client may still be live,
                // and the same owner would (rightly) join it.
                let options = LockOptions::new().ttl(ttl).owner(OwnerId::random());
                let g = c.try_lock_with(&name, &options).await.expect("try_lock");
                let Some(g) = g else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                };
                let granted_at = Instant::now();
                let token = g.token().0;
                assert_eq!(g.hold_count(), 1, "a fresh owner joined someone's grant");
                let safe = g.safe_until().expect("leased");
                // Half the holders release in time; the others let the lease run out, so the
                // next grant is a takeover of an expired row.
                let until = if round % 2 == 0 {
                    let sent = Instant::now().min(safe);
                    g.release().await.expect("release");
                    sent
                } else {
                    tokio::time::sleep_until((safe + Duration::from_millis(1)).into()).await;
                    // A crashed holder: no release, the row stays until taken over or swept.
                    std::mem::forget(g);
                    safe
                };
                log.lock().unwrap().push(Held {
                    token,
                    granted_at,
                    until,
                });
            }
        }));
    }
    for t in tasks {
        t.await.expect("contender panicked");
    }
    let mut log = log.lock().unwrap().clone();
    assert!(
        log.len() >= 10,
        "only {} grants in 3 s: the storm did not happen",
        log.len()
    );
    log.sort_by_key(|h| h.token);
    for w in log.windows(2) {
        assert!(w[0].token < w[1].token, "token {} issued twice", w[0].token);
        assert!(
            w[1].granted_at >= w[0].until,
            "double holder: token {} granted {:?} before token {} stopped",
            w[1].token,
            w[0].until - w[1].granted_at,
            w[0].token
        );
    }
    let after = tables.fencing_value(&name).await;
    assert_eq!(
        after,
        log.len() as u64,
        "the fencing counter moved {after} times for {} grants: a failed attempt burned a token",
        log.len()
    );
    if audited {
        let bad = tables.audit_records().await;
        assert!(bad.is_empty(), "the server audit saw: {bad:?}");
    }
    eprintln!(
        "{} grants in 3 s, tokens 1..={after}, server audit: {}",
        log.len(),
        if audited { "on" } else { "NOT AVAILABLE" }
    );
    // The last holder may have let its lease lapse: take the row over and release it.
    let g = first
        .lock(&name, Duration::from_secs(5))
        .await
        .expect("final");
    assert_eq!(g.token().0, after + 1);
    assert!(g.release().await.expect("release"));
}

/// Several tasks of one owner take and give back holds of one name while another owner keeps
/// trying: the hold count never loses or gains a hold (every release finds its hold), the other
/// owner never gets in while a hold is out, and the lock ends free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_holds_race_releases_without_losing_count() {
    if common::skipped() {
        return;
    }
    common::with_tables(Arc::new(PrivateTables::new("reent")), reentrant).await;
}

async fn reentrant(tables: Arc<PrivateTables>) {
    const SAME_OWNER: usize = 6;
    let name = "reentrant".to_string();
    let owner = OwnerId::new(format!("shared-{}", std::process::id())).unwrap();
    let first = client(&tables).await; // creates the tables
    let audited = tables.install_audit(&[Audit::LiveTakeovers]).await;
    let owner_inside = Arc::new(AtomicI64::new(0));
    let other_inside = Arc::new(AtomicI64::new(0));
    let fresh = Arc::new(AtomicI64::new(0));
    let stop_at = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for _ in 0..SAME_OWNER {
        let c = client(&tables).await;
        let (name, owner) = (name.clone(), owner.clone());
        let (owner_inside, other_inside, fresh) =
            (owner_inside.clone(), other_inside.clone(), fresh.clone());
        tasks.push(tokio::spawn(async move {
            let options = LockOptions::new()
                .owner(owner)
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(30));
            let mut holds = 0;
            while Instant::now() < stop_at {
                let g = c.lock_with(&name, &options).await.expect("lock");
                owner_inside.fetch_add(1, Ordering::SeqCst);
                assert_eq!(other_inside.load(Ordering::SeqCst), 0, "two owners inside");
                if g.hold_count() == 1 {
                    fresh.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                owner_inside.fetch_sub(1, Ordering::SeqCst);
                assert!(g.release().await.expect("release"), "a hold went missing");
                holds += 1;
            }
            holds
        }));
    }
    let other = {
        let c = client(&tables).await;
        let name = name.clone();
        let (owner_inside, other_inside, fresh) =
            (owner_inside.clone(), other_inside.clone(), fresh.clone());
        tokio::spawn(async move {
            let mut wins = 0;
            while Instant::now() < stop_at {
                let options = LockOptions::new().ttl(Duration::from_secs(30));
                if let Some(g) = c.try_lock_with(&name, &options).await.expect("try_lock") {
                    other_inside.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(owner_inside.load(Ordering::SeqCst), 0, "two owners inside");
                    fresh.fetch_add(1, Ordering::SeqCst);
                    wins += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    other_inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(g.release().await.expect("release"));
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            wins
        })
    };
    let mut holds = 0;
    for t in tasks {
        holds += t.await.expect("holder panicked");
    }
    let wins = other.await.expect("other owner panicked");
    eprintln!("{holds} holds by one owner, {wins} grants to the other");
    assert!(holds >= 20, "only {holds} holds: no contention happened");
    assert!(
        first.holder(&name).await.expect("holder").is_none(),
        "a hold was left behind"
    );
    assert_eq!(
        tables.fencing_value(&name).await,
        fresh.load(Ordering::SeqCst) as u64,
        "tokens issued != fresh grants (joins must not issue tokens)"
    );
    if audited {
        let bad = tables.audit_records().await;
        assert!(bad.is_empty(), "the server audit saw: {bad:?}");
    }
}

/// A release through a client handle wakes that handle's own waiters for the name at once. With
/// a 60 s backoff, a waiter that had to sit out its step would look again only after 5 s (the
/// longest a waiter sleeps between attempts); woken by the release 0.3 s in, it has the lock
/// long before that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_same_handles_polling_waiter_without_waiting_out_its_backoff() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("localwake");
    let config = tables
        .config()
        .backoff(Duration::from_secs(60), Duration::from_secs(60));
    let locks = Arc::new(MysqlLock::connect(config).await.expect("connect"));
    let held = locks.try_lock("wake").await.unwrap().expect("free");
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let guard = locks
                .lock("wake", Duration::from_secs(30))
                .await
                .expect("granted within the wait bound");
            (started.elapsed(), guard)
        })
    };
    // Let the waiter make its first attempt and start its (60 s) backoff step.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(held.release().await.unwrap());
    let (waited, guard) = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(3),
        "the waiter sat out its backoff: granted after {waited:?}"
    );
    assert!(guard.release().await.unwrap());
    drop(locks);
    tables.drop_all().await;
}

/// The same wake-up when the holder's guard is dropped on a plain thread (no runtime there):
/// the drop hands the release to the client's runtime, which wakes the waiter as an explicit
/// release does, long before the 5 s a waiter sleeps between attempts at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_on_a_plain_thread_wakes_the_same_handles_polling_waiter() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("dropwake");
    let config = tables
        .config()
        .backoff(Duration::from_secs(60), Duration::from_secs(60));
    let locks = Arc::new(MysqlLock::connect(config).await.expect("connect"));
    let held = locks.try_lock("wake").await.unwrap().expect("free");
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let guard = locks
                .lock("wake", Duration::from_secs(30))
                .await
                .expect("granted within the wait bound");
            (started.elapsed(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::thread::spawn(move || drop(held))
        .join()
        .expect("the plain thread");
    let (waited, guard) = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(3),
        "the waiter sat out its backoff: granted after {waited:?}"
    );
    assert!(guard.release().await.unwrap());
    drop(locks);
    tables.drop_all().await;
}
