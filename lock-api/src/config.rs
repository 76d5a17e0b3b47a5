//! The configuration vocabulary every backend shares: one URL grammar, one set of client
//! options with one spelling, one duration syntax, and one way to say that an input is bad.
//!
//! # The shared options
//!
//! Every backend's config (`RedisConfig`, `MysqlConfig`, `MongoConfig`, `ZkConfig`,
//! `EtcdConfig`) takes the four [`ClientOptions`], from its URL's query and from setters of the
//! same names:
//!
//! | URL option | setter | meaning |
//! |---|---|---|
//! | `owner=NAME` | `owner(OwnerId)` | the client's owner id instead of a fresh random one |
//! | `default_ttl=30s` | `default_ttl(Duration)` | the lease of watchdog-managed locks (on ZooKeeper and etcd: the session / client lease every lock shares) |
//! | `connect_timeout=5s` | `connect_timeout(Duration)` | how long connecting may take before the server counts as unavailable |
//! | `operation_timeout=5s` | `operation_timeout(Duration)` | how long one server operation may take |
//!
//! **Durations** are a whole number with a unit: `500ms`, `10s` or `2m`. A bare number is
//! refused (is `10` ten seconds or ten milliseconds?), except under the `<name>_ms` spelling
//! earlier versions used, which takes whole milliseconds: `default_ttl_ms=1500` is
//! `default_ttl=1500ms`. Older per-backend names stay accepted as aliases: `response_timeout`
//! (Redis) and `request_timeout` (etcd) for `operation_timeout`, `lease_ttl` (etcd) and
//! `session_timeout` (ZooKeeper) for `default_ttl`. Timeouts lie in 1 ms ..= 10 min; TTLs are
//! checked by [`check_ttl`](crate::backend::check_ttl()).
//!
//! # Builder style
//!
//! Every config is built the same way: `from_url` parses (no I/O), setters return `Self` and
//! never fail, and `validate()` checks every option together — ranges, names, and rules that
//! tie two options (two table names that must differ, a namespace length). `from_url` and every
//! backend's `connect` call `validate()` before any I/O, so a bad value is an
//! [`ErrorKind::InvalidArgument`] naming the option, never a half-connected client. Getters are
//! named `get_<option>`, so they never collide with the setter of the same option.
//!
//! A bad URL is an [`ErrorKind::InvalidArgument`] whose message names the option and shows the
//! URL with its password replaced by `***` ([`redact`]).

use std::fmt;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::grant::check_ttl;
use crate::name::OwnerId;

/// The shortest connect or operation timeout a config accepts.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// The longest connect or operation timeout a config accepts.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// The options every backend's client takes, with one spelling in URLs and setters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// The client's owner id; `None` gives it a fresh random one.
    pub owner: Option<OwnerId>,
    /// The lease of watchdog-managed locks when the caller sets none.
    pub default_ttl: Duration,
    /// How long connecting may take before the server counts as unavailable.
    pub connect_timeout: Duration,
    /// How long one server operation may take before it fails as unavailable.
    pub operation_timeout: Duration,
}

impl ClientOptions {
    /// The options with a backend's defaults and no owner.
    pub const fn new(
        default_ttl: Duration,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Self {
        Self {
            owner: None,
            default_ttl,
            connect_timeout,
            operation_timeout,
        }
    }

    /// Takes the shared options (and their older spellings) out of `query`, leaving the rest.
    pub fn take_from(&mut self, query: &mut UrlQuery<'_>) -> Result<()> {
        if let Some(owner) = query.take_str("owner") {
            self.owner = Some(OwnerId::new(&owner).map_err(|e| {
                query
                    .url
                    .invalid(format!("option owner={owner:?}: {}", e.message()))
            })?);
        }
        if let Some(d) = query.take_duration(&["default_ttl"])? {
            self.default_ttl = d;
        }
        if let Some(d) = query.take_duration(&["connect_timeout"])? {
            self.connect_timeout = d;
        }
        let operation = ["operation_timeout", "request_timeout", "response_timeout"];
        if let Some(d) = query.take_duration(&operation)? {
            self.operation_timeout = d;
        }
        Ok(())
    }

    /// Checks the TTL and both timeouts; `backend` names the backend in the error.
    pub fn validate(&self, backend: &'static str) -> Result<()> {
        check_ttl(self.default_ttl).map_err(|e| {
            Error::invalid(format!("default TTL: {}", e.message())).with_backend(backend)
        })?;
        check_timeout(backend, "connect timeout", self.connect_timeout)?;
        check_timeout(backend, "operation timeout", self.operation_timeout)
    }
}

/// Rejects a timeout outside [`MIN_TIMEOUT`] ..= [`MAX_TIMEOUT`].
pub fn check_timeout(backend: &'static str, what: &str, timeout: Duration) -> Result<()> {
    if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&timeout) {
        return Err(
            Error::invalid(format!("{what} {timeout:?} is outside 1ms..=10min"))
                .with_backend(backend),
        );
    }
    Ok(())
}

