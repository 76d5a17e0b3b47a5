//! Semaphore permits (requests for more than one permit): the attempt's transaction, what
//! inspect, list, force-release and give-back see of the permit table.
//!
//! A permit is a row of the permit table, keyed by name and token. Every grant of a name, lock
//! or permit, first takes the row lock of the name's counter in the fencing table, so the
//! permits of one name are counted and granted one transaction at a time, and each takes its
//! token from that one counter. Releases, renewals and the sweep need no such lock: they only
//! take permits away or extend live ones, which can only make a count taken under the lock too
//! high, never too low.
//!
//! Permits take no release signal: several clients hold one name at once, and a `GET_LOCK`
//! companion has one holder. A waiter of another client finds the companion free and polls
//! with the backoff, bounded by the soonest expiry of the permits it found; a waiter of the
//! same handle is woken by the handle's own release.

use std::time::{Duration, Instant};

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, FencingToken, Grant, LockInfo, LockName, OwnerId, Result};
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, Connection, Row};

use super::{grant, info_of, last_insert_id, micros, Inner, MAX_ROUNDS};
use crate::error::{is_conflict, map_error};
use crate::BACKEND;

/// How one round of a permit attempt ends.
enum Decided {
    /// Granted or joined: commit.
    Granted(Grant),
    /// Held, or refused: roll back and answer.
    Answer(Result<Attempt>),
    /// A row changed between the read and the write: roll back and try again.
    Again,
}

/// The refusal of a request for `req.permits` on a name held with `held` (1: as a lock).
pub(super) fn other_permits(req: &AcquireRequest, held: u32) -> Error {
    Error::invalid(format!(
        "{} is held with {held} permit(s), not the {} this request asks for",
        req.name, req.permits
    ))
    .with_backend(BACKEND)
    .with_lock(&req.name)
}

impl Inner {
    /// One attempt at a permit: a transaction under the counter's row lock, again after a lock
    /// conflict or a row that changed under it, up to [`MAX_ROUNDS`] times.
    pub(super) async fn permit_attempt_on(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
    ) -> Result<Attempt> {
        for _ in 0..MAX_ROUNDS {
            let mut tx = conn
                .begin()
                .await
                .map_err(self.err("acquiring a permit", &req.name))?;
            let decided = self.permit_decide(&mut tx, req).await;
            let ended = match &decided {
                Ok(Decided::Granted(_)) => tx.commit().await,
                Ok(_) => tx.rollback().await,
                Err(_) => {
                    // After a deadlock the server rolled back already; after a lock wait
                    // timeout only the statement was.
                    let _ = tx.rollback().await;
                    Ok(())
                }
            };
            match decided.and_then(|d| ended.map(|()| d)) {
                Ok(Decided::Granted(g)) => return Ok(Attempt::Granted(g)),
                Ok(Decided::Answer(answer)) => return answer,
                Ok(Decided::Again) => continue,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(self.err("acquiring a permit", &req.name)(e)),
            }
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Inside the transaction: lock the counter, read the name's permits and lock row, then
    /// re-enter the owner's own permit, grant a new one, or answer held or refused.
    async fn permit_decide(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
    ) -> sqlx::Result<Decided> {
        let sql = &self.sql.permit;
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let owner = owner_text.as_bytes();
        let ttl_us = micros(req.ttl);
        let max = req.permits;
        let run = |s: &std::sync::Arc<str>| sqlx::query(AssertSqlSafe(s.clone()));
        run(&sql.lock_counter)
            .bind(name)
            .execute(&mut *conn)
            .await?;
        let rows = run(&sql.state)
            .bind(name)
            .bind(name)
            .fetch_all(&mut *conn)
            .await?;
        let (mut live, mut soonest, mut own) = (0u32, None::<i64>, None::<u64>);
        let (mut expired_permits, mut expired_lock) = (false, false);
        for row in &rows {
            let (kind, holder, token, size, left) = state_row(row)?;
            if left <= 0 {
                expired_permits |= kind == 0;
                expired_lock |= kind == 1;
                continue;
            }
            if kind == 1 || size != i64::from(max) {
                let held = u32::try_from(size).unwrap_or(u32::MAX);
                return Ok(Decided::Answer(Err(other_permits(req, held))));
            }
            live += 1;
            soonest = Some(soonest.map_or(left, |s| s.min(left)));
            if holder == owner {
                own = Some(token);
            }
        }
        if let Some(token) = own {
            // Re-entry: one more hold of the owner's permit, same token, lease not shortened.
            let sent_at = Instant::now();
            let done = run(&sql.join)
                .bind(ttl_us)
                .bind(name)
                .bind(owner)
                .bind(token)
                .execute(&mut *conn)
                .await?;
            if done.rows_affected() != 1 {
                return Ok(Decided::Again);
            }
            let holds = u32::try_from(last_insert_id(&mut *conn, &done).await?)
                .map_err(|_| sqlx::Error::Protocol("the hold count does not fit 32 bits".into()))?;
            return Ok(Decided::Granted(grant(
                req,
                FencingToken(token),
                holds,
                sent_at,
            )));
        }
        if live >= max {
            let expires_in = soonest.map(|us| Duration::from_micros(us.unsigned_abs()));
            return Ok(Decided::Answer(Ok(Attempt::Held { expires_in })));
        }
        if expired_permits {
            run(&sql.drop_expired)
                .bind(name)
                .execute(&mut *conn)
                .await?;
        }
        if expired_lock {
            run(&sql.drop_expired_lock)
                .bind(name)
                .execute(&mut *conn)
                .await?;
        }
        let bumped = run(&sql.next_token).bind(name).execute(&mut *conn).await?;
        let token = last_insert_id(&mut *conn, &bumped).await?;
        let sent_at = Instant::now();
        run(&sql.insert)
            .bind(name)
            .bind(owner)
            .bind(token)
            .bind(max)
            .bind(ttl_us)
            .execute(&mut *conn)
            .await?;
        Ok(Decided::Granted(grant(
            req,
            FencingToken(token),
            1,
            sent_at,
        )))
    }

    /// The size of the semaphore that refused a lock request: `None` if none of its permits
    /// is live any more.
    pub(super) async fn semaphore_size(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
    ) -> Result<Option<u32>> {
        let size: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.sql.permit.size.clone()))
            .bind(req.name.as_str().as_bytes())
            .fetch_one(&mut *conn)
            .await
            .map_err(self.err("reading the semaphore's size", &req.name))?;
        Ok(size.map(|s| u32::try_from(s).unwrap_or(u32::MAX)))
    }

