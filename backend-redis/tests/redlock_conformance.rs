//! The shared conformance suite against RedLock over three independent masters
//! (`DISTLOCK_REDLOCK_URLS`).

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::DistributedLock;
use distlock_conformance::Suite;
use distlock_redis::{testing, RedLock, RedLockConfig};

fn main() -> ExitCode {
    let suite = Suite::new(
        RedLock::BACKEND,
        distlock_redis::REDLOCK_CAPABILITIES,
        common::redlock_url(),
        |url| {
            Box::pin(async move {
                let lock = RedLock::connect(RedLockConfig::from_url(&url)?).await?;
                Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
            })
        },
    )
    .admin(|url| Box::pin(testing::redlock_admin(url)))
    .unreachable_at("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    // Waiters poll: the backoff cap (100 ms) plus a few round trips to three masters.
    .wake_bound(Duration::from_millis(500))
    .start_hint(
        "run `scripts/services up redis` (it starts the RedLock masters on 6380-6382), or set \
         DISTLOCK_REDLOCK_URLS",
    );
    distlock_conformance::run(suite)
}
