//! What the core does when a server's answer is lost, written once for every backend with
//! per-lock leases: an acquire whose outcome is unknown is given back, and a release the server
//! did not answer is sent again, in the background, until the server answers or the lease asked
//! for has run out (after that, whatever the server applied late has expired by itself).
//!
//! A give-back must take away only the hold the lost request may have added, never one a live
//! guard relies on. An acquisition's own owner id names exactly one acquisition, but a re-entry
//! (through [`LockGuard::reenter`](crate::LockGuard::reenter), or an explicit owner acquiring
//! twice) adds a hold to a hold that guards of this handle already have. So the core counts, per
//! name and owner, the holds this handle accounts for ([`Holds`]): its live guards and its
//! acquires in flight. A give-back releases one hold only while the server reports more holds
//! than that: the surplus is what lost requests left behind.
//!
//! The count is read *after* the server's: an acquire is counted before its request is sent,
//! and a release is uncounted only after the server answered it, so a hold the server reports
//! is always counted by the time the count is read, and the give-back errs on the side of
//! waiting. (One window is left: a re-entry of the same name and explicit owner on this handle
//! that the server applies between a give-back's look and its release makes the release take
//! that re-entry's hold instead of the lost one; the count of holds is then one short, and the
//! lock frees at the second-to-last release of that owner's guards.)

use std::sync::Arc;
use std::time::Duration;

use crate::backend::wait::HandOver;
use crate::capability::LeaseKind;
use crate::error::{ErrorKind, Result};
use crate::grant::{drift, AcquireRequest, Grant};
use crate::lock::DistributedLock;
use crate::name::{LockName, OwnerId};
use crate::observe::{self, Settling};
use crate::wakes::Offer;

/// One acquire in flight, counted until it becomes a guard ([`InFlight::landed`]) or fails.
pub(crate) struct InFlight<'a> {
    backend: &'a dyn DistributedLock,
    req: &'a AcquireRequest,
    counted: bool,
}

impl<'a> InFlight<'a> {
    /// Counts `req`'s acquire, before its request is sent.
    pub(crate) fn new(backend: &'a dyn DistributedLock, req: &'a AcquireRequest) -> Self {
        backend.core().holds().add(&req.name, &req.owner);
        Self {
            backend,
            req,
            counted: true,
        }
    }

    /// The acquire was granted: its guard keeps the count from here on.
    pub(crate) fn landed(mut self) {
        self.counted = false;
    }

    /// The acquire failed or found the lock held: it holds nothing this handle knows of.
    pub(crate) fn failed(mut self) {
        self.uncount();
    }

    fn uncount(&mut self) {
        if std::mem::take(&mut self.counted) {
            let holds = self.backend.core().holds();
            holds.remove(&self.req.name, &self.req.owner);
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.uncount();
    }
}

/// Whether the server's answer to a request was lost, so that it may have been applied, on a
/// backend whose holds outlive a lost answer only by their lease.
fn answer_lost(backend: &dyn DistributedLock, kind: ErrorKind) -> bool {
    kind == ErrorKind::Unavailable && backend.capabilities().ttl.kind == LeaseKind::PerLock
}

/// After an acquire failed with `kind`: if its answer was lost, has the hold the server may have
/// applied given back in the background. Called once the acquire no longer counts as in flight.
pub(crate) fn acquire_failed(
    this: &Arc<dyn DistributedLock>,
    req: &AcquireRequest,
    kind: ErrorKind,
) {
    if answer_lost(&**this, kind) {
        observe::settling(this.core().backend(), req.name.as_str(), Settling::GiveBack);
        tokio::spawn(settle(
            this.clone(),
            Job::GiveBack {
                name: req.name.clone(),
                owner: req.owner.clone(),
                ttl: req.ttl,
            },
        ));
    }
}

/// Uncounts a hold of `(name, owner)` unless disarmed, also when the future that owns it is
/// dropped mid-way.
struct Uncount<'a>(Option<(&'a dyn DistributedLock, &'a LockName, &'a OwnerId)>);

impl<'a> Uncount<'a> {
    fn new(backend: &'a dyn DistributedLock, name: &'a LockName, owner: &'a OwnerId) -> Self {
        Self(Some((backend, name, owner)))
    }
}

impl Drop for Uncount<'_> {
    fn drop(&mut self) {
        if let Some((backend, name, owner)) = self.0.take() {
            backend.core().holds().remove(name, owner);
        }
    }
}

/// A grant a release handed over to a waiter of its handle ([`DistributedLock::hand_over`]),
/// on its way to that waiter: counted in [`Holds`] until the waiter
/// [takes](Handed::into_grant) it, and released in the background if it is dropped instead
/// (the waiter left), so no grant is left without a guard.
pub(crate) struct Handed {
    backend: Arc<dyn DistributedLock>,
    grant: Option<Grant>,
}

impl Handed {
    /// The grant, for the waiter's guard (the waiter's acquire counts it from here on).
    pub(crate) fn into_grant(mut self) -> Grant {
        let grant = self
            .grant
            .take()
            .expect("a Handed holds its grant until taken");
        let holds = self.backend.core().holds();
        holds.remove(&grant.name, &grant.owner);
        grant
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        let Some(grant) = self.grant.take() else {
            return;
        };
        match self.backend.core().runtime() {
            Some(rt) => {
                let backend = self.backend.clone();
                // The release uncounts the hold once the server has answered.
                rt.spawn(async move {
                    let _ = release(&backend, &grant).await;
                });
            }
            // No runtime to release it: it ends with its lease.
            None => self
                .backend
                .core()
                .holds()
                .remove(&grant.name, &grant.owner),
        }
    }
}

