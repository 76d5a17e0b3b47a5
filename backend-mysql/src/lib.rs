#![doc = include_str!("../docs.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod backend;
mod config;
/// The lock operations' connections: a pool with a spare, lent to one operation at a time.
mod conn {
    pub(crate) type Pool = distlock_sql_conn::Pool<sqlx::MySql>;
    pub(crate) type Lent<'a> = distlock_sql_conn::Lent<'a, sqlx::MySql>;
}
mod error;
mod hint;
mod notices;
mod ops;
mod renewal;
mod schema;
mod sql;
mod sweep;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;

pub use backend::{MysqlLock, CAPABILITIES};
pub use config::{
    MysqlConfig, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FENCING_TABLE, DEFAULT_LOCK_TABLE, DEFAULT_OPERATION_TIMEOUT, DEFAULT_POOL_SIZE,
    DEFAULT_SWEEP_BATCH, DEFAULT_SWEEP_INTERVAL,
};
pub use distlock_api::{
    Capabilities, DistributedLock, Error, ErrorKind, FencingToken, Lease, LockExt, LockGuard,
    LockInfo, LockName, LockOptions, LostReason, OwnerId, Result, SharedLock,
};
/// The driver, re-exported so users can reach the pool without a dependency of their own.
pub use sqlx;

/// The backend's name, as errors and `DISTLOCK_SKIP` show it.
pub const BACKEND: &str = "mysql";

/// The MySQL/MariaDB backend, described once for the facade, the benchmark and the tests.
pub static DESCRIPTOR: distlock_api::BackendDescriptor = distlock_api::BackendDescriptor {
    id: BACKEND,
    label: "MySQL/MariaDB",
    schemes: &["mysql", "mariadb"],
    test_url_var: "DISTLOCK_MYSQL_URL",
    test_url_default: "mysql://distlock:distlock@127.0.0.1:3306/distlock",
    capabilities: CAPABILITIES,
    connect: |url| {
        Box::pin(async move {
            let lock = MysqlLock::connect(MysqlConfig::from_url(&url)?).await?;
            Ok(std::sync::Arc::new(lock) as SharedLock)
        })
    },
};

/// The DDL of the lock table, as `connect` runs it (`{locks}` stands for the table name).
pub const LOCK_TABLE_DDL: &str = include_str!("sql/create_locks.sql");
/// The DDL of the fencing table, as `connect` runs it (`{fencing}` stands for the table name).
pub const FENCING_TABLE_DDL: &str = include_str!("sql/create_fencing.sql");
/// The DDL of the permit table of semaphores, as `connect` runs it (`{permits}` stands for its
/// name: the lock table's with `_permits` appended, see the crate docs).
pub const PERMIT_TABLE_DDL: &str = include_str!("sql/create_permits.sql");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_show_the_capability_checklist() {
        assert!(
            include_str!("../docs.md").contains(&CAPABILITIES.checklist()),
            "docs.md must contain:\n{}",
            CAPABILITIES.checklist()
        );
    }

    #[test]
    fn docs_show_the_ddl() {
        let docs = include_str!("../docs.md");
        for ddl in [LOCK_TABLE_DDL, FENCING_TABLE_DDL, PERMIT_TABLE_DDL] {
            assert!(docs.contains(ddl.trim()), "docs.md must contain:\n{ddl}");
        }
    }
}
