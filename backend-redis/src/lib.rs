#![doc = include_str!("../docs.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod backend;
mod config;
mod keys;
mod pubsub;
mod redlock;
mod server;
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
