//! What the Redis test targets share: server URLs and out-of-band inspection of a server.
#![allow(dead_code, unreachable_pub)]

pub mod private;
pub mod sentinel;

use std::time::Duration;

use distlock_redis::redis::{self, AsyncCommands};
use std::sync::Arc;

use distlock_api::backend::wait::Attempt;
use distlock_api::DistributedLock;
use distlock_redis::{Error, LockName, RedLock, RedLockConfig, RedisConfig, RedisLock, Result};

/// A client of the single server.
pub async fn client() -> Arc<RedisLock> {
    let config = RedisConfig::from_url(&redis_url()).expect("DISTLOCK_REDIS_URL");
    Arc::new(
        RedisLock::connect(config)
            .await
            .expect("redis unreachable: run `scripts/services up redis`"),
    )
}

/// A client whose connections go through a loopback proxy to the single server, and the proxy
/// (to count round trips, delay, cut).
pub async fn client_behind_proxy() -> (Arc<RedisLock>, distlock_conformance::Proxy) {
    use distlock_conformance::{hosts_of, reroute, Proxy};
    let url = redis_url();
    let first = hosts_of(&url)[0].clone();
    let proxy = Proxy::start(first.clone()).await;
    let proxied = reroute(&url, &[first], &[proxy.addr()]);
    let client = RedisLock::connect(RedisConfig::from_url(&proxied).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}\n  start Redis: scripts/services up redis"));
    (Arc::new(client), proxy)
}

/// The conformance suite through Sentinel at `url` (the proxy cases not applicable: the
/// sentinels name the master's own address, which the client reaches around any proxy in
/// front of the sentinels).
pub fn sentinel_suite(url: String) -> distlock_conformance::Suite {
    distlock_conformance::Suite::new(
        RedisLock::BACKEND,
        distlock_redis::CAPABILITIES,
        url,
        |url| {
            Box::pin(async move {
                let lock = RedisLock::connect(RedisConfig::from_url(&url)?).await?;
                Ok(Arc::new(lock) as Arc<dyn distlock_api::DistributedLock>)
            })
        },
    )
    .admin(|url| Box::pin(distlock_redis::testing::redis_admin(url)))
    .without_proxies(
        "the sentinels announce the master's own address, which the client then reaches \
         around the proxies in front of the sentinels",
    )
    .unreachable_at("redis+sentinel://127.0.0.1:1/distlock")
    .wake_bound(Duration::from_millis(250))
    .start_hint("run `scripts/services up redis` (or set DISTLOCK_REDIS_SENTINEL_URL)")
}

/// A name prefix no other test or run uses: `t-<tag>-<pid>-<random>-`.
pub fn unique(tag: &str) -> String {
    format!(
        "t-{tag}-{}-{:08x}-",
        std::process::id(),
        distlock_conformance::unique_suffix()
    )
}

/// The single server the tests use.
pub fn redis_url() -> String {
    distlock_redis::DESCRIPTOR.test_url()
}

/// The Redis Cluster the tests use: `DISTLOCK_REDIS_CLUSTER_URL`, by default the local
/// cluster's three primaries (`scripts/services up redis`).
pub fn redis_cluster_url() -> String {
    std::env::var("DISTLOCK_REDIS_CLUSTER_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| {
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002".to_string()
        })
}

/// The Sentinel-monitored master the tests use: `DISTLOCK_REDIS_SENTINEL_URL`, by default the
/// local topology's three sentinels and its master `distlock` (`scripts/services up redis`).
pub fn redis_sentinel_url() -> String {
    std::env::var("DISTLOCK_REDIS_SENTINEL_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| {
            "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/distlock".to_string()
        })
}

/// The RedLock masters the tests use, comma-separated.
pub fn redlock_urls() -> String {
    distlock_redis::REDLOCK_DESCRIPTOR.test_url()
}

/// The RedLock masters as one `redlock://h1,h2,h3` URL (user and options of the first), the
/// form whose hosts the conformance suite's proxies can stand in for.
pub fn redlock_url() -> String {
    let urls = redlock_urls();
    if urls.trim_start().starts_with("redlock://") {
        return urls.trim().to_string();
    }
    let list: Vec<&str> = urls.split(',').map(str::trim).collect();
    let hosts: Vec<String> = list
        .iter()
        .flat_map(|u| distlock_conformance::hosts_of(u))
        .collect();
    let first = list[0].split_once("://").map_or(list[0], |(_, r)| r);
    let end = first.find(['/', '?']).unwrap_or(first.len());
    let (authority, tail) = first.split_at(end);
    let user = authority
        .rsplit_once('@')
        .map_or(String::new(), |(u, _)| format!("{u}@"));
    format!("redlock://{user}{}{tail}", hosts.join(","))
}

/// A plain driver connection, separate from any lock client.
pub async fn raw(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).map_err(|e| Error::invalid(e.to_string()))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| Error::unavailable(format!("test connection to {url}"), e))
}

