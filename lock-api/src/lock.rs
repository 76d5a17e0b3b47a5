//! The trait every backend implements, and the per-client state every backend embeds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::backend::wait::{Attempt, HandOver, Notices};
use crate::capability::{Capabilities, Profile};
use crate::error::{Error, ErrorKind, LostReason, Result};
use crate::grant::{safe_until, AcquireRequest, FencingToken, Grant, LockInfo, Surplus};
use crate::keeper::{Hold, HoldState, Holds};
use crate::name::{LockName, OwnerId};
use crate::wakes::LocalWakes;
use crate::watchdog::{Renewer, Watchdog};

/// The default lease of a watchdog-managed lock, when neither the client nor the caller set one.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The primitives a lock backend implements. Users call the conveniences of
/// [`LockExt`](crate::LockExt) on an `Arc` of it, which validate input, build the
/// [`LockGuard`](crate::LockGuard) and enrol it with the client's watchdog.
///
/// # Contract
///
/// An implementation is one *client handle*: it owns its connections and one
/// [`ClientCore`] (default owner id, default TTL, watchdog), and it keeps these promises, which
/// the `distlock-conformance` suite checks case by case:
///
/// - **Mutual exclusion.** At most one owner holds a name at any instant of the server's clock.
///   Owners are per acquisition ([`ClientCore::owner_for`]): the conveniences give every
///   acquisition without an explicit owner an owner id of its own, so two tasks sharing this
///   handle exclude each other exactly as two clients do. Re-entry is explicit
///   ([`LockGuard::reenter`](crate::LockGuard::reenter), or an explicit owner, which is
///   qualified by the handle that uses it): **an owner id re-enters only on the handle that
///   made it**; another handle asking with the same label is answered like anyone else. The
///   backend itself needs nothing for this: it compares [`AcquireRequest::owner`] as given.
/// - **Server-side expiry.** A grant's lease is judged by the server's clock, never by comparing
///   client wall clocks. [`Grant::sent_at`] is the monotonic instant the winning request was
///   *sent*, so that `sent_at + ttl - drift` is a safe lower bound of the server's expiry.
/// - **Conditional mutations.** `release` and `renew` act only if the grant (owner, token and
///   [`Grant::key`]) still holds the lock, checked atomically on the server; a stale or repeated
///   release of an old grant never frees a newer holder.
/// - **Reentrancy** (if [`Capabilities::reentrant`]): the holder re-acquiring adds one to its
///   hold count and gets the *same* token; `release` takes one away and frees at zero. Without
///   reentrancy, a re-acquire by the holder is answered like anyone else's.
/// - **Fencing** (if [`Capabilities::fencing`] is not `None`): every fresh grant's token is
///   strictly greater than every token issued earlier for the same name.
/// - **Waiting.** `attempt` never waits. The conveniences wait with attempts, polling or woken
///   by the server's notices as [`Profile::waiting`](crate::Profile::waiting) says, up to the wait
///   bound, then fail with [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) within one round
///   trip; a dropped wait leaves nothing behind (the core releases a grant that raced the
///   cancellation). A backend with a queue on the server ([`Waiting::Queue`](crate::backend::wait::Waiting::Queue)) waits in its own
///   [`acquire`](DistributedLock::acquire), which keeps the same promises.
/// - **Errors.** An unreachable server is
///   [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) within the connect timeout; a
///   renew that finds the lock gone is [`ErrorKind::Lost`](crate::ErrorKind::Lost).
/// - **Lost signal.** When the backend learns that grants ended behind their guards' backs
///   (session expiry, lease revoked), it calls [`ClientCore::mark_lost`].
///
/// Input reaching these methods is already validated ([`LockName`], [`OwnerId`], TTL bounds).
#[async_trait]
pub trait DistributedLock: Send + Sync + 'static {
    /// Everything this client handle says about itself: what it promises, how its acquires
    /// wait, whether it hands locks over, how many grants one renewal confirms.
    fn profile(&self) -> Profile;

    /// What this backend promises: [`profile`](Self::profile)'s capabilities. Not for
    /// overriding: a backend says it in its profile.
    fn capabilities(&self) -> Capabilities {
        self.profile().capabilities
    }

    /// The per-client state: backend name, default owner id, default TTL, watchdog.
    fn core(&self) -> &ClientCore;

    /// One acquire request: the lock is granted if it is free (or held by `req.owner`, on
    /// reentrant backends), else the answer says who holds it for how long
    /// ([`Attempt::Held`], with the holder's remaining lease where the server tells it). Never
    /// waits for the lock. The conveniences make it cancellation-safe (a grant that lands after
    /// the caller went away is released) and wait with it as [`Profile::waiting`](crate::Profile::waiting) says,
    /// so a backend implements only its server's request.
    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt>;

    /// Subscribes to notices that `name` may have come free, for [`Waiting::Notify`](crate::backend::wait::Waiting::Notify): made
    /// before the attempt that follows it, so a release in between is not missed.
    ///
    /// A [`Waiting::Poll`](crate::backend::wait::Waiting::Poll) backend may have notices too, for some holds or some servers (a
    /// wait channel the holder keeps, a change stream where the server has them): its waiter
    /// subscribes after an attempt found the lock held, attempts once more, and then waits for
    /// the notices instead of the backoff step. Such notices must themselves fall back to a
    /// backoff where the server has nothing to tell for the hold, and the capability says
    /// [`Blocking::Signal`](crate::Blocking::Signal). An error here (the default's
    /// `Unsupported` included) leaves the waiter polling.
    async fn subscribe(&self, name: &LockName) -> Result<Box<dyn Notices>> {
        let _ = name;
        Err(Error::new(
            ErrorKind::Unsupported,
            "this backend's server sends no notices",
        ))
    }

    /// For [`Waiting::Queue`](crate::backend::wait::Waiting::Queue): takes a place in the server's queue for the lock and waits up to
    /// `wait` for it ([`ErrorKind::Timeout`](crate::ErrorKind::Timeout) after that, within one
    /// round trip). Dropping the future at any await point must leave nothing behind: no queue
    /// entry, and no grant without a caller.
    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        let _ = (req, wait);
        Err(Error::new(
            ErrorKind::Unsupported,
            "this backend has no queue of its own: it waits by attempts",
        ))
    }

    /// Gives up one hold of `grant`. `Ok(true)` if the grant still held the lock (and one hold
    /// was taken away), `Ok(false)` if it no longer did (expired, taken over, released before).
    async fn release(&self, grant: &Grant) -> Result<bool>;

    /// Gives up `from`'s hold and, if that was its last one, grants the lock to `to` — a waiter
    /// of this same handle for the same name — in the same atomic step on the server, with a
    /// fencing token greater than `from`'s and `to.ttl` as the lease (counted from this
    /// request's send). Conditional like [`release`](Self::release): a `from` that no longer
    /// holds the lock changes nothing and is [`HandOver::Released(false)`](HandOver::Released).
    /// A `from` with holds left loses one and passes nothing on. Called only where
    /// the profile's [`Profile::hands_over`] says so; the default is a plain release.
    ///
    /// One request for a hand-off between tasks of one process, where a release and the
    /// waiter's next attempt take two. Only for backends without a fair queue: the waiter goes
    /// before waiters of other handles.
    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        let _ = to;
        Ok(HandOver::Released(self.release(from).await?))
    }

    /// Who keeps this backend's guards once acquired ([`LeaseKeeper`]): the client's watchdog,
    /// the default, which renews their leases against the server and fires `lost()`. The
    /// in-memory backend's store keeps its own. A backend that wraps another forwards it when
    /// the inner backend's guards should stay as they are.
    fn keeper(&self) -> &dyn LeaseKeeper {
        self.core().watchdog_keeper()
    }

    /// Extends `grant`'s lease to at least `ttl` from now, if it still holds the lock, and
    /// returns the lease the server granted. It never shortens the server's lease: the server
    /// keeps the later of its current expiry and now + `ttl`, and the conditions (owner, token,
    /// key) are checked atomically with the change. A grant that no longer holds the lock is
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost). Session-bound backends confirm the grant and
    /// return the session's lease.
    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration>;

    /// Renews every `(grant, ttl)` of `grants` as [`renew`](Self::renew) would, and returns one
    /// result per grant, in order. The default renews them one after another; a backend that
    /// raises [`Profile::renew_batch`] overrides it with one request per batch.
    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        let mut results = Vec::with_capacity(grants.len());
        for (grant, ttl) in grants {
            results.push(self.renew(grant, *ttl).await);
        }
        results
    }

    /// Makes `value` the value of the election `grant` leads, if `grant` (owner, token and
    /// [`Grant::key`]) still holds the name, checked atomically on the server with the write;
    /// `Ok(false)` if it no longer does (its lease ended, it was released or force-released), so
    /// a deposed leader's proclaim changes nothing. [`inspect`](Self::inspect) then reports the
    /// value as [`LockInfo::value`] while this grant holds, and never for a later grant: a
    /// backend stores the value with the grant's token and reports it only while that token is
    /// the holder's. Called only where [`Capabilities::election`] says so; the default is
    /// [`ErrorKind::Unsupported`]. The value is at most
    /// [`MAX_VALUE_LEN`](crate::grant::MAX_VALUE_LEN) bytes (checked before the call).
    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        let _ = (grant, value);
        Err(Error::new(
            ErrorKind::Unsupported,
            "this backend keeps no leader's value",
        ))
    }

    /// Who holds `name`, with hold count, token and remaining lease; `None` if it is free.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>>;

    /// Every held lock whose name starts with `prefix` (every one for `""`), with what
    /// [`inspect`](Self::inspect) says of it, in name order. A snapshot read while locks come
    /// and go, not one atomic view. [`ErrorKind::Unsupported`] where the server cannot
    /// enumerate its locks (the default).
    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let _ = prefix;
        Err(Error::new(
            ErrorKind::Unsupported,
            "this backend cannot enumerate its locks",
        ))
    }

    /// An operator's escape hatch: frees `name` whatever its holder's hold count, but only
    /// while its current grant carries `token`, so a lock that changed hands since the operator
    /// looked is left alone. `Ok(true)` if the grant of `token` held the lock and now does not,
    /// `Ok(false)` if the lock was free or held under another token. Waiters are woken as by a
    /// release; the holder's guard learns of it at its next renewal, and its `lost()` fires.
    ///
    /// Where a release needs no [`Grant::key`],
    /// [`backend::force_release_by_releases`](crate::backend::force_release_by_releases) is the
    /// whole implementation.
    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool>;

    /// Settles a request whose answer was lost, by taking away at most one hold: the one an
    /// acquire of `surplus.name` by `surplus.owner` may have added, or the one a release was
    /// taking away. It takes one only if the server has it: if the owner has more holds there
    /// than this handle accounts for, the released ones aside ([`ClientCore::has_surplus`], read
    /// *after* the server's count). `Ok(true)` if one was taken, `Ok(false)` if there is none (yet).
    ///
    /// The conveniences call it in the background until the lease asked for has run out (after
    /// that, a grant the server applied late has expired by itself), on backends with per-lock
    /// leases; session-bound backends clean up with their session. Where a release needs no
    /// [`Grant::key`], [`backend::give_back_by_release`](crate::backend::give_back_by_release)
    /// is the whole implementation.
    async fn give_back(&self, surplus: &Surplus) -> Result<bool>;
}

