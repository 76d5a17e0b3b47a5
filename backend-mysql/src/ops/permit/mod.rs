//! Semaphore permits (requests for more than one permit): the attempt, and the marker it
//! keeps ([`held`] has the release, renewal and force-release transactions, and what inspect,
//! list and give-back see of permits). The statements are in `sql/permit.rs`.
//!
//! A permit is a row of the permit table, keyed by name and token. While a name has live
//! permits, its row in the lock table is the *marker* (owner [`MARKER`], hold count the
//! semaphore's `max`, expiry the latest of its live permits'), so a lock request finds the name
//! held as it finds any holder and reads nothing of the permit table; only where it would
//! answer "held" does it look at the owner, and the marker's turns the answer into a refusal.
//!
//! Every permit transaction takes its row locks in one order: the name's counter (all but the
//! renewal), then its permit rows, then its lock-table row. The lock's own transactions take
//! the counter, then the lock-table row. So the grants of a name, lock or permit, are
//! serialised by the counter, and no two of these transactions wait for each other in a
//! circle.
//!
//! Permits take no release signal: a `GET_LOCK` companion has one holder, a semaphore several.
//! A waiter of another client finds the companion free and polls with the backoff, bounded by
//! the soonest expiry of the permits it found; a waiter of the same handle is woken by the
//! handle's own release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, FencingToken, Grant, Result};
use sqlx::mysql::{MySqlArguments, MySqlConnection, MySqlRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, Row};

use super::{grant, last_insert_id, micros, Inner, MAX_ROUNDS};
use crate::error::is_conflict;
use crate::sql::MARKER;
use crate::BACKEND;

mod held;

pub(super) use held::permit_info;

/// How often a permit renewal that lost a lock conflict is tried, in all.
const RENEW_TRIES: usize = 3;

/// How one round of a permit attempt ends.
enum Decided {
    /// Granted or joined: commit.
    Granted(Grant),
    /// Held, or refused: roll back and answer.
    Answer(Result<Attempt>),
    /// A row changed between the read and the write: roll back and try again.
    Again,
}

/// The lock-table row of a name as a permit attempt reads it.
struct LockTableRow {
    marker: bool,
    /// The marker's hold count: the semaphore's `max`.
    size: u32,
    remaining_us: i64,
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

/// Whether the owner column at `at` of `row` is a semaphore's marker.
pub(super) fn is_marker(row: &MySqlRow, at: usize) -> sqlx::Result<bool> {
    Ok(row.try_get::<&[u8], _>(at)? == MARKER.as_bytes())
}

/// A statement of `sql.rs`, to bind and run.
fn run<'q>(sql: &Arc<str>) -> Query<'q, MySql, MySqlArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}

async fn begin(conn: &mut MySqlConnection) -> sqlx::Result<()> {
    sqlx::raw_sql("BEGIN").execute(conn).await.map(drop)
}

async fn commit(conn: &mut MySqlConnection) -> sqlx::Result<()> {
    sqlx::raw_sql("COMMIT").execute(conn).await.map(drop)
}

/// Rolls back. After an error it is best-effort: a deadlock rolled the transaction back
/// already, a lock wait timeout only the statement.
async fn rollback(conn: &mut MySqlConnection) -> sqlx::Result<()> {
    sqlx::raw_sql("ROLLBACK").execute(conn).await.map(drop)
}

