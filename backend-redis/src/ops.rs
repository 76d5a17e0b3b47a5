//! The server operations: one Redis server's connection, the scripts, and what their answers
//! mean.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, ErrorKind, LockName, OwnerId, Result};
use futures::FutureExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

use crate::conn::{Conn, Remake};
use crate::endpoint::{Endpoint, Options};
use crate::keys::KeySpace;
use crate::replicas::{Call, Waiting};
use crate::scripts::{self, LockScripts, PermitScripts};
use crate::sentinel::Sentinel;

/// What the acquire script answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// The owner holds the lock: `token` is this server's fencing counter value of the grant,
    /// `count` the owner's hold count now, `fence` the RedLock-derived token (0 if none).
    Granted { token: u64, count: u32, fence: u64 },
    /// Another owner holds it, for `pttl` more (`None`: the key has no expiry).
    Held { pttl: Option<Duration> },
}

/// What the hand-over script did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandedOver {
    /// The new owner holds the lock, under this fresh token.
    To { token: u64 },
    /// The grant had more holds: one was given up, and it keeps the lock.
    Kept,
    /// The grant did not hold the lock: nothing changed.
    NotHeld,
}

/// What the inspect script saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) owner: OwnerId,
    pub(crate) count: u32,
    pub(crate) token: u64,
    pub(crate) fence: u64,
    pub(crate) pttl: Option<Duration>,
    /// The server's clock at the grant, in ms since the epoch (0: unknown).
    pub(crate) since_ms: i64,
    /// How many permits are held, of how many: `(1, 1)` for a lock.
    pub(crate) permits: (u32, u32),
    /// What an election's leader proclaimed under this hold's token (or RedLock fence).
    pub(crate) value: Option<String>,
}

/// A connection to one server, with the key layout of locks in it.
pub(crate) struct Server {
    /// The command connection. Replaced after a request times out: a connection that did not
    /// answer in time may be half-open (a peer gone without a reset), and the driver reconnects
    /// only once it sees the connection drop, which may be never.
    pub(crate) conn: Arc<RwLock<Conn>>,
    /// For a cluster: what makes a new cluster connection after a timeout.
    pub(crate) remake: Option<Arc<Remake>>,
    pub(crate) manager: ConnectionManagerConfig,
    pub(crate) keys: KeySpace,
    /// The lock's scripts and the permits', as this deployment runs them (Redis Cluster
    /// publishes on shard channels).
    pub(crate) scripts: &'static LockScripts,
    pub(crate) permit_scripts: &'static PermitScripts,
    pub(crate) endpoint: Endpoint,
    pub(crate) backend: &'static str,
    /// Set for a master found through Sentinel (`redis+sentinel://`): where to ask for the
    /// master again when it may have moved.
    pub(crate) sentinel: Option<Arc<Sentinel>>,
    /// With `sync_replicas`: the replicas every grant and renewal waits for.
    pub(crate) sync: Option<Waiting>,
}

