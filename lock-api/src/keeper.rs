//! Who looks after a guard once its acquire has returned: the lease keeper.
//!
//! A [`LockGuard`](crate::LockGuard) holds one kind of thing, a [`Hold`]: its grant and what
//! its keeper needs to find it again. The keeper keeps the lease (renewing a watchdog-managed
//! one), knows until when the guard may trust it, tells the guard's `lost()` futures when it
//! goes, and lets go of it when the guard is released. A networked backend's keeper is its
//! client's watchdog; the in-memory backend's is its store, which is the lock's server too, so
//! it also grants and releases on the spot. The guard asks its backend for the keeper
//! ([`DistributedLock::keeper`]) and never needs to know which one it has.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::Notify;

use crate::error::Result;
use crate::grant::{AcquireRequest, Grant};
use crate::lock::DistributedLock;
use crate::name::OwnerId;

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

/// Keeps the leases of a backend's guards. Implemented by the client's watchdog (the default
/// [`DistributedLock::keeper`]) and by the in-memory store; a backend that wraps another
/// forwards its `keeper` when it forwards the inner backend's guards as they are. Sealed: the
/// methods are the guard's, not a user's.
pub trait LeaseKeeper: Send + Sync + sealed::Sealed {
    /// Takes charge of `grant`, just acquired through `backend`: renews it with `renew` while
    /// the guard lives (`None`: a fixed lease), and watches its safe-until if `leased`.
    fn keep(
        &self,
        backend: &Arc<dyn DistributedLock>,
        grant: Grant,
        renew: Option<Duration>,
        leased: bool,
    ) -> Hold;

    /// Grants `name` to `owner` on the spot, if this keeper is the lock's server: `kept` as
    /// [`keep`](Self::keep)'s `renew.is_some()`. A keeper whose server is elsewhere hands the
    /// owner back ([`OnTheSpot::NotHere`]), and the acquire goes to the backend.
    fn grant_now(&self, name: &str, owner: OwnerId, ttl: Duration, kept: bool) -> OnTheSpot {
        let _ = (name, ttl, kept);
        OnTheSpot::NotHere(owner)
    }

    /// Waits up to `wait` for `req`'s lock in the server's own queue, if this keeper is the
    /// lock's server (`kept` as for [`grant_now`](Self::grant_now)); `None` from keepers whose
    /// server is elsewhere, whose acquires wait the way the backend says.
    fn queue_now<'a>(
        &'a self,
        req: AcquireRequest,
        wait: Duration,
        kept: bool,
    ) -> Option<BoxFuture<'a, Result<Hold>>> {
        let _ = (req, wait, kept);
        None
    }

    /// Until when the guard may claim the lock; `None` if it never expires.
    fn safe_until(&self, hold: &Hold) -> Option<Instant>;

    /// Why the lock was lost, if it was (or safe-until has passed).
    fn lost_reason(&self, hold: &Hold) -> Option<LostReason>;

    /// For a `lost()` future: the reason if the lock is lost, else the instant to look again at
    /// the latest (`None`: only when told), with the keeper set to tell the hold's shared
    /// state of anything sooner.
    fn watch(&self, hold: &Hold) -> std::result::Result<Option<Instant>, LostReason>;

    /// Takes in the outcome of the guard's own renew request, sent at `sent`.
    fn extended(&self, hold: &Hold, sent: Instant, outcome: &Result<Duration>);

    /// Releases one hold on the spot, if this keeper is the lock's server: `Some(still held)`,
    /// with the guard let go of. `None` from keepers whose server is elsewhere. `dropped`: the
    /// guard was dropped rather than released.
    fn release_now(&self, hold: &Hold, dropped: bool) -> Option<bool> {
        let _ = (hold, dropped);
        None
    }

    /// Stops looking after the guard, whose release goes to the server now, and tells its
    /// `lost()` futures that it was given up.
    fn let_go(&self, hold: &Hold);
}

/// What [`LeaseKeeper::grant_now`] did.
pub enum OnTheSpot {
    /// Granted: the guard's hold.
    Granted(Hold),
    /// Someone else holds it: the owner, back.
    Held(OwnerId),
    /// This keeper is not the lock's server: the owner, back.
    NotHere(OwnerId),
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::watchdog::Watchdog {}
    impl Sealed for crate::memory::MemoryStore {}
}

