//! What a backend can promise, as plain values.

use std::time::Duration;

use crate::backend::wait::{Backoff, Waiting};

/// What a backend promises. A plain `Copy + Default` value: a backend declares it as a constant
/// with the `const` builder (`Capabilities::new().reentrant(true)…`), its docs show the same
/// values as a checklist, and the conformance suite runs a case only where these say it
/// applies. Read the fields; promises may be added, so it is `#[non_exhaustive]` and built only
/// through [`Capabilities::new`] and its setters.
///
/// ```
/// use std::time::Duration;
/// use distlock_api::{Blocking, Capabilities, Fencing, LeaseKind, TtlSupport};
///
/// const CAPS: Capabilities = Capabilities::new()
///     .reentrant(true)
///     .blocking(Blocking::Notify)
///     .ttl(TtlSupport::new(LeaseKind::PerLock, Duration::from_millis(1), Duration::from_millis(1)))
///     .fencing(Fencing::Volatile)
///     .renewal(true);
/// assert!(CAPS.reentrant && CAPS.per_lock_ttl() && !CAPS.fair);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The same owner may acquire a name it holds; each acquire adds to a hold count and each
    /// release takes one away. Without it, a re-acquire by the holder is answered like any other
    /// contender's (held / would wait), never by a silent deadlock.
    pub reentrant: bool,
    /// How a waiting `acquire` learns that the lock came free.
    pub blocking: Blocking,
    /// How long a grant lives without renewal.
    pub ttl: TtlSupport,
    /// Waiters are granted the lock in the order they started waiting (FIFO).
    pub fair: bool,
    /// Where fencing tokens come from and how long their order survives.
    pub fencing: Fencing,
    /// The watchdog can renew a held lock's lease (per-lock renewal or session keep-alive).
    pub renewal: bool,
    /// Names can be counting semaphores: a request for a permit of at most `max`
    /// ([`LockExt::permit`](crate::LockExt::permit)) is granted while fewer than `max` permits
    /// are held, each permit its own grant with its own lease and token. Without it, a request
    /// for more than one permit is [`Unsupported`](crate::ErrorKind::Unsupported), before any
    /// request is sent.
    pub semaphore: bool,
    /// Names can be elections: a holder can proclaim a value
    /// ([`DistributedLock::proclaim`](crate::DistributedLock::proclaim)), written only while
    /// its grant holds, which [`inspect`](crate::DistributedLock::inspect) reports with the
    /// holder. Without it, campaigning is [`Unsupported`](crate::ErrorKind::Unsupported), before
    /// any request is sent.
    pub election: bool,
}

/// How a waiting acquire learns that the lock came free. Ways may be added (`#[non_exhaustive]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Blocking {
    /// It retries with capped exponential backoff and jitter, waking no later than the holder's
    /// expiry.
    #[default]
    Poll,
    /// The server tells it (pub/sub message, watch event); it does not poll.
    Notify,
    /// The server tells it where the server can for the hold (a wait channel the holding
    /// client keeps, such as MariaDB's `GET_LOCK` on a companion name; a change stream), and it
    /// polls with backoff where it cannot (a holder that keeps no channel, a server without
    /// change streams). Waiters of one client handle are woken by its own releases either way.
    Signal,
}

/// How leases behave. Built with [`TtlSupport::new`]; fields may be added (`#[non_exhaustive]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TtlSupport {
    /// Whether each grant has its own lease, shares the client session's, or has none.
    pub kind: LeaseKind,
    /// The shortest lease the server grants; a shorter request is raised to it (and the granted
    /// value reported), never silently honoured.
    pub min: Duration,
    /// The unit the server counts leases in (1 ms for Redis PX, 1 µs for `NOW(6)`, 1 s for etcd).
    pub granularity: Duration,
}

/// Whether each grant has its own lease. Kinds may be added (`#[non_exhaustive]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseKind {
    /// Locks never expire; only release frees them.
    #[default]
    None,
    /// Each grant has its own TTL, judged by the server's clock.
    PerLock,
    /// Grants live as long as the client's session or lease (ZooKeeper session, etcd lease); a
    /// caller-fixed per-lock TTL is [`Unsupported`](crate::ErrorKind::Unsupported).
    Session,
}

