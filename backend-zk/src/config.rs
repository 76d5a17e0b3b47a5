//! Parsing and validating the ZooKeeper backend's configuration, with no I/O.

use std::fmt;
use std::time::Duration;

use distlock_api::{Error, OwnerId, Result};

/// The port a host without one is reached on.
pub const DEFAULT_PORT: u16 = 2181;
/// The session timeout asked of the server unless the URL or [`ZkConfig::session_timeout`]
/// say otherwise. The server clamps it to its own `[minSessionTimeout, maxSessionTimeout]`
/// (by default 2 and 20 times its `tickTime`, 4 s and 40 s with the stock 2 s tick).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `connect` may take to establish a session, unless the URL or
/// [`ZkConfig::connect_timeout`] say otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Where lock nodes live (under the chroot, if the URL names one).
pub const DEFAULT_BASE_PATH: &str = "/distlock";

/// The longest session timeout a client may ask for: ZooKeeper carries it as an `int` of
/// milliseconds, and no stock server grants more than its `maxSessionTimeout` anyway.
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(600);

/// How to reach the ensemble and where the lock nodes live.
///
/// ```
/// use std::time::Duration;
/// use distlock_zk::ZkConfig;
///
/// let config = ZkConfig::from_url("zk://zk1:2181,zk2:2181,zk3/apps?session_timeout_ms=6000")?
///     .base_path("/locks")?
///     .connect_timeout(Duration::from_secs(3))?;
/// assert_eq!(config.hosts(), "zk1:2181,zk2:2181,zk3:2181");
/// assert_eq!(config.chroot(), Some("/apps"));
/// assert_eq!(config.base(), "/locks");
/// assert_eq!(config.requested_session_timeout(), Duration::from_secs(6));
/// # Ok::<_, distlock_zk::Error>(())
/// ```
#[derive(Clone)]
pub struct ZkConfig {
    pub(crate) hosts: String,
    pub(crate) chroot: Option<String>,
    pub(crate) base_path: String,
    pub(crate) session_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) owner: Option<OwnerId>,
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("base_path", &self.base_path)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("owner", &self.owner)
            .finish()
    }
}

impl ZkConfig {
    /// A configuration for the ensemble at `hosts` (`host[:port]`, comma-separated), with the
    /// defaults for everything else.
    pub fn new(hosts: &str) -> Result<Self> {
        Ok(Self {
            hosts: parse_hosts(hosts)?,
            chroot: None,
            base_path: DEFAULT_BASE_PATH.to_string(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            owner: None,
        })
    }

    /// Parses `zk://host1[:port],host2[:port]/chroot?option=value&…`.
    ///
    /// The chroot is optional; it is created (as persistent nodes) if missing. Options:
    /// `session_timeout_ms`, `connect_timeout_ms` and `base_path` (URL-escaped where needed),
    /// the same as the setters below. Credentials in the URL, an unknown option, a bad host,
    /// port or path are [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("zk://")
            .ok_or_else(|| invalid(format!("{url:?} is not a zk:// URL")))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        if rest.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err(invalid("a zk:// URL takes no #fragment"));
        }
        let (hosts, chroot) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if hosts.contains('@') {
            return Err(invalid(
                "credentials in a zk:// URL are not supported: the backend creates its nodes \
                 with open ACLs and does not authenticate",
            ));
        }
        let mut config = Self::new(hosts)?;
        if !chroot.is_empty() && chroot != "/" {
            let chroot = percent_decode(chroot)
                .ok_or_else(|| invalid(format!("chroot {chroot:?} is not valid %-encoding")))?;
            validate_path("chroot", &chroot)?;
            config.chroot = Some(chroot);
        }
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| invalid(format!("option {pair:?} has no value")))?;
            let value = percent_decode(value).ok_or_else(|| {
                invalid(format!("option {key}: {value:?} is not valid %-encoding"))
            })?;
            config = match key {
                "session_timeout_ms" => config.session_timeout(millis(key, &value)?)?,
                "connect_timeout_ms" => config.connect_timeout(millis(key, &value)?)?,
                "base_path" => config.base_path(value)?,
                other => {
                    return Err(invalid(format!(
                        "unknown zk:// option {other:?}: expected session_timeout_ms, \
                         connect_timeout_ms or base_path"
                    )))
                }
            };
        }
        Ok(config)
    }

    /// Keeps lock nodes under `path` (absolute, under the chroot; default `/distlock`). It is
    /// created as persistent nodes if missing; each lock is a container node below it.
    pub fn base_path(mut self, path: impl Into<String>) -> Result<Self> {
        let path = path.into();
        validate_path("base path", &path)?;
        self.base_path = path;
        Ok(self)
    }

    /// The session timeout to ask for: the lease of every lock this client holds. The server
    /// clamps it to its limits; [`ZkLock::session_timeout`](crate::ZkLock::session_timeout)
    /// reports what it granted. 1 ms ..= 24 h.
    pub fn session_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_range("session timeout", timeout, MAX_SESSION_TIMEOUT)?;
        self.session_timeout = timeout;
        Ok(self)
    }

    /// How long `connect` may take to establish a session (and create the base path) before
    /// it fails with `Unavailable`. Also the bound of each reconnect attempt after a session
    /// is lost. 1 ms ..= 10 min.
    pub fn connect_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_range("connect timeout", timeout, MAX_CONNECT_TIMEOUT)?;
        self.connect_timeout = timeout;
        Ok(self)
    }

    /// Uses `owner` as the client's owner id instead of a fresh random one.
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
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
    pub fn base(&self) -> &str {
        &self.base_path
    }

    /// The session timeout this config asks for (the server may grant another).
    pub fn requested_session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// How long `connect` may take.
    pub fn requested_connect_timeout(&self) -> Duration {
        self.connect_timeout
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
    Error::invalid(message).with_backend("zk")
}

