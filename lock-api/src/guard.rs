//! The guard a successful acquire returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::Either;
use tokio::sync::Notify;

use crate::error::{Error, ErrorKind, Result};
use crate::grant::{safe_until, FencingToken, Grant};
use crate::lock::DistributedLock;
use crate::memory::{LocalStatus, LocalWatch};
use crate::name::{LockName, OwnerId};
use crate::options::LockOptions;

/// Why a guard stopped holding its lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// Safe-until passed without a successful renewal (a fixed lease ran out, or renewals kept
    /// failing).
    Expired,
    /// A renewal found the lock gone or held by someone else.
    Taken(String),
    /// The backend's session or lease ended (ZooKeeper session expiry, etcd lease revoked).
    Session(String),
    /// The client handle was dropped.
    ClientGone,
    /// The guard was released or dropped: the lock was given up, not lost. Only a `lost()`
    /// future that outlives its guard sees this.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Expired => f.write_str("lease expired without a successful renewal"),
            LostReason::Taken(why) => write!(f, "lock gone or taken over: {why}"),
            LostReason::Session(why) => write!(f, "session or lease ended: {why}"),
            LostReason::ClientGone => f.write_str("client dropped"),
            LostReason::Released => f.write_str("guard released"),
        }
    }
}

/// State shared between a guard and the client's watchdog.
pub(crate) struct GrantState {
    pub(crate) grant: Grant,
    /// The backend's name, for the lost event.
    backend: &'static str,
    inner: Mutex<StateInner>,
    changed: Notify,
}

struct StateInner {
    safe_until: Option<Instant>,
    lost: Option<LostReason>,
}

