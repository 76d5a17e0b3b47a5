//! A held permit: its release, renewal and force-release transactions (each settling the
//! marker), and what inspect, list and give-back see of the permits of a name.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::lost;
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockInfo, LockName, OwnerId, Result};
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, Row};

use super::super::{info_of, micros, Inner, Released, MAX_ROUNDS};
use super::*;
use crate::error::{is_conflict, map_error};
use crate::BACKEND;

impl Inner {
    /// Gives up one hold of the permit `g`, within the operation timeout: `true` if it was
    /// still held live.
    pub(in crate::ops) async fn release_permit(&self, g: &Grant) -> Result<bool> {
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
        Err(kept_conflicting("releasing a permit", &g.name))
    }

    /// Extends the permit `g` to at least `ttl` from the server's now, and its marker with it,
    /// in one transaction (the permit row first, then the marker); lost if either is not live.
    pub(in crate::ops) async fn renew_permit(&self, g: &Grant, ttl: Duration) -> Result<Duration> {
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
        Err(kept_conflicting("force-releasing a permit", name))
    }

    /// What inspect shows of a name whose lock-table row is a live marker: its oldest live
    /// permit, with how many are held.
    pub(in crate::ops) async fn inspect_permits(
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
    pub(in crate::ops) async fn list_permits(
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
pub(in crate::ops) fn permit_info(
    row: &MySqlRow,
    at: usize,
    name: &LockName,
    max: u32,
) -> Result<Option<LockInfo>> {
    let held: i64 = row
        .try_get(at + 6)
        .map_err(|e| map_error(e, "reading the permit row").with_lock(name))?;
    let held = u32::try_from(held).unwrap_or(u32::MAX);
    Ok(info_of(row, at, name)?.map(|info| info.with_permits(held, max)))
}

/// The temporary error of a permit transaction that lost a lock conflict on every try.
fn kept_conflicting(what: &str, name: &LockName) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("{what} kept losing lock conflicts"),
    )
    .with_backend(BACKEND)
    .with_lock(name)
    .temporary(true)
}
