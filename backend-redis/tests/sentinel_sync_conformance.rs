//! The shared conformance suite through Redis Sentinel with `sync_replicas=2`: every grant and
//! renewal waits for both replicas of the local topology (`DISTLOCK_REDIS_SENTINEL_URL`, by
//! default the master on 127.0.0.1:6390, its two replicas and three sentinels on 26379-26381
//! that `scripts/services up redis` starts). Every promise holds with the option on (no
//! hand-overs between tasks of one handle: every grant is an acquire).

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
        sync_url(),
        |url| {
            Box::pin(async move {
                let lock = RedisLock::connect(RedisConfig::from_url(&url)?).await?;
                Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
            })
        },
    )
    .admin(|url| Box::pin(testing::redis_admin(url)))
    // The partition cases put a proxy in front of each server the URL names: here the
    // sentinels, which name the master's own address, and the client reaches it around them.
    .without_proxies(
        "the sentinels announce the master's own address, which the client then reaches \
         around the proxies in front of the sentinels",
    )
    .unreachable_at("redis+sentinel://127.0.0.1:1/distlock")
    .wake_bound(Duration::from_millis(250))
    .start_hint("run `scripts/services up redis` (or set DISTLOCK_REDIS_SENTINEL_URL)");
    distlock_conformance::run(suite)
}

/// The Sentinel URL with `sync_replicas=2` added.
fn sync_url() -> String {
    let url = common::redis_sentinel_url();
    let join = if url.contains('?') { '&' } else { '?' };
    format!("{url}{join}sync_replicas=2")
}
