//! Parsing and validating the ZooKeeper backend's configuration, with no I/O. The shared
//! options and the builder style are those of [`distlock_api::config`].

use std::fmt;
use std::time::Duration;

use distlock_api::config::ConfigUrl;
use distlock_api::{ClientOptions, Error, Result};

/// The port a host without one is reached on.
pub const DEFAULT_PORT: u16 = 2181;
/// The session timeout asked of the server unless the URL or [`ZkConfig::default_ttl`] say
/// otherwise. The server clamps it to its own `[minSessionTimeout, maxSessionTimeout]` (by
/// default 2 and 20 times its `tickTime`, 4 s and 40 s with the stock 2 s tick).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `connect` may take to establish a session, unless the URL or
/// [`ZkConfig::connect_timeout`] say otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest bound of one request (each is bounded by the longer of this and the session
/// timeout: a request may take as long as the session survives without the server).
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// Where lock nodes live (under the chroot, if the URL names one).
pub const DEFAULT_BASE_PATH: &str = "/distlock";

/// The longest session timeout a client may ask for: ZooKeeper carries it as an `int` of
/// milliseconds, and no stock server grants more than its `maxSessionTimeout` anyway.
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

const BACKEND: &str = "zk";

/// How to reach the ensemble and where the lock nodes live.
///
/// ```
/// use std::time::Duration;
/// use distlock_zk::ZkConfig;
///
/// let config = ZkConfig::from_url("zk://zk1:2181,zk2:2181,zk3/apps?default_ttl=6s")?
///     .base_path("/locks")
///     .connect_timeout(Duration::from_secs(3));
/// config.validate()?;
/// assert_eq!(config.hosts(), "zk1:2181,zk2:2181,zk3:2181");
/// assert_eq!(config.chroot(), Some("/apps"));
/// assert_eq!(config.get_base_path(), "/locks");
/// assert_eq!(config.get_default_ttl(), Duration::from_secs(6));
/// # Ok::<_, distlock_zk::Error>(())
/// ```
#[derive(Clone)]
pub struct ZkConfig {
    pub(crate) hosts: String,
    pub(crate) chroot: Option<String>,
    pub(crate) base_path: String,
    /// `default_ttl` is the session timeout asked for: the lease of every lock.
    pub(crate) client: ClientOptions,
    /// The application's session builder (see [`ZkConfig::connector`]).
    pub(crate) connector: Option<zookeeper_client::Connector>,
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("base_path", &self.base_path)
            .field("client", &self.client)
            .field("own_connector", &self.connector.is_some())
            .finish()
    }
}

impl ZkConfig {
    /// A configuration for the ensemble at `hosts` (`host[:port]`, comma-separated), with the
    /// defaults for everything else.
    pub fn new(hosts: &str) -> Result<Self> {
        Self::from_url(&format!("zk://{hosts}"))
    }

    /// Parses `zk://host1[:port],host2[:port]/chroot?option=value&…`.
    ///
    /// The chroot is optional; it is created (as persistent nodes) if missing. Options: the
    /// shared ones of [`distlock_api::config`] (`default_ttl` is the session timeout asked for;
    /// `session_timeout` is accepted as its older name) and `base_path` (URL-escaped where
    /// needed). Credentials in the URL, an unknown option, a bad host, port or path are
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn from_url(raw: &str) -> Result<Self> {
        let url = ConfigUrl::parse(BACKEND, raw)?;
        if !url.scheme.eq_ignore_ascii_case("zk") {
            return Err(url.invalid("not a zk:// URL"));
        }
        if url.user.is_some() {
            return Err(url.invalid(
                "credentials in a zk:// URL are not supported: the backend creates its nodes \
                 with open ACLs and does not authenticate",
            ));
        }
        let hosts: Vec<String> = (url.hosts(DEFAULT_PORT)?.iter())
            .map(ToString::to_string)
            .collect();
        let mut config = Self {
            hosts: hosts.join(","),
            chroot: None,
            base_path: DEFAULT_BASE_PATH.to_string(),
            client: ClientOptions::new(
                DEFAULT_SESSION_TIMEOUT,
                DEFAULT_CONNECT_TIMEOUT,
                DEFAULT_OPERATION_TIMEOUT,
            ),
            connector: None,
        };
        match url.path {
            None | Some("/") => {}
            Some(chroot) => config.chroot = Some(url.decode(chroot, "chroot")?),
        }
        let mut query = url.options()?;
        if let Some(ttl) = query.take_duration(&["session_timeout"])? {
            config.client.default_ttl = ttl;
        }
        config.client.take_from(&mut query)?;
        if let Some(base) = query.take_str("base_path") {
            config.base_path = base;
        }
        query.finish(&["base_path"])?;
        config.validate()?;
        Ok(config)
    }

