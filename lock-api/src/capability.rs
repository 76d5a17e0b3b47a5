//! What a backend can promise, as plain values.

use std::time::Duration;

/// What a backend promises. A plain `Copy + Default` struct: a backend declares
/// `Capabilities { reentrant: true, ..Default::default() }`, its docs show the same values as a
/// checklist, and the conformance suite runs a case only where these say it applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
}

/// How a waiting acquire learns that the lock came free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Blocking {
    /// It retries with capped exponential backoff and jitter, waking no later than the holder's
    /// expiry.
    #[default]
    Poll,
    /// The server tells it (pub/sub message, watch event); it does not poll.
    Notify,
}

/// How leases behave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TtlSupport {
    /// Whether each grant has its own lease, shares the client session's, or has none.
    pub kind: LeaseKind,
    /// The shortest lease the server grants; a shorter request is raised to it (and the granted
    /// value reported), never silently honoured.
    pub min: Duration,
    /// The unit the server counts leases in (1 ms for Redis PX, 1 µs for `NOW(6)`, 1 s for etcd).
    pub granularity: Duration,
}

/// Whether each grant has its own lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// Where fencing tokens come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

impl Capabilities {
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
        };
        format!(
            "- [{}] reentrant\n- [x] blocking: {blocking}\n- [{}] ttl: {ttl}\n- [{}] fair (FIFO)\n- [{}] fencing: {fencing}\n- [{}] renewal (watchdog)\n",
            tick(self.reentrant),
            tick(self.ttl.kind != LeaseKind::None),
            tick(self.fair),
            tick(self.fencing_tokens()),
            tick(self.renewal),
        )
    }
}
