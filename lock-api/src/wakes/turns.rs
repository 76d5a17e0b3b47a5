//! Turns: on a backend that polls, one waiter of a handle polls the server for a name at a
//! time and the others queue in the handle, FIFO, sending nothing; a waiter that wins the lock
//! tells the next that the lock is held through the handle, so it waits for that release
//! before it asks the server.

use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::OwnedSemaphorePermit;

use super::LocalWaiter;

impl LocalWaiter<'_> {
    /// This waiter, holding the turn, won the lock: the next one to take the turn knows the
    /// lock is held through this handle, and waits for its release before asking the server.
    pub(crate) fn won(&self) {
        self.handed
            .store(self.releases().wrapping_add(1), Ordering::Release);
    }

    /// Whether the turn just taken was passed on by a waiter that won the lock, and the
    /// releases counted then (for [`wait`](Self::wait)).
    pub(crate) fn passed_by_a_winner(&self) -> Option<u64> {
        match self.handed.swap(0, Ordering::AcqRel) {
            0 => None,
            n => Some(n.wrapping_sub(1)),
        }
    }

    /// Waits for this waiter's turn to poll the server for the name, which it has until the
    /// returned permit drops: the handle's waiters for a name take it one at a time, in the
    /// order they asked. `None` if `deadline` came first.
    pub(crate) async fn turn(&self, deadline: Instant) -> Option<OwnedSemaphorePermit> {
        let turn = self.turn.clone().acquire_owned();
        // The semaphore is never closed: an error cannot happen, and would read as no turn.
        tokio::time::timeout_at(deadline.into(), turn)
            .await
            .ok()
            .and_then(Result::ok)
    }
}
