//! The store as the keeper of its own guards' leases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::LostReason;
use crate::error::Result;
use crate::grant::{safe_until, Grant};
use crate::keeper::Hold;
use crate::lock::{sealed::Sealed, DistributedLock, LeaseKeeper};

use super::store::{LocalStatus, MemoryStore};

/// The store keeps the leases of its own guards: a watchdog-managed lease stays alive while its
/// guard lives (the renewals could not fail: client and "server" share one process), `lost()`
/// hears from the store the moment the holder goes.
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
        let core = backend.core();
        core.holds().remove(&grant.name, &grant.owner);
        core.note_runtime();
        if let Some(ttl) = renew {
            let mut s = self.lock();
            let holder = s.find(&grant.name).and_then(|slot| slot.holder_of(&grant));
            if let Some(h) = holder {
                h.kept += 1;
                h.kept_ttl = h.kept_ttl.max(ttl);
            }
        }
        Hold::new(grant, u64::MAX, renew.is_some())
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

    fn let_go(&self, hold: &Hold) {
        // Marked before the store lets go, so a `lost()` future the store wakes sees a
        // release, not a loss.
        let shared = hold.shared.get();
        if let Some(w) = shared {
            w.mark_released();
        }
        self.unkeep(hold);
        if let Some(w) = shared {
            w.changed.notify_waiters();
        }
    }
}