impl GrantState {
    fn new(backend: &'static str, grant: Grant, safe_until: Option<Instant>) -> Self {
        Self {
            grant,
            backend,
            inner: Mutex::new(StateInner {
                safe_until,
                lost: None,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StateInner> {
        // Every update is a single assignment, so a poisoned lock still holds consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn safe_until(&self) -> Option<Instant> {
        self.lock().safe_until
    }

    pub(crate) fn extend(&self, until: Instant) {
        let mut s = self.lock();
        if s.safe_until.is_some_and(|cur| until > cur) {
            s.safe_until = Some(until);
        }
        drop(s);
        // `lost()` futures sleep until safe-until: let them take the new deadline.
        self.changed.notify_waiters();
    }

    /// Fires the lost signal; the first reason sticks.
    pub(crate) fn fire(&self, reason: LostReason) {
        let mut s = self.lock();
        if s.lost.is_none() {
            let g = &self.grant;
            crate::observe::lost(self.backend, g.name.as_str(), g.token.0, &reason);
            s.lost = Some(reason);
            drop(s);
            self.changed.notify_waiters();
        }
    }

    pub(crate) fn is_fired(&self) -> bool {
        self.lock().lost.is_some()
    }

    fn reason(&self) -> Option<LostReason> {
        let s = self.lock();
        if let Some(r) = &s.lost {
            return Some(r.clone());
        }
        s.safe_until
            .filter(|&until| Instant::now() >= until)
            .map(|_| LostReason::Expired)
    }
}

/// A held lock. Dropping it releases the lock: at once on an in-process backend, in the
/// background when a Tokio runtime is present, and otherwise it leaves the lease to expire; it
/// never blocks and never panics.
///
/// Check [`is_lost`](LockGuard::is_lost) (or race your work against
/// [`lost`](LockGuard::lost)) before acting on the protected resource, and pass
/// [`token`](LockGuard::token) along so the resource can reject a stale holder.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    backend: Arc<dyn DistributedLock>,
    held: Held,
    /// Released: nothing left for `drop` to do.
    done: Flag,
}

/// A `bool` one word wide, for the guard's flags. A guard moves through a few futures on every
/// lock cycle; behind a `bool` field the compiler copied the seven bytes of padding in
/// overlapping pieces, which defeats the CPU's store-to-load forwarding. That cost about 10 ns
/// of a 150 ns in-memory lock cycle.
#[derive(Clone, Copy)]
struct Flag(usize);

impl Flag {
    const NO: Flag = Flag(0);
    const YES: Flag = Flag(1);

    fn of(value: bool) -> Self {
        Flag(usize::from(value))
    }

    fn get(self) -> bool {
        self.0 != 0
    }
}

/// Who looks after the lease and the lost signal.
enum Held {
    /// The client's watchdog: it shares `state` (which holds the grant) under entry `entry`.
    Watched { state: Arc<GrantState>, entry: u64 },
    /// The in-memory store ([`DistributedLock::in_process`]). `kept`: the store keeps the
    /// lease while the guard lives (a watchdog-managed lease). `watch` is made by the first
    /// `lost()` call.
    Local {
        grant: Grant,
        kept: Flag,
        /// The index of the name's slot in the store (`usize::MAX`: look it up).
        slot: usize,
        watch: OnceLock<Arc<LocalWatch>>,
    },
}

impl LockGuard {
    /// Wraps a grant in a guard and enrols it with the client's watchdog: renewed at TTL/3 if
    /// `renew_ttl` is set, watched for safe-until either way. Must run inside a Tokio runtime.
    pub(crate) fn new(
        backend: Arc<dyn DistributedLock>,
        grant: Grant,
        renew_ttl: Option<Duration>,
        leased: bool,
    ) -> Self {
        let until = leased.then(|| safe_until(grant.sent_at, grant.ttl));
        backend.core().note_runtime();
        let state = Arc::new(GrantState::new(backend.core().backend(), grant, until));
        let entry = backend.core().watchdog().register(
            Arc::downgrade(&backend),
            state.clone(),
            renew_ttl,
            until,
        );
        Self {
            backend,
            held: Held::Watched { state, entry },
            done: Flag::NO,
        }
    }

    /// Wraps a grant of the in-memory backend (`backend.in_process()` is `Some`), whose store
    /// looks after the lease: no watchdog enrolment.
    pub(crate) fn local(
        backend: Arc<dyn DistributedLock>,
        grant: Grant,
        kept: bool,
        slot: usize,
    ) -> Self {
        Self {
            backend,
            held: Held::Local {
                grant,
                kept: Flag::of(kept),
                slot,
                watch: OnceLock::new(),
            },
            done: Flag::NO,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.grant().name
    }

    /// The owner holding it.
    pub fn owner(&self) -> &OwnerId {
        &self.grant().owner
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.grant().token
    }

    /// The owner's hold count right after this acquire.
    pub fn hold_count(&self) -> u32 {
        self.grant().hold_count
    }

    /// The lease the server granted.
    pub fn ttl(&self) -> Duration {
        self.grant().ttl
    }

    /// The grant as the backend reported it.
    pub fn grant(&self) -> &Grant {
        match &self.held {
            Held::Watched { state, .. } => &state.grant,
            Held::Local { grant, .. } => grant,
        }
    }

    /// The store's view of an in-process guard's grant.
    fn local_status(&self, watch: Option<&Arc<LocalWatch>>) -> Option<LocalStatus> {
        match &self.held {
            Held::Local { grant, kept, .. } => Some(match self.backend.in_process() {
                Some(mem) => mem.local_status(grant, kept.get(), watch),
                None => LocalStatus::Lost(LostReason::ClientGone),
            }),
            Held::Watched { .. } => None,
        }
    }

    /// The monotonic instant until which this guard may claim the lock: when the last
    /// successful acquire or renew request was sent, plus its lease, minus a drift margin.
    /// `None` on backends whose locks never expire. (An in-memory lock whose lease the store
    /// keeps is renewed continuously: a full lease from now, while it is held.)
    pub fn safe_until(&self) -> Option<Instant> {
        match &self.held {
            Held::Watched { state, .. } => state.safe_until(),
            Held::Local { grant, .. } => Some(match self.local_status(None) {
                Some(LocalStatus::Held(Some(until))) => until,
                Some(LocalStatus::Held(None)) => safe_until(Instant::now(), grant.ttl),
                _ => safe_until(grant.sent_at, grant.ttl),
            }),
        }
    }

    /// Whether the lock is lost (or safe-until has passed). Once true, stays true.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        match &self.held {
            Held::Watched { state, .. } => state.reason(),
            Held::Local { .. } => match self.local_status(None) {
                Some(LocalStatus::Lost(why)) => Some(why),
                _ => None,
            },
        }
    }

    /// Resolves when the lock is lost, at once if it already is. It does not borrow the guard,
    /// so it can be raced against the critical section or handed to another task; if the guard
    /// is released first, it resolves to [`LostReason::Released`].
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        match &self.held {
            Held::Watched { state, .. } => Either::Left(watch_state(state.clone())),
            Held::Local {
                grant, kept, watch, ..
            } => {
                let watch = watch.get_or_init(Default::default).clone();
                Either::Right(watch_local(
                    self.backend.clone(),
                    grant.clone(),
                    kept.get(),
                    watch,
                ))
            }
        }
    }

    /// Extends the lease so that it lasts **at least** `ttl` from now, for a fixed lease
    /// (watchdog-managed leases are renewed for you). A lease never gets shorter: asking for less
    /// than is left keeps what is left, on the server and in [`safe_until`](Self::safe_until)
    /// alike, so the guard never believes it holds longer than the server does, and other holds
    /// of a re-entered lock keep the lease they were given. Fails with `Lost` if the lock is no
    /// longer held, and the guard then reports lost.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::grant::check_ttl(ttl).map_err(|e| e.with_lock(self.name()))?;
        let sent = Instant::now();
        let renewed = self.backend.renew(self.grant(), ttl).await;
        let state = match &self.held {
            Held::Watched { state, .. } => Some(state),
            // The store has the lease, and tells the guard.
            Held::Local { .. } => None,
        };
        match renewed {
            Ok(granted) => {
                if let Some(state) = state {
                    state.extend(safe_until(sent, granted));
                }
                Ok(())
            }
            Err(e) => {
                let e = context(e, &*self.backend, self.name());
                if let Some(state) = state {
                    if matches!(e.kind(), ErrorKind::Lost | ErrorKind::NotHeld) {
                        state.fire(LostReason::Taken(e.to_string()));
                    }
                }
                Err(e)
            }
        }
    }

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
        crate::ext::reenter(&self.backend, self, &LockOptions::new()).await
    }

    /// Like [`reenter`](Self::reenter), with `options`' lease for the new hold (its wait bound
    /// is ignored; an owner in it is `InvalidArgument`: the hold's owner is this guard's).
    pub async fn reenter_with(&self, options: &LockOptions) -> Result<LockGuard> {
        crate::ext::reenter(&self.backend, self, options).await
    }

    /// Releases one hold of the lock. `Ok(true)` if it was still held (by this grant) until
    /// now, `Ok(false)` if it had already been lost.
    ///
    /// A release the server does not answer ([`ErrorKind::Unavailable`]) may or may not have
    /// been applied. On backends with per-lock leases it is sent again in the background until
    /// the server answers or the lease has run out, so the lock never stays held for a whole
    /// lease by a guard that is gone; session-bound backends do the same until their session
    /// ends.
    ///
    /// An in-memory guard is released when this is called; otherwise when the future is first
    /// polled (dropped unpolled, the guard is dropped, and releases as a dropped guard does).
    pub fn release(mut self) -> impl Future<Output = Result<bool>> + Send + 'static {
        if let Held::Local { .. } = self.held {
            self.done = Flag::YES;
            let released = self.give_up().unwrap_or(false);
            crate::observe::released_metrics(
                crate::memory::BACKEND,
                if released { "released" } else { "not_held" },
            );
            return Either::Left(Released(Flag::of(released)));
        }
        Either::Right(Box::pin(async move {
            self.done = Flag::YES;
            self.give_up();
            let grant = self.grant();
            let backend = self.backend.core().backend();
            let released = crate::settle::release(&self.backend, grant).await;
            crate::observe::released(backend, grant.name.as_str(), grant.token.0, Some(&released));
            released.map_err(|e| context(e, &*self.backend, &grant.name))
        }))
    }

    /// Takes the guard off whoever looks after it and tells any `lost()` future still watching
    /// it. An in-process guard's release is done on the spot: `Some(still held)`.
    fn give_up(&self) -> Option<bool> {
        match &self.held {
            Held::Watched { state, entry } => {
                self.backend.core().watchdog().deregister(*entry);
                // With the watchdog's copy gone, a state nobody else shares has nobody to
                // tell, and the lock and wake-up are skipped.
                if Arc::strong_count(state) > 1 {
                    state.fire(LostReason::Released);
                }
                None
            }
            Held::Local {
                grant,
                kept,
                slot,
                watch,
            } => {
                // Marked before the store lets go, so a `lost()` future the store wakes sees
                // a release, not a loss.
                let watch = watch.get();
                if let Some(w) = watch {
                    w.released.store(true, Ordering::Release);
                }
                let released = self
                    .backend
                    .in_process()
                    .is_some_and(|mem| mem.release_now(grant, kept.get(), *slot));
                if let Some(w) = watch {
                    w.changed.notify_waiters();
                }
                Some(released)
            }
        }
    }
}

