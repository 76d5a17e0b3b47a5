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

// The guide's pages under docs/, compiled only as doctests: their Rust examples run like the
// README's, so a page cannot drift from the API. Every topic page is listed, with or without
// Rust blocks today, so an example added later is tested without touching this file.
#[cfg(doctest)]
#[doc = include_str!("../../docs/choosing-a-backend.md")]
mod choosing_a_backend_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/ownership-and-reentry.md")]
mod ownership_and_reentry_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/semaphores.md")]
mod semaphores_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/elections.md")]
mod elections_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/when-servers-fail.md")]
mod when_servers_fail_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/configuration.md")]
mod configuration_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/observability.md")]
mod observability_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/fault-campaign.md")]
mod fault_campaign_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/benchmark.md")]
mod benchmark_doc {}
#[cfg(doctest)]
#[doc = include_str!("../../docs/adding-a-backend.md")]
mod adding_a_backend_doc {}

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

/// The PostgreSQL backend (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    pub use distlock_postgres::*;
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
