//! Conveniences over the primitives, written once for every backend.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::capability::LeaseKind;
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{check_wait, AcquireRequest, LockInfo};
use crate::guard::{context, LockGuard};
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::options::{Lease, LockOptions};

/// What users call: validate, acquire, wrap in a [`LockGuard`] watched by the client's
/// watchdog. Implemented for `Arc<dyn DistributedLock>` and `Arc<B>` for every backend `B`.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use distlock_api::{LockExt, MemoryLock};
///
/// # tokio_test_block_on(async {
/// let locks = Arc::new(MemoryLock::new());
/// let guard = locks.lock("reports/daily", Duration::from_secs(1)).await?;
/// assert!(!guard.is_lost());
/// assert!(guard.release().await?);
/// # Ok::<_, distlock_api::Error>(())
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[async_trait]
pub trait LockExt {
    /// Takes the lock if it is free, with default options; `None` if someone else holds it.
    async fn try_lock(&self, name: &str) -> Result<Option<LockGuard>> {
        self.try_lock_with(name, &LockOptions::default()).await
    }

    /// Takes the lock, waiting up to `wait`; [`ErrorKind::Timeout`] after that.
    async fn lock(&self, name: &str, wait: Duration) -> Result<LockGuard> {
        self.lock_with(name, &LockOptions::default().wait(wait))
            .await
    }

    /// Takes the lock if it is free, with `options` (its wait bound is ignored).
    async fn try_lock_with(&self, name: &str, options: &LockOptions) -> Result<Option<LockGuard>>;

    /// Takes the lock with `options`, waiting up to `options.wait` (no wait if unset).
    async fn lock_with(&self, name: &str, options: &LockOptions) -> Result<LockGuard>;

    /// Who holds `name`, if anyone.
    async fn holder(&self, name: &str) -> Result<Option<LockInfo>>;
}

#[async_trait]
impl LockExt for Arc<dyn DistributedLock> {
    async fn try_lock_with(&self, name: &str, options: &LockOptions) -> Result<Option<LockGuard>> {
        let plan = Plan::new(&**self, name, options)?;
        let grant = self
            .try_acquire(&plan.req)
            .await
            .map_err(|e| context(e, &**self, &plan.req.name))?;
        Ok(grant.map(|g| LockGuard::new(self.clone(), g, plan.renew, plan.leased)))
    }

    async fn lock_with(&self, name: &str, options: &LockOptions) -> Result<LockGuard> {
        let plan = Plan::new(&**self, name, options)?;
        let wait = options.wait.unwrap_or(Duration::ZERO);
        let grant = self
            .acquire(&plan.req, wait)
            .await
            .map_err(|e| context(e, &**self, &plan.req.name))?;
        Ok(LockGuard::new(self.clone(), grant, plan.renew, plan.leased))
    }

    async fn holder(&self, name: &str) -> Result<Option<LockInfo>> {
        let name = LockName::new(name)?;
        self.inspect(&name)
            .await
            .map_err(|e| context(e, &**self, &name))
    }
}

#[async_trait]
impl<B: DistributedLock> LockExt for Arc<B> {
    async fn try_lock_with(&self, name: &str, options: &LockOptions) -> Result<Option<LockGuard>> {
        let this: Arc<dyn DistributedLock> = self.clone();
        this.try_lock_with(name, options).await
    }

    async fn lock_with(&self, name: &str, options: &LockOptions) -> Result<LockGuard> {
        let this: Arc<dyn DistributedLock> = self.clone();
        this.lock_with(name, options).await
    }

    async fn holder(&self, name: &str) -> Result<Option<LockInfo>> {
        let this: Arc<dyn DistributedLock> = self.clone();
        this.holder(name).await
    }
}

/// A validated acquire: the request, and how the guard keeps its lease.
struct Plan {
    req: AcquireRequest,
    renew: Option<Duration>,
    leased: bool,
}

impl Plan {
    fn new(backend: &dyn DistributedLock, name: &str, options: &LockOptions) -> Result<Self> {
        let core = backend.core();
        let name = LockName::new(name).map_err(|e| e.with_backend(core.backend()))?;
        let with_ctx = |e: Error| e.with_backend(core.backend()).with_lock(&name);
        options.validate().map_err(with_ctx)?;
        if let Some(wait) = options.wait {
            check_wait(wait).map_err(with_ctx)?;
        }
        let caps = backend.capabilities();
        let (ttl, renew) = match options.lease {
            Lease::Watchdog => (core.default_ttl(), Some(core.default_ttl())),
            Lease::WatchdogTtl(ttl) => (ttl, Some(ttl)),
            Lease::Fixed(ttl) => {
                if caps.ttl.kind != LeaseKind::PerLock {
                    return Err(with_ctx(Error::new(
                        ErrorKind::Unsupported,
                        "this backend has no per-lock leases: a fixed TTL cannot be honoured; \
                         use a watchdog-managed lease",
                    )));
                }
                (ttl, None)
            }
        };
        let renew = renew.filter(|_| caps.renewal);
        let owner = options
            .owner
            .clone()
            .unwrap_or_else(|| core.owner().clone());
        let req = AcquireRequest::new(name.clone(), owner, ttl).map_err(with_ctx)?;
        Ok(Self {
            req,
            renew,
            leased: caps.ttl.kind != LeaseKind::None,
        })
    }
}
