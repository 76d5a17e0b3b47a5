//! Semaphore permits (requests for more than one permit): the attempt, release, renewal and
//! force-release transactions, and what inspect, list and give-back see of them. The
//! statements are in `sql/permit.rs`.
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
use distlock_api::backend::{lost, AcquireRequest};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockInfo, LockName, OwnerId, Result};
use sqlx::mysql::{MySqlArguments, MySqlConnection, MySqlRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, Row};

use super::{grant, info_of, last_insert_id, micros, Inner, Released, MAX_ROUNDS};
use crate::error::{is_conflict, map_error};
use crate::sql::MARKER;
use crate::BACKEND;

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

    /// Gives up one hold of the permit `g`, within the operation timeout: `true` if it was
    /// still held live.
    pub(super) async fn release_permit(&self, g: &Grant) -> Result<bool> {
        let mut conn = self.lend(&self.holders, &g.name).await?;
        let outcome =
            tokio::time::timeout(self.operation_timeout, self.release_permit_on(&mut conn, g))
                .await;
        let released = conn
            .finish(outcome)
            .unwrap_or_else(|| Err(self.timed_out("releasing a permit", &g.name)))?;
        Ok(released != Released::NotHeld)
    }

    /// One transaction under the counter's row lock: the lock's release statements on the
    /// permit table, and the marker settled after the last hold of a live permit went.
    async fn release_permit_on(&self, conn: &mut MySqlConnection, g: &Grant) -> Result<Released> {
        let sql = &self.sql.permit;
        let name = g.name.as_str().as_bytes();
        let owner_text = g.owner.text();
        let owner = owner_text.as_bytes();
        let token = g.token.0;
        let fail = || self.err("releasing a permit", &g.name);
        let exec = |s: &Arc<str>| run(s).bind(name).bind(owner).bind(token);
        for _ in 0..MAX_ROUNDS {
            begin(conn).await.map_err(fail())?;
            let step: sqlx::Result<Option<Released>> = async {
                run(&sql.lock_counter)
                    .bind(name)
                    .execute(&mut *conn)
                    .await?;
                if exec(&sql.release_last)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1
                {
                    self.settle_marker(conn, name).await?;
                    return Ok(Some(Released::Last));
                }
                if exec(&sql.release_one)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1
                {
                    return Ok(Some(Released::OneOfSeveral));
                }
                let live: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.probe.clone()))
                    .bind(name)
                    .bind(owner)
                    .bind(token)
                    .fetch_optional(&mut *conn)
                    .await?;
                match live {
                    None => Ok(Some(Released::NotHeld)),
                    // Expired: not one of the live permits the marker covers, so it stays.
                    Some(0) => {
                        exec(&sql.clear_expired).execute(&mut *conn).await?;
                        Ok(Some(Released::NotHeld))
                    }
                    // Still live, yet neither statement matched: cannot happen under the
                    // counter's lock (re-entries take it too), but try again rather than guess.
                    Some(_) => Ok(None),
                }
            }
            .await;
            match step {
                Ok(Some(released)) => {
                    commit(conn).await.map_err(fail())?;
                    return Ok(released);
                }
                Ok(None) => rollback(conn).await.map_err(fail())?,
                Err(e) => {
                    let _ = rollback(conn).await;
                    if !is_conflict(&e) {
                        return Err(fail()(e));
                    }
                }
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "releasing a permit kept losing lock conflicts",
        )
        .with_backend(BACKEND)
        .with_lock(&g.name)
        .temporary(true))
    }

    /// Extends the permit `g` to at least `ttl` from the server's now, and its marker with it,
    /// in one transaction (the permit row first, then the marker); lost if either is not live.
    pub(super) async fn renew_permit(&self, g: &Grant, ttl: Duration) -> Result<Duration> {
        let ttl_us = micros(ttl);
        let mut conn = self.lend(&self.holders, &g.name).await?;
        let outcome = tokio::time::timeout(
            self.operation_timeout,
            self.renew_permit_on(&mut conn, g, ttl_us),
        )
        .await;
        let renewed = conn
            .finish(outcome)
            .unwrap_or_else(|| Err(self.timed_out("renewing a permit", &g.name)))?;
        if renewed {
            Ok(Duration::from_micros(ttl_us))
        } else {
            Err(lost(
                &g.name,
                format!(
                    "the lease of permit {} ran out or the permit was removed",
                    g.token
                ),
            )
            .with_backend(BACKEND))
        }
    }

    async fn renew_permit_on(
        &self,
        conn: &mut MySqlConnection,
        g: &Grant,
        ttl_us: u64,
    ) -> Result<bool> {
        let sql = &self.sql.permit;
        let name = g.name.as_str().as_bytes();
        let owner_text = g.owner.text();
        let fail = || self.err("renewing a permit", &g.name);
        let mut tries = 0;
        loop {
            tries += 1;
            begin(conn).await.map_err(fail())?;
            let step: sqlx::Result<bool> = async {
                let renewed = run(&sql.renew)
                    .bind(ttl_us)
                    .bind(name)
                    .bind(owner_text.as_bytes())
                    .bind(g.token.0)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1;
                Ok(renewed && self.raise_marker(conn, name, g.token.0).await?)
            }
            .await;
            match step {
                Ok(true) => {
                    commit(conn).await.map_err(fail())?;
                    return Ok(true);
                }
                Ok(false) => {
                    rollback(conn).await.map_err(fail())?;
                    return Ok(false);
                }
                Err(e) => {
                    let _ = rollback(conn).await;
                    if !is_conflict(&e) || tries >= RENEW_TRIES {
                        return Err(fail()(e));
                    }
                }
            }
        }
    }

    /// An operator's force-release of the live permit of `name` with `token`, all its holds at
    /// once: whether there was one. The other permits are untouched; the marker is settled.
    pub(crate) async fn force_release_permit(
        &self,
        name: &LockName,
        token: FencingToken,
    ) -> Result<bool> {
        let mut conn = self.lend(&self.holders, name).await?;
        let outcome = tokio::time::timeout(
            self.operation_timeout,
            self.force_release_permit_on(&mut conn, name, token),
        )
        .await;
        conn.finish(outcome)
            .unwrap_or_else(|| Err(self.timed_out("force-releasing a permit", name)))
    }

    async fn force_release_permit_on(
        &self,
        conn: &mut MySqlConnection,
        name: &LockName,
        token: FencingToken,
    ) -> Result<bool> {
        let sql = &self.sql.permit;
        let bytes = name.as_str().as_bytes();
        let fail = || self.err("force-releasing a permit", name);
        for _ in 0..MAX_ROUNDS {
            begin(conn).await.map_err(fail())?;
            let step: sqlx::Result<bool> = async {
                run(&sql.lock_counter)
                    .bind(bytes)
                    .execute(&mut *conn)
                    .await?;
                let deleted = run(&sql.force)
                    .bind(bytes)
                    .bind(token.0)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1;
                if deleted {
                    self.settle_marker(conn, bytes).await?;
                }
                Ok(deleted)
            }
            .await;
            match step {
                Ok(true) => {
                    commit(conn).await.map_err(fail())?;
                    return Ok(true);
                }
                Ok(false) => {
                    rollback(conn).await.map_err(fail())?;
                    return Ok(false);
                }
                Err(e) => {
                    let _ = rollback(conn).await;
                    if !is_conflict(&e) {
                        return Err(fail()(e));
                    }
                }
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "force-releasing a permit kept losing lock conflicts",
        )
        .with_backend(BACKEND)
        .with_lock(name)
        .temporary(true))
    }

    /// What inspect shows of a name whose lock-table row is a live marker: its oldest live
    /// permit, with how many are held.
    pub(super) async fn inspect_permits(
        &self,
        conn: &mut MySqlConnection,
        name: &LockName,
    ) -> sqlx::Result<Option<MySqlRow>> {
        run(&self.sql.permit.inspect)
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
        run(&self.sql.permit.list)
            .bind(prefix.as_bytes())
            .bind(prefix.len() as u64)
            .bind(prefix.as_bytes())
            .fetch_all(&mut *conn)
            .await
    }

    /// `owner`'s own live permit of `name`, as a grant (with its hold count and the semaphore's
    /// size) that releases one hold; `None` if it holds none. Read directly, not through
    /// inspect, which shows only the oldest permit.
    pub(crate) async fn own_permit(
        &self,
        name: &LockName,
        owner: &OwnerId,
        ttl: Duration,
    ) -> Result<Option<Grant>> {
        let mut conn = self.lend(&self.pool, name).await?;
        let owner_text = owner.text();
        let read = run(&self.sql.permit.own)
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

/// What inspect and list see of a semaphore: the oldest live permit (the columns of the permit
/// `INSPECT` from `at` on, the live count last), of `max` permits.
pub(super) fn permit_info(
    row: &MySqlRow,
    at: usize,
    name: &LockName,
    max: u32,
) -> Result<Option<LockInfo>> {
    let held: i64 = row
        .try_get(at + 5)
        .map_err(|e| map_error(e, "reading the permit row").with_lock(name))?;
    let held = u32::try_from(held).unwrap_or(u32::MAX);
    Ok(info_of(row, at, name)?.map(|info| info.with_permits(held, max)))
}
