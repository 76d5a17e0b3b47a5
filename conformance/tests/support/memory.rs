//! The in-memory harness both memory targets run: `memory` gives the suite the backend as users
//! get it, `memory_watchdog` puts it behind [`Watched`].

use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::{async_trait, AcquireRequest, ClientCore};
use distlock_api::Profile;
use distlock_api::{
    Capabilities, DistributedLock, FencingToken, Grant, LockInfo, LockName, MemoryLock,
    MemoryStore, Result,
};

pub(crate) struct Memory {
    store: MemoryStore,
    /// Whether clients hide [`DistributedLock::keeper`].
    watched: bool,
}

impl Memory {
    /// A fresh store. `watched`: clients behind [`Watched`], whose guards take the path every
    /// networked backend's take; otherwise clients as users get them (guards kept by the store).
    pub(crate) fn new(watched: bool) -> Self {
        Self {
            store: MemoryStore::new(),
            watched,
        }
    }
}

/// A memory client that forwards every primitive but keeps its guards with the watchdog, so
/// they take the networked backends' path (watchdog enrolment, renewals through `renew`).
struct Watched(MemoryLock);

#[async_trait]
impl DistributedLock for Watched {
    fn profile(&self) -> Profile {
        self.0.profile()
    }

    fn core(&self) -> &ClientCore {
        self.0.core()
    }
    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.0.attempt(req).await
    }
    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        self.0.acquire(req, wait).await
    }
    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.0.release(grant).await
    }
    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        self.0.renew(grant, ttl).await
    }
    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        self.0.proclaim(grant, value).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.0.inspect(name).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        self.0.list(prefix).await
    }
    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        self.0.force_release(name, token).await
    }
    async fn give_back(&self, surplus: &distlock_api::backend::Surplus) -> Result<bool> {
        self.0.give_back(surplus).await
    }
    fn capabilities(&self) -> distlock_api::Capabilities {
        self.0.capabilities()
    }
    async fn subscribe(
        &self,
        name: &distlock_api::LockName,
    ) -> distlock_api::Result<Box<dyn distlock_api::backend::wait::Notices>> {
        self.0.subscribe(name).await
    }
    async fn hand_over(
        &self,
        from: &distlock_api::Grant,
        to: &distlock_api::backend::AcquireRequest,
    ) -> distlock_api::Result<distlock_api::backend::wait::HandOver> {
        self.0.hand_over(from, to).await
    }
    /// The watchdog's, not the wrapped backend's: this wrapper's guards take the networked
    /// backends' path.
    fn keeper(&self) -> &dyn distlock_api::backend::LeaseKeeper {
        self.core().watchdog_keeper()
    }
    async fn renew_many(
        &self,
        grants: &[(distlock_api::Grant, std::time::Duration)],
    ) -> Vec<distlock_api::Result<std::time::Duration>> {
        self.0.renew_many(grants).await
    }
}

#[async_trait]
impl distlock_conformance::Harness for Memory {
    fn backend(&self) -> &'static str {
        "memory"
    }
    fn capabilities(&self) -> Capabilities {
        distlock_api::memory::CAPABILITIES
    }
    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        let core = ClientCore::new("memory").with_default_ttl(self.short_ttl())?;
        let client = self.store.client().with_core(core);
        Ok(if self.watched {
            Arc::new(Watched(client))
        } else {
            Arc::new(client)
        })
    }
    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>> {
        None
    }
    async fn remove_behind_back(&self, name: &LockName) -> Result<()> {
        self.store.remove(name);
        Ok(())
    }
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        Ok(Some(self.store.waiters_for(name)))
    }
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(300)
    }
    fn wake_bound(&self) -> Duration {
        Duration::from_millis(100)
    }
    async fn leftovers(&self, _prefix: &str) -> Result<Vec<String>> {
        // Each case's clients share this store alone (one store per process under nextest,
        // per harness otherwise), so any waiter left at all is a leak.
        let waiters = self.store.waiters();
        Ok((waiters > 0)
            .then(|| format!("{waiters} queued waiters"))
            .into_iter()
            .collect())
    }
}
