//! A backend wrapper that counts renewals (grants renewed) and renewal requests (calls, of one
//! grant or of a batch), so scenario 6 can report the watchdog's renewal traffic for any backend
//! without hooks in the backends themselves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use distlock_api::backend::wait::{Attempt, HandOver, Notices};
use distlock_api::backend::{async_trait, AcquireRequest, ClientCore, LeaseKeeper};
use distlock_api::Profile;
use distlock_api::{DistributedLock, FencingToken, Grant, LockInfo, LockName, Result, SharedLock};

/// Delegates everything to `inner`. `core()` returns the inner's core, so guards taken through
/// the wrapper enrol with the inner client's one watchdog — which then renews through the
/// wrapper, because a guard keeps the handle it was acquired with.
pub(crate) struct Counting {
    inner: SharedLock,
    /// Whether to forward [`DistributedLock::keeper`]: true gives the in-memory backend's
    /// guards as users get them (the store keeps their leases: nothing to renew); false puts
    /// its guards in the watchdog's care like a networked backend's.
    forward_keeper: bool,
    renewals: AtomicU64,
    requests: AtomicU64,
    renew_errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Counting {
    pub(crate) fn new(inner: SharedLock) -> Self {
        Self {
            inner,
            forward_keeper: true,
            renewals: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            renew_errors: AtomicU64::new(0),
            first_error: Mutex::new(None),
        }
    }

    /// The same, but the in-memory backend's guards are renewed by the watchdog.
    #[cfg(test)]
    pub(crate) fn watched(inner: SharedLock) -> Self {
        Self {
            forward_keeper: false,
            ..Self::new(inner)
        }
    }

    /// Grants renewed so far (successfully or not).
    pub(crate) fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// Renewal calls so far: one per `renew`, one per batch of `renew_many`.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn count(&self, result: &Result<Duration>) {
        if let Err(e) = result {
            self.renew_errors.fetch_add(1, Ordering::Relaxed);
            self.first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.to_string());
        }
    }

    /// The first failed renew call's error.
    pub(crate) fn first_error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Renew calls that failed.
    pub(crate) fn renew_errors(&self) -> u64 {
        self.renew_errors.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl DistributedLock for Counting {
    fn profile(&self) -> Profile {
        self.inner.profile()
    }

    fn core(&self) -> &ClientCore {
        self.inner.core()
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.inner.attempt(req).await
    }

    async fn subscribe(&self, name: &LockName) -> Result<Box<dyn Notices>> {
        self.inner.subscribe(name).await
    }

    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        self.inner.acquire(req, wait).await
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.inner.release(grant).await
    }

    async fn give_back(&self, surplus: &distlock_api::backend::Surplus) -> Result<bool> {
        self.inner.give_back(surplus).await
    }

    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        self.inner.hand_over(from, to).await
    }

    fn keeper(&self) -> &dyn LeaseKeeper {
        if self.forward_keeper {
            self.inner.keeper()
        } else {
            self.inner.core().watchdog_keeper()
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let result = self.inner.renew(grant, ttl).await;
        self.count(&result);
        result
    }

    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        self.renewals
            .fetch_add(grants.len() as u64, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let results = self.inner.renew_many(grants).await;
        results.iter().for_each(|r| self.count(r));
        results
    }

    async fn proclaim(
        &self,
        grant: &distlock_api::Grant,
        value: &str,
    ) -> distlock_api::Result<bool> {
        self.inner.proclaim(grant, value).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        self.inner.list(prefix).await
    }

    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        self.inner.force_release(name, token).await
    }
    fn capabilities(&self) -> distlock_api::Capabilities {
        self.inner.capabilities()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use distlock_api::{LockExt, LockOptions, MemoryLock};

    use super::*;

    #[tokio::test]
    async fn the_watchdog_renews_through_the_wrapper() {
        let counting = Arc::new(Counting::watched(Arc::new(MemoryLock::new())));
        let ttl = Duration::from_millis(300);
        let guard = counting
            .try_lock_with("w", &LockOptions::new().watchdog_ttl(ttl))
            .await
            .unwrap()
            .expect("free");
        // Renewals come every TTL/3 = 100 ms; a generous window keeps this free of timing.
        tokio::time::sleep(Duration::from_millis(650)).await;
        assert!(counting.renewals() >= 2, "{} renewals", counting.renewals());
        assert_eq!(counting.renew_errors(), 0);
        assert!(!guard.is_lost());
        assert!(guard.release().await.unwrap());
    }
}
