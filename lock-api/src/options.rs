//! How a caller asks for a lock.

use std::time::Duration;

use crate::error::Result;
use crate::grant::{check_ttl, check_wait};
use crate::name::OwnerId;

/// How a grant's lease is kept. Ways may be added (`#[non_exhaustive]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Lease {
    /// The client's watchdog renews the lease every TTL/3 while the guard lives. `None` uses the
    /// client's default TTL.
    #[default]
    Watchdog,
    /// Like `Watchdog`, with this TTL instead of the client's default.
    WatchdogTtl(Duration),
    /// A fixed lease: nobody renews it; it expires `ttl` after the grant unless the holder calls
    /// [`LockGuard::extend`](crate::LockGuard::extend). Only backends with per-lock leases.
    Fixed(Duration),
}

/// Options for one acquire. `LockOptions::default()` is a watchdog-managed lease with the
/// client's default TTL, an owner id of the acquisition's own, and no waiting. Built with
/// [`LockOptions::new`] and its setters; options may be added (`#[non_exhaustive]`).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct LockOptions {
    /// How the lease is kept.
    pub lease: Lease,
    /// How long `lock_with` waits; `None` means try once (`lock_with` then times out at once).
    pub wait: Option<Duration>,
    /// An explicit owner; `None` (the default) gives the acquisition an owner id of its own,
    /// so that it excludes every other acquisition, of this client handle too. An explicit
    /// label is qualified by the client handle (see [`OwnerId`]): acquisitions with one label on
    /// one handle re-enter each other's hold; on another handle it is another owner.
    pub owner: Option<OwnerId>,
}

impl LockOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fixed lease of `ttl`, not renewed.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.lease = Lease::Fixed(ttl);
        self
    }

    /// A watchdog-renewed lease of `ttl`.
    pub fn watchdog_ttl(mut self, ttl: Duration) -> Self {
        self.lease = Lease::WatchdogTtl(ttl);
        self
    }

    /// Wait up to `wait` for the lock.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Acquire as `owner` on this client handle, re-entering a hold of the same owner (see
    /// [`owner`](LockOptions#structfield.owner)); a guard's
    /// [`reenter`](crate::LockGuard::reenter) is the usual way to re-enter.
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Rejects bad TTLs and wait bounds before any I/O.
    pub fn validate(&self) -> Result<()> {
        match self.lease {
            Lease::Watchdog => {}
            Lease::WatchdogTtl(ttl) | Lease::Fixed(ttl) => check_ttl(ttl)?,
        }
        if let Some(wait) = self.wait {
            check_wait(wait)?;
        }
        Ok(())
    }
}
