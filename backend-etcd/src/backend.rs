//! [`EtcdLock`]: the lock algorithm over one kept-alive lease per client. The queue is in
//! [`crate::queue`], the client's holds in [`crate::holds`], the lease in [`crate::lease`] and
//! [`crate::keepalive`].
//!
//! A contender creates its key `<prefix>/<name>/<lease>-<owner>` in a transaction that only
//! succeeds if the key is absent, attached to the client's lease. The key with the lowest
//! create-revision under the name's directory holds the lock; every other key waits for the
//! delete of the key created just before it (FIFO, no herd) and then looks again, because that
//! predecessor may have been a waiter who gave up rather than the holder. The holder key's
//! create-revision is the fencing token; release and renew are transactions conditioned on it.
//! A semaphore's permit is an entry of the same queue that holds while fewer than `max` entries
//! are older ([`crate::permits`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::backend::wait::{self, Attempt, Waiting};
use distlock_api::backend::{AcquireRequest, ClientCore};
use distlock_api::Profile;
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, Fencing, FencingToken, Grant, LeaseKind,
    LockInfo, LockName, LostReason, Result, TtlSupport,
};
use etcd_client::{Client, ConnectOptions};
use tokio::task::JoinHandle;

use crate::config::EtcdConfig;
use crate::endpoints::Endpoints;
use crate::holds::{lock, Shared};
use crate::lease::{self, LeaseCell};
use crate::BACKEND;

/// How many locks the watchdog confirms with one transaction (etcd allows 128 operations per
/// branch by default).
const RENEW_BATCH: usize = 64;

/// What the etcd backend promises.
///
/// The lease minimum is etcd's with default server settings (1.5 × the 1 s election timeout,
/// rounded up to whole seconds); a server configured otherwise grants its own, which every
/// grant reports.
pub const CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Notify)
    .ttl(TtlSupport::new(
        LeaseKind::Session,
        Duration::from_secs(2),
        Duration::from_secs(1),
    ))
    .fair(true)
    .fencing(Fencing::Durable)
    .renewal(true)
    .semaphore(true)
    .election(true);

/// HTTP/2 pings on the connection, so a silently dead peer is noticed and the channel moves
/// to another endpoint. etcd's default `--grpc-keepalive-min-time` is 5 s; pinging more often
const HTTP2_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(5));

/// A client of an etcd cluster: one connection (balanced over the configured endpoints), one
/// lease kept alive in the background, and the state of the locks its owners hold.
///
/// Dropping it stops the keep-alive and revokes the lease in the background (which deletes
/// every key it still has); [`close`](EtcdLock::close) does the same and waits for it.
pub struct EtcdLock {
    shared: Arc<Shared>,
    keeper: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLock")
            .field("endpoints", &self.shared.config.endpoints)
            .field("lease_id", &self.lease_id())
            .field("owner", self.shared.core.owner())
            .finish_non_exhaustive()
    }
}

impl EtcdLock {
    /// Connects to the cluster and is granted the client's lease, all within the config's
    /// connect timeout: an unreachable cluster is
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) after it, never a hang.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        // Each endpoint gets its share of the connect timeout, so one that swallows packets
        // leaves time to try the others.
        let endpoints = u32::try_from(config.endpoints.len()).unwrap_or(u32::MAX);
        let per_endpoint =
            (config.client.connect_timeout / endpoints).max(Duration::from_millis(10));
        let mut options = ConnectOptions::new()
            .with_connect_timeout(per_endpoint)
            .with_keep_alive(HTTP2_KEEPALIVE.0, HTTP2_KEEPALIVE.1);
        if let Some((user, password)) = &config.user {
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        let endpoints = match &config.given {
            Some(client) => Endpoints::given(config.endpoints[0].clone(), client.clone()),
            None => Endpoints::new(config.endpoints.clone(), options),
        };
        let ttl_secs = config.lease_ttl_secs();
        let info = endpoints
            .call(
                "connecting and being granted a lease",
                config.client.connect_timeout,
                |client| lease::grant(client, ttl_secs),
            )
            .await
            .and_then(lease::granted)
            .map_err(|e| e.with_backend(BACKEND))?;
        let mut core = ClientCore::new(BACKEND).with_default_ttl(info.ttl)?;
        if let Some(owner) = &config.client.owner {
            core = core.with_owner(owner.clone());
        }
        let shared = Arc::new(Shared {
            core,
            endpoints,
            config,
            lease: LeaseCell::new(info),
            slots: Mutex::new(HashMap::new()),
            watches: Arc::default(),
            released: Mutex::default(),
            #[cfg(feature = "testing")]
            requests: Default::default(),
        });
        let keeper = tokio::spawn(crate::keepalive::keep_alive(Arc::downgrade(&shared)));
        Ok(Self {
            shared,
            keeper: Mutex::new(Some(keeper)),
        })
    }

    /// The id of the client's lease; `None` while a lost lease is being replaced, or after
    /// [`close`](EtcdLock::close).
    pub fn lease_id(&self) -> Option<i64> {
        self.shared.lease.current().ok().map(|l| l.id)
    }

    /// The TTL the server granted the client's lease (etcd raises short requests to its
    /// minimum); every grant reports it as its lease.
    pub fn lease_ttl(&self) -> Option<Duration> {
        self.shared.lease.current().ok().map(|l| l.ttl)
    }

    /// The client's state, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// How many lock directories this client's waiters watch right now (test-only).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn watched_dirs(&self) -> usize {
        self.shared.watches.live()
    }

    /// How many key-value and lease requests this client has sent, keep-alives and watches
    /// aside (test-only).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn requests_sent(&self) -> u64 {
        self.shared
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &EtcdConfig {
        &self.shared.config
    }

    /// Stops the keep-alive, fires `lost()` on every guard of this client, and revokes the
    /// lease, which deletes every key the client still has: its locks are free, its waiters
    /// leave their queues. Later acquires fail with a non-temporary
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable). Idempotent.
    pub async fn close(&self) -> Result<()> {
        if let Some(task) = lock(&self.keeper).take() {
            task.abort();
        }
        let id = self.shared.lease.close();
        self.shared.core.mark_lost(|_| true, LostReason::ClientGone);
        let Some(id) = id else { return Ok(()) };
        let revoked = self
            .shared
            .call("revoking the lease", |c| async move {
                c.lease_client().revoke(id).await
            })
            .await;
        match revoked {
            Err(e) if e.message().contains("lease not found") => Ok(()),
            r => r.map(drop).map_err(|e| e.with_backend(BACKEND)),
        }
    }
}

