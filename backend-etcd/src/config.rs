//! Parsing and validating the etcd backend's configuration, with no I/O. The shared options
//! and the builder style are those of [`distlock_api::config`].

use std::fmt;
use std::time::Duration;

use distlock_api::config::ConfigUrl;
use distlock_api::{ClientOptions, Error, LockName, Result};

use crate::{keys, BACKEND};

/// The key prefix every lock key lives under unless the URL's path or
/// [`EtcdConfig::key_prefix`] name another.
pub const DEFAULT_KEY_PREFIX: &str = "/distlock";
/// The port used for an endpoint that names none.
pub const DEFAULT_PORT: u16 = 2379;
/// How long `connect` may take to reach a server and be granted the client's lease.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request (a transaction, a lease call, a watch being set up) may take.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// The client lease asked for unless configured: 1 s, which the server raises to its minimum
/// (2 s with default server settings).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(1);

/// How to reach the etcd cluster and where the lock keys live.
///
/// ```
/// use std::time::Duration;
/// use distlock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379/app/locks?default_ttl=10s")?
///     .connect_timeout(Duration::from_secs(3));
/// config.validate()?;
/// assert_eq!(config.endpoints(), ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
/// assert_eq!(config.get_key_prefix(), "/app/locks");
/// assert_eq!(config.get_default_ttl(), Duration::from_secs(10));
/// # Ok::<_, distlock_etcd::Error>(())
/// ```
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) key_prefix: String,
    pub(crate) client: ClientOptions,
    pub(crate) user: Option<(String, String)>,
    /// The application's own driver client (see [`EtcdConfig::from_client`]).
    pub(crate) given: Option<etcd_client::Client>,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("key_prefix", &self.key_prefix)
            .field("client", &self.client)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("own_client", &self.given.is_some())
            .finish()
    }
}

impl EtcdConfig {
    /// A config for these endpoints (`host:port`, `http://host:port`), with every other setting
    /// at its default.
    pub fn new<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Result<Self> {
        let hosts: Vec<String> = endpoints
            .into_iter()
            .map(|e| {
                let e = e.as_ref();
                e.strip_prefix("http://").unwrap_or(e).to_string()
            })
            .collect();
        let list = format!("etcd://{}", hosts.join(","));
        let url = ConfigUrl::parse(BACKEND, &list)?;
        if url.user.is_some() || url.path.is_some() || url.query.is_some() {
            return Err(url.invalid("an endpoint is host:port"));
        }
        let endpoints = (url.hosts(DEFAULT_PORT)?.iter())
            .map(|h| format!("http://{h}"))
            .collect();
        Ok(Self::with_defaults(endpoints, None))
    }

    /// `endpoints` (or a `given` client) with every other setting at its default.
    fn with_defaults(endpoints: Vec<String>, given: Option<etcd_client::Client>) -> Self {
        Self {
            endpoints,
            key_prefix: DEFAULT_KEY_PREFIX.to_string(),
            client: ClientOptions::new(
                DEFAULT_LEASE_TTL,
                DEFAULT_CONNECT_TIMEOUT,
                DEFAULT_OPERATION_TIMEOUT,
            ),
            user: None,
            given,
        }
    }

    /// Uses an `etcd_client::Client` the application connected itself, with its endpoints,
    /// TLS and credentials, sharing its connection ([`user`](Self::user) does not apply to
    /// it). Every other setting keeps its default. The client fails over between endpoints
    /// the way the driver does (a config from URLs keeps one driver client per endpoint
    /// instead, see the crate docs); [`endpoints`](Self::endpoints) then names the given
    /// client rather than its addresses.
    pub fn from_client(client: etcd_client::Client) -> Self {
        Self::with_defaults(
            vec!["the application's etcd client".to_string()],
            Some(client),
        )
    }

