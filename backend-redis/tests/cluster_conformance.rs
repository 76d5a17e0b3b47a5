//! The shared conformance suite against a Redis Cluster (`DISTLOCK_REDIS_CLUSTER_URL`, by
//! default the local 3-primary, 3-replica cluster on 127.0.0.1:7000-7005 that
//! `scripts/services up redis` starts).

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
        common::redis_cluster_url(),
        |url| {
            Box::pin(async move {
                let lock = RedisLock::connect(RedisConfig::from_url(&url)?).await?;
                Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
            })
        },
    )
    .admin(|url| Box::pin(testing::redis_admin(url)))
    // The partition cases put a proxy in front of each seed; the cluster announces its nodes'
    // own addresses, which the client then reaches through the seed's proxy.
    .option_through_proxy("map_seeds", "true")
    .unreachable_at("redis+cluster://127.0.0.1:1")
    .wake_bound(Duration::from_millis(250))
    .start_hint("run `scripts/services up redis` (or set DISTLOCK_REDIS_CLUSTER_URL)");
    distlock_conformance::run(suite)
}
