//! Leader election on this backend, through the public API: the leader's value lives in its
//! grant's lock-table row with the grant's token (`value`, `value_token`), a proclaim is one
//! `UPDATE` conditional on the grant holding the row live by the server's clock, and inspect
//! shows a value only for the grant that proclaimed it — also when an earlier grant's value
//! lingers in a row taken over or handed over in place. A table made before the two columns
//! is brought up to date on connect.
//!
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`); skipped
//! when `DISTLOCK_SKIP` names `mysql`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{with_tables, PrivateTables};
use distlock_mysql::sqlx::{self, AssertSqlSafe};
use distlock_mysql::{DistributedLock, ErrorKind, LockExt, LockName, LockOptions, MysqlLock};

async fn client(t: &PrivateTables) -> Arc<MysqlLock> {
    let config = t.config().sweep_interval(None);
    Arc::new(MysqlLock::connect(config).await.unwrap_or_else(|e| {
        panic!("{e}\n  start MariaDB with `scripts/services up` or skip with DISTLOCK_SKIP=mysql")
    }))
}

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

/// What the row of `name` keeps, whatever inspect shows: its token, value and value's token.
async fn raw_row(t: &PrivateTables, name: &str) -> Option<(u64, Option<String>, Option<u64>)> {
    let mut conn = t.raw().await;
    let row: Option<(u64, Option<Vec<u8>>, Option<u64>)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT token, value, value_token FROM `{}` WHERE name = ?",
        t.locks
    )))
    .bind(name.as_bytes())
    .fetch_optional(&mut conn)
    .await
    .unwrap();
    row.map(|(tok, v, vt)| (tok, v.map(|v| String::from_utf8(v).unwrap()), vt))
}

/// How many of `value` and `value_token` the lock table has.
async fn value_columns(t: &PrivateTables) -> i64 {
    let mut conn = t.raw().await;
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
         AND TABLE_NAME = '{}' AND COLUMN_NAME IN ('value', 'value_token')",
        t.locks
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_shows_its_value_and_a_second_proclaim_replaces_it() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("el_val")), |t| async move {
        values_and_replacement(&t).await.unwrap();
    })
    .await;
}

async fn values_and_replacement(t: &PrivateTables) -> distlock_api::Result<()> {
    let (a, b) = (client(t).await, client(t).await);
    let opts = LockOptions::new();
    let mut leading = a.election("lead")?.campaign("10.0.0.7:80", &opts).await?;
    let epoch = leading.epoch();
    let seen = b.election("lead")?.leader().await?.expect("led");
    assert_eq!(
        (seen.epoch, seen.value.as_deref(), &seen.owner),
        (epoch, Some("10.0.0.7:80"), leading.guard().owner())
    );
    assert!(seen.since.is_some());
    // Nobody else leads meanwhile.
    assert!(b
        .election("lead")?
        .try_campaign("other", &opts)
        .await?
        .is_none());
    leading.proclaim("10.0.0.7:90").await?;
    // The same value again still counts as proclaimed (found rows, not changed rows).
    leading.proclaim("10.0.0.7:90").await?;
    let seen = b.election("lead")?.leader().await?.expect("led");
    assert_eq!(
        (seen.epoch, seen.value.as_deref()),
        (epoch, Some("10.0.0.7:90"))
    );
    // Any UTF-8 up to the limit, and the empty string, are kept as they are.
    let big = "é".repeat(distlock_api::MAX_VALUE_LEN / 2);
    for v in ["", "ünïcode ✓ 'quoted'", big.as_str()] {
        leading.proclaim(v).await?;
        let seen = a.election("lead")?.leader().await?.expect("led");
        assert_eq!(seen.value.as_deref(), Some(v));
    }
    // One slot per row: the value is in the grant's row, under its token.
    assert_eq!(
        raw_row(t, "lead").await,
        Some((epoch.0, Some(big.clone()), Some(epoch.0)))
    );
    // list shows it too.
    let listed = b.list("lea").await?;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.value.as_deref(), Some(big.as_str()));
    assert!(leading.resign().await?);
    assert!(b.election("lead")?.leader().await?.is_none());
    assert_eq!(raw_row(t, "lead").await, None, "the release took the value");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_leader_cannot_proclaim() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("el_force")), |t| async move {
        let (a, op) = (client(&t).await, client(&t).await);
        let mut leading = a
            .election("forced")
            .unwrap()
            .campaign("mine", &LockOptions::new())
            .await
            .unwrap();
        assert!(op.force_release("forced", leading.epoch()).await.unwrap());
        let e = leading.proclaim("still mine").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
        assert!(op
            .election("forced")
            .unwrap()
            .leader()
            .await
            .unwrap()
            .is_none());
        // Another leader comes; the deposed one's proclaim still changes nothing.
        let other = op
            .election("forced")
            .unwrap()
            .campaign("theirs", &LockOptions::new())
            .await
            .unwrap();
        assert!(other.epoch() > leading.epoch());
        let e = leading.proclaim("still mine").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
        // Straight to the backend too, past the guard's own knowledge.
        assert!(!a.proclaim(leading.guard().grant(), "x").await.unwrap());
        let seen = a
            .election("forced")
            .unwrap()
            .leader()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (seen.epoch, seen.value.as_deref()),
            (other.epoch(), Some("theirs"))
        );
        assert!(other.resign().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_never_shows_the_old_value() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("el_next")), |t| async move {
        let (a, b) = (client(&t).await, client(&t).await);
        let opts = LockOptions::new();
        let first = a
            .election("next")
            .unwrap()
            .campaign("old", &opts)
            .await
            .unwrap();
        let old_epoch = first.epoch();
        assert!(first.resign().await.unwrap());
        // The moment between a new grant and its proclaim: no value.
        let g = b.try_lock_with("next", &opts).await.unwrap().expect("free");
        let info = b.inspect(&name("next")).await.unwrap().expect("held");
        assert_eq!((info.token, info.value), (g.token(), None));
        assert!(g.token() > old_epoch);
        assert!(g.release().await.unwrap());
        let second = b
            .election("next")
            .unwrap()
            .campaign("new", &opts)
            .await
            .unwrap();
        let seen = a.election("next").unwrap().leader().await.unwrap().unwrap();
        assert!(seen.epoch > old_epoch);
        assert_eq!(
            (seen.epoch, seen.value.as_deref()),
            (second.epoch(), Some("new"))
        );
        assert!(second.resign().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_left_in_a_row_handed_over_in_place_is_not_shown() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("el_hand")), |t| async move {
        let c = client(&t).await;
        let opts = LockOptions::new();
        let leading = c
            .election("hand")
            .unwrap()
            .campaign("old", &opts)
            .await
            .unwrap();
        let old_epoch = leading.epoch();
        // A task of the same handle waits for the name: the release hands the row over.
        let waiter = {
            let c = c.clone();
            let opts = LockOptions::new().wait(Duration::from_secs(10));
            tokio::spawn(async move { c.lock_with("hand", &opts).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(leading.resign().await.unwrap());
        let g = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(g.token() > old_epoch);
        let info = c.inspect(&name("hand")).await.unwrap().expect("held");
        assert_eq!((info.token, info.value), (g.token(), None));
        // It was a hand-over in place: the old value is still in the row, under the old token.
        assert_eq!(
            raw_row(&t, "hand").await,
            Some((g.token().0, Some("old".into()), Some(old_epoch.0)))
        );
        assert!(g.release().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_leader_cannot_proclaim_and_its_value_dies_with_the_lease() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("el_exp")), |t| async move {
        let (a, b) = (client(&t).await, client(&t).await);
        let short = LockOptions::new().ttl(Duration::from_millis(300));
        let mut leading = a
            .election("exp")
            .unwrap()
            .campaign("short", &short)
            .await
            .unwrap();
        let old_epoch = leading.epoch();
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Straight to the backend: the server judges the lease over, whatever the guard knows.
        assert!(!a.proclaim(leading.guard().grant(), "late").await.unwrap());
        let e = leading.proclaim("late").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
        assert!(b.election("exp").unwrap().leader().await.unwrap().is_none());
        assert_eq!(
            raw_row(&t, "exp").await,
            Some((old_epoch.0, Some("short".into()), Some(old_epoch.0))),
            "the late proclaim changed the expired row"
        );
        // The expired row is taken over in place: its old value lingers, unseen.
        let g = b
            .try_lock_with("exp", &LockOptions::new())
            .await
            .unwrap()
            .expect("expired");
        let info = b.inspect(&name("exp")).await.unwrap().expect("held");
        assert_eq!((info.token, info.value), (g.token(), None));
        assert_eq!(
            raw_row(&t, "exp").await,
            Some((g.token().0, Some("short".into()), Some(old_epoch.0)))
        );
        assert!(b.proclaim(g.grant(), "fresh").await.unwrap());
        let info = a.inspect(&name("exp")).await.unwrap().expect("held");
        assert_eq!(info.value.as_deref(), Some("fresh"));
        assert!(g.release().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_table_without_the_value_columns_gets_them_on_connect() {
    if common::skipped() {
        return;
    }
    with_tables(Arc::new(PrivateTables::new("el_old")), |t| async move {
        // The lock table as the previous version made it.
        let mut conn = t.raw().await;
        let ddl: String = distlock_mysql::LOCK_TABLE_DDL
            .replace("{locks}", &t.locks)
            .lines()
            .filter(|l| !l.trim_start().starts_with("value"))
            .collect::<Vec<_>>()
            .join("\n");
        sqlx::query(AssertSqlSafe(ddl))
            .execute(&mut conn)
            .await
            .unwrap();
        assert_eq!(value_columns(&t).await, 0);
        // A row an earlier client wrote, live for a minute.
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO `{}` (name, owner, hold_count, token, expires_at, granted_at) \
             VALUES ('held', 'earlier#1', 1, 7, UTC_TIMESTAMP(6) + INTERVAL 60 SECOND, \
             UTC_TIMESTAMP(6))",
            t.locks
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        // Without the right to change it, the connect says what to run.
        let e = MysqlLock::connect(t.config().create_tables(false))
            .await
            .expect_err("connected to a table without the value columns");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let text = e.to_string();
        assert!(text.contains("ADD COLUMN value BLOB NULL"), "{e}");
        assert!(
            text.contains("ADD COLUMN value_token BIGINT UNSIGNED NULL"),
            "{e}"
        );
        assert!(!text.contains("granted_at"), "{e}");
        // With it, clients connecting at once each see the columns missing; one adds each.
        let connects: Vec<_> = (0..4)
            .map(|_| {
                let config = t.config().sweep_interval(None);
                tokio::spawn(MysqlLock::connect(config))
            })
            .collect();
        let mut clients = Vec::new();
        for c in connects {
            clients.push(c.await.unwrap().expect("a concurrent connect"));
        }
        let a = Arc::new(clients.pop().unwrap());
        assert_eq!(value_columns(&t).await, 2, "the columns were added");
        // The old row keeps holding, and elections work.
        let old = a.holder("held").await.unwrap().expect("the old row holds");
        assert_eq!((old.token.0, old.value), (7, None));
        let mut leading = a
            .election("elect")
            .unwrap()
            .campaign("v1", &LockOptions::new())
            .await
            .unwrap();
        leading.proclaim("v2").await.unwrap();
        let seen = a
            .election("elect")
            .unwrap()
            .leader()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (seen.epoch, seen.value.as_deref()),
            (leading.epoch(), Some("v2"))
        );
        assert!(leading.resign().await.unwrap());
        // A second connect finds nothing to change.
        MysqlLock::connect(t.config().create_tables(false))
            .await
            .expect("the table is up to date");
    })
    .await;
}
