//! What a guard holds once its acquire has returned, for its lease keeper
//! ([`LeaseKeeper`](crate::backend::LeaseKeeper)).
//!
//! A [`LockGuard`](crate::LockGuard) holds one kind of thing, a [`Hold`]: its grant and what
//! its keeper needs to find it again. The keeper keeps the lease (renewing a watchdog-managed
//! one), knows until when the guard may trust it, tells the guard's `lost()` futures when it
//! goes, and lets go of it when the guard is released. A networked backend's keeper is its
//! client's watchdog; the in-memory backend's is its store, which is the lock's server too and
//! keeps a watchdog-managed lease without renewals. The guard asks its backend for the keeper
//! ([`DistributedLock::keeper`](crate::DistributedLock::keeper)) and never needs to know
//! which one it has. `Holds` counts, per client handle, the holds its guards and acquires in
//! flight account for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::LostReason;
use crate::grant::Grant;
use crate::name::{LockName, OwnerId};

/// What a guard holds: its grant, and what its keeper needs to find it again.
#[derive(Clone)]
pub struct Hold {
    pub(crate) grant: Grant,
    /// The keeper's index for it: the watchdog's entry, the store's slot (`u64::MAX`: look it
    /// up).
    pub(crate) ticket: u64,
    /// The keeper keeps the lease while the guard lives (watchdog-managed).
    pub(crate) kept: bool,
    /// HoldState with the keeper and the `lost()` futures: the watchdog's from the start, the
    /// store's made by the first `lost()`.
    pub(crate) shared: OnceLock<Arc<HoldState>>,
}

impl Hold {
    #[inline]
    pub(crate) fn new(grant: Grant, ticket: u64, kept: bool) -> Self {
        Self {
            grant,
            ticket,
            kept,
            shared: OnceLock::new(),
        }
    }

    /// A hold whose state is shared with its keeper from the start.
    pub(crate) fn shared_with(
        grant: Grant,
        ticket: u64,
        kept: bool,
        state: Arc<HoldState>,
    ) -> Self {
        Self {
            grant,
            ticket,
            kept,
            shared: OnceLock::from(state),
        }
    }

    /// The grant.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The state shared with the keeper and the `lost()` futures, made on first use.
    pub(crate) fn shared(&self, backend: &'static str) -> &Arc<HoldState> {
        self.shared
            .get_or_init(|| Arc::new(HoldState::new(backend, None)))
    }
}

/// The state a keeper shares with a guard and its `lost()` futures.
pub(crate) struct HoldState {
    /// The backend's name, for the lost event.
    backend: &'static str,
    inner: Mutex<StateInner>,
    pub(crate) changed: Notify,
    /// Set when the guard is given up, before the keeper lets go.
    released: AtomicBool,
}

struct StateInner {
    safe_until: Option<Instant>,
    lost: Option<LostReason>,
}

impl HoldState {
    pub(crate) fn new(backend: &'static str, safe_until: Option<Instant>) -> Self {
        Self {
            backend,
            inner: Mutex::new(StateInner {
                safe_until,
                lost: None,
            }),
            changed: Notify::new(),
            released: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StateInner> {
        // Every update is a single assignment, so a poisoned lock still holds consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn safe_until(&self) -> Option<Instant> {
        self.lock().safe_until
    }

    /// Moves safe-until later (never earlier) and wakes the `lost()` futures to take it.
    pub(crate) fn extend(&self, until: Instant) {
        let mut s = self.lock();
        if s.safe_until.is_some_and(|cur| until > cur) {
            s.safe_until = Some(until);
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// Fires the lost signal of `grant`'s guard; the first reason sticks.
    pub(crate) fn fire(&self, reason: LostReason, grant: &Grant) {
        let mut s = self.lock();
        if s.lost.is_none() {
            crate::observe::lost(self.backend, grant.name.as_str(), grant.token.0, &reason);
            s.lost = Some(reason);
            drop(s);
            self.changed.notify_waiters();
        }
    }

    pub(crate) fn is_fired(&self) -> bool {
        self.lock().lost.is_some()
    }

    /// The lost reason, or `Expired` once safe-until has passed.
    pub(crate) fn reason(&self) -> Option<LostReason> {
        let s = self.lock();
        if let Some(r) = &s.lost {
            return Some(r.clone());
        }
        s.safe_until
            .filter(|&until| Instant::now() >= until)
            .map(|_| LostReason::Expired)
    }

    /// Marks the guard given up: before the keeper lets go, so a `lost()` future woken by the
    /// keeper sees a release, not a loss.
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::Release);
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }
}

/// The holds of each name and owner that one client handle accounts for: its live guards and
/// its acquires in flight (see [`lost_reply`](crate::lost_reply)).
#[derive(Default)]
pub(crate) struct Holds {
    counts: Mutex<HashMap<(LockName, OwnerId), u32>>,
}

impl Holds {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<(LockName, OwnerId), u32>> {
        // Every update is one insert or remove, so a poisoned map is still consistent.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one more hold of `name` by `owner`.
    pub(crate) fn add(&self, name: &LockName, owner: &OwnerId) {
        *self
            .counts()
            .entry((name.clone(), owner.clone()))
            .or_default() += 1;
    }

    /// Counts one hold fewer.
    pub(crate) fn remove(&self, name: &LockName, owner: &OwnerId) {
        let mut counts = self.counts();
        let key = (name.clone(), owner.clone());
        if let Some(n) = counts.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&key);
            }
        }
    }

    /// How many holds of `name` by `owner` this handle accounts for.
    pub(crate) fn of(&self, name: &LockName, owner: &OwnerId) -> u32 {
        let counts = self.counts();
        if counts.is_empty() {
            return 0;
        }
        counts
            .get(&(name.clone(), owner.clone()))
            .copied()
            .unwrap_or(0)
    }
}
