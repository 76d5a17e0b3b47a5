//! Conveniences over the primitives, written once for every backend.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Either};

use crate::backend::wait::{self, Attempt, Waiting};
use crate::capability::LeaseKind;
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{check_wait, AcquireRequest, FencingToken, Grant, LockInfo};
use crate::guard::{context, LockGuard};
use crate::keeper::Hold;
use crate::lock::{DistributedLock, LeaseKeeper, OnTheSpot};
use crate::name::{check_name, check_prefix, LockName, OwnerId};
use crate::observe::{self, Acquired};
use crate::options::{Lease, LockOptions};
use crate::settle::{self, Handed, InFlight};
use crate::wakes::LocalWaiter;
use futures::TryFutureExt;
use tracing::Instrument;

/// What users call: validate, acquire, wrap in a [`LockGuard`] watched by the client's
/// watchdog. Implemented for `Arc<dyn DistributedLock>` and `Arc<B>` for every backend `B`.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use distlock_api::{LockExt, MemoryLock};
///
/// # tokio_test_block_on(async {
/// let locks = Arc::new(MemoryLock::new());
/// let guard = locks.lock("reports/daily", Duration::from_secs(1)).await?;
/// assert!(!guard.is_lost());
/// assert!(guard.release().await?);
/// # Ok::<_, distlock_api::Error>(())
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
pub trait LockExt {
    /// Takes the lock if it is free, with default options; `None` if someone else holds it.
    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send;

    /// Takes the lock, waiting up to `wait`; [`ErrorKind::Timeout`] after that.
    fn lock(&self, name: &str, wait: Duration) -> impl Future<Output = Result<LockGuard>> + Send;

    /// Takes the lock if it is free, with `options` (its wait bound is ignored).
    fn try_lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send;

    /// Takes the lock with `options`, waiting up to `options.wait` (no wait if unset).
    fn lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send;

    /// Who holds `name`, if anyone.
    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send;

    /// Every held lock whose name starts with `prefix` (all of them for `""`), in name order,
    /// where the backend can enumerate them ([`ErrorKind::Unsupported`] where it cannot). A
    /// prefix longer than a name may be, or with a control character, is `InvalidArgument`.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<(LockName, LockInfo)>>> + Send;

    /// Frees `name` for an operator, whatever its holder's hold count, but only while its
    /// current grant carries `token` (read it with [`holder`](Self::holder)): `Ok(true)` if
    /// that grant held it, `Ok(false)` if the lock was free or changed hands meanwhile. See
    /// [`DistributedLock::force_release`].
    fn force_release(
        &self,
        name: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Runs `work` while holding `name`: takes the lock with `options` (waiting up to
    /// `options.wait`), hands `work` the fencing token to pass to the resource, and releases the
    /// lock when `work` finishes. If the lock is lost first, `work` is dropped at its next await
    /// point and the result is [`ErrorKind::Lost`] with the reason: work that must not outlive
    /// the lock does not.
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use distlock_api::{LockExt, LockOptions, MemoryLock};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = Arc::new(MemoryLock::new());
    /// let opts = LockOptions::new().wait(Duration::from_secs(5));
    /// let written = locks
    ///     .with_lock("reports/daily", &opts, |token| async move { format!("written with {token}") })
    ///     .await?;
    /// assert!(written.starts_with("written with"));
    /// assert!(locks.holder("reports/daily").await?.is_none()); // released
    /// # Ok::<_, distlock_api::Error>(())
    /// # }).unwrap();
    /// ```
    fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send;
}

// The methods are plain `async` bodies over `&Arc<dyn DistributedLock>` rather than
// `#[async_trait]` ones: on the in-memory backend a boxed future per call was a visible share of
// a whole lock cycle, and nobody needs `LockExt` itself as a trait object.
impl LockExt for Arc<dyn DistributedLock> {
    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        try_lock_with(self, name, None, None)
    }

    fn lock(&self, name: &str, wait: Duration) -> impl Future<Output = Result<LockGuard>> + Send {
        lock_with(self, name, None, Some(wait))
    }

    fn try_lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        try_lock_with(self, name, Some(options), None)
    }

