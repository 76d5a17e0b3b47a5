//! Where a client connects: one server's endpoint parsed from its URL (or made from the
//! application's driver client), a cluster's seed endpoints, and the options every client
//! shares.

use std::fmt;
use std::time::Duration;

use distlock_api::config::{redact, ConfigUrl};
use distlock_api::{ClientOptions, Error, ErrorKind, Result, DEFAULT_TTL};

use crate::keys::{check_prefix, KeySpace};
use crate::replicas::SyncReplicas;

/// The name the config's errors carry.
pub(crate) const BACKEND: &str = "redis";

/// The key prefix used unless configured otherwise.
pub const DEFAULT_KEY_PREFIX: &str = "distlock";
/// How long connecting may take before the server counts as unavailable.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one command may wait for its answer before the server counts as unavailable.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

/// Options shared by the single-server and RedLock clients: the shared client options of
/// [`distlock_api::config`] (the operation timeout bounds each command's answer) and the key
/// prefix.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) key_prefix: String,
    pub(crate) client: ClientOptions,
    /// RedLock only: whether waiters listen to the masters' release messages (`None`: the
    /// default, on). Given for a single server, `validate` refuses it.
    pub(crate) release_signals: Option<bool>,
    /// `sync_replicas` and `sync_timeout` (single server, Sentinel, Cluster; RedLock refuses
    /// them).
    pub(crate) sync: SyncReplicas,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            key_prefix: DEFAULT_KEY_PREFIX.to_string(),
            release_signals: None,
            sync: SyncReplicas::default(),
            client: ClientOptions::new(
                DEFAULT_TTL,
                DEFAULT_CONNECT_TIMEOUT,
                DEFAULT_RESPONSE_TIMEOUT,
            ),
        }
    }
}

impl Options {
    pub(crate) fn validate(&self) -> Result<()> {
        check_prefix(&self.key_prefix)?;
        self.client.validate(BACKEND)?;
        self.sync.validate(self.client.operation_timeout)
    }

    pub(crate) fn keys(&self) -> KeySpace {
        KeySpace::new(&self.key_prefix)
    }
}

/// One Redis server's address, checked and ready for the driver.
#[derive(Clone)]
pub(crate) struct Endpoint {
    /// What errors and `Debug` show: host, port and database, never the password.
    pub(crate) display: String,
    pub(crate) client: redis::Client,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

/// Parses one `redis://` or `rediss://` URL, taking distlock's query options into `options`;
/// the rest go to the driver.
pub(crate) fn endpoint(raw: &str, options: &mut Options) -> Result<Endpoint> {
    let raw = raw.trim();
    let bad = |why: &str| Error::invalid(format!("bad Redis URL {:?}: {why}", redact(raw)));
    let cut = ConfigUrl::parse(BACKEND, raw)?;
    let mut query = cut.options()?;
    options.client.take_from(&mut query)?;
    if let Some(prefix) = query.take_str("key_prefix") {
        options.key_prefix = prefix;
    }
    if let Some(on) = query.take_bool("release_signals")? {
        options.release_signals = Some(on);
    }
    options.sync.take_from(&mut query)?;
    let base = raw.split_once('?').map_or(raw, |(b, _)| b);
    let driver_url = match query.rest() {
        Some(rest) => format!("{base}?{rest}"),
        None => base.to_string(),
    };
    let url = url::Url::parse(&driver_url).map_err(|e| bad(&e.to_string()))?;
    match url.scheme() {
        "redis" => {}
        "rediss" if cfg!(feature = "tls") => {}
        "rediss" => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{:?}: TLS (rediss://) needs distlock-redis's `tls` Cargo feature, which \
                     this build lacks",
                    redact(raw)
                ),
            ))
        }
        other => {
            return Err(bad(&format!(
                "scheme {other:?} is not redis:// or rediss://"
            )))
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    let display = format!(
        "{}:{}{}",
        url.host_str().unwrap_or_default(),
        url.port().unwrap_or(6379),
        match url.path().trim_matches('/') {
            "" | "0" => String::new(),
            db => format!("/{db}"),
        }
    );
    let client = redis::Client::open(url.as_str()).map_err(|e| bad(&e.to_string()))?;
    Ok(Endpoint { display, client })
}

/// The endpoint of a driver client the application made itself (its TLS, credentials and
/// protocol settings are used as they are).
pub(crate) fn endpoint_of_client(client: redis::Client) -> Endpoint {
    let info = client.get_connection_info();
    let display = format!(
        "{}{}",
        info.addr(),
        match info.redis_settings().db() {
            0 => String::new(),
            db => format!("/{db}"),
        }
    );
    Endpoint { display, client }
}

/// How to reach a cluster: its seed nodes (any of them; the rest are discovered).
#[derive(Clone, Debug)]
pub(crate) struct ClusterSpec {
    pub(crate) seeds: Vec<Endpoint>,
    /// Reach each seed's announced address at the address the URL gives for it (URL
    /// `map_seeds=true`): for a cluster behind address translation or proxies.
    pub(crate) map_seeds: bool,
}

/// Parses `redis+cluster://[user:password@]h1:port,h2:port,…[?options]` (or `rediss+cluster://`)
/// into one `redis://` (`rediss://`) endpoint per seed, taking distlock's options; `None` for
/// any other scheme.
pub(crate) fn parse_cluster_url(
    raw: &str,
    options: &mut Options,
    endpoint: impl Fn(&str, &mut Options) -> Result<Endpoint>,
) -> Option<Result<(Endpoint, ClusterSpec)>> {
    let raw = raw.trim();
    let (scheme, rest) = if let Some(rest) = raw.strip_prefix("redis+cluster://") {
        ("redis", rest)
    } else {
        ("rediss", raw.strip_prefix("rediss+cluster://")?)
    };
    Some((|| {
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        if !matches!(path.trim_matches('/'), "" | "0") {
            return Err(Error::invalid(format!(
                "bad Redis Cluster URL {:?}: a cluster has only database 0",
                redact(raw)
            )));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), authority),
        };
        // Every seed's URL carries the query: distlock's options are read from the first and
        // are the same for the rest; `map_seeds` is ours.
        let mut query: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
        let mut map_seeds = false;
        query.retain(|p| match p.split_once('=') {
            Some(("map_seeds", v)) => {
                map_seeds = matches!(v, "true" | "1" | "yes" | "on");
                false
            }
            _ => true,
        });
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        let seeds = hosts
            .split(',')
            .map(|h| {
                endpoint(
                    &format!("{scheme}://{userinfo}{}{query}", h.trim()),
                    options,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let display = format!(
            "cluster {}",
            seeds
                .iter()
                .map(|s| s.display.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
        let first = seeds[0].client.clone();
        Ok((
            Endpoint {
                display,
                client: first,
            },
            ClusterSpec { seeds, map_seeds },
        ))
    })())
}