/// Where fencing tokens come from. Sources may be added (`#[non_exhaustive]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// No tokens.
    #[default]
    None,
    /// Tokens increase for as long as the server keeps its state in memory (for example Redis
    /// without AOF: a restart starts again at 1).
    Volatile,
    /// Tokens increase across server restarts (a durable counter or revision).
    Durable,
}

impl TtlSupport {
    /// Leases of `kind`, raised to at least `min`, counted in units of `granularity`.
    pub const fn new(kind: LeaseKind, min: Duration, granularity: Duration) -> Self {
        Self {
            kind,
            min,
            granularity,
        }
    }
}

impl Capabilities {
    /// No promises: not reentrant, polling, no leases, not fair, no fencing, no renewal, no
    /// semaphore (the same as `Default`); the setters below add them.
    pub const fn new() -> Self {
        Self {
            reentrant: false,
            blocking: Blocking::Poll,
            ttl: TtlSupport::new(LeaseKind::None, Duration::ZERO, Duration::ZERO),
            fair: false,
            fencing: Fencing::None,
            renewal: false,
            semaphore: false,
            election: false,
        }
    }

    /// Sets [`reentrant`](Capabilities#structfield.reentrant).
    #[must_use]
    pub const fn reentrant(mut self, reentrant: bool) -> Self {
        self.reentrant = reentrant;
        self
    }

    /// Sets [`blocking`](Capabilities#structfield.blocking).
    #[must_use]
    pub const fn blocking(mut self, blocking: Blocking) -> Self {
        self.blocking = blocking;
        self
    }

