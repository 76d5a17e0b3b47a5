//! The distlock lock API: the [`DistributedLock`] trait every backend implements, the
//! [`LockExt`] conveniences users call, the [`LockGuard`] they get back, the watchdog that
//! renews leases, names, owners, fencing tokens, capabilities and errors — and
//! [`MemoryLock`], the in-memory backend that is the reference model of the contract.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use distlock_api::{LockExt, LockOptions, MemoryStore};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let (a, b) = (Arc::new(store.client()), Arc::new(store.client()));
//!
//! let held = a.try_lock("invoice-42").await?.expect("free");
//! assert!(b.try_lock("invoice-42").await?.is_none()); // another client: held
//!
//! let first = held.token();
//! held.release().await?;
//! let next = b.lock_with("invoice-42", &LockOptions::new().ttl(Duration::from_secs(5))).await?;
//! assert!(next.token() > first); // fencing tokens only go up
//! # Ok::<_, distlock_api::Error>(())
//! # }).unwrap();
//! ```
//!
//! # Words
//!
//! The code and its docs use these words in one sense each:
//!
//! - **grant**: what the server gave one acquisition: name, owner id, fencing token, lease
//!   ([`Grant`]). A fresh grant has a new token; a re-entry adds a hold to the same grant.
//! - **hold**: one of a grant's counted acquisitions. The lock is free when its grant's last
//!   hold is given up. Each [`LockGuard`] is one hold.
//! - **holder**: the owner whose grant holds the lock now ([`LockInfo`]).
//! - **hand-over**: a release that passes the lock to a waiter of the same client handle in the
//!   same request, with a new grant ([`DistributedLock::hand_over`]).
//! - **give-back**: taking away the hold an acquire may have left when its answer was lost
//!   ([`DistributedLock::give_back`]).
//! - **lease** and **safe-until**: how long the server keeps a grant without renewal, and the
//!   instant until which the guard may act as holder (the lease counted from the request's
//!   send, less drift).

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod acquire;
pub mod backend;
mod capability;
pub mod config;
mod descriptor;
mod election;
mod error;
mod ext;
mod grant;
mod guard;
mod keeper;
mod lock;
mod lost_reply;
pub mod memory;
mod name;
mod observe;
mod options;
mod release;
mod wakes;
mod watchdog;

pub use capability::{Blocking, Capabilities, Fencing, LeaseKind, Profile, TtlSupport};
pub use config::ClientOptions;
pub use descriptor::{BackendDescriptor, ConnectFn, MEMORY};
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{Error, ErrorKind, LostReason, Result};
pub use ext::LockExt;
pub use grant::{FencingToken, Grant, LockInfo, MAX_PERMITS, MAX_TTL, MAX_VALUE_LEN, MAX_WAIT};
pub use guard::LockGuard;
pub use lock::{DistributedLock, SharedLock, DEFAULT_TTL};
pub use memory::{MemoryLock, MemoryStore};
pub use name::{LockName, OwnerId, MAX_NAME_LEN, MAX_OWNER_LEN, MAX_OWNER_TEXT_LEN};
pub use options::{Lease, LockOptions};
