//! Semaphore permits on this backend's own tables: what the conformance suite cannot see from
//! outside. A permit attempt that is refused or finds the semaphore full, and a lock request
//! refused on a semaphore's name, roll their transaction back with the name's counter (no token
//! is burned); the name's marker row in the lock table appears with the first permit, follows
//! the latest expiry of the live permits and goes with the last one; the sweeper deletes
//! expired permit rows and only those; a force-release frees one permit; the permit table is
//! named after the lock table.
//!
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`); skipped
//! when `DISTLOCK_SKIP` names `mysql`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{with_tables, PrivateTables};
use distlock_mysql::sqlx::{self, AssertSqlSafe};
use distlock_mysql::{ErrorKind, LockExt, LockOptions, MysqlLock};

/// A lease far longer than the test: only releases free a name.
fn long_lease() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(120))
}

async fn client(t: &PrivateTables) -> Arc<MysqlLock> {
    let config = t.config().sweep_interval(None);
    Arc::new(MysqlLock::connect(config).await.unwrap_or_else(|e| {
        panic!("{e}\n  start MariaDB with `scripts/services up` or skip with DISTLOCK_SKIP=mysql")
    }))
}

/// The lock-table row of `name`: owner, hold count and the lease left (ms), expired or not.
async fn lock_row(t: &PrivateTables, name: &str) -> Option<(String, u32, i64)> {
    let mut conn = t.raw().await;
    let row: Option<(Vec<u8>, u32, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT owner, hold_count, \
         TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000 \
         FROM `{}` WHERE name = ?",
        t.locks
    )))
    .bind(name.as_bytes())
    .fetch_optional(&mut conn)
    .await
    .unwrap();
    row.map(|(o, h, ms)| (String::from_utf8(o).unwrap(), h, ms))
}

async fn permit_rows(t: &PrivateTables) -> i64 {
    let mut conn = t.raw().await;
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{}_permits`",
        t.locks
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_full_semaphores_issue_no_token() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("ptok")), |t| async move {
        let (a, b) = (client(&t).await, client(&t).await);
        let opts = long_lease();
        let first = a.try_permit("sem", 2, &opts).await.unwrap().expect("free");
        let second = b
            .try_permit("sem", 2, &opts)
            .await
            .unwrap()
            .expect("one left");
        assert_eq!(second.token().0, first.token().0 + 1);
        let counter = t.fencing_value("sem").await;
        assert_eq!(counter, second.token().0);
        assert!(
            b.try_permit("sem", 2, &opts).await.unwrap().is_none(),
            "full"
        );
        for _ in 0..2 {
            let e = b.try_lock_with("sem", &opts).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains("2 permit(s)"), "{e}");
            // Waiting does not help: the refusal comes at once.
            let waiting = opts.clone().wait(Duration::from_secs(5));
            let e = b.lock_with("sem", &waiting).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        }
        let e = b.try_permit("sem", 3, &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert_eq!(t.fencing_value("sem").await, counter, "a token was burned");

        // A locked name refuses permits, and issues none either.
        let lock = a
            .try_lock_with("locked", &opts)
            .await
            .unwrap()
            .expect("free");
        for _ in 0..2 {
            let e = b.try_permit("locked", 2, &opts).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains("1 permit(s)"), "{e}");
        }
        assert_eq!(t.fencing_value("locked").await, lock.token().0);
        assert!(lock.release().await.unwrap());

        // Freed, the name takes the lock again, with the counter's next token.
        assert!(first.release().await.unwrap());
        assert!(second.release().await.unwrap());
        let g = b.try_lock_with("sem", &opts).await.unwrap().expect("free");
        assert_eq!(g.token().0, counter + 1);
        assert!(g.release().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_marker_follows_the_latest_live_permit_and_goes_with_the_last() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("pmark")), |t| async move {
        let a = client(&t).await;
        assert!(lock_row(&t, "sem").await.is_none());
        let long = a
            .try_permit("sem", 3, &long_lease())
            .await
            .unwrap()
            .unwrap();
        let (owner, max, left) = lock_row(&t, "sem").await.expect("the marker");
        assert_eq!((owner.as_str(), max), ("#semaphore", 3));
        assert!(left > 110_000, "the long permit's lease: {left} ms");

        let ten = LockOptions::new().ttl(Duration::from_secs(10));
        let short = a.try_permit("sem", 3, &ten).await.unwrap().unwrap();
        let (_, _, left) = lock_row(&t, "sem").await.unwrap();
        assert!(
            left > 110_000,
            "never lowered by a shorter grant: {left} ms"
        );

        // The long permit goes: the marker comes down to the short one's expiry.
        assert!(long.release().await.unwrap());
        let (owner, max, left) = lock_row(&t, "sem").await.unwrap();
        assert_eq!((owner.as_str(), max), ("#semaphore", 3));
        assert!((5_000..=10_000).contains(&left), "lowered: {left} ms");

        // A renewal raises it with the permit; a re-entry too.
        short.extend(Duration::from_secs(60)).await.unwrap();
        let (_, _, left) = lock_row(&t, "sem").await.unwrap();
        assert!(left > 55_000, "raised by the renewal: {left} ms");
        let inner = short.reenter().await.unwrap();
        assert_eq!(inner.hold_count(), 2);
        assert!(inner.release().await.unwrap());
        assert!(lock_row(&t, "sem").await.is_some(), "one hold is left");

        // The last permit goes: so does the marker, and the permit rows.
        assert!(short.release().await.unwrap());
        assert!(lock_row(&t, "sem").await.is_none(), "the marker went");
        assert_eq!(permit_rows(&t).await, 0);
        assert!(a.holder("sem").await.unwrap().is_none());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_semaphore_frees_the_lock_with_its_last_lease() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("pdead")), |t| async move {
        let (a, b) = (client(&t).await, client(&t).await);
        let short = LockOptions::new().ttl(Duration::from_millis(300));
        let dead = [
            a.try_permit("sem", 2, &short).await.unwrap().unwrap(),
            a.try_permit("sem", 2, &short).await.unwrap().unwrap(),
        ];
        let last = dead[1].token();
        // Holders that stop without releasing.
        std::mem::forget(dead);
        let e = b.try_lock_with("sem", &long_lease()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        // No sweep ran: the expired marker is taken over as any expired row is.
        assert!(a.holder("sem").await.unwrap().is_none());
        let g = b
            .try_lock_with("sem", &long_lease())
            .await
            .unwrap()
            .expect("the permits' leases ended");
        assert!(g.token() > last);
        let (owner, holds, _) = lock_row(&t, "sem").await.unwrap();
        assert_eq!((owner, holds), (g.owner().to_string(), 1));
        // The expired permit rows do not count: a permit of the locked name is refused.
        let e = a.try_permit("sem", 2, &long_lease()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(g.release().await.unwrap());
        assert_eq!(a.sweep_now().await.unwrap(), 2, "the two expired permits");
        assert_eq!(permit_rows(&t).await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_deletes_expired_permits_and_a_force_release_frees_one() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("psweep")), |t| async move {
        let a = client(&t).await;
        let long = long_lease();
        let live = a.try_permit("sem", 3, &long).await.unwrap().expect("free");
        let short = LockOptions::new().ttl(Duration::from_millis(50));
        let dead = a
            .try_permit("sem", 3, &short)
            .await
            .unwrap()
            .expect("one left");
        // A holder that stops without releasing.
        std::mem::forget(dead);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(a.sweep_now().await.unwrap(), 1, "the expired permit, only");
        let info = a.holder("sem").await.unwrap().expect("held");
        assert_eq!((info.permits, info.token), ((1, 3), live.token()));
        assert_eq!(info.owner, *live.owner());

        let other = a.try_permit("sem", 3, &long).await.unwrap().expect("free");
        assert!(a.force_release("sem", other.token()).await.unwrap());
        assert!(!a.force_release("sem", other.token()).await.unwrap());
        let info = a.holder("sem").await.unwrap().expect("held");
        assert_eq!((info.permits, info.token), ((1, 3), live.token()));
        let listed = a.list("se").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].0.as_str(), listed[0].1.permits), ("sem", (1, 3)));
        assert!(!other.release().await.unwrap(), "force-released");
        assert!(lock_row(&t, "sem").await.is_some(), "a live permit is left");
        // The last live permit force-released: the marker goes with it.
        assert!(a.force_release("sem", live.token()).await.unwrap());
        assert!(lock_row(&t, "sem").await.is_none());
        assert!(!live.release().await.unwrap());
        assert!(a.holder("sem").await.unwrap().is_none());
        assert!(a.list("se").await.unwrap().is_empty());

        // Every permit row went with its permit: the table is named after the lock table.
        assert_eq!(permit_rows(&t).await, 0);
    })
    .await;
}
