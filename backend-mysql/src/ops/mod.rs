//! The server operations behind [`MysqlLock`](crate::MysqlLock): the state its tasks share,
//! renewals and reads here, acquiring in `acquire.rs`, releasing and handing over in `release.rs`,
//! semaphore permits in `permit.rs`, an election leader's value in `proclaim.rs`.

mod acquire;
mod permit;
mod proclaim;
mod release;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::{lost, AcquireRequest};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockInfo, LockName, OwnerId, Result};
use sqlx::mysql::{MySqlConnection, MySqlQueryResult, MySqlRow};
use sqlx::{AssertSqlSafe, Row};

use crate::conn::{Lent, Pool};
use crate::error::{error_from, map_error};
use crate::hint::Hints;
use crate::notices::Signals;
use crate::renewal::{BatchError, Renewals};
use crate::sql::{self, Statements};
use crate::BACKEND;

use self::permit::{is_marker, permit_info};

/// How many times one acquire attempt or release re-reads the row after a conditional write
/// matched nothing because another client changed the row in between (or the server picked
/// this transaction as a deadlock victim). Each round means someone else made progress.
const MAX_ROUNDS: usize = 16;

/// The state shared with the tasks that run acquire attempts and sweeps.
pub(crate) struct Inner {
    /// Acquire attempts, inspect and the sweeper.
    pub(crate) pool: Pool,
    /// Renewals and releases: the statements that keep held locks alive or free them get
    /// connections of their own, so a burst of contenders cannot delay them past a lease.
    pub(crate) holders: Pool,
    /// Renewals due together, sent as one transaction (see [`crate::renewal`]).
    pub(crate) renewals: Arc<Renewals>,
    pub(crate) sql: Statements,
    pub(crate) endpoint: String,
    /// The limit on each server operation (see
    /// [`MysqlConfig::operation_timeout`](crate::MysqlConfig::operation_timeout)).
    pub(crate) operation_timeout: Duration,
    pub(crate) backoff: (Duration, Duration),
    pub(crate) sweep_batch: u32,
    pub(crate) swept: AtomicU64,
    pub(crate) server_version: String,
    /// Release signals for waiters of other clients, unless turned off.
    pub(crate) signals: Option<Signals>,
    /// The names this client last saw held, and until when.
    pub(crate) hints: Arc<Hints>,
}

/// What a release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Released {
    /// Let go of the last hold: the row is gone.
    Last,
    /// Let go of one hold of several: the grant stays.
    OneOfSeveral,
    /// The grant was not held any more (expired, taken over or removed).
    NotHeld,
}

/// A row of the lock table as acquire and inspect read it.
struct LockRow {
    owner: Vec<u8>,
    token: u64,
    /// Microseconds of lease left by the server's clock; zero or less once expired.
    remaining_us: i64,
}

impl Inner {
    fn err(&self, what: &str, name: &LockName) -> impl FnOnce(sqlx::Error) -> Error + '_ {
        let what = format!("{what} on {}", self.endpoint);
        let name = name.clone();
        move |e| map_error(e, &what).with_lock(name)
    }

    /// A connection of `pool` for one operation on `name`, within the connect timeout.
    async fn lend<'a>(&self, pool: &'a Pool, name: &LockName) -> Result<Lent<'a>> {
        Lent::from(pool)
            .await
            .map_err(self.err("getting a pooled connection", name))
    }

    /// The error of an operation on `name` that ran out of the operation timeout.
    fn timed_out(&self, what: &str, name: &LockName) -> Error {
        timed_out(
            &format!("{what} on {}", self.endpoint),
            self.operation_timeout,
        )
        .with_lock(name)
    }

    pub(crate) async fn renew(&self, g: &Grant, ttl: Duration) -> Result<Duration> {
        if g.permits > 1 {
            return self.renew_permit(g, ttl).await;
        }
        let ttl_us = micros(ttl);
        let renewed = self
            .renewals
            .renew(
                g.name.as_str().as_bytes(),
                g.owner.text().as_bytes(),
                g.token.0,
                ttl_us,
            )
            .await
            .ok_or_else(|| {
                Error::new(ErrorKind::Unavailable, "the client is shutting down")
                    .with_backend(BACKEND)
                    .with_lock(&g.name)
            })?
            .map_err(|e| {
                let what = format!("renewing on {}", self.endpoint);
                match e {
                    BatchError::Driver(e) => error_from(&e.0, &what, e.clone()),
                    BatchError::TimedOut => timed_out(&what, self.operation_timeout),
                }
                .with_lock(&g.name)
            })?;
        if renewed {
            Ok(Duration::from_micros(ttl_us))
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
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let mut conn = self.lend(&self.pool, name).await?;
        let read = async {
            let row = sqlx::query(AssertSqlSafe(self.sql.inspect.clone()))
                .bind(name.as_str().as_bytes())
                .fetch_optional(&mut *conn)
                .await?;
            match row {
                // A live semaphore's marker: its permits tell the rest.
                Some(row) if is_marker(&row, 0)? && row.try_get::<i64, _>(3)? > 0 => {
                    let max: u32 = row.try_get(1)?;
                    let permits = self.inspect_permits(&mut conn, name).await?;
                    Ok(permits.map(|p| (p, Some(max))))
                }
                other => Ok(other.map(|row| (row, None))),
            }
        };
        let outcome = tokio::time::timeout(self.operation_timeout, read).await;
        let row = conn
            .finish(outcome)
            .ok_or_else(|| self.timed_out("reading the lock row", name))?
            .map_err(self.err("reading the lock row", name))?;
        match row {
            Some((row, None)) => info_of(&row, 0, name),
            Some((row, Some(max))) => permit_info(&row, 0, name, max),
            None => Ok(None),
        }
    }

    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let what = || format!("listing the locks on {}", self.endpoint);
        let mut conn = Lent::from(&self.pool)
            .await
            .map_err(|e| map_error(e, &what()))?;
        let read = async {
            let rows = sqlx::query(AssertSqlSafe(self.sql.list.clone()))
                .bind(prefix.as_bytes())
                .bind(prefix.len() as u64)
                .bind(prefix.as_bytes())
                .fetch_all(&mut *conn)
                .await?;
            // Semaphores' markers: their permits tell the rest, read once for all of them.
            let mut permits = HashMap::new();
            let mut markers = false;
            for row in &rows {
                markers |= is_marker(row, 1)?;
            }
            if markers {
                for row in self.list_permits(&mut conn, prefix).await? {
                    permits.insert(row.try_get::<Vec<u8>, _>(0)?, row);
                }
            }
            Ok::<_, sqlx::Error>((rows, permits))
        };
        let (rows, mut permits) = match tokio::time::timeout(self.operation_timeout, read).await {
            Ok(rows) => rows.map_err(|e| map_error(e, &what()))?,
            Err(_) => return Err(timed_out(&what(), self.operation_timeout)),
        };
        let mut held = Vec::with_capacity(rows.len());
        for row in rows {
            let name: Vec<u8> = row.try_get(0).map_err(|e| map_error(e, &what()))?;
            // A row no distlock client could have written is not listed.
            let Some(name) = String::from_utf8(name)
                .ok()
                .and_then(|n| LockName::new(n).ok())
            else {
                continue;
            };
            let info = if is_marker(&row, 1).map_err(|e| map_error(e, &what()))? {
                let max: u32 = row.try_get(2).map_err(|e| map_error(e, &what()))?;
                // No live permit seen: they went between the two reads.
                match permits.remove(name.as_str().as_bytes()) {
                    Some(p) => permit_info(&p, 1, &name, max)?,
                    None => None,
                }
            } else {
                info_of(&row, 1, &name)?
            };
            if let Some(info) = info {
                held.push((name, info));
            }
        }
        Ok(held)
    }
}

