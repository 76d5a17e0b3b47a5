#![doc = include_str!("../docs.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod advisory;
mod backend;
mod config;
mod error;
mod notices;
mod ops;
mod permit;
mod schema;
mod sql;
mod sweep;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;

pub use advisory::advisory_key;
pub use backend::{PostgresLock, ADVISORY_CAPABILITIES, CAPABILITIES};
pub use config::{
    Mode, PostgresConfig, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FENCING_TABLE, DEFAULT_LOCK_TABLE, DEFAULT_OPERATION_TIMEOUT, DEFAULT_POOL_SIZE,
    DEFAULT_SESSION_TIMEOUT, DEFAULT_SWEEP_BATCH, DEFAULT_SWEEP_INTERVAL,
};
pub use distlock_api::{
    Capabilities, DistributedLock, Error, ErrorKind, FencingToken, Lease, LockExt, LockGuard,
    LockInfo, LockName, LockOptions, LostReason, OwnerId, Result, SharedLock,
};
/// The driver, re-exported so users can reach the pool without a dependency of their own.
pub use sqlx;

/// The backend's name, as errors and `DISTLOCK_SKIP` show it.
pub const BACKEND: &str = "postgres";

/// The PostgreSQL backend, described once for the facade, the benchmark and the tests.
pub static DESCRIPTOR: distlock_api::BackendDescriptor = distlock_api::BackendDescriptor {
    id: BACKEND,
    label: "PostgreSQL",
    schemes: &["postgres", "postgresql"],
    test_url_var: "DISTLOCK_POSTGRES_URL",
    test_url_default: "postgres://distlock:distlock@127.0.0.1:5432/distlock",
    capabilities: CAPABILITIES,
    connect: |url| {
        Box::pin(async move {
            let lock = PostgresLock::connect(PostgresConfig::from_url(&url)?).await?;
            Ok(std::sync::Arc::new(lock) as SharedLock)
        })
    },
};

/// The DDL of the lock table, as `connect` runs it (`{locks}` stands for the table name).
pub const LOCK_TABLE_DDL: &str = include_str!("sql/create_locks.sql");
/// The DDL of the fencing table, as `connect` runs it (`{fencing}` stands for the table name).
pub const FENCING_TABLE_DDL: &str = include_str!("sql/create_fencing.sql");
/// The DDL of the permit table, as `connect` runs it (`{permits}` stands for the table name:
/// the lock table's with `_permits`).
pub const PERMIT_TABLE_DDL: &str = include_str!("sql/create_permits.sql");
/// The DDL of advisory mode's key table, as `connect` runs it in that mode (`{advisory}` stands
/// for the table name: the lock table's with `_advisory`).
pub const ADVISORY_TABLE_DDL: &str = include_str!("sql/create_advisory.sql");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_show_the_capability_checklist() {
        for caps in [CAPABILITIES, ADVISORY_CAPABILITIES] {
            assert!(
                include_str!("../docs.md").contains(&caps.checklist()),
                "docs.md must contain:\n{}",
                caps.checklist()
            );
        }
    }

    #[test]
    fn docs_show_the_ddl() {
        let docs = include_str!("../docs.md");
        for ddl in [
            LOCK_TABLE_DDL,
            FENCING_TABLE_DDL,
            PERMIT_TABLE_DDL,
            ADVISORY_TABLE_DDL,
        ] {
            assert!(docs.contains(ddl.trim()), "docs.md must contain:\n{ddl}");
        }
    }
}
