//! Conveniences over the primitives, written once for every backend.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::{lock_with, try_lock_with};
use crate::election::Election;
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{FencingToken, LockInfo};
use crate::guard::{context, LockGuard};
use crate::lock::DistributedLock;
use crate::name::{check_prefix, LockName};
use crate::options::LockOptions;

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

    /// Takes a permit of the semaphore `name`, which admits `max` holders at once, if one is
    /// free, with `options` (its wait bound is ignored); `None` if all `max` are held. A permit
    /// is a grant like a lock's, and its guard has the lock guard's surface: its own token
    /// (from the name's one counter, so every permit's is higher than any before it), its own
    /// lease and watchdog, `lost()`, `safe_until()`, `release()`, release on drop.
    ///
    /// `max` is 1 to [`MAX_PERMITS`](crate::MAX_PERMITS) (a semaphore of 1 is the lock of the
    /// same name); while permits are held, asking with another `max` is `InvalidArgument`.
    /// `Unsupported` on a backend without semaphores
    /// ([`Capabilities::semaphore`](crate::Capabilities::semaphore)), before any request.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use distlock_api::{ErrorKind, LockExt, LockOptions, MemoryLock};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = Arc::new(MemoryLock::new());
    /// let opts = LockOptions::new();
    /// let a = locks.try_permit("workers", 2, &opts).await?.expect("2 free");
    /// let b = locks.try_permit("workers", 2, &opts).await?.expect("1 free");
    /// assert!(locks.try_permit("workers", 2, &opts).await?.is_none()); // both held
    /// assert!(b.token() > a.token());
    /// let err = locks.try_permit("workers", 3, &opts).await.unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidArgument); // held as a semaphore of 2
    /// assert!(a.release().await?);
    /// assert!(locks.try_permit("workers", 2, &opts).await?.is_some());
    /// # Ok::<_, distlock_api::Error>(())
    /// # }).unwrap();
    /// ```
    fn try_permit(
        &self,
        name: &str,
        max: u32,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send;

    /// Takes a permit of the semaphore `name` of `max` permits, waiting up to `options.wait`
    /// (no wait if unset); see [`try_permit`](Self::try_permit).
    fn permit(
        &self,
        name: &str,
        max: u32,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send;

    /// The leader election `name` ([`Election`]): campaign, proclaim, who leads, observe.
    /// `InvalidArgument` for a bad name; `Unsupported` on a backend without elections
    /// ([`Capabilities::election`](crate::Capabilities::election)). No request is sent.
    fn election(&self, name: &str) -> Result<Election>;

    /// Who holds `name`, if anyone.
    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send;

    /// Every held lock whose name starts with `prefix` (all of them for `""`), in name order,
    /// where the backend can enumerate them ([`ErrorKind::Unsupported`] where it cannot). A
    /// prefix longer than a name may be, or with a control character, is `InvalidArgument`.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<(LockName, LockInfo)>>> + Send;

    /// Frees `name` for an operator, whatever its holder's hold count, but only while its
    /// current grant carries `token` (read it with [`holder`](Self::holder)): `Ok(true)` if
    /// that grant held it, `Ok(false)` if the lock was free or changed hands meanwhile. See
    /// [`DistributedLock::force_release`].
    fn force_release(
        &self,
        name: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Runs `work` while holding `name`: takes the lock with `options` (waiting up to
    /// `options.wait`), hands `work` the fencing token to pass to the resource, and releases the
    /// lock when `work` finishes. If the lock is lost first, `work` is dropped at its next await
    /// point and the result is [`ErrorKind::Lost`] with the reason: work that must not outlive
    /// the lock does not.
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use distlock_api::{LockExt, LockOptions, MemoryLock};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = Arc::new(MemoryLock::new());
    /// let opts = LockOptions::new().wait(Duration::from_secs(5));
    /// let written = locks
    ///     .with_lock("reports/daily", &opts, |token| async move { format!("written with {token}") })
    ///     .await?;
    /// assert!(written.starts_with("written with"));
    /// assert!(locks.holder("reports/daily").await?.is_none()); // released
    /// # Ok::<_, distlock_api::Error>(())
    /// # }).unwrap();
    /// ```
    fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send;
}

// The methods are plain `async` bodies over `&Arc<dyn DistributedLock>` rather than
// `#[async_trait]` ones: on the in-memory backend a boxed future per call was a visible share of
// a whole lock cycle, and nobody needs `LockExt` itself as a trait object.
impl LockExt for Arc<dyn DistributedLock> {
    fn election(&self, name: &str) -> Result<Election> {
        Election::new(self.clone(), name)
    }

    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        try_lock_with(self, name, None, 1, None)
    }

    fn lock(&self, name: &str, wait: Duration) -> impl Future<Output = Result<LockGuard>> + Send {
        lock_with(self, name, None, 1, Some(wait))
    }

    fn try_lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        try_lock_with(self, name, Some(options), 1, None)
    }

    fn lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        lock_with(self, name, Some(options), 1, options.wait)
    }

    fn try_permit(
        &self,
        name: &str,
        max: u32,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        try_lock_with(self, name, Some(options), max, None)
    }

    fn permit(
        &self,
        name: &str,
        max: u32,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        lock_with(self, name, Some(options), max, options.wait)
    }

    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        holder(self, name)
    }

    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<(LockName, LockInfo)>>> + Send {
        list(self, prefix)
    }

    fn force_release(
        &self,
        name: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<bool>> + Send {
        force_release(self, name, token)
    }

    fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        with_lock(self, name, options, work)
    }
}

