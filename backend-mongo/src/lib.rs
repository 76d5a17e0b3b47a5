#![doc = include_str!("../docs.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod backend;
mod commands;
mod config;
mod error;
mod notices;
mod ops;
mod schema;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{MongoLock, ServerInfo, CAPABILITIES, POLL_CAP};
pub use config::{
    MongoConfig, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, DEFAULT_COLLECTION,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DATABASE, DEFAULT_OPERATION_TIMEOUT,
};
pub use distlock_api::{
    Capabilities, DistributedLock, Error, ErrorKind, FencingToken, LockExt, LockGuard, LockInfo,
    LockName, LockOptions, LostReason, OwnerId, Result, SharedLock,
};
/// The driver this backend uses, re-exported so users need no second dependency line.
pub use mongodb;

/// The backend's name, as errors and `DISTLOCK_SKIP` show it.
pub(crate) const BACKEND: &str = "mongo";

/// The MongoDB backend, described once for the facade, the benchmark and the tests.
pub static DESCRIPTOR: distlock_api::BackendDescriptor = distlock_api::BackendDescriptor {
    id: BACKEND,
    label: "MongoDB",
    schemes: &["mongodb", "mongodb+srv"],
    test_url_var: "DISTLOCK_MONGO_URL",
    test_url_default: "mongodb://127.0.0.1:27017",
    capabilities: CAPABILITIES,
    connect: |url| {
        Box::pin(async move {
            let lock = MongoLock::connect(MongoConfig::from_url(&url)?).await?;
            Ok(std::sync::Arc::new(lock) as SharedLock)
        })
    },
};

/// The field names of a lock document, for tools that read the collection.
pub mod fields {
    pub use crate::commands::{
        COUNT, EXPIRES_AT, FREED, GRANTED_AT, MAX, OWNER, PERMITS, TOKEN, VALUE,
    };
}
