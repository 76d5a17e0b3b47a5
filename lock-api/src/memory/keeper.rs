//! The store as the keeper of its own guards' leases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::error::LostReason;
use crate::error::Result;
use crate::grant::{safe_until, AcquireRequest, Grant};
use crate::keeper::Hold;
use crate::lock::{sealed::Sealed, DistributedLock, LeaseKeeper, OnTheSpot};
use crate::name::OwnerId;

use super::store::{LocalStatus, MemoryStore, BACKEND};

/// The store keeps the leases of its own guards: a watchdog-managed lease stays alive while its
/// guard lives (the renewals could not fail: client and "server" share one process), `lost()`
/// hears from the store the moment the holder goes, and grants and releases happen on the
/// spot, with or without a runtime.
impl Sealed for MemoryStore {}

impl LeaseKeeper for MemoryStore {
    fn keep(
        &self,
        backend: &Arc<dyn DistributedLock>,
        grant: Grant,
        renew: Option<Duration>,
        _leased: bool,
    ) -> Hold {
        // The store's guards need no count of holds: their releases cannot go unanswered.
        backend.core().holds().remove(&grant.name, &grant.owner);
        if let Some(ttl) = renew {
            let mut s = self.lock();
            let holder = s
                .find(&grant.name, None)
                .and_then(|slot| slot.holder_of(&grant));
            if let Some(h) = holder {
                h.kept += 1;
                h.kept_ttl = h.kept_ttl.max(ttl);
            }
        }
        Hold::new(grant, u64::MAX, renew.is_some())
    }

    fn grant_now(&self, name: &str, owner: OwnerId, ttl: Duration, kept: bool) -> OnTheSpot {
        match self.grant(name, owner, ttl, kept) {
            Ok((grant, at)) => OnTheSpot::Granted(Hold::new(grant, at as u64, kept)),
            Err(owner) => OnTheSpot::Held(owner),
        }
    }

    fn queue_now<'a>(
        &'a self,
        req: AcquireRequest,
        wait: Duration,
        kept: bool,
    ) -> Option<BoxFuture<'a, Result<Hold>>> {
        Some(Box::pin(async move {
            let grant = self.queue(&req, wait, kept).await?;
            Ok(Hold::new(grant, u64::MAX, kept))
        }))
    }

    fn safe_until(&self, hold: &Hold) -> Option<Instant> {
        let grant = &hold.grant;
        Some(match self.status(hold, None) {
            LocalStatus::Held(Some(until)) => until,
            // Kept: renewed continuously, a full lease from now.
            LocalStatus::Held(None) => safe_until(Instant::now(), grant.ttl),
            LocalStatus::Lost(_) => safe_until(grant.sent_at, grant.ttl),
        })
    }

    fn lost_reason(&self, hold: &Hold) -> Option<LostReason> {
        match self.status(hold, None) {
            LocalStatus::Lost(why) => Some(why),
            LocalStatus::Held(_) => None,
        }
    }

    fn watch(&self, hold: &Hold) -> std::result::Result<Option<Instant>, LostReason> {
        match self.status(hold, hold.shared.get()) {
            LocalStatus::Held(until) => Ok(until),
            LocalStatus::Lost(why) => Err(why),
        }
    }

    fn extended(&self, _: &Hold, _: Instant, _: &Result<Duration>) {
        // The store has the lease, and tells the guard.
    }

    fn release_now(&self, hold: &Hold, dropped: bool) -> Option<bool> {
        // Marked before the store lets go, so a `lost()` future the store wakes sees a
        // release, not a loss.
        let shared = hold.shared.get();
        if let Some(w) = shared {
            w.mark_released();
        }
        let at = usize::try_from(hold.ticket).unwrap_or(usize::MAX);
        let released = self.release_at(&hold.grant, hold.kept.get(), at);
        if let Some(w) = shared {
            w.changed.notify_waiters();
        }
        let outcome = match (dropped, released) {
            (true, _) => "dropped",
            (false, true) => "released",
            (false, false) => "not_held",
        };
        crate::observe::released_metrics(BACKEND, outcome);
        Some(released)
    }

    fn let_go(&self, hold: &Hold) {
        if let Some(w) = hold.shared.get() {
            w.mark_released();
            w.changed.notify_waiters();
        }
    }
}
