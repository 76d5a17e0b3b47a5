//! The in-memory reference backend against the whole suite.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    async_trait, Capabilities, ClientCore, DistributedLock, LockName, MemoryStore, Result,
};

struct Memory {
    store: MemoryStore,
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
        Ok(Arc::new(self.store.client().with_core(core)))
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

fn main() -> ExitCode {
    distlock_conformance::run(Memory {
        store: MemoryStore::new(),
    })
}
