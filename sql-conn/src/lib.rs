//! Connections for distlock's SQL backends (MySQL/MariaDB and PostgreSQL): a sqlx pool with
//! one spare connection set aside ([`Pool`]), and the [`Lent`] connection one operation uses.
//!
//! sqlx pings every connection that goes back to its pool: a round trip, on a server every
//! client shares, after each lock operation (two per lock cycle). A backend that lends its
//! connections through this crate skips that ping for operations that ended with an answer,
//! and closes, rather than pings, a connection whose operation was cut short. `&Pool` is a
//! sqlx [`Executor`], so a single statement runs on it as on a sqlx pool.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::{Connection, Database, Either, Execute, Executor, SqlStr};

/// A pooled connection idle longer than this is pinged before use, so a server restart or an
/// idle-timeout disconnect costs a reconnect instead of a failed lock operation.
pub const PING_IDLE_AFTER: Duration = Duration::from_secs(5);

/// A sqlx pool, and one connection set aside by the last operation that ended cleanly.
///
/// The spare stays checked out of the pool, so nothing pings it, and the next operation takes
/// it at once. Only a connection whose operation ended with an answer is set aside; one that
/// saw an error goes back to the pool, whose ping tests it. A spare idle for
/// [`PING_IDLE_AFTER`] goes back too, and the pool pings it before lending it again.
pub struct Pool<DB: Database> {
    pool: sqlx::Pool<DB>,
    spare: Arc<Mutex<Option<Spare<DB>>>>,
    /// Whether a spare may be set aside: not when the pool has room for one connection only,
    /// which the spare would keep from everyone else.
    keeps_spare: bool,
}

impl<DB: Database> Clone for Pool<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            spare: self.spare.clone(),
            keeps_spare: self.keeps_spare,
        }
    }
}

impl<DB: Database> fmt::Debug for Pool<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("pool", &self.pool)
            .field("keeps_spare", &self.keeps_spare)
            .finish()
    }
}

struct Spare<DB: Database> {
    conn: PoolConnection<DB>,
    since: Instant,
}

impl<DB: Database> Pool<DB> {
    /// A pool of up to `size` connections to the server of `options`, opened when first
    /// needed; waiting for one gives up after `acquire_timeout`.
    pub fn connect_lazy(
        options: <DB::Connection as Connection>::Options,
        size: u32,
        acquire_timeout: Duration,
    ) -> Self {
        let pool = PoolOptions::<DB>::new()
            .max_connections(size)
            .min_connections(0)
            .acquire_timeout(acquire_timeout)
            .idle_timeout(Duration::from_secs(300))
            // sqlx pings every connection it hands out by default: a round trip per lock
            // operation. Ping only connections that sat idle long enough to go stale.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_IDLE_AFTER {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(options);
        Self::with_spare(pool, size > 1)
    }

    /// The application's own pool, as it is.
    pub fn given(pool: sqlx::Pool<DB>) -> Self {
        let keeps_spare = pool.options().get_max_connections() > 1;
        Self::with_spare(pool, keeps_spare)
    }

    fn with_spare(pool: sqlx::Pool<DB>, keeps_spare: bool) -> Self {
        Self {
            pool,
            spare: Arc::default(),
            keeps_spare,
        }
    }

    /// The sqlx pool.
    pub fn sqlx(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    fn spare(&self) -> MutexGuard<'_, Option<Spare<DB>>> {
        // Every update is a single assignment, so a poisoned lock still holds a consistent
        // value.
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `conn` aside for the next operation, or gives it back to the pool if a spare is
    /// already set aside.
    fn keep(&self, conn: PoolConnection<DB>) {
        if !self.keeps_spare {
            return;
        }
        let mut spare = self.spare();
        if spare.is_none() {
            *spare = Some(Spare {
                conn,
                since: Instant::now(),
            });
        }
        // Otherwise `conn` is dropped here, which hands it back to the pool.
    }

    /// The spare, if there is one that has not sat idle too long (a stale one goes back to the
    /// pool, which pings it).
    fn take_spare(&self) -> Option<PoolConnection<DB>> {
        let spare = self.spare().take()?;
        (spare.since.elapsed() < PING_IDLE_AFTER).then_some(spare.conn)
    }
}

/// A connection lent to one server operation. It goes back only through
/// [`give_back`](Lent::give_back) (or [`finish`](Lent::finish)), once the operation has come to
/// an end: an answer, or an error from the driver. Dropped otherwise — the operation ran out of
/// the operation timeout, or its future was dropped in the middle of a statement — it is closed
/// on the spot: detached from the pool, which frees its slot at once, and its socket closed
/// without a word to the server, so closing never waits for a server that does not answer.
///
/// Returned to the pool instead, sqlx would ping it first, with no time limit, in a task that
/// keeps its pool slot for as long as a paused server stays silent; and the next user could
/// find a statement or a transaction cut short on it. When the server reads the closed socket it
/// ends the session, which rolls back any transaction that was left open.
pub struct Lent<'a, DB: Database> {
    conn: Option<PoolConnection<DB>>,
    pool: &'a Pool<DB>,
}

