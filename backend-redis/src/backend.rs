//! [`RedisLock`]: locks on one Redis server.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, HandOver, Notices, Waiting};
use distlock_api::backend::{async_trait, lost, AcquireRequest, ClientCore};
use distlock_api::Profile;
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Fencing, FencingToken, Grant, LeaseKind, LockInfo,
    LockName, Result, TtlSupport,
};

use crate::config::RedisConfig;
use crate::notices::{Hub, HubConfig};
use crate::ops::{Acquired, HandedOver, Server};
use crate::permits::PermitOf;
use crate::sentinel::Sentinel;

/// What [`RedisLock`] promises.
pub const CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Notify)
    .ttl(TtlSupport::new(
        LeaseKind::PerLock,
        Duration::from_millis(1),
        Duration::from_millis(1),
    ))
    .fair(false)
    .fencing(Fencing::Volatile)
    .renewal(true)
    .semaphore(true)
    .election(true);

/// A client of one Redis server: one multiplexed command connection (reconnected on demand),
/// one pub/sub connection shared by all its waiters (opened on first wait), one watchdog.
///
/// Build it with [`RedisLock::connect`], wrap it in an `Arc` and use
/// [`LockExt`](crate::LockExt) on it.
pub struct RedisLock {
    core: ClientCore,
    shared: Arc<Shared>,
}

struct Shared {
    server: Server,
    hub: Hub,
    /// Through Sentinel: dropped with the client, it ends the `+switch-master` listener.
    _switches: Option<tokio::sync::watch::Sender<()>>,
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("endpoint", &self.shared.server.endpoint)
            .field("owner", self.core.owner())
            .finish_non_exhaustive()
    }
}

impl RedisLock {
    /// The server, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) fn server(&self) -> &Server {
        &self.shared.server
    }

    /// The backend's name, as errors and `DISTLOCK_SKIP` show it.
    pub const BACKEND: &'static str = "redis";

    /// Validates `config` (before any I/O), connects within its connect timeout and loads the
    /// scripts. An unreachable server is [`Unavailable`](crate::ErrorKind::Unavailable).
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        config
            .validate()
            .map_err(|e| e.with_backend(Self::BACKEND))?;
        let mut core =
            ClientCore::new(Self::BACKEND).with_default_ttl(config.options.client.default_ttl)?;
        if let Some(owner) = &config.options.client.owner {
            core = core.with_owner(owner.clone());
        }
        let (endpoint, options) = (&config.endpoint, &config.options);
        let sentinel = config.sentinel.as_ref().map(|spec| {
            Arc::new(Sentinel::new(
                spec.clone(),
                endpoint,
                options,
                Self::BACKEND,
            ))
        });
        let mut server = match (&config.cluster, &sentinel) {
            (Some(spec), _) => {
                Server::connect_cluster(spec, endpoint, options, Self::BACKEND).await?
            }
            (None, Some(sentinel)) => {
                Server::connect_sentinel(sentinel.clone(), endpoint, options, Self::BACKEND).await?
            }
            (None, None) => Server::connect(endpoint, options, Self::BACKEND).await?,
        };
        server.sync = options.sync.in_force(options.client.operation_timeout);
        // Through Sentinel: a failover is heard of when a sentinel announces it.
        let switches = sentinel.as_ref().map(|sentinel| {
            let (stop, listening) = tokio::sync::watch::channel(());
            sentinel.listen_for_switches(listening);
            stop
        });
        let hub = Hub::new(HubConfig {
            endpoint: config.endpoint.clone(),
            backend: Self::BACKEND,
            connect_timeout: config.options.client.connect_timeout,
            response_timeout: config.options.client.operation_timeout,
            cluster: config
                .cluster
                .as_ref()
                .map(|spec| (spec.clone(), config.options.clone())),
            sentinel,
        });
        Ok(Self {
            core,
            shared: Arc::new(Shared {
                server,
                hub,
                _switches: switches,
            }),
        })
    }

    /// Uses `core` (owner id, default TTL) instead of the one built from the config.
    pub fn with_core(mut self, core: ClientCore) -> Self {
        self.core = core;
        self
    }
}

