//! [`MysqlLock`]: the lock table, the fencing counter, the sweeper and the trait impl.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, Backoff, HandOver, Notices, Waiting};
use distlock_api::backend::{async_trait, lost, AcquireRequest, ClientCore};
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, ErrorKind, Fencing, FencingToken, Grant,
    LeaseKind, LockInfo, LockName, OwnerId, Result, TtlSupport,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlQueryResult, MySqlRow};
use sqlx::{AssertSqlSafe, Connection, Executor, Row};
use tokio::task::JoinHandle;

use crate::config::MysqlConfig;
use crate::conn::{Lent, Pool};
use crate::error::{error_from, is_conflict, is_duplicate, map_error};
use crate::hint::Hints;
use crate::renewal::{BatchError, Renewals};
use crate::signal::Signals;
use crate::sql::{self, Statements};
use crate::BACKEND;

/// What the MySQL/MariaDB backend promises.
pub const CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Signal)
    .ttl(TtlSupport::new(
        LeaseKind::PerLock,
        Duration::from_millis(1),
        Duration::from_micros(1),
    ))
    .fair(false)
    .fencing(Fencing::Durable)
    .renewal(true);

/// How many times one acquire attempt or release re-reads the row after a conditional write
/// matched nothing because another client changed the row in between (or the server picked
/// this transaction as a deadlock victim). Each round means someone else made progress.
const MAX_ROUNDS: usize = 16;

/// A client of the MySQL/MariaDB lock table: two connection pools (acquiring; renewing and
/// releasing), one owner id, one watchdog, and (if configured) one sweeper task.
///
/// Every transition is one conditional statement, or one transaction whose writes are
/// conditional, judged by the server's clock (`UTC_TIMESTAMP(6)`); see the crate docs for the
/// algorithm and its safety model.
pub struct MysqlLock {
    inner: Arc<Inner>,
    core: ClientCore,
    sweeper: Option<JoinHandle<()>>,
}

/// The state shared with the tasks that run acquire attempts and sweeps.
struct Inner {
    /// Acquire attempts, inspect and the sweeper.
    pool: Pool,
    /// Renewals and releases: the statements that keep held locks alive or free them get
    /// connections of their own, so a burst of contenders cannot delay them past a lease.
    holders: Pool,
    /// Renewals due together, sent as one transaction (see [`crate::renewal`]).
    renewals: Arc<Renewals>,
    sql: Statements,
    endpoint: String,
    /// The limit on each server operation (see [`MysqlConfig::operation_timeout`]).
    operation_timeout: Duration,
    backoff: (Duration, Duration),
    sweep_batch: u32,
    swept: AtomicU64,
    server_version: String,
    /// Release signals for waiters of other clients, unless turned off.
    signals: Option<Signals>,
    /// The names this client last saw held, and until when.
    hints: Arc<Hints>,
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

impl MysqlLock {
    /// The pool and the lock table's name, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) fn admin_parts(&self) -> (&sqlx::MySqlPool, &str) {
        (self.inner.pool.sqlx(), &self.inner.sql.locks)
    }
}

