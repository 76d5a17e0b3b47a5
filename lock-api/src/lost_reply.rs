//! What the core does when a server's answer is lost, written once for every backend with
//! per-lock leases: an acquire whose outcome is unknown is given back, and a release the server
//! did not answer is sent again, in the background, until the server answers or the lease asked
//! for has run out (after that, whatever the server applied late has expired by itself).
//!
//! A give-back must take away only the hold the lost request may have added, never one a live
//! guard relies on. An acquisition's own owner id names exactly one acquisition, but a re-entry
//! (through [`LockGuard::reenter`](crate::LockGuard::reenter), or an explicit owner acquiring
//! twice) adds a hold to a hold that guards of this handle already have. So the core counts, per
//! name and owner, the holds this handle accounts for ([`Holds`](crate::keeper::Holds)): its live guards and its
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
//!
//! A release whose answer was lost is settled the same way, never by sending it again blind:
//! where the owner has several holds (a re-entry), a release the server applied and then
//! applied again would take a hold a live guard relies on, and the lock would be free while
//! that guard still holds it. The released hold stays counted until the release is settled,
//! so the retry takes one hold only while the server has *at least* as many as this handle
//! accounts for ([`Surplus::leaving`](crate::backend::Surplus::leaving)): if the lost release was applied, the server has one
//! fewer, and nothing more is taken.

use std::sync::Arc;
use std::time::Duration;

use crate::capability::LeaseKind;
use crate::error::ErrorKind;
use crate::grant::{drift, AcquireRequest, Surplus};
use crate::lock::DistributedLock;
use crate::name::{LockName, OwnerId};
use crate::observe::{self, Settling};

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
pub(crate) fn answer_lost(backend: &dyn DistributedLock, kind: ErrorKind) -> bool {
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
        let surplus = Surplus::of_acquire(req.name.clone(), req.owner.clone(), req.ttl);
        tokio::spawn(settle(this.clone(), surplus));
    }
}

/// Uncounts a hold of `(name, owner)` unless disarmed, also when the future that owns it is
/// dropped mid-way.
pub(crate) struct Uncount<'a>(
    pub(crate) Option<(&'a dyn DistributedLock, &'a LockName, &'a OwnerId)>,
);

impl<'a> Uncount<'a> {
    pub(crate) fn new(
        backend: &'a dyn DistributedLock,
        name: &'a LockName,
        owner: &'a OwnerId,
    ) -> Self {
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

/// Settles a request whose answer was lost, until the server answers or the lease asked for has
/// run out: gives back `surplus` ([`DistributedLock::give_back`]). An acquire's is looked for
/// again while the server reports none (the late request may still land); a release's is settled
/// by any answer (the server took the hold, or has fewer than the handle counts: the release
/// landed), and its hold is uncounted then. The job keeps the client alive meanwhile: a client
/// dropped right after a lost answer still cleans up after itself.
pub(crate) async fn settle(lock: Arc<dyn DistributedLock>, surplus: Surplus) {
    let until = tokio::time::Instant::now() + surplus.ttl + drift(surplus.ttl);
    let releasing = surplus.leaving > 0;
    let mut pause = Duration::from_millis(50);
    loop {
        let done = match lock.give_back(&surplus).await {
            Ok(given_back) => given_back || releasing,
            Err(e) => !e.is_temporary(),
        };
        let now = tokio::time::Instant::now();
        if done || now >= until {
            let what = match releasing {
                true => {
                    let holds = lock.core().holds();
                    holds.remove(&surplus.name, &surplus.owner);
                    Settling::Release
                }
                false => Settling::GiveBack,
            };
            observe::settled(lock.core().backend(), surplus.name.as_str(), what, done);
            return;
        }
        tokio::time::sleep_until((now + pause).min(until)).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
