//! [`RedLock`]: one lock over N independent Redis masters.
//!
//! **Rounds end at a majority.** Every operation (acquire, fence write-back, renew, release)
//! sends its script to the masters at once and decides as soon as a strict majority has said
//! yes, or as soon as a majority can no longer say yes, or at the round's deadline: the
//! per-master deadline ([`master_deadline`], small against the TTL) after the first answer
//! and, for acquire and renew, the validity left. A dead or paused master therefore costs a
//! round at most that deadline, never the connection's response timeout. The requests still in flight at the decision keep
//! running in a background task, which reconciles their late answers:
//!
//! - a late grant of a round that failed is released at once;
//! - a late grant of a round that succeeded *joins* the grant: the derived fencing token is
//!   written on it (so every master that holds the grant reports the same token) and it is
//!   recorded in the client's late table under the grant's id, so release and renew reach it
//!   like any other master of the grant. If the grant was released meanwhile, the late grant is
//!   released instead. Keeping (rather than dropping) it means a healthy client still holds all
//!   N masters and survives losing one of them later, though its round ended at N/2 + 1.
//!
//! An acquire is granted when a majority granted it and the validity left — TTL minus the time
//! since the requests were sent minus the drift margin — is still positive when that majority
//! is reached (and again once the token is written back); otherwise what was granted is given
//! back.
//!
//! **Fencing tokens are derived**, not taken from one counter. Each master keeps the usual
//! per-name counter. A fresh grant's token is `T = max` of the counters the granting majority
//! returned; before the grant counts, `T` is written back (counter := max(counter, T)) to a
//! majority of masters *while the grant still holds each of them*. Any later grant's majority
//! shares a master with that write-back majority; on that master the later grant's `INCR`
//! happens after the write-back (the write-back finished before the earlier grant was returned,
//! and the master was locked by the earlier grant until then), so it returns more than `T`, and
//! the later token, a maximum that includes it, is greater than `T`. This needs no clock
//! assumption; it fails only if a master loses its counters (restart without persistence).
//! A master whose own `INCR` returned `T` needs no write-back (its counter is at `T` from the
//! grant on, and the grant held it from then), so when a majority of the granting answers
//! already agree on `T` — the usual case, since every grant reaches every master and the
//! counters move together — the write-back round is skipped and a fresh grant costs one round.
//! Late grants joined afterwards get `T` written too (unless their counter gave `T` itself),
//! which only raises counters.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, Backoff, HandOver, Notices, Waiting};
use distlock_api::backend::{async_trait, AcquireRequest, ClientCore, Surplus};
use distlock_api::Profile;
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, ErrorKind, Fencing, FencingToken, Grant,
    LeaseKind, LockInfo, LockName, OwnerId, Result, TtlSupport,
};
use futures::future::join_all;

use crate::config::RedLockConfig;
use crate::notices::{Hub, HubConfig, Subscription};

mod acquire;
mod handover;
mod holds;
mod inspect;
mod late;
mod round;

use crate::ops::{Holder, Server};
use late::{decode_key, encode_key, LateTable};
use round::{
    agreed, finish_late, join_errors, kth_largest, next_before, no_answer, Deadline, Pending,
};

/// What [`RedLock`] promises.
pub const REDLOCK_CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Signal)
    .ttl(TtlSupport::new(
        LeaseKind::PerLock,
        Duration::from_millis(1),
        Duration::from_millis(1),
    ))
    .fair(false)
    .fencing(Fencing::Volatile)
    .renewal(true)
    .election(true);

/// The least a round waits for the masters that have not answered, whatever the TTL. Loopback
/// answers in well under a millisecond, but on a loaded machine the answers of healthy masters
/// straggle: on the 2-core test machine under the parallel test load, the conformance suite
/// over five masters saw stragglers more than 50 ms behind the first answer (3 failing runs of
/// 8 with a 50 ms floor, none of 5 with 100 ms). A deadline below that counts healthy masters
/// as dead, and a grant held on a bare majority then cannot renew.
pub const MIN_MASTER_DEADLINE: Duration = Duration::from_millis(100);