impl MysqlLock {
    /// Connects to the server, creates the two tables if they do not exist (unless turned off),
    /// checks that they have the columns this backend uses, and starts the sweeper if the config
    /// asks for it.
    ///
    /// Bad config is `InvalidArgument` before any I/O; a server that cannot be reached within
    /// the connect timeout is `Unavailable`; a server that refuses (wrong password, missing
    /// privilege, incompatible table) is `Backend`.
    pub async fn connect(config: MysqlConfig) -> Result<Self> {
        config.validate()?;
        let mut core = ClientCore::new(BACKEND)
            .with_default_ttl(config.get_default_ttl())
            .map_err(|e| e.with_backend(BACKEND))?;
        if let Some(owner) = config.get_owner() {
            core = core.with_owner(owner.clone());
        }
        let sql = Statements::new(config.get_lock_table(), config.get_fencing_table());
        // sqlx's rustls needs a crypto provider for any TLS handshake, `ssl-mode=preferred`
        // (its default) included.
        #[cfg(feature = "tls")]
        distlock_api::backend::ensure_crypto_provider();
        let options = config.connect_options();
        let endpoint = config.endpoint();
        let timeout = config.get_connect_timeout();
        let server_version = tokio::time::timeout(
            timeout,
            prepare(&options, &sql, config.get_create_tables(), &endpoint),
        )
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Unavailable,
                format!(
                    "no MySQL session with {endpoint} within the connect timeout of {timeout:?}"
                ),
            )
            .with_backend(BACKEND)
        })??;
        let size = config.get_pool_size();
        let pool = || Pool::connect_lazy(options.clone(), size, timeout);
        let holders = pool();
        // Two flushers: one batch in flight while the next one gathers. More would only split
        // the renewals into more commits.
        let operation_timeout = config.get_operation_timeout();
        let hints = Arc::new(Hints::default());
        let signals = config.get_release_signals().then(|| {
            Signals::start(
                options.clone(),
                config.database().to_string(),
                config.get_lock_table().to_string(),
                size as usize,
                config.get_backoff(),
                operation_timeout,
                hints.clone(),
            )
        });
        let renewals = Renewals::new(holders.clone(), sql.renew.clone(), 2, operation_timeout);
        let inner = Arc::new(Inner {
            pool: match config.get_pool() {
                Some(given) => Pool::given(given.clone()),
                None => pool(),
            },
            holders,
            renewals,
            sql,
            endpoint,
            operation_timeout,
            backoff: config.get_backoff(),
            sweep_batch: config.get_sweep_batch(),
            swept: AtomicU64::new(0),
            server_version,
            signals,
            hints,
        });
        let sweeper = config
            .get_sweep_interval()
            .map(|every| tokio::spawn(sweep_loop(inner.clone(), every)));
        Ok(Self {
            inner,
            core,
            sweeper,
        })
    }

    /// The server's version string (`SELECT VERSION()`), e.g. `10.11.19-MariaDB-0+deb12u1`.
    pub fn server_version(&self) -> &str {
        &self.inner.server_version
    }

    /// The client's connection pool, for statements of your own against the same server. The
    /// lock operations set one idle connection of it aside for the next one (unless it holds
    /// only one).
    pub fn pool(&self) -> &MySqlPool {
        self.inner.pool.sqlx()
    }

    /// Deletes every expired row now, in batches, and returns how many it deleted. Never
    /// deletes a live row. The background sweeper runs the same code.
    pub async fn sweep_now(&self) -> Result<u64> {
        self.inner.sweep().await
    }

    /// The companion name of `name`'s release signal, if signals are on (test-only).
    #[cfg(feature = "testing")]
    pub fn signal_name(&self, name: &LockName) -> Option<String> {
        self.inner.signals.as_ref().map(|s| s.companion(name))
    }

    /// How many sessions this client's waiters have opened to wait for release signals on
    /// (test-only).
    #[cfg(feature = "testing")]
    pub fn wait_sessions(&self) -> usize {
        self.inner
            .signals
            .as_ref()
            .map_or(0, Signals::wait_sessions)
    }

    /// How many expired rows this client's sweeps have deleted so far.
    pub fn rows_swept(&self) -> u64 {
        self.inner.swept.load(Ordering::Relaxed)
    }
}

impl Drop for MysqlLock {
    fn drop(&mut self) {
        if let Some(sweeper) = self.sweeper.take() {
            sweeper.abort();
        }
    }
}

impl std::fmt::Debug for MysqlLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlLock")
            .field("endpoint", &self.inner.endpoint)
            .field("server_version", &self.inner.server_version)
            .field("owner", self.core.owner())
            .field("sweeper", &self.sweeper.is_some())
            .finish()
    }
}

#[async_trait]
impl DistributedLock for MysqlLock {
    fn capabilities(&self) -> Capabilities {
        match self.inner.signals {
            Some(_) => CAPABILITIES,
            None => CAPABILITIES.blocking(Blocking::Poll),
        }
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.inner.attempt(req).await
    }

