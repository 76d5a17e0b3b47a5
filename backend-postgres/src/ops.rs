//! The server operations behind [`PostgresLock`](crate::PostgresLock): one statement each (see
//! [`crate::sql`]), on a pooled connection, within the operation timeout.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::{lost, AcquireRequest};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockInfo, LockName, OwnerId, Result};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use crate::error::{is_conflict, map_error, timed_out};
use crate::notices::Listener;
use crate::sql::Statements;
use crate::BACKEND;

/// How many times one operation is retried at once after the server rolled it back for a
/// conflict with a concurrent transaction (nothing of it took effect).
const MAX_ROUNDS: usize = 8;

/// The lock operations' connections: a pool with a spare, lent to one statement at a time
/// (`&Pool` runs a statement as a sqlx pool does, without sqlx's ping when the connection comes
/// back).
pub(crate) type Pool = distlock_sql_conn::Pool<sqlx::Postgres>;

/// The state shared with the sweeper and the listener.
pub(crate) struct Inner {
    /// Acquire attempts, reads and the sweeper.
    pub(crate) pool: Pool,
    /// Renewals, releases and proclaims: the statements that keep held locks alive or free
    /// them get connections of their own, so a burst of contenders cannot delay them.
    pub(crate) holders: Pool,
    pub(crate) sql: Statements,
    pub(crate) endpoint: String,
    pub(crate) operation_timeout: Duration,
    /// Whether statements are kept prepared on their connections.
    pub(crate) persistent: bool,
    pub(crate) sweep_batch: u32,
    pub(crate) swept: AtomicU64,
    pub(crate) server_version: String,
    /// The channel releases notify on, named after the lock table.
    pub(crate) channel: String,
    /// Notices for waiters, unless turned off.
    pub(crate) listener: Option<Listener>,
    /// The backoff of waiters when notices are off.
    pub(crate) backoff: (Duration, Duration),
    /// Advisory mode's session, in that mode.
    pub(crate) advisory: Option<crate::advisory::Advisory>,
}

