//! Redis and RedLock. The floor sends distlock-redis's own acquire and release scripts (EVALSHA,
//! reloaded on NOSCRIPT, as the backend does) with the same keys and arguments, over the same
//! kind of connection (a `ConnectionManager`), so cycle ÷ floor is exactly the client-side
//! overhead of the library: the server does identical work on both sides.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::{LockName, OwnerId, SharedLock};
use distlock_redis::redis::aio::ConnectionManager;
use distlock_redis::redis::{self, Script, Value};
use distlock_redis::{RedLock, RedLockConfig, RedisConfig, RedisLock};
use futures::future::try_join_all;

use super::{Floor, FloorOps, Kind, Target};
use crate::error::Res;

/// The scripts the backend sends, read from its sources so the floor cannot drift from them.
const ACQUIRE_LUA: &str = include_str!("../../../../backend-redis/src/acquire.lua");
const RELEASE_LUA: &str = include_str!("../../../../backend-redis/src/release.lua");
const FENCE_LUA: &str = include_str!("../../../../backend-redis/src/fence.lua");

/// The floor's lease: long enough that nothing expires mid-cycle.
pub(super) const FLOOR_TTL_MS: u64 = 30_000;

/// Bounds the availability probe: an unreachable server must not stall the run.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub(crate) struct RedisTarget {
    config: RedisConfig,
    raw_url: String,
}

impl RedisTarget {
    pub(crate) async fn open(url: &str) -> Res<Self> {
        let config = RedisConfig::from_url(url)?.connect_timeout(CONNECT_TIMEOUT);
        // Connecting once proves the server answers and loads the scripts for the floor too.
        RedisLock::connect(config.clone()).await?;
        Ok(Self {
            config,
            raw_url: driver_url(url),
        })
    }
}

#[async_trait]
impl Target for RedisTarget {
    fn kind(&self) -> Kind {
        Kind::Redis
    }

    async fn server_version(&self) -> Res<String> {
        server_version(&self.raw_url).await
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(RedisLock::connect(self.config.clone()).await?))
    }

    async fn client_ttl(&self, ttl: std::time::Duration) -> Res<SharedLock> {
        Ok(Arc::new(
            RedisLock::connect(self.config.clone().default_ttl(ttl)).await?,
        ))
    }

    async fn server_requests(&self) -> Res<Option<u64>> {
        Ok(Some(commands_processed(&self.raw_url).await?))
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        Ok(Box::new(ScriptFloor {
            servers: vec![connect_raw(&self.raw_url).await?],
            keys: Keys::Single(Box::new(self.config.clone())),
            owner: OwnerId::random(),
            fence: false,
        }))
    }

    fn floor_ops(&self) -> FloorOps {
        FloorOps {
            what: "EVALSHA acquire.lua + EVALSHA release.lua (the backend's own scripts and keys)",
            round_trips: 2,
        }
    }
}

pub(crate) struct RedlockTarget {
    config: RedLockConfig,
    raw_urls: Vec<String>,
}

impl RedlockTarget {
    pub(crate) async fn open(urls: &str) -> Res<Self> {
        let config = RedLockConfig::from_url(urls)?.connect_timeout(CONNECT_TIMEOUT);
        // RedLock tolerates a minority of masters down at connect; the benchmark wants them
        // all, so that its floor and its cycle talk to the same servers.
        let raw_urls = redlock_urls(urls);
        for url in &raw_urls {
            connect_raw(url).await?;
        }
        RedLock::connect(config.clone()).await?;
        Ok(Self { config, raw_urls })
    }
}

#[async_trait]
impl Target for RedlockTarget {
    fn kind(&self) -> Kind {
        Kind::Redlock
    }