impl<B: DistributedLock> LockExt for Arc<B> {
    fn election(&self, name: &str) -> Result<Election> {
        Election::new(self.clone(), name)
    }

    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { try_lock_with(&this, name, None, 1, None).await }
    }

    fn lock(&self, name: &str, wait: Duration) -> impl Future<Output = Result<LockGuard>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { lock_with(&this, name, None, 1, Some(wait)).await }
    }

    fn try_lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { try_lock_with(&this, name, Some(options), 1, None).await }
    }

    fn lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { lock_with(&this, name, Some(options), 1, options.wait).await }
    }

    fn try_permit(
        &self,
        name: &str,
        max: u32,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { try_lock_with(&this, name, Some(options), max, None).await }
    }

    fn permit(
        &self,
        name: &str,
        max: u32,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { lock_with(&this, name, Some(options), max, options.wait).await }
    }

    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { holder(&this, name).await }
    }

    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<(LockName, LockInfo)>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { list(&this, prefix).await }
    }

    fn force_release(
        &self,
        name: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<bool>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { force_release(&this, name, token).await }
    }

    fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { with_lock(&this, name, options, work).await }
    }
}

async fn with_lock<F, Fut, T>(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    options: &LockOptions,
    work: F,
) -> Result<T>
where
    F: FnOnce(FencingToken) -> Fut + Send,
    Fut: Future<Output = T> + Send,
    T: Send,
{
    let guard = lock_with(this, name, Some(options), 1, options.wait).await?;
    let lost = guard.lost();
    let outcome = tokio::select! {
        // The work first: when both are ready, work that finished is not thrown away.
        biased;
        done = work(guard.token()) => Ok(done),
        why = lost => Err(why),
    };
    match outcome {
        Ok(done) => {
            // A release that fails leaves the lock to its lease; the work is done either way.
            let _ = guard.release().await;
            Ok(done)
        }
        Err(why) => {
            let name = guard.name().clone();
            let _ = guard.release().await;
            Err(Error::new(
                ErrorKind::Lost,
                format!("the lock was lost while the work ran: {why}"),
            )
            .with_backend(this.core().backend())
            .with_lock(name))
        }
    }
}

async fn holder(this: &Arc<dyn DistributedLock>, name: &str) -> Result<Option<LockInfo>> {
    let name = LockName::new(name).map_err(|e| e.with_backend(this.core().backend()))?;
    this.inspect(&name)
        .await
        .map_err(|e| context(e, &**this, &name))
}

async fn list(this: &Arc<dyn DistributedLock>, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
    let backend = this.core().backend();
    check_prefix(prefix).map_err(|e| e.with_backend(backend))?;
    let mut held = DistributedLock::list(&**this, prefix)
        .await
        .map_err(|e| e.with_backend(backend))?;
    held.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    Ok(held)
}

async fn force_release(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    token: FencingToken,
) -> Result<bool> {
    let name = LockName::new(name).map_err(|e| e.with_backend(this.core().backend()))?;
    let freed = DistributedLock::force_release(&**this, &name, token)
        .await
        .map_err(|e| context(e, &**this, &name))?;
    tracing::info!(
        backend = this.core().backend(),
        lock = %name,
        token = token.0,
        freed,
        "lock force-released"
    );
    Ok(freed)
}
