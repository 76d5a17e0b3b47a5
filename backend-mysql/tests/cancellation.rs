//! Acquires dropped at random points — before, inside and after their transaction — leave no
//! transaction open and no row held without a guard.
//!
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`); skipped
//! when `DISTLOCK_SKIP` names `mysql`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{PrivateTables, Rng};
use distlock_mysql::sqlx::{self, AssertSqlSafe};
use distlock_mysql::{LockExt, MysqlLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_no_transaction_and_no_row() {
    if common::skipped() {
        return;
    }
    common::with_tables(Arc::new(PrivateTables::new("cancel")), run).await;
}

async fn run(tables: Arc<PrivateTables>) {
    let client = Arc::new(
        MysqlLock::connect(tables.config().sweep_interval(None))
            .await
            .expect("client"),
    );
    let mut rng = Rng(common::seed() | 1);
    let names = ["free", "held"];
    // "held" has a holder (another owner) for the first half, so its waiters are dropped while
    // polling; in the second half they race its release and each other.
    let other = Arc::new(MysqlLock::connect(tables.config()).await.expect("client"));
    let mut holder = Some(other.try_lock("held").await.expect("lock").expect("free"));
    for round in 0..80u64 {
        let name = names[(round % 2) as usize];
        let c = client.clone();
        let task = tokio::spawn(async move {
            if round % 4 < 2 {
                c.lock(name, Duration::from_secs(30)).await.map(drop)
            } else {
                c.try_lock(name).await.map(drop)
            }
        });
        // Anywhere from before the first statement to after the commit.
        tokio::time::sleep(Duration::from_micros(rng.below(6_000))).await;
        task.abort();
        let _ = task.await;
        if round == 40 {
            if let Some(g) = holder.take() {
                assert!(
                    g.release().await.expect("release"),
                    "the holder lost its lock"
                );
            }
        }
    }

    // Grants that raced their cancellation are released in the background: give them a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = tables.raw().await;
    loop {
        let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM `{}`",
            tables.locks
        )))
        .fetch_one(&mut conn)
        .await
        .expect("count rows");
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} rows still held 10 s after their acquires were dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // No transaction of ours is still open: one would hold the fencing or lock row lock, and
    // these locking reads would wait for it until the (1 s) lock wait timeout.
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
        .execute(&mut conn)
        .await
        .expect("set lock wait timeout");
    for name in names {
        for table in [&tables.fencing, &tables.locks] {
            let mut tx = sqlx::Connection::begin(&mut conn).await.expect("begin");
            sqlx::query(AssertSqlSafe(format!(
                "SELECT name FROM `{table}` WHERE name = ? FOR UPDATE"
            )))
            .bind(name.as_bytes())
            .fetch_optional(&mut *tx)
            .await
            .unwrap_or_else(|e| {
                panic!("a dropped acquire left a transaction holding {table}/{name}: {e}")
            });
            tx.rollback().await.expect("rollback");
        }
    }
    // And the names work at once.
    for name in names {
        let g = client
            .try_lock(name)
            .await
            .expect("try_lock")
            .unwrap_or_else(|| panic!("{name} is held by nobody's guard"));
        assert!(g.release().await.expect("release"));
    }
}
