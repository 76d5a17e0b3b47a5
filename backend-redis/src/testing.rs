//! The test-only admin of Redis and RedLock (feature `testing`): acts on the servers with the
//! client's own connections and key layout, so tests need not re-derive either.

use std::sync::Arc;

use distlock_api::backend::async_trait;
use distlock_api::backend::testing::Admin;
use distlock_api::{LockName, Result};
use redis::FromRedisValue;

use crate::keys::KeySpace;
use crate::ops::Server;
use crate::{RedLock, RedLockConfig, RedisConfig, RedisLock, DEFAULT_KEY_PREFIX};

impl Server {
    async fn command<T: FromRedisValue>(&self, what: &str, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.conn();
        cmd.query_async(&mut conn)
            .await
            .map_err(|e| self.error(what, e))
    }

    /// Removes the lock and, if the name is a semaphore, every permit of it.
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        let del = redis::cmd("DEL")
            .arg(self.keys.lock_key(name))
            .arg(self.keys.holders_key(name))
            .arg(self.keys.semaphore_key(name))
            .to_owned();
        let _: i64 = self.command("DEL", &del).await?;
        Ok(())
    }

    async fn subscribers(&self, name: &LockName) -> Result<usize> {
        // A cluster's waiters listen on shard channels, counted by the slot's primary.
        let numsub = if self.is_cluster() {
            "SHARDNUMSUB"
        } else {
            "NUMSUB"
        };
        let cmd = redis::cmd("PUBSUB")
            .arg(numsub)
            .arg(self.keys.channel(name))
            .to_owned();
        let counts: Vec<(String, u64)> = self.command("PUBSUB NUMSUB", &cmd).await?;
        Ok(counts.into_iter().map(|(_, n)| n as usize).sum())
    }

    /// Lock and semaphore keys (not the fencing counters, which are kept on purpose) and
    /// subscribed release channels of names starting with `prefix`.
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let pattern = self.keys.pattern(prefix);
        let at = &self.endpoint.display;
        let mut left = Vec::new();
        for key in self.scan(&pattern).await? {
            match self.keys.parse(&key) {
                Some((_, "fence")) => {}
                _ => left.push(format!("key {key} on {at}")),
            }
        }
        if self.is_cluster() {
            // Shard channels, asked of every primary (each knows its own slots' channels).
            let list = redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .arg(&pattern)
                .to_owned();
            for reply in self.on_primaries(&list).await? {
                let channels: Vec<String> = redis::from_redis_value(reply)
                    .map_err(|e| self.error("PUBSUB SHARDCHANNELS", e.into()))?;
                for channel in channels {
                    left.push(format!("a subscription to shard channel {channel} on {at}"));
                }
            }
            return Ok(left);
        }
        let list = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(&pattern)
            .to_owned();
        let channels: Vec<String> = self.command("PUBSUB CHANNELS", &list).await?;
        if !channels.is_empty() {
            let count = redis::cmd("PUBSUB").arg("NUMSUB").arg(&channels).to_owned();
            let counts: Vec<(String, u64)> = self.command("PUBSUB NUMSUB", &count).await?;
            for (channel, n) in counts.into_iter().filter(|(_, n)| *n > 0) {
                left.push(format!("{n} subscription(s) to {channel} on {at}"));
            }
        }
        Ok(left)
    }
}

#[async_trait]
impl Admin for RedisLock {
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        self.server().remove_holder(name).await
    }

    /// Waiters subscribe to the lock's release channel.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        self.server().subscribers(name).await.map(Some)
    }

    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        self.server().leftovers(prefix).await
    }
}

/// Works master by master: a holder is removed from every master, and what any master keeps is
/// left over.
#[async_trait]
impl Admin for RedLock {
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        for server in self.servers() {
            server.remove_holder(name).await?;
        }
        Ok(())
    }

    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let mut left = Vec::new();
        for server in self.servers() {
            left.extend(server.leftovers(prefix).await?);
        }
        Ok(left)
    }
}

/// The admin of the Redis server at `url` (a [`RedisLock`] client of it).
pub async fn redis_admin(url: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(
        RedisLock::connect(RedisConfig::from_url(&url)?).await?,
    ))
}

/// The admin of the RedLock masters at `urls` (a `redlock://` URL or comma-separated
/// `redis://` URLs, as [`RedLockConfig::from_url`] takes).
pub async fn redlock_admin(urls: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(
        RedLock::connect(RedLockConfig::from_url(&urls)?).await?,
    ))
}

/// The key of `name`'s lock under the default key prefix. Every key of a name shares this key's
/// hash tag, so its Redis Cluster slot is the name's (a test that faults one slot's primary
/// picks its names with it).
pub fn lock_key(name: &LockName) -> String {
    KeySpace::new(DEFAULT_KEY_PREFIX).lock_key(name)
}
