//! An acquire's options, validated and resolved into a request and how its guard keeps it.

use std::time::Duration;

use crate::capability::LeaseKind;
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{check_wait, AcquireRequest};
use crate::lock::{DistributedLock, LeaseKeeper};
use crate::name::{check_name, LockName, OwnerId};
use crate::options::{Lease, LockOptions};

/// A validated acquire: the lease, the owner, and how the guard keeps its lease. The name is
/// checked, not yet copied: the in-memory backend finds a name it has seen by `&str`.
pub(super) struct Plan<'a> {
    /// Who keeps the guard: it grants on the spot if it is the lock's server too.
    pub(super) keeper: &'a dyn LeaseKeeper,
    /// This acquisition's owner id (see [`ClientCore::owner_for`](crate::backend::ClientCore::owner_for)).
    pub(super) owner: OwnerId,
    pub(super) ttl: Duration,
    pub(super) renew: Option<Duration>,
    pub(super) leased: bool,
}

impl<'a> Plan<'a> {
    // Always inlined: returned from a call, the `Result<Plan>` went through memory and was read
    // back in pieces that straddled the callee's stores, stalling store-to-load forwarding
    // (about 5 ns of an in-memory lock cycle). The error paths stay out of line.
    #[inline(always)]
    pub(super) fn new(
        backend: &'a dyn DistributedLock,
        name: &str,
        options: &'a LockOptions,
        wait: Option<Duration>,
        reenter: Option<&OwnerId>,
    ) -> Result<Self> {
        let core = backend.core();
        check_name(name).map_err(|e| e.with_backend(core.backend()))?;
        // Errors past the name check are rare: only they pay for a `LockName`.
        let with_ctx = |e: Error| {
            e.with_backend(core.backend())
                .with_lock(LockName::checked(name))
        };
        options.validate().map_err(with_ctx)?;
        if let Some(wait) = wait {
            check_wait(wait).map_err(with_ctx)?;
        }
        // The client's default TTL was checked when it was set.
        let (ttl, renew) = match options.lease {
            Lease::Watchdog => (core.default_ttl(), Some(core.default_ttl())),
            Lease::WatchdogTtl(ttl) => (ttl, Some(ttl)),
            Lease::Fixed(ttl) => (ttl, None),
        };
        let caps = backend.capabilities();
        if renew.is_none() && caps.ttl.kind != LeaseKind::PerLock {
            return Err(with_ctx(Error::new(
                ErrorKind::Unsupported,
                "this backend has no per-lock leases: a fixed TTL cannot be honoured; use a \
                 watchdog-managed lease",
            )));
        }
        let renew = renew.filter(|_| caps.renewal);
        let owner = match reenter {
            Some(owner) => owner.clone(),
            None => core.owner_for(options.owner.as_ref()).map_err(with_ctx)?,
        };
        Ok(Self {
            keeper: backend.keeper(),
            owner,
            ttl,
            renew,
            leased: caps.ttl.kind != LeaseKind::None,
        })
    }

    /// The request for `name` (the name this plan checked), and what the guard needs after it.
    pub(super) fn request(self, name: &str) -> (AcquireRequest, Keeping) {
        let req = AcquireRequest {
            name: LockName::checked(name),
            owner: self.owner,
            ttl: self.ttl,
        };
        (
            req,
            Keeping {
                renew: self.renew,
                leased: self.leased,
            },
        )
    }
}

/// How a networked guard keeps its lease: what [`LockGuard::new`](crate::guard::LockGuard::new) takes besides the grant.
pub(super) struct Keeping {
    pub(super) renew: Option<Duration>,
    pub(super) leased: bool,
}
