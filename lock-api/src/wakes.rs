//! Same-handle waiting for backends that poll: one waiter of a client handle polls the server
//! for a name at a time, the others queue in the handle in the order they came (FIFO), and a
//! release through the handle wakes the polling one at once instead of at its next backoff
//! step. Waiters of other handles (other processes) still find the lock free by polling.
//!
//! On a backend that [hands locks over](crate::Profile::hands_over), a waiter between
//! attempts also offers to take the lock straight from a releasing guard of its handle
//! ([`LocalWaiter::offer`]): the release and its grant are then one request, and the grant
//! reaches the waiter through the offer. The handle passes a lock on at most
//! [`HANDED_IN_A_ROW`] times in a row; the release after that frees it, and wakes the handle's
//! own waiters no sooner than the server's notices (or their polling) wake other clients', so
//! that waiters of other handles get their chance.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};

use crate::grant::{AcquireRequest, Grant};
use crate::name::LockName;

/// How many times in a row a handle passes a lock to its own waiters before a release frees it
/// on the server instead (where any client may take it).
pub const HANDED_IN_A_ROW: u32 = 16;

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

/// A waiter's offer to take the lock from a release of its handle.
pub(crate) struct Offer {
    id: u64,
    /// The waiter's place in line ([`LocalWaiter::seq`]).
    seq: u64,
    /// The waiter's acquire: its owner and lease.
    pub(crate) req: AcquireRequest,
    /// Where the grant goes. A send to a waiter that left gives the grant back (it drops).
    pub(crate) to: oneshot::Sender<Handed>,
}

/// A grant a release handed over to a waiter of its handle
/// ([`DistributedLock::hand_over`](crate::DistributedLock::hand_over)), on its way to that
/// waiter. What becomes of it is the releasing side's to say (`settle`): taken by the waiter
/// ([`Handed::into_grant`]), or given back when it is dropped instead.
pub(crate) struct Handed {
    grant: Option<Grant>,
    settle: Option<Settle>,
}

/// Told what became of a handed grant: taken (`true`) or dropped (`false`).
type Settle = Box<dyn FnOnce(&Grant, bool) + Send>;

impl Handed {
    pub(crate) fn new(grant: Grant, settle: Settle) -> Self {
        Self {
            grant: Some(grant),
            settle: Some(settle),
        }
    }

    /// The grant, for the waiter's guard.
    pub(crate) fn into_grant(mut self) -> Grant {
        let grant = self
            .grant
            .take()
            .expect("a Handed holds its grant until taken");
        if let Some(settle) = self.settle.take() {
            settle(&grant, true);
        }
        grant
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let (Some(grant), Some(settle)) = (self.grant.take(), self.settle.take()) {
            settle(&grant, false);
        }
    }
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

    /// The oldest offer of a waiter for `name` that is still waiting, for a release to hand
    /// the lock to; `None` if there is none, or if the handle has passed the lock on
    /// [`HANDED_IN_A_ROW`] times in a row (this release frees it).
    pub(crate) fn claim(&self, name: &LockName) -> Option<Offer> {
        let mut names = self.names();
        let w = names.get_mut(name)?;
        if w.in_a_row >= HANDED_IN_A_ROW {
            w.in_a_row = 0;
            w.let_go = true;
            return None;
        }
        while let Some(offer) = w.offers.pop_front() {
            if !offer.to.is_closed() {
                w.in_a_row += 1;
                return Some(offer);
            }
        }
        None
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

    /// How many releases of the name this handle has made while waiters watched: read before an
    /// attempt, and passed to [`wait`](Self::wait) after it, so a release that lands while the
    /// attempt is in flight still wakes the wait that follows.
    pub(crate) fn releases(&self) -> u64 {
        *self.rx.borrow()
    }

    /// Offers to take the lock from a release through this handle until the returned value is
    /// [withdrawn](Offered::withdraw) or dropped.
    pub(crate) fn offer(&self, req: &AcquireRequest) -> Offered<'_> {
        static IDS: AtomicU64 = AtomicU64::new(0);
        let id = IDS.fetch_add(1, Ordering::Relaxed);
        let (to, from) = oneshot::channel();
        let offer = Offer {
            id,
            seq: self.seq,
            req: req.clone(),
            to,
        };
        if let Some(w) = self.wakes.names().get_mut(&self.name) {
            let at = w
                .offers
                .iter()
                .position(|o| o.seq > self.seq)
                .unwrap_or(w.offers.len());
            w.offers.insert(at, offer);
        }
        Offered {
            wakes: self.wakes,
            name: &self.name,
            id,
            from,
        }
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

/// A waiter's standing offer ([`LocalWaiter::offer`]).
pub(crate) struct Offered<'a> {
    wakes: &'a LocalWakes,
    name: &'a LockName,
    id: u64,
    from: oneshot::Receiver<Handed>,
}

impl Offered<'_> {
    /// Returns when a release took the offer up and is done with it: with the lock, or with
    /// `None` when the release passed nothing on (it freed the lock, or failed).
    pub(crate) async fn handed(&mut self) -> Option<Handed> {
        (&mut self.from).await.ok()
    }

