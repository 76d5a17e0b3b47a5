//! The store: the in-memory backend's "server", with one [`Slot`] per name ever locked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::backend::wait::timeout;
use crate::error::LostReason;
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{drift, safe_until, AcquireRequest, Grant};
use crate::keeper::{Hold, HoldState};
use crate::name::{LockName, OwnerId};

use super::slot::{removed, Refused, Slot, Waiter};

/// The backend's name, as errors, traces and metrics show it.
pub(crate) const BACKEND: &str = "memory";

/// The shared state that [`MemoryLock`](super::MemoryLock) clients lock against: the "server".
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
pub(super) struct State {
    /// One slot per name ever locked. Slots are never removed, because each carries the name's
    /// fencing counter, which must never go back.
    pub(super) slots: Vec<Slot>,
    /// Each slot's index, by name.
    pub(super) index: HashMap<LockName, usize>,
    pub(super) next_waiter: u64,
}

/// Whether an in-process guard still holds its lock, as the store sees it.
pub(super) enum LocalStatus {
    /// Held; safe until then (`None`: kept by the store while the guard lives).
    Held(Option<Instant>),
    Lost(LostReason),
}

impl State {
    /// `name`'s slot, made on first use, and its index.
    pub(super) fn slot(&mut self, name: &LockName) -> (usize, &mut Slot) {
        let next = self.slots.len();
        // The owned key is an `Arc` clone: no allocation.
        let at = *self.index.entry(name.clone()).or_insert(next);
        if at == next {
            self.slots.push(Slot::new(name.clone()));
        }
        (at, &mut self.slots[at])
    }