impl Server {
    pub(crate) fn manager_config(options: &Options) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.client.connect_timeout))
            .set_response_timeout(Some(options.client.operation_timeout))
            // Each command that finds the connection broken triggers one fresh connect; a lock
            // call must fail fast rather than sit in a reconnect loop.
            .set_number_of_retries(0)
    }

    /// A server that connects on first use (for a RedLock master that was down at start-up).
    pub(crate) fn lazy(
        endpoint: &Endpoint,
        options: &Options,
        backend: &'static str,
    ) -> Result<Self> {
        let conn = ConnectionManager::new_lazy_with_config(
            endpoint.client.clone(),
            Self::manager_config(options),
        )
        .map_err(|e| driver_error(backend, endpoint, "configure", e))?;
        Ok(Self::new(Conn::Single(conn), endpoint, options, backend))
    }

    /// Connects, bounded by the connect timeout, and loads the scripts.
    pub(crate) async fn connect(
        endpoint: &Endpoint,
        options: &Options,
        backend: &'static str,
    ) -> Result<Self> {
        // rustls panics inside the driver when it has no crypto provider; one is installed
        // unless the application chose its own, and a panic left all the same (a provider that
        // cannot be installed) becomes an error, not a crash.
        #[cfg(feature = "tls")]
        distlock_api::backend::ensure_crypto_provider();
        let connecting = AssertUnwindSafe(ConnectionManager::new_with_config(
            endpoint.client.clone(),
            Self::manager_config(options),
        ))
        .catch_unwind();
        // The driver bounds each step; this bounds the whole handshake too (AUTH, SELECT, HELLO).
        let limit = options.client.connect_timeout + options.client.operation_timeout;
        let conn = match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(Ok(conn))) => conn,
            Ok(Ok(Err(e))) => return Err(driver_error(backend, endpoint, "connect", e)),
            Ok(Err(panic)) => {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("the driver panicked")
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                return Err(Error::invalid(format!(
                    "{}: cannot set up the connection: {why} (for rediss://, install a rustls \
                     CryptoProvider before connecting, e.g. \
                     rustls::crypto::ring::default_provider().install_default())",
                    endpoint.display
                ))
                .with_backend(backend));
            }
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{}: no connection within {limit:?}", endpoint.display),
                )
                .with_backend(backend))
            }
        };
        let server = Self::new(Conn::Single(conn), endpoint, options, backend);
        server.load_scripts().await?;
        Ok(server)
    }

    /// A server on `conn`; a cluster connection runs the cluster's scripts.
    pub(crate) fn new(
        conn: Conn,
        endpoint: &Endpoint,
        options: &Options,
        backend: &'static str,
    ) -> Self {
        let (scripts, permit_scripts) = scripts::of(matches!(conn, Conn::Cluster(_)));
        Self {
            conn: Arc::new(RwLock::new(conn)),
            remake: None,
            manager: Self::manager_config(options),
            keys: options.keys(),
            scripts,
            permit_scripts,
            endpoint: endpoint.clone(),
            backend,
            sentinel: None,
            sync: None,
        }
    }

    /// Whether this is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(
            &*self.conn.read().unwrap_or_else(PoisonError::into_inner),
            Conn::Cluster(_)
        )
    }

    /// Loads every script once up front, so the first lock call is one EVALSHA.
    async fn load_scripts(&self) -> Result<()> {
        let mut pipe = redis::pipe();
        for lua in scripts::all(false) {
            pipe.cmd("SCRIPT").arg("LOAD").arg(lua.source).ignore();
        }
        let mut conn = self.conn();
        pipe.query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.error("load scripts", e))
    }

    pub(crate) fn error(&self, what: &str, e: redis::RedisError) -> Error {
        driver_error(self.backend, &self.endpoint, what, e)
    }

    pub(crate) fn conn(&self) -> Conn {
        self.conn
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) async fn run(&self, what: &str, inv: redis::ScriptInvocation<'_>) -> Result<Value> {
        let round = self.sync_master();
        let mut conn = self.conn();
        match inv.invoke_async(&mut conn).await {
            Ok(reply) => Ok(reply),
            Err(e) => {
                if self.sentinel.is_some() {
                    // The next call reaches the master the sentinels name; this one is sent
                    // there too if it certainly did not run on the old one.
                    if self.follow_master(&e, round).await {
                        let mut conn = self.conn();
                        return inv
                            .invoke_async(&mut conn)
                            .await
                            .map_err(|e| self.error(what, e));
                    }
                } else if e.is_timeout() {
                    self.replace_connection();
                }
                Err(self.error(what, e))
            }
        }
    }

    /// Puts a fresh connection in place of the current one: made on first use (one server) or
    /// in the background (a cluster, see `conn.rs`). Requests in flight on the old one
    /// finish (or time out) on it.
    pub(crate) fn replace_connection(&self) {
        if let Some(remake) = &self.remake {
            let slot = self.conn.clone();
            remake.start(move |fresh| {
                *slot.write().unwrap_or_else(PoisonError::into_inner) = Conn::Cluster(fresh);
            });
            return;
        }
        // A Sentinel client's is replaced when it follows the master.
        if self.sentinel.is_some() || self.is_cluster() {
            return;
        }
        if let Ok(fresh) = ConnectionManager::new_lazy_with_config(
            self.endpoint.client.clone(),
            self.manager.clone(),
        ) {
            *self.conn.write().unwrap_or_else(PoisonError::into_inner) = Conn::Single(fresh);
        }
    }

    /// Runs the acquire script.
    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        let (name, owner) = (&req.name, &req.owner);
        let call = Call::new(&self.scripts.acquire)
            .key(self.keys.lock_key(name))
            .key(self.keys.fence_key(name))
            .key(self.keys.semaphore_key(name))
            .arg(&*owner.text())
            .arg(millis(req.ttl))
            .arg(if req.fresh { "1" } else { "0" });
        let (reply, acks) = self.write("acquire", call, req.ttl).await?;
        let reply = ints(reply).ok_or_else(|| self.bad_reply("acquire"))?;
        if let [2, max] = reply[..] {
            return Err(other_permits(name, max, 1));
        }
        match reply[..] {
            [1, token, count, fence] => {
                let token = u64::try_from(token).map_err(|_| self.bad_reply("acquire"))?;
                self.check_grant(acks, name, (owner, token), false).await?;
                Ok(Acquired::Granted {
                    token,
                    count: u32::try_from(count).map_err(|_| self.bad_reply("acquire"))?,
                    fence: u64::try_from(fence).map_err(|_| self.bad_reply("acquire"))?,
                })
            }
            [0, pttl] => Ok(Acquired::Held {
                pttl: pttl_of(pttl),
            }),
            _ => Err(self.bad_reply("acquire")),
        }
    }

    /// Runs the release script: the holds left (0: deleted and published), or `None` if the
    /// grant `(owner, token)` does not hold the lock here.
    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &OwnerId,
        token: u64,
    ) -> Result<Option<u32>> {
        let mut inv = self.scripts.release.script.prepare_invoke();
        inv.key(self.keys.lock_key(name))
            .arg(&*owner.text())
            .arg(token)
            .arg(self.keys.channel(name));
        let reply = self.run("release", inv).await?;
        self.holds_left("release", reply)
    }

    /// A release script's answer: the holds left (0: freed and published), or `None` (-1) when
    /// the grant held nothing here.
    pub(crate) fn holds_left(&self, what: &str, reply: Value) -> Result<Option<u32>> {
        match int(reply) {
            Some(-1) => Ok(None),
            Some(n) => u32::try_from(n).map(Some).map_err(|_| self.bad_reply(what)),
            None => Err(self.bad_reply(what)),
        }
    }

    /// Runs the hand-over script: the grant `(owner, token)` gives up its last hold and `to`
    /// gets the lock with a lease of `ttl`.
    pub(crate) async fn hand_over(
        &self,
        name: &LockName,
        owner: &OwnerId,
        token: u64,
        to: &OwnerId,
        ttl: Duration,
    ) -> Result<HandedOver> {
        let mut inv = self.scripts.handover.script.prepare_invoke();
        inv.key(self.keys.lock_key(name))
            .key(self.keys.fence_key(name))
            .arg(&*owner.text())
            .arg(token)
            .arg(&*to.text())
            .arg(millis(ttl));
        let reply =
            ints(self.run("hand over", inv).await?).ok_or_else(|| self.bad_reply("hand over"))?;
        match reply[..] {
            [1, token] => Ok(HandedOver::To {
                token: u64::try_from(token).map_err(|_| self.bad_reply("hand over"))?,
            }),
            [0, _] => Ok(HandedOver::Kept),
            [-1] => Ok(HandedOver::NotHeld),
            _ => Err(self.bad_reply("hand over")),
        }
    }

    /// Runs the renew script: whether the grant `(owner, token)` still held the lock; if it
    /// did, its lease now ends no sooner than `ttl` from now (a longer lease is kept).
    pub(crate) async fn renew(
        &self,
        name: &LockName,
        owner: &OwnerId,
        token: u64,
        ttl: Duration,
    ) -> Result<bool> {
        let call = Call::new(&self.scripts.renew)
            .key(self.keys.lock_key(name))
            .arg(&*owner.text())
            .arg(token)
            .arg(millis(ttl));
        let (reply, acks) = self.write("renew", call, ttl).await?;
        match int(reply) {
            Some(1) => self.check_renewal(acks, name).map(|()| true),
            Some(0) => Ok(false),
            _ => Err(self.bad_reply("renew")),
        }
    }

    /// Runs the RedLock fence script: records `derived` as the grant's token here, if the grant
    /// `(owner, token)` still holds the lock here.
    pub(crate) async fn fence(
        &self,
        name: &LockName,
        owner: &OwnerId,
        token: u64,
        derived: u64,
    ) -> Result<bool> {
        let mut inv = self.scripts.fence.script.prepare_invoke();
        inv.key(self.keys.lock_key(name))
            .key(self.keys.fence_key(name))
            .arg(&*owner.text())
            .arg(token)
            .arg(derived);
        match int(self.run("fence", inv).await?) {
            Some(1) => Ok(true),
            Some(0) => Ok(false),
            _ => Err(self.bad_reply("fence")),
        }
    }

    /// Runs the proclaim script: writes `value` under `epoch` into the lock hash, if the grant
    /// `(owner, token)` still holds the lock here; tells the name's subscribers.
    pub(crate) async fn proclaim(
        &self,
        name: &LockName,
        owner: &OwnerId,
        (token, epoch): (u64, u64),
        value: &str,
    ) -> Result<bool> {
        let mut inv = self.scripts.proclaim.script.prepare_invoke();
        inv.key(self.keys.lock_key(name))
            .arg(&*owner.text())
            .arg(token)
            .arg(epoch)
            .arg(value)
            .arg(self.keys.channel(name));
        match int(self.run("proclaim", inv).await?) {
            Some(1) => Ok(true),
            Some(0) => Ok(false),
            _ => Err(self.bad_reply("proclaim")),
        }
    }

    /// The names of the locks held here under names starting with `prefix`, by a `SCAN` of
    /// their lock keys (the fencing counters and channels are not locks).
    pub(crate) async fn held_names(&self, prefix: &str) -> Result<Vec<LockName>> {
        let pattern = self.keys.pattern(prefix);
        let mut names = Vec::new();
        for key in self.scan(&pattern).await? {
            // A semaphore is held while its holders key exists.
            if let Some((name, "lock" | "permits")) = self.keys.parse(&key) {
                // A key this layout cannot have made is someone else's: not listed.
                if let Ok(name) = LockName::new(&name) {
                    names.push(name);
                }
            }
        }
        // SCAN may return a key more than once.
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        Ok(names)
    }

    /// Runs the inspect script on the lock hash only (RedLock: no semaphores).
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>> {
        self.inspect_keys(name, false).await
    }

    /// Runs the inspect script on the lock and, when it is free, on the semaphore: its oldest
    /// live permit.
    pub(crate) async fn inspect_any(&self, name: &LockName) -> Result<Option<Holder>> {
        self.inspect_keys(name, true).await
    }

    async fn inspect_keys(&self, name: &LockName, permits: bool) -> Result<Option<Holder>> {
        let mut inv = self.scripts.inspect.script.prepare_invoke();
        inv.key(self.keys.lock_key(name));
        if permits {
            inv.key(self.keys.holders_key(name))
                .key(self.keys.semaphore_key(name));
        }
        let Value::Array(mut items) = self.run("inspect", inv).await? else {
            return Err(self.bad_reply("inspect"));
        };
        if items.is_empty() {
            return Ok(None);
        }
        let parsed = (|| {
            let (permits, value) = match items.len() {
                7 => {
                    let value: Option<String> = redis::from_redis_value(items.pop()?).ok()?;
                    ((1, 1), value)
                }
                8 => {
                    let max = u32::try_from(int(items.pop()?)?).ok()?;
                    ((u32::try_from(int(items.pop()?)?).ok()?, max), None)
                }
                _ => return None,
            };
            let [owner, count, token, fence, pttl, since] = <[Value; 6]>::try_from(items).ok()?;
            let owner: String = redis::from_redis_value(owner).ok()?;
            Some(Holder {
                owner: OwnerId::parse(&owner).ok()?,
                count: u32::try_from(int(count)?).ok()?,
                token: u64::try_from(int(token)?).ok()?,
                fence: u64::try_from(int(fence)?).ok()?,
                pttl: pttl_of(int(pttl)?),
                since_ms: int(since)?,
                permits,
                value,
            })
        })();
        parsed.map(Some).ok_or_else(|| {
            Error::new(
                ErrorKind::Backend,
                format!(
                    "{}: the lock hash {} is not one distlock wrote",
                    self.endpoint.display,
                    self.keys.lock_key(name)
                ),
            )
            .with_lock(name)
        })
    }

    pub(crate) fn bad_reply(&self, what: &str) -> Error {
        Error::new(
            ErrorKind::Backend,
            format!(
                "{}: unexpected reply to the {what} script",
                self.endpoint.display
            ),
        )
    }
}