/// The state every client handle carries, written once here for every backend: the backend's
/// name (for errors), the default owner id, the default lease TTL, and the one watchdog task
/// that renews every lock this client holds.
pub struct ClientCore {
    backend: &'static str,
    owner: OwnerId,
    /// This handle's tag, which qualifies the explicit owner ids it is given.
    handle: u64,
    default_ttl: Duration,
    watchdog: Watchdog<dyn DistributedLock>,
    /// The runtime this client's guards were made on: a guard dropped where no runtime runs
    /// hands its release to it.
    runtime: OnceLock<tokio::runtime::Handle>,
    /// The holds this handle's guards and acquires in flight account for.
    holds: Holds,
    /// This handle's polling waiters, which its releases wake at once.
    wakes: LocalWakes,
}

impl ClientCore {
    /// A core for a client of `backend`, with a readable owner id of its own
    /// ([`OwnerId::for_this_process`]) and [`DEFAULT_TTL`].
    pub fn new(backend: &'static str) -> Self {
        Self {
            backend,
            owner: OwnerId::for_this_process(),
            // 32 random bits, never 0: short in the stored text, and two handles given one
            // explicit owner collide with a chance of 2^-32.
            handle: u64::from(fastrand::u32(..) | 1),
            default_ttl: DEFAULT_TTL,
            watchdog: Watchdog::new(),
            runtime: OnceLock::new(),
            holds: Holds::default(),
            wakes: LocalWakes::default(),
        }
    }

