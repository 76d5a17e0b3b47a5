#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod connect;
mod table;

pub use connect::{connect, schemes};
pub use distlock_api::*;
pub use table::capability_table;

/// The MongoDB backend (feature `mongo`).
#[cfg(feature = "mongo")]
pub mod mongo {
    pub use distlock_mongo::*;
}

/// The in-memory backend (always available).
pub mod memory {
    pub use distlock_api::memory::*;
}
