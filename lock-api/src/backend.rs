//! For backend authors: what implementing [`DistributedLock`](crate::DistributedLock) takes,
//! apart from what users see at the crate root.
//!
//! A backend implements the server's operations ([`attempt`], `release`, `renew`, `inspect`,
//! optionally a batched `renew_many` and a `give_back`), says how its acquires wait
//! ([`Waiting`]) and keeps its per-client state in a [`ClientCore`]. lock-api does the rest:
//! try-acquire, the wait loops, cancellation safety, lost answers, the watchdog and the
//! guards. A backend that waits in a queue of its own undoes half-done work with [`Armed`].
//!
//! [`attempt`]: crate::DistributedLock::attempt
//! [`Waiting`]: wait::Waiting
//! [`Armed`]: wait::Armed

pub use crate::grant::{
    check_ttl, check_wait, drift, lost, safe_until, AcquireRequest, Grant, MAX_TTL, MAX_WAIT,
};
pub use crate::keeper::Hold;
pub use crate::lock::{ClientCore, LeaseKeeper, OnTheSpot};
/// Re-exported so backends implement the trait with the same macro version.
pub use async_trait::async_trait;

pub mod testing;
pub mod wait;