    /// Parses `etcd://[user:password@]host[:port][,host[:port]…][/key/prefix][?options]`
    /// (`http://` is accepted for `etcd://`). The port defaults to 2379; the path, if any, is
    /// the key prefix (default `/distlock`). Options: the shared ones of
    /// [`distlock_api::config`] (`default_ttl` is the client lease; `lease_ttl` and
    /// `request_timeout` are accepted as older names).
    ///
    /// A malformed URL, an unknown option or a bad value is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument), before any I/O.
    pub fn from_url(raw: &str) -> Result<Self> {
        let url = ConfigUrl::parse(BACKEND, raw)?;
        match url.scheme.to_ascii_lowercase().as_str() {
            "etcd" | "http" => {}
            "https" => return Err(url.invalid("https:// (TLS) is not supported by distlock-etcd")),
            _ => return Err(url.invalid("expected etcd://host:port[,host:port…]")),
        }
        let mut config = Self::new(url.hosts.split(','))?;
        if let Some(user) = url.user {
            let password = (url.password)
                .ok_or_else(|| url.invalid("the user needs a password: user:password@host"))?;
            let name = url.decode(user, "user name")?;
            if name.is_empty() {
                return Err(url.invalid("the user name is empty"));
            }
            config.user = Some((name, url.decode(password, "password")?));
        }
        if let Some(path) = url.path {
            let path = url.decode(path, "key prefix")?;
            if path != "/" {
                config = config.key_prefix(path);
            }
        }
        let mut query = url.options()?;
        if let Some(ttl) = query.take_duration(&["lease_ttl"])? {
            config.client.default_ttl = ttl;
        }
        config.client.take_from(&mut query)?;
        query.finish(&[])?;
        config.validate()?;
        Ok(config)
    }

    distlock_api::client_option_methods!(client);

