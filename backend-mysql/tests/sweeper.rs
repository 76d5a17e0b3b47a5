//! The expiry sweeper at a high frequency, racing holders that renew at the edge of their
//! lease and contenders that take over expired rows: no two holders overlap, no renewal that
//! completed inside its lease finds its row gone, and no live row is ever deleted.
//!
//! Runs on private tables (created and dropped here). Where the server lets this user create a
//! trigger (MariaDB with the suite's grants; MySQL 8 needs SUPER or
//! `log_bin_trust_function_creators` when the binary log is on), a `BEFORE DELETE` trigger also
//! records every deletion of a row that was live by the deleting statement's own clock: since
//! holders here never release, any such deletion would be the sweeper's bug.
//!
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`); skipped
//! when `DISTLOCK_SKIP` names `mysql`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Audit, PrivateTables, Rng};
use distlock_mysql::{ErrorKind, LockExt, LockOptions, MysqlLock, OwnerId};

const NAMES: usize = 6;
const CONTENDERS_PER_NAME: usize = 2;
const RUN_FOR: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_millis(120);
/// Renewals are sent one measured round trip plus at most this much before the holder's
/// safe-until, so they reach the server within a few milliseconds of the row's expiry and most
/// of them are still answered inside the lease (and so are conclusive).
const EDGE_JITTER: Duration = Duration::from_millis(8);

#[derive(Clone, Copy, Debug)]
struct Held {
    token: u64,
    granted_at: Instant,
    /// The last safe-until this holder had (holders here never release).
    until: Instant,
}

#[derive(Default)]
struct Tally {
    renewals: AtomicU64,
    /// Renewals whose whole round trip finished before the previous safe-until: the row was
    /// certainly live when the server ran them, so they must succeed.
    conclusive: AtomicU64,
    /// Conclusive renewals that found the row gone: a live row deleted or taken over.
    violations: Mutex<Vec<String>>,
    /// Renewals that reached the server after (or too near) the expiry and lost: allowed.
    late_losses: AtomicU64,
    /// Renewals sent within 5 ms of safe-until that succeeded: the edge was exercised.
    tight_successes: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_never_deletes_a_live_row_while_holders_renew_at_the_edge() {
    if common::skipped() {
        return;
    }
    common::with_tables(Arc::new(PrivateTables::new("sweep")), run).await;
}

async fn run(tables: Arc<PrivateTables>) {
    // The first client creates the private tables.
    let sweeper = MysqlLock::connect(
        tables
            .config()
            .sweep_interval(Some(Duration::from_millis(1)))
            .sweep_batch(3),
    )
    .await
    .expect("sweeper client");
    let audited = tables
        .install_audit(&[Audit::LiveDeletes, Audit::LiveTakeovers])
        .await;

    let log = Arc::new(Mutex::new(Vec::<(usize, Held)>::new()));
    let tally = Arc::new(Tally::default());
    let stop_at = Instant::now() + RUN_FOR;
    let mut tasks = Vec::new();
    for n in 0..NAMES {
        for k in 0..CONTENDERS_PER_NAME {
            // Contenders sweep too, so several sweepers race each other as well.
            let client = Arc::new(
                MysqlLock::connect(
                    tables
                        .config()
                        .sweep_interval(Some(Duration::from_millis(2)))
                        .sweep_batch(2),
                )
                .await
                .expect("contender client"),
            );
            let seed = 0x9e37_79b9_7f4a_7c15 ^ ((n * 31 + k) as u64 + 1);
            tasks.push(tokio::spawn(contend(
                client,
                format!("edge-{n}"),
                n,
                Rng(seed),
                stop_at,
                log.clone(),
                tally.clone(),
            )));
        }
    }
    for t in tasks {
        t.await.expect("contender panicked");
    }

    // 1. No renewal that completed inside its lease found its row gone.
    let violations = tally.violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "live rows were deleted or taken over under a holder that renewed in time:\n{}",
        violations.join("\n")
    );
    // 2. No two holders of a name overlapped, and tokens follow grant order.
    let mut log = log.lock().unwrap().clone();
    log.sort_by_key(|(n, h)| (*n, h.token));
    let mut grants = 0;
    for w in log.windows(2) {
        let ((n0, a), (n1, b)) = (w[0], w[1]);
        if n0 != n1 {
            continue;
        }
        grants += 1;
        assert!(
            a.token < b.token,
            "name {n0}: token {} issued twice",
            a.token
        );
        assert!(
            b.granted_at >= a.until,
            "name {n0}: double holder: token {} granted {:?} before token {} ran out",
            b.token,
            a.until - b.granted_at,
            a.token
        );
    }
    // 3. The server never deleted nor took over a row that was live by the statement's clock.
    if audited {
        let bad = tables.audit_records().await;
        assert!(bad.is_empty(), "the server audit saw: {bad:?}");
    }
    let renewals = tally.renewals.load(Ordering::Relaxed);
    let conclusive = tally.conclusive.load(Ordering::Relaxed);
    let tight = tally.tight_successes.load(Ordering::Relaxed);
    let swept = sweeper.rows_swept();
    eprintln!(
        "{} grants, {renewals} renewals ({conclusive} conclusive, {tight} within 5 ms of \
         safe-until, {} lost late), {swept} rows swept by the 1 ms sweeper, audit trigger: {}",
        log.len(),
        tally.late_losses.load(Ordering::Relaxed),
        if audited {
            "on"
        } else {
            "NOT AVAILABLE (see stderr)"
        }
    );
    // The run must have exercised what it claims to.
    assert!(grants >= NAMES, "only {grants} hand-overs: no contention");
    assert!(
        conclusive >= 10,
        "only {conclusive} renewals completed inside their lease: the edge was not exercised"
    );
    assert!(
        swept > 0,
        "the sweeper deleted nothing: expired rows were never left for it"
    );
}

async fn contend(
    client: Arc<MysqlLock>,
    name: String,
    index: usize,
    mut rng: Rng,
    stop_at: Instant,
    log: Arc<Mutex<Vec<(usize, Held)>>>,
    tally: Arc<Tally>,
) {
    // Moving average of this task's renewal round trips.
    let mut rtt = Duration::from_millis(10);
    while Instant::now() < stop_at {
        // A fresh owner per grant, so a contender never joins its own lapsed-but-live grant.
        let options = LockOptions::new()
            .ttl(TTL)
            .owner(OwnerId::random())
            .wait(Duration::from_secs(5));
        let g = match client.lock_with(&name, &options).await {
            Ok(g) => g,
            Err(e) if e.kind() == ErrorKind::Timeout => continue,
            Err(e) => panic!("lock: {e}"),
        };
        let granted_at = Instant::now();
        let token = g.token().0;
        let mut until = g.safe_until().expect("leased");
        // Renew at the edge one to four times, then stop: a crashed holder, whose row a
        // contender takes over or the sweeper deletes.
        for _ in 0..=rng.below(4) {
            let edge =
                rtt.mul_f64(1.2) + Duration::from_micros(rng.below(EDGE_JITTER.as_micros() as u64));
            let at = until.checked_sub(edge).unwrap_or(until);
            tokio::time::sleep_until(at.into()).await;
            let sent = Instant::now();
            if sent >= until {
                break; // overslept: the lease is not ours to renew any more
            }
            tally.renewals.fetch_add(1, Ordering::Relaxed);
            let result = g.extend(TTL).await;
            let answered = Instant::now();
            rtt = (rtt * 3 + (answered - sent)) / 4;
            let inside = answered < until;
            if inside {
                tally.conclusive.fetch_add(1, Ordering::Relaxed);
            }
            match result {
                Ok(()) => {
                    if until.saturating_duration_since(sent) <= Duration::from_millis(5) {
                        tally.tight_successes.fetch_add(1, Ordering::Relaxed);
                    }
                    until = g.safe_until().expect("leased");
                }
                Err(e) if e.kind() == ErrorKind::Lost && inside => {
                    tally.violations.lock().unwrap().push(format!(
                        "{name} token {token}: renewal sent {:?} and answered {:?} before \
                         safe-until found the row gone: {e}",
                        until - sent,
                        until - answered
                    ));
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Lost => {
                    tally.late_losses.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                // A slow or failed round trip: the holder stops acting at its safe-until.
                Err(_) => break,
            }
        }
        log.lock().unwrap().push((
            index,
            Held {
                token,
                granted_at,
                until,
            },
        ));
        // Never released: the lease runs out. Sometimes wait a little before contending again,
        // so the expired row is left for the sweepers rather than taken over at once.
        tokio::time::sleep_until(until.into()).await;
        std::mem::forget(g);
        if rng.below(2) == 0 {
            tokio::time::sleep(Duration::from_millis(5 + rng.below(20))).await;
        }
    }
}
