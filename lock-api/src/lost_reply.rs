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

use std::sync::Arc;
use std::time::Duration;

use crate::capability::LeaseKind;
use crate::error::ErrorKind;
use crate::grant::{drift, AcquireRequest, Grant};
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

/// A request whose answer was lost, to settle with the server.
pub(crate) enum Job {
    /// Give back the hold an acquire may have added.
    GiveBack {
        name: LockName,
        owner: OwnerId,
        ttl: Duration,
    },
    /// Take away one hold of a grant (counted in [`Holds`](crate::keeper::Holds) until the server answers).
    Release(Grant),
}

/// Settles `job` until the server answers it or its lease has run out. The job keeps the client
/// alive meanwhile: a client dropped right after a lost answer still cleans up after itself.
pub(crate) async fn settle(lock: Arc<dyn DistributedLock>, job: Job) {
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
