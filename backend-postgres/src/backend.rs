//! [`PostgresLock`]: the client handle, its connect, and the trait impl that forwards to the
//! server operations of [`crate::ops`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::wait::{Attempt, Backoff, Notices, Waiting};
use distlock_api::backend::{async_trait, AcquireRequest, ClientCore, Surplus};
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, ErrorKind, Fencing, FencingToken, Grant,
    LeaseKind, LockInfo, LockName, Profile, Result, TtlSupport,
};
use sqlx::postgres::PgPool;
use tokio::task::JoinHandle;

use crate::advisory::sql::AdvisoryStatements;
use crate::advisory::{Advisory, Setup};
use crate::config::{Mode, PostgresConfig};
use crate::notices::Listener;
use crate::ops::{Inner, Pool};
use crate::schema::prepare;
use crate::sql::Statements;
use crate::sweep::sweep_loop;
use crate::BACKEND;

/// What the PostgreSQL backend promises (table mode).
pub const CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Notify)
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

/// What the PostgreSQL backend promises in advisory mode (`mode=advisory`): session advisory
/// locks whose lease is the client's session, bounded by `session_timeout` (min 1 s).
pub const ADVISORY_CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Notify)
    .ttl(TtlSupport::new(
        LeaseKind::Session,
        Duration::from_secs(1),
        Duration::from_millis(1),
    ))
    .fair(false)
    .fencing(Fencing::Durable)
    .renewal(true)
    .semaphore(false)
    .election(true);

/// How many grants one renewal statement confirms at most.
const RENEW_BATCH: usize = 128;

/// A client of the PostgreSQL lock table: two connection pools (acquiring and reading;
/// renewing and releasing), one listener session for notices (opened at the first wait), one
/// owner id, one watchdog, and (if configured) one sweeper task.
///
/// Every operation is one statement judged by the server's clock (`clock_timestamp()`); see
/// the crate docs for the algorithm and its safety model.
pub struct PostgresLock {
    inner: Arc<Inner>,
    core: ClientCore,
    sweeper: Option<JoinHandle<()>>,
}

impl PostgresLock {
    /// Connects to the server, creates both tables if they do not exist (unless turned off),
    /// checks their columns, and starts the sweeper if the config asks for it.
    ///
    /// Bad config is `InvalidArgument` before any I/O; a server that cannot be reached within
    /// the connect timeout is `Unavailable`; a server that refuses (wrong password, missing
    /// privilege, incompatible table) is `Backend`.
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        let mut core = ClientCore::new(BACKEND)
            .with_default_ttl(config.get_default_ttl())
            .map_err(|e| e.with_backend(BACKEND))?;
        if let Some(owner) = config.get_owner() {
            core = core.with_owner(owner.clone());
        }
        let sql = Statements::new(config.get_lock_table(), config.get_fencing_table());
        #[cfg(feature = "tls")]
        distlock_api::backend::ensure_crypto_provider();
        let mut options = config.connect_options();
        if !config.get_statement_cache() {
            options = options.statement_cache_capacity(0);
        }
        let endpoint = config.endpoint();
        let timeout = config.get_connect_timeout();
        let advisory_sql = (config.get_mode() == Mode::Advisory)
            .then(|| AdvisoryStatements::new(config.get_lock_table(), config.get_fencing_table()));
        let server_version = tokio::time::timeout(
            timeout,
            prepare(
                &options,
                &sql,
                advisory_sql.as_ref(),
                config.get_create_tables(),
                &endpoint,
            ),
        )
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Unavailable,
                format!(
                    "no PostgreSQL session with {endpoint} within the connect timeout of \
                     {timeout:?}"
                ),
            )
            .with_backend(BACKEND)
        })??;
        let pool = || Pool::connect_lazy(options.clone(), config.get_pool_size(), timeout);
        let channel = format!("{}_released", config.get_lock_table());
        let listener = config.get_notices().then(|| {
            Listener::new(
                channel.clone(),
                options.clone(),
                timeout,
                config.get_backoff(),
            )
        });
        let advisory = advisory_sql.map(|sql| {
            Advisory::new(Setup {
                options: options.clone(),
                sql,
                bound: config.get_session_timeout(),
                operation_timeout: config.get_operation_timeout(),
                connect_timeout: timeout,
                endpoint: endpoint.clone(),
                channel: channel.clone(),
            })
        });
        if let Some(advisory) = &advisory {
            advisory.open().await?;
        }
        let inner = Arc::new(Inner {
            pool: config
                .get_pool()
                .map(|p| Pool::given(p.clone()))
                .unwrap_or_else(pool),
            holders: pool(),
            sql,
            endpoint,
            operation_timeout: config.get_operation_timeout(),
            persistent: config.get_statement_cache(),
            sweep_batch: config.get_sweep_batch(),
            swept: AtomicU64::new(0),
            server_version,
            channel,
            listener,
            backoff: config.get_backoff(),
            advisory,
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

    /// The server's version (`SHOW server_version`), e.g. `15.18 (Debian 15.18-0+deb12u1)`.
    pub fn server_version(&self) -> &str {
        &self.inner.server_version
    }

    /// The client's connection pool (the one given to
    /// [`PostgresConfig::from_pool`], if any), for statements of your own.
    pub fn pool(&self) -> &PgPool {
        self.inner.pool.sqlx()
    }

    /// Deletes every expired row now, in batches, and returns how many it deleted. Never
    /// deletes a live row. The background sweeper runs the same code.
    pub async fn sweep_now(&self) -> Result<u64> {
        self.inner.sweep().await
    }

    /// How many expired rows this client's sweeps have deleted so far.
    pub fn rows_swept(&self) -> u64 {
        self.inner.swept.load(Ordering::Relaxed)
    }

    /// The channel releases notify on: the lock table's name with `_released`.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// Whether this client's listener listens now (test-only).
    #[cfg(feature = "testing")]
    pub fn listening(&self) -> bool {
        self.inner
            .listener
            .as_ref()
            .is_some_and(Listener::listening)
    }

    /// The holders' pool, the lock, permit and advisory tables' names, and the channel, for
    /// the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) fn admin_parts(&self) -> (&PgPool, [&str; 2], String, &str) {
        (
            self.inner.holders.sqlx(),
            [&self.inner.sql.locks, &self.inner.sql.permits],
            crate::advisory::sql::advisory_table(&self.inner.sql.locks),
            &self.inner.channel,
        )
    }
}

