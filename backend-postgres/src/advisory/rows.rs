//! The statements of advisory mode that read or change the key table from the client's
//! pools (not its session): inspect, list, proclaim, force-release, sweep.

use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockInfo, LockName, OwnerId, Result};
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::session::query;
use super::{advisory_key, Advisory};
use crate::error::map_error;
use crate::ops::Pool;
use crate::BACKEND;

impl Advisory {
    pub(crate) async fn inspect(&self, pool: &Pool, name: &LockName) -> Result<Option<LockInfo>> {
        let what = format!("reading the advisory row on {}", self.shared.endpoint);
        let row = self
            .shared
            .with_timeout(
                &what,
                query(&self.shared.sql.inspect)
                    .bind(advisory_key(name.as_str()))
                    .bind(name.as_str())
                    .fetch_optional(pool),
            )
            .await
            .map_err(|e| e.with_lock(name))?;
        row.map(|row| info_of(&row, name)).transpose()
    }

    pub(crate) async fn list(
        &self,
        pool: &Pool,
        prefix: &str,
    ) -> Result<Vec<(LockName, LockInfo)>> {
        let what = format!("listing the advisory rows on {}", self.shared.endpoint);
        let rows = self
            .shared
            .with_timeout(
                &what,
                query(&self.shared.sql.list).bind(prefix).fetch_all(pool),
            )
            .await?;
        let mut held = Vec::with_capacity(rows.len());
        for row in rows {
            let name: String = row.try_get(0).map_err(|e| map_error(e, &what))?;
            let Ok(name) = LockName::new(name) else {
                continue;
            };
            let info = info_of(&row, &name)?;
            held.push((name, info));
        }
        Ok(held)
    }

    pub(crate) async fn proclaim(&self, pool: &Pool, g: &Grant, value: &str) -> Result<bool> {
        let what = format!("proclaiming on {}", self.shared.endpoint);
        let n: i64 = self
            .shared
            .with_timeout(
                &what,
                sqlx::query_scalar(sqlx::AssertSqlSafe(self.shared.sql.proclaim.as_str()))
                    .bind(advisory_key(g.name.as_str()))
                    .bind(g.name.as_str())
                    .bind(g.token.0 as i64)
                    .bind(value)
                    .bind(&self.shared.channel)
                    .fetch_one(pool),
            )
            .await
            .map_err(|e| e.with_lock(&g.name))?;
        Ok(n > 0)
    }

    /// Deletes the row of the grant of `token` while its session holds the key: the holder
    /// finds it gone at its next probe (within a third of the session bound), unlocks and
    /// notifies.
    pub(crate) async fn force_release(
        &self,
        pool: &Pool,
        name: &LockName,
        token: FencingToken,
    ) -> Result<bool> {
        let what = format!("force-releasing on {}", self.shared.endpoint);
        let n: i64 = self
            .shared
            .with_timeout(
                &what,
                sqlx::query_scalar(sqlx::AssertSqlSafe(self.shared.sql.force.as_str()))
                    .bind(advisory_key(name.as_str()))
                    .bind(name.as_str())
                    .bind(token.0 as i64)
                    .bind(&self.shared.channel)
                    .fetch_one(pool),
            )
            .await
            .map_err(|e| e.with_lock(name))?;
        Ok(n > 0)
    }

    /// Deletes up to `batch` stale rows (their session no longer holds the key).
    pub(crate) async fn sweep(&self, pool: &Pool, batch: u32) -> Result<u64> {
        let what = format!("sweeping stale advisory rows on {}", self.shared.endpoint);
        let done = self
            .shared
            .with_timeout(
                &what,
                query(&self.shared.sql.sweep)
                    .bind(i64::from(batch))
                    .execute(pool),
            )
            .await?;
        Ok(done.rows_affected())
    }
}

fn info_of(row: &PgRow, name: &LockName) -> Result<LockInfo> {
    let bad = |e: sqlx::Error| map_error(e, "reading the advisory row").with_lock(name);
    let owner: String = row.try_get(1).map_err(bad)?;
    let owner = OwnerId::parse(&owner).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            "the advisory row's owner is not a valid owner id (written by something else?)",
        )
        .with_backend(BACKEND)
        .with_lock(name)
    })?;
    let holds: i32 = row.try_get(2).map_err(bad)?;
    let token: i64 = row.try_get(3).map_err(bad)?;
    let since_ms: i64 = row.try_get(4).map_err(bad)?;
    let value: Option<String> = row.try_get(5).map_err(bad)?;
    let info = LockInfo::new(owner, holds as u32, FencingToken(token as u64), None)
        .with_since_unix_ms(since_ms);
    Ok(match value {
        Some(v) => info.with_value(v),
        None => info,
    })
}
