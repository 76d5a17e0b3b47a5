//! The `redis+sentinel://` URL: the sentinels, the master's name, and how to reach whichever
//! data node the sentinels name (scheme, credentials, database, driver options).

use std::fmt;

use distlock_api::config::ConfigUrl;
use distlock_api::{ErrorKind, Result};

use crate::endpoint::{Endpoint, Options, BACKEND};

/// The port a sentinel listens on unless the URL says otherwise.
pub(crate) const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// How to reach a master through Sentinel.
#[derive(Clone, Debug)]
pub(crate) struct SentinelSpec {
    /// The sentinels, in the URL's order.
    pub(crate) sentinels: Vec<Endpoint>,
    /// The name the sentinels monitor the master under.
    pub(crate) master: String,
    /// How to reach a data node once the sentinels named its address.
    pub(crate) node: NodeUrl,
}

/// A data node's URL without its address: the URL's scheme, credentials (the data nodes',
/// never the sentinels'), database and driver options.
#[derive(Clone)]
pub(crate) struct NodeUrl {
    scheme: &'static str,
    /// `user:password@` as the URL spelled it (percent-encoded), or empty.
    userinfo: String,
    db: u32,
    /// `?options` for the driver, or empty.
    query: String,
}

impl fmt::Debug for NodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        write!(f, "{}://…/{}", self.scheme, self.db)
    }
}

impl NodeUrl {
    /// The endpoint of the data node at `host:port`.
    pub(crate) fn at(&self, host: &str, port: u16) -> redis::RedisResult<Endpoint> {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let url = format!(
            "{}://{}{host}:{port}/{}{}",
            self.scheme, self.userinfo, self.db, self.query
        );
        let display = match self.db {
            0 => format!("{host}:{port}"),
            db => format!("{host}:{port}/{db}"),
        };
        Ok(Endpoint {
            display,
            client: redis::Client::open(url.as_str())?,
        })
    }
}

/// Parses `redis+sentinel://[user:password@]host:port[,host:port…]/master[/db][?options]` (or
/// `rediss+sentinel://`), taking distlock's options; `None` for any other scheme.
///
/// Besides the shared options and `key_prefix` it takes `sentinel_password` (the sentinels'
/// own password, if they require one) and `protocol` (handed to the driver for the data
/// nodes); anything else is refused.
pub(crate) fn parse_sentinel_url(
    raw: &str,
    options: &mut Options,
) -> Option<Result<(Endpoint, SentinelSpec)>> {
    let raw = raw.trim();
    let lower: String = raw
        .chars()
        .take(18)
        .collect::<String>()
        .to_ascii_lowercase();
    let scheme = if lower.starts_with("redis+sentinel://") {
        "redis"
    } else if lower.starts_with("rediss+sentinel://") {
        "rediss"
    } else {
        return None;
    };
    Some(parse(raw, scheme, options))
}

fn parse(
    raw: &str,
    scheme: &'static str,
    options: &mut Options,
) -> Result<(Endpoint, SentinelSpec)> {
    let cut = ConfigUrl::parse(BACKEND, raw)?;
    if scheme == "rediss" && !cfg!(feature = "tls") {
        return Err(cut.error(
            ErrorKind::Unsupported,
            "TLS (rediss+sentinel://) needs distlock-redis's `tls` Cargo feature, which this \
             build lacks",
        ));
    }
    let hosts = cut.hosts(DEFAULT_SENTINEL_PORT)?;
    let path = cut.path.unwrap_or("").trim_start_matches('/');
    let mut parts = path.split('/');
    let master = cut.decode(parts.next().unwrap_or(""), "master name")?;
    if master.is_empty() {
        return Err(
            cut.invalid("no master name: expected redis+sentinel://host:port,…/master-name[/db]")
        );
    }
    if master.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(cut.invalid(format!("master name {master:?} has whitespace")));
    }
    let db = match parts.next() {
        None | Some("") => 0,
        Some(db) => db
            .parse::<u32>()
            .map_err(|_| cut.invalid(format!("database {db:?} is not a number")))?,
    };
    if parts.any(|p| !p.is_empty()) {
        return Err(cut.invalid("the path is /master-name[/db]"));
    }

    let mut query = cut.options()?;
    options.client.take_from(&mut query)?;
    if let Some(prefix) = query.take_str("key_prefix") {
        options.key_prefix = prefix;
    }
    // Refused later by validate, as for one server: a single master's waiters are notified.
    if let Some(on) = query.take_bool("release_signals")? {
        options.release_signals = Some(on);
    }
    options.sync.take_from(&mut query)?;
    let sentinel_password = query.take_str("sentinel_password");
    let protocol = query.take_str("protocol");
    query.finish(&[
        "key_prefix",
        "sentinel_password",
        "protocol (resp2, resp3)",
        "sync_replicas",
        "sync_timeout",
    ])?;
    let query = match &protocol {
        Some(p) if matches!(p.as_str(), "2" | "3" | "resp2" | "resp3") => format!("?protocol={p}"),
        Some(p) => return Err(cut.invalid(format!("option protocol={p:?} is not resp2 or resp3"))),
        None => String::new(),
    };
    let userinfo = match (cut.user, cut.password) {
        (Some(u), Some(p)) => format!("{u}:{p}@"),
        (Some(u), None) if !u.is_empty() => format!("{u}@"),
        _ => String::new(),
    };
    let node = NodeUrl {
        scheme,
        userinfo,
        db,
        query,
    };
    let bad = |e: redis::RedisError| cut.invalid(e.to_string());
    let sentinels = hosts
        .iter()
        .map(|h| {
            let info = redis::IntoConnectionInfo::into_connection_info(format!("{scheme}://{h}"))
                .map_err(bad)?;
            let info = match &sentinel_password {
                Some(p) => {
                    let settings = info.redis_settings().clone().set_password(p);
                    info.set_redis_settings(settings)
                }
                None => info,
            };
            Ok(Endpoint {
                display: h.to_string(),
                client: redis::Client::open(info).map_err(bad)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // The node URL must make a driver client too: checked here, before any I/O.
    node.at("127.0.0.1", 6379).map_err(bad)?;
    let display = format!(
        "sentinel {}/{master}",
        sentinels
            .iter()
            .map(|s| s.display.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    let first = sentinels[0].client.clone();
    Ok((
        Endpoint {
            display,
            client: first,
        },
        SentinelSpec {
            sentinels,
            master,
            node,
        },
    ))
}