/// Maps a driver error: connection trouble and a server that cannot serve writes right now
/// (loading, failing over, read-only replica) are `Unavailable` (temporary); bad
/// configuration is `InvalidArgument`; anything else the server said is `Backend`.
pub(crate) fn driver_error(
    backend: &'static str,
    endpoint: &Endpoint,
    what: &str,
    e: redis::RedisError,
) -> Error {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    let kind = match e.kind() {
        // Reached, but its certificate is not trusted: retrying will not help.
        _ if distlock_api::backend::refused_as_untrusted(&e) => ErrorKind::Backend,
        K::Io | K::ClusterConnectionNotFound => ErrorKind::Unavailable,
        K::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly) => {
            ErrorKind::Unavailable
        }
        K::InvalidClientConfig => ErrorKind::InvalidArgument,
        _ if e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() => {
            ErrorKind::Unavailable
        }
        _ => ErrorKind::Backend,
    };
    Error::new(kind, format!("{what} on {} failed", endpoint.display))
        .with_backend(backend)
        .with_source(e)
}

pub(crate) fn millis(d: Duration) -> u64 {
    // check_ttl bounds leases to days, far below u64 milliseconds; at least 1 ms, as PX needs.
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(crate) fn pttl_of(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

pub(crate) fn int(v: Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(i),
        _ => None,
    }
}

pub(crate) fn ints(v: Value) -> Option<Vec<i64>> {
    match v {
        Value::Array(items) => items.into_iter().map(int).collect(),
        _ => None,
    }
}

/// The refusal of a request for `asked` permits of `name`, which is held with `held`.
pub(crate) fn other_permits(name: &LockName, held: i64, asked: u32) -> Error {
    Error::invalid(format!(
        "{name} is held with {held} permit(s), not the {asked} this request asks for"
    ))
    .with_lock(name)
}