impl Drop for PostgresLock {
    fn drop(&mut self) {
        if let Some(sweeper) = self.sweeper.take() {
            sweeper.abort();
        }
    }
}

impl std::fmt::Debug for PostgresLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLock")
            .field("endpoint", &self.inner.endpoint)
            .field("server_version", &self.inner.server_version)
            .field("owner", self.core.owner())
            .field("sweeper", &self.sweeper.is_some())
            .field("notices", &self.inner.listener.is_some())
            .finish()
    }
}

#[async_trait]
impl DistributedLock for PostgresLock {
    fn profile(&self) -> Profile {
        // With notices, waiters attempt again on each release of the name (and at the holder's
        // expiry, a crashed holder sending none); without, they poll with the backoff.
        let declared = match &self.inner.advisory {
            Some(a) => ADVISORY_CAPABILITIES.ttl(TtlSupport::new(
                LeaseKind::Session,
                a.bound(),
                Duration::from_millis(1),
            )),
            None => CAPABILITIES,
        };
        let (capabilities, waiting) = match self.inner.listener {
            Some(_) => (declared, Waiting::Notify),
            None => {
                let (base, cap) = self.inner.backoff;
                (
                    declared.blocking(Blocking::Poll),
                    Waiting::Poll(Backoff::new(base, cap)),
                )
            }
        };
        Profile::new(capabilities)
            .waiting(waiting)
            .renew_batch(RENEW_BATCH)
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        match &self.inner.advisory {
            Some(a) => a.attempt(req).await,
            None => self.inner.attempt(req).await,
        }
    }

    /// `LISTEN` on the lock table's channel (one session per client, opened at the first
    /// wait); `Unsupported` with notices off.
    async fn subscribe(&self, name: &LockName) -> Result<Box<dyn Notices>> {
        match &self.inner.listener {
            Some(listener) => Ok(Box::new(listener.subscribe(name).await)),
            None => Err(
                Error::new(ErrorKind::Unsupported, "notices are off for this client")
                    .with_backend(BACKEND),
            ),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        match &self.inner.advisory {
            Some(a) => a.release(grant).await,
            None => self.inner.release(grant).await,
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        let mut results = self.renew_many(&[(grant.clone(), ttl)]).await;
        results.pop().expect("one result per grant")
    }

    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        match &self.inner.advisory {
            Some(a) => a.renew_many(&self.core, grants).await,
            None => self.inner.renew_many(grants).await,
        }
    }

    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        match &self.inner.advisory {
            Some(a) => a.proclaim(&self.inner.holders, grant, value).await,
            None => self.inner.proclaim(grant, value).await,
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        match &self.inner.advisory {
            Some(a) => a.inspect(&self.inner.pool, name).await,
            None => self.inner.inspect(name).await,
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        match &self.inner.advisory {
            Some(a) => a.list(&self.inner.pool, prefix).await,
            None => self.inner.list(prefix).await,
        }
    }

    /// A semaphore's permit by its token (one transaction), a lock's grant by its releases;
    /// in advisory mode, the grant's row (its holder unlocks at its next probe).
    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        if let Some(a) = &self.inner.advisory {
            return a.force_release(&self.inner.holders, name, token).await;
        }
        match self.inner.inspect(name).await? {
            None => Ok(false),
            Some(info) if info.permits.1 > 1 => {
                self.inner
                    .force_release_permit(name, info.owner, token, info.permits.1)
                    .await
            }
            Some(_) => distlock_api::backend::force_release_by_releases(self, name, token).await,
        }
    }

    /// The owner's permit of the name if it has one, else the lock's way.
    async fn give_back(&self, surplus: &Surplus) -> Result<bool> {
        if let Some(a) = &self.inner.advisory {
            return a.give_back(&self.core, surplus).await;
        }
        match self.inner.give_back_permit(&self.core, surplus).await? {
            Some(given) => Ok(given),
            None => distlock_api::backend::give_back_by_release(self, surplus).await,
        }
    }
}