/// The future of an in-process release, which is done when the future is made: whether the
/// lock was still held. (A `Ready<Result<bool>>` here was copied byte-wise, as [`Flag`] says.)
struct Released(Flag);

impl Future for Released {
    type Output = Result<bool>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<bool>> {
        Poll::Ready(Ok(self.0.get()))
    }
}

/// `lost()` of a watchdog-watched guard.
async fn watch_state(state: Arc<GrantState>) -> LostReason {
    loop {
        // Registered before the check, so a change between the two is not missed.
        let changed = state.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if let Some(r) = state.reason() {
            return r;
        }
        let until = state.safe_until();
        tokio::select! {
            _ = changed => {}
            _ = sleep_until(until) => {}
        }
    }
}

/// `lost()` of an in-process guard: the store tells `watch` when the holder goes, the guard
/// when it is released, and a fixed lease runs out at its safe-until.
async fn watch_local(
    backend: Arc<dyn DistributedLock>,
    grant: Grant,
    kept: bool,
    watch: Arc<LocalWatch>,
) -> LostReason {
    let Some(mem) = backend.in_process() else {
        return LostReason::ClientGone;
    };
    loop {
        let changed = watch.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if watch.released.load(Ordering::Acquire) {
            return LostReason::Released;
        }
        let until = match mem.local_status(&grant, kept, Some(&watch)) {
            LocalStatus::Lost(why) => return why,
            LocalStatus::Held(until) => until,
        };
        tokio::select! {
            _ = changed => {}
            _ = sleep_until(until) => {}
        }
    }
}

