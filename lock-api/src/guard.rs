//! The guard a successful acquire returns.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::{Error, ErrorKind, Result};
use crate::grant::{safe_until, FencingToken, Grant};
use crate::lock::DistributedLock;
use crate::name::{LockName, OwnerId};

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
    inner: Mutex<StateInner>,
    changed: Notify,
}

struct StateInner {
    safe_until: Option<Instant>,
    lost: Option<LostReason>,
}

impl GrantState {
    fn new(grant: Grant, safe_until: Option<Instant>) -> Self {
        Self {
            grant,
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
    /// The grant (`state.grant`) and what the watchdog shares of it.
    state: Arc<GrantState>,
    entry: u64,
    done: bool,
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
        let state = Arc::new(GrantState::new(grant, until));
        let entry = backend.core().watchdog().register(
            Arc::downgrade(&backend),
            state.clone(),
            renew_ttl,
            until,
        );
        Self {
            backend,
            state,
            entry,
            done: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.state.grant.name
    }

    /// The owner holding it.
    pub fn owner(&self) -> &OwnerId {
        &self.state.grant.owner
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.state.grant.token
    }

    /// The owner's hold count right after this acquire.
    pub fn hold_count(&self) -> u32 {
        self.state.grant.hold_count
    }

    /// The lease the server granted.
    pub fn ttl(&self) -> Duration {
        self.state.grant.ttl
    }

    /// The grant as the backend reported it.
    pub fn grant(&self) -> &Grant {
        &self.state.grant
    }

    /// The monotonic instant until which this guard may claim the lock: when the last
    /// successful acquire or renew request was sent, plus its lease, minus a drift margin.
    /// `None` on backends whose locks never expire.
    pub fn safe_until(&self) -> Option<Instant> {
        self.state.safe_until()
    }

    /// Whether the lock is lost (or safe-until has passed). Once true, stays true.
    pub fn is_lost(&self) -> bool {
        self.state.reason().is_some()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.state.reason()
    }

    /// Resolves when the lock is lost, at once if it already is. It does not borrow the guard,
    /// so it can be raced against the critical section or handed to another task; if the guard
    /// is released first, it resolves to [`LostReason::Released`].
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let state = self.state.clone();
        async move {
            loop {
                // Registered before the check, so a change between the two is not missed.
                let changed = state.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if let Some(r) = state.reason() {
                    return r;
                }
                let until = state.safe_until();
                let sleep = async {
                    match until {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = changed => {}
                    _ = sleep => {}
                }
            }
        }
    }

    /// Extends the lease to `ttl` from now, for a fixed lease (watchdog-managed leases are
    /// renewed for you). Fails with `Lost` if the lock is no longer held, and the guard then
    /// reports lost.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::grant::check_ttl(ttl).map_err(|e| e.with_lock(self.name()))?;
        let sent = Instant::now();
        match self.backend.renew(&self.state.grant, ttl).await {
            Ok(granted) => {
                self.state.extend(safe_until(sent, granted));
                Ok(())
            }
            Err(e) => {
                let e = context(e, &*self.backend, self.name());
                if matches!(e.kind(), ErrorKind::Lost | ErrorKind::NotHeld) {
                    self.state.fire(LostReason::Taken(e.to_string()));
                }
                Err(e)
            }
        }
    }

    /// Releases one hold of the lock. `Ok(true)` if it was still held (by this grant) until
    /// now, `Ok(false)` if it had already been lost.
    pub async fn release(mut self) -> Result<bool> {
        self.done = true;
        self.backend.core().watchdog().deregister(self.entry);
        self.released();
        let grant = &self.state.grant;
        match self.backend.release_local(grant) {
            Some(released) => released,
            None => self.backend.release(grant).await,
        }
        .map_err(|e| context(e, &*self.backend, &grant.name))
    }

    /// Marks the guard released for any `lost()` future still watching it. With the watchdog's
    /// copy of the state gone (deregistered just before), a state nobody else shares has nobody
    /// to tell, and the lock and wake-up are skipped.
    fn released(&self) {
        if Arc::strong_count(&self.state) > 1 {
            self.state.fire(LostReason::Released);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.backend.core().watchdog().deregister(self.entry);
        self.released();
        if self.backend.release_local(&self.state.grant).is_some() {
            return;
        }
        // Without a runtime there is nothing to release on; the lease expires by itself.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let backend = self.backend.clone();
            let grant = self.state.grant.clone();
            handle.spawn(async move {
                let _ = backend.release(&grant).await;
            });
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.state.grant.name)
            .field("owner", &self.state.grant.owner)
            .field("token", &self.state.grant.token)
            .field("hold_count", &self.state.grant.hold_count)
            .field("lost", &self.state.reason())
            .finish()
    }
}

/// Adds the backend and lock to an error from a backend primitive.
pub(crate) fn context(e: Error, backend: &dyn DistributedLock, name: &LockName) -> Error {
    e.with_backend(backend.core().backend()).with_lock(name)
}