/// What a guard holds: its grant, and what its keeper needs to find it again.
#[derive(Clone)]
pub struct Hold {
    pub(crate) grant: Grant,
    /// The keeper's index for it: the watchdog's entry, the store's slot (`u64::MAX`: look it
    /// up).
    pub(crate) ticket: u64,
    /// The keeper keeps the lease while the guard lives (watchdog-managed).
    pub(crate) kept: Flag,
    /// HoldState with the keeper and the `lost()` futures: the watchdog's from the start, the
    /// store's made by the first `lost()`.
    pub(crate) shared: OnceLock<Arc<HoldState>>,
}

impl Hold {
    #[inline]
    pub(crate) fn new(grant: Grant, ticket: u64, kept: bool) -> Self {
        Self {
            grant,
            ticket,
            kept: Flag::of(kept),
            shared: OnceLock::new(),
        }
    }

    /// A hold whose state is shared with its keeper from the start.
    pub(crate) fn shared_with(
        grant: Grant,
        ticket: u64,
        kept: bool,
        state: Arc<HoldState>,
    ) -> Self {
        Self {
            grant,
            ticket,
            kept: Flag::of(kept),
            shared: OnceLock::from(state),
        }
    }

    /// The grant.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The state shared with the keeper and the `lost()` futures, made on first use.
    pub(crate) fn shared(&self, backend: &'static str) -> &Arc<HoldState> {
        self.shared
            .get_or_init(|| Arc::new(HoldState::new(backend, None)))
    }
}

/// A `bool` one word wide, for the guard's flags. A guard moves through a few futures on every
/// lock cycle; behind a `bool` field the compiler copied the seven bytes of padding in
/// overlapping pieces, which defeats the CPU's store-to-load forwarding. That cost about 10 ns
/// of a 150 ns in-memory lock cycle.
#[derive(Clone, Copy)]
pub(crate) struct Flag(usize);

impl Flag {
    pub(crate) const NO: Flag = Flag(0);
    pub(crate) const YES: Flag = Flag(1);

    pub(crate) fn of(value: bool) -> Self {
        Flag(usize::from(value))
    }

    pub(crate) fn get(self) -> bool {
        self.0 != 0
    }
}

/// The state a keeper shares with a guard and its `lost()` futures.
pub(crate) struct HoldState {
    /// The backend's name, for the lost event.
    backend: &'static str,
    inner: Mutex<StateInner>,
    pub(crate) changed: Notify,
    /// Set when the guard is given up, before the keeper lets go.
    released: AtomicBool,
}

struct StateInner {
    safe_until: Option<Instant>,
    lost: Option<LostReason>,
}

impl HoldState {
    pub(crate) fn new(backend: &'static str, safe_until: Option<Instant>) -> Self {
        Self {
            backend,
            inner: Mutex::new(StateInner {
                safe_until,
                lost: None,
            }),
            changed: Notify::new(),
            released: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StateInner> {
        // Every update is a single assignment, so a poisoned lock still holds consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn safe_until(&self) -> Option<Instant> {
        self.lock().safe_until
    }

    /// Moves safe-until later (never earlier) and wakes the `lost()` futures to take it.
    pub(crate) fn extend(&self, until: Instant) {
        let mut s = self.lock();
        if s.safe_until.is_some_and(|cur| until > cur) {
            s.safe_until = Some(until);
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// Fires the lost signal of `grant`'s guard; the first reason sticks.
    pub(crate) fn fire(&self, reason: LostReason, grant: &Grant) {
        let mut s = self.lock();
        if s.lost.is_none() {
            crate::observe::lost(self.backend, grant.name.as_str(), grant.token.0, &reason);
            s.lost = Some(reason);
            drop(s);
            self.changed.notify_waiters();
        }
    }

    pub(crate) fn is_fired(&self) -> bool {
        self.lock().lost.is_some()
    }

    /// The lost reason, or `Expired` once safe-until has passed.
    pub(crate) fn reason(&self) -> Option<LostReason> {
        let s = self.lock();
        if let Some(r) = &s.lost {
            return Some(r.clone());
        }
        s.safe_until
            .filter(|&until| Instant::now() >= until)
            .map(|_| LostReason::Expired)
    }

    /// Marks the guard given up: before the keeper lets go, so a `lost()` future woken by the
    /// keeper sees a release, not a loss.
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::Release);
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }
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
