//! Connection URLs and options of [`RedisLock`](crate::RedisLock) and
//! [`RedLock`](crate::RedLock).

use std::time::Duration;

use distlock_api::{Error, LockName, Result};

use crate::endpoint::{endpoint, endpoint_of_client, ClusterSpec, Endpoint, Options};
pub use crate::endpoint::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_RESPONSE_TIMEOUT};
use crate::sentinel::{parse_sentinel_url, SentinelSpec};

/// The fewest masters a [`RedLock`](crate::RedLock) accepts: with fewer, one failure stops it.
pub const MIN_REDLOCK_INSTANCES: usize = 3;

macro_rules! setters {
    () => {
        /// Stores locks under keys starting with `prefix:` (default [`DEFAULT_KEY_PREFIX`]).
        /// 1..=64 bytes, no braces (they would break the cluster hash tag), no whitespace.
        pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
            self.options.key_prefix = prefix.into();
            self
        }

        distlock_api::client_option_methods!(options.client);

        /// The older name of [`operation_timeout`](Self::operation_timeout): how long one
        /// command may wait for its answer (default [`DEFAULT_RESPONSE_TIMEOUT`]).
        pub fn response_timeout(self, timeout: Duration) -> Self {
            self.operation_timeout(timeout)
        }

        /// The key of `name`'s lock hash (owner → hold count, `#token`, `#fence`), for
        /// operators: deleting it frees the lock behind its holder's back.
        pub fn lock_key(&self, name: &LockName) -> String {
            self.options.keys().lock_key(name)
        }

        /// The key of `name`'s fencing counter. It is never deleted: removing it restarts
        /// the name's tokens at 1.
        pub fn fence_key(&self, name: &LockName) -> String {
            self.options.keys().fence_key(name)
        }

        /// The channel a release of `name` is published on.
        pub fn release_channel(&self, name: &LockName) -> String {
            self.options.keys().channel(name)
        }

        /// The keys of `name` held as a semaphore, for operators: the holders (a sorted set of
        /// owner ids scored by lease expiry, ms) and the permit data (`#max`, owner →
        /// `token:hold count:since`). Deleting both frees every permit behind their holders' backs.
        pub fn semaphore_keys(&self, name: &LockName) -> [String; 2] {
            let keys = self.options.keys();
            [keys.holders_key(name), keys.semaphore_key(name)]
        }

        /// A glob pattern (for `SCAN MATCH` and `PUBSUB CHANNELS`) matching every key and
        /// channel of the names that start with `name_prefix`.
        pub fn key_pattern(&self, name_prefix: &str) -> String {
            self.options.keys().pattern(name_prefix)
        }

        /// The lock name and kind (`lock`, `fence`, `permits`, `semaphore`, `released`) of a
        /// key or channel made by this configuration; `None` for anything else.
        pub fn parse_key(&self, key: &str) -> Option<(String, String)> {
            self.options
                .keys()
                .parse(key)
                .map(|(name, kind)| (name, kind.to_string()))
        }
    };
}

/// How to reach one Redis server (or a Redis Cluster-compatible proxy) and how to lay out
/// locks in it.
///
/// ```
/// use std::time::Duration;
/// use distlock_redis::RedisConfig;
///
/// let config = RedisConfig::from_url("redis://127.0.0.1:6379/0?key_prefix=app")?
///     .default_ttl(Duration::from_secs(10))
///     .connect_timeout(Duration::from_secs(1));
/// # Ok::<_, distlock_redis::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct RedisConfig {
    pub(crate) endpoint: Endpoint,
    pub(crate) options: Options,
    /// Set for a Redis Cluster (`redis+cluster://`): its seeds.
    pub(crate) cluster: Option<ClusterSpec>,
    /// Set for a master found through Sentinel (`redis+sentinel://`): the sentinels and the
    /// master's name.
    pub(crate) sentinel: Option<SentinelSpec>,
}

