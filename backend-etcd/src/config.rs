//! Parsing and validating the etcd backend's configuration, with no I/O.

use std::fmt;
use std::time::Duration;

use distlock_api::{check_ttl, Error, LockName, OwnerId, Result};

use crate::keys;

/// The key prefix every lock key lives under unless the URL's path or
/// [`EtcdConfig::key_prefix`] name another.
pub const DEFAULT_KEY_PREFIX: &str = "/distlock";
/// The port used for an endpoint that names none.
pub const DEFAULT_PORT: u16 = 2379;
/// How long `connect` may take to reach a server and be granted the client's lease.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request (a transaction, a lease call, a watch being set up) may take.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest timeout the config accepts.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// How to reach the etcd cluster and where the lock keys live.
///
/// ```
/// use std::time::Duration;
/// use distlock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379/app/locks?lease_ttl=10s")?
///     .connect_timeout(Duration::from_secs(3))?;
/// assert_eq!(config.endpoints(), ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
/// assert_eq!(config.key_prefix_str(), "/app/locks");
/// assert_eq!(config.requested_lease_ttl(), Some(Duration::from_secs(10)));
/// # Ok::<_, distlock_etcd::Error>(())
/// ```
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) key_prefix: String,
    pub(crate) lease_ttl: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) owner: Option<OwnerId>,
    pub(crate) user: Option<(String, String)>,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("key_prefix", &self.key_prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("owner", &self.owner)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

impl EtcdConfig {
    /// A config for these endpoints (`host:port`, `http://host:port`), with every other setting
    /// at its default.
    pub fn new<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Result<Self> {
        let endpoints = endpoints
            .into_iter()
            .map(|e| {
                let e = e.as_ref();
                parse_endpoint(e.strip_prefix("http://").unwrap_or(e))
            })
            .collect::<Result<Vec<_>>>()?;
        if endpoints.is_empty() {
            return Err(invalid("no etcd endpoint given".to_string()));
        }
        Ok(Self {
            endpoints,
            key_prefix: DEFAULT_KEY_PREFIX.to_string(),
            lease_ttl: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            owner: None,
            user: None,
        })
    }

    /// Parses `etcd://[user:password@]host[:port][,host[:port]…][/key/prefix][?options]`
    /// (`http://` is accepted for `etcd://`). The port defaults to 2379; the path, if any, is
    /// the key prefix (default `/distlock`). Options (each also as `<name>_ms=<millis>`): `lease_ttl`, `connect_timeout`,
    /// `request_timeout` (a whole number with a unit: `500ms`, `10s`, `2m`) and `owner`.
    ///
    /// A malformed URL, an unknown option or a bad value is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument), before any I/O.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("etcd") => rest,
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
                return Err(invalid(
                    "https:// (TLS) is not supported by this build of distlock-etcd".to_string(),
                ))
            }
            _ => {
                return Err(invalid(format!(
                    "{:?} is not an etcd URL: expected etcd://host:port[,host:port…]",
                    redact(url)
                )))
            }
        };
        if rest.contains('#') {
            return Err(invalid("an etcd URL has no #fragment".to_string()));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        let (user, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (name, password) = userinfo.split_once(':').ok_or_else(|| {
                    invalid("the URL's user needs a password: user:password@host".to_string())
                })?;
                let name = percent_decode(name, "user name")?;
                if name.is_empty() {
                    return Err(invalid("the URL's user name is empty".to_string()));
                }
                (Some((name, percent_decode(password, "password")?)), hosts)
            }
            None => (None, authority),
        };
        if hosts.is_empty() {
            return Err(invalid(format!("no host in etcd URL {:?}", redact(url))));
        }
        let mut config = Self::new(hosts.split(','))?;
        config.user = user;
        if let Some(path) = path {
            let path = percent_decode(path, "key prefix")?;
            if path != "/" {
                config = config.key_prefix(path)?;
            }
        }
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| invalid(format!("URL option {pair:?} has no value")))?;
            let v = percent_decode(v, k)?;
            // `<option>_ms=<millis>`, as the other backends spell it, means `<option>=<n>ms`.
            let (k, v) = match k.strip_suffix("_ms") {
                Some(base) if v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty() => {
                    (base, format!("{v}ms"))
                }
                _ => (k, v.to_string()),
            };
            config = match k {
                "lease_ttl" => config.lease_ttl(parse_duration(k, &v)?)?,
                "connect_timeout" => config.connect_timeout(parse_duration(k, &v)?)?,
                "request_timeout" => config.request_timeout(parse_duration(k, &v)?)?,
                "owner" => {
                    config.owner(OwnerId::new(&v).map_err(|e| e.with_backend(crate::BACKEND))?)
                }
                _ => {
                    return Err(invalid(format!(
                        "unknown etcd URL option {k:?}: expected lease_ttl, connect_timeout, \
                         request_timeout or owner"
                    )))
                }
            };
        }
        Ok(config)
    }

    /// Keeps the lock keys under `prefix` (default `/distlock`); a trailing `/` is dropped.
    /// Lock `name` lives at `<prefix>/<encoded name>/`, see [`EtcdConfig::lock_dir`].
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        let trimmed = prefix.trim_end_matches('/');
        if let Some(c) = trimmed.chars().find(|c| c.is_control()) {
            return Err(invalid(format!(
                "key prefix {prefix:?} contains the control character U+{:04X}",
                c as u32
            )));
        }
        if trimmed.len() > 1024 {
            return Err(invalid(format!(
                "key prefix is {} bytes long; the limit is 1024",
                trimmed.len()
            )));
        }
        self.key_prefix = trimmed.to_string();
        Ok(self)
    }

    /// Asks for a client lease of `ttl` instead of the server's minimum. etcd counts leases in
    /// whole seconds and raises anything shorter than its minimum (2 s with default server
    /// settings) to it, so `ttl` is rounded up to whole seconds and the lease actually granted
    /// is what [`EtcdLock::lease_ttl`](crate::EtcdLock::lease_ttl) and every grant report.
    ///
    /// The lease bounds how long a crashed or partitioned client's locks outlive it, and how
    /// long a pause (GC, swap, VM migration) the client survives without losing them.
    pub fn lease_ttl(mut self, ttl: Duration) -> Result<Self> {
        check_ttl(ttl).map_err(|e| e.with_backend(crate::BACKEND))?;
        self.lease_ttl = Some(ttl);
        Ok(self)
    }

    /// How long `connect` may take to reach a server and be granted the client's lease
    /// (1 ms ..= 10 min, default 5 s); past it, `connect` fails with
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable).
    pub fn connect_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_timeout("connect timeout", timeout)?;
        self.connect_timeout = timeout;
        Ok(self)
    }

    /// How long one request may take (1 ms ..= 10 min, default 5 s); past it, the operation
    /// fails with [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable).
    pub fn request_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_timeout("request timeout", timeout)?;
        self.request_timeout = timeout;
        Ok(self)
    }

    /// Uses `owner` as the client's owner id instead of a fresh random one.
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Authenticates as `name` with `password` (etcd's own user authentication).
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// The endpoints, as `http://host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix, without a trailing `/`.
    pub fn key_prefix_str(&self) -> &str {
        &self.key_prefix
    }

    /// The lease TTL asked for; `None` asks for the server's minimum.
    pub fn requested_lease_ttl(&self) -> Option<Duration> {
        self.lease_ttl
    }

    /// The key range (a prefix ending in `/`) that holds `name`'s holder and waiters, one key
    /// each: `<prefix>/<name with % and / percent-encoded>/`. No other name's keys start with
    /// it, so operators can list or delete one lock with `etcdctl get --prefix`.
    pub fn lock_dir(&self, name: &LockName) -> String {
        keys::lock_dir(&self.key_prefix, name.as_str())
    }

    /// The lease TTL to ask the server for, in its unit (whole seconds, rounded up).
    pub(crate) fn lease_ttl_secs(&self) -> i64 {
        match self.lease_ttl {
            // The server raises 1 s to its minimum, which is what "no preference" means.
            None => 1,
            Some(ttl) => {
                let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
                i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
            }
        }
    }
}

