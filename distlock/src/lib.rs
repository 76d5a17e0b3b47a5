#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]
// docs.rs shows which feature each backend module needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod table;

pub use connect::{backends, connect, schemes};
pub use distlock_api::*;
pub use table::capability_table;

/// The Redis and RedLock backends (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use distlock_redis::*;
}

/// The MySQL/MariaDB backend (feature `mysql`).
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql {
    pub use distlock_mysql::*;
}

/// The ZooKeeper backend (feature `zk`).
#[cfg(feature = "zk")]
#[cfg_attr(docsrs, doc(cfg(feature = "zk")))]
pub mod zk {
    pub use distlock_zk::*;
}

/// The etcd backend (feature `etcd`).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd {
    pub use distlock_etcd::*;
}

/// The MongoDB backend (feature `mongo`).
#[cfg(feature = "mongo")]
#[cfg_attr(docsrs, doc(cfg(feature = "mongo")))]
pub mod mongo {
    pub use distlock_mongo::*;
}

/// The in-memory backend (always available).
pub mod memory {
    pub use distlock_api::memory::*;
}