    /// `name`'s slot, if it has one.
    pub(super) fn find(&mut self, name: &LockName) -> Option<&mut Slot> {
        let at = *self.index.get(name.as_str())?;
        self.slots.get_mut(at)
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide store named `name`, made on first use: what `memory://NAME` connects
    /// to (`memory://` is the one named `""`). Every client of it, made anywhere in the process,
    /// sees the same locks, as clients of one server do.
    pub fn named(name: &str) -> Self {
        static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
        let mut stores = STORES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        stores.entry(name.to_string()).or_default().clone()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation of `State` completes before anything that could panic, so a poisoned
        // lock still guards consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes `name`'s holders behind their backs, as an operator or a failing server would;
    /// the next waiters get the lock (or the permits). For tests of the lost signal.
    pub fn remove(&self, name: &LockName) {
        if let Some(slot) = self.lock().find(name) {
            slot.end_all();
            slot.dispatch(Instant::now());
        }
    }

    /// How many names have a holder or waiters (expired holders included until touched).
    pub fn active_names(&self) -> usize {
        self.lock()
            .slots
            .iter()
            .filter(|s| !s.holders.is_empty() || !s.waiters.is_empty())
            .count()
    }

    /// How many waiters are queued for `name`.
    pub fn waiters_for(&self, name: &LockName) -> usize {
        self.lock().find(name).map_or(0, |s| s.waiters.len())
    }

    /// How many waiters are queued, over all names.
    pub fn waiters(&self) -> usize {
        self.lock().slots.iter().map(|s| s.waiters.len()).sum()
    }
}

impl MemoryStore {
    /// The acquire attempt: granted at once if a permit is free or `owner` holds one (see
    /// [`Slot::try_grant`]). `name` has passed [`check_name`](crate::name::check_name); a name
    /// locked before (the common case) is found by `&str` and its grant shares the slot's name,
    /// so nothing is allocated.
    #[inline(always)]
    pub(super) fn grant(
        &self,
        name: &str,
        owner: OwnerId,
        ttl: Duration,
        permits: u32,
    ) -> std::result::Result<Grant, Refused> {
        let mut s = self.lock();
        let now = Instant::now();
        if let Some(&at) = s.index.get(name) {
            return s.slots[at].try_grant(owner, ttl, permits, now);
        }
        let slot = s.slot(&LockName::checked(name)).1;
        slot.try_grant(owner, ttl, permits, now)
    }

    /// Gives up one hold of `grant`; false if it no longer held the lock.
    pub(super) fn release(&self, grant: &Grant) -> bool {
        self.lock()
            .find(&grant.name)
            .is_some_and(|slot| slot.release(grant))
    }

    /// The store stops keeping `hold`'s lease, if it kept it.
    pub(super) fn unkeep(&self, hold: &Hold) {
        if hold.kept {
            if let Some(slot) = self.lock().find(&hold.grant.name) {
                slot.unkeep(&hold.grant);
            }
        }
    }

    /// Whether `hold` (of an in-process guard) still holds its lock. With `watch`, the store
    /// also tells it when the holder goes.
    pub(super) fn status(&self, hold: &Hold, watch: Option<&Arc<HoldState>>) -> LocalStatus {
        let (grant, kept) = (&hold.grant, hold.kept);
        let mut s = self.lock();
        let now = Instant::now();
        let Some(slot) = s.find(&grant.name) else {
            return LocalStatus::Lost(removed());
        };
        if let Some(h) = slot.holder_of(grant) {
            let until = if h.kept > 0 {
                None
            } else {
                Some(h.expires_at.checked_sub(drift(grant.ttl)).unwrap_or(now))
            };
            if until.is_some_and(|u| now >= u) {
                return LocalStatus::Lost(LostReason::Expired);
            }
            if let Some(w) = watch {
                slot.watchers.retain(|x| x.strong_count() > 0);
                if !slot.watchers.iter().any(|x| x.as_ptr() == Arc::as_ptr(w)) {
                    slot.watchers.push(Arc::downgrade(w));
                }
            }
            return LocalStatus::Held(until);
        }
        LocalStatus::Lost(match slot.ended(grant.token) {
            Some(why) => why.clone(),
            // Ended long ago: judge by the grant's own lease.
            _ if !kept && now >= safe_until(grant.sent_at, grant.ttl) => LostReason::Expired,
            _ => removed(),
        })
    }

    /// Waits up to `wait` for `req`'s lock in the name's queue.
    pub(super) async fn queue(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        tokio::task::coop::consume_budget().await;
        let started = Instant::now();
        let deadline = started + wait;
        let mut queued = {
            let mut s = self.lock();
            s.next_waiter += 1;
            let id = s.next_waiter;
            let (_, slot) = s.slot(&req.name);
            match slot.try_grant(req.owner.clone(), req.ttl, req.permits, started) {
                Ok(g) => return Ok(g),
                Err(Refused::Permits(held)) => return Err(other_permits(req, held)),
                Err(Refused::Held) => {}
            }
            let (tx, rx) = oneshot::channel();
            slot.waiters.push_back(Waiter {
                id,
                owner: req.owner.clone(),
                ttl: req.ttl,
                permits: req.permits,
                tx,
            });
            QueuedWaiter {
                store: self,
                name: &req.name,
                id,
                rx,
                done: false,
            }
        };
        loop {
            // Wake at the deadline or when a holder's lease runs out, whichever is first: an
            // expired holder sends no notice.
            let wake = {
                let mut s = self.lock();
                let expiry = s.find(&req.name).and_then(|slot| slot.next_expiry());
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
                    self.lock().slot(&req.name).1.dispatch(now);
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
        let Some(slot) = s.find(self.name) else {
            return;
        };
        slot.waiters.retain(|w| w.id != self.id);
        // Dispatch sends under the store lock, so under it the grant is either queued or here.
        if let Ok(grant) = self.rx.try_recv() {
            if let Some(at) = slot.holders.iter().position(|h| h.token == grant.token) {
                slot.end_holder(at, None);
            }
        }
        slot.dispatch(Instant::now());
    }
}

/// The refusal of a request whose number of permits is not the one `req`'s name is held with.
pub(super) fn other_permits(req: &AcquireRequest, held: u32) -> Error {
    Error::invalid(format!(
        "{} is held with {held} permit(s), not the {} this request asks for",
        req.name, req.permits
    ))
}