/// Releases one hold of `grant` (a guard's, counted in [`Holds`]), and settles the count: it
/// goes once the server has answered. A release whose answer was lost is sent again in the
/// background until one is answered or the lease has run out; the caller gets the first
/// attempt's outcome.
///
/// On a backend that [hands locks over](DistributedLock::hands_over), a waiter of this handle
/// for the name that offered to take the lock gets it in the same request
/// ([`hand_over`]).
pub(crate) async fn release(backend: &Arc<dyn DistributedLock>, grant: &Grant) -> Result<bool> {
    if backend.hands_over() {
        if let Some(offer) = backend.core().wakes().claim(&grant.name) {
            return hand_over(backend, grant, offer).await;
        }
    }
    let mut uncount = Uncount::new(&**backend, &grant.name, &grant.owner);
    let released = backend.release(grant).await;
    if released.is_ok() {
        // Whatever the answer, the lock may be free now: this handle's pollers look at once.
        backend.core().wakes().released(&grant.name);
    }
    if let Err(e) = &released {
        if answer_lost(&**backend, e.kind()) {
            // The background job uncounts it when the server has answered.
            uncount.0 = None;
            observe::settling(
                backend.core().backend(),
                grant.name.as_str(),
                Settling::Release,
            );
            tokio::spawn(settle(backend.clone(), Job::Release(grant.clone())));
        }
    }
    released
}

/// Releases one hold of `grant` and hands the lock to `offer`'s waiter in the same request.
/// Settles both counts: the released hold's as [`release`] does, and the waiter's new hold,
/// counted here from before the request until the waiter takes it. A lost answer leaves both
/// outcomes unknown, and both are settled in the background: the release sent again (it takes
/// nothing if the lock was handed over) and the waiter's hold given back (there is none if it
/// was not).
async fn hand_over(
    backend: &Arc<dyn DistributedLock>,
    grant: &Grant,
    offer: Offer,
) -> Result<bool> {
    let core = backend.core();
    let Offer {
        req: ref to,
        to: waiter,
        ..
    } = offer;
    let mut uncount = Uncount::new(&**backend, &grant.name, &grant.owner);
    core.holds().add(&to.name, &to.owner);
    let mut uncount_new = Uncount::new(&**backend, &to.name, &to.owner);
    match backend.hand_over(grant, to).await {
        Ok(HandOver::Handed(new)) => {
            // The count goes with the grant to the waiter, or back with it if the waiter left.
            uncount_new.0 = None;
            let handed = Handed {
                backend: backend.clone(),
                grant: Some(new),
            };
            let _ = waiter.send(handed);
            Ok(true)
        }
        Ok(HandOver::Released(held)) => {
            // Nothing was passed on: the waiter (told by the dropped offer) asks the server.
            drop(waiter);
            core.wakes().released(&grant.name);
            Ok(held)
        }
        Err(e) => {
            drop(uncount_new);
            if answer_lost(&**backend, e.kind()) {
                observe::settling(core.backend(), to.name.as_str(), Settling::GiveBack);
                tokio::spawn(settle(
                    backend.clone(),
                    Job::GiveBack {
                        name: to.name.clone(),
                        owner: to.owner.clone(),
                        ttl: to.ttl,
                    },
                ));
                uncount.0 = None;
                observe::settling(core.backend(), grant.name.as_str(), Settling::Release);
                tokio::spawn(settle(backend.clone(), Job::Release(grant.clone())));
            }
            Err(e)
        }
    }
}

/// A request whose answer was lost, to settle with the server.
enum Job {
    /// Give back the hold an acquire may have added.
    GiveBack {
        name: LockName,
        owner: OwnerId,
        ttl: Duration,
    },
    /// Take away one hold of a grant (counted in [`Holds`] until the server answers).
    Release(Grant),
}

/// Settles `job` until the server answers it or its lease has run out. The job keeps the client
/// alive meanwhile: a client dropped right after a lost answer still cleans up after itself.
async fn settle(lock: Arc<dyn DistributedLock>, job: Job) {
    let ttl = match &job {
        Job::GiveBack { ttl, .. } => *ttl,
        Job::Release(grant) => grant.ttl,
    };
    let until = tokio::time::Instant::now() + ttl + drift(ttl);
    let mut pause = Duration::from_millis(50);
    loop {
        let done = match &job {
            // Not given back (yet): the late request may still land; look again.
            Job::GiveBack { name, owner, ttl } => match lock.give_back(name, owner, *ttl).await {
                Ok(given_back) => given_back,
                Err(e) => !e.is_temporary(),
            },
            // Any answer settles a release: it took the hold, or the hold was gone.
            Job::Release(grant) => match lock.release(grant).await {
                Ok(_) => true,
                Err(e) => !e.is_temporary(),
            },
        };
        let now = tokio::time::Instant::now();
        if done || now >= until {
            let (name, what) = match &job {
                Job::GiveBack { name, .. } => (name, Settling::GiveBack),
                Job::Release(grant) => {
                    lock.core().holds().remove(&grant.name, &grant.owner);
                    (&grant.name, Settling::Release)
                }
            };
            observe::settled(lock.core().backend(), name.as_str(), what, done);
            return;
        }
        tokio::time::sleep_until((now + pause).min(until)).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
