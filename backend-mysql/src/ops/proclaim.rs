//! An election leader's value: one conditional statement ([`PROCLAIM`](crate::sql)) on the
//! grant's own row. The lock's own statements never touch it.

use distlock_api::{Grant, Result};
use sqlx::AssertSqlSafe;

use super::Inner;

impl Inner {
    /// Stores `value` with the grant's token in the grant's row if the grant (owner and token)
    /// holds it live by the server's clock; `Ok(false)` if it does not (a semaphore's permit
    /// never does: its row is in the permit table). On the holders' pool, within the operation
    /// timeout, like a renewal.
    pub(crate) async fn proclaim(&self, g: &Grant, value: &str) -> Result<bool> {
        if g.permits > 1 {
            return Ok(false);
        }
        let mut conn = self.lend(&self.holders, &g.name).await?;
        let owner = g.owner.text();
        let write = sqlx::query(AssertSqlSafe(self.sql.proclaim.clone()))
            .bind(value.as_bytes())
            .bind(g.name.as_str().as_bytes())
            .bind(owner.as_bytes())
            .bind(g.token.0)
            .execute(&mut *conn);
        let outcome = tokio::time::timeout(self.operation_timeout, write).await;
        let done = conn
            .finish(outcome)
            .ok_or_else(|| self.timed_out("proclaiming", &g.name))?
            .map_err(self.err("proclaiming", &g.name))?;
        Ok(done.rows_affected() == 1)
    }
}
