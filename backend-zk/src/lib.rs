#![doc = include_str!("../docs.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod auth;
mod backend;
mod cleanup;
mod config;
mod error;
mod holds;
mod path;
mod permits;
mod queue;
mod session;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tls")]
mod tls;

pub use backend::{ZkLock, CAPABILITIES};
pub use config::{
    NodeAcl, ZkConfig, DEFAULT_BASE_PATH, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_PORT, DEFAULT_SESSION_TIMEOUT,
};
pub use distlock_api::{
    Capabilities, DistributedLock, Error, ErrorKind, FencingToken, LockExt, LockGuard, LockInfo,
    LockName, LockOptions, LostReason, OwnerId, Result, SharedLock,
};
/// The ZooKeeper client this backend drives, re-exported for [`ZkLock::client`].
pub use zookeeper_client;

/// The ZooKeeper backend, described once for the facade, the benchmark and the tests.
pub static DESCRIPTOR: distlock_api::BackendDescriptor = distlock_api::BackendDescriptor {
    id: "zk",
    label: "ZooKeeper",
    schemes: &["zk"],
    test_url_var: "DISTLOCK_ZK_URL",
    test_url_default: "zk://127.0.0.1:2181",
    capabilities: CAPABILITIES,
    connect: |url| {
        Box::pin(async move {
            let lock = ZkLock::connect(ZkConfig::from_url(&url)?).await?;
            Ok(std::sync::Arc::new(lock) as SharedLock)
        })
    },
};

/// The path segment lock `name` is stored under, below the base path: a fixed mark, then the
/// name with `/`, `%` and every character ZooKeeper cannot store percent-encoded. For
/// operators (finding a lock in `zkCli.sh`) and tests; [`ZkLock::lock_path`] gives the whole
/// path.
pub fn encode_lock_name(name: &str) -> String {
    path::encode_name(name)
}

/// The lock name a path segment made by [`encode_lock_name`] stands for; `None` for any other
/// node.
pub fn decode_lock_name(segment: &str) -> Option<String> {
    path::decode_name(segment)
}