impl Shared {
    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        let sent_at = Instant::now();
        // A lock (one permit) keeps to the lock's own script: a semaphore costs it nothing more.
        let acquired = if req.permits > 1 {
            let (name, owner) = (&req.name, &req.owner);
            self.server
                .acquire_permit(name, owner, req.ttl, req.permits)
                .await?
        } else {
            self.server.acquire(req).await?
        };
        Ok(match acquired {
            Acquired::Granted { token, count, .. } => {
                let mut grant = Grant::new(
                    req.name.clone(),
                    req.owner.clone(),
                    FencingToken(token),
                    count,
                    req.ttl,
                    sent_at,
                );
                // Whoever releases it (a guard, or the core after a cancelled wait) knows it
                // for a permit.
                grant.permits = req.permits;
                Attempt::Granted(grant)
            }
            Acquired::Held { pttl } => Attempt::Held { expires_in: pttl },
        })
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        let (name, owner, token) = (&grant.name, &grant.owner, grant.token.0);
        let left = if grant.permits > 1 {
            self.server.release_permit(name, owner, token).await?
        } else {
            self.server.release(name, owner, token).await?
        };
        Ok(left.is_some())
    }

    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        // The hand-over script is the lock's; the core sends a permit's release as a release.
        // With sync_replicas the profile hands nothing over: every grant is an acquire.
        if from.permits > 1 || to.permits > 1 || self.server.sync.is_some() {
            return Ok(HandOver::Released(self.release(from).await?));
        }
        let sent_at = Instant::now();
        let handed = self
            .server
            .hand_over(&from.name, &from.owner, from.token.0, &to.owner, to.ttl)
            .await?;
        Ok(match handed {
            HandedOver::To { token } => HandOver::Handed(Grant::new(
                to.name.clone(),
                to.owner.clone(),
                FencingToken(token),
                1,
                to.ttl,
                sent_at,
            )),
            HandedOver::Kept => HandOver::Released(true),
            HandedOver::NotHeld => HandOver::Released(false),
        })
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn profile(&self) -> Profile {
        Profile::new(CAPABILITIES)
            // Waiters subscribe to the lock's channel; a release publishes on it.
            .waiting(Waiting::Notify)
            // A release wakes a waiting task of this handle with the lock already its own: one
            // script gives up the releasing grant and grants the waiter a fresh token. Not with
            // sync_replicas: every grant is then an acquire, which waits for the replicas.
            .hands_over(self.shared.server.sync.is_none())
    }

    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        // A semaphore frees the one permit of `token` in one script; a lock goes hold by hold.
        match self
            .shared
            .server
            .force_release_permit(name, token.0)
            .await?
        {
            Some(freed) => Ok(freed),
            None => distlock_api::backend::force_release_by_releases(self, name, token).await,
        }
    }

    async fn give_back(&self, surplus: &distlock_api::backend::Surplus) -> Result<bool> {
        // The owner's own permit, which need not be the oldest one `inspect` shows.
        let (name, owner) = (&surplus.name, &surplus.owner);
        match self.shared.server.permit_of(name, owner).await? {
            PermitOf::NoSemaphore => {
                distlock_api::backend::give_back_by_release(self, surplus).await
            }
            PermitOf::NotHeld => Ok(false),
            // Accounted holds are read after the server's count, as give_back asks.
            PermitOf::Held { token, count } => {
                if !self.core.has_surplus(surplus, count) {
                    return Ok(false);
                }
                let released = self
                    .shared
                    .server
                    .release_permit(name, owner, token)
                    .await?;
                Ok(released.is_some())
            }
        }
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.shared.attempt(req).await
    }

    async fn subscribe(&self, name: &LockName) -> Result<Box<dyn Notices>> {
        let channel = self.shared.server.keys.channel(name);
        Ok(Box::new(self.shared.hub.subscribe(&channel).await?))
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.shared.release(grant).await
    }

    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        self.shared.hand_over(from, to).await
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        let (name, owner, token) = (&grant.name, &grant.owner, grant.token.0);
        let server = &self.shared.server;
        // The watchdog renews one grant per request here (no renew batch), through this.
        let renewed = if grant.permits > 1 {
            server.renew_permit(name, owner, token, ttl).await?
        } else {
            server.renew(name, owner, token, ttl).await?
        };
        if renewed {
            Ok(ttl)
        } else {
            Err(lost(
                &grant.name,
                format!(
                    "the {} is no longer held by owner {} with token {} (expired, removed or \
                     taken over)",
                    if grant.permits > 1 { "permit" } else { "lock" },
                    grant.owner,
                    grant.token
                ),
            ))
        }
    }

    /// One script: the value goes into the lock hash (`#value`, as `<token>:<value>`) if the
    /// grant (owner and token) still holds the lock, and the name's channel is told.
    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        if grant.permits > 1 {
            return Err(
                distlock_api::Error::invalid("a semaphore's permit has no value")
                    .with_lock(&grant.name),
            );
        }
        let (name, owner, token) = (&grant.name, &grant.owner, grant.token.0);
        let server = &self.shared.server;
        server.proclaim(name, owner, (token, token), value).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        Ok(self.shared.server.inspect_any(name).await?.map(|h| {
            let info = LockInfo::new(h.owner, h.count, FencingToken(h.token), h.pttl)
                .with_since_unix_ms(h.since_ms)
                .with_permits(h.permits.0, h.permits.1);
            match h.value {
                Some(v) => info.with_value(v),
                None => info,
            }
        }))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let mut held = Vec::new();
        for name in self.shared.server.held_names(prefix).await? {
            // Released or expired since the scan: not held any more, so not listed.
            if let Some(info) = self.inspect(&name).await? {
                held.push((name, info));
            }
        }
        Ok(held)
    }
}
