//! The shared conformance suite against one real Redis server (`DISTLOCK_REDIS_URL`).

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{async_trait, Capabilities, DistributedLock, LockName, Result};
use distlock_conformance::Harness;
use distlock_redis::{RedisConfig, RedisLock};

struct Redis {
    url: String,
}

impl Redis {
    fn from_env() -> Self {
        Self {
            url: common::redis_url(),
        }
    }
}

#[async_trait]
impl Harness for Redis {
    fn backend(&self) -> &'static str {
        RedisLock::BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        distlock_redis::CAPABILITIES
    }

    fn start_hint(&self) -> &'static str {
        "run `scripts/services up redis` (or set DISTLOCK_REDIS_URL)"
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        self.client_at(&self.url).await
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn client_at(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let config = RedisConfig::from_url(url)?.default_ttl(self.short_ttl());
        Ok(Arc::new(RedisLock::connect(config).await?))
    }

    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>> {
        let connect = async {
            let config = RedisConfig::from_url("redis://127.0.0.1:1")?
                .connect_timeout(self.connect_timeout());
            let lock: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(config).await?);
            Ok(lock)
        };
        Some(connect.await)
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn remove_behind_back(&self, name: &LockName) -> Result<()> {
        common::remove_lock(&self.url, name).await
    }

    fn wake_bound(&self) -> Duration {
        Duration::from_millis(250)
    }

    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        common::subscribers(&self.url, name).await.map(Some)
    }

    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        common::leftovers(&self.url, prefix).await
    }
}

fn main() -> ExitCode {
    distlock_conformance::run(Redis::from_env())
}