    async fn server_version(&self) -> Res<String> {
        let mut versions = Vec::new();
        for url in &self.raw_urls {
            versions.push(server_version(url).await?);
        }
        versions.dedup();
        Ok(format!("{} × {}", self.raw_urls.len(), versions.join(", ")))
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(RedLock::connect(self.config.clone()).await?))
    }

    async fn client_ttl(&self, ttl: std::time::Duration) -> Res<SharedLock> {
        Ok(Arc::new(
            RedLock::connect(self.config.clone().default_ttl(ttl)).await?,
        ))
    }

    async fn server_requests(&self) -> Res<Option<u64>> {
        let mut total = 0;
        for url in &self.raw_urls {
            total += commands_processed(url).await?;
        }
        Ok(Some(total))
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        let servers = try_join_all(self.raw_urls.iter().map(|u| connect_raw(u))).await?;
        Ok(Box::new(ScriptFloor {
            servers,
            keys: Keys::Redlock(self.config.clone()),
            owner: OwnerId::random(),
            fence: true,
        }))
    }

    fn floor_ops(&self) -> FloorOps {
        FloorOps {
            what: "on all masters at once: EVALSHA acquire.lua, then release.lua (fence.lua, \
                   the derived token's write-back, only when the majority's counters disagree, \
                   as in the client)",
            round_trips: 2,
        }
    }
}

/// The `redis` driver rejects distlock's own query options; the floor needs none of them.
pub(super) fn driver_url(url: &str) -> String {
    let url = url.trim();
    url.split('?').next().unwrap_or(url).to_string()
}

/// One driver URL per master, from either form `RedLockConfig::from_url` accepts:
/// `redlock://[auth@]h1,h2,h3[/db]` or a comma-separated list of `redis://` URLs.
pub(crate) fn redlock_urls(urls: &str) -> Vec<String> {
    let urls = urls.trim();
    let Some(rest) = urls.strip_prefix("redlock://") else {
        return urls.split(',').map(driver_url).collect();
    };
    let rest = rest.split('?').next().unwrap_or(rest);
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let (auth, hosts) = authority
        .rsplit_once('@')
        .map_or((String::new(), authority), |(a, h)| (format!("{a}@"), h));
    hosts
        .split(',')
        .map(|h| format!("redis://{auth}{}{path}", h.trim()))
        .collect()
}

/// The server's count of commands processed (`INFO stats`), less the `INFO` asking for it.
pub(super) async fn commands_processed(url: &str) -> Res<u64> {
    let n = info_field(url, "stats", "total_commands_processed").await?;
    Ok(n.parse::<u64>()?.saturating_sub(1))
}

/// The value of `field` in the server's `INFO section`.
pub(super) async fn info_field(url: &str, section: &str, field: &str) -> Res<String> {
    let mut conn = connect_raw(url).await?;
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await?;
    let value = info
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or_else(|| format!("INFO {section} has no {field}"))?;
    Ok(value.trim().to_string())
}

pub(super) async fn connect_raw(url: &str) -> Res<ConnectionManager> {
    let client = redis::Client::open(url)?;
    let connecting = ConnectionManager::new(client);
    Ok(tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| format!("no connection to {url} within {CONNECT_TIMEOUT:?}"))??)
}

pub(super) async fn server_version(url: &str) -> Res<String> {
    let version = info_field(url, "server", "redis_version").await?;
    Ok(format!("Redis {version}"))
}

enum Keys {
    Single(Box<RedisConfig>),
    Redlock(RedLockConfig),
}

impl Keys {
    fn lock(&self, n: &LockName) -> String {
        match self {
            Keys::Single(c) => c.lock_key(n),
            Keys::Redlock(c) => c.lock_key(n),
        }
    }
    fn fence(&self, n: &LockName) -> String {
        match self {
            Keys::Single(c) => c.fence_key(n),
            Keys::Redlock(c) => c.fence_key(n),
        }
    }
    /// The permit data key, which the lock's acquire script checks for a semaphore.
    fn semaphore(&self, n: &LockName) -> String {
        let [_, data] = match self {
            Keys::Single(c) => c.semaphore_keys(n),
            Keys::Redlock(c) => c.semaphore_keys(n),
        };
        data
    }
    fn channel(&self, n: &LockName) -> String {
        match self {
            Keys::Single(c) => c.release_channel(n),
            Keys::Redlock(c) => c.release_channel(n),
        }
    }
}

