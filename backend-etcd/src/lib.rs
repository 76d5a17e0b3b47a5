#![doc = include_str!("../docs.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod backend;
mod config;
mod count_down;
mod endpoints;
mod error;
mod holds;
mod inspect;
mod keepalive;
mod keys;
mod lease;
mod notices;
mod permits;
mod queue;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{EtcdLock, CAPABILITIES};
pub use config::{
    EtcdConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_LEASE_TTL,
    DEFAULT_OPERATION_TIMEOUT, DEFAULT_PORT,
};
pub use distlock_api::{
    Capabilities, DistributedLock, Error, ErrorKind, FencingToken, LockExt, LockGuard, LockInfo,
    LockName, LockOptions, LostReason, OwnerId, Result, SharedLock,
};
/// The etcd driver this backend uses, for the rest of what an application does with etcd.
pub use etcd_client;

/// The backend's name, as errors and `DISTLOCK_SKIP` show it.
pub(crate) const BACKEND: &str = "etcd";

/// The etcd backend, described once for the facade, the benchmark and the tests.
pub static DESCRIPTOR: distlock_api::BackendDescriptor = distlock_api::BackendDescriptor {
    id: BACKEND,
    label: "etcd",
    schemes: &["etcd"],
    test_url_var: "DISTLOCK_ETCD_URL",
    test_url_default: "etcd://127.0.0.1:2379",
    capabilities: CAPABILITIES,
    connect: |url| {
        Box::pin(async move {
            let lock = EtcdLock::connect(EtcdConfig::from_url(&url)?).await?;
            Ok(std::sync::Arc::new(lock) as SharedLock)
        })
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_show_the_capability_checklist() {
        assert!(include_str!("../docs.md").contains(&CAPABILITIES.checklist()));
    }
}
