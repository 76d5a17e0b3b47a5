//! The guard a successful acquire returns.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::error::LostReason;
use crate::error::{Error, Result};
use crate::grant::{FencingToken, Grant};
use crate::keeper::Hold;
use crate::lock::{DistributedLock, LeaseKeeper};
use crate::name::{LockName, OwnerId};

/// A held lock. Dropping it releases the lock in the background, on the caller's Tokio runtime
/// or, on a thread without one, on the runtime the guard was made on (if none runs, the lease
/// ends the hold); it never blocks and never panics.
///
/// Check [`is_lost`](LockGuard::is_lost) (or race your work against
/// [`lost`](LockGuard::lost)) before acting on the protected resource, and pass
/// [`token`](LockGuard::token) along so the resource can reject a stale holder.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    pub(crate) backend: Arc<dyn DistributedLock>,
    hold: Hold,
    /// Released: nothing left for `drop` to do.
    done: bool,
}

impl LockGuard {
    /// Hands a fresh grant to the backend's keeper ([`DistributedLock::keeper`]): renewed with
    /// `renew_ttl` if it is set, watched for safe-until if `leased`. Must run inside a Tokio
    /// runtime.
    pub(crate) fn new(
        backend: Arc<dyn DistributedLock>,
        grant: Grant,
        renew_ttl: Option<Duration>,
        leased: bool,
    ) -> Self {
        let hold = backend.keeper().keep(&backend, grant, renew_ttl, leased);
        Self::kept(backend, hold)
    }

    /// A guard of a hold its keeper has already taken charge of.
    pub(crate) fn kept(backend: Arc<dyn DistributedLock>, hold: Hold) -> Self {
        Self {
            backend,
            hold,
            done: false,
        }
    }

    fn keeper(&self) -> &dyn LeaseKeeper {
        self.backend.keeper()
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
        &self.hold.grant
    }

    /// The monotonic instant until which this guard may claim the lock: when the last
    /// successful acquire or renew request was sent, plus its lease, minus a drift margin.
    /// `None` on backends whose locks never expire. (An in-memory lock whose lease the store
    /// keeps is renewed continuously: a full lease from now, while it is held.)
    pub fn safe_until(&self) -> Option<Instant> {
        self.keeper().safe_until(&self.hold)
    }

    /// Whether the lock is lost (or safe-until has passed). Once true, stays true.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.keeper().lost_reason(&self.hold)
    }

    /// Resolves when the lock is lost, at once if it already is. It does not borrow the guard,
    /// so it can be raced against the critical section or handed to another task; if the guard
    /// is released first, it resolves to [`LostReason::Released`].
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.hold.shared(self.backend.core().backend());
        watch(self.backend.clone(), self.hold.clone())
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
        let renewed = renewed.map_err(|e| context(e, &*self.backend, self.name()));
        self.keeper().extended(&self.hold, sent, &renewed);
        renewed.map(|_| ())
    }

    /// Tells this guard that a server's answer found its hold gone (`why`), as an extend that
    /// finds it gone does: `lost()` fires now, not at the next renewal.
    pub(crate) fn found_gone(&self, why: &Error) {
        let told = Err(Error::new(crate::error::ErrorKind::Lost, why.to_string()));
        self.keeper().extended(&self.hold, Instant::now(), &told);
    }

    /// Releases one hold of the lock. `Ok(true)` if it was still held (by this grant) until
    /// now, `Ok(false)` if it had already been lost.
    ///
    /// A release the server does not answer ([`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable)) may or may not have
    /// been applied. On backends with per-lock leases it is sent again in the background until
    /// the server answers or the lease has run out, so the lock never stays held for a whole
    /// lease by a guard that is gone; session-bound backends do the same until their session
    /// ends.
    ///
    /// The release starts when the future is first polled (dropped unpolled, the guard is
    /// dropped, and releases as a dropped guard does).
    pub async fn release(mut self) -> Result<bool> {
        self.done = true;
        self.keeper().let_go(&self.hold);
        let grant = self.grant();
        let backend = self.backend.core().backend();
        let span = crate::observe::release_span(backend, grant.name.as_str(), grant.token.0);
        let released = crate::release::release(&self.backend, grant)
            .instrument(span.clone())
            .await;
        span.in_scope(|| {
            crate::observe::released(backend, grant.name.as_str(), grant.token.0, Some(&released))
        });
        released.map_err(|e| context(e, &*self.backend, &grant.name))
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.keeper().let_go(&self.hold);
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
                    let _ = crate::release::release(&backend, &grant).await;
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

/// `lost()` of any guard: asks the keeper, and sleeps until it says to look again or tells of a
/// change.
pub(crate) async fn watch(backend: Arc<dyn DistributedLock>, hold: Hold) -> LostReason {
    let Some(shared) = hold.shared.get().cloned() else {
        return LostReason::ClientGone;
    };
    loop {
        // Registered before the look, so a change between the two is not missed.
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if shared.is_released() {
            return LostReason::Released;
        }
        let until = match backend.keeper().watch(&hold) {
            Err(why) => return why,
            Ok(until) => until,
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