impl Inner {
    /// One attempt at a permit: a transaction under the counter's row lock, again after a lock
    /// conflict or a row that changed under it, up to [`MAX_ROUNDS`] times.
    pub(super) async fn permit_attempt_on(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
    ) -> Result<Attempt> {
        let fail = || self.err("acquiring a permit", &req.name);
        for _ in 0..MAX_ROUNDS {
            begin(conn).await.map_err(fail())?;
            match self.permit_decide(conn, req).await {
                Ok(Decided::Granted(g)) => {
                    commit(conn).await.map_err(fail())?;
                    return Ok(Attempt::Granted(g));
                }
                Ok(Decided::Answer(answer)) => {
                    rollback(conn).await.map_err(fail())?;
                    return answer;
                }
                Ok(Decided::Again) => rollback(conn).await.map_err(fail())?,
                Err(e) => {
                    let _ = rollback(conn).await;
                    if !is_conflict(&e) {
                        return Err(fail()(e));
                    }
                }
            }
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Inside the transaction: lock the counter, read the name's permits (locked) and its
    /// lock-table row, then re-enter the owner's own permit, grant a new one, or answer held or refused.
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
        run(&sql.lock_counter)
            .bind(name)
            .execute(&mut *conn)
            .await?;
        let permits = run(&sql.permits_locked)
            .bind(name)
            .fetch_all(&mut *conn)
            .await?;
        let (mut live, mut soonest, mut own, mut expired) = (0u32, None::<i64>, None, false);
        for row in &permits {
            let holder: &[u8] = row.try_get(0)?;
            let token: u64 = row.try_get(1)?;
            let left: i64 = row.try_get(2)?;
            if left <= 0 {
                expired = true;
            } else {
                live += 1;
                soonest = Some(soonest.map_or(left, |s: i64| s.min(left)));
                if holder == owner {
                    own = Some(token);
                }
            }
        }
        let lock_row = run(&sql.lock_row)
            .bind(name)
            .fetch_optional(&mut *conn)
            .await?
            .map(|row| -> sqlx::Result<LockTableRow> {
                let size: i64 = row.try_get(1)?;
                Ok(LockTableRow {
                    marker: is_marker(&row, 0)?,
                    size: u32::try_from(size).unwrap_or(u32::MAX),
                    remaining_us: row.try_get(2)?,
                })
            })
            .transpose()?;
        match &lock_row {
            Some(r) if r.remaining_us > 0 && !r.marker => {
                return Ok(Decided::Answer(Err(other_permits(req, 1))));
            }
            Some(r) if r.remaining_us > 0 && r.size != max => {
                return Ok(Decided::Answer(Err(other_permits(req, r.size))));
            }
            _ => {}
        }
        if let Some(token) = own {
            // Re-entry: one more hold of the owner's permit, same token, lease not shortened;
            // the marker raised to it.
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
            if !self.raise_marker(conn, name, token).await? {
                return Ok(Decided::Again);
            }
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
        if expired {
            run(&sql.drop_expired)
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
        let marked = match lock_row {
            None => match run(&sql.marker_insert)
                .bind(name)
                .bind(token)
                .execute(&mut *conn)
                .await
            {
                Ok(done) => done.rows_affected() == 1,
                Err(e) if crate::error::is_duplicate(&e) => false,
                Err(e) => return Err(e),
            },
            Some(r) if r.remaining_us > 0 => self.raise_marker(conn, name, token).await?,
            Some(_) => {
                run(&sql.marker_replace)
                    .bind(max)
                    .bind(token)
                    .bind(name)
                    .bind(token)
                    .bind(name)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1
            }
        };
        if !marked {
            return Ok(Decided::Again);
        }
        Ok(Decided::Granted(grant(
            req,
            FencingToken(token),
            1,
            sent_at,
        )))
    }

    /// Raises the live marker of `name` to the expiry of its permit `token`: false if there is
    /// no live marker.
    async fn raise_marker(
        &self,
        conn: &mut MySqlConnection,
        name: &[u8],
        token: u64,
    ) -> sqlx::Result<bool> {
        let done = run(&self.sql.permit.marker_raise)
            .bind(name)
            .bind(token)
            .bind(name)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// After a live permit of `name` went: the marker lowered to the latest expiry of the live
    /// permits left, or deleted if none is left. The permit rows are locked first (the one lock
    /// order), so no renewal moves them until the marker is set.
    async fn settle_marker(&self, conn: &mut MySqlConnection, name: &[u8]) -> sqlx::Result<()> {
        let sql = &self.sql.permit;
        let live: i64 = sqlx::query_scalar(AssertSqlSafe(sql.live_locked.clone()))
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
        if live == 0 {
            run(&sql.marker_delete)
                .bind(name)
                .execute(&mut *conn)
                .await?;
        } else {
            run(&sql.marker_lower)
                .bind(name)
                .bind(name)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// The size of the semaphore whose marker a lock request found: `None` if the marker is no
    /// longer live.
    pub(super) async fn semaphore_size(
        &self,
        conn: &mut MySqlConnection,
        name: &[u8],
    ) -> sqlx::Result<Option<u32>> {
        let size: Option<i64> =
            sqlx::query_scalar(AssertSqlSafe(self.sql.permit.marker_size.clone()))
                .bind(name)
                .fetch_optional(&mut *conn)
                .await?;
        Ok(size.map(|s| u32::try_from(s).unwrap_or(u32::MAX)))
    }
}
