//! The in-memory backend: the reference model of the contract, with every capability on.
//!
//! A [`MemoryStore`] plays the server; each [`MemoryLock`] is one client of it with its own
//! owner id and watchdog. Waiters queue per name and the releasing holder hands the lock to the
//! first live waiter, so waiting is notice-driven and FIFO.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::oneshot;

use crate::capability::{Blocking, Capabilities, Fencing, LeaseKind, TtlSupport};
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{lost, AcquireRequest, FencingToken, Grant, LockInfo};
use crate::lock::{ClientCore, DistributedLock};
use crate::name::{LockName, OwnerId};
use crate::wait::timeout;

/// What the in-memory backend promises: everything.
pub const CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    blocking: Blocking::Notify,
    ttl: TtlSupport {
        kind: LeaseKind::PerLock,
        min: Duration::from_millis(1),
        granularity: Duration::from_nanos(1),
    },
    fair: true,
    fencing: Fencing::Volatile,
    renewal: true,
};

/// The shared state that [`MemoryLock`] clients lock against: the "server".
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// One slot per name ever locked. Slots are never removed, because each carries the name's
    /// fencing counter, which must never go back.
    slots: HashMap<LockName, Slot>,
    next_waiter: u64,
}

#[derive(Default)]
struct Slot {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
    /// The last fencing token issued for this name.
    token: u64,
}

struct Holder {
    owner: OwnerId,
    count: u32,
    token: FencingToken,
    expires_at: Instant,
}

struct Waiter {
    id: u64,
    owner: OwnerId,
    ttl: Duration,
    tx: oneshot::Sender<Grant>,
}

fn grant(
    name: &LockName,
    owner: &OwnerId,
    token: FencingToken,
    count: u32,
    ttl: Duration,
    now: Instant,
) -> Grant {
    Grant {
        name: name.clone(),
        owner: owner.clone(),
        token,
        hold_count: count,
        ttl,
        sent_at: now,
        key: String::new(),
    }
}

impl Slot {
    fn fresh_token(&mut self) -> FencingToken {
        self.token += 1;
        FencingToken(self.token)
    }

    /// The holder, unless its lease has run out.
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires_at > now)
    }

    /// Drops an expired holder and, while the lock is free, hands it to the first waiter that
    /// is still listening. Called on every state change that can free a lock.
    fn dispatch(&mut self, name: &LockName, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            self.holder = None;
        }
        while self.holder.is_none() {
            let Some(w) = self.waiters.pop_front() else {
                break;
            };
            let token = self.fresh_token();
            if w.tx
                .send(grant(name, &w.owner, token, 1, w.ttl, now))
                .is_ok()
            {
                self.holder = Some(Holder {
                    owner: w.owner,
                    count: 1,
                    token,
                    expires_at: now + w.ttl,
                });
            }
        }
    }

    /// Grants at once if free or held by `req.owner`; `None` if held by someone else (or if
    /// others already queue for it: FIFO).
    fn try_grant(&mut self, req: &AcquireRequest, now: Instant) -> Option<Grant> {
        self.dispatch(&req.name, now);
        if let Some(h) = self.holder.as_mut() {
            if h.owner != req.owner {
                return None;
            }
            h.count += 1;
            h.expires_at = h.expires_at.max(now + req.ttl);
            return Some(grant(&req.name, &req.owner, h.token, h.count, req.ttl, now));
        }
        let token = self.fresh_token();
        self.holder = Some(Holder {
            owner: req.owner.clone(),
            count: 1,
            token,
            expires_at: now + req.ttl,
        });
        Some(grant(&req.name, &req.owner, token, 1, req.ttl, now))
    }

    fn holds(&self, grant: &Grant, now: Instant) -> bool {
        self.live_holder(now)
            .is_some_and(|h| h.token == grant.token && h.owner == grant.owner)
    }
}

