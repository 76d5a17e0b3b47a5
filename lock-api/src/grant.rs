//! What a backend hands back: grants, fencing tokens, lock state.

use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use crate::error::{Error, ErrorKind, Result};
use crate::name::{LockName, OwnerId};

/// The longest lease a caller may ask for.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest a caller may wait for a lock.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);
/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 10_000;
/// The longest value, in bytes, a leader may proclaim.
pub const MAX_VALUE_LEN: usize = 4096;

/// A number that is strictly greater than every token issued earlier for the same lock name,
/// across release, expiry, takeover and owner changes. Pass it to the resource you protect and
/// have it reject writes carrying a smaller token than it has seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One validated acquire request, the input of [`DistributedLock`](crate::DistributedLock)'s
/// acquire primitives.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The lock.
    pub name: LockName,
    /// Who acquires it.
    pub owner: OwnerId,
    /// The lease asked for. Backends with session-bound leases ignore it.
    pub ttl: Duration,
    /// How many grants of the name may be held at once: 1 for a lock, the semaphore's `max`
    /// for a permit. A backend stores it with the name while any grant is held, and refuses a
    /// request with another number meanwhile (`InvalidArgument`).
    pub permits: u32,
    /// Whether `owner` is this acquisition's own id (made for it, as every acquisition's is
    /// unless it re-enters or names an explicit owner), so that no other request holds under
    /// it. A hold of it the server already has was then left by an earlier attempt of this
    /// acquisition whose answer was lost, and a backend may grant the lock afresh over it (a
    /// new token, one hold) instead of re-entering it: a give-back of that hold still on its
    /// way names the old token, and cannot take the new grant's. `false` (the default) for a
    /// re-entry or an explicit owner: a hold of the owner is re-entered.
    pub fresh: bool,
}

impl AcquireRequest {
    /// Builds a request for the lock (one permit), rejecting a zero or too long TTL with
    /// `InvalidArgument`.
    pub fn new(name: LockName, owner: OwnerId, ttl: Duration) -> Result<Self> {
        check_ttl(ttl).map_err(|e| e.with_lock(&name))?;
        Ok(Self {
            name,
            owner,
            ttl,
            permits: 1,
            fresh: false,
        })
    }

    /// The request of an acquisition under its own owner id ([`fresh`](Self::fresh)).
    pub fn fresh(mut self) -> Self {
        self.fresh = true;
        self
    }

    /// The request for a permit of a semaphore of `permits` (1 to [`MAX_PERMITS`]).
    pub fn with_permits(mut self, permits: u32) -> Result<Self> {
        check_permits(permits).map_err(|e| e.with_lock(&self.name))?;
        self.permits = permits;
        Ok(self)
    }
}

/// Rejects a semaphore of no permits or of more than [`MAX_PERMITS`].
pub(crate) fn check_permits(permits: u32) -> Result<()> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::invalid(format!(
            "a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"
        )));
    }
    Ok(())
}

/// Rejects a leader's value longer than [`MAX_VALUE_LEN`] bytes.
pub(crate) fn check_value(value: &str) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid(format!(
            "a leader's value is at most {MAX_VALUE_LEN} bytes, not {}",
            value.len()
        )));
    }
    Ok(())
}

/// Rejects a zero or too long lease.
pub fn check_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_millis(1) {
        return Err(Error::invalid(format!(
            "lease TTL {ttl:?} is shorter than 1ms"
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(format!(
            "lease TTL {ttl:?} is longer than the limit of {MAX_TTL:?}"
        )));
    }
    Ok(())
}

/// Rejects a wait bound that would overflow a deadline.
pub fn check_wait(wait: Duration) -> Result<()> {
    if wait > MAX_WAIT {
        return Err(Error::invalid(format!(
            "wait bound {wait:?} is longer than the limit of {MAX_WAIT:?}"
        )));
    }
    Ok(())
}

/// A successful acquire, as the backend reports it. Backends build it with [`Grant::new`]
/// (and [`with_key`](Grant::with_key)); fields may be added, so it is `#[non_exhaustive]`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Grant {
    /// The lock.
    pub name: LockName,
    /// Who holds it.
    pub owner: OwnerId,
    /// The fencing token of the grant (a reentrant acquire returns the token of the grant it
    /// joins).
    pub token: FencingToken,
    /// The owner's hold count after this acquire (1 for a fresh grant).
    pub hold_count: u32,
    /// The lease the server granted, which may differ from the one asked for (etcd rounds up to
    /// whole seconds and its minimum; ZooKeeper grants the negotiated session timeout).
    pub ttl: Duration,
    /// When the request that won the grant was sent, on the monotonic clock. Safe-until is
    /// `sent_at + ttl - drift`.
    pub sent_at: Instant,
    /// Backend-specific identity of the grant that release and renew receive back (an etcd key,
    /// a ZooKeeper node path). Empty where the name and owner suffice.
    pub key: String,
    /// The permits of the name when it was granted: 1 for a lock, the semaphore's `max` for a
    /// permit (the request's [`AcquireRequest::permits`], which the client sets here).
    pub permits: u32,
}