    /// Polls with the configured backoff; held answers carry the holder's remaining lease, so a
    /// waiter wakes no later than the holder's expiry even when the step is longer. With
    /// release signals on, a waiter that found the lock held waits for the holder's signal
    /// instead ([`subscribe`](Self::subscribe)).
    fn waiting(&self) -> Waiting {
        let (base, cap) = self.inner.backoff;
        Waiting::Poll(Backoff::new(base, cap))
    }

    /// The release signal of `name` (see [`MysqlConfig::release_signals`]): a wait in
    /// `GET_LOCK` on its companion name, or the backoff step where the holder keeps none.
    /// Opens nothing until the first wait. `Unsupported` with signals off.
    async fn subscribe(&self, name: &LockName) -> Result<Box<dyn Notices>> {
        match &self.inner.signals {
            Some(signals) => Ok(Box::new(signals.notices(name))),
            None => Err(Error::new(
                ErrorKind::Unsupported,
                "release signals are off for this client",
            )
            .with_backend(BACKEND)),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.inner.release(grant).await
    }

    /// A release through this handle passes the lock straight to a waiting task of the same
    /// handle: one request ([`hand_over`](Self::hand_over)) instead of a release and the
    /// waiter's next attempt.
    fn hands_over(&self) -> bool {
        true
    }

    /// One transaction (the `HAND_OVER_LAST` and `HAND_OVER` statements in `sql.rs`): the
    /// counter bumped as for a fresh grant and the row passed to `to.owner` if `from` holds it
    /// live with its last hold (one request); one hold taken away if it has several; nothing
    /// changed if it holds none (those two, a second request). The name stays held
    /// throughout, so other clients' waiters are not told anything (what becomes of the
    /// release signal is told at `Inner::hand_over`).
    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        self.inner.hand_over(from, to).await
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        self.inner.renew(grant, ttl).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        self.inner.list(prefix).await
    }
}

