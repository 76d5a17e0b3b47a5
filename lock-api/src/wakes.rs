//! Same-handle wake-ups for backends that poll: a release through a client handle wakes that
//! handle's own waiters for the name at once, instead of at their next backoff step. Waiters of
//! other handles (other processes) still find the lock free by polling.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::name::LockName;

/// The polling waiters of one client handle, by lock name: a counter of releases per name that
/// has waiters, which they watch.
#[derive(Default)]
pub(crate) struct LocalWakes {
    names: Mutex<HashMap<LockName, watch::Sender<u64>>>,
}

impl LocalWakes {
    fn names(&self) -> MutexGuard<'_, HashMap<LockName, watch::Sender<u64>>> {
        // Every update is one insert, remove or counter bump: a poisoned map is consistent.
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter for `name` until the returned value drops.
    pub(crate) fn waiter(&self, name: &LockName) -> LocalWaiter<'_> {
        let rx = self
            .names()
            .entry(name.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        LocalWaiter {
            wakes: self,
            name: name.clone(),
            rx,
        }
    }

    /// A release of `name` went through this handle: wakes its waiters for the name, if any.
    pub(crate) fn released(&self, name: &LockName) {
        if let Some(tx) = self.names().get(name) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.names().len()
    }
}

/// One polling waiter's registration.
pub(crate) struct LocalWaiter<'a> {
    wakes: &'a LocalWakes,
    name: LockName,
    rx: watch::Receiver<u64>,
}

impl LocalWaiter<'_> {
    /// How many releases of the name this handle has made while waiters watched: read before an
    /// attempt, and passed to [`wait`](Self::wait) after it, so a release that lands while the
    /// attempt is in flight still wakes the wait that follows.
    pub(crate) fn releases(&self) -> u64 {
        *self.rx.borrow()
    }

    /// Returns after `max`, or at once when the handle has released the name since `seen`.
    pub(crate) async fn wait(&self, seen: u64, max: Duration) {
        let mut rx = self.rx.clone();
        tokio::select! {
            _ = tokio::time::sleep(max) => {}
            _ = rx.wait_for(|n| *n != seen) => {}
        }
    }
}

impl Drop for LocalWaiter<'_> {
    fn drop(&mut self) {
        let mut names = self.wakes.names();
        // Only this waiter's receiver is left: the name has no waiters any more.
        if names
            .get(&self.name)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            names.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    // Paused time: the clock moves only when every task waits, so the durations below are
    // exact, not measured against a busy machine.
    #[tokio::test(start_paused = true)]
    async fn a_release_wakes_a_waiter_also_when_it_landed_during_the_attempt() {
        let wakes = LocalWakes::default();
        let name = LockName::new("n").unwrap();
        let waiter = wakes.waiter(&name);
        let seen = waiter.releases();
        // The release lands between the attempt and the wait.
        wakes.released(&name);
        let started = Instant::now();
        waiter.wait(seen, Duration::from_secs(60)).await;
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "woken at once, not at the bound"
        );
        // With nothing new released, the wait runs to its bound.
        let seen = waiter.releases();
        let started = Instant::now();
        waiter.wait(seen, Duration::from_secs(60)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        // A release while it waits wakes it then.
        let seen = waiter.releases();
        let started = Instant::now();
        let release = async {
            tokio::time::sleep(Duration::from_secs(7)).await;
            wakes.released(&name);
        };
        tokio::join!(waiter.wait(seen, Duration::from_secs(60)), release);
        assert_eq!(started.elapsed(), Duration::from_secs(7));
    }

    #[tokio::test]
    async fn names_without_waiters_are_forgotten_and_releases_of_them_cost_nothing() {
        let wakes = LocalWakes::default();
        let (a, b) = (LockName::new("a").unwrap(), LockName::new("b").unwrap());
        wakes.released(&a);
        assert_eq!(wakes.len(), 0);
        let first = wakes.waiter(&a);
        let second = wakes.waiter(&a);
        let other = wakes.waiter(&b);
        assert_eq!(wakes.len(), 2);
        drop(first);
        assert_eq!(wakes.len(), 2, "a waiter for a is left");
        drop(second);
        assert_eq!(wakes.len(), 1);
        drop(other);
        assert_eq!(wakes.len(), 0);
    }
}