/// Sleeps until `until`, or forever.
async fn sleep_until(until: Option<Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done.get() {
            return;
        }
        if self.give_up().is_some() {
            crate::observe::released_metrics(crate::memory::BACKEND, "dropped");
            return;
        }
        let g = self.grant();
        crate::observe::released(
            self.backend.core().backend(),
            g.name.as_str(),
            g.token.0,
            None,
        );
        // Dropped where no runtime runs (a plain thread), the release goes to the runtime the
        // client's guards were made on: session-bound locks (ZooKeeper, etcd) would otherwise
        // stay held for as long as the client lives. Spawning through a handle needs no
        // runtime on this thread and never blocks.
        let grant = self.grant().clone();
        match self.backend.core().runtime() {
            Some(handle) => {
                let backend = self.backend.clone();
                handle.spawn(async move {
                    let _ = crate::settle::release(&backend, &grant).await;
                });
            }
            // Nothing can send the release: the lease ends the hold.
            None => self
                .backend
                .core()
                .holds()
                .remove(&grant.name, &grant.owner),
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.grant().name)
            .field("owner", &self.grant().owner)
            .field("token", &self.grant().token)
            .field("hold_count", &self.grant().hold_count)
            .field("lost", &self.lost_reason())
            .finish()
    }
}

/// Adds the backend and lock to an error from a backend primitive.
pub(crate) fn context(e: Error, backend: &dyn DistributedLock, name: &LockName) -> Error {
    e.with_backend(backend.core().backend()).with_lock(name)
}