impl Grant {
    /// A grant of `name` to `owner` with `token`, the owner's `hold_count` after this acquire,
    /// the lease `ttl` the server granted, and when the winning request was `sent_at`; no
    /// backend key (see [`with_key`](Grant::with_key)).
    pub fn new(
        name: LockName,
        owner: OwnerId,
        token: FencingToken,
        hold_count: u32,
        ttl: Duration,
        sent_at: Instant,
    ) -> Self {
        Self {
            name,
            owner,
            token,
            hold_count,
            ttl,
            sent_at,
            key: String::new(),
            permits: 1,
        }
    }

    /// The grant with the backend's own identity of it (an etcd key, a ZooKeeper node path),
    /// which release and renew receive back.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }
}

/// What [`DistributedLock::inspect`](crate::DistributedLock::inspect) sees of a held lock.
///
/// Backends build it with [`LockInfo::new`]; fields may be added, so it is `#[non_exhaustive]`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The holder.
    pub owner: OwnerId,
    /// The holder's hold count.
    pub hold_count: u32,
    /// The current grant's fencing token.
    pub token: FencingToken,
    /// The lease left, by the server's clock; `None` for session-bound or unleased locks.
    pub remaining: Option<Duration>,
    /// For a semaphore: how many permits are held, and of how many. A lock is `(1, 1)`; the
    /// other fields then describe the oldest permit held.
    pub permits: (u32, u32),
    /// When the current grant began, by the server's clock, where the server keeps it (`None`
    /// where it does not). Re-entries and renewals do not move it. For display: it comes from
    /// another machine's clock, so never compare it with the local clock to judge a lease.
    pub since: Option<SystemTime>,
    /// For an election: the value the current grant's holder proclaimed
    /// ([`DistributedLock::proclaim`](crate::DistributedLock::proclaim)); `None` until it
    /// proclaims one, and never a value an earlier grant of the name proclaimed.
    pub value: Option<String>,
}

impl LockInfo {
    /// What a backend reports of a held lock; [`since`](#structfield.since) unknown.
    pub fn new(
        owner: OwnerId,
        hold_count: u32,
        token: FencingToken,
        remaining: Option<Duration>,
    ) -> Self {
        Self {
            owner,
            hold_count,
            token,
            remaining,
            since: None,
            permits: (1, 1),
            value: None,
        }
    }

    /// Sets the value the holder proclaimed (an election's leader).
    pub fn with_value(mut self, value: impl Into<String>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Sets how many permits of how many are held (a semaphore).
    pub fn with_permits(mut self, held: u32, max: u32) -> Self {
        self.permits = (held, max);
        self
    }

    /// Sets when the current grant began, by the server's clock.
    pub fn with_since(mut self, since: SystemTime) -> Self {
        self.since = Some(since);
        self
    }

    /// Sets [`since`](#structfield.since) from milliseconds since the Unix epoch, as servers keep it;
    /// a negative or absurd value leaves it unknown.
    pub fn with_since_unix_ms(mut self, ms: i64) -> Self {
        self.since = u64::try_from(ms)
            .ok()
            .filter(|&ms| ms > 0)
            .and_then(|ms| SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms)));
        self
    }
}

/// The margin subtracted from a lease to get safe-until: 1% of the TTL plus 2 ms, covering clock
/// rate drift between client and server and timer lateness.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The instant up to which a grant of `ttl` whose request was sent at `sent_at` may be trusted.
pub fn safe_until(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl.saturating_sub(drift(ttl))
}

/// Shorthand for the `Lost` error of a renew that found the lock gone.
pub fn lost(name: &LockName, why: impl fmt::Display) -> Error {
    Error::new(ErrorKind::Lost, why.to_string()).with_lock(name)
}

/// What a [`give_back`](crate::DistributedLock::give_back) may take away: one hold of `owner`'s on
/// `name` that nothing on this handle accounts for, if the server has one.
#[derive(Clone, Debug)]
pub struct Surplus {
    /// The lock.
    pub name: LockName,
    /// Whose hold it is.
    pub owner: OwnerId,
    /// The lease the lost request asked for.
    pub ttl: Duration,
    /// How many of the holds this handle accounts for are the ones being taken away: 1 when
    /// a release whose answer was lost is settled (its hold stays counted until then), 0 when
    /// an acquire's is.
    pub leaving: u32,
}

impl Surplus {
    /// A hold an acquire whose answer was lost may have added.
    pub fn of_acquire(name: LockName, owner: OwnerId, ttl: Duration) -> Self {
        Self {
            name,
            owner,
            ttl,
            leaving: 0,
        }
    }

    /// The hold a release of `grant` whose answer was lost was taking away, if the server still
    /// has it.
    pub fn of_release(grant: &Grant) -> Self {
        Self {
            name: grant.name.clone(),
            owner: grant.owner.clone(),
            ttl: grant.ttl,
            leaving: 1,
        }
    }
}