/// Opens one session within the caller's connect timeout: proves the server is reachable and
/// accepts the credentials, creates and checks the tables, and reads the server version.
async fn prepare(
    options: &MySqlConnectOptions,
    sql: &Statements,
    create_tables: bool,
    endpoint: &str,
) -> Result<String> {
    let fail = |what: &str| {
        let what = format!("{what} on {endpoint}");
        move |e: sqlx::Error| map_error(e, &what)
    };
    let mut conn = MySqlConnection::connect_with(options)
        .await
        .map_err(fail("connecting"))?;
    if create_tables {
        for ddl in [&sql.create_locks, &sql.create_fencing] {
            conn.execute(AssertSqlSafe(ddl.clone()))
                .await
                .map_err(fail("creating the lock tables"))?;
        }
    }
    // Tables made by earlier versions: a narrower owner column (for owner ids without a tag,
    // a longer id would be refused or, without strict mode, cut short and never match again)
    // and no `granted_at` column. Fixed on connect, or refused with the statements to run.
    let width: Option<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(sql.owner_width.clone()))
        .fetch_optional(&mut conn)
        .await
        .map_err(fail("checking the lock table's owner column"))?;
    let exists = width.is_some();
    let narrow = width.flatten().filter(|&w| w < sql::OWNER_COLUMN_WIDTH);
    let has_granted_at: i64 = sqlx::query_scalar(AssertSqlSafe(sql.has_granted_at.clone()))
        .fetch_one(&mut conn)
        .await
        .map_err(fail("checking the lock table's columns"))?;
    let mut fixes = Vec::new();
    if narrow.is_some() {
        fixes.push(&sql.widen_owner);
    }
    if exists && has_granted_at == 0 {
        fixes.push(&sql.add_granted_at);
    }
    if !fixes.is_empty() && !create_tables {
        let run: Vec<String> = fixes.iter().map(|f| format!("`{f}`")).collect();
        let narrow = match narrow {
            Some(width) => format!(
                "its owner column holds {width} bytes, fewer than the {} an owner id can take; ",
                sql::OWNER_COLUMN_WIDTH
            ),
            None => String::new(),
        };
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "the lock table on {endpoint} was made by an earlier version: {narrow}run {}",
                run.join(" and ")
            ),
        ));
    }
    for fix in fixes {
        conn.execute(AssertSqlSafe(fix.clone()))
            .await
            .map_err(fail("updating the lock table to this version"))?;
    }
    for check in [&sql.check_locks, &sql.check_fencing] {
        conn.execute(AssertSqlSafe(check.clone()))
            .await
            .map_err(|e| {
                map_error(
                    e,
                    &format!(
                        "checking the lock tables on {endpoint} (created with the DDL in the \
                     distlock-mysql docs?)"
                    ),
                )
            })?;
    }
    let version: String = sqlx::query_scalar(sql::VERSION)
        .fetch_one(&mut conn)
        .await
        .map_err(fail("reading the server version"))?;
    // A failed goodbye does not make the session we just used any less proven.
    let _ = conn.close().await;
    Ok(version)
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

    /// One acquire attempt within the operation timeout.
    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        let mut conn = self.lend(&self.pool, &req.name).await?;
        let outcome =
            tokio::time::timeout(self.operation_timeout, self.attempt_on(&mut conn, req)).await;
        conn.finish(outcome)
            .unwrap_or_else(|| Err(self.timed_out("acquiring", &req.name)))
    }

    /// One acquire attempt: read the row, then try the one conditional write that fits what
    /// was read. The write re-checks everything it relies on, on the server, so a row that
    /// changed in between only costs another round.
    async fn attempt_on(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
    ) -> Result<Attempt> {
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let owner = owner_text.as_bytes();
        let ttl_us = micros(req.ttl);
        // A name not known to be held: the whole fresh grant in one request. If a row is
        // there after all, what it says is read in the request that ends the transaction.
        let mut read_already = None;
        if self.hints.likely_free(name) {
            match self.grant_in_one(conn, req, ttl_us).await {
                Ok(Ok(grant)) => return Ok(self.granted(grant, true)),
                Ok(Err(row)) => read_already = Some(row),
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(self.err("acquiring", &req.name)(e)),
            }
        }
        for _ in 0..MAX_ROUNDS {
            let row = match read_already.take() {
                Some(row) => row,
                None => self
                    .read(conn, name)
                    .await
                    .map_err(self.err("reading the lock row", &req.name))?,
            };
            let mut fresh = false;
            let outcome = match row {
                Some(r) if r.remaining_us > 0 && r.owner == owner => {
                    self.join(conn, req, r.token, ttl_us).await
                }
                Some(r) if r.remaining_us > 0 => {
                    let left = Duration::from_micros(r.remaining_us.unsigned_abs());
                    self.hints.held(name, left);
                    return Ok(Attempt::Held {
                        expires_in: Some(left),
                    });
                }
                seen => {
                    fresh = true;
                    self.grant_fresh(conn, req, seen.is_some(), ttl_us).await
                }
            };
            match outcome {
                Ok(Some(grant)) => return Ok(self.granted(grant, fresh)),
                Ok(None) => continue,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(self.err("acquiring", &req.name)(e)),
            }
        }
        // Others kept changing the row under us: it is contended, so report it held.
        Ok(Attempt::Held { expires_in: None })
    }

    /// The bookkeeping of a grant: the release signal of a fresh one, and the name remembered
    /// as held.
    fn granted(&self, grant: Grant, fresh: bool) -> Attempt {
        if let (true, Some(signals)) = (fresh, &self.signals) {
            signals.granted(&grant.name, grant.token.0);
        }
        self.hints.held(grant.name.as_str().as_bytes(), grant.ttl);
        Attempt::Granted(grant)
    }

    async fn read(&self, conn: &mut MySqlConnection, name: &[u8]) -> sqlx::Result<Option<LockRow>> {
        let row = sqlx::query(AssertSqlSafe(self.sql.read.clone()))
            .bind(name)
            .fetch_optional(&mut *conn)
            .await?;
        row.as_ref().map(lock_row).transpose()
    }

    /// A fresh grant of a name that is likely free, in one request ([`Statements::grant_in_one`]):
    /// `Ok(Ok(grant))`, or `Ok(Err(row))` with the row that was there after all (read in the
    /// request that rolled the transaction back, so the counter is as it was). Any other error
    /// also rolls back (a lock wait timeout ends only the statement), so the connection goes
    /// back without a transaction left open.
    async fn grant_in_one(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
        ttl_us: u64,
    ) -> sqlx::Result<std::result::Result<Grant, Option<LockRow>>> {
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let sql = self.sql.grant_in_one(name, owner_text.as_bytes(), ttl_us);
        let sent_at = Instant::now();
        let granted = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await;
        match granted {
            Ok(rows) => {
                let token: u64 = match rows.first() {
                    Some(row) => row.try_get(0)?,
                    None => {
                        return Err(sqlx::Error::Protocol(
                            "the one-request grant returned no token".into(),
                        ))
                    }
                };
                Ok(Ok(grant(req, FencingToken(token), 1, sent_at)))
            }
            Err(e) if is_duplicate(&e) => {
                let rows = sqlx::raw_sql(AssertSqlSafe(self.sql.rollback_and_read(name)))
                    .fetch_all(&mut *conn)
                    .await?;
                Ok(Err(rows.first().map(lock_row).transpose()?))
            }
            Err(e) => {
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                Err(e)
            }
        }
    }

    /// A reentrant acquire: one more hold of the live grant with `token`, if it is still there.
    async fn join(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
        token: u64,
        ttl_us: u64,
    ) -> sqlx::Result<Option<Grant>> {
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let owner = owner_text.as_bytes();
        let sent_at = Instant::now();
        let done = sqlx::query(AssertSqlSafe(self.sql.join.clone()))
            .bind(ttl_us)
            .bind(name)
            .bind(owner)
            .bind(token)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        let holds = u32::try_from(last_insert_id(&mut *conn, &done).await?).map_err(|_| {
            sqlx::Error::Protocol("the joined hold count does not fit 32 bits".into())
        })?;
        Ok(Some(grant(req, FencingToken(token), holds, sent_at)))
    }

    /// A fresh grant, in one transaction: bump the name's fencing counter, then insert the row
    /// (`expired` false: none was seen) or take over the expired one. If the write matches
    /// nothing, the transaction is rolled back and the counter with it, so a failed attempt
    /// issues no token.
    async fn grant_fresh(
        &self,
        conn: &mut MySqlConnection,
        req: &AcquireRequest,
        expired: bool,
        ttl_us: u64,
    ) -> sqlx::Result<Option<Grant>> {
        let name = req.name.as_str().as_bytes();
        let owner_text = req.owner.text();
        let owner = owner_text.as_bytes();
        let mut tx = conn.begin().await?;
        let result: sqlx::Result<Option<(u64, Instant)>> = async {
            let bumped = sqlx::query(AssertSqlSafe(self.sql.bump_fencing.clone()))
                .bind(name)
                .execute(&mut *tx)
                .await?;
            let token = last_insert_id(&mut tx, &bumped).await?;
            let sent_at = Instant::now();
            let wrote = if expired {
                sqlx::query(AssertSqlSafe(self.sql.takeover.clone()))
                    .bind(owner)
                    .bind(token)
                    .bind(ttl_us)
                    .bind(name)
                    .execute(&mut *tx)
                    .await
                    .map(|d| d.rows_affected() == 1)?
            } else {
                match sqlx::query(AssertSqlSafe(self.sql.insert.clone()))
                    .bind(name)
                    .bind(owner)
                    .bind(token)
                    .bind(ttl_us)
                    .execute(&mut *tx)
                    .await
                {
                    Ok(_) => true,
                    // Inserted by someone else since our read: read again.
                    Err(e) if is_duplicate(&e) => false,
                    Err(e) => return Err(e),
                }
            };
            Ok(wrote.then_some((token, sent_at)))
        }
        .await;
        match result {
            Ok(Some((token, sent_at))) => {
                tx.commit().await?;
                Ok(Some(grant(req, FencingToken(token), 1, sent_at)))
            }
            Ok(None) => {
                tx.rollback().await?;
                Ok(None)
            }
            Err(e) => {
                // After a deadlock the server has rolled back already; after a lock wait
                // timeout only the statement was. Either way end the transaction here rather
                // than leave it to the connection's next user.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    /// A release within the operation timeout.
    async fn release(&self, g: &Grant) -> Result<bool> {
        let released = async {
            let mut conn = self.lend(&self.holders, &g.name).await?;
            let outcome =
                tokio::time::timeout(self.operation_timeout, self.release_on(&mut conn, g)).await;
            conn.finish(outcome)
                .unwrap_or_else(|| Err(self.timed_out("releasing", &g.name)))
        }
        .await;
        // Unless one hold of several was let go, the next attempt on the name most likely finds
        // it free (whatever the answer: the hint only picks which request an attempt sends
        // first).
        if !matches!(released, Ok(Released::OneOfSeveral)) {
            self.hints.released(g.name.as_str().as_bytes());
        }
        // The grant is gone unless one hold of several was let go: its signal goes too (also
        // when the answer was lost; a waiter woken in vain looks at the row and waits again).
        if let Some(signals) = &self.signals {
            if !matches!(released, Ok(Released::OneOfSeveral)) {
                signals.released(&g.name, g.token.0);
            }
        }
        released.map(|r| r != Released::NotHeld)
    }

    /// A hand-over within the operation timeout, on a connection of the releasing pool, and its
    /// bookkeeping.
    ///
    /// The release signal: a hand-over does not free the name, so the companion lock that the
    /// signal session took for `from` is not let go (that would wake waiters of other clients
    /// as if the lock were free, only for them to find it held again). It is moved to the new
    /// grant instead, with no request: the companion lock is the session's, keyed here by
    /// token, and the new grant's release lets it go as any grant's would. The client's count
    /// of its own holds of the name is unchanged (one grant ended, one began), so its waiters
    /// keep waiting through the handle. A hand-over that only gave up one hold of several
    /// changes nothing here, like such a release; one that found `from` gone, or whose outcome
    /// is unknown, is bookkept like a release that did (the core then settles the rest with a
    /// release of `from` and a give-back of `to`, which let go of whatever is left).
    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        let done = async {
            let mut conn = self.lend(&self.holders, &from.name).await?;
            let outcome = tokio::time::timeout(
                self.operation_timeout,
                self.hand_over_on(&mut conn, from, to),
            )
            .await;
            conn.finish(outcome)
                .unwrap_or_else(|| Err(self.timed_out("handing over", &from.name)))
        }
        .await;
        let name = from.name.as_str().as_bytes();
        match &done {
            Ok(Ok(g)) => {
                self.hints.held(name, g.ttl);
                if let Some(signals) = &self.signals {
                    signals.handed(&from.name, from.token.0, g.token.0);
                }
            }
            Ok(Err(Released::OneOfSeveral)) => {}
            Ok(Err(Released::Last | Released::NotHeld)) | Err(_) => {
                self.hints.released(name);
                if let Some(signals) = &self.signals {
                    signals.released(&from.name, from.token.0);
                }
            }
        }
        Ok(match done? {
            Ok(g) => HandOver::Handed(g),
            Err(released) => HandOver::Released(released != Released::NotHeld),
        })
    }

    /// The common case first (`HAND_OVER_LAST` in `sql.rs`): the last hold of a grant that
    /// still holds the lock passes in one request. Otherwise (one hold of several, not held,
    /// a race) the full hand-over, which tells those cases apart, in a second request that
    /// begins with the rollback of the first; sent again (rolled back in the same way) while
    /// it loses a race to another change of the row, and after [`MAX_ROUNDS`] of them, a plain
    /// release. `Ok(grant)` when handed over, else what the release did.
    async fn hand_over_on(
        &self,
        conn: &mut MySqlConnection,
        from: &Grant,
        to: &AcquireRequest,
    ) -> Result<std::result::Result<Grant, Released>> {
        let from_owner = from.owner.text();
        let to_owner = to.owner.text();
        let (last, full) = self.sql.hand_over(
            from.name.as_str().as_bytes(),
            from_owner.as_bytes(),
            from.token.0,
            to_owner.as_bytes(),
            micros(to.ttl),
        );
        let fail = || self.err("handing over", &from.name);
        let sent_at = Instant::now();
        // Whether the transaction may still be open (a guard or lock conflict stopped the
        // batch, the counter perhaps bumped): rolled back at the start of the next request.
        let mut open = match sqlx::raw_sql(AssertSqlSafe(last))
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => {
                let token: u64 = match rows.first() {
                    Some(row) => row.try_get(0).map_err(fail())?,
                    None => {
                        return Err(fail()(sqlx::Error::Protocol(
                            "the hand-over returned no token".into(),
                        )))
                    }
                };
                if token > 0 {
                    return Ok(Ok(grant(to, FencingToken(token), 1, sent_at)));
                }
                // No counter row, so nothing was done: the full hand-over decides.
                false
            }
            Err(e) if is_duplicate(&e) || is_conflict(&e) => true,
            Err(e) => {
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                return Err(fail()(e));
            }
        };
        let rollback_and_full = format!("ROLLBACK; {full}");
        for _ in 0..MAX_ROUNDS {
            let sent_at = Instant::now();
            let sql = if open { &rollback_and_full } else { &full };
            let answer = sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                .fetch_all(&mut *conn)
                .await;
            let rows = match answer {
                Ok(rows) => rows,
                // The guard (a token taken, the row not passed on) or a lock conflict: the
                // server ran nothing after it, and the transaction may still be open with the
                // counter bumped. Rolled back (so no token is burned), then tried again.
                Err(e) if is_duplicate(&e) || is_conflict(&e) => {
                    open = true;
                    continue;
                }
                Err(e) => {
                    let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                    return Err(fail()(e));
                }
            };
            open = false;
            let read = |row: &MySqlRow| -> sqlx::Result<(u64, i64, Option<i64>)> {
                Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
            };
            let (token, one_of_several, live) = match rows.first() {
                Some(row) => read(row).map_err(fail())?,
                None => {
                    return Err(fail()(sqlx::Error::Protocol(
                        "the hand-over returned no outcome".into(),
                    )))
                }
            };
            if token > 0 {
                return Ok(Ok(grant(to, FencingToken(token), 1, sent_at)));
            }
            if one_of_several == 1 {
                return Ok(Err(Released::OneOfSeveral));
            }
            if live != Some(1) {
                return Ok(Err(Released::NotHeld));
            }
            // Still held live by `from`, yet neither passed on nor one hold given up: its hold
            // count moved across 1 between the statements. Try again.
        }
        if open {
            sqlx::raw_sql("ROLLBACK")
                .execute(&mut *conn)
                .await
                .map_err(fail())?;
        }
        // Kept losing races (or the name's counter row is gone, so no token can be taken):
        // release as a release would.
        self.release_on(conn, from).await.map(Err)
    }

    async fn release_on(&self, conn: &mut MySqlConnection, g: &Grant) -> Result<Released> {
        let name = g.name.as_str().as_bytes();
        let owner_text = g.owner.text();
        let owner = owner_text.as_bytes();
        let token = g.token.0;
        let fail = || self.err("releasing", &g.name);
        let exec = |sql: &Arc<str>| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(name)
                .bind(owner)
                .bind(token)
        };
        for _ in 0..MAX_ROUNDS {
            let step: sqlx::Result<Option<Released>> = async {
                if exec(&self.sql.release_last)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1
                {
                    return Ok(Some(Released::Last));
                }
                if exec(&self.sql.release_one)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1
                {
                    return Ok(Some(Released::OneOfSeveral));
                }
                let live: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.sql.probe.clone()))
                    .bind(name)
                    .bind(owner)
                    .bind(token)
                    .fetch_optional(&mut *conn)
                    .await?;
                match live {
                    None => Ok(Some(Released::NotHeld)),
                    Some(0) => {
                        exec(&self.sql.clear_expired).execute(&mut *conn).await?;
                        Ok(Some(Released::NotHeld))
                    }
                    // Still live: another hold of this owner moved the count across 1 between
                    // our two statements. Try again.
                    Some(_) => Ok(None),
                }
            }
            .await;
            match step {
                Ok(Some(held)) => return Ok(held),
                Ok(None) => continue,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(fail()(e)),
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "release kept racing with other holds of the same owner",
        )
        .with_backend(BACKEND)
        .with_lock(&g.name)
        .temporary(true))
    }

    async fn renew(&self, g: &Grant, ttl: Duration) -> Result<Duration> {
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

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let mut conn = self.lend(&self.pool, name).await?;
        let read = sqlx::query(AssertSqlSafe(self.sql.inspect.clone()))
            .bind(name.as_str().as_bytes())
            .fetch_optional(&mut *conn);
        let outcome = tokio::time::timeout(self.operation_timeout, read).await;
        let row = conn
            .finish(outcome)
            .ok_or_else(|| self.timed_out("reading the lock row", name))?
            .map_err(self.err("reading the lock row", name))?;
        match row {
            Some(row) => info_of(&row, 0, name),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let what = || format!("listing the locks on {}", self.endpoint);
        let mut conn = Lent::from(&self.pool)
            .await
            .map_err(|e| map_error(e, &what()))?;
        let read = sqlx::query(AssertSqlSafe(self.sql.list.clone()))
            .bind(prefix.as_bytes())
            .bind(prefix.len() as u64)
            .bind(prefix.as_bytes())
            .fetch_all(&mut *conn);
        let rows = match tokio::time::timeout(self.operation_timeout, read).await {
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
            if let Some(info) = info_of(&row, 1, &name)? {
                held.push((name, info));
            }
        }
        Ok(held)
    }

    /// Deletes expired rows in batches until a batch comes back short, on one connection; each
    /// statement within the operation timeout.
    async fn sweep(&self) -> Result<u64> {
        let what = || format!("sweeping expired rows on {}", self.endpoint);
        let mut conn = Lent::from(&self.pool)
            .await
            .map_err(|e| map_error(e, &what()))?;
        let mut total = 0;
        loop {
            let statement = sqlx::query(AssertSqlSafe(self.sql.sweep.clone()))
                .bind(self.sweep_batch)
                .execute(&mut *conn);
            let Ok(deleted) = tokio::time::timeout(self.operation_timeout, statement).await else {
                // `conn` is closed on return, ending the statement on the server too.
                return Err(timed_out(&what(), self.operation_timeout));
            };
            let deleted = match deleted {
                Ok(d) => d.rows_affected(),
                // Lost a lock race with an acquire or renewal; the next sweep catches up.
                Err(e) if is_conflict(&e) => 0,
                Err(e) => {
                    conn.give_back_after_error();
                    return Err(map_error(e, &what()));
                }
            };
            total += deleted;
            self.swept.fetch_add(deleted, Ordering::Relaxed);
            if deleted < u64::from(self.sweep_batch) {
                conn.give_back();
                return Ok(total);
            }
            // Let acquires and renewals queued behind this batch's row locks go first.
            tokio::task::yield_now().await;
        }
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

async fn sweep_loop(inner: Arc<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = inner.sweep().await {
            tracing::warn!(error = %e, "distlock-mysql: sweeping expired locks failed");
        }
    }
}

/// The value the statement just run set with `LAST_INSERT_ID(expr)`: from its OK packet, or,
/// where the packet does not carry it, from this session's own `LAST_INSERT_ID()`.
/// A row of [`sql::READ`]'s columns.
fn lock_row(row: &MySqlRow) -> sqlx::Result<LockRow> {
    Ok(LockRow {
        owner: row.try_get(0)?,
        token: row.try_get(1)?,
        remaining_us: row.try_get(2)?,
    })
}

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
/// hold count, token, µs of lease left and the grant's time in ms since the epoch. `None` when
/// the lease has run out.
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
    let info = LockInfo::new(
        owner,
        row.try_get(at + 1).map_err(bad)?,
        FencingToken(row.try_get(at + 2).map_err(bad)?),
        Some(Duration::from_micros(remaining_us.unsigned_abs())),
    );
    Ok(Some(match since_ms {
        Some(ms) => info.with_since_unix_ms(ms),
        None => info,
    }))
}
