//! An acquire's options, validated and resolved into a request and how its guard keeps it.

use std::sync::Arc;
use std::time::Duration;

use crate::capability::LeaseKind;
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{check_permits, check_wait, AcquireRequest, Grant};
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::name::{check_name, LockName, OwnerId};
use crate::options::{Lease, LockOptions};

/// A validated acquire: the lease, the owner, and how the guard keeps its lease.
pub(super) struct Plan {
    /// This acquisition's owner id (see [`ClientCore::owner_for`](crate::backend::ClientCore::owner_for)).
    owner: OwnerId,
    /// Whether the owner id was made for this acquisition ([`AcquireRequest::fresh`]).
    fresh: bool,
    ttl: Duration,
    permits: u32,
    renew: Option<Duration>,
    leased: bool,
}

impl Plan {
    pub(super) fn new(
        backend: &dyn DistributedLock,
        name: &str,
        options: &LockOptions,
        permits: u32,
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
        check_permits(permits).map_err(with_ctx)?;
        // The client's default TTL was checked when it was set.
        let (ttl, renew) = match options.lease {
            Lease::Watchdog => (core.default_ttl(), Some(core.default_ttl())),
            Lease::WatchdogTtl(ttl) => (ttl, Some(ttl)),
            Lease::Fixed(ttl) => (ttl, None),
        };
        let caps = backend.capabilities();
        if permits > 1 && !caps.semaphore {
            return Err(with_ctx(Error::new(
                ErrorKind::Unsupported,
                "this backend has no semaphores: a name admits one holder (see the backend's \
                 docs for why)",
            )));
        }
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
            owner,
            fresh: reenter.is_none() && options.owner.is_none(),
            ttl,
            permits,
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
            permits: self.permits,
            fresh: self.fresh,
        };
        (
            req,
            Keeping {
                renew: self.renew,
                leased: self.leased,
                permits: self.permits,
            },
        )
    }
}

/// How the guard keeps its lease: what [`LockGuard::new`] takes besides the grant.
pub(super) struct Keeping {
    pub(super) renew: Option<Duration>,
    pub(super) leased: bool,
    pub(super) permits: u32,
}

impl Keeping {
    /// The guard of `grant`, handed to the backend's keeper.
    pub(super) fn guard(self, backend: &Arc<dyn DistributedLock>, mut grant: Grant) -> LockGuard {
        grant.permits = self.permits;
        LockGuard::new(backend.clone(), grant, self.renew, self.leased)
    }
}