impl RedisConfig {
    /// Parses `redis://[user:password@]host[:port][/db][?options]` or `rediss://…` (TLS,
    /// with the `tls` feature; without it [`Unsupported`](distlock_api::ErrorKind::Unsupported)). distlock
    /// reads `key_prefix`, `sync_replicas` and `sync_timeout` (see
    /// [`sync_replicas`](Self::sync_replicas)) and the shared options of
    /// [`distlock_api::config`] (`owner`, `default_ttl`, `connect_timeout`,
    /// `operation_timeout`, its older name `response_timeout`, and their `_ms` spellings); the
    /// rest go to the `redis` driver
    /// (e.g. `protocol=resp3`).
    /// A malformed URL is [`InvalidArgument`](distlock_api::ErrorKind::InvalidArgument); no I/O happens.
    ///
    /// `redis+cluster://[user:password@]host:port,host:port,…[?options]` (`rediss+cluster://`
    /// for TLS) is a Redis Cluster reached through any of the listed seed nodes (the rest are
    /// discovered); besides the options above it takes `map_seeds=true`, which reaches each
    /// seed's announced address at the address the URL gives for it (a cluster behind address
    /// translation or proxies).
    ///
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/master-name[/db][?options]`
    /// (`rediss+sentinel://` for TLS) is the master that the listed sentinels (port 26379 by
    /// default) monitor under `master-name`: the client asks them for its address at connect
    /// and again when the master may have moved (a failover). User and password are the data
    /// nodes'; the sentinels are reached without one unless `sentinel_password` gives theirs.
    /// Besides the options above it takes `protocol` (`resp2`, `resp3`) for the data nodes;
    /// any other option is refused.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut options = Options::default();
        let (mut cluster, mut sentinel) = (None, None);
        let endpoint = if let Some(parsed) = parse_sentinel_url(url, &mut options) {
            let (endpoint, spec) = parsed?;
            sentinel = Some(spec);
            endpoint
        } else if let Some(parsed) = crate::endpoint::parse_cluster_url(url, &mut options, endpoint)
        {
            let (endpoint, spec) = parsed?;
            cluster = Some(spec);
            endpoint
        } else {
            endpoint(url, &mut options)?
        };
        let config = Self {
            endpoint,
            options,
            cluster,
            sentinel,
        };
        config.validate()?;
        Ok(config)
    }

    /// Uses a `redis::Client` the application built itself, with its address, database,
    /// credentials, protocol and TLS settings (e.g. `rediss://` with the application's own
    /// certificates through `redis::Client::build_with_tls` and the `tls` feature). The lock client opens its own
    /// connections from it (one for commands, one for release notices); distlock's options
    /// keep their defaults and are set with the methods below.
    ///
    /// ```
    /// use distlock_redis::RedisConfig;
    ///
    /// let client = distlock_redis::redis::Client::open("redis://127.0.0.1:6379/2")?;
    /// let config = RedisConfig::from_client(client).key_prefix("app");
    /// assert_eq!(config.endpoint(), "127.0.0.1:6379/2");
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_client(client: redis::Client) -> Self {
        Self {
            endpoint: endpoint_of_client(client),
            options: Options::default(),
            cluster: None,
            sentinel: None,
        }
    }

    setters!();

    /// Waits after every grant, re-entry, renewal and permit grant or renewal until `n`
    /// replicas acknowledged it (`WAIT n timeout` on the same connection; URL
    /// `sync_replicas=n`; 0, the default, waits for none). A grant fewer replicas acknowledged
    /// is given back and is [`Unavailable`](distlock_api::ErrorKind::Unavailable); such a
    /// renewal fails as a temporary error. See the crate docs, *Replicas and failover*, for
    /// what this does and does not promise.
    pub fn sync_replicas(mut self, n: u32) -> Self {
        self.options.sync.replicas = n;
        self
    }

    /// The `WAIT` timeout of [`sync_replicas`](Self::sync_replicas) (URL `sync_timeout`):
    /// at least 1 ms, at most half the operation timeout, and cut to a third of the lease of
    /// each write. Unset, it is a tenth of the lease, at most half the operation timeout.
    pub fn sync_timeout(mut self, timeout: Duration) -> Self {
        self.options.sync.timeout = Some(timeout);
        self
    }

    /// How many replicas must acknowledge each grant and renewal (0: none).
    pub fn get_sync_replicas(&self) -> u32 {
        self.options.sync.replicas
    }

    /// The `WAIT` timeout set with [`sync_timeout`](Self::sync_timeout), if any.
    pub fn get_sync_timeout(&self) -> Option<Duration> {
        self.options.sync.timeout
    }

    /// Whether this is a Redis Cluster (`redis+cluster://`).
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Whether the master is found through Sentinel (`redis+sentinel://`).
    pub fn is_sentinel(&self) -> bool {
        self.sentinel.is_some()
    }

    /// Checks every option; [`RedisLock::connect`](crate::RedisLock::connect) calls it before
    /// any I/O.
    pub fn validate(&self) -> Result<()> {
        if self.options.release_signals.is_some() {
            return Err(Error::invalid(
                "release_signals is a RedLock option: a single server's waiters are always \
                 notified by its release messages",
            ));
        }
        self.options.validate()
    }

    /// The server, as errors name it (`host:port[/db]`, no password; a cluster's seeds as
    /// `cluster host:port,host:port`; sentinels as `sentinel host:port,host:port/master`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint.display
    }
}