    /// Sets [`ttl`](Capabilities#structfield.ttl).
    #[must_use]
    pub const fn ttl(mut self, ttl: TtlSupport) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets [`fair`](Capabilities#structfield.fair).
    #[must_use]
    pub const fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Sets [`fencing`](Capabilities#structfield.fencing).
    #[must_use]
    pub const fn fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets [`renewal`](Capabilities#structfield.renewal).
    #[must_use]
    pub const fn renewal(mut self, renewal: bool) -> Self {
        self.renewal = renewal;
        self
    }

    /// Sets [`semaphore`](Capabilities#structfield.semaphore).
    #[must_use]
    pub const fn semaphore(mut self, semaphore: bool) -> Self {
        self.semaphore = semaphore;
        self
    }

    /// Sets [`election`](Capabilities#structfield.election).
    #[must_use]
    pub const fn election(mut self, election: bool) -> Self {
        self.election = election;
        self
    }

    /// Whether grants expire by themselves when not renewed, per lock.
    pub fn per_lock_ttl(&self) -> bool {
        self.ttl.kind == LeaseKind::PerLock
    }

    /// Whether grants carry fencing tokens.
    pub fn fencing_tokens(&self) -> bool {
        self.fencing != Fencing::None
    }

    /// The capability checklist as Markdown, one line per promise; backend docs embed it and a
    /// test keeps them equal.
    pub fn checklist(&self) -> String {
        let tick = |b: bool| if b { "x" } else { " " };
        let ttl = match self.ttl.kind {
            LeaseKind::None => "none".to_string(),
            LeaseKind::PerLock => format!(
                "per lock (min {:?}, granularity {:?})",
                self.ttl.min, self.ttl.granularity
            ),
            LeaseKind::Session => format!(
                "session-bound (min {:?}, granularity {:?})",
                self.ttl.min, self.ttl.granularity
            ),
        };
        let fencing = match self.fencing {
            Fencing::None => "none",
            Fencing::Volatile => "volatile (lost if the server loses its state)",
            Fencing::Durable => "durable",
        };
        let blocking = match self.blocking {
            Blocking::Poll => "poll (capped exponential backoff with jitter)",
            Blocking::Notify => "notify (the server wakes waiters)",
            Blocking::Signal => "signal (the server wakes waiters where it can; else poll)",
        };
        format!(
            "- [{}] reentrant\n- [x] blocking: {blocking}\n- [{}] ttl: {ttl}\n- [{}] fair (FIFO)\n- [{}] fencing: {fencing}\n- [{}] renewal (watchdog)\n- [{}] semaphore (counting permits)\n- [{}] election (leader with a proclaimed value)\n",
            tick(self.reentrant),
            tick(self.ttl.kind != LeaseKind::None),
            tick(self.fair),
            tick(self.fencing_tokens()),
            tick(self.renewal),
            tick(self.semaphore),
            tick(self.election),
        )
    }
}

/// Everything a client handle says about itself, in one value
/// ([`DistributedLock::profile`](crate::DistributedLock::profile)): what it promises, how its
/// acquires wait, whether a release hands the lock to a task of the same handle, and how many
/// grants one renewal request confirms. Built with [`Profile::new`] and its setters; fields may
/// be added (`#[non_exhaustive]`).
///
/// The conformance suite checks that its parts agree: a backend that waits by
/// [`Waiting::Poll`] says [`Blocking::Poll`] or [`Blocking::Signal`]; one that is notified or
/// queues says [`Blocking::Notify`]; a fair backend does not hand over (a hand-over goes before
/// the queue).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Profile {
    /// What the backend promises.
    pub capabilities: Capabilities,
    /// How a waiting acquire learns that the lock may be free.
    pub waiting: Waiting,
    /// Whether [`hand_over`](crate::DistributedLock::hand_over) passes a lock in one request.
    /// Without it, a release through the handle frees the lock and wakes the handle's own
    /// waiters, which then ask the server.
    pub hands_over: bool,
    /// How many grants [`renew_many`](crate::DistributedLock::renew_many) confirms with one
    /// request (1: the watchdog renews each with its own `renew`).
    pub renew_batch: usize,
}

impl Profile {
    /// `capabilities`, waiting by polling with the default [`Backoff`], no hand-over, and
    /// renewals one grant at a time.
    pub fn new(capabilities: Capabilities) -> Self {
        Self {
            capabilities,
            waiting: Waiting::Poll(Backoff::default()),
            hands_over: false,
            renew_batch: 1,
        }
    }

    /// Sets how acquires wait.
    pub fn waiting(mut self, waiting: Waiting) -> Self {
        self.waiting = waiting;
        self
    }

    /// Sets whether a release hands the lock over in one request.
    pub fn hands_over(mut self, hands_over: bool) -> Self {
        self.hands_over = hands_over;
        self
    }

    /// Sets how many grants one renewal request confirms (at least 1).
    pub fn renew_batch(mut self, renew_batch: usize) -> Self {
        self.renew_batch = renew_batch.max(1);
        self
    }

    /// Why the parts disagree, if they do (see the type's docs).
    pub fn disagreement(&self) -> Option<&'static str> {
        let blocking = self.capabilities.blocking;
        match (&self.waiting, blocking) {
            (Waiting::Poll(_), Blocking::Poll | Blocking::Signal) => {}
            (Waiting::Notify | Waiting::Queue, Blocking::Notify) => {}
            (Waiting::Poll(_), _) => {
                return Some("a backend that waits by polling must say Blocking::Poll or Signal")
            }
            _ => return Some("a backend that is notified or queues must say Blocking::Notify"),
        }
        if self.hands_over && self.capabilities.fair {
            return Some("a fair backend must not hand over: a hand-over goes before its queue");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_whose_parts_disagree_says_why() {
        let notify = Capabilities::new().blocking(Blocking::Notify);
        let signal = Capabilities::new().blocking(Blocking::Signal);
        assert_eq!(Profile::new(signal).disagreement(), None);
        assert_eq!(
            Profile::new(notify).waiting(Waiting::Queue).disagreement(),
            None
        );
        assert!(Profile::new(notify).disagreement().is_some());
        assert!(Profile::new(signal)
            .waiting(Waiting::Notify)
            .disagreement()
            .is_some());
        let fair = notify.fair(true);
        let handing = Profile::new(fair).waiting(Waiting::Queue).hands_over(true);
        assert!(handing.disagreement().is_some());
        assert_eq!(Profile::new(signal).renew_batch(0).renew_batch, 1);
    }
}