/// How long one round waits for the masters that have not answered yet: TTL/200, at least
/// [`MIN_MASTER_DEADLINE`], but never more than a quarter of the TTL (most of the lease must
/// be left to use) nor more than the response timeout. Leases up to 20 s give 100 ms, 30 s
/// gives 150 ms, 200 ms gives 50 ms. It runs from the first master's answer, so this is all a
/// dead or paused master costs an operation over the quickest master's round trip.
pub fn master_deadline(ttl: Duration, response_timeout: Duration) -> Duration {
    (ttl / 200)
        .max(MIN_MASTER_DEADLINE)
        .min(ttl / 4)
        .min(response_timeout)
}

/// A client of N independent Redis masters running the RedLock algorithm: one multiplexed
/// connection per master and one watchdog. Waiters poll with capped exponential backoff and
/// jitter (a release on N masters is N messages; a split vote needs randomized retries anyway).
///
/// Build it with [`RedLock::connect`], wrap it in an `Arc` and use
/// [`LockExt`](crate::LockExt) on it.
pub struct RedLock {
    shared: Arc<Shared>,
}

struct Shared {
    core: ClientCore,
    servers: Vec<Server>,
    /// One pub/sub hub per master (connected on the first wait), in the order of `servers`.
    hubs: Vec<Hub>,
    quorum: usize,
    response_timeout: Duration,
    default_ttl: Duration,
    late: Mutex<LateTable>,
}

impl fmt::Debug for RedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLock")
            .field(
                "endpoints",
                &self
                    .shared
                    .servers
                    .iter()
                    .map(|s| &s.endpoint)
                    .collect::<Vec<_>>(),
            )
            .field("quorum", &self.shared.quorum)
            .field("owner", self.shared.core.owner())
            .finish_non_exhaustive()
    }
}

impl RedLock {
    /// The backend's name, as errors and `DISTLOCK_SKIP` show it.
    pub const BACKEND: &'static str = "redlock";

    /// The masters, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) fn servers(&self) -> &[Server] {
        &self.shared.servers
    }

    /// Validates `config` (before any I/O) and connects to every master at once. A master that
    /// cannot be reached is tolerated as long as a majority can (it is retried on every call);
    /// fewer than a majority is [`Unavailable`](ErrorKind::Unavailable) within the connect
    /// timeout.
    pub async fn connect(config: RedLockConfig) -> Result<Self> {
        config
            .validate()
            .map_err(|e| e.with_backend(Self::BACKEND))?;
        let mut core =
            ClientCore::new(Self::BACKEND).with_default_ttl(config.options.client.default_ttl)?;
        if let Some(owner) = &config.options.client.owner {
            core = core.with_owner(owner.clone());
        }
        let quorum = config.quorum();
        let connected = join_all(
            config
                .endpoints
                .iter()
                .map(|e| Server::connect(e, &config.options, Self::BACKEND)),
        )
        .await;
        let mut servers = Vec::new();
        let mut errors = Vec::new();
        for (endpoint, r) in config.endpoints.iter().zip(connected) {
            match r {
                Ok(s) => servers.push(s),
                Err(e) => {
                    errors.push(e.to_string());
                    // Tolerated while a majority is up: it connects on first use later.
                    servers.push(Server::lazy(endpoint, &config.options, Self::BACKEND)?);
                }
            }
        }
        let up = config.endpoints.len() - errors.len();
        if up < quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "only {up} of {} RedLock masters reachable, {quorum} needed: {}",
                    config.endpoints.len(),
                    errors.join("; ")
                ),
            )
            .with_backend(Self::BACKEND));
        }
        let signals = config.get_release_signals();
        let hubs = config
            .endpoints
            .iter()
            .filter(|_| signals)
            .map(|endpoint| {
                Hub::new(HubConfig {
                    endpoint: endpoint.clone(),
                    backend: Self::BACKEND,
                    connect_timeout: config.options.client.connect_timeout,
                    response_timeout: config.options.client.operation_timeout,
                    cluster: None,
                    sentinel: None,
                })
            })
            .collect();
        Ok(Self {
            shared: Arc::new(Shared {
                core,
                servers,
                hubs,
                quorum,
                response_timeout: config.options.client.operation_timeout,
                default_ttl: config.options.client.default_ttl,
                late: Mutex::default(),
            }),
        })
    }

    /// How many masters must agree.
    pub fn quorum(&self) -> usize {
        self.shared.quorum
    }

    /// How long a round of this client waits for unanswered masters for a lease of `ttl`
    /// ([`master_deadline`] with the configured response timeout).
    pub fn master_deadline(&self, ttl: Duration) -> Duration {
        master_deadline(ttl, self.shared.response_timeout)
    }
}