/// Generates the setters and getters of the [`ClientOptions`] a backend's config keeps in
/// its field `$field`: `owner`, `default_ttl`, `connect_timeout`, `operation_timeout` (each
/// returning `Self`) and `get_owner`, `get_default_ttl`, `get_connect_timeout`,
/// `get_operation_timeout`. Use it inside the config's `impl` block.
#[macro_export]
macro_rules! client_option_methods {
    ($($field:ident).+) => {
        /// Acquires as `owner` by default instead of a fresh random owner id (URL `owner=`).
        pub fn owner(mut self, owner: $crate::OwnerId) -> Self {
            self.$($field).+.owner = Some(owner);
            self
        }

        /// The lease of watchdog-managed locks when the caller sets none (URL
        /// `default_ttl=`); checked by `validate`.
        pub fn default_ttl(mut self, ttl: ::std::time::Duration) -> Self {
            self.$($field).+.default_ttl = ttl;
            self
        }

        /// How long connecting may take before the server counts as unavailable (URL
        /// `connect_timeout=`, 1 ms ..= 10 min); checked by `validate`.
        pub fn connect_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.$($field).+.connect_timeout = timeout;
            self
        }

        /// How long one server operation may take before it fails as unavailable (URL
        /// `operation_timeout=`, 1 ms ..= 10 min); checked by `validate`.
        pub fn operation_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.$($field).+.operation_timeout = timeout;
            self
        }

        /// The configured owner id, if any.
        pub fn get_owner(&self) -> Option<&$crate::OwnerId> {
            self.$($field).+.owner.as_ref()
        }

        /// The default lease of watchdog-managed locks.
        pub fn get_default_ttl(&self) -> ::std::time::Duration {
            self.$($field).+.default_ttl
        }

        /// The connect timeout.
        pub fn get_connect_timeout(&self) -> ::std::time::Duration {
            self.$($field).+.connect_timeout
        }

        /// The operation timeout.
        pub fn get_operation_timeout(&self) -> ::std::time::Duration {
            self.$($field).+.operation_timeout
        }
    };
}

/// `500ms`, `10s` or `2m`; `None` for anything else (a bare number included).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

/// The URL with any password replaced by `***`, for messages and `Debug`.
pub fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |s| s + 3);
    let Some(at) = url[start..].rfind('@').map(|a| a + start) else {
        return url.to_string();
    };
    match url[start..at].split_once(':') {
        Some((user, _)) => format!("{}{user}:***{}", &url[..start], &url[at..]),
        None => url.to_string(),
    }
}

/// Decodes `%XX` escapes strictly: a `%` not followed by two hex digits, or bytes that are not
/// UTF-8, is `None` (where a lenient decoder would pass a typo through).
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let escapes_ok = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_ok {
        return None;
    }
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

/// One `host[:port]` of a URL's host list; an IPv6 host is kept without its brackets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    /// The host name or address (IPv6 without brackets).
    pub host: String,
    /// The port, the backend's default when the URL names none.
    pub port: u16,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A URL cut at the places every backend's grammar shares:
