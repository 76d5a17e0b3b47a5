#![doc = include_str!("../docs.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod backend;
mod config;
mod endpoints;
mod error;
mod holds;
mod keepalive;
mod keys;
mod lease;
mod queue;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{EtcdLock, CAPABILITIES};
pub use config::{
    EtcdConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT,
};
pub use distlock_api::{
    Capabilities, DistributedLock, Error, ErrorKind, FencingToken, LockExt, LockGuard, LockInfo,
    LockName, LockOptions, LostReason, OwnerId, Result, SharedLock,
};
/// The etcd driver this backend uses, for the rest of what an application does with etcd.
pub use etcd_client;

/// The backend's name, as errors and `DISTLOCK_SKIP` show it.
pub(crate) const BACKEND: &str = "etcd";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_show_the_capability_checklist() {
        assert!(include_str!("../docs.md").contains(&CAPABILITIES.checklist()));
    }
}
