//! The test-only admin of the MySQL/MariaDB backend (feature `testing`): statements on the
//! client's own pool, lock table and permit table.

use std::sync::Arc;

use distlock_api::backend::async_trait;
use distlock_api::backend::testing::Admin;
use distlock_api::{LockName, Result};
use sqlx::AssertSqlSafe;

use crate::error::map_error;
use crate::{MysqlConfig, MysqlLock};

#[async_trait]
impl Admin for MysqlLock {
    /// Deletes the name's lock-table row (a lock, or a semaphore's marker) and its permits.
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        let (pool, tables) = self.admin_parts();
        for table in tables {
            sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM `{table}` WHERE name = ?"
            )))
            .bind(name.as_str().as_bytes())
            .execute(pool)
            .await
            .map_err(|e| map_error(e, "deleting the lock row"))?;
        }
        Ok(())
    }

    /// Lock-table rows and permit rows of names starting with `prefix` that a sweep leaves: a
    /// row is removed by its release, or by the sweeper once expired, so this sweeps first (as
    /// the background sweeper would, whenever it next runs). An expired row is no leak: a
    /// semaphore's marker, for one, outlives a last permit that expired instead of being
    /// released until the next grant of its name or the next sweep.
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        self.sweep_now().await?;
        let (pool, [locks, permits]) = self.admin_parts();
        let mut left = Vec::new();
        for (table, what) in [(locks, "lock row"), (permits, "permit row")] {
            let names: Vec<Vec<u8>> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT name FROM `{table}` WHERE LEFT(name, ?) = ?"
            )))
            .bind(prefix.len() as u64)
            .bind(prefix.as_bytes())
            .fetch_all(pool)
            .await
            .map_err(|e| map_error(e, "listing lock rows"))?;
            left.extend(
                names
                    .into_iter()
                    .map(|n| format!("{what} {:?}", String::from_utf8_lossy(&n))),
            );
        }
        Ok(left)
    }
}

/// The admin of the server at `url` (a [`MysqlLock`] client of it).
pub async fn admin(url: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(
        MysqlLock::connect(MysqlConfig::from_url(&url)?).await?,
    ))
}
