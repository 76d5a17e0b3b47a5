//! The dedicated connection of advisory mode: opened on demand, checked to be one server
//! session (a transaction-pooling proxy is refused), told to end itself when idle for the
//! session bound (`idle_session_timeout`), probed every third of the bound, and dropped (which
//! ends the session on the server, freeing its locks) after any failure that leaves its state
//! unknown.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use distlock_api::{Error, ErrorKind, LockName, OwnerId, Result};
use sqlx::postgres::{PgConnection, PgDatabaseError, PgSeverity};
use sqlx::{AssertSqlSafe, ConnectOptions, Row};

use super::sql::{PID, PING, SESSION};
use super::Shared;
use crate::error::{map_error, timed_out};
use crate::BACKEND;

/// One held key of this client.
#[derive(Clone, Debug)]
pub(super) struct Held {
    pub(super) key: i64,
    pub(super) owner: OwnerId,
    pub(super) token: i64,
    pub(super) holds: u32,
}

/// The session and what it holds; behind one async mutex, so one statement at a time.
#[derive(Default)]
pub(super) struct State {
    pub(super) conn: Option<PgConnection>,
    /// Counts the sessions opened; a grant carries the one it was made in.
    pub(super) epoch: u64,
    /// The names this session holds (empty whenever `conn` is `None`).
    pub(super) held: HashMap<LockName, Held>,
    /// An acquire is between its start and its answer: if the state is locked again with this
    /// set, the acquire was dropped mid-statement and the session's state is unknown.
    pub(super) inflight: bool,
    /// The latest safe-until a grant of this session can have: the send of its last statement
    /// that was answered, plus the bound (a grant's lease, and each renewal's, is the bound
    /// from the send of an answered statement).
    pub(super) believed_until: Option<Instant>,
}

impl State {
    /// Drops the session: the server ends it (and frees its locks) when it sees the socket
    /// close. Every hold of it is gone.
    ///
    /// The socket itself stays open, unused, until the latest safe-until of the session's
    /// grants has passed: closing it would let the server free the keys at once (a session
    /// ends when its client's socket closes), while a guard could still believe it holds
    /// until its safe-until. A session the server already ended has freed them anyway.
    pub(super) fn kill(&mut self, why: &str) {
        if let Some(conn) = self.conn.take() {
            tracing::warn!(
                held = self.held.len(),
                "postgres advisory session dropped: {why}"
            );
            let until = self.believed_until.take();
            match (until, tokio::runtime::Handle::try_current()) {
                (Some(until), Ok(rt)) if !self.held.is_empty() && until > Instant::now() => {
                    rt.spawn(async move {
                        tokio::time::sleep_until(until.into()).await;
                        drop(conn);
                    });
                }
                _ => drop(conn),
            }
        }
        self.held.clear();
    }
}

/// Whether an error ends the session or leaves its protocol state unknown: anything but an
/// error the server reported for a statement, and of those the ones it reports as it ends the
/// session (`FATAL` or `PANIC`, such as `pg_terminate_backend`'s 57P01 or the idle timeout's
/// 57P05).
pub(super) fn breaks_session(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<PgDatabaseError>()
            .is_some_and(|pg| matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic)),
        sqlx::Error::ColumnDecode { .. } => false,
        _ => true,
    }
}

impl Shared {
    /// The session, opened if there is none.
    pub(super) async fn session<'s>(&self, st: &'s mut State) -> Result<&'s mut PgConnection> {
        if st.conn.is_none() {
            let conn = tokio::time::timeout(self.connect_timeout, self.open())
                .await
                .map_err(|_| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "no advisory session with {} within the connect timeout of {:?}",
                            self.endpoint, self.connect_timeout
                        ),
                    )
                    .with_backend(BACKEND)
                })??;
            st.held.clear();
            st.epoch += 1;
            st.conn = Some(conn);
        }
        Ok(st.conn.as_mut().expect("just opened"))
    }

    async fn open(&self) -> Result<PgConnection> {
        let what = format!("opening the advisory session on {}", self.endpoint);
        let mut conn = self
            .options
            .connect()
            .await
            .map_err(|e| map_error(e, &what))?;
        let bound = format!("{}ms", self.bound.as_millis());
        let row = sqlx::query(SESSION)
            .bind(&bound)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(_) => Error::new(
                    ErrorKind::Backend,
                    format!(
                        "{what}: advisory mode needs PostgreSQL 14 or later \
                         (idle_session_timeout)"
                    ),
                )
                .with_source(e)
                .with_backend(BACKEND),
                e => map_error(e, &what),
            })?;
        let first: i32 = row.try_get(1).map_err(|e| map_error(e, &what))?;
        let second: i32 = sqlx::query_scalar(PID)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| map_error(e, &what))?;
        if first != second {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "advisory mode needs one server session per connection, but two statements \
                     on one connection to {} ran in server sessions {first} and {second} (a \
                     transaction-pooling proxy?): connect to the server or a session-mode \
                     pool, or use mode=table",
                    self.endpoint
                ),
            )
            .with_backend(BACKEND));
        }
        Ok(conn)
    }

    /// Runs one probe of the session, dropping it if the probe fails.
    pub(super) async fn ping(&self, st: &mut State) {
        let Some(conn) = st.conn.as_mut() else {
            return;
        };
        let limit = self.operation_timeout.min(self.bound / 3);
        match tokio::time::timeout(limit, sqlx::query(PING).execute(conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => st.kill(&format!("keepalive probe failed: {e}")),
            Err(_) => st.kill(&format!("keepalive probe unanswered within {limit:?}")),
        }
    }

    /// Runs `op` on the session within the operation timeout; a timeout or a broken
    /// connection drops the session.
    pub(super) async fn on_session<T, F>(&self, st: &mut State, what: &str, op: F) -> Result<T>
    where
        F: for<'c> FnOnce(
            &'c mut PgConnection,
        )
            -> std::pin::Pin<Box<dyn Future<Output = sqlx::Result<T>> + Send + 'c>>,
    {
        let what = format!("{what} on {}", self.endpoint);
        let conn = self.session(st).await?;
        let sent = Instant::now();
        match tokio::time::timeout(self.operation_timeout, op(conn)).await {
            Ok(Ok(v)) => {
                st.believed_until = Some(sent + self.bound);
                Ok(v)
            }
            Ok(Err(e)) => {
                if breaks_session(&e) {
                    st.kill(&format!("{what}: {e}"));
                }
                Err(map_error(e, &what))
            }
            Err(_) => {
                st.kill(&format!("{what}: no answer"));
                Err(timed_out(&what, self.operation_timeout))
            }
        }
    }
}

/// Probes the session every third of the bound while the client lives.
pub(super) async fn keepalive(shared: Arc<Shared>) {
    let every = shared.bound / 3;
    loop {
        tokio::time::sleep(every).await;
        let mut st = shared.lock_state().await;
        shared.ping(&mut st).await;
    }
}

/// A statement of advisory mode.
pub(super) fn query(
    sql: &str,
) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(AssertSqlSafe(sql))
}