    /// Keeps the lock keys under `prefix` (default `/distlock`); a trailing `/` is dropped.
    /// Lock `name` lives at `<prefix>/<encoded name>/`, see [`EtcdConfig::lock_dir`].
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into().trim_end_matches('/').to_string();
        self
    }

    /// Authenticates as `name` with `password` (etcd's own user authentication).
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// Checks every option; [`EtcdLock::connect`](crate::EtcdLock::connect) calls it before any
    /// I/O. The lease ([`default_ttl`](EtcdConfig::default_ttl)) is asked for in whole seconds,
    /// rounded up; etcd raises anything shorter than its minimum to it, and the lease actually
    /// granted is what [`EtcdLock::lease_ttl`](crate::EtcdLock::lease_ttl) and every grant
    /// report. It bounds how long a crashed or partitioned client's locks outlive it, and how
    /// long a pause the client survives without losing them.
    pub fn validate(&self) -> Result<()> {
        let invalid = |why: String| Err(Error::invalid(why).with_backend(BACKEND));
        let prefix = &self.key_prefix;
        if let Some(c) = prefix.chars().find(|c| c.is_control()) {
            return invalid(format!(
                "key prefix {prefix:?} contains the control character U+{:04X}",
                c as u32
            ));
        }
        if prefix.len() > 1024 {
            return invalid(format!(
                "key prefix is {} bytes long; the limit is 1024",
                prefix.len()
            ));
        }
        if self.endpoints.is_empty() {
            return invalid("no etcd endpoint given".to_string());
        }
        self.client.validate(BACKEND)
    }

    /// The endpoints, as `http://host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix, without a trailing `/`.
    pub fn get_key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The key range (a prefix ending in `/`) that holds `name`'s holder and waiters, one key
    /// each: `<prefix>/<name with % and / percent-encoded>/`. No other name's keys start with
    /// it, so operators can list or delete one lock with `etcdctl get --prefix`.
    pub fn lock_dir(&self, name: &LockName) -> String {
        keys::lock_dir(&self.key_prefix, name.as_str())
    }

    /// The key of election `name`'s leader value, `<epoch>:<value>`: the lock's directory
    /// path without its trailing `/`, so outside every lock's directory.
    pub fn value_key(&self, name: &LockName) -> String {
        keys::value_key(&self.key_prefix, name.as_str())
    }

    /// The lease TTL to ask the server for, in its unit (whole seconds, rounded up).
    pub(crate) fn lease_ttl_secs(&self) -> i64 {
        let ttl = self.client.default_ttl;
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::ErrorKind;

    #[test]
    fn url_with_many_hosts_prefix_and_options() {
        let c = EtcdConfig::from_url(
            "etcd://u%40x:p%3Ass@h1:1,h2,[::1]:3/app%2Fx/locks/?lease_ttl=1500ms&connect_timeout=2s&request_timeout=1m&owner=me-1",
        )
        .unwrap();
        assert_eq!(
            c.endpoints(),
            ["http://h1:1", "http://h2:2379", "http://[::1]:3"]
        );
        assert_eq!(c.get_key_prefix(), "/app/x/locks");
        assert_eq!(c.get_default_ttl(), Duration::from_millis(1500));
        assert_eq!(c.lease_ttl_secs(), 2);
        assert_eq!(c.get_connect_timeout(), Duration::from_secs(2));
        assert_eq!(c.get_operation_timeout(), Duration::from_secs(60));
        assert_eq!(c.get_owner().map(|o| o.label()), Some("me-1"));
        assert_eq!(c.user, Some(("u@x".to_string(), "p:ss".to_string())));
        assert!(!format!("{c:?}").contains("p:ss"), "password in Debug");
    }

    #[test]
    fn defaults_and_http_scheme() {
        let c = EtcdConfig::from_url("http://127.0.0.1:2379").unwrap();
        assert_eq!(c.endpoints(), ["http://127.0.0.1:2379"]);
        assert_eq!(c.get_key_prefix(), DEFAULT_KEY_PREFIX);
        assert_eq!(c.get_default_ttl(), DEFAULT_LEASE_TTL);
        assert_eq!(c.lease_ttl_secs(), 1);
        assert_eq!(c.get_connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        let c = EtcdConfig::from_url("ETCD://localhost/").unwrap();
        assert_eq!(c.endpoints(), ["http://localhost:2379"]);
        assert_eq!(c.get_key_prefix(), DEFAULT_KEY_PREFIX);
    }

    #[test]
    fn bad_urls_are_invalid_argument() {
        for bad in [
            "",
            "127.0.0.1:2379",
            "redis://h:1",
            "https://h:2379",
            "etcd://",
            "etcd:///prefix",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h:port",
            "etcd://h1,,h2",
            "etcd://h one:1",
            "etcd://[::1",
            "etcd://[zz]:1",
            "etcd://h:1?lease_ttl=10",
            "etcd://h:1?lease_ttl=0s",
            "etcd://h:1?lease_ttl=10h",
            "etcd://h:1?connect_timeout=0ms",
            "etcd://h:1?request_timeout=11m",
            "etcd://h:1?owner=a%20b",
            "etcd://h:1?bogus=1",
            "etcd://h:1?lease_ttl",
            "etcd://user@h:1",
            "etcd://:pw@h:1",
            "etcd://h:1/%zz",
            "etcd://h:1/a%0Ab",
            "etcd://h:1#frag",
        ] {
            let e = EtcdConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
            assert_eq!(e.backend(), Some("etcd"), "{bad}: {e}");
        }
    }

    #[test]
    fn passwords_stay_out_of_errors() {
        let e = EtcdConfig::from_url("etcd://me:secret@").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = EtcdConfig::from_url("etcds://me:secret@h").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn lease_ttl_rounds_up_to_whole_seconds() {
        let c = EtcdConfig::new(["h:1"]).unwrap();
        for (ttl, secs) in [(1, 1), (999, 1), (1000, 1), (1001, 2), (30_000, 30)] {
            let c = c.clone().default_ttl(Duration::from_millis(ttl));
            c.validate().unwrap();
            assert_eq!(c.lease_ttl_secs(), secs, "{ttl} ms");
        }
        assert!(c.clone().default_ttl(Duration::ZERO).validate().is_err());
    }
}