#[async_trait]
impl DistributedLock for RedLock {
    fn profile(&self) -> Profile {
        let capabilities = match self.shared.hubs.is_empty() {
            false => REDLOCK_CAPABILITIES,
            true => REDLOCK_CAPABILITIES.blocking(Blocking::Poll),
        };
        // Rounds are retried after a random delay (jittered backoff steps), as the RedLock
        // description asks of a client that failed to get a majority; a waiter subscribed to the
        // masters' release channels retries when one of them tells it the lock was released.
        // A release through this handle passes the lock straight to a waiting task of the same
        // handle: one round on the masters instead of a release round and an acquire round.
        Profile::new(capabilities)
            .waiting(Waiting::Poll(Backoff::default()))
            .hands_over(true)
    }

    fn core(&self) -> &ClientCore {
        &self.shared.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.shared.attempt(req).await
    }

    /// The release channel of `name` on every master that confirms it within the master
    /// deadline; `Unavailable` (and the waiter keeps polling) when fewer than a majority do.
    /// A majority suffices: the holder's grant is on a majority too, and a release deletes the
    /// lock on each master of it, which publishes there.
    async fn subscribe(&self, name: &LockName) -> Result<Box<dyn Notices>> {
        let shared = &self.shared;
        if shared.hubs.is_empty() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "release signals are off for this client",
            )
            .with_backend(Self::BACKEND));
        }
        let bound = master_deadline(shared.default_ttl, shared.response_timeout);
        let asked = shared
            .hubs
            .iter()
            .zip(&shared.servers)
            .map(|(hub, server)| {
                let channel = server.keys.channel(name);
                async move { tokio::time::timeout(bound, hub.subscribe(&channel)).await }
            });
        let subs: Vec<Subscription> = join_all(asked)
            .await
            .into_iter()
            .filter_map(|r| r.ok().and_then(Result::ok))
            .collect();
        if subs.len() < shared.quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "only {} of {} masters confirmed the release channel, {} needed",
                    subs.len(),
                    shared.hubs.len(),
                    shared.quorum
                ),
            )
            .with_backend(Self::BACKEND)
            .with_lock(name));
        }
        Ok(Box::new(MasterNotices {
            subs,
            quorum: shared.quorum,
        }))
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.shared.release(grant).await
    }

    /// One round of the hand-over script on every master the grant holds, decided like an
    /// acquire for `to`: it holds the lock once a majority passed it on within the validity
    /// of `to.ttl`, under a derived token (written back to a majority unless a majority's
    /// counters gave it). Short of a majority nothing passes: what a minority passed is given
    /// back and the outcome is the release's.
    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        self.shared.hand_over(from, to).await
    }

    /// Master by master: a lost answer may have left holds on any of them (or, for a release,
    /// taken the hold on some and not others), each with its own token, so each is found and
    /// released on its own, where the master has the surplus (read after the master's count).
    async fn give_back(&self, surplus: &Surplus) -> Result<bool> {
        let s = &self.shared;
        let (name, owner) = (&surplus.name, &surplus.owner);
        let undone = join_all(s.servers.iter().map(|srv| async move {
            match srv.inspect(name).await? {
                Some(h) if h.owner == *owner && s.core.has_surplus(surplus, h.count) => {
                    srv.release(name, owner, h.token).await.map(|r| r.is_some())
                }
                _ => Ok(false),
            }
        }))
        .await;
        let failed = undone.iter().filter(|r| r.is_err()).count();
        if undone.iter().any(|r| matches!(r, Ok(true))) && failed == 0 {
            return Ok(true);
        }
        if failed > 0 {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{failed} of {} masters did not answer", s.n()),
            ));
        }
        Ok(false)
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        self.shared.renew(grant, ttl).await
    }

    /// One round of the proclaim script on every master the grant holds: written once a
    /// majority wrote it, each master checking its own token of the grant.
    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        self.shared.proclaim(grant, value).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.shared.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        self.shared.list(prefix).await
    }

    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        let Some(info) = self.inspect(name).await? else {
            return Ok(false);
        };
        if info.token != token {
            return Ok(false);
        }
        let s = &self.shared;
        // Master by master: every hold of that owner there, each release conditional on the
        // master's own token of the grant.
        let mut cleared = 0;
        for server in &s.servers {
            let Ok(Ok(here)) = tokio::time::timeout(s.response_timeout, server.inspect(name)).await
            else {
                continue;
            };
            let Some(h) = here.filter(|h| h.owner == info.owner) else {
                cleared += 1;
                continue;
            };
            for _ in 0..h.count.saturating_add(64) {
                match server.release(name, &h.owner, h.token).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        cleared += 1;
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        if cleared < s.quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "the holds were given up on {cleared} of {} masters; the rest end with \
                     their lease",
                    s.n()
                ),
            )
            .with_lock(name));
        }
        Ok(true)
    }
}