fn failed(what: &str, e: redis::RedisError) -> Error {
    Error::new(distlock_redis::ErrorKind::Backend, what.to_string()).with_source(e)
}

/// Deletes `name`'s lock hash behind its holder's back, as an operator would.
pub async fn remove_lock(url: &str, name: &LockName) -> Result<()> {
    let config = RedisConfig::from_url(url)?;
    let mut con = raw(url).await?;
    let _: i64 = con
        .del(config.lock_key(name))
        .await
        .map_err(|e| failed("DEL", e))?;
    Ok(())
}

/// How many connections are subscribed to `name`'s release channel: each waiting client holds
/// one subscription, so a cancelled waiter's must be gone.
pub async fn subscribers(url: &str, name: &LockName) -> Result<usize> {
    let config = RedisConfig::from_url(url)?;
    let mut con = raw(url).await?;
    let counts: Vec<(String, u64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(config.release_channel(name))
        .query_async(&mut con)
        .await
        .map_err(|e| failed("PUBSUB NUMSUB", e))?;
    Ok(counts.into_iter().map(|(_, n)| n as usize).sum())
}

/// Lock keys (not fencing counters) and subscribed release channels left on the server for
/// names starting with `prefix`.
pub async fn leftovers(url: &str, prefix: &str) -> Result<Vec<String>> {
    let config = RedisConfig::from_url(url)?;
    let pattern = config.key_pattern(prefix);
    let mut con = raw(url).await?;
    let mut left = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await
            .map_err(|e| failed("SCAN", e))?;
        for key in keys {
            match config.parse_key(&key) {
                Some((_, kind)) if kind == "fence" => {}
                _ => left.push(format!("key {key} on {}", config.endpoint())),
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(&pattern)
        .query_async(&mut con)
        .await
        .map_err(|e| failed("PUBSUB CHANNELS", e))?;
    if !channels.is_empty() {
        let counts: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channels)
            .query_async(&mut con)
            .await
            .map_err(|e| failed("PUBSUB NUMSUB", e))?;
        for (channel, n) in counts {
            if n > 0 {
                left.push(format!(
                    "{n} subscription(s) to {channel} on {}",
                    config.endpoint()
                ));
            }
        }
    }
    Ok(left)
}

/// A RedLock client of the masters at `url` (a `redlock://` URL, maybe through proxies).
pub async fn redlock_client(url: &str) -> Arc<RedLock> {
    Arc::new(
        RedLock::connect(RedLockConfig::from_url(url).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start the masters: scripts/services up redis")),
    )
}

/// Each RedLock master's own URL, in the client's order.
pub fn redlock_master_urls() -> Vec<String> {
    distlock_conformance::hosts_of(&redlock_url())
        .into_iter()
        .map(|h| format!("redis://{h}"))
        .collect()
}

/// An acquisition's attempts share its owner id, so an attempt whose answer was lost leaves a
/// hold the next attempt finds on the server. The next attempt takes the lock afresh over it (a
/// new token, one hold) instead of re-entering it: the lost attempt's give-back, even applied
/// twice (sent again after its own answer was lost), then finds nothing of its own to take, and
/// the acquisition's grant still excludes everyone else. Raw trait calls on `lock` (`other`: a
/// second client of the same servers); `name` must be free.
pub async fn an_attempt_takes_afresh_the_hold_a_lost_attempt_left<L: DistributedLock + ?Sized>(
    lock: &L,
    other: &L,
    name: &LockName,
) {
    use distlock_conformance::hand_over::{granted, request};
    let ttl = Duration::from_secs(30);
    let req = request(lock, name, ttl).fresh();
    // Its answer is lost: nobody keeps this grant but the give-back below.
    let left = granted(lock, &req).await;
    // Late masters of a RedLock round land in the background: let them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let grant = granted(lock, &req).await;
    assert_eq!(
        grant.hold_count, 1,
        "a fresh grant, not a re-entry of the hold left"
    );
    assert!(
        grant.token > left.token,
        "a new token: {} after {}",
        grant.token,
        left.token
    );
    for _ in 0..2 {
        assert!(
            !lock.release(&left).await.unwrap(),
            "the hold left is gone: its give-back takes nothing"
        );
    }
    let theirs = other.attempt(&request(other, name, ttl)).await.unwrap();
    assert!(
        matches!(theirs, Attempt::Held { .. }),
        "another owner got in while the acquisition's grant held: {theirs:?}"
    );
    assert_eq!(lock.renew(&grant, ttl).await.unwrap(), ttl);
    let info = lock.inspect(name).await.unwrap().expect("held");
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&req.owner, 1, grant.token)
    );
    assert!(lock.release(&grant).await.unwrap());
    assert!(lock.inspect(name).await.unwrap().is_none());
}
