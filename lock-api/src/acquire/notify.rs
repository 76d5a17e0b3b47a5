//! Waiting woken by the server's notices: subscribed once an attempt found the lock held, and
//! cut short by a release through the handle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::wait::{self, Attempt};
use crate::error::Result;
use crate::grant::{AcquireRequest, Grant};
use crate::lock::DistributedLock;

use super::attempt::attempt_once;
use super::local::{next_attempt, offering, Stash};

/// Waits until `deadline` for `req`'s lock, woken by the server's notices (`wait` is the bound,
/// for the timeout's message).
pub(super) async fn wait(
    this: &Arc<dyn DistributedLock>,
    req: &AcquireRequest,
    wait: Duration,
    deadline: Instant,
) -> Result<Grant> {
    // An uncontended lock costs one request and no subscription.
    if let Attempt::Granted(g) = attempt_once(this, req).await? {
        return Ok(g);
    }
    if Instant::now() >= deadline {
        return Err(wait::timeout(wait));
    }
    let subscribed = tokio::time::timeout_at(deadline.into(), this.subscribe(&req.name));
    let notices = match subscribed.await {
        Ok(notices) => notices?,
        // The wait bound ran out while subscribing: one last attempt, as the loop makes.
        Err(_) => {
            return match attempt_once(this, req).await? {
                Attempt::Granted(g) => Ok(g),
                Attempt::Held { .. } => Err(wait::timeout(wait)),
            }
        }
    };
    // A release through this handle wakes its own waiters as soon as it returns,
    // without waiting for the server's notice to come round.
    let local = this.core().wakes().waiter(&req.name);
    let seen = AtomicU64::new(local.releases());
    let stash = Stash::default();
    wait::notified(
        deadline,
        || {
            seen.store(local.releases(), Ordering::Relaxed);
            next_attempt(this, req, &stash)
        },
        |max| {
            let (notices, local, seen, stash) = (&notices, &local, &seen, &stash);
            async move {
                let step = async {
                    tokio::select! {
                        _ = notices.wait(max) => {}
                        _ = local.wait(seen.load(Ordering::Relaxed), max) => {}
                    }
                };
                offering(this, local, req, stash, step).await;
            }
        },
    )
    .await
}
