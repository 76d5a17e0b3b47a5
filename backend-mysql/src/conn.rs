//! Connections for lock operations: a sqlx pool with one spare connection set aside, and the
//! [`Lent`] connection one operation uses.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, MySql};

/// A pooled connection idle longer than this is pinged before use, so a server restart or an
/// idle-timeout disconnect costs a reconnect instead of a failed lock operation.
const PING_IDLE_AFTER: Duration = Duration::from_secs(5);

/// A sqlx pool, and one connection set aside by the last operation that ended cleanly.
///
/// sqlx pings every connection that goes back to its pool: a round trip, on a server every
/// client shares, after each lock operation (two per lock cycle). The spare stays checked out
/// of the pool, so nothing pings it, and the next operation takes it at once. Only a connection
/// whose operation ended with an answer is set aside; one that saw an error goes back to the
/// pool, whose ping tests it. A spare idle for [`PING_IDLE_AFTER`] goes back too, and the pool
/// pings it before lending it again.
#[derive(Clone)]
pub(crate) struct Pool {
    pool: MySqlPool,
    spare: Arc<Mutex<Option<Spare>>>,
    /// Whether a spare may be set aside: not when the pool has room for one connection only,
    /// which the spare would keep from everyone else.
    keeps_spare: bool,
}

struct Spare {
    conn: PoolConnection<MySql>,
    since: Instant,
}

impl Pool {
    /// A pool of up to `size` connections to the server of `options`, opened when first
    /// needed; waiting for one gives up after `acquire_timeout`.
    pub(crate) fn connect_lazy(
        options: MySqlConnectOptions,
        size: u32,
        acquire_timeout: Duration,
    ) -> Self {
        let pool = MySqlPoolOptions::new()
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
        Self {
            pool,
            spare: Arc::default(),
            keeps_spare: size > 1,
        }
    }

    /// The application's own pool, as it is.
    pub(crate) fn given(pool: MySqlPool) -> Self {
        let keeps_spare = pool.options().get_max_connections() > 1;
        Self {
            pool,
            spare: Arc::default(),
            keeps_spare,
        }
    }

    /// The sqlx pool.
    pub(crate) fn sqlx(&self) -> &MySqlPool {
        &self.pool
    }

    fn spare(&self) -> MutexGuard<'_, Option<Spare>> {
        // Every update is a single assignment, so a poisoned lock still holds a consistent
        // value.
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `conn` aside for the next operation, or gives it back to the pool if a spare is
    /// already set aside.
    fn keep(&self, conn: PoolConnection<MySql>) {
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
    fn take_spare(&self) -> Option<PoolConnection<MySql>> {
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
pub(crate) struct Lent<'a> {
    conn: Option<PoolConnection<MySql>>,
    pool: &'a Pool,
}

impl<'a> Lent<'a> {
    /// The spare connection of `pool`, or one of the pool's within its acquire timeout (the
    /// connect timeout).
    pub(crate) async fn from(pool: &'a Pool) -> sqlx::Result<Self> {
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
    pub(crate) fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.keep(conn);
        }
    }

    /// The operation ended in an error from the driver: the connection goes back to the pool,
    /// which tests it before anyone uses it again.
    pub(crate) fn give_back_after_error(mut self) {
        drop(self.conn.take());
    }

    /// Ends an operation run under `tokio::time::timeout`: returns its result if it finished in
    /// time, and the connection with [`give_back`](Self::give_back) if the result is a success,
    /// with [`give_back_after_error`](Self::give_back_after_error) if it is an error. Closes the
    /// connection and returns `None` if the operation ran out of time.
    pub(crate) fn finish<T, E>(
        self,
        outcome: std::result::Result<std::result::Result<T, E>, tokio::time::error::Elapsed>,
    ) -> Option<std::result::Result<T, E>> {
        match outcome {
            Ok(Ok(v)) => {
                self.give_back();
                Some(Ok(v))
            }
            Ok(Err(e)) => {
                self.give_back_after_error();
                Some(Err(e))
            }
            Err(_) => None,
        }
    }
}

impl Deref for Lent<'_> {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        self.conn
            .as_deref()
            .expect("a lent connection is there until it is given back")
    }
}

impl DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        self.conn
            .as_deref_mut()
            .expect("a lent connection is there until it is given back")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Detached, the pool forgets it (and may open a replacement); dropping the bare
            // connection closes its socket synchronously.
            drop(conn.detach());
        }
    }
}
