//! Hand-over offers: on a backend that [hands locks over](crate::Profile::hands_over), a
//! waiter between attempts offers to take the lock straight from a releasing guard of its
//! handle ([`LocalWaiter::offer`]): the release and its grant are then one request, and the
//! grant reaches the waiter through the offer. The handle passes a lock on at most
//! [`HANDED_IN_A_ROW`] times in a row; the release after that frees it, and wakes the handle's
//! own waiters no sooner than the server's notices (or their polling) wake other clients', so
//! that waiters of other handles get their chance.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;

use crate::grant::{AcquireRequest, Grant};
use crate::name::LockName;

use super::{LocalWaiter, LocalWakes};

/// How many times in a row a handle passes a lock to its own waiters before a release frees it
/// on the server instead (where any client may take it).
pub const HANDED_IN_A_ROW: u32 = 16;

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

impl LocalWakes {
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
}

impl LocalWaiter<'_> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn request(name: &LockName, owner: &str) -> AcquireRequest {
        AcquireRequest {
            name: name.clone(),
            owner: crate::name::OwnerId::new(owner).unwrap(),
            ttl: Duration::from_secs(1),
            permits: 1,
            fresh: true,
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
}
