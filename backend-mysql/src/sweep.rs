//! The expiry sweeper: expired rows deleted in batches, now or every sweep interval.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::Result;
use sqlx::AssertSqlSafe;

use crate::conn::Lent;
use crate::error::{is_conflict, map_error};
use crate::ops::{timed_out, Inner};

impl Inner {
    /// Deletes expired rows in batches until a batch comes back short, on one connection; each
    /// statement within the operation timeout.
    pub(crate) async fn sweep(&self) -> Result<u64> {
        let what = || format!("sweeping expired rows on {}", self.endpoint);
        let mut conn = Lent::from(&self.pool)
            .await
            .map_err(|e| map_error(e, &what()))?;
        let mut total = 0;
        // Expired lock rows (markers included), then expired permits; each table until a
        // batch comes back short.
        let mut tables = [&self.sql.sweep, &self.sql.permit.sweep].into_iter();
        let mut sweep = tables.next();
        while let Some(sql) = sweep {
            let statement = sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(self.sweep_batch)
                .execute(&mut *conn);
            let Ok(deleted) = tokio::time::timeout(self.operation_timeout, statement).await else {
                // `conn` is closed on return, ending the statement on the server too.
                return Err(timed_out(&what(), self.operation_timeout));
            };
            let deleted = match deleted {
                Ok(d) => d.rows_affected(),
                // Lost a lock race with an acquire or renewal; the next sweep catches up.
                Err(e) if is_conflict(&e) => 0,
                Err(e) => {
                    conn.give_back_after_error();
                    return Err(map_error(e, &what()));
                }
            };
            total += deleted;
            self.swept.fetch_add(deleted, Ordering::Relaxed);
            if deleted < u64::from(self.sweep_batch) {
                sweep = tables.next();
                continue;
            }
            // Let acquires and renewals queued behind this batch's row locks go first.
            tokio::task::yield_now().await;
        }
        conn.give_back();
        Ok(total)
    }
}

pub(crate) async fn sweep_loop(inner: Arc<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = inner.sweep().await {
            tracing::warn!(error = %e, "distlock-mysql: sweeping expired locks failed");
        }
    }
}
