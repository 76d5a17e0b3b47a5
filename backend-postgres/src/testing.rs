//! The test-only admin of the PostgreSQL backend (feature `testing`): statements on the
//! client's own pool and tables.

use std::sync::Arc;

use distlock_api::backend::async_trait;
use distlock_api::backend::testing::Admin;
use distlock_api::{LockName, Result};
use sqlx::AssertSqlSafe;

use crate::error::map_error;
use crate::{PostgresConfig, PostgresLock};

#[async_trait]
impl Admin for PostgresLock {
    /// Deletes the name's row (and a semaphore's permits), as an operator would, and
    /// notifies its channel as a release does (waiters would otherwise wait for the holder's
    /// expiry). Where advisory mode's table exists it deletes the key's row too: the holder
    /// finds it gone at its next probe, gives the key up and reports the lock lost.
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        let (pool, [locks, permits], advisory, channel) = self.admin_parts();
        let mut tables = vec![locks.to_string()];
        if has_table(pool, &advisory).await? {
            tables.push(advisory);
        }
        for table in tables {
            sqlx::query(AssertSqlSafe(format!(
                "WITH p AS (DELETE FROM \"{permits}\" WHERE name = $1), \
                 gone AS (DELETE FROM \"{table}\" WHERE name = $1 RETURNING name) \
                 SELECT pg_notify($2, name) FROM gone"
            )))
            .bind(name.as_str())
            .bind(channel)
            .execute(pool)
            .await
            .map_err(|e| map_error(e, "deleting the lock row"))?;
        }
        Ok(())
    }

    /// Rows of names starting with `prefix` that a sweep leaves: a row is removed by its
    /// release, or by the sweeper once expired (or once its session is gone), so this sweeps
    /// first (as the background sweeper would, whenever it next runs).
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        self.sweep_now().await?;
        let (pool, [locks, permits], advisory, _) = self.admin_parts();
        let mut tables = vec![
            ("lock row", locks.to_string()),
            ("permit row", permits.to_string()),
        ];
        if has_table(pool, &advisory).await? {
            tables.push(("advisory row", advisory));
        }
        let mut found = Vec::new();
        for (what, table) in tables {
            let names: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT name FROM \"{table}\" WHERE starts_with(name, $1) ORDER BY name"
            )))
            .bind(prefix)
            .fetch_all(pool)
            .await
            .map_err(|e| map_error(e, "listing rows"))?;
            found.extend(names.into_iter().map(|n| format!("{what} {n:?}")));
        }
        Ok(found)
    }
}

async fn has_table(pool: &sqlx::PgPool, table: &str) -> Result<bool> {
    sqlx::query_scalar("SELECT to_regclass(quote_ident($1)) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await
        .map_err(|e| map_error(e, "looking for a table"))
}

/// The admin of the server at `url` (a [`PostgresLock`] client of it).
pub async fn admin(url: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(
        PostgresLock::connect(PostgresConfig::from_url(&url)?).await?,
    ))
}