/// `scheme://[user[:password]@]host[:port][,host[:port]…][/path][?query]`.
#[derive(Clone, Copy, Debug)]
pub struct ConfigUrl<'a> {
    backend: &'static str,
    raw: &'a str,
    /// The scheme as written (compare it case-insensitively).
    pub scheme: &'a str,
    /// The user, still percent-encoded ([`ConfigUrl::decode`] it).
    pub user: Option<&'a str>,
    /// The password, still percent-encoded.
    pub password: Option<&'a str>,
    /// The host list, comma-separated ([`ConfigUrl::hosts`] parses it).
    pub hosts: &'a str,
    /// The path from its leading `/`, still percent-encoded; `None` when absent.
    pub path: Option<&'a str>,
    /// The query after `?`; `None` when absent.
    pub query: Option<&'a str>,
}

impl<'a> ConfigUrl<'a> {
    /// Cuts `raw` for `backend`, whose name the errors carry. A URL without `scheme://` or
    /// with a `#fragment` is [`ErrorKind::InvalidArgument`].
    pub fn parse(backend: &'static str, raw: &'a str) -> Result<Self> {
        let mut url = Self {
            backend,
            raw,
            scheme: "",
            user: None,
            password: None,
            hosts: "",
            path: None,
            query: None,
        };
        let Some((scheme, rest)) = raw.split_once("://").filter(|(s, _)| !s.is_empty()) else {
            return Err(url.invalid("not a URL: expected scheme://host…"));
        };
        if rest.contains('#') {
            return Err(url.invalid("a lock URL takes no #fragment"));
        }
        url.scheme = scheme;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        url.query = query;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        url.path = path;
        url.hosts = authority;
        if let Some((userinfo, hosts)) = authority.rsplit_once('@') {
            url.hosts = hosts;
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            url.user = Some(user);
            url.password = password;
        }
        Ok(url)
    }

    /// An [`ErrorKind::InvalidArgument`] about this URL: the backend, the redacted URL, `why`.
    pub fn invalid(&self, why: impl fmt::Display) -> Error {
        Error::invalid(format!("bad URL {:?}: {why}", redact(self.raw))).with_backend(self.backend)
    }

    /// Like [`invalid`](ConfigUrl::invalid) with another kind (say, `Unsupported` for TLS a
    /// build lacks).
    pub fn error(&self, kind: ErrorKind, why: impl fmt::Display) -> Error {
        Error::new(kind, format!("URL {:?}: {why}", redact(self.raw))).with_backend(self.backend)
    }

    /// Percent-decodes the URL part `what` (named in the error).
    pub fn decode(&self, text: &str, what: &str) -> Result<String> {
        percent_decode(text)
            .ok_or_else(|| self.invalid(format!("the {what} is not valid %-encoded UTF-8")))
    }

    /// Parses the host list: `host`, `host:port`, `[v6]` or `[v6]:port`, comma-separated, the
    /// port defaulting to `default_port`. Hosts are letters, digits, `.`, `-` and `_`.
    pub fn hosts(&self, default_port: u16) -> Result<Vec<HostPort>> {
        if self.hosts.is_empty() {
            return Err(self.invalid("no host"));
        }
        self.hosts
            .split(',')
            .map(|entry| self.host(entry, default_port))
            .collect()
    }

    fn host(&self, entry: &str, default_port: u16) -> Result<HostPort> {
        let bad = |why: &str| self.invalid(format!("host {entry:?}: {why}"));
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (v6, after) = rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            if v6.is_empty()
                || !v6
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || ":.".contains(c))
            {
                return Err(bad("not an IPv6 address"));
            }
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ']'"))?),
            };
            (v6, port)
        } else {
            let (host, port) = match entry.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (entry, None),
            };
            let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
            if host.is_empty() || !host.chars().all(ok) {
                return Err(bad("a host is letters, digits, '.', '-' and '_'"));
            }
            (host, port)
        };
        let port = match port.map(str::parse::<u16>) {
            None => default_port,
            Some(Ok(p)) if p > 0 => p,
            Some(_) => return Err(bad("the port must be 1..=65535")),
        };
        Ok(HostPort {
            host: host.to_string(),
            port,
        })
    }

    /// The query's options, percent-decoded, to be taken one by one.
    pub fn options(&self) -> Result<UrlQuery<'a>> {
        let mut pairs = Vec::new();
        for raw in self
            .query
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = raw
                .split_once('=')
                .ok_or_else(|| self.invalid(format!("option {raw:?} has no value")))?;
            let key = self.decode(k, "option name")?;
            let value = self.decode(v, &format!("value of option {key}"))?;
            pairs.push(Pair { key, value, raw });
        }
        Ok(UrlQuery { url: *self, pairs })
    }
}

