//! Same-handle waiting: the waiters of one client handle for one name, registered here while
//! they wait, and woken at once by a release through the handle instead of at their next
//! backoff step or the server's notice. Two mechanisms build on the registry, one file each:
//! on a backend that polls, one waiter of a handle polls the server for a name at a time and
//! the others queue in the handle in the order they came ([`turns`]); on a backend that
//! [hands locks over](crate::Profile::hands_over), a waiter between attempts offers to take
//! the lock straight from a releasing guard of its handle ([`offers`]). Waiters of other
//! handles (other processes) still find the lock free by the server's notices or by polling.

mod offers;
mod turns;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

use crate::name::LockName;

pub use offers::HANDED_IN_A_ROW;
pub(crate) use offers::{Handed, Offer};

/// The waiters of one name in one handle: a counter of releases, which they watch, and the turn
/// to poll, which they take one at a time in FIFO order (Tokio's semaphore queues fairly).
struct NameWaiters {
    releases: watch::Sender<u64>,
    turn: Arc<Semaphore>,
    handed: Arc<AtomicU64>,
    /// Waiters between attempts that take the lock straight from a release, in the order the
    /// waiters arrived (a waiter that offers again after an attempt keeps its place).
    offers: VecDeque<Offer>,
    /// Hand-overs since the last release that freed the lock.
    in_a_row: u32,
    /// The release under way frees the lock after [`HANDED_IN_A_ROW`] hand-overs: it does not
    /// wake these waiters at once, so that they find out as other clients' waiters do.
    let_go: bool,
}

/// The polling waiters of one client handle, by lock name.
#[derive(Default)]
pub(crate) struct LocalWakes {
    names: Mutex<HashMap<LockName, NameWaiters>>,
}

impl LocalWakes {
    fn names(&self) -> MutexGuard<'_, HashMap<LockName, NameWaiters>> {
        // Every update is one insert, remove or counter bump: a poisoned map is consistent.
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter for `name` until the returned value drops.
    pub(crate) fn waiter(&self, name: &LockName) -> LocalWaiter<'_> {
        let mut names = self.names();
        let entry = names.entry(name.clone()).or_insert_with(|| NameWaiters {
            releases: watch::channel(0).0,
            turn: Arc::new(Semaphore::new(1)),
            handed: Arc::default(),
            offers: VecDeque::new(),
            in_a_row: 0,
            let_go: false,
        });
        static ARRIVALS: AtomicU64 = AtomicU64::new(0);
        LocalWaiter {
            wakes: self,
            seq: ARRIVALS.fetch_add(1, Ordering::Relaxed),
            name: name.clone(),
            rx: entry.releases.subscribe(),
            turn: entry.turn.clone(),
            handed: entry.handed.clone(),
        }
    }

    /// A release of `name` went through this handle: wakes its waiters for the name, if any.
    pub(crate) fn released(&self, name: &LockName) {
        if let Some(w) = self.names().get_mut(name) {
            w.in_a_row = 0;
            if !std::mem::take(&mut w.let_go) {
                w.releases.send_modify(|n| *n = n.wrapping_add(1));
            }
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
    /// When it arrived, among all waiters: its offers take their place in line by it.
    seq: u64,
    name: LockName,
    rx: watch::Receiver<u64>,
    turn: Arc<Semaphore>,
    /// Set by a turn holder that won the lock: 1 + the releases counted then (0: not set).
    handed: Arc<AtomicU64>,
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
            .is_some_and(|w| w.releases.receiver_count() <= 1)
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