fn invalid(message: String) -> Error {
    Error::invalid(message).with_backend(crate::BACKEND)
}

fn check_timeout(what: &str, timeout: Duration) -> Result<()> {
    if timeout < Duration::from_millis(1) || timeout > MAX_TIMEOUT {
        return Err(invalid(format!(
            "{what} {timeout:?} is outside 1ms..=10min"
        )));
    }
    Ok(())
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` to `http://host:port`.
fn parse_endpoint(endpoint: &str) -> Result<String> {
    let bad = |why: &str| invalid(format!("bad etcd endpoint {endpoint:?}: {why}"));
    let (host, port) = if let Some(rest) = endpoint.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(|| bad("unclosed ["))?;
        if v6.is_empty()
            || !v6
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(bad("not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
        };
        (format!("[{v6}]"), port)
    } else {
        let (host, port) = match endpoint.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (endpoint, None),
        };
        let host_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        if !host.chars().all(host_ok) {
            return Err(bad("a host is letters, digits, '.', '-' and '_'"));
        }
        (host.to_string(), port)
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(bad("the port must be 1..=65535")),
        },
    };
    Ok(format!("http://{host}:{port}"))
}

/// `500ms`, `10s`, `2m`.
fn parse_duration(option: &str, value: &str) -> Result<Duration> {
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        invalid(format!(
            "option {option}={value:?} is not a whole number with a unit (500ms, 10s, 2m)"
        ))
    })?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => {
            return Err(invalid(format!(
                "option {option}={value:?} needs a unit: ms, s or m"
            )))
        }
    };
    Ok(d)
}

fn percent_decode(s: &str, what: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| invalid(format!("bad percent-encoding in the URL's {what}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid(format!("the URL's {what} is not UTF-8")))
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
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
        assert_eq!(c.key_prefix_str(), "/app/x/locks");
        assert_eq!(c.requested_lease_ttl(), Some(Duration::from_millis(1500)));
        assert_eq!(c.lease_ttl_secs(), 2);
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.request_timeout, Duration::from_secs(60));
        assert_eq!(c.owner.as_ref().map(|o| o.label()), Some("me-1"));
        assert_eq!(c.user, Some(("u@x".to_string(), "p:ss".to_string())));
        assert!(!format!("{c:?}").contains("p:ss"), "password in Debug");
    }

    #[test]
    fn defaults_and_http_scheme() {
        let c = EtcdConfig::from_url("http://127.0.0.1:2379").unwrap();
        assert_eq!(c.endpoints(), ["http://127.0.0.1:2379"]);
        assert_eq!(c.key_prefix_str(), DEFAULT_KEY_PREFIX);
        assert_eq!(c.requested_lease_ttl(), None);
        assert_eq!(c.lease_ttl_secs(), 1);
        assert_eq!(c.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        let c = EtcdConfig::from_url("ETCD://localhost/").unwrap();
        assert_eq!(c.endpoints(), ["http://localhost:2379"]);
        assert_eq!(c.key_prefix_str(), DEFAULT_KEY_PREFIX);
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
            let c = c.clone().lease_ttl(Duration::from_millis(ttl)).unwrap();
            assert_eq!(c.lease_ttl_secs(), secs, "{ttl} ms");
        }
        assert!(c.clone().lease_ttl(Duration::ZERO).is_err());
    }
}