#[derive(Debug)]
struct Pair<'a> {
    key: String,
    value: String,
    raw: &'a str,
}

/// A URL's query options, percent-decoded. Each backend takes the ones it knows (the shared
/// ones through [`ClientOptions::take_from`]); what is left is either an error
/// ([`finish`](UrlQuery::finish)) or handed to the driver ([`rest`](UrlQuery::rest)).
#[derive(Debug)]
pub struct UrlQuery<'a> {
    url: ConfigUrl<'a>,
    pairs: Vec<Pair<'a>>,
}

impl UrlQuery<'_> {
    /// Removes every `name=…` and returns the last value.
    pub fn take_str(&mut self, name: &str) -> Option<String> {
        let mut found = None;
        self.pairs.retain(|p| {
            let hit = p.key == name;
            if hit {
                found = Some(p.value.clone());
            }
            !hit
        });
        found
    }

    /// Removes `name=<value>` and parses the value as `what` (for the error: "a whole number").
    pub fn take_parsed<T: std::str::FromStr>(
        &mut self,
        name: &str,
        what: &str,
    ) -> Result<Option<T>> {
        self.take_str(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| self.invalid(name, &v, &format!("is not {what}")))
            })
            .transpose()
    }

    /// Removes `name=true|false` (or `1`/`0`).
    pub fn take_bool(&mut self, name: &str) -> Result<Option<bool>> {
        self.take_str(name)
            .map(|v| match v.as_str() {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(self.invalid(name, &v, "is not true or false")),
            })
            .transpose()
    }

    /// Removes the first of `names` given, as `<name>=<n><unit>` or `<name>_ms=<n>`.
    pub fn take_duration(&mut self, names: &[&str]) -> Result<Option<Duration>> {
        let mut found = None;
        for name in names {
            if let Some(v) = self.take_str(name) {
                let d = parse_duration(&v).ok_or_else(|| {
                    self.invalid(
                        name,
                        &v,
                        "is not a whole number with a unit (500ms, 10s, 2m)",
                    )
                })?;
                found = found.or(Some(d));
            }
            let legacy = format!("{name}_ms");
            if let Some(v) = self.take_str(&legacy) {
                let ms = v.parse::<u64>().map_err(|_| {
                    self.invalid(&legacy, &v, "is not a whole number of milliseconds")
                })?;
                found = found.or(Some(Duration::from_millis(ms)));
            }
        }
        Ok(found)
    }

    /// An [`ErrorKind::InvalidArgument`] naming option `name=value` and the redacted URL.
    pub fn invalid(&self, name: &str, value: &str, why: &str) -> Error {
        self.url.invalid(format!("option {name}={value:?} {why}"))
    }

    /// Succeeds if every option was taken; otherwise names the first unknown one and lists
    /// `known` (the backend's own) with the shared ones.
    pub fn finish(self, known: &[&str]) -> Result<()> {
        match self.pairs.first() {
            None => Ok(()),
            Some(p) => Err(self.url.invalid(format!(
                "unknown option {:?} (known: {}owner, default_ttl, connect_timeout, \
                 operation_timeout)",
                p.key,
                known.iter().map(|k| format!("{k}, ")).collect::<String>()
            ))),
        }
    }

    /// The options not taken, as the URL spelled them (for the driver); `None` if none.
    pub fn rest(&self) -> Option<String> {
        let raw: Vec<&str> = self.pairs.iter().map(|p| p.raw).collect();
        (!raw.is_empty()).then(|| raw.join("&"))
    }
}

#[cfg(test)]
mod tests;
