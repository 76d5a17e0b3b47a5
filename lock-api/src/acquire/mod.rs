//! What `lock()` does, read top to bottom: validate the options into a [`Plan`], take the lock
//! on the spot where the keeper is the lock's server, else attempt at the server once
//! (`try_lock`) or wait the backend's one way ([`Waiting`]): polling with backoff
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

use futures::future::{BoxFuture, Either};
use futures::TryFutureExt;
use tracing::Instrument;

use crate::backend::wait::{Attempt, Waiting};
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{AcquireRequest, Grant};
use crate::guard::{context, LockGuard};
use crate::keeper::Hold;
use crate::lock::{DistributedLock, OnTheSpot};
use crate::lost_reply::{self, InFlight};
use crate::name::{LockName, OwnerId};
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

// On the in-memory backend a whole cycle takes a few hundred nanoseconds, so the futures below
// stay small: what may wait (a networked backend's call, a queue for a held in-memory lock) is
// boxed, and only a state of a few words is moved around on the uncontended path.

pub(crate) async fn try_lock_with(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    options: Option<&LockOptions>,
    reenter: Option<&OwnerId>,
) -> Result<Option<LockGuard>> {
    spend_budget().await;
    // The plan is made after the await above and lives in this block only, so this future's
    // state never holds it: on the in-memory backend's fast path nothing is saved and restored.
    let acquire = {
        let plan = Plan::new(
            &**this,
            name,
            options.unwrap_or(&DEFAULT_OPTIONS),
            None,
            reenter,
        )?;
        let started = observe::stamp();
        let Plan {
            keeper,
            owner,
            ttl,
            renew,
            leased,
        } = plan;
        let owner = match keeper.grant_now(name, owner, ttl, renew.is_some()) {
            OnTheSpot::Granted(hold) => {
                observe::acquire_metrics_of(&**this, false, "granted", started);
                return Ok(Some(LockGuard::kept(this.clone(), hold)));
            }
            OnTheSpot::Held(_) => {
                observe::acquire_metrics_of(&**this, false, "held", started);
                return Ok(None);
            }
            OnTheSpot::NotHere(owner) => owner,
        };
        let plan = Plan {
            keeper,
            owner,
            ttl,
            renew,
            leased,
        };
        Box::pin(async move {
            let (req, plan) = plan.request(name);
            let backend = this.core().backend();
            let span = observe::acquire_span(backend, name, false);
            let started = observe::stamp();
            let in_flight = InFlight::new(&**this, &req);
            let attempt = attempt_once(this, &req).map_ok(Attempt::into_grant);
            let result = match attempt.instrument(span.clone()).await {
                Ok(Some(g)) => {
                    in_flight.landed();
                    Ok(Some(LockGuard::new(
                        this.clone(),
                        g,
                        plan.renew,
                        plan.leased,
                    )))
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
        })
    };
    acquire.await
}

pub(crate) async fn lock_with(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    options: Option<&LockOptions>,
    wait: Option<Duration>,
) -> Result<LockGuard> {
    spend_budget().await;
    // The plan is made after the await above and lives in this block only, so this future's
    // state never holds it: on the in-memory backend's fast path nothing is saved and restored.
    let acquire = 'acquire: {
        let plan = Plan::new(
            &**this,
            name,
            options.unwrap_or(&DEFAULT_OPTIONS),
            wait,
            None,
        )?;
        let wait = wait.unwrap_or(Duration::ZERO);
        let started = observe::stamp();
        let Plan {
            keeper,
            owner,
            ttl,
            renew,
            leased,
        } = plan;
        let owner = match keeper.grant_now(name, owner, ttl, renew.is_some()) {
            OnTheSpot::Granted(hold) => {
                observe::acquire_metrics_of(&**this, true, "granted", started);
                return Ok(LockGuard::kept(this.clone(), hold));
            }
            OnTheSpot::Held(owner) => {
                // The keeper is the lock's server, and queues for it.
                let req = AcquireRequest {
                    name: LockName::checked(name),
                    owner,
                    ttl,
                };
                let queued = keeper
                    .queue_now(req, wait, renew.is_some())
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Backend,
                            "a keeper that grants on the spot must queue on the spot",
                        )
                    })?;
                break 'acquire Either::Left(waited_on_the_spot(this, name, queued, started));
            }
            OnTheSpot::NotHere(owner) => owner,
        };
        let plan = Plan {
            keeper,
            owner,
            ttl,
            renew,
            leased,
        };
        Either::Right(Box::pin(async move {
            let (req, plan) = plan.request(name);
            let backend = this.core().backend();
            let span = observe::acquire_span(backend, name, true);
            let in_flight = InFlight::new(&**this, &req);
            let waited = acquire_waiting(this, &req, wait);
            let result = match waited.instrument(span.clone()).await {
                Ok(grant) => {
                    in_flight.landed();
                    Ok(LockGuard::new(this.clone(), grant, plan.renew, plan.leased))
                }
                Err(e) => {
                    in_flight.failed();
                    Err(acquire_failed(this, &req, e))
                }
            };
            let outcome = Acquired::of(&result, |g| Some(g.token().0));
            observe::acquired(&span, backend, true, outcome, started);
            result
        }))
    };
    acquire.await
}

/// The wait of a keeper that is the lock's server, in its own queue.
fn waited_on_the_spot<'a>(
    this: &'a Arc<dyn DistributedLock>,
    name: &'a str,
    queued: BoxFuture<'a, Result<Hold>>,
    started: observe::Stamp,
) -> BoxFuture<'a, Result<LockGuard>> {
    Box::pin(async move {
        let backend = this.core().backend();
        let span = observe::acquire_span(backend, name, true);
        let result = queued
            .instrument(span.clone())
            .await
            .map_err(|e| context(e, &**this, &LockName::checked(name)))
            .map(|hold| LockGuard::kept(this.clone(), hold));
        let outcome = Acquired::of(&result, |g| Some(g.token().0));
        observe::acquired(&span, backend, true, outcome, started);
        result
    })
}

/// Waits up to `wait` for `req`'s lock the way the backend says
/// ([`DistributedLock::waiting`]): attempts with backoff, attempts woken by the server's
/// notices, or the backend's own queue.
async fn acquire_waiting(
    this: &Arc<dyn DistributedLock>,
    req: &AcquireRequest,
    wait: Duration,
) -> Result<Grant> {
    let deadline = Instant::now() + wait;
    match this.waiting() {
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
