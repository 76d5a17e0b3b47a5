//! The shared conformance suite against RedLock over three independent masters
//! (`DISTLOCK_REDLOCK_URLS`).

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{async_trait, Capabilities, DistributedLock, LockName, Result};
use distlock_conformance::Harness;
use distlock_redis::{RedLock, RedLockConfig};

struct RedLockHarness {
    urls: String,
}

impl RedLockHarness {
    fn from_env() -> Self {
        Self {
            urls: common::redlock_urls(),
        }
    }

    fn each(&self) -> impl Iterator<Item = &str> {
        self.urls.split(',').map(str::trim)
    }
}

#[async_trait]
impl Harness for RedLockHarness {
    fn backend(&self) -> &'static str {
        RedLock::BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        distlock_redis::REDLOCK_CAPABILITIES
    }

    fn start_hint(&self) -> &'static str {
        "run `scripts/services up redis` (it starts the RedLock masters on 6380-6382), or set \
         DISTLOCK_REDLOCK_URLS"
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        let config = RedLockConfig::from_url(&self.urls)?.default_ttl(self.short_ttl());
        Ok(Arc::new(RedLock::connect(config).await?))
    }

    fn upstreams(&self) -> Vec<String> {
        self.each()
            .flat_map(distlock_conformance::hosts_of)
            .collect()
    }

    async fn client_via(&self, addrs: &[String]) -> Result<Arc<dyn DistributedLock>> {
        let from = self.upstreams();
        let urls: Vec<String> = self
            .each()
            .map(|url| distlock_conformance::reroute(url, &from, addrs))
            .collect();
        let config = RedLockConfig::from_url(&urls.join(","))?.default_ttl(self.short_ttl());
        Ok(Arc::new(RedLock::connect(config).await?))
    }

    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>> {
        let connect = async {
            let config = RedLockConfig::from_url("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")?
                .connect_timeout(self.connect_timeout());
            let lock: Arc<dyn DistributedLock> = Arc::new(RedLock::connect(config).await?);
            Ok(lock)
        };
        Some(connect.await)
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn remove_behind_back(&self, name: &LockName) -> Result<()> {
        for url in self.each() {
            common::remove_lock(url, name).await?;
        }
        Ok(())
    }

    fn wake_bound(&self) -> Duration {
        // Waiters poll: the backoff cap (100 ms) plus a few round trips to three masters.
        Duration::from_millis(500)
    }

    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let mut left = Vec::new();
        for url in self.each() {
            left.extend(common::leftovers(url, prefix).await?);
        }
        Ok(left)
    }
}

fn main() -> ExitCode {
    distlock_conformance::run(RedLockHarness::from_env())
}