    /// What inspect shows of a name without a lock row: its oldest live permit, with how many
    /// are held of how many.
    pub(super) async fn inspect_permits(
        &self,
        conn: &mut MySqlConnection,
        name: &LockName,
    ) -> sqlx::Result<Option<MySqlRow>> {
        sqlx::query(AssertSqlSafe(self.sql.permit.inspect.clone()))
            .bind(name.as_str().as_bytes())
            .fetch_optional(&mut *conn)
            .await
    }

    /// The live semaphores whose names start with `prefix`, one row per name.
    pub(super) async fn list_permits(
        &self,
        conn: &mut MySqlConnection,
        prefix: &str,
    ) -> sqlx::Result<Vec<MySqlRow>> {
        sqlx::query(AssertSqlSafe(self.sql.permit.list.clone()))
            .bind(prefix.as_bytes())
            .bind(prefix.len() as u64)
            .bind(prefix.as_bytes())
            .fetch_all(&mut *conn)
            .await
    }

    /// An operator's force-release of the live permit with `token`, if there is one.
    pub(crate) async fn force_release_permit(
        &self,
        name: &LockName,
        token: FencingToken,
    ) -> Result<bool> {
        let mut conn = self.lend(&self.holders, name).await?;
        let delete = sqlx::query(AssertSqlSafe(self.sql.permit.force.clone()))
            .bind(name.as_str().as_bytes())
            .bind(token.0)
            .execute(&mut *conn);
        let outcome = tokio::time::timeout(self.operation_timeout, delete).await;
        let done = conn
            .finish(outcome)
            .ok_or_else(|| self.timed_out("force-releasing a permit", name))?
            .map_err(self.err("force-releasing a permit", name))?;
        Ok(done.rows_affected() == 1)
    }

    /// `owner`'s own live permit of `name`, as a grant to release one hold of, with its hold
    /// count.
    pub(crate) async fn own_permit(
        &self,
        name: &LockName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Option<Grant>> {
        let mut conn = self.lend(&self.pool, name).await?;
        let owner_text = owner.text();
        let read = sqlx::query(AssertSqlSafe(self.sql.permit.own.clone()))
            .bind(name.as_str().as_bytes())
            .bind(owner_text.as_bytes())
            .fetch_optional(&mut *conn);
        let outcome = tokio::time::timeout(self.operation_timeout, read).await;
        let row = conn
            .finish(outcome)
            .ok_or_else(|| self.timed_out("reading a permit", name))?
            .map_err(self.err("reading a permit", name))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let read = |row: &MySqlRow| -> sqlx::Result<(u64, u32, i64)> {
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        };
        let (token, holds, size) = read(&row).map_err(self.err("reading a permit", name))?;
        let mut g = Grant::new(
            name.clone(),
            owner.clone(),
            FencingToken(token),
            holds,
            ttl,
            Instant::now(),
        );
        g.permits = u32::try_from(size).unwrap_or(u32::MAX);
        Ok(Some(g))
    }
}

/// A row of the permit attempt's `STATE`: kind (0 permit, 1 lock), owner, token, size and µs
/// of lease left.
fn state_row(row: &MySqlRow) -> sqlx::Result<(i64, Vec<u8>, u64, i64, i64)> {
    Ok((
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
        row.try_get(4)?,
    ))
}

/// What inspect and list see of a semaphore's row (the columns of `INSPECT` from `at` on):
/// the oldest live permit, with how many are held of how many.
pub(super) fn permit_info(row: &MySqlRow, at: usize, name: &LockName) -> Result<Option<LockInfo>> {
    let bad = |e: sqlx::Error| map_error(e, "reading the permit row").with_lock(name);
    let held: i64 = row.try_get(at + 5).map_err(bad)?;
    let size: i64 = row.try_get(at + 6).map_err(bad)?;
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    Ok(info_of(row, at, name)?.map(|info| info.with_permits(count(held), count(size))))
}