impl State {
    /// `name`'s slot, made on first use.
    fn slot(&mut self, name: &LockName) -> &mut Slot {
        // The owned key is an `Arc` clone: one hash, no allocation.
        self.slots.entry(name.clone()).or_default()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new client of this store, with its own owner id and watchdog.
    pub fn client(&self) -> MemoryLock {
        MemoryLock {
            store: self.clone(),
            core: ClientCore::new("memory"),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation of `State` completes before anything that could panic, so a poisoned
        // lock still guards consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes `name`'s holder behind its back, as an operator or a failing server would; the
    /// next waiter gets the lock. For tests of the lost signal.
    pub fn remove(&self, name: &LockName) {
        if let Some(slot) = self.lock().slots.get_mut(name.as_str()) {
            slot.holder = None;
            slot.dispatch(name, Instant::now());
        }
    }

    /// How many names have a holder or waiters (expired holders included until touched).
    pub fn active_names(&self) -> usize {
        self.lock()
            .slots
            .values()
            .filter(|s| s.holder.is_some() || !s.waiters.is_empty())
            .count()
    }

    /// How many waiters are queued for `name`.
    pub fn waiters_for(&self, name: &LockName) -> usize {
        self.lock()
            .slots
            .get(name.as_str())
            .map_or(0, |s| s.waiters.len())
    }

    /// How many waiters are queued, over all names.
    pub fn waiters(&self) -> usize {
        self.lock().slots.values().map(|s| s.waiters.len()).sum()
    }
}

/// A client of a [`MemoryStore`]. `MemoryLock::new()` makes a store of its own; use
/// [`MemoryStore::client`] for several clients of one store.
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

impl MemoryLock {
    /// The acquire attempt: granted at once if free or held by `req.owner`.
    fn grant_now(&self, req: &AcquireRequest) -> Option<Grant> {
        let mut s = self.store.lock();
        let now = Instant::now();
        // A name locked before (the common case) is found by `&str`, without the reference-count
        // traffic of `slot`'s owned key.
        if let Some(slot) = s.slots.get_mut(req.name.as_str()) {
            return slot.try_grant(req, now);
        }
        s.slot(&req.name).try_grant(req, now)
    }

    /// Gives up one hold of `grant`; false if it no longer held the lock.
    fn release_now(&self, grant: &Grant) -> bool {
        let mut s = self.store.lock();
        let now = Instant::now();
        let Some(slot) = s.slots.get_mut(grant.name.as_str()) else {
            return false;
        };
        if !slot.holds(grant, now) {
            return false;
        }
        let h = slot.holder.as_mut().expect("held implies a holder");
        h.count -= 1;
        if h.count == 0 {
            slot.holder = None;
            if !slot.waiters.is_empty() {
                slot.dispatch(&grant.name, now);
            }
        }
        true
    }
}

/// Removes a queued waiter if its acquire is dropped, and releases a grant that was handed to
/// it after it stopped listening.
struct QueuedWaiter<'a> {
    store: &'a MemoryStore,
    name: &'a LockName,
    id: u64,
    rx: oneshot::Receiver<Grant>,
    done: bool,
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = self.store.lock();
        let Some(slot) = s.slots.get_mut(self.name.as_str()) else {
            return;
        };
        slot.waiters.retain(|w| w.id != self.id);
        // Dispatch sends under the store lock, so under it the grant is either queued or here.
        if let Ok(grant) = self.rx.try_recv() {
            if slot.holder.as_ref().is_some_and(|h| h.token == grant.token) {
                slot.holder = None;
            }
        }
        slot.dispatch(self.name, Instant::now());
    }
}

#[async_trait]
impl DistributedLock for MemoryLock {
    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        // Nothing here awaits I/O, so spend the task's cooperative budget: a loop of in-memory
        // lock calls must still let the runtime run its other tasks (the watchdog among them).
        // Acquires spend it, releases do not: a loop that releases also acquires. (The
        // conveniences spend it before calling `try_acquire_local`.)
        tokio::task::coop::consume_budget().await;
        Ok(self.grant_now(req))
    }

    fn try_acquire_local(&self, req: &AcquireRequest) -> Option<Result<Option<Grant>>> {
        Some(Ok(self.grant_now(req)))
    }

    fn release_local(&self, grant: &Grant) -> Option<Result<bool>> {
        Some(Ok(self.release_now(grant)))
    }

    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        tokio::task::coop::consume_budget().await;
        let started = Instant::now();
        let deadline = started + wait;
        let mut queued = {
            let mut s = self.store.lock();
            s.next_waiter += 1;
            let id = s.next_waiter;
            let slot = s.slot(&req.name);
            if let Some(g) = slot.try_grant(req, started) {
                return Ok(g);
            }
            let (tx, rx) = oneshot::channel();
            slot.waiters.push_back(Waiter {
                id,
                owner: req.owner.clone(),
                ttl: req.ttl,
                tx,
            });
            QueuedWaiter {
                store: &self.store,
                name: &req.name,
                id,
                rx,
                done: false,
            }
        };
        loop {
            // Wake at the deadline or when the holder's lease runs out, whichever is first: an
            // expired holder sends no notice.
            let wake = {
                let s = self.store.lock();
                let expiry = s
                    .slots
                    .get(req.name.as_str())
                    .and_then(|slot| slot.holder.as_ref())
                    .map(|h| h.expires_at);
                expiry.map_or(deadline, |e| e.min(deadline))
            };
            tokio::select! {
                granted = &mut queued.rx => {
                    // The sender is only dropped with the waiter entry, which only this
                    // future removes; an error here means the store broke that invariant.
                    queued.done = granted.is_ok();
                    return granted.map_err(|_| {
                        Error::new(ErrorKind::Backend, "memory store dropped a queued waiter")
                    });
                }
                _ = tokio::time::sleep_until(wake.into()) => {
                    let now = Instant::now();
                    self.store.lock().slot(&req.name).dispatch(&req.name, now);
                    if now >= deadline {
                        if let Ok(grant) = queued.rx.try_recv() {
                            queued.done = true;
                            return Ok(grant);
                        }
                        return Err(timeout(wait));
                    }
                }
            }
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        Ok(self.release_now(grant))
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        let mut s = self.store.lock();
        let now = Instant::now();
        match s.slots.get_mut(grant.name.as_str()) {
            Some(slot) if slot.holds(grant, now) => {
                let h = slot.holder.as_mut().expect("held implies a holder");
                h.expires_at = now + ttl;
                Ok(ttl)
            }
            _ => Err(lost(
                &grant.name,
                "the lock is no longer held by this grant",
            )),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        tokio::task::coop::consume_budget().await;
        let mut s = self.store.lock();
        let now = Instant::now();
        let Some(slot) = s.slots.get_mut(name.as_str()) else {
            return Ok(None);
        };
        slot.dispatch(name, now);
        Ok(slot.live_holder(now).map(|h| LockInfo {
            owner: h.owner.clone(),
            hold_count: h.count,
            token: h.token,
            remaining: Some(h.expires_at - now),
        }))
    }
}
