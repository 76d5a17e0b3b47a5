//! What `lock()` does, read top to bottom, the same for every backend: validate the options
//! into a [`Plan`], then attempt at the server once (`try_lock`) or wait the backend's one way ([`Waiting`]): polling with backoff
//! ([`poll`]), woken by the server's notices ([`notify`]), or in the server's own queue
//! ([`DistributedLock::acquire`]); then wrap the grant in a [`LockGuard`]. Every acquire counts
//! as in flight until it becomes a guard, and one whose answer was lost is given back
//! ([`lost_reply`]).

mod attempt;
mod local;
mod notify;
mod plan;
mod poll;
mod reenter;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryFutureExt;
use tracing::Instrument;

use crate::backend::wait::{Attempt, Waiting};
use crate::error::{Error, Result};
use crate::grant::{AcquireRequest, Grant};
use crate::guard::{context, LockGuard};
use crate::lock::DistributedLock;
use crate::lost_reply::{self, InFlight};
use crate::name::OwnerId;
use crate::observe::{self, Acquired};
use crate::options::{Lease, LockOptions};

use attempt::attempt_once;
use plan::Plan;

/// Default options, for the methods that take none.
static DEFAULT_OPTIONS: LockOptions = LockOptions {
    lease: Lease::Watchdog,
    wait: None,
    owner: None,
};

/// `try_lock`: one attempt at the server, cancellation-safe; `None` if the lock is held.
/// `permits`: 1 for a lock, the semaphore's `max` for a permit. `reenter`: the owner of a held
/// guard, for [`LockGuard::reenter`].
pub(crate) async fn try_lock_with(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    options: Option<&LockOptions>,
    permits: u32,
    reenter: Option<&OwnerId>,
) -> Result<Option<LockGuard>> {
    spend_budget().await;
    let options = options.unwrap_or(&DEFAULT_OPTIONS);
    let (req, keeping) = Plan::new(&**this, name, options, permits, None, reenter)?.request(name);
    let backend = this.core().backend();
    let span = observe::acquire_span(backend, name, false);
    let started = observe::stamp();
    let in_flight = InFlight::new(&**this, &req);
    let attempt = attempt_once(this, &req).map_ok(Attempt::into_grant);
    let result = match attempt.instrument(span.clone()).await {
        Ok(Some(g)) => {
            in_flight.landed();
            Ok(Some(keeping.guard(this, g)))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            in_flight.failed();
            Err(acquire_failed(this, &req, e))
        }
    };
    let outcome = Acquired::of(&result, |g| g.as_ref().map(|g| g.token().0));
    observe::acquired(&span, backend, false, outcome, started);
    result
}

/// `lock`: waits up to `wait` (none: one attempt) the backend's way; `permits` as for
/// [`try_lock_with`].
pub(crate) async fn lock_with(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    options: Option<&LockOptions>,
    permits: u32,
    wait: Option<Duration>,
) -> Result<LockGuard> {
    spend_budget().await;
    let options = options.unwrap_or(&DEFAULT_OPTIONS);
    let (req, keeping) = Plan::new(&**this, name, options, permits, wait, None)?.request(name);
    let backend = this.core().backend();
    let span = observe::acquire_span(backend, name, true);
    let started = observe::stamp();
    let in_flight = InFlight::new(&**this, &req);
    let waited = acquire_waiting(this, &req, wait.unwrap_or(Duration::ZERO));
    let result = match waited.instrument(span.clone()).await {
        Ok(grant) => {
            in_flight.landed();
            Ok(keeping.guard(this, grant))
        }
        Err(e) => {
            in_flight.failed();
            Err(acquire_failed(this, &req, e))
        }
    };
    let outcome = Acquired::of(&result, |g| Some(g.token().0));
    observe::acquired(&span, backend, true, outcome, started);
    result
}

/// Waits up to `wait` for `req`'s lock the way the backend says
/// ([`Profile::waiting`](crate::Profile::waiting)): attempts with backoff, attempts woken by the server's
/// notices, or the backend's own queue.
async fn acquire_waiting(
    this: &Arc<dyn DistributedLock>,
    req: &AcquireRequest,
    wait: Duration,
) -> Result<Grant> {
    let deadline = Instant::now() + wait;
    match this.profile().waiting {
        Waiting::Queue => this.acquire(req, wait).await,
        Waiting::Poll(backoff) => poll::wait(this, req, wait, deadline, backoff).await,
        Waiting::Notify => notify::wait(this, req, wait, deadline).await,
    }
}

/// Adds context to an acquire's error, and when the error leaves the outcome unknown (the
/// server may have applied the request whose answer never came), has the hold it may have added
/// given back in the background ([`lost_reply`]). The acquire no longer counts as in
/// flight by now, so the give-back takes exactly the surplus it may have left.
fn acquire_failed(this: &Arc<dyn DistributedLock>, req: &AcquireRequest, e: Error) -> Error {
    let e = context(e, &**this, &req.name);
    lost_reply::acquire_failed(this, req, e.kind());
    e
}

/// Spends one unit of the task's cooperative budget, yielding if it is used up. An in-process
/// backend's attempt never yields by itself, and a loop of them must still let the runtime run
/// its other tasks (the watchdog among them). It comes before the attempt, not after: a task
/// dropped while it yields must not leave a grant that no guard owns.
async fn spend_budget() {
    tokio::task::coop::consume_budget().await;
}
