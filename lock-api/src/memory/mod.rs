//! The in-memory backend: the reference model of the contract, with every capability on.
//!
//! A [`MemoryStore`] plays the server; each [`MemoryLock`] is one client of it with its own
//! owner id. Waiters queue per name and the releasing holder hands the lock to the first live
//! waiter, so waiting is notice-driven and FIFO. A name may be a semaphore: up to its `permits`
//! holders at once, each with a grant, token and lease of its own.
//!
//! The store also plays the watchdog for the guards the conveniences hand out: it keeps a
//! watchdog-managed lease alive while its guard lives (the renewals could not fail: client and
//! "server" share one process), and it tells a guard's `lost()` the moment its holder goes, so
//! holding many locks costs no renewal work. Otherwise it takes the path every backend takes:
//! attempts, its own queue ([`Waiting::Queue`]), and releases sent when the guard lets go.

mod keeper;
mod slot;
mod store;

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::backend::wait::{Attempt, Waiting};
use crate::capability::{Blocking, Capabilities, Fencing, LeaseKind, Profile, TtlSupport};
use crate::error::Result;
use crate::grant::{lost, AcquireRequest, FencingToken, Grant, LockInfo, Surplus};
use crate::lock::{ClientCore, DistributedLock, LeaseKeeper};

use crate::name::LockName;

use slot::Refused;
use store::other_permits;

pub use store::MemoryStore;
pub(crate) use store::BACKEND;

/// What the in-memory backend promises: everything.
pub const CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Notify)
    .ttl(TtlSupport::new(
        LeaseKind::PerLock,
        Duration::from_millis(1),
        Duration::from_nanos(1),
    ))
    .fair(true)
    .fencing(Fencing::Volatile)
    .renewal(true)
    .semaphore(true)
    .election(true);

/// A client of a [`MemoryStore`]. `MemoryLock::new()` makes a store of its own; use
/// [`MemoryStore::client`] for several clients of one store.
///
/// Its guards are the store's own business: the store keeps a watchdog-managed lease alive for
/// as long as its guard lives (so the client's watchdog has nothing to renew), and `lost()` hears
/// from the store the moment the lock is removed. A wrapper around it that does not forward
/// [`DistributedLock::keeper`] gets the guards every networked backend gets instead.
pub struct MemoryLock {
    store: MemoryStore,
    core: ClientCore,
}

impl Default for MemoryLock {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLock {
    /// A client of a fresh store of its own.
    pub fn new() -> Self {
        MemoryStore::new().client()
    }

    /// The store this client locks against.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// Uses `core` (owner id, default TTL) instead of the default one.
    pub fn with_core(mut self, core: ClientCore) -> Self {
        self.core = core;
        self
    }
}

impl MemoryStore {
    /// A new client of this store, with its own owner id and watchdog.
    pub fn client(&self) -> MemoryLock {
        MemoryLock {
            store: self.clone(),
            core: ClientCore::new(BACKEND),
        }
    }
}

#[async_trait]
impl DistributedLock for MemoryLock {
    fn profile(&self) -> Profile {
        Profile::new(CAPABILITIES)
            // The store keeps a queue of waiters per name.
            .waiting(Waiting::Queue)
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        // Nothing here awaits I/O, so spend the task's cooperative budget: a loop of in-memory
        // lock calls must still let the runtime run its other tasks (the watchdog among them).
        // Acquires spend it, releases do not: a loop that releases also acquires. (The
        // conveniences spend it too, before the attempt.)
        tokio::task::coop::consume_budget().await;
        let owner = req.owner.clone();
        match self
            .store
            .grant(req.name.as_str(), owner, req.ttl, req.permits)
        {
            Ok(grant) => Ok(Attempt::Granted(grant)),
            // The store wakes its own waiters ([`Waiting::Queue`]): no expiry to poll by.
            Err(Refused::Held) => Ok(Attempt::Held { expires_in: None }),
            Err(Refused::Permits(held)) => Err(other_permits(req, held)),
        }
    }

    fn keeper(&self) -> &dyn LeaseKeeper {
        &self.store
    }

    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        self.store.queue(req, wait).await
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        Ok(self.store.release(grant))
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        let mut s = self.store.lock();
        let now = Instant::now();
        let holder = s
            .find(&grant.name)
            .and_then(|slot| slot.holder_of(grant))
            .filter(|h| h.live(now));
        match holder {
            Some(h) => {
                // A renewal never shortens the lease: another hold of the same owner, or the
                // guard's own safe-until, may rely on the longer one.
                h.expires_at = h.expires_at.max(now + ttl);
                Ok(h.expires_at - now)
            }
            None => Err(lost(
                &grant.name,
                "the lock is no longer held by this grant",
            )),
        }
    }

    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        tokio::task::coop::consume_budget().await;
        let mut s = self.store.lock();
        let now = Instant::now();
        let Some(slot) = s.find(&grant.name) else {
            return Ok(false);
        };
        match slot.holder_of(grant).filter(|h| h.live(now)) {
            Some(h) => {
                h.value = Some(value.to_owned());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        tokio::task::coop::consume_budget().await;
        let mut s = self.store.lock();
        let now = Instant::now();
        let Some(slot) = s.find(name) else {
            return Ok(None);
        };
        Ok(slot.info(now))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        tokio::task::coop::consume_budget().await;
        let mut s = self.store.lock();
        let now = Instant::now();
        let mut held: Vec<_> = s
            .slots
            .iter_mut()
            .filter(|slot| slot.name.as_str().starts_with(prefix))
            .filter_map(|slot| Some((slot.name.clone(), slot.info(now)?)))
            .collect();
        held.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        Ok(held)
    }

    async fn give_back(&self, surplus: &Surplus) -> Result<bool> {
        // By the owner's own permit, which `inspect` (the oldest holder's) may not show.
        let (name, owner) = (&surplus.name, &surplus.owner);
        let mut s = self.store.lock();
        let Some(slot) = s.find(name) else {
            return Ok(false);
        };
        let held = slot
            .holders
            .iter()
            .find(|h| h.owner == *owner && self.core.has_surplus(surplus, h.count))
            .map(|h| (h.token, h.count));
        Ok(held.is_some_and(|(token, count)| {
            let grant = Grant::new(
                name.clone(),
                owner.clone(),
                token,
                count,
                Duration::ZERO,
                Instant::now(),
            );
            slot.release(&grant)
        }))
    }

    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        tokio::task::coop::consume_budget().await;
        let mut s = self.store.lock();
        let now = Instant::now();
        Ok(s.find(name)
            .is_some_and(|slot| slot.force_release(token, now)))
    }
}
