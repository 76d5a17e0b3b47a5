//! Conveniences over the primitives, written once for every backend.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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
pub trait LockExt {
    /// Takes the lock if it is free, with default options; `None` if someone else holds it.
    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send;

    /// Takes the lock, waiting up to `wait`; [`ErrorKind::Timeout`] after that.
    fn lock(&self, name: &str, wait: Duration) -> impl Future<Output = Result<LockGuard>> + Send;

    /// Takes the lock if it is free, with `options` (its wait bound is ignored).
    fn try_lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send;

    /// Takes the lock with `options`, waiting up to `options.wait` (no wait if unset).
    fn lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send;

    /// Who holds `name`, if anyone.
    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send;
}

// The methods are plain `async` bodies over `&Arc<dyn DistributedLock>` rather than
// `#[async_trait]` ones: on the in-memory backend a boxed future per call was a visible share of
// a whole lock cycle, and nobody needs `LockExt` itself as a trait object.
impl LockExt for Arc<dyn DistributedLock> {
    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        try_lock_with(self, name, None)
    }

    fn lock(&self, name: &str, wait: Duration) -> impl Future<Output = Result<LockGuard>> + Send {
        lock_with(self, name, None, Some(wait))
    }

    fn try_lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        try_lock_with(self, name, Some(options))
    }

    fn lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        lock_with(self, name, Some(options), options.wait)
    }

    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        holder(self, name)
    }
}

impl<B: DistributedLock> LockExt for Arc<B> {
    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { try_lock_with(&this, name, None).await }
    }

    fn lock(&self, name: &str, wait: Duration) -> impl Future<Output = Result<LockGuard>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { lock_with(&this, name, None, Some(wait)).await }
    }

    fn try_lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { try_lock_with(&this, name, Some(options)).await }
    }

    fn lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { lock_with(&this, name, Some(options), options.wait).await }
    }

    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { holder(&this, name).await }
    }
}

/// Default options, for the methods that take none.
static DEFAULT_OPTIONS: LockOptions = LockOptions {
    lease: Lease::Watchdog,
    wait: None,
    owner: None,
};

async fn try_lock_with(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    options: Option<&LockOptions>,
) -> Result<Option<LockGuard>> {
    let plan = Plan::new(&**this, name, options.unwrap_or(&DEFAULT_OPTIONS), None)?;
    spend_budget().await;
    let grant = match this.try_acquire_local(&plan.req) {
        Some(attempt) => attempt,
        None => this.try_acquire(&plan.req).await,
    }
    .map_err(|e| context(e, &**this, &plan.req.name))?;
    Ok(grant.map(|g| LockGuard::new(this.clone(), g, plan.renew, plan.leased)))
}

async fn lock_with(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    options: Option<&LockOptions>,
    wait: Option<Duration>,
) -> Result<LockGuard> {
    let plan = Plan::new(&**this, name, options.unwrap_or(&DEFAULT_OPTIONS), wait)?;
    spend_budget().await;
    let grant = match this.try_acquire_local(&plan.req) {
        Some(Ok(Some(grant))) => Ok(grant),
        Some(Err(e)) => Err(e),
        // Held (the backend's `acquire` queues or polls), or not an in-process backend.
        Some(Ok(None)) | None => {
            this.acquire(&plan.req, wait.unwrap_or(Duration::ZERO))
                .await
        }
    }
    .map_err(|e| context(e, &**this, &plan.req.name))?;
    Ok(LockGuard::new(this.clone(), grant, plan.renew, plan.leased))
}

/// Spends one unit of the task's cooperative budget, yielding if it is used up. An in-process
/// backend's attempt never yields by itself, and a loop of them must still let the runtime run
/// its other tasks (the watchdog among them). It comes before the attempt, not after: a task
/// dropped while it yields must not leave a grant that no guard owns.
async fn spend_budget() {
    tokio::task::coop::consume_budget().await;
}

async fn holder(this: &Arc<dyn DistributedLock>, name: &str) -> Result<Option<LockInfo>> {
    let name = LockName::new(name).map_err(|e| e.with_backend(this.core().backend()))?;
    this.inspect(&name)
        .await
        .map_err(|e| context(e, &**this, &name))
}

/// A validated acquire: the request, and how the guard keeps its lease.
struct Plan {
    req: AcquireRequest,
    renew: Option<Duration>,
    leased: bool,
}

impl Plan {
    fn new(
        backend: &dyn DistributedLock,
        name: &str,
        options: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Self> {
        let core = backend.core();
        let name = LockName::new(name).map_err(|e| e.with_backend(core.backend()))?;
        let with_ctx = |e: Error| e.with_backend(core.backend()).with_lock(&name);
        options.validate().map_err(with_ctx)?;
        if let Some(wait) = wait {
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
        crate::grant::check_ttl(ttl).map_err(with_ctx)?;
        let owner = options
            .owner
            .clone()
            .unwrap_or_else(|| core.owner().clone());
        Ok(Self {
            // Checked above; built in place so the name moves in rather than being cloned.
            req: AcquireRequest { name, owner, ttl },
            renew,
            leased: caps.ttl.kind != LeaseKind::None,
        })
    }
}