    fn lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        lock_with(self, name, Some(options), options.wait)
    }

    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        holder(self, name)
    }

    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<(LockName, LockInfo)>>> + Send {
        list(self, prefix)
    }

    fn force_release(
        &self,
        name: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<bool>> + Send {
        force_release(self, name, token)
    }

    fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        with_lock(self, name, options, work)
    }
}

impl<B: DistributedLock> LockExt for Arc<B> {
    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { try_lock_with(&this, name, None, None).await }
    }

    fn lock(&self, name: &str, wait: Duration) -> impl Future<Output = Result<LockGuard>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { lock_with(&this, name, None, Some(wait)).await }
    }

    fn try_lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { try_lock_with(&this, name, Some(options), None).await }
    }

    fn lock_with(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { lock_with(&this, name, Some(options), options.wait).await }
    }

    fn holder(&self, name: &str) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { holder(&this, name).await }
    }

    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<(LockName, LockInfo)>>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { list(&this, prefix).await }
    }

    fn force_release(
        &self,
        name: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<bool>> + Send {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { force_release(&this, name, token).await }
    }

    fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let this: Arc<dyn DistributedLock> = self.clone();
        async move { with_lock(&this, name, options, work).await }
    }
}

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

async fn lock_with(
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

/// One attempt of `req`, safe to drop at any point: once its request may have been sent, a
/// grant nobody is left to receive is released ([`wait::detached`]). Every backend's attempts
/// go through here, so none wires cancellation of its own.
async fn attempt_once(this: &Arc<dyn DistributedLock>, req: &AcquireRequest) -> Result<Attempt> {
    let (lock, req) = (this.clone(), req.clone());
    let undo = this.clone();
    wait::detached(
        async move { lock.attempt(&req).await },
        move |orphan| async move {
            let _ = undo.release(&orphan).await;
        },
    )
    .await
}

/// A lock handed over to a waiter between its attempts ([`DistributedLock::hand_over`]), kept
/// for its next attempt to return. Dropped with the acquire, it is given back.
#[derive(Default)]
struct Stash(Mutex<Option<Handed>>);

impl Stash {
    fn take(&self) -> Option<Handed> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    fn put(&self, handed: Handed) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(handed);
    }
}