    /// Uses `owner` as the client's owner id.
    pub fn with_owner(mut self, owner: OwnerId) -> Self {
        self.owner = owner;
        self
    }

    /// Uses `ttl` as the default lease of watchdog-managed locks.
    pub fn with_default_ttl(mut self, ttl: Duration) -> Result<Self> {
        crate::grant::check_ttl(ttl)?;
        self.default_ttl = ttl;
        Ok(self)
    }

    /// The backend's name, as errors show it.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The client's owner id: the label of the owner ids of its acquisitions.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// A fresh owner id for one acquisition: the client's label and a number of its own.
    pub fn next_owner(&self) -> OwnerId {
        self.owner.acquisition(next_acquisition())
    }

    /// The owner id an acquisition asks as: a fresh one of its own when `explicit` is `None`;
    /// an explicit label qualified by this handle; an id this handle made (a guard's owner, for
    /// re-entry) as it is. An id tagged by another handle is `InvalidArgument`: owner ids
    /// re-enter only on the handle that made them.
    pub fn owner_for(&self, explicit: Option<&OwnerId>) -> Result<OwnerId> {
        let Some(id) = explicit else {
            return Ok(self.next_owner());
        };
        if !id.is_tagged() {
            return Ok(id.on_handle(self.handle));
        }
        if self.made(id) {
            return Ok(id.clone());
        }
        Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "owner id {id} was made by another client handle: an owner re-enters only on \
                 the handle that holds, so pass a plain label (or re-enter through the guard)"
            ),
        ))
    }

    /// Whether `id` is one this handle made: one of its acquisitions' or an explicit label it
    /// qualified.
    pub fn made(&self, id: &OwnerId) -> bool {
        id.is_handle_tag(self.handle)
            || (id.is_acquisition_tag() && id.label() == self.owner.label())
    }

    /// Remembers the runtime this client runs on, for guards dropped outside it. Called when
    /// a guard is made, which is always inside a runtime.
    pub(crate) fn note_runtime(&self) {
        if self.runtime.get().is_none() {
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                let _ = self.runtime.set(h);
            }
        }
    }

    /// The runtime to hand a dropped guard's release to: the caller's, else the client's.
    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.runtime.get().cloned())
    }

    /// How many holds of `name` by `owner` this handle accounts for: its live guards (of
    /// networked backends), its acquires in flight and its releases not yet settled. A
    /// [`give_back`](DistributedLock::give_back) leaves that many, those it releases aside: it
    /// takes away only the surplus that lost requests left.
    pub fn holds_accounted(&self, name: &LockName, owner: &OwnerId) -> u32 {
        self.holds.of(name, owner)
    }

    /// Whether the server's `count` of the owner's holds on the name includes `surplus`: more
    /// than this handle accounts for, not counting those [leaving](Surplus::leaving). Call it
    /// *after* reading the server's count (see [`DistributedLock::give_back`]).
    pub fn has_surplus(&self, surplus: &Surplus, count: u32) -> bool {
        count + surplus.leaving > self.holds_accounted(&surplus.name, &surplus.owner)
    }

    /// Counts one more hold of `name` by `owner`, until [`uncount_hold`](Self::uncount_hold).
    /// For a backend whose release returns before every server it was sent to has answered
    /// (RedLock decides at a majority): the hold stays counted until they have, so that a
    /// give-back meanwhile, which reads each server's count against this handle's, does not
    /// take the hold a server is about to release as a surplus, and then that one too.
    pub fn count_hold(&self, name: &LockName, owner: &OwnerId) {
        self.holds.add(name, owner);
    }

    /// Ends one [`count_hold`](Self::count_hold).
    pub fn uncount_hold(&self, name: &LockName, owner: &OwnerId) {
        self.holds.remove(name, owner);
    }

    pub(crate) fn holds(&self) -> &Holds {
        &self.holds
    }

    pub(crate) fn wakes(&self) -> &LocalWakes {
        &self.wakes
    }

    /// The default lease of watchdog-managed locks.
    pub fn default_ttl(&self) -> Duration {
        self.default_ttl
    }

    /// This client's watchdog as a [`LeaseKeeper`]: what [`DistributedLock::keeper`] returns
    /// unless a backend keeps its guards itself, and what a wrapper returns to put another
    /// backend's guards in the watchdog's care.
    pub fn watchdog_keeper(&self) -> &dyn LeaseKeeper {
        &self.watchdog
    }

    /// Fires `lost()` on every live guard of this client whose grant matches `which`, and stops
    /// renewing them: for backends that learn of loss themselves (session expiry, lease gone).
    pub fn mark_lost(&self, which: impl Fn(&Grant) -> bool, reason: LostReason) {
        self.watchdog.mark_lost(which, reason);
    }

    /// How many guards this client's watchdog is looking after (none of the in-memory
    /// backend's own: its store looks after them).
    pub fn guards_watched(&self) -> usize {
        self.watchdog.len()
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

    /// Stops looking after the guard, whose release goes to the server now, and tells its
    /// `lost()` futures that it was given up.
    fn let_go(&self, hold: &Hold);
}

