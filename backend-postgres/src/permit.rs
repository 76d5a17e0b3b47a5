//! The semaphore's permits (see the crate docs, "Semaphores"): each operation one short
//! transaction that first takes the row lock of the name's counter, then runs one statement of
//! [`crate::sql::permit`] with a snapshot taken after that lock.

use std::time::{Duration, Instant};

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::{lost, AcquireRequest, ClientCore, Surplus};
use distlock_api::{Error, FencingToken, Grant, LockName, OwnerId, Result};
use sqlx::Row;

use crate::error::map_error;
use crate::ops::{held_as_semaphore, micros, Inner};
use crate::BACKEND;

/// What a permit's acquire statement answered.
struct Answer {
    what: String,
    token: Option<i64>,
    holds: Option<i32>,
    marked: bool,
    size: Option<i32>,
    remaining_us: Option<i64>,
}

impl Inner {
    /// One transaction: the counter's row lock, then the acquire statement; committed only
    /// when it granted (or re-entered) a permit and wrote the marker.
    pub(crate) async fn attempt_permit(&self, req: &AcquireRequest) -> Result<Attempt> {
        let ttl_us = micros(req.ttl);
        let owner = req.owner.text();
        let owner: &str = owner.as_ref();
        let name = req.name.as_str();
        let max = req.permits as i32;
        let sent_at = Instant::now();
        let answer = self
            .run("acquiring a permit", Some(&req.name), || async move {
                let mut tx = self.pool.sqlx().begin().await?;
                self.query(&self.sql.permit.counter_lock)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                let row = self
                    .query(&self.sql.permit.acquire)
                    .bind(name)
                    .bind(owner)
                    .bind(ttl_us)
                    .bind(max)
                    .fetch_one(&mut *tx)
                    .await?;
                let answer = Answer {
                    what: row.try_get(0)?,
                    token: row.try_get(1)?,
                    holds: row.try_get(2)?,
                    marked: row.try_get(3)?,
                    size: row.try_get(4)?,
                    remaining_us: row.try_get(5)?,
                };
                let granted = matches!(answer.what.as_str(), "grant" | "reenter")
                    && answer.marked
                    && answer.token.is_some();
                if granted {
                    tx.commit().await?;
                } else {
                    // Nothing is kept of an answer that grants nothing: no token is burned.
                    tx.rollback().await?;
                }
                Ok(answer)
            })
            .await?;
        match (answer.what.as_str(), answer.token, answer.holds) {
            ("grant" | "reenter", Some(token), Some(holds)) if answer.marked => {
                Ok(Attempt::Granted(Grant::new(
                    req.name.clone(),
                    req.owner.clone(),
                    FencingToken(token as u64),
                    holds as u32,
                    Duration::from_micros(ttl_us as u64),
                    sent_at,
                )))
            }
            ("lock", ..) => Err(Error::invalid(format!(
                "held as a lock, not as a semaphore of {} permits",
                req.permits
            ))
            .with_backend(BACKEND)
            .with_lock(&req.name)),
            ("size", ..) => Err(held_as_semaphore(
                &req.name,
                answer.size.unwrap_or_default() as u32,
                req.permits,
            )),
            // Full, or a lock took the name over between the snapshot and the marker's write
            // (the next attempt sees it).
            _ => Ok(Attempt::Held {
                expires_in: answer
                    .remaining_us
                    .map(|us| Duration::from_micros(us.max(0) as u64)),
            }),
        }
    }

    /// Takes one hold away from the permit of `g` (of `owner`'s), or with no owner deletes
    /// the live permit of `g.token` whatever its holds (an operator's force-release).
    pub(crate) async fn release_permit(&self, g: &Grant, owner: Option<&str>) -> Result<bool> {
        let name = g.name.as_str();
        let token = g.token.0 as i64;
        let released: i64 = self
            .run("releasing a permit", Some(&g.name), || async move {
                let mut tx = self.holders.sqlx().begin().await?;
                self.query(&self.sql.permit.counter_hold)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                let row = self
                    .query(&self.sql.permit.release)
                    .bind(name)
                    .bind(owner)
                    .bind(token)
                    .bind(&self.channel)
                    .fetch_one(&mut *tx)
                    .await?;
                let released: i64 = row.try_get(0)?;
                tx.commit().await?;
                Ok(released)
            })
            .await?;
        Ok(released > 0)
    }

    /// One transaction: the counter's row lock, then the permit's and its marker's renewal,
    /// committed only if both were live.
    pub(crate) async fn renew_permit(&self, g: &Grant, ttl: Duration) -> Result<Duration> {
        let name = g.name.as_str();
        let owner = g.owner.text();
        let owner: &str = owner.as_ref();
        let token = g.token.0 as i64;
        let ttl_us = micros(ttl);
        let renewed = self
            .run("renewing a permit", Some(&g.name), || async move {
                let mut tx = self.holders.sqlx().begin().await?;
                self.query(&self.sql.permit.counter_hold)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                let row = self
                    .query(&self.sql.permit.renew)
                    .bind(name)
                    .bind(owner)
                    .bind(token)
                    .bind(ttl_us)
                    .fetch_one(&mut *tx)
                    .await?;
                let (permit, marker): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
                let renewed = permit == 1 && marker == 1;
                if renewed {
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
                Ok(renewed)
            })
            .await?;
        if renewed {
            Ok(Duration::from_micros(ttl_us as u64))
        } else {
            Err(lost(
                &g.name,
                format!(
                    "the lease of permit token {} ran out or the permit was removed",
                    g.token
                ),
            )
            .with_backend(BACKEND))
        }
    }

    /// The live permit of `token` of the semaphore `name` (of `size` permits), deleted with all
    /// its holds, whoever holds it (`owner` only fills the grant; the statement ignores it).
    pub(crate) async fn force_release_permit(
        &self,
        name: &LockName,
        owner: OwnerId,
        token: FencingToken,
        size: u32,
    ) -> Result<bool> {
        let mut grant = Grant::new(
            name.clone(),
            owner,
            token,
            1,
            Duration::from_millis(1),
            Instant::now(),
        );
        grant.permits = size;
        self.release_permit(&grant, None).await
    }

    /// One hold of `surplus.owner`'s permit of the name, if the server has one that this
    /// handle does not account for; `None` if the owner has no permit of the name.
    pub(crate) async fn give_back_permit(
        &self,
        core: &ClientCore,
        surplus: &Surplus,
    ) -> Result<Option<bool>> {
        let owner = surplus.owner.text();
        let owner: &str = owner.as_ref();
        let row = self
            .run("reading the owner's permit", Some(&surplus.name), || {
                self.query(&self.sql.permit.owned)
                    .bind(surplus.name.as_str())
                    .bind(owner)
                    .fetch_optional(&self.pool)
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let bad =
            |e: sqlx::Error| map_error(e, "reading the owner's permit").with_lock(&surplus.name);
        let token: i64 = row.try_get(0).map_err(bad)?;
        let holds: i32 = row.try_get(1).map_err(bad)?;
        let size: i32 = row.try_get(2).map_err(bad)?;
        if !core.has_surplus(surplus, holds as u32) {
            return Ok(Some(false));
        }
        let mut grant = Grant::new(
            surplus.name.clone(),
            surplus.owner.clone(),
            FencingToken(token as u64),
            holds as u32,
            surplus.ttl,
            Instant::now(),
        );
        grant.permits = size as u32;
        self.release_permit(&grant, Some(owner)).await.map(Some)
    }
}
