//! [`MysqlLock`]: the client handle, its connect, and the trait impl that forwards to the
//! server operations of [`crate::ops`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::wait::{Attempt, Backoff, HandOver, Notices, Waiting};
use distlock_api::backend::{async_trait, AcquireRequest, ClientCore};
use distlock_api::Profile;
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, ErrorKind, Fencing, Grant, LeaseKind, LockInfo,
    LockName, Result, TtlSupport,
};
use sqlx::mysql::MySqlPool;
use tokio::task::JoinHandle;

use crate::config::MysqlConfig;
use crate::conn::Pool;
use crate::hint::Hints;
use crate::notices::Signals;
use crate::ops::Inner;
use crate::renewal::Renewals;
use crate::schema::prepare;
use crate::sql::Statements;
use crate::sweep::sweep_loop;
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
    .renewal(true)
    .semaphore(true)
    .election(true);

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

impl MysqlLock {
    /// The pool and the lock and permit tables' names, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) fn admin_parts(&self) -> (&sqlx::MySqlPool, [&str; 2]) {
        let sql = &self.inner.sql;
        (self.inner.pool.sqlx(), [&sql.locks, &sql.permit.table])
    }
}

impl MysqlLock {
    /// Connects to the server, creates the three tables if they do not exist (unless turned off),
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
    fn profile(&self) -> Profile {
        let capabilities = match self.inner.signals {
            Some(_) => CAPABILITIES,
            None => CAPABILITIES.blocking(Blocking::Poll),
        };
        // Polls with the configured backoff; held answers carry the holder's remaining lease,
        // so a waiter wakes no later than the holder's expiry even when the step is longer.
        // With release signals on, a waiter that found the lock held waits for the holder's
        // signal instead. A release through this handle passes the lock straight to a waiting
        // task of the same handle: one request instead of a release and the next attempt.
        let (base, cap) = self.inner.backoff;
        Profile::new(capabilities)
            .waiting(Waiting::Poll(Backoff::new(base, cap)))
            .hands_over(true)
    }

    async fn force_release(
        &self,
        name: &distlock_api::LockName,
        token: distlock_api::FencingToken,
    ) -> distlock_api::Result<bool> {
        // A permit goes by one conditional delete; a lock by its releases.
        if self.inner.force_release_permit(name, token).await? {
            return Ok(true);
        }
        distlock_api::backend::force_release_by_releases(self, name, token).await
    }

    async fn give_back(
        &self,
        surplus: &distlock_api::backend::Surplus,
    ) -> distlock_api::Result<bool> {
        // By the owner's own permit, which inspect (the oldest permit) may not show.
        let (name, owner, ttl) = (&surplus.name, &surplus.owner, surplus.ttl);
        match self.inner.own_permit(name, owner, ttl).await? {
            Some(g) if self.core.has_surplus(surplus, g.hold_count) => self.inner.release(&g).await,
            Some(_) => Ok(false),
            None => distlock_api::backend::give_back_by_release(self, surplus).await,
        }
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.inner.attempt(req).await
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

    /// One conditional `UPDATE` of the grant's row (`PROCLAIM` in `sql.rs`): the value and the
    /// grant's token, if the grant's owner and token hold the row live by the server's clock.
    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        self.inner.proclaim(grant, value).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        self.inner.list(prefix).await
    }
}