pub(crate) mod sealed {
    /// Only lock-api's keepers: the watchdog (here) and the in-memory store (in memory/keeper.rs).
    pub trait Sealed {}
    impl Sealed for crate::watchdog::Watchdog<dyn super::DistributedLock> {}
}

/// The networked backends' keeper: guards are enrolled with the client's watchdog, which renews
/// a watchdog-managed lease and fires `lost()`; their releases go to the server.
impl LeaseKeeper for Watchdog<dyn DistributedLock> {
    fn keep(
        &self,
        backend: &Arc<dyn DistributedLock>,
        grant: Grant,
        renew: Option<Duration>,
        leased: bool,
    ) -> Hold {
        let until = leased.then(|| safe_until(grant.sent_at, grant.ttl));
        let core = backend.core();
        core.note_runtime();
        let state = Arc::new(HoldState::new(core.backend(), until));
        let entry = self.register(
            Arc::downgrade(backend),
            grant.clone(),
            state.clone(),
            renew,
            until,
        );
        Hold::shared_with(grant, entry, renew.is_some(), state)
    }

    fn safe_until(&self, hold: &Hold) -> Option<Instant> {
        hold.shared.get().and_then(|s| s.safe_until())
    }

    fn lost_reason(&self, hold: &Hold) -> Option<LostReason> {
        match hold.shared.get() {
            Some(s) => s.reason(),
            None => Some(LostReason::ClientGone),
        }
    }

