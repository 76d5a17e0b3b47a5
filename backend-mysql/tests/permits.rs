//! Semaphore permits on this backend's own tables: what the conformance suite cannot see from
//! outside. A permit attempt that is refused or finds the semaphore full, and a lock request
//! refused on a semaphore's name, roll their transaction back with the name's counter (no token
//! is burned); the sweeper deletes expired permit rows and only those; a force-release frees
//! one permit; the permit table is named after the lock table.
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
        let e = b.try_permit("locked", 2, &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
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

        let other = a.try_permit("sem", 3, &long).await.unwrap().expect("free");
        assert!(a.force_release("sem", other.token()).await.unwrap());
        assert!(!a.force_release("sem", other.token()).await.unwrap());
        let info = a.holder("sem").await.unwrap().expect("held");
        assert_eq!((info.permits, info.token), ((1, 3), live.token()));
        assert!(!other.release().await.unwrap(), "force-released");
        assert!(live.release().await.unwrap());
        assert!(a.holder("sem").await.unwrap().is_none());

        // Every permit row went with its permit: the table is named after the lock table.
        let mut conn = t.raw().await;
        let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM `{}_permits`",
            t.locks
        )))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(left, 0);
    })
    .await;
}
