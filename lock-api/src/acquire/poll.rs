//! Waiting by attempts: one waiter of the handle polls with backoff, cut short by a release
//! through the handle or by the server's notices where the backend has some.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::wait::{self, Attempt, Backoff};
use crate::error::Result;
use crate::grant::{AcquireRequest, Grant};
use crate::lock::DistributedLock;

use super::attempt::attempt_once;
use super::local::{next_attempt, notice_or_release, offering, turn_or_handed, Stash};

/// Waits until `deadline` for `req`'s lock by attempts (`wait` is the bound, for the timeout's
/// message).
pub(super) async fn wait(
    this: &Arc<dyn DistributedLock>,
    req: &AcquireRequest,
    wait: Duration,
    deadline: Instant,
    mut backoff: Backoff,
) -> Result<Grant> {
    // Between attempts: the backoff step, cut short by a release of the name through
    // this handle (counted from before the attempt, so one that lands while the
    // attempt is in flight is not missed).
    let local = this.core().wakes().waiter(&req.name);
    // One waiter of this handle polls for the name; the rest queue here, FIFO, and send
    // nothing (on a backend that hands locks over, a release of the handle may hand
    // the lock to one of them). A queued waiter whose bound runs out makes the one last
    // attempt.
    let turn = match turn_or_handed(this, &local, req, deadline).await {
        Ok(turn) => turn,
        Err(handed) => return Ok(handed.into_grant()),
    };
    let Some(_turn) = turn else {
        return match attempt_once(this, req).await? {
            Attempt::Granted(g) => Ok(g),
            Attempt::Held { .. } => Err(wait::timeout(wait)),
        };
    };
    let stash = Stash::default();
    // The server's notices, where a polling backend has them for waiters of other
    // handles (MariaDB's `GET_LOCK`, MongoDB's change streams, the RedLock masters'
    // messages): subscribed once the lock is known to be held, so an uncontended
    // acquire subscribes to nothing.
    let notices = tokio::sync::OnceCell::new();
    // Passed on by a waiter that won the lock: it is held through this handle, so an
    // attempt now would only find it held. Wait for that release (or the first step).
    // A release that frees the lock after `HANDED_IN_A_ROW` hand-overs wakes no waiter
    // of the handle: this one then learns of it as other clients' waiters do, from the
    // server's notice, so it subscribes first (within the step; else later). It offers
    // to take the lock meanwhile, subscribing included, so it keeps its place in line.
    if let Some(seen) = local.passed_by_a_winner() {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = backoff.next_delay().min(left);
        let wait = async {
            let started = Instant::now();
            let subscribed = tokio::time::timeout(step, this.subscribe(&req.name));
            if let Ok(Ok(n)) = subscribed.await {
                let _ = notices.set(Some(n));
            }
            let step = step.saturating_sub(started.elapsed());
            notice_or_release(&notices, &local, seen, step, step).await;
        };
        offering(this, &local, req, &stash, wait).await;
    }
    let seen = AtomicU64::new(local.releases());
    let granted = wait::notified(
        deadline,
        || {
            seen.store(local.releases(), Ordering::Relaxed);
            next_attempt(this, req, &stash)
        },
        |max| {
            let step = backoff.next_delay().min(max);
            let seen = seen.load(Ordering::Relaxed);
            let (notices, local, stash) = (&notices, &local, &stash);
            async move {
                if !notices.initialized() {
                    let subscribed = tokio::time::timeout(max, this.subscribe(&req.name));
                    let subscribed = subscribed.await.ok().and_then(Result::ok);
                    let fresh = subscribed.is_some();
                    let _ = notices.set(subscribed);
                    if fresh {
                        // Attempt again at once: a release that came before the
                        // subscription sends no notice to it.
                        return;
                    }
                }
                let step = notice_or_release(notices, local, seen, max, step);
                offering(this, local, req, stash, step).await;
            }
        },
    )
    .await;
    if granted.is_ok() {
        local.won();
    }
    granted
}