impl Drop for EtcdLock {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.keeper).take() {
            task.abort();
        }
        // Without a runtime there is nothing to revoke on; the lease expires after its TTL.
        if let (Some(id), Ok(rt)) = (
            self.shared.lease.close(),
            tokio::runtime::Handle::try_current(),
        ) {
            let shared = self.shared.clone();
            rt.spawn(async move {
                let revoke = |c: Client| async move { c.lease_client().revoke(id).await };
                let _ = shared.call("revoking the lease", revoke).await;
            });
        }
    }
}

#[async_trait]
impl DistributedLock for EtcdLock {
    fn profile(&self) -> Profile {
        Profile::new(CAPABILITIES)
            // Waiters queue by creation revision, each watching its predecessor's key.
            .waiting(Waiting::Queue)
            .renew_batch(RENEW_BATCH)
    }

    async fn give_back(
        &self,
        surplus: &distlock_api::backend::Surplus,
    ) -> distlock_api::Result<bool> {
        self.shared
            .give_back(surplus)
            .await
            .map_err(|e| context(e, &surplus.name))
    }

    fn core(&self) -> &ClientCore {
        &self.shared.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        match self.shared.acquire(req, None).await {
            Ok(Some(grant)) => Ok(Attempt::Granted(grant)),
            // A lease-bound lock: the holder's lease is the client's, not the lock's.
            Ok(None) => Ok(Attempt::Held { expires_in: None }),
            Err(e) => Err(context(e, &req.name)),
        }
    }

    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        let started = Instant::now();
        let deadline = started
            .checked_add(wait)
            .ok_or_else(|| Error::invalid(format!("wait bound {wait:?} is too long")))?;
        match self.shared.acquire(req, Some(deadline)).await {
            Ok(Some(grant)) => Ok(grant),
            Ok(None) => Err(wait::timeout(wait)),
            Err(e) => Err(context(e, &req.name)),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.shared
            .release(grant)
            .await
            .map_err(|e| context(e, &grant.name))
    }

    async fn renew(&self, grant: &Grant, _ttl: Duration) -> Result<Duration> {
        self.shared
            .renew(grant)
            .await
            .map_err(|e| context(e, &grant.name))
    }

    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        let grants: Vec<&Grant> = grants.iter().map(|(g, _)| g).collect();
        self.shared
            .renew_many(&grants)
            .await
            .into_iter()
            .zip(grants)
            .map(|(r, g)| r.map_err(|e| context(e, &g.name)))
            .collect()
    }

    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        self.shared
            .proclaim(grant, value)
            .await
            .map_err(|e| context(e, &grant.name))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.shared
            .inspect(name)
            .await
            .map_err(|e| context(e, name))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        self.shared
            .list(prefix)
            .await
            .map_err(|e| e.with_backend(BACKEND))
    }

    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        self.shared
            .force_release(name, token)
            .await
            .map_err(|e| context(e, name))
    }
}

fn context(e: Error, name: &LockName) -> Error {
    e.with_backend(BACKEND).with_lock(name)
}
