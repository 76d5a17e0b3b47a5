//! Releasing a guard's hold, and handing the lock over to a waiter of the same handle in the
//! same request where the backend can ([`Profile::hands_over`](crate::Profile::hands_over)). A release whose answer
//! was lost is sent again in the background ([`lost_reply`](crate::lost_reply)).

use std::sync::Arc;

use crate::backend::wait::HandOver;
use crate::error::Result;
use crate::grant::Grant;
use crate::grant::Surplus;
use crate::lock::DistributedLock;
use crate::lost_reply::{answer_lost, settle, Uncount};
use crate::observe::{self, Settling};
use crate::wakes::{Handed, Offer};

/// Releases one hold of `grant` (a guard's, counted in [`Holds`](crate::keeper::Holds)), and settles the count: it
/// goes once the server has answered. A release whose answer was lost is sent again in the
/// background until one is answered or the lease has run out; the caller gets the first
/// attempt's outcome. A retry takes the hold only if the server still has it, never one more
/// ([`Surplus`]).
///
/// On a backend that [hands locks over](crate::Profile::hands_over), a waiter of this handle
/// for the name that offered to take the lock gets the lock with the owner's last hold, in the
/// same request
/// ([`hand_over`]); a semaphore's permit is not handed over (the backends' hand-over is the
/// lock's), its release wakes the handle's waiters instead.
pub(crate) async fn release(backend: &Arc<dyn DistributedLock>, grant: &Grant) -> Result<bool> {
    // Only an owner's last hold passes on: with holds left the owner keeps the lock, and a
    // hand-over round could only give one of them up (RedLock's masters may disagree on how
    // many holds are left, and a round that reads that wrong takes back more than one).
    let last = || backend.core().holds_accounted(&grant.name, &grant.owner) == 1;
    if backend.profile().hands_over && grant.permits == 1 && last() {
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
            tokio::spawn(settle(backend.clone(), Surplus::of_release(grant)));
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
            let _ = waiter.send(handed(backend, new));
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
                let waiters = Surplus::of_acquire(to.name.clone(), to.owner.clone(), to.ttl);
                tokio::spawn(settle(backend.clone(), waiters));
                uncount.0 = None;
                observe::settling(core.backend(), grant.name.as_str(), Settling::Release);
                tokio::spawn(settle(backend.clone(), Surplus::of_release(grant)));
            }
            Err(e)
        }
    }
}

/// `grant`, handed over to a waiter of `backend`'s handle: counted until the waiter takes it,
/// and released in the background if it is dropped instead (the waiter left), so no grant is
/// left without a guard.
fn handed(backend: &Arc<dyn DistributedLock>, grant: Grant) -> Handed {
    let backend = backend.clone();
    Handed::new(
        grant,
        Box::new(move |grant: &Grant, taken: bool| {
            let core = backend.core();
            if taken {
                // The waiter's acquire counts it from here on.
                core.holds().remove(&grant.name, &grant.owner);
                return;
            }
            match core.runtime() {
                Some(rt) => {
                    let (backend, grant) = (backend.clone(), grant.clone());
                    // The release uncounts the hold once the server has answered.
                    rt.spawn(async move {
                        let _ = release(&backend, &grant).await;
                    });
                }
                // No runtime to release it: it ends with its lease.
                None => core.holds().remove(&grant.name, &grant.owner),
            }
        }),
    )
}