    fn watch(&self, hold: &Hold) -> std::result::Result<Option<Instant>, LostReason> {
        match hold.shared.get() {
            Some(s) => s.reason().map_or(Ok(s.safe_until()), Err),
            None => Err(LostReason::ClientGone),
        }
    }

    fn extended(&self, hold: &Hold, sent: Instant, outcome: &Result<Duration>) {
        let Some(state) = hold.shared.get() else {
            return;
        };
        match outcome {
            Ok(granted) => state.extend(safe_until(sent, *granted)),
            Err(e) if matches!(e.kind(), ErrorKind::Lost | ErrorKind::NotHeld) => {
                state.fire(LostReason::Taken(e.to_string()), &hold.grant);
            }
            Err(_) => {}
        }
    }

    fn let_go(&self, hold: &Hold) {
        self.deregister(hold.ticket);
        // With the watchdog's copy gone, a state nobody else shares has nobody to tell.
        if let Some(state) = hold.shared.get().filter(|s| Arc::strong_count(s) > 1) {
            state.mark_released();
            state.changed.notify_waiters();
        }
    }
}

/// The watchdog renews through the backend's own calls.
impl Renewer for dyn DistributedLock {
    fn label(&self) -> &'static str {
        self.core().backend()
    }

    fn batch_size(&self) -> usize {
        self.profile().renew_batch
    }

    fn renew_one<'a>(&'a self, grant: &'a Grant, ttl: Duration) -> BoxFuture<'a, Result<Duration>> {
        self.renew(grant, ttl)
    }

    fn renew_all<'a>(
        &'a self,
        grants: &'a [(Grant, Duration)],
    ) -> BoxFuture<'a, Vec<Result<Duration>>> {
        self.renew_many(grants)
    }
}

/// How many acquisition numbers a thread takes from the process-wide counter at a time.
const NUMBERS_PER_BLOCK: u64 = 1 << 16;

/// The next acquisition number: unique in the process (so unique for every client label), at
/// least 1 and below 2^63. Each thread hands out numbers from a block of its own, so a lock
/// cycle pays a thread-local increment rather than an atomic one on a counter that every
/// thread of a busy client shares.
fn next_acquisition() -> u64 {
    static BLOCKS: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static NEXT: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    NEXT.with(|next| {
        let (mut at, mut end) = next.get();
        if at == end {
            // Relaxed: only uniqueness matters, which the atomic increment gives by itself.
            let block = BLOCKS.fetch_add(1, Ordering::Relaxed);
            at = block * NUMBERS_PER_BLOCK + 1;
            end = at + NUMBERS_PER_BLOCK;
        }
        next.set((at + 1, end));
        at
    })
}

/// A lock shared as a trait object, as the facade and the suite hold it.
pub type SharedLock = Arc<dyn DistributedLock>;