impl Inner {
    pub(crate) fn query<'q>(
        &self,
        sql: &'q str,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(AssertSqlSafe(sql)).persistent(self.persistent)
    }

    /// Runs `op` within the operation timeout, again at once on a conflict the server rolled
    /// back; errors name `what`, the server and the lock.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        what: &str,
        name: Option<&LockName>,
        op: F,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = sqlx::Result<T>>,
    {
        let what = format!("{what} on {}", self.endpoint);
        let with_lock = |e: Error| match name {
            Some(n) => e.with_lock(n),
            None => e,
        };
        let mut round = 0;
        loop {
            match tokio::time::timeout(self.operation_timeout, op()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if is_conflict(&e) && round + 1 < MAX_ROUNDS => round += 1,
                Ok(Err(e)) => return Err(with_lock(map_error(e, &what))),
                Err(_) => return Err(with_lock(timed_out(&what, self.operation_timeout))),
            }
        }
    }

    pub(crate) async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        if req.permits > 1 {
            return self.attempt_permit(req).await;
        }
        let ttl_us = micros(req.ttl);
        let owner = req.owner.text();
        let sent_at = Instant::now();
        let row = self
            .run("acquiring", Some(&req.name), || {
                self.query(&self.sql.acquire)
                    .bind(req.name.as_str())
                    .bind(owner.as_ref())
                    .bind(ttl_us)
                    .fetch_one(&self.pool)
            })
            .await?;
        let bad =
            |e: sqlx::Error| map_error(e, "reading the acquire's answer").with_lock(&req.name);
        if row.try_get::<bool, _>(0).map_err(bad)? {
            let token: i64 = row.try_get(1).map_err(bad)?;
            let holds: i32 = row.try_get(2).map_err(bad)?;
            Ok(Attempt::Granted(Grant::new(
                req.name.clone(),
                req.owner.clone(),
                FencingToken(token as u64),
                holds as u32,
                Duration::from_micros(ttl_us as u64),
                sent_at,
            )))
        } else {
            let left: Option<i64> = row.try_get(3).map_err(bad)?;
            if let Some(size) = row.try_get::<Option<i32>, _>(4).map_err(bad)? {
                return Err(held_as_semaphore(&req.name, size as u32, 1));
            }
            Ok(Attempt::Held {
                expires_in: left.map(|us| Duration::from_micros(us.max(0) as u64)),
            })
        }
    }

    pub(crate) async fn release(&self, g: &Grant) -> Result<bool> {
        if g.permits > 1 {
            return self.release_permit(g, Some(g.owner.text().as_ref())).await;
        }
        let owner = g.owner.text();
        let released: i64 = self
            .run("releasing", Some(&g.name), || {
                self.query(&self.sql.release)
                    .bind(g.name.as_str())
                    .bind(owner.as_ref())
                    .bind(g.token.0 as i64)
                    .bind(&self.channel)
                    .fetch_one(&self.holders)
            })
            .await
            .and_then(|row| {
                row.try_get(0)
                    .map_err(|e| map_error(e, "reading the release's answer"))
            })?;
        Ok(released > 0)
    }

    /// One statement for every lock grant of `grants`, one short transaction for each permit;
    /// one result per grant, in order.
    pub(crate) async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        if grants.iter().all(|(g, _)| g.permits <= 1) {
            return self.renew_locks(grants).await;
        }
        let locks: Vec<(Grant, Duration)> = grants
            .iter()
            .filter(|(g, _)| g.permits <= 1)
            .cloned()
            .collect();
        let mut locks = self.renew_locks(&locks).await.into_iter();
        let mut results = Vec::with_capacity(grants.len());
        for (g, ttl) in grants {
            if g.permits > 1 {
                results.push(self.renew_permit(g, *ttl).await);
            } else {
                results.push(locks.next().expect("one result per lock grant"));
            }
        }
        results
    }

    async fn renew_locks(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        if grants.is_empty() {
            return Vec::new();
        }
        // One row per grant: the holds of one grant (re-entries, each with a lease of its own)
        // can fall in one batch, and an `UPDATE … FROM` whose source has a row twice updates
        // the target once and returns it once, so all but one of them would read as lost. The
        // grant is renewed for the longest lease its holds ask, which is at least each one's.
        let mut unique: Vec<(&Grant, Duration)> = Vec::new();
        let mut slot = Vec::with_capacity(grants.len());
        for (g, ttl) in grants {
            let same = |(u, _): &(&Grant, Duration)| {
                u.name == g.name && u.owner == g.owner && u.token == g.token
            };
            match unique.iter().position(same) {
                Some(i) => {
                    unique[i].1 = unique[i].1.max(*ttl);
                    slot.push(i);
                }
                None => {
                    slot.push(unique.len());
                    unique.push((g, *ttl));
                }
            }
        }
        let names: Vec<&str> = unique.iter().map(|(g, _)| g.name.as_str()).collect();
        let owners: Vec<String> = unique.iter().map(|(g, _)| g.owner.text().into()).collect();
        let tokens: Vec<i64> = unique.iter().map(|(g, _)| g.token.0 as i64).collect();
        let ttls: Vec<i64> = unique.iter().map(|(_, ttl)| micros(*ttl)).collect();
        let name = (unique.len() == 1).then(|| &unique[0].0.name);
        let renewed = self
            .run("renewing", name, || {
                self.query(&self.sql.renew)
                    .bind(&names)
                    .bind(&owners)
                    .bind(&tokens)
                    .bind(&ttls)
                    .fetch_all(&self.holders)
            })
            .await;
        let renewed: Vec<i64> = match renewed {
            Ok(rows) => rows.iter().filter_map(|r| r.try_get(0).ok()).collect(),
            Err(e) => {
                return grants
                    .iter()
                    .map(|(g, _)| Err(crate::error::clone_error(&e).with_lock(&g.name)))
                    .collect()
            }
        };
        grants
            .iter()
            .zip(slot)
            .map(|((g, ttl), i)| {
                if renewed.contains(&(i as i64 + 1)) {
                    Ok(Duration::from_micros(micros(*ttl) as u64))
                } else {
                    Err(lost(
                        &g.name,
                        format!(
                            "the lease of token {} ran out or the row was taken over or removed",
                            g.token
                        ),
                    )
                    .with_backend(BACKEND))
                }
            })
            .collect()
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let row = self
            .run("reading the lock row", Some(name), || {
                self.query(&self.sql.inspect)
                    .bind(name.as_str())
                    .fetch_optional(&self.pool)
            })
            .await?;
        match row {
            Some(row) => info_of(&row, name),
            None => Ok(None),
        }
    }

    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let rows = self
            .run("listing the locks", None, || {
                self.query(&self.sql.list)
                    .bind(prefix)
                    .fetch_all(&self.pool)
            })
            .await?;
        let mut held = Vec::with_capacity(rows.len());
        for row in rows {
            let name: String = row
                .try_get(0)
                .map_err(|e| map_error(e, "reading the lock rows"))?;
            // A row no distlock client could have written is not listed.
            let Ok(name) = LockName::new(name) else {
                continue;
            };
            if let Some(info) = info_of(&row, &name)? {
                held.push((name, info));
            }
        }
        Ok(held)
    }

    pub(crate) async fn proclaim(&self, g: &Grant, value: &str) -> Result<bool> {
        let owner = g.owner.text();
        let row = self
            .run("proclaiming", Some(&g.name), || {
                self.query(&self.sql.proclaim)
                    .bind(g.name.as_str())
                    .bind(owner.as_ref())
                    .bind(g.token.0 as i64)
                    .bind(value)
                    .bind(&self.channel)
                    .fetch_one(&self.holders)
            })
            .await?;
        let done: i64 = row
            .try_get(0)
            .map_err(|e| map_error(e, "reading the proclaim's answer"))?;
        Ok(done > 0)
    }

    /// Deletes expired rows in batches until a batch comes back short.
    pub(crate) async fn sweep(&self) -> Result<u64> {
        let mut total = 0;
        loop {
            let done = self
                .run("sweeping expired rows", None, || {
                    self.query(&self.sql.sweep)
                        .bind(i64::from(self.sweep_batch))
                        .execute(&self.pool)
                })
                .await?;
            let n = done.rows_affected();
            total += n;
            self.swept.fetch_add(n, Ordering::Relaxed);
            if n < u64::from(self.sweep_batch) {
                break;
            }
        }
        loop {
            let done = self
                .run("sweeping expired permits", None, || {
                    self.query(&self.sql.permit.sweep)
                        .bind(i64::from(self.sweep_batch))
                        .execute(&self.pool)
                })
                .await?;
            let n = done.rows_affected();
            total += n;
            self.swept.fetch_add(n, Ordering::Relaxed);
            if n < u64::from(self.sweep_batch) {
                break;
            }
        }
        if let Some(advisory) = &self.advisory {
            loop {
                let n = advisory.sweep(&self.pool, self.sweep_batch).await?;
                total += n;
                self.swept.fetch_add(n, Ordering::Relaxed);
                if n < u64::from(self.sweep_batch) {
                    break;
                }
            }
        }
        Ok(total)
    }
}