/// How to reach the independent Redis masters of a [`RedLock`](crate::RedLock).
///
/// ```
/// use distlock_redis::RedLockConfig;
///
/// let a = RedLockConfig::from_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379")?;
/// let b = RedLockConfig::from_urls(&[
///     "redis://10.0.0.1:6379",
///     "redis://10.0.0.2:6379",
///     "redis://10.0.0.3:6379",
/// ])?;
/// assert_eq!(a.endpoints(), b.endpoints());
/// # Ok::<_, distlock_redis::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct RedLockConfig {
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) options: Options,
}

impl RedLockConfig {
    /// Parses either `redlock://[user:password@]h1:port,h2:port,h3:port[/db][?options]` or a
    /// comma-separated list of `redis://` / `rediss://` URLs. Options are those of
    /// [`RedisConfig::from_url`], given once (on the `redlock://` URL or on any one of the list).
    pub fn from_url(url: &str) -> Result<Self> {
        let url = url.trim();
        if let Some(rest) = url.strip_prefix("redlock://") {
            let (authority, tail) = match rest.find(['/', '?']) {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let (userinfo, hosts) = match authority.rsplit_once('@') {
                Some((u, h)) => (format!("{u}@"), h),
                None => (String::new(), authority),
            };
            let urls: Vec<String> = hosts
                .split(',')
                .map(|h| format!("redis://{userinfo}{}{tail}", h.trim()))
                .collect();
            return Self::from_urls(&urls);
        }
        let urls: Vec<&str> = url.split(',').collect();
        Self::from_urls(&urls)
    }

    /// One URL per independent master (`redis://` or `rediss://`); at least
    /// [`MIN_REDLOCK_INSTANCES`], all distinct.
    pub fn from_urls<S: AsRef<str>>(urls: &[S]) -> Result<Self> {
        let mut options = Options::default();
        let endpoints = urls
            .iter()
            .map(|u| endpoint(u.as_ref(), &mut options))
            .collect::<Result<Vec<_>>>()?;
        let config = Self { endpoints, options };
        config.validate()?;
        Ok(config)
    }

    /// One `redis::Client` per independent master, built by the application (see
    /// [`RedisConfig::from_client`]); at least [`MIN_REDLOCK_INSTANCES`], all distinct, else
    /// [`InvalidArgument`](distlock_api::ErrorKind::InvalidArgument).
    pub fn from_clients(clients: impl IntoIterator<Item = redis::Client>) -> Result<Self> {
        let config = Self {
            endpoints: clients.into_iter().map(endpoint_of_client).collect(),
            options: Options::default(),
        };
        config.validate()?;
        Ok(config)
    }

    setters!();

    /// Checks every option; [`RedLock::connect`](crate::RedLock::connect) calls it before any
    /// I/O.
    pub fn validate(&self) -> Result<()> {
        if self.options.sync.replicas > 0 || self.options.sync.timeout.is_some() {
            return Err(Error::invalid(
                "sync_replicas is not a RedLock option: RedLock's masters are independent and \
                 its safety rests on a majority of them, not on their replicas",
            ));
        }
        let n = self.endpoints.len();
        if n < MIN_REDLOCK_INSTANCES {
            return Err(Error::invalid(format!(
                "RedLock needs at least {MIN_REDLOCK_INSTANCES} independent masters to survive \
                 one failure, got {n}; for a single server use RedisLock"
            )));
        }
        for (i, a) in self.endpoints.iter().enumerate() {
            if self.endpoints[..i].iter().any(|b| b.display == a.display) {
                return Err(Error::invalid(format!(
                    "RedLock master {} is listed twice: the instances must be independent",
                    a.display
                )));
            }
        }
        self.options.validate()
    }

    /// The masters, as errors name them.
    pub fn endpoints(&self) -> Vec<&str> {
        self.endpoints.iter().map(|e| e.display.as_str()).collect()
    }

    /// How many masters must agree: a strict majority.
    pub fn quorum(&self) -> usize {
        self.endpoints.len() / 2 + 1
    }

    /// Whether waiters listen to the masters' release messages (default `true`; URL
    /// `release_signals=false`). On, a waiter that finds the lock held subscribes to the name's
    /// release channel on every master and retries when a majority of them tell it of a
    /// release: prompt wake-ups across processes, and contenders that take turns, at the cost
    /// of every waiter retrying at each release of a hot lock. Off, waiters retry after random
    /// backoff steps only (2 ms doubling to 100 ms), as the RedLock description has it: under
    /// heavy contention the client that just released mostly takes the lock again, which gives
    /// more grants per second and long waits for the others.
    pub fn release_signals(mut self, on: bool) -> Self {
        self.options.release_signals = Some(on);
        self
    }

    /// Whether waiters listen to the masters' release messages.
    pub fn get_release_signals(&self) -> bool {
        self.options.release_signals.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use distlock_api::ErrorKind;

    use super::*;

    fn kind<T: fmt::Debug>(r: Result<T>) -> ErrorKind {
        r.expect_err("accepted").kind()
    }

    #[test]
    fn good_urls_parse_with_options() {
        let c = RedisConfig::from_url(
            "redis://user:secret@127.0.0.1:6380/2?key_prefix=app&default_ttl_ms=1500&connect_timeout_ms=250",
        )
        .unwrap();
        assert_eq!(c.endpoint(), "127.0.0.1:6380/2");
        assert_eq!(c.options.key_prefix, "app");
        assert_eq!(c.get_default_ttl(), Duration::from_millis(1500));
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(250));
        assert!(!format!("{c:?}").contains("secret"));
        let c = RedisConfig::from_url(
            "redis://h?default_ttl=2s&response_timeout=750ms&owner=job-7&protocol=resp3",
        )
        .unwrap();
        assert_eq!(c.get_default_ttl(), Duration::from_secs(2));
        assert_eq!(c.get_operation_timeout(), Duration::from_millis(750));
        assert_eq!(c.get_owner().map(|o| o.to_string()), Some("job-7".into()));
        let c = RedisConfig::from_url("redis://localhost").unwrap();
        assert_eq!(c.endpoint(), "localhost:6379");
        assert_eq!(c.options.key_prefix, DEFAULT_KEY_PREFIX);
    }

    #[test]
    fn bad_urls_are_invalid_argument() {
        for bad in [
            "",
            "redis",
            "redis://",
            "http://127.0.0.1:6379",
            "redis://127.0.0.1:notaport",
            "redis://127.0.0.1/notadb",
            "redis://127.0.0.1?default_ttl_ms=soon",
            "redis://127.0.0.1?default_ttl_ms=0",
            "redis://127.0.0.1?key_prefix=a%7Bb",
            "redis://127.0.0.1?connect_timeout_ms=0",
            "redis://127.0.0.1?default_ttl=10",
            "redis://127.0.0.1?operation_timeout=11m",
        ] {
            assert_eq!(
                kind(RedisConfig::from_url(bad)),
                ErrorKind::InvalidArgument,
                "{bad}"
            );
        }
        let c = RedisConfig::from_url("redis://127.0.0.1").unwrap();
        assert_eq!(
            kind(c.clone().key_prefix("{x}").validate()),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind(c.default_ttl(Duration::ZERO).validate()),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn tls_without_the_feature_is_unsupported() {
        let r = RedisConfig::from_url("rediss://127.0.0.1:6379");
        if cfg!(feature = "tls") {
            assert!(r.is_ok());
        } else {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported);
            assert!(e.message().contains("`tls` Cargo feature"), "{e}");
        }
    }

    #[test]
    fn release_signals_are_a_redlock_option_refused_for_one_server() {
        let on = RedLockConfig::from_url("redlock://a:1,b:2,c:3").unwrap();
        assert!(on.get_release_signals());
        let off = RedLockConfig::from_url("redlock://a:1,b:2,c:3?release_signals=false").unwrap();
        assert!(!off.get_release_signals());
        assert!(!on.release_signals(false).get_release_signals());
        let bad = RedLockConfig::from_url("redlock://a:1,b:2,c:3?release_signals=maybe");
        assert_eq!(bad.unwrap_err().kind(), ErrorKind::InvalidArgument);
        let single = RedisConfig::from_url("redis://a:1?release_signals=false");
        assert_eq!(single.unwrap_err().kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn redlock_urls_in_both_forms() {
        let a = RedLockConfig::from_url(
            "redlock://u:pw@127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382/1?key_prefix=rl",
        )
        .unwrap();
        assert_eq!(
            a.endpoints(),
            ["127.0.0.1:6380/1", "127.0.0.1:6381/1", "127.0.0.1:6382/1"]
        );
        assert_eq!(a.options.key_prefix, "rl");
        assert_eq!(a.quorum(), 2);
        let b = RedLockConfig::from_url(
            "redis://127.0.0.1:6380,redis://127.0.0.1:6381,redis://127.0.0.1:6382",
        )
        .unwrap();
        assert_eq!(
            b.endpoints(),
            ["127.0.0.1:6380", "127.0.0.1:6381", "127.0.0.1:6382"]
        );
        for bad in [
            "redlock://127.0.0.1:6380,127.0.0.1:6381",
            "redlock://127.0.0.1:6380,127.0.0.1:6380,127.0.0.1:6381",
            "redlock://127.0.0.1:6380,,127.0.0.1:6381",
            "redis://127.0.0.1:6380",
        ] {
            assert_eq!(
                kind(RedLockConfig::from_url(bad)),
                ErrorKind::InvalidArgument,
                "{bad}"
            );
        }
    }
}