/// The next attempt of a wait loop: the lock handed over while the waiter waited, if it was,
/// without a request; else one attempt at the server.
fn next_attempt<'a>(
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
async fn offering(
    this: &Arc<dyn DistributedLock>,
    local: &LocalWaiter<'_>,
    req: &AcquireRequest,
    stash: &Stash,
    wait: impl Future<Output = ()>,
) {
    if !this.hands_over() {
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
async fn turn_or_handed(
    this: &Arc<dyn DistributedLock>,
    local: &LocalWaiter<'_>,
    req: &AcquireRequest,
    deadline: Instant,
) -> std::result::Result<Option<tokio::sync::OwnedSemaphorePermit>, Handed> {
    let turn = local.turn(deadline);
    if !this.hands_over() {
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
async fn notice_or_release(
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
        Waiting::Poll(mut backoff) => {
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
        Waiting::Notify => {
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
    }
}

/// Adds context to an acquire's error, and when the error leaves the outcome unknown (the
/// server may have applied the request whose answer never came), has the hold it may have added
/// given back in the background ([`settle`](crate::settle)). The acquire no longer counts as in
/// flight by now, so the give-back takes exactly the surplus it may have left.
fn acquire_failed(this: &Arc<dyn DistributedLock>, req: &AcquireRequest, e: Error) -> Error {
    let e = context(e, &**this, &req.name);
    settle::acquire_failed(this, req, e.kind());
    e
}

/// Spends one unit of the task's cooperative budget, yielding if it is used up. An in-process
/// backend's attempt never yields by itself, and a loop of them must still let the runtime run
/// its other tasks (the watchdog among them). It comes before the attempt, not after: a task
/// dropped while it yields must not leave a grant that no guard owns.
async fn spend_budget() {
    tokio::task::coop::consume_budget().await;
}

/// Re-entry is an acquire, so it lives with the other acquires.
impl LockGuard {
    /// Takes one more hold of this guard's lock, as the same owner: the new guard has the same
    /// token and a hold count one higher, and the lock is free only when every guard of the
    /// hold has been released or dropped, in any order. This is how a holder re-enters: an
    /// acquire through the client (`try_lock`, `lock`) is a new owner, which this hold excludes
    /// like any other. The new hold's lease is the client's default watchdog lease; see
    /// [`reenter_with`](Self::reenter_with).
    ///
    /// `Unsupported` on a backend without reentrancy; `Lost` if this guard no longer holds.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use distlock_api::{LockExt, MemoryLock};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = Arc::new(MemoryLock::new());
    /// let outer = locks.try_lock("ledger").await?.expect("free");
    /// // The same client asking again is another owner: excluded.
    /// assert!(locks.try_lock("ledger").await?.is_none());
    /// // The holder re-enters through its guard.
    /// let inner = outer.reenter().await?;
    /// assert_eq!((inner.token(), inner.hold_count()), (outer.token(), 2));
    /// assert!(outer.release().await?); // one hold left: still held
    /// assert!(locks.try_lock("ledger").await?.is_none());
    /// assert!(inner.release().await?); // the last hold: free
    /// assert!(locks.try_lock("ledger").await?.is_some());
    /// # Ok::<_, distlock_api::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn reenter(&self) -> Result<LockGuard> {
        reenter(&self.backend, self, &LockOptions::new()).await
    }

    /// Like [`reenter`](Self::reenter), with `options`' lease for the new hold (its wait bound
    /// is ignored; an owner in it is `InvalidArgument`: the hold's owner is this guard's).
    pub async fn reenter_with(&self, options: &LockOptions) -> Result<LockGuard> {
        reenter(&self.backend, self, options).await
    }
}

/// [`LockGuard::reenter_with`]: one more hold for `held`'s owner, which only an acquire that
/// names that owner exactly can take (every other acquisition has an owner of its own).
async fn reenter(
    this: &Arc<dyn DistributedLock>,
    held: &LockGuard,
    options: &LockOptions,
) -> Result<LockGuard> {
    let name = held.name();
    let fail = |kind, msg: &str| {
        Err(Error::new(kind, msg.to_string())
            .with_backend(this.core().backend())
            .with_lock(name))
    };
    if !this.capabilities().reentrant {
        return fail(
            ErrorKind::Unsupported,
            "this backend is not reentrant: a holder cannot take its lock twice",
        );
    }
    if options.owner.is_some() {
        return fail(
            ErrorKind::InvalidArgument,
            "re-entry keeps the guard's owner: leave the options' owner unset",
        );
    }
    if let Some(why) = held.lost_reason() {
        return fail(
            ErrorKind::Lost,
            &format!("cannot re-enter a lock this guard no longer holds ({why})"),
        );
    }
    match try_lock_with(this, name.as_str(), Some(options), Some(held.owner())).await? {
        Some(g) if g.token() == held.token() => Ok(g),
        Some(g) => {
            // The hold ended and the owner was granted afresh: not the hold being re-entered.
            let _ = g.release().await;
            fail(ErrorKind::Lost, "the hold this guard re-enters has ended")
        }
        None => fail(ErrorKind::Lost, "the hold this guard re-enters has ended"),
    }
}

async fn with_lock<F, Fut, T>(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    options: &LockOptions,
    work: F,
) -> Result<T>
where
    F: FnOnce(FencingToken) -> Fut + Send,
    Fut: Future<Output = T> + Send,
    T: Send,
{
    let guard = lock_with(this, name, Some(options), options.wait).await?;
    let lost = guard.lost();
    let outcome = tokio::select! {
        // The work first: when both are ready, work that finished is not thrown away.
        biased;
        done = work(guard.token()) => Ok(done),
        why = lost => Err(why),
    };
    match outcome {
        Ok(done) => {
            // A release that fails leaves the lock to its lease; the work is done either way.
            let _ = guard.release().await;
            Ok(done)
        }
        Err(why) => {
            let name = guard.name().clone();
            let _ = guard.release().await;
            Err(Error::new(
                ErrorKind::Lost,
                format!("the lock was lost while the work ran: {why}"),
            )
            .with_backend(this.core().backend())
            .with_lock(name))
        }
    }
}

async fn holder(this: &Arc<dyn DistributedLock>, name: &str) -> Result<Option<LockInfo>> {
    let name = LockName::new(name).map_err(|e| e.with_backend(this.core().backend()))?;
    this.inspect(&name)
        .await
        .map_err(|e| context(e, &**this, &name))
}

async fn list(this: &Arc<dyn DistributedLock>, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
    let backend = this.core().backend();
    check_prefix(prefix).map_err(|e| e.with_backend(backend))?;
    let mut held = DistributedLock::list(&**this, prefix)
        .await
        .map_err(|e| e.with_backend(backend))?;
    held.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    Ok(held)
}

async fn force_release(
    this: &Arc<dyn DistributedLock>,
    name: &str,
    token: FencingToken,
) -> Result<bool> {
    let name = LockName::new(name).map_err(|e| e.with_backend(this.core().backend()))?;
    let freed = DistributedLock::force_release(&**this, &name, token)
        .await
        .map_err(|e| context(e, &**this, &name))?;
    tracing::info!(
        backend = this.core().backend(),
        lock = %name,
        token = token.0,
        freed,
        "lock force-released"
    );
    Ok(freed)
}

/// A validated acquire: the lease, the owner, and how the guard keeps its lease. The name is
/// checked, not yet copied: the in-memory backend finds a name it has seen by `&str`.
struct Plan<'a> {
    /// Who keeps the guard: it grants on the spot if it is the lock's server too.
    keeper: &'a dyn LeaseKeeper,
    /// This acquisition's owner id (see [`ClientCore::owner_for`](crate::backend::ClientCore::owner_for)).
    owner: OwnerId,
    ttl: Duration,
    renew: Option<Duration>,
    leased: bool,
}

impl<'a> Plan<'a> {
    // Always inlined: returned from a call, the `Result<Plan>` went through memory and was read
    // back in pieces that straddled the callee's stores, stalling store-to-load forwarding
    // (about 5 ns of an in-memory lock cycle). The error paths stay out of line.
    #[inline(always)]
    fn new(
        backend: &'a dyn DistributedLock,
        name: &str,
        options: &'a LockOptions,
        wait: Option<Duration>,
        reenter: Option<&OwnerId>,
    ) -> Result<Self> {
        let core = backend.core();
        check_name(name).map_err(|e| e.with_backend(core.backend()))?;
        // Errors past the name check are rare: only they pay for a `LockName`.
        let with_ctx = |e: Error| {
            e.with_backend(core.backend())
                .with_lock(LockName::checked(name))
        };
        options.validate().map_err(with_ctx)?;
        if let Some(wait) = wait {
            check_wait(wait).map_err(with_ctx)?;
        }
        // The client's default TTL was checked when it was set.
        let (ttl, renew) = match options.lease {
            Lease::Watchdog => (core.default_ttl(), Some(core.default_ttl())),
            Lease::WatchdogTtl(ttl) => (ttl, Some(ttl)),
            Lease::Fixed(ttl) => (ttl, None),
        };
        let caps = backend.capabilities();
        if renew.is_none() && caps.ttl.kind != LeaseKind::PerLock {
            return Err(with_ctx(Error::new(
                ErrorKind::Unsupported,
                "this backend has no per-lock leases: a fixed TTL cannot be honoured; use a \
                 watchdog-managed lease",
            )));
        }
        let renew = renew.filter(|_| caps.renewal);
        let owner = match reenter {
            Some(owner) => owner.clone(),
            None => core.owner_for(options.owner.as_ref()).map_err(with_ctx)?,
        };
        Ok(Self {
            keeper: backend.keeper(),
            owner,
            ttl,
            renew,
            leased: caps.ttl.kind != LeaseKind::None,
        })
    }

    /// The request for `name` (the name this plan checked), and what the guard needs after it.
    fn request(self, name: &str) -> (AcquireRequest, Keeping) {
        let req = AcquireRequest {
            name: LockName::checked(name),
            owner: self.owner,
            ttl: self.ttl,
        };
        (
            req,
            Keeping {
                renew: self.renew,
                leased: self.leased,
            },
        )
    }
}

/// How a networked guard keeps its lease: what [`LockGuard::new`] takes besides the grant.
struct Keeping {
    renew: Option<Duration>,
    leased: bool,
}