fn check_range(what: &str, d: Duration, max: Duration) -> Result<()> {
    if d < Duration::from_millis(1) || d > max {
        return Err(invalid(format!(
            "{what} {d:?} is out of range: 1ms ..= {max:?}"
        )));
    }
    Ok(())
}

fn millis(key: &str, value: &str) -> Result<Duration> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| {
            invalid(format!(
                "option {key}: {value:?} is not a whole number of ms"
            ))
        })
}

/// Normalises `host[:port],…` into the connect string the client takes, port defaulted.
fn parse_hosts(hosts: &str) -> Result<String> {
    if hosts.is_empty() {
        return Err(invalid("a zk:// URL needs at least one host"));
    }
    let mut out = Vec::new();
    for entry in hosts.split(',') {
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            // [v6]:port
            let (h, after) = rest
                .split_once(']')
                .ok_or_else(|| invalid(format!("host {entry:?} has an unclosed '['")))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| {
                    invalid(format!("host {entry:?}: expected ':port' after ']'"))
                })?),
            };
            (format!("[{h}]"), port)
        } else {
            match entry.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (entry.to_string(), None),
            }
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let host_ok = !bare.is_empty()
            && bare
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'));
        if !host_ok {
            return Err(invalid(format!("bad host {entry:?} in {hosts:?}")));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(invalid(format!("bad port in {entry:?}"))),
            },
        };
        out.push(format!("{host}:{port}"));
    }
    Ok(out.join(","))
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

fn percent_decode(s: &str) -> Option<String> {
    crate::path::percent_decode(s)
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
        assert_eq!(c.base(), DEFAULT_BASE_PATH);
        assert_eq!(c.absolute_base(), "/distlock");
        assert_eq!(c.requested_session_timeout(), DEFAULT_SESSION_TIMEOUT);

        let c = ZkConfig::from_url(
            "zk://a,b:2182,[::1]:2183,[fe80::1]/app/x?session_timeout_ms=1500&connect_timeout_ms=250&base_path=%2Flocks%2Fv1",
        )
        .unwrap();
        assert_eq!(c.hosts(), "a:2181,b:2182,[::1]:2183,[fe80::1]:2181");
        assert_eq!(c.chroot(), Some("/app/x"));
        assert_eq!(c.base(), "/locks/v1");
        assert_eq!(c.absolute_base(), "/app/x/locks/v1");
        assert_eq!(c.requested_session_timeout(), Duration::from_millis(1500));
        assert_eq!(c.requested_connect_timeout(), Duration::from_millis(250));

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
        assert!(c.clone().session_timeout(Duration::ZERO).is_err());
        assert!(c
            .clone()
            .session_timeout(MAX_SESSION_TIMEOUT + Duration::from_secs(1))
            .is_err());
        assert!(c.clone().connect_timeout(Duration::from_secs(601)).is_err());
        assert!(c.clone().base_path("").is_err());
        assert!(c.clone().base_path("/a\u{1}").is_err());
        assert!(c.clone().base_path("/🔒").is_err());
        assert_eq!(c.base_path("/ok/é").unwrap().base(), "/ok/é");
    }
}
