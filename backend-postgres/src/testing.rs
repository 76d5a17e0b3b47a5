//! The test-only admin of the PostgreSQL backend (feature `testing`): statements on the
//! client's own pool and lock table.

use std::sync::Arc;

use distlock_api::backend::async_trait;
use distlock_api::backend::testing::Admin;
use distlock_api::{LockName, Result};
use sqlx::AssertSqlSafe;

use crate::error::map_error;
use crate::{PostgresConfig, PostgresLock};

#[async_trait]
impl Admin for PostgresLock {
    /// Deletes the name's row, as an operator would, and notifies its channel as a release
    /// does (waiters would otherwise wait for the holder's expiry).
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        let (pool, locks, channel) = self.admin_parts();
        sqlx::query(AssertSqlSafe(format!(
            "WITH gone AS (DELETE FROM \"{locks}\" WHERE name = $1 RETURNING name) \
             SELECT pg_notify($2, name) FROM gone"
        )))
        .bind(name.as_str())
        .bind(channel)
        .execute(pool)
        .await
        .map_err(|e| map_error(e, "deleting the lock row"))?;
        Ok(())
    }

    /// Lock rows of names starting with `prefix`, expired or not: a row is removed by its
    /// release, or by the sweeper once expired.
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let (pool, locks, _) = self.admin_parts();
        let names: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT name FROM \"{locks}\" WHERE starts_with(name, $1) ORDER BY name"
        )))
        .bind(prefix)
        .fetch_all(pool)
        .await
        .map_err(|e| map_error(e, "listing lock rows"))?;
        Ok(names
            .into_iter()
            .map(|n| format!("lock row {n:?}"))
            .collect())
    }
}

/// The admin of the server at `url` (a [`PostgresLock`] client of it).
pub async fn admin(url: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(
        PostgresLock::connect(PostgresConfig::from_url(&url)?).await?,
    ))
}
