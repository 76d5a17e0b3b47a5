//! Acquire attempts: the one-request fresh grant, the read, and the conditional writes.

use std::time::{Duration, Instant};

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::AcquireRequest;
use distlock_api::{FencingToken, Grant, Result};
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Connection, Row};

use super::permit::other_permits;
use super::{grant, last_insert_id, lock_row, micros, Inner, LockRow, MAX_ROUNDS};
use crate::error::{is_conflict, is_duplicate};
use crate::sql::MARKER;

impl Inner {
    /// One acquire attempt within the operation timeout.
    pub(crate) async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        let mut conn = self.lend(&self.pool, &req.name).await?;
        let outcome = if req.permits > 1 {
            let attempt = self.permit_attempt_on(&mut conn, req);
            tokio::time::timeout(self.operation_timeout, attempt).await
        } else {
            tokio::time::timeout(self.operation_timeout, self.attempt_on(&mut conn, req)).await
        };
        conn.finish(outcome)
            .unwrap_or_else(|| Err(self.timed_out("acquiring", &req.name)))
    }

    /// One acquire attempt: read the row, then try the one conditional write that fits what
    /// was read. The write re-checks everything it relies on, on the server, so a row that
    /// changed in between only costs another round.
    async fn attempt_on(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
    ) -> Result<Attempt> {
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let owner = owner_text.as_bytes();
        let ttl_us = micros(req.ttl);
        // A name not known to be held: the whole fresh grant in one request. If a row is
        // there after all, what it says is read in the request that ends the transaction.
        let mut read_already = None;
        if self.hints.likely_free(name) {
            match self.grant_in_one(conn, req, ttl_us).await {
                Ok(Ok(grant)) => return Ok(self.granted(grant, true)),
                Ok(Err(row)) => read_already = Some(row),
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(self.err("acquiring", &req.name)(e)),
            }
        }
        for _ in 0..MAX_ROUNDS {
            let row = match read_already.take() {
                Some(row) => row,
                None => self
                    .read(conn, name)
                    .await
                    .map_err(self.err("reading the lock row", &req.name))?,
            };
            let mut fresh = false;
            let outcome = match row {
                Some(r) if r.remaining_us > 0 && r.owner == owner => {
                    self.join(conn, req, r.token, ttl_us).await
                }
                // A semaphore's marker: a lock is a semaphore of one permit, so the request is
                // refused (looked at only here, where the answer would be "held").
                Some(r) if r.remaining_us > 0 && r.owner == MARKER.as_bytes() => {
                    let size = self
                        .semaphore_size(conn, name)
                        .await
                        .map_err(self.err("reading the semaphore's size", &req.name))?;
                    match size {
                        Some(size) => return Err(other_permits(req, size)),
                        // Its permits went meanwhile: read again.
                        None => continue,
                    }
                }
                Some(r) if r.remaining_us > 0 => {
                    let left = Duration::from_micros(r.remaining_us.unsigned_abs());
                    self.hints.held(name, left);
                    return Ok(Attempt::Held {
                        expires_in: Some(left),
                    });
                }
                seen => {
                    fresh = true;
                    self.grant_fresh(conn, req, seen.is_some(), ttl_us).await
                }
            };
            match outcome {
                Ok(Some(grant)) => return Ok(self.granted(grant, fresh)),
                Ok(None) => continue,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(self.err("acquiring", &req.name)(e)),
            }
        }
        // Others kept changing the row under us: it is contended, so report it held.
        Ok(Attempt::Held { expires_in: None })
    }

    /// The bookkeeping of a grant: the release signal of a fresh one, and the name remembered
    /// as held.
    fn granted(&self, grant: Grant, fresh: bool) -> Attempt {
        if let (true, Some(signals)) = (fresh, &self.signals) {
            signals.granted(&grant.name, grant.token.0);
        }
        self.hints.held(grant.name.as_str().as_bytes(), grant.ttl);
        Attempt::Granted(grant)
    }

    async fn read(&self, conn: &mut MySqlConnection, name: &[u8]) -> sqlx::Result<Option<LockRow>> {
        let row = sqlx::query(AssertSqlSafe(self.sql.read.clone()))
            .bind(name)
            .fetch_optional(&mut *conn)
            .await?;
        row.as_ref().map(lock_row).transpose()
    }

    /// A fresh grant of a name that is likely free, in one request
    /// ([`Statements::grant_in_one`](crate::sql::Statements::grant_in_one)):
    /// `Ok(Ok(grant))`, or `Ok(Err(row))` with the row that was there after all (read in the
    /// request that rolled the transaction back, so the counter is as it was). Any other error
    /// also rolls back (a lock wait timeout ends only the statement), so the connection goes
    /// back without a transaction left open.
    async fn grant_in_one(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
        ttl_us: u64,
    ) -> sqlx::Result<std::result::Result<Grant, Option<LockRow>>> {
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let sql = self.sql.grant_in_one(name, owner_text.as_bytes(), ttl_us);
        let sent_at = Instant::now();
        let granted = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await;
        match granted {
            Ok(rows) => {
                let token: u64 = match rows.first() {
                    Some(row) => row.try_get(0)?,
                    None => {
                        return Err(sqlx::Error::Protocol(
                            "the one-request grant returned no token".into(),
                        ))
                    }
                };
                Ok(Ok(grant(req, FencingToken(token), 1, sent_at)))
            }
            Err(e) if is_duplicate(&e) => {
                let rows = sqlx::raw_sql(AssertSqlSafe(self.sql.rollback_and_read(name)))
                    .fetch_all(&mut *conn)
                    .await?;
                Ok(Err(rows.first().map(lock_row).transpose()?))
            }
            Err(e) => {
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                Err(e)
            }
        }
    }

    /// A reentrant acquire: one more hold of the live grant with `token`, if it is still there.
    async fn join(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
        token: u64,
        ttl_us: u64,
    ) -> sqlx::Result<Option<Grant>> {
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let owner = owner_text.as_bytes();
        let sent_at = Instant::now();
        let done = sqlx::query(AssertSqlSafe(self.sql.join.clone()))
            .bind(ttl_us)
            .bind(name)
            .bind(owner)
            .bind(token)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        let holds = u32::try_from(last_insert_id(&mut *conn, &done).await?).map_err(|_| {
            sqlx::Error::Protocol("the joined hold count does not fit 32 bits".into())
        })?;
        Ok(Some(grant(req, FencingToken(token), holds, sent_at)))
    }

    /// A fresh grant, in one transaction: bump the name's fencing counter, then insert the row
    /// (`expired` false: none was seen) or take over the expired one. If the write matches
    /// nothing, the transaction is rolled back and the counter with it, so a failed attempt
    /// issues no token.
    async fn grant_fresh(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
        expired: bool,
        ttl_us: u64,
    ) -> sqlx::Result<Option<Grant>> {
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let owner = owner_text.as_bytes();
        let mut tx = conn.begin().await?;
        let result: sqlx::Result<Option<(u64, Instant)>> = async {
            let bumped = sqlx::query(AssertSqlSafe(self.sql.bump_fencing.clone()))
                .bind(name)
                .execute(&mut *tx)
                .await?;
            let token = last_insert_id(&mut tx, &bumped).await?;
            let sent_at = Instant::now();
            let wrote = if expired {
                sqlx::query(AssertSqlSafe(self.sql.takeover.clone()))
                    .bind(owner)
                    .bind(token)
                    .bind(ttl_us)
                    .bind(name)
                    .execute(&mut *tx)
                    .await
                    .map(|d| d.rows_affected() == 1)?
            } else {
                match sqlx::query(AssertSqlSafe(self.sql.insert.clone()))
                    .bind(name)
                    .bind(owner)
                    .bind(token)
                    .bind(ttl_us)
                    .execute(&mut *tx)
                    .await
                {
                    Ok(_) => true,
                    // Inserted by someone else since our read: read again.
                    Err(e) if is_duplicate(&e) => false,
                    Err(e) => return Err(e),
                }
            };
            Ok(wrote.then_some((token, sent_at)))
        }
        .await;
        match result {
            Ok(Some((token, sent_at))) => {
                tx.commit().await?;
                Ok(Some(grant(req, FencingToken(token), 1, sent_at)))
            }
            Ok(None) => {
                tx.rollback().await?;
                Ok(None)
            }
            Err(e) => {
                // After a deadlock the server has rolled back already; after a lock wait
                // timeout only the statement was. Either way end the transaction here rather
                // than leave it to the connection's next user.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }
}
