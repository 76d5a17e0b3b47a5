//! The ZooKeeper backend against the whole conformance suite, on the server at
//! `DISTLOCK_ZK_URL` (default `zk://127.0.0.1:2181`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{async_trait, Capabilities, DistributedLock, Error, LockName, Result};
use distlock_zk::zookeeper_client as zk;
use distlock_zk::{ZkConfig, ZkLock};

struct Zk {
    url: String,
}

impl Zk {
    fn from_env() -> Self {
        Self {
            url: distlock_zk::DESCRIPTOR.test_url(),
        }
    }

    fn config(&self) -> Result<ZkConfig> {
        ZkConfig::from_url(&self.url)
    }

    /// A plain client of the same ensemble, rooted like the backend's, for acting behind the
    /// backend's back.
    async fn raw(&self) -> Result<zk::Client> {
        let config = self.config()?;
        let client =
            tokio::time::timeout(Duration::from_secs(5), zk::Client::connect(config.hosts()))
                .await
                .map_err(|_| Error::unavailable("raw ZooKeeper connect", "timed out"))?
                .map_err(|e| Error::unavailable("raw ZooKeeper connect", e))?;
        match config.chroot() {
            None => Ok(client),
            Some(root) => client
                .chroot(root.to_string())
                .map_err(|_| Error::invalid("bad chroot")),
        }
    }

    fn base(&self) -> Result<String> {
        Ok(self.config()?.get_base_path().to_string())
    }
}

fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

fn backend_err(e: zk::Error) -> Error {
    Error::new(distlock_api::ErrorKind::Backend, "raw ZooKeeper request").with_source(e)
}

#[async_trait]
impl distlock_conformance::Harness for Zk {
    fn backend(&self) -> &'static str {
        "zk"
    }

    fn capabilities(&self) -> Capabilities {
        distlock_zk::CAPABILITIES
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        self.client_at(&self.url).await
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    /// A suite client of the ensemble at `url`. Its session timeout is the lease the watchdog
    /// keeps renewing: short, so that renewal and loss cases run in seconds (the server allows
    /// down to 2 ticks).
    async fn client_at(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let config = ZkConfig::from_url(url)?.default_ttl(self.short_ttl());
        Ok(Arc::new(ZkLock::connect(config).await?))
    }

    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>> {
        let config = ZkConfig::from_url("zk://127.0.0.1:1")
            .map(|c| c.connect_timeout(self.connect_timeout()));
        Some(match config {
            Ok(config) => ZkLock::connect(config)
                .await
                .map(|c| Arc::new(c) as Arc<dyn DistributedLock>),
            Err(e) => Err(e),
        })
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn remove_behind_back(&self, name: &LockName) -> Result<()> {
        let raw = self.raw().await?;
        let dir = join(&self.base()?, &distlock_zk::encode_lock_name(name.as_str()));
        let mut children = raw.list_children(&dir).await.map_err(backend_err)?;
        // The holder is the lowest sequence number, the digits after the last '-'.
        children.sort_by_key(|c| c.rsplit('-').next().and_then(|s| s.parse::<i64>().ok()));
        let holder = children
            .first()
            .ok_or_else(|| Error::invalid(format!("{name} has no holder to remove")))?;
        raw.delete(&join(&dir, holder), None)
            .await
            .map_err(backend_err)
    }

    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        let raw = self.raw().await?;
        let dir = join(&self.base()?, &distlock_zk::encode_lock_name(name.as_str()));
        match raw.list_children(&dir).await {
            // Every queue node but the lowest (the holder's) is a waiter.
            Ok(queue) => Ok(Some(queue.len().saturating_sub(1))),
            Err(zk::Error::NoNode) => Ok(Some(0)),
            Err(e) => Err(backend_err(e)),
        }
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn wake_bound(&self) -> Duration {
        Duration::from_millis(250)
    }

    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let raw = self.raw().await?;
        let base = self.base()?;
        let children = match raw.list_children(&base).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(backend_err(e)),
        };
        // The encoding is character by character, so names with the prefix have segments
        // that start with the prefix's segment.
        let mark = distlock_zk::encode_lock_name(prefix);
        let mut left = Vec::new();
        for segment in children.into_iter().filter(|c| c.starts_with(&mark)) {
            let name = distlock_zk::decode_lock_name(&segment).unwrap_or_else(|| segment.clone());
            match raw.list_children(&join(&base, &segment)).await {
                Ok(queue) if queue.is_empty() => left.push(format!("{name:?}: empty lock node")),
                Ok(queue) => left.push(format!("{name:?}: queue nodes {queue:?}")),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(backend_err(e)),
            }
        }
        Ok(left)
    }
}

fn main() -> ExitCode {
    distlock_conformance::run(Zk::from_env())
}
