//! The test-only admin of the MySQL/MariaDB backend (feature `testing`): statements on the
//! client's own pool and lock table.

use std::sync::Arc;

use distlock_api::backend::async_trait;
use distlock_api::backend::testing::Admin;
use distlock_api::{LockName, Result};
use sqlx::AssertSqlSafe;

use crate::error::map_error;
use crate::{MysqlConfig, MysqlLock};

#[async_trait]
impl Admin for MysqlLock {
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        let (pool, table) = self.admin_parts();
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM `{table}` WHERE name = ?"
        )))
        .bind(name.as_str().as_bytes())
        .execute(pool)
        .await
        .map_err(|e| map_error(e, "deleting the lock row"))?;
        Ok(())
    }

    /// Rows of names starting with `prefix`, expired or not: a row is removed by its release,
    /// or by the sweeper once expired.
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let (pool, table) = self.admin_parts();
        let names: Vec<Vec<u8>> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT name FROM `{table}` WHERE LEFT(name, ?) = ?"
        )))
        .bind(prefix.len() as u64)
        .bind(prefix.as_bytes())
        .fetch_all(pool)
        .await
        .map_err(|e| map_error(e, "listing lock rows"))?;
        Ok(names
            .into_iter()
            .map(|n| format!("lock row {:?}", String::from_utf8_lossy(&n)))
            .collect())
    }
}

/// The admin of the server at `url` (a [`MysqlLock`] client of it).
pub async fn admin(url: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(
        MysqlLock::connect(MysqlConfig::from_url(&url)?).await?,
    ))
}