/// A RedLock waiter's release notices: the name's channel on a majority of masters or more.
struct MasterNotices {
    subs: Vec<Subscription>,
    quorum: usize,
}

#[async_trait]
impl Notices for MasterNotices {
    /// Returns once messages have come from a majority of masters since the last wait (or
    /// since subscribing), or after `max`. A holder's release deletes the lock on each master
    /// of its majority, and each of them publishes; a failed round that gives back what it got
    /// on a minority publishes there too, but on fewer masters than a majority, so the
    /// contenders' own retries do not wake each other in a storm. A split vote (every
    /// contender gave back a minority) publishes across the masters, and wakes them. Messages
    /// that have arrived by the time this returns are taken as seen: the retry that follows
    /// covers them.
    async fn wait(&self, max: Duration) {
        let needed = self.quorum.min(self.subs.len()).max(1);
        let deadline = tokio::time::Instant::now() + max;
        let mut counts: Vec<_> = self.subs.iter().map(Subscription::receiver).collect();
        loop {
            // Marked before counting, so a message after the count wakes the wait below.
            for c in &mut counts {
                c.borrow_and_update();
            }
            if self.subs.iter().filter(|s| s.moved()).count() >= needed {
                break;
            }
            let next =
                futures::future::select_all(counts.iter_mut().map(|c| Box::pin(c.changed())));
            match tokio::time::timeout_at(deadline, next).await {
                Ok((Ok(()), _, _)) => {}
                // Out of time, or a channel whose sender is gone (it lives as long as the
                // subscription, so never): the caller retries.
                _ => break,
            }
        }
        for s in &self.subs {
            s.mark_seen();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_keys_round_trip() {
        assert_eq!(encode_key(&[3, 0, 7], None), "3,0,7");
        assert_eq!(encode_key(&[3, 0, 7], Some(12)), "3,0,7;12");
        assert_eq!(decode_key("3,0,7", 3), Some((vec![3, 0, 7], None)));
        assert_eq!(decode_key("3,0,7;12", 3), Some((vec![3, 0, 7], Some(12))));
        assert_eq!(decode_key("3,0,7;x", 3), None);
        assert_eq!(decode_key("3,0", 3), None);
        assert_eq!(decode_key("", 3), None);
        assert_eq!(decode_key("a,b,c", 3), None);
    }

    #[test]
    fn late_table_sweeps_only_entries_past_their_lease() {
        let mut table = LateTable::default();
        let past = Instant::now() - Duration::from_secs(1);
        let future = Instant::now() + Duration::from_secs(60);
        let live: Vec<u64> = (0..10).map(|_| table.open(3, future)).collect();
        for _ in 0..200 {
            table.open(3, past);
        }
        assert!(
            table.joined.len() < 80,
            "{} entries kept",
            table.joined.len()
        );
        assert!(live.iter().all(|id| table.joined.contains_key(id)));
    }

    #[test]
    fn master_deadline_is_small_against_the_ttl() {
        let rt = Duration::from_secs(3);
        let ms = Duration::from_millis;
        assert_eq!(master_deadline(Duration::from_secs(10), rt), ms(100));
        assert_eq!(master_deadline(Duration::from_secs(2), rt), ms(100));
        assert_eq!(master_deadline(ms(200), rt), ms(50));
        assert_eq!(master_deadline(Duration::from_secs(30), rt), ms(150));
        assert_eq!(master_deadline(ms(100), rt), ms(25));
        assert_eq!(master_deadline(Duration::from_secs(3600), rt), rt);
    }

    #[test]
    fn kth_largest_is_the_majority_bound() {
        assert_eq!(kth_largest(vec![1, 3, 2], 2), Some(2));
        assert_eq!(kth_largest(vec![5], 2), None);
        assert_eq!(kth_largest(Vec::<u32>::new(), 1), None);
    }
}