    distlock_api::client_option_methods!(client);

    /// Keeps lock nodes under `path` (absolute, under the chroot; default `/distlock`). It is
    /// created as persistent nodes if missing; each lock is a container node below it.
    pub fn base_path(mut self, path: impl Into<String>) -> Self {
        self.base_path = path.into();
        self
    }

    /// Opens every session with the application's own driver `Connector`: its authentication
    /// (`with_auth`, e.g. digest), TLS, SASL and connection timeout. A ZooKeeper lock lives and
    /// dies with its session, and the client opens a fresh session after one ends, so it takes
    /// the recipe for a session rather than one `Client`. The session timeout asked for is still
    /// [`default_ttl`](Self::default_ttl) (the lease of every lock), set on each session.
    ///
    /// ```
    /// use distlock_zk::{zookeeper_client, ZkConfig};
    ///
    /// let connector = zookeeper_client::Client::connector().with_auth("digest", b"app:secret");
    /// let config = ZkConfig::new("127.0.0.1:2181")?.connector(connector);
    /// # Ok::<_, distlock_zk::Error>(())
    /// ```
    pub fn connector(mut self, connector: zookeeper_client::Connector) -> Self {
        self.connector = Some(connector);
        self
    }

    /// Checks every option; [`ZkLock::connect`](crate::ZkLock::connect) calls it before any
    /// I/O. The TTL ([`default_ttl`](ZkConfig::default_ttl)) is the session timeout to ask for,
    /// 1 ms ..= 24 h: the lease of every lock this client holds. The server clamps it to its
    /// limits; [`ZkLock::session_timeout`](crate::ZkLock::session_timeout) reports what it
    /// granted. The connect timeout also bounds each reconnect attempt after a session is lost.
    pub fn validate(&self) -> Result<()> {
        if let Some(chroot) = &self.chroot {
            validate_path("chroot", chroot)?;
        }
        validate_path("base path", &self.base_path)?;
        let ttl = self.client.default_ttl;
        if ttl > MAX_SESSION_TIMEOUT {
            return Err(invalid(format!(
                "session timeout {ttl:?} is out of range: 1ms ..= {MAX_SESSION_TIMEOUT:?}"
            )));
        }
        self.client.validate(BACKEND)
    }

    /// The ensemble, as the connect string the client uses (`host:port,…`).
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The chroot every path is under, if any.
    pub fn chroot(&self) -> Option<&str> {
        self.chroot.as_deref()
    }

    /// The base path lock nodes live under (below the chroot).
    pub fn get_base_path(&self) -> &str {
        &self.base_path
    }

