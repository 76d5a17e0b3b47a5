//! Tasks of one handle waiting for the same name take turns ([`LocalWaiter`]), and on a backend
//! that hands locks over, a waiter offers to take the lock straight from a release of its handle
//! ([`DistributedLock::hand_over`]); what a release handed over waits in a [`Stash`] for the
//! waiter's next attempt.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::backend::wait::{self, Attempt};
use crate::error::Result;
use crate::grant::AcquireRequest;
use crate::lock::DistributedLock;
use crate::wakes::{Handed, LocalWaiter};

use super::attempt::attempt_once;

/// A lock handed over to a waiter between its attempts ([`DistributedLock::hand_over`]), kept
/// for its next attempt to return. Dropped with the acquire, it is given back.
#[derive(Default)]
pub(super) struct Stash(Mutex<Option<Handed>>);

impl Stash {
    pub(super) fn take(&self) -> Option<Handed> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    pub(super) fn put(&self, handed: Handed) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(handed);
    }
}

/// The next attempt of a wait loop: the lock handed over while the waiter waited, if it was,
/// without a request; else one attempt at the server.
pub(super) fn next_attempt<'a>(
    this: &'a Arc<dyn DistributedLock>,
    req: &'a AcquireRequest,
    stash: &Stash,
) -> impl Future<Output = Result<Attempt>> + Send + 'a {
    let handed = stash.take();
    async move {
        match handed {
            // Taken in the poll that returns it: the grant is the acquire's from here on.
            Some(handed) => Ok(Attempt::Granted(handed.into_grant())),
            None => attempt_once(this, req).await,
        }
    }
}

/// Runs one wait step (`wait`) of a waiter; on a backend that hands locks over, the waiter
/// offers meanwhile to take the lock from a release through its handle, and a lock handed over
/// ends the step and goes to `stash`. An offer that a release took up as the step ended is
/// waited for (one request), so a grant is never lost between the two.
pub(super) async fn offering(
    this: &Arc<dyn DistributedLock>,
    local: &LocalWaiter<'_>,
    req: &AcquireRequest,
    stash: &Stash,
    wait: impl Future<Output = ()>,
) {
    if !this.profile().hands_over || req.permits > 1 {
        return wait.await;
    }
    let mut offered = local.offer(req);
    let answered = tokio::select! {
        handed = offered.handed() => Some(handed),
        () = wait => None,
    };
    let handed = match answered {
        Some(handed) => handed,
        None => offered.withdraw().await,
    };
    if let Some(handed) = handed {
        stash.put(handed);
    }
}

/// A polling waiter's wait for its turn to poll ([`LocalWaiter::turn`]); on a backend that
/// hands locks over, the waiter offers meanwhile to take the lock from a release through its
/// handle, and a lock handed over ends the wait (`Err`).
pub(super) async fn turn_or_handed(
    this: &Arc<dyn DistributedLock>,
    local: &LocalWaiter<'_>,
    req: &AcquireRequest,
    deadline: Instant,
) -> std::result::Result<Option<tokio::sync::OwnedSemaphorePermit>, Handed> {
    let turn = local.turn(deadline);
    if !this.profile().hands_over || req.permits > 1 {
        return Ok(turn.await);
    }
    tokio::pin!(turn);
    loop {
        let mut offered = local.offer(req);
        tokio::select! {
            handed = offered.handed() => match handed {
                Some(handed) => return Err(handed),
                // The release that took the offer up passed nothing on: offer again.
                None => continue,
            },
            turn = &mut turn => {
                return match offered.withdraw().await {
                    Some(handed) => Err(handed),
                    None => Ok(turn),
                };
            }
        }
    }
}

/// A polling waiter's wait: until the server's notice (where it subscribed) or a release of the
/// name through its handle since `seen`, for at most `max`; without notices, until such a
/// release or `step`.
pub(super) async fn notice_or_release(
    notices: &tokio::sync::OnceCell<Option<Box<dyn wait::Notices>>>,
    local: &LocalWaiter<'_>,
    seen: u64,
    max: Duration,
    step: Duration,
) {
    match notices.get() {
        Some(Some(n)) => tokio::select! {
            _ = n.wait(max) => {}
            _ = local.wait(seen, max) => {}
        },
        _ => local.wait(seen, step).await,
    }
}
