//! Lock tables made by earlier versions, whose owner column was VARBINARY(64) and which had no
//! `granted_at` column, get the width that tagged owner ids need and the column: on connect, or
//! refused with the statements to run.

use std::sync::Arc;
use std::time::Duration;

use distlock_mysql::sqlx::{self, AssertSqlSafe};
use distlock_mysql::{ErrorKind, LockExt, LockOptions, MysqlLock, OwnerId};

mod common;

use common::{skipped, with_tables, PrivateTables};

async fn owner_width(tables: &PrivateTables) -> i64 {
    let mut conn = tables.raw().await;
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{}' AND COLUMN_NAME = 'owner'",
        tables.locks
    )))
    .fetch_one(&mut conn)
    .await
    .expect("read the owner column's width")
}

async fn has_granted_at(tables: &PrivateTables) -> bool {
    let mut conn = tables.raw().await;
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{}' AND COLUMN_NAME = 'granted_at'",
        tables.locks
    )))
    .fetch_one(&mut conn)
    .await
    .expect("read the lock table's columns");
    n == 1
}

/// Makes the private lock table as distlock did before owner ids had tags and grants a time.
async fn make_old_table(tables: &PrivateTables) {
    let mut conn = tables.raw().await;
    let ddl: String = distlock_mysql::LOCK_TABLE_DDL
        .replace("{locks}", &tables.locks)
        .replace("VARBINARY(81)", "VARBINARY(64)")
        .lines()
        .filter(|line| {
            let line = line.trim_start();
            !line.starts_with("granted_at") && !line.starts_with("value")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let fencing = distlock_mysql::FENCING_TABLE_DDL.replace("{fencing}", &tables.fencing);
    for sql in [ddl, fencing] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("create the old tables");
    }
    assert_eq!(owner_width(tables).await, 64);
    assert!(!has_granted_at(tables).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_lock_table_is_widened_on_connect_and_holds_the_longest_owner() {
    if skipped() {
        return;
    }
    let tables = Arc::new(PrivateTables::new("widen"));
    with_tables(tables, |t| async move {
        make_old_table(&t).await;
        // A row an earlier version wrote, live for a minute: it has no grant time.
        let mut conn = t.raw().await;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO `{}` (name, owner, hold_count, token, expires_at) \
             VALUES ('old', 'earlier', 1, 7, UTC_TIMESTAMP(6) + INTERVAL 60 SECOND)",
            t.locks
        )))
        .execute(&mut conn)
        .await
        .expect("an old row");
        let lock = Arc::new(MysqlLock::connect(t.config()).await.expect("connect"));
        assert_eq!(owner_width(&t).await, 81);
        assert!(has_granted_at(&t).await, "the granted_at column was added");
        let old = lock
            .holder("old")
            .await
            .unwrap()
            .expect("the old row still holds");
        assert_eq!(
            (old.token.0, old.since),
            (7, None),
            "no time for an old row"
        );
        // The longest label, qualified by the handle: more than 64 bytes on the server.
        let label = OwnerId::new("o".repeat(64)).unwrap();
        let opts = LockOptions::new().owner(label).ttl(Duration::from_secs(30));
        let g = lock
            .try_lock_with("wide", &opts)
            .await
            .unwrap()
            .expect("free");
        assert!(g.owner().text().len() > 64);
        let info = lock.holder("wide").await.unwrap().expect("held");
        assert_eq!(&info.owner, g.owner(), "the stored owner was cut short");
        assert!(info.since.is_some(), "a new grant has its time");
        assert!(g.release().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_lock_table_without_create_rights_is_refused_with_the_fix() {
    if skipped() {
        return;
    }
    let tables = Arc::new(PrivateTables::new("narrow"));
    with_tables(tables, |t| async move {
        make_old_table(&t).await;
        let e = MysqlLock::connect(t.config().create_tables(false))
            .await
            .expect_err("connected to a table too narrow for owner ids");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("VARBINARY(81)"), "{e}");
        assert!(e.to_string().contains("ADD COLUMN granted_at"), "{e}");
        assert!(e.to_string().contains("ADD COLUMN value_token"), "{e}");
        assert_eq!(
            owner_width(&t).await,
            64,
            "changed a table it was told not to touch"
        );
        assert!(
            !has_granted_at(&t).await,
            "changed a table it was told not to touch"
        );
    })
    .await;
}
