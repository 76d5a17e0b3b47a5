#![doc = include_str!("../docs.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod backend;
mod cluster;
mod config;
mod conn;
mod endpoint;
mod following;
mod keys;
mod notices;
mod ops;
mod permits;
mod redlock;
mod replicas;
mod replicated;
mod scripts;
mod sentinel;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{RedisLock, CAPABILITIES};
pub use config::{
    RedLockConfig, RedisConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, MIN_REDLOCK_INSTANCES,
};
pub use redlock::{master_deadline, RedLock, MIN_MASTER_DEADLINE, REDLOCK_CAPABILITIES};

pub use distlock_api::{
    Capabilities, DistributedLock, Error, ErrorKind, FencingToken, Lease, LockExt, LockGuard,
    LockInfo, LockName, LockOptions, LostReason, OwnerId, Result,
};
/// The `redis` driver this backend is built on.
pub use redis;

/// The single-server Redis backend, described once for the facade, the benchmark and the tests.
pub static DESCRIPTOR: distlock_api::BackendDescriptor = distlock_api::BackendDescriptor {
    id: RedisLock::BACKEND,
    label: "Redis",
    schemes: &[
        "redis",
        "rediss",
        "redis+cluster",
        "rediss+cluster",
        "redis+sentinel",
        "rediss+sentinel",
    ],
    test_url_var: "DISTLOCK_REDIS_URL",
    test_url_default: "redis://127.0.0.1:6379",
    capabilities: CAPABILITIES,
    connect: |url| {
        Box::pin(async move {
            let lock = RedisLock::connect(RedisConfig::from_url(&url)?).await?;
            Ok(std::sync::Arc::new(lock) as distlock_api::SharedLock)
        })
    },
};

/// RedLock over independent Redis masters, described once: `redlock://h1,h2,h3` or a
/// comma-separated list of `redis://` URLs.
pub static REDLOCK_DESCRIPTOR: distlock_api::BackendDescriptor = distlock_api::BackendDescriptor {
    id: RedLock::BACKEND,
    label: "RedLock",
    schemes: &["redlock"],
    test_url_var: "DISTLOCK_REDLOCK_URLS",
    test_url_default: "redlock://127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382",
    capabilities: REDLOCK_CAPABILITIES,
    connect: |url| {
        Box::pin(async move {
            let lock = RedLock::connect(RedLockConfig::from_url(&url)?).await?;
            Ok(std::sync::Arc::new(lock) as distlock_api::SharedLock)
        })
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_show_the_capability_checklists() {
        let docs = include_str!("../docs.md");
        assert!(docs.contains(&CAPABILITIES.checklist()));
        assert!(docs.contains(&REDLOCK_CAPABILITIES.checklist()));
    }
}
