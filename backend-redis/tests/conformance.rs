//! The shared conformance suite against one real Redis server (`DISTLOCK_REDIS_URL`).

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::DistributedLock;
use distlock_conformance::Suite;
use distlock_redis::{testing, RedisConfig, RedisLock};

fn main() -> ExitCode {
    let suite = Suite::new(
        RedisLock::BACKEND,
        distlock_redis::CAPABILITIES,
        common::redis_url(),
        |url| {
            Box::pin(async move {
                let lock = RedisLock::connect(RedisConfig::from_url(&url)?).await?;
                Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
            })
        },
    )
    .admin(|url| Box::pin(testing::redis_admin(url)))
    .unreachable_at("redis://127.0.0.1:1")
    .wake_bound(Duration::from_millis(250))
    .start_hint("run `scripts/services up redis` (or set DISTLOCK_REDIS_URL)");
    distlock_conformance::run(suite)
}