    /// Takes the offer back. A release that took it up already is waited for (one request):
    /// the lock it hands over is returned, and must become a guard or be dropped (which gives
    /// it back).
    pub(crate) async fn withdraw(mut self) -> Option<Handed> {
        if self.take_back() {
            return None;
        }
        self.handed().await
    }

    /// Removes the offer from the queue; `false` if a release took it already.
    fn take_back(&self) -> bool {
        let mut names = self.wakes.names();
        let Some(w) = names.get_mut(self.name) else {
            return false;
        };
        match w.offers.iter().position(|o| o.id == self.id) {
            Some(at) => {
                w.offers.remove(at);
                true
            }
            None => false,
        }
    }
}

impl Drop for Offered<'_> {
    fn drop(&mut self) {
        // A release that took the offer up finds the receiver gone, and gives its grant back.
        self.take_back();
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

    fn request(name: &LockName, owner: &str) -> AcquireRequest {
        AcquireRequest {
            name: name.clone(),
            owner: crate::name::OwnerId::new(owner).unwrap(),
            ttl: Duration::from_secs(1),
            permits: 1,
        }
    }

    #[tokio::test]
    async fn releases_take_offers_oldest_first_and_only_so_many_in_a_row() {
        let wakes = LocalWakes::default();
        let name = LockName::new("n").unwrap();
        let (first, second) = (wakes.waiter(&name), wakes.waiter(&name));
        let a = first.offer(&request(&name, "a"));
        let b = second.offer(&request(&name, "b"));
        let claimed = wakes.claim(&name).expect("a waiter offered");
        assert_eq!(
            claimed.req.owner,
            request(&name, "a").owner,
            "the oldest offer first"
        );
        // A taken offer is waited for when withdrawn: here the release gives up on it.
        drop(claimed);
        assert!(a.withdraw().await.is_none());
        // A withdrawn offer is not taken.
        assert!(b.withdraw().await.is_none());
        assert!(wakes.claim(&name).is_none());
        // One standing offer, taken again and again: the handle passes the lock on
        // HANDED_IN_A_ROW times, then one release frees it, without waking its own waiters.
        // (A release that frees the lock starts the count afresh.)
        wakes.released(&name);
        let seen = first.releases();
        for round in 0..HANDED_IN_A_ROW {
            let offer = first.offer(&request(&name, "a"));
            assert!(wakes.claim(&name).is_some(), "hand-over {round}");
            drop(offer);
        }
        let offer = first.offer(&request(&name, "a"));
        assert!(wakes.claim(&name).is_none(), "one too many in a row");
        wakes.released(&name);
        assert_eq!(first.releases(), seen, "the waiters were woken at once");
        assert!(wakes.claim(&name).is_some(), "a fresh run of hand-overs");
        drop(offer);
        // A release that frees the lock otherwise wakes them as before.
        wakes.released(&name);
        assert_eq!(first.releases(), seen + 1);
    }

    /// A waiter that offers again (after an attempt, or a release that passed nothing on)
    /// keeps its place in line: the waiter that arrived first is handed the lock first.
    #[tokio::test]
    async fn an_offer_made_again_keeps_its_waiters_place_in_line() {
        let wakes = LocalWakes::default();
        let name = LockName::new("n").unwrap();
        let (first, second, third) = (
            wakes.waiter(&name),
            wakes.waiter(&name),
            wakes.waiter(&name),
        );
        let b = second.offer(&request(&name, "b"));
        let c = third.offer(&request(&name, "c"));
        let a = first.offer(&request(&name, "a"));
        for owner in ["a", "b", "c"] {
            let claimed = wakes.claim(&name).expect("a waiter offered");
            assert_eq!(claimed.req.owner, request(&name, owner).owner);
        }
        drop((a, b, c));
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
