//! How a client uses its connections, on a private MariaDB server (see
//! `common/private_mariadb.rs`), so that the server's counters count this client alone.
//!
//! Skipped when `DISTLOCK_SKIP` names `mysql`. The shared server is not used.

mod common;
#[path = "common/private_mariadb.rs"]
mod private_mariadb;

use std::sync::Arc;
use std::time::Duration;

use distlock_mysql::sqlx::{self, Connection, MySqlConnection};
use distlock_mysql::{LockExt, MysqlConfig, MysqlLock, SharedLock};
use private_mariadb::PrivateMariadb;

/// The server's count of administrative commands, `COM_PING` among them.
async fn admin_commands(status: &mut MySqlConnection) -> u64 {
    let (_, value): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Com_admin_commands'")
            .fetch_one(status)
            .await
            .expect("reading Com_admin_commands");
    value.parse().expect("Com_admin_commands is a number")
}

/// One lock cycle.
async fn cycle(lock: &SharedLock) {
    let guard = lock
        .lock("reused", Duration::from_secs(5))
        .await
        .expect("lock");
    assert!(guard.release().await.expect("release"));
}

/// sqlx pings every connection that goes back to its pool; a client sets the connection of an
/// operation that ended cleanly aside for its next one instead. So a run of lock cycles on one
/// client sends the server no pings, where sqlx's pool would send two per cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consecutive_lock_operations_reuse_a_connection_without_pinging_it() {
    if common::skipped() {
        return;
    }
    const CYCLES: u64 = 20;
    let server = PrivateMariadb::start().await;
    let config = MysqlConfig::from_url(&server.url()).expect("private server URL");
    let lock: SharedLock = Arc::new(MysqlLock::connect(config).await.expect("connect"));
    let mut status = MySqlConnection::connect(&server.url())
        .await
        .expect("a connection for reading the server's status");

    // The first cycle opens the connections (and lets go of the one used to set up).
    cycle(&lock).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = admin_commands(&mut status).await;
    for _ in 0..CYCLES {
        cycle(&lock).await;
    }
    // A pool's ping runs in a task of its own after the hand-back: let any of them land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pings = admin_commands(&mut status).await - before;
    assert_eq!(
        pings, 0,
        "{CYCLES} lock cycles sent {pings} administrative commands (pings); each operation \
         should take the connection the last one set aside"
    );
}