struct ScriptFloor {
    servers: Vec<ConnectionManager>,
    keys: Keys,
    owner: OwnerId,
    /// RedLock records the derived token on the masters before the grant counts, when their
    /// counters disagree.
    fence: bool,
}

/// The scripts, hashed once: `Script::new` computes the SHA1 that EVALSHA sends.
struct Scripts {
    acquire: Script,
    release: Script,
    fence: Script,
}

static SCRIPTS: std::sync::LazyLock<Scripts> = std::sync::LazyLock::new(|| Scripts {
    acquire: Script::new(ACQUIRE_LUA),
    release: Script::new(RELEASE_LUA),
    fence: Script::new(FENCE_LUA),
});

#[async_trait]
impl Floor for ScriptFloor {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        let name = LockName::new(name)?;
        let (lock, fence, semaphore, channel) = (
            self.keys.lock(&name),
            self.keys.fence(&name),
            self.keys.semaphore(&name),
            self.keys.channel(&name),
        );
        let owner_text = self.owner.text();
        let owner = &*owner_text;
        let s = &*SCRIPTS;

        let acquired = try_join_all(self.servers.iter().map(|conn| {
            let mut conn = conn.clone();
            let mut inv = s.acquire.prepare_invoke();
            inv.key(&lock)
                .key(&fence)
                .key(&semaphore)
                .arg(owner)
                .arg(FLOOR_TTL_MS);
            async move { inv.invoke_async::<Value>(&mut conn).await }
        }))
        .await?;
        let mut tokens = Vec::with_capacity(acquired.len());
        for reply in acquired {
            match ints(&reply).as_deref() {
                Some([1, token, 1, _]) => tokens.push(*token),
                _ => return Err(format!("floor: acquire not granted: {reply:?}").into()),
            }
        }
        let derived = tokens.iter().copied().max().unwrap_or(0);
        let quorum = self.servers.len() / 2 + 1;
        // As the client does: no write-back round when a majority's counters gave the token.
        if self.fence && tokens.iter().filter(|&&t| t == derived).count() < quorum {
            try_join_all(self.servers.iter().zip(&tokens).map(|(conn, token)| {
                let mut conn = conn.clone();
                let mut inv = s.fence.prepare_invoke();
                inv.key(&lock)
                    .key(&fence)
                    .arg(owner)
                    .arg(*token)
                    .arg(derived);
                async move { inv.invoke_async::<i64>(&mut conn).await }
            }))
            .await?;
        }
        let release = Instant::now();
        let released = try_join_all(self.servers.iter().zip(&tokens).map(|(conn, token)| {
            let mut conn = conn.clone();
            let mut inv = s.release.prepare_invoke();
            inv.key(&lock).arg(owner).arg(*token).arg(&channel);
            async move { inv.invoke_async::<i64>(&mut conn).await }
        }))
        .await?;
        if released.iter().any(|&left| left != 0) {
            return Err(format!("floor: release did not free the lock: {released:?}").into());
        }
        Ok(release.elapsed())
    }
}

fn ints(v: &Value) -> Option<Vec<i64>> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redlock_urls_expand_both_forms_without_distlock_options() {
        let want = vec!["redis://a:1/2".to_string(), "redis://b:1/2".to_string()];
        assert_eq!(redlock_urls("redlock://a:1,b:1/2?key_prefix=x"), want);
        assert_eq!(
            redlock_urls("redis://a:1/2?key_prefix=x, redis://b:1/2"),
            want
        );
        assert_eq!(
            redlock_urls("redlock://u:p@a:1,b:1"),
            vec!["redis://u:p@a:1".to_string(), "redis://u:p@b:1".to_string()]
        );
    }
}