/// The refusal of a request for `asked` permits (1: the lock) on a name held as a semaphore
/// of `size`.
pub(crate) fn held_as_semaphore(name: &LockName, size: u32, asked: u32) -> Error {
    let asked = match asked {
        1 => "1 (the lock)".to_string(),
        n => n.to_string(),
    };
    Error::invalid(format!(
        "held as a semaphore of {size} permit(s), not {asked}: a name's size is fixed while \
         permits are held"
    ))
    .with_backend(BACKEND)
    .with_lock(name)
}

/// A lease in whole microseconds, rounded down (never promise more than the server was told).
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// What inspect and list see of one row: `None` when its lease has just run out.
fn info_of(row: &PgRow, name: &LockName) -> Result<Option<LockInfo>> {
    let bad = |e: sqlx::Error| map_error(e, "reading the lock row").with_lock(name);
    let remaining_us: i64 = row.try_get(4).map_err(bad)?;
    // A marker whose permits have all just run out shows no live permit.
    let marker: bool = row.try_get(7).map_err(bad)?;
    let live: i64 = row.try_get::<Option<i64>, _>(8).map_err(bad)?.unwrap_or(0);
    if remaining_us <= 0 || (marker && live == 0) {
        return Ok(None);
    }
    let owner: String = row.try_get(1).map_err(bad)?;
    let owner = OwnerId::parse(&owner).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            "the lock row's owner is not a valid owner id (written by something else?)",
        )
        .with_backend(BACKEND)
        .with_lock(name)
    })?;
    let holds: i32 = row.try_get(2).map_err(bad)?;
    let token: i64 = row.try_get(3).map_err(bad)?;
    let since_ms: i64 = row.try_get(5).map_err(bad)?;
    let value: Option<String> = row.try_get(6).map_err(bad)?;
    let mut info = LockInfo::new(
        owner,
        holds as u32,
        FencingToken(token as u64),
        Some(Duration::from_micros(remaining_us as u64)),
    )
    .with_since_unix_ms(since_ms);
    if row.try_get::<bool, _>(7).map_err(bad)? {
        let size: i32 = row.try_get(9).map_err(bad)?;
        info = info.with_permits(live as u32, size as u32);
    }
    Ok(Some(match value {
        Some(v) => info.with_value(v),
        None => info,
    }))
}