    /// The base path as the server sees it: chroot plus base path.
    pub(crate) fn absolute_base(&self) -> String {
        match &self.chroot {
            None => self.base_path.clone(),
            Some(root) if self.base_path == "/" => root.clone(),
            Some(root) => format!("{root}{}", self.base_path),
        }
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::invalid(message).with_backend(BACKEND)
}

/// Checks an absolute ZooKeeper path the way the server would, so a bad one is
/// `InvalidArgument` here rather than a server error later.
fn validate_path(what: &str, path: &str) -> Result<()> {
    if !path.starts_with('/') {
        return Err(invalid(format!("{what} {path:?} must start with '/'")));
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(invalid(format!("{what} {path:?} must not end with '/'")));
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return Err(invalid(format!("{what} {path:?} has an empty segment")));
        }
        if segment == "." || segment == ".." {
            return Err(invalid(format!("{what} {path:?} has a relative segment")));
        }
        if let Some(c) = segment.chars().find(|&c| crate::path::unstorable(c)) {
            return Err(invalid(format!(
                "{what} {path:?} has U+{:04X}, which ZooKeeper does not accept in paths",
                c as u32
            )));
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return Err(invalid(format!(
            "{what} {path:?} is inside ZooKeeper's reserved /zookeeper tree"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::ErrorKind;

    #[test]
    fn urls_with_hosts_chroot_and_options() {
        let c = ZkConfig::from_url("zk://127.0.0.1:2181").unwrap();
        assert_eq!(c.hosts(), "127.0.0.1:2181");
        assert_eq!(c.chroot(), None);
        assert_eq!(c.get_base_path(), DEFAULT_BASE_PATH);
        assert_eq!(c.absolute_base(), "/distlock");
        assert_eq!(c.get_default_ttl(), DEFAULT_SESSION_TIMEOUT);

        let c = ZkConfig::from_url(
            "zk://a,b:2182,[::1]:2183,[fe80::1]/app/x?session_timeout_ms=1500&connect_timeout_ms=250&base_path=%2Flocks%2Fv1",
        )
        .unwrap();
        assert_eq!(c.hosts(), "a:2181,b:2182,[::1]:2183,[fe80::1]:2181");
        assert_eq!(c.chroot(), Some("/app/x"));
        assert_eq!(c.get_base_path(), "/locks/v1");
        assert_eq!(c.absolute_base(), "/app/x/locks/v1");
        assert_eq!(c.get_default_ttl(), Duration::from_millis(1500));
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(250));

        let c = ZkConfig::from_url("zk://h/?base_path=/").unwrap();
        assert_eq!(c.chroot(), None);
        assert_eq!(c.absolute_base(), "/");
        let c = ZkConfig::from_url("zk://h/r?base_path=/").unwrap();
        assert_eq!(c.absolute_base(), "/r");
    }

    #[test]
    fn bad_urls_are_invalid_argument() {
        for bad in [
            "",
            "zk:/h",
            "redis://h:6379",
            "zk://",
            "zk:///chroot",
            "zk://h:0",
            "zk://h:65536",
            "zk://h:port",
            "zk://h,,g",
            "zk://[::1",
            "zk://[::1]x",
            "zk://user:pw@h",
            "zk://h/a//b",
            "zk://h/a/",
            "zk://h/a/../b",
            "zk://h/zookeeper",
            "zk://h/a%",
            "zk://h#frag",
            "zk://h?nope=1",
            "zk://h?session_timeout_ms",
            "zk://h?session_timeout_ms=abc",
            "zk://h?session_timeout_ms=0",
            "zk://h?connect_timeout_ms=-5",
            "zk://h?base_path=relative",
            "zk://h?base_path=/a/./b",
        ] {
            let e = ZkConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
            assert_eq!(e.backend(), Some("zk"));
        }
    }

    #[test]
    fn setters_validate() {
        let c = ZkConfig::new("h").unwrap();
        assert!(c.clone().default_ttl(Duration::ZERO).validate().is_err());
        assert!(c
            .clone()
            .default_ttl(MAX_SESSION_TIMEOUT + Duration::from_secs(1))
            .validate()
            .is_err());
        assert!(c
            .clone()
            .connect_timeout(Duration::from_secs(601))
            .validate()
            .is_err());
        assert!(c.clone().base_path("").validate().is_err());
        assert!(c.clone().base_path("/a\u{1}").validate().is_err());
        assert!(c.clone().base_path("/🔒").validate().is_err());
        let c = c.base_path("/ok/é");
        assert!(c.validate().is_ok());
        assert_eq!(c.get_base_path(), "/ok/é");
    }
}