impl<'a, DB: Database> Lent<'a, DB> {
    /// The spare connection of `pool`, or one of the pool's within its acquire timeout (the
    /// connect timeout).
    pub async fn from(pool: &'a Pool<DB>) -> sqlx::Result<Self> {
        let conn = match pool.take_spare() {
            Some(conn) => conn,
            None => pool.pool.acquire().await?,
        };
        Ok(Self {
            conn: Some(conn),
            pool,
        })
    }

    /// The operation got its answer and left the connection idle: it is set aside as the spare
    /// for the next operation.
    pub fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.keep(conn);
        }
    }

    /// The operation ended in an error from the driver: the connection goes back to the pool,
    /// which tests it before anyone uses it again.
    pub fn give_back_after_error(mut self) {
        drop(self.conn.take());
    }

    /// Gives the connection back as `outcome` says: [`give_back`](Self::give_back) after a
    /// success, [`give_back_after_error`](Self::give_back_after_error) after an error.
    pub fn settle<T, E>(self, outcome: &std::result::Result<T, E>) {
        match outcome {
            Ok(_) => self.give_back(),
            Err(_) => self.give_back_after_error(),
        }
    }

    /// Ends an operation run under `tokio::time::timeout`: returns its result if it finished in
    /// time, giving the connection back as [`settle`](Self::settle) does. Closes the connection
    /// and returns `None` if the operation ran out of time.
    pub fn finish<T, E, Elapsed>(
        self,
        outcome: std::result::Result<std::result::Result<T, E>, Elapsed>,
    ) -> Option<std::result::Result<T, E>> {
        let outcome = outcome.ok()?;
        self.settle(&outcome);
        Some(outcome)
    }
}

impl<DB: Database> Deref for Lent<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.conn
            .as_deref()
            .expect("a lent connection is there until it is given back")
    }
}

impl<DB: Database> DerefMut for Lent<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.conn
            .as_deref_mut()
            .expect("a lent connection is there until it is given back")
    }
}

impl<DB: Database> Drop for Lent<'_, DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Detached, the pool forgets it (and may open a replacement); dropping the bare
            // connection closes its socket synchronously.
            drop(conn.detach());
        }
    }
}

/// One statement on a [`Lent`] connection of the pool: given back when it is answered, closed
/// when the statement's future is dropped unfinished (an operation timeout). A statement's rows
/// are read in full before the first is passed on, so the connection is free by then.
impl<'p, DB: Database> Executor<'p> for &'p Pool<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    type Database = DB;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, sqlx::Result<Either<DB::QueryResult, DB::Row>>>
    where
        'p: 'e,
        E: 'q + Execute<'q, DB>,
    {
        let all = async move {
            let mut conn = Lent::from(self).await?;
            let rows: sqlx::Result<Vec<_>> = conn.fetch_many(query).try_collect().await;
            conn.settle(&rows);
            rows
        };
        stream::once(all)
            .map_ok(|rows| stream::iter(rows.into_iter().map(Ok)))
            .try_flatten()
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, sqlx::Result<Option<DB::Row>>>
    where
        'p: 'e,
        E: 'q + Execute<'q, DB>,
    {
        Box::pin(async move {
            let mut conn = Lent::from(self).await?;
            let row = conn.fetch_optional(query).await;
            conn.settle(&row);
            row
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [DB::TypeInfo],
    ) -> BoxFuture<'e, sqlx::Result<DB::Statement>>
    where
        'p: 'e,
    {
        Box::pin(async move {
            let mut conn = Lent::from(self).await?;
            let statement = conn.prepare_with(sql, parameters).await;
            conn.settle(&statement);
            statement
        })
    }
}