/// The error of an operation that got no answer within the operation timeout: temporary
/// `Unavailable`, like any other unreachable server. `what` says what ran out of time, and
/// where.
pub(crate) fn timed_out(what: &str, limit: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "{what} failed: no answer from the MySQL server within the operation timeout of \
             {limit:?}"
        ),
    )
    .with_backend(BACKEND)
    .temporary(true)
}

/// A row of [`sql::READ`]'s columns.
fn lock_row(row: &MySqlRow) -> sqlx::Result<LockRow> {
    Ok(LockRow {
        owner: row.try_get(0)?,
        token: row.try_get(1)?,
        remaining_us: row.try_get(2)?,
    })
}

/// The value the statement just run set with `LAST_INSERT_ID(expr)`: from its OK packet, or,
/// where the packet does not carry it, from this session's own `LAST_INSERT_ID()`.
async fn last_insert_id(conn: &mut MySqlConnection, done: &MySqlQueryResult) -> sqlx::Result<u64> {
    match done.last_insert_id() {
        0 => {
            let id: u64 = sqlx::query_scalar(sql::LAST_INSERT_ID)
                .fetch_one(&mut *conn)
                .await?;
            Ok(id)
        }
        id => Ok(id),
    }
}

fn grant(req: &AcquireRequest, token: FencingToken, hold_count: u32, sent_at: Instant) -> Grant {
    Grant::new(
        req.name.clone(),
        req.owner.clone(),
        token,
        hold_count,
        // The server counts in whole microseconds; report the lease it was given.
        Duration::from_micros(micros(req.ttl)),
        sent_at,
    )
}

/// A lease in whole microseconds, rounded down (never promise more than the server was told).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What [`Inner::inspect`] and [`Inner::list`] see of one row, its columns from `at` on: owner,
/// hold count, token, µs of lease left, the grant's time in ms since the epoch and the value
/// this grant proclaimed (NULL unless its token is the row's). `None` when the lease has run
/// out.
fn info_of(row: &MySqlRow, at: usize, name: &LockName) -> Result<Option<LockInfo>> {
    let bad = |e: sqlx::Error| map_error(e, "reading the lock row").with_lock(name);
    let remaining_us: i64 = row.try_get(at + 3).map_err(bad)?;
    if remaining_us <= 0 {
        return Ok(None);
    }
    let owner: Vec<u8> = row.try_get(at).map_err(bad)?;
    let owner = String::from_utf8(owner)
        .ok()
        .and_then(|o| OwnerId::parse(&o).ok())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Backend,
                "the lock row's owner is not a valid owner id (written by something else?)",
            )
            .with_backend(BACKEND)
            .with_lock(name)
        })?;
    let since_ms: Option<i64> = row.try_get(at + 4).map_err(bad)?;
    let value: Option<Vec<u8>> = row.try_get(at + 5).map_err(bad)?;
    let value = value
        .map(|v| {
            String::from_utf8(v).map_err(|_| {
                Error::new(
                    ErrorKind::Backend,
                    "the lock row's value is not UTF-8 (written by something else?)",
                )
                .with_backend(BACKEND)
                .with_lock(name)
            })
        })
        .transpose()?;
    let info = LockInfo::new(
        owner,
        row.try_get(at + 1).map_err(bad)?,
        FencingToken(row.try_get(at + 2).map_err(bad)?),
        Some(Duration::from_micros(remaining_us.unsigned_abs())),
    );
    let info = match since_ms {
        Some(ms) => info.with_since_unix_ms(ms),
        None => info,
    };
    Ok(Some(match value {
        Some(v) => info.with_value(v),
        None => info,
    }))
}
