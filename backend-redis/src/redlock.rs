//! [`RedLock`]: one lock over N independent Redis masters.
//!
//! An acquire runs the single-server acquire script on every master at once. It is granted when
//! a strict majority granted it and the validity left — TTL minus the time since the requests
//! were sent minus the drift margin — is still positive; otherwise it is given back on every
//! master that granted it. Release and renew go to every master that holds the grant and count
//! the majority the same way.
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

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::wait::{self, Attempt, Backoff};
use distlock_api::{
    async_trait, lost, safe_until, AcquireRequest, Blocking, Capabilities, ClientCore,
    DistributedLock, Error, ErrorKind, Fencing, FencingToken, Grant, LeaseKind, LockInfo, LockName,
    OwnerId, Result, TtlSupport,
};
use futures::future::join_all;

use crate::config::RedLockConfig;
use crate::server::{Acquired, Holder, Server};
use distlock_api::wait::detached;

/// What [`RedLock`] promises.
pub const REDLOCK_CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    blocking: Blocking::Poll,
    ttl: TtlSupport {
        kind: LeaseKind::PerLock,
        min: Duration::from_millis(1),
        granularity: Duration::from_millis(1),
    },
    fair: false,
    fencing: Fencing::Volatile,
    renewal: true,
};

/// A client of N independent Redis masters running the RedLock algorithm: one multiplexed
/// connection per master and one watchdog. Waiters poll with capped exponential backoff and
/// jitter (a release on N masters is N messages; a split vote needs randomized retries anyway).
///
/// Build it with [`RedLock::connect`], wrap it in an `Arc` and use
/// [`LockExt`](crate::LockExt) on it.
pub struct RedLock {
    core: ClientCore,
    shared: Arc<Shared>,
}

struct Shared {
    servers: Vec<Server>,
    quorum: usize,
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
            .field("owner", self.core.owner())
            .finish_non_exhaustive()
    }
}

/// One master's answer, or its error.
type Reply<T> = Result<T>;

impl RedLock {
    /// The backend's name, as errors and `DISTLOCK_SKIP` show it.
    pub const BACKEND: &'static str = "redlock";

    /// Validates `config` (before any I/O) and connects to every master at once. A master that
    /// cannot be reached is tolerated as long as a majority can (it is retried on every call);
    /// fewer than a majority is [`Unavailable`](ErrorKind::Unavailable) within the connect
    /// timeout.
    pub async fn connect(config: RedLockConfig) -> Result<Self> {
        config
            .validate()
            .map_err(|e| e.with_backend(Self::BACKEND))?;
        let mut core =
            ClientCore::new(Self::BACKEND).with_default_ttl(config.options.default_ttl)?;
        if let Some(owner) = &config.options.owner {
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
        Ok(Self {
            core,
            shared: Arc::new(Shared { servers, quorum }),
        })
    }

    /// Uses `core` (owner id, default TTL) instead of the one built from the config.
    pub fn with_core(mut self, core: ClientCore) -> Self {
        self.core = core;
        self
    }

    /// How many masters must agree.
    pub fn quorum(&self) -> usize {
        self.shared.quorum
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        let shared = self.shared.clone();
        let req = req.clone();
        let undo = {
            let shared = self.shared.clone();
            move |g: Grant| async move {
                let _ = shared.release(&g).await;
            }
        };
        detached(async move { shared.attempt(&req).await }, undo).await
    }
}

/// The per-master tokens of a grant, kept in [`Grant::key`] as `t1,t2,…` (0: not held there),
/// so release and renew check each master's own token.
fn encode_tokens(tokens: &[u64]) -> String {
    tokens
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn decode_tokens(key: &str, n: usize) -> Option<Vec<u64>> {
    let tokens = key
        .split(',')
        .map(|t| t.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    (tokens.len() == n).then_some(tokens)
}

/// The `k`-th largest value (1-based), if there are that many.
fn kth_largest<T: Ord + Copy>(mut values: Vec<T>, k: usize) -> Option<T> {
    values.sort_unstable_by(|a, b| b.cmp(a));
    k.checked_sub(1).and_then(|i| values.get(i).copied())
}

impl Shared {
    fn n(&self) -> usize {
        self.servers.len()
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        let (name, owner, ttl) = (&req.name, &req.owner, req.ttl);
        let sent_at = Instant::now();
        let valid_until = safe_until(sent_at, ttl);
        let replies: Vec<Reply<Acquired>> =
            join_all(self.servers.iter().map(|s| s.acquire(name, owner, ttl))).await;

        let mut tokens = vec![0u64; self.n()];
        let mut granted = Vec::new(); // (index, token, count, fence)
        let mut held_pttls = Vec::new();
        let mut errors = Vec::new();
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(Acquired::Granted {
                    token,
                    count,
                    fence,
                }) => {
                    tokens[i] = token;
                    granted.push((i, token, count, fence));
                }
                Ok(Acquired::Held { pttl }) => held_pttls.push(pttl),
                Err(e) => errors.push(e),
            }
        }
        let grant = |token: u64, hold_count: u32, tokens: &[u64]| Grant {
            name: name.clone(),
            owner: owner.clone(),
            token: FencingToken(token),
            hold_count,
            ttl,
            sent_at,
            key: encode_tokens(tokens),
        };
        if granted.len() >= self.quorum && Instant::now() < valid_until {
            // Releases needed before fewer than a majority hold it: the quorum-th largest count.
            let hold_count =
                kth_largest(granted.iter().map(|g| g.2).collect(), self.quorum).unwrap_or(1);
            let joins_a_held_grant = granted.iter().filter(|g| g.2 > 1).count() >= self.quorum;
            let token = if joins_a_held_grant {
                // A re-entry by an owner that held a majority already: its existing token.
                granted
                    .iter()
                    .filter(|g| g.2 > 1)
                    .map(|g| if g.3 > 0 { g.3 } else { g.1 })
                    .max()
                    .unwrap_or(0)
            } else {
                let derived = granted.iter().map(|g| g.1.max(g.3)).max().unwrap_or(0);
                let recorded = join_all(
                    granted
                        .iter()
                        .map(|&(i, t, _, _)| self.servers[i].fence(name, owner, t, derived)),
                )
                .await;
                let acks = recorded.iter().filter(|r| matches!(r, Ok(true))).count();
                if acks < self.quorum {
                    let g = grant(derived, hold_count, &tokens);
                    let _ = self.release(&g).await;
                    return self.contended(errors, held_pttls, ttl);
                }
                derived
            };
            if Instant::now() < valid_until {
                return Ok(Attempt::Granted(grant(token, hold_count, &tokens)));
            }
        }
        // Not granted: give back what was granted, on every master that granted it.
        if !granted.is_empty() {
            let g = grant(0, 1, &tokens);
            let _ = self.release(&g).await;
        }
        self.contended(errors, held_pttls, ttl)
    }

    /// The outcome of a failed attempt: `Held` while a majority answered, else the errors.
    fn contended(
        &self,
        errors: Vec<Error>,
        held_pttls: Vec<Option<Duration>>,
        ttl: Duration,
    ) -> Result<Attempt> {
        let answered = self.n() - errors.len();
        if answered < self.quorum {
            let detail = errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "only {answered} of {} RedLock masters answered, {} needed: {detail}",
                    self.n(),
                    self.quorum
                ),
            ));
        }
        // The lock is free on a majority once enough holders expire: every master that did not
        // report a holder counts as free now. If a majority is free already (a split vote with
        // other contenders), give no expiry, so the backoff spaces the retries out.
        let free_now = self.n() - errors.len() - held_pttls.len();
        let expires_in = match self.quorum.saturating_sub(free_now) {
            0 => None,
            need => {
                let mut pttls: Vec<Duration> =
                    held_pttls.into_iter().map(|p| p.unwrap_or(ttl)).collect();
                pttls.sort_unstable();
                pttls.get(need - 1).copied()
            }
        };
        Ok(Attempt::Held { expires_in })
    }

    /// Releases one hold on every master that holds the grant. `Ok(true)` when a majority
    /// still held it.
    async fn release(&self, grant: &Grant) -> Result<bool> {
        let tokens = self.tokens(grant)?;
        let replies = join_all(
            self.servers
                .iter()
                .zip(&tokens)
                .filter(|(_, &t)| t != 0)
                .map(|(s, &t)| s.release(&grant.name, &grant.owner, t)),
        )
        .await;
        let held = replies.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        let failed: Vec<&Error> = replies.iter().filter_map(|r| r.as_ref().err()).collect();
        if held >= self.quorum || held + failed.len() < self.quorum {
            return Ok(held >= self.quorum);
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "release reached {held} of {} masters; {} failed: {}",
                self.n(),
                failed.len(),
                failed
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ))
    }

    fn tokens(&self, grant: &Grant) -> Result<Vec<u64>> {
        decode_tokens(&grant.key, self.n()).ok_or_else(|| {
            Error::invalid(format!(
                "grant key {:?} is not a RedLock grant of {} masters",
                grant.key,
                self.n()
            ))
            .with_lock(&grant.name)
        })
    }
}

#[async_trait]
impl DistributedLock for RedLock {
    fn capabilities(&self) -> Capabilities {
        REDLOCK_CAPABILITIES
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        Ok(self.attempt(req).await?.into_grant())
    }

    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        let deadline = Instant::now() + wait;
        wait::poll(deadline, Backoff::default(), || self.attempt(req)).await
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.shared.release(grant).await
    }

    /// Master by master: a lost answer may have left holds on any of them, each with its own
    /// token, so each is found and released on its own.
    async fn give_back(&self, name: &LockName, owner: &OwnerId, _ttl: Duration) -> Result<bool> {
        let s = &self.shared;
        let undone = join_all(s.servers.iter().map(|srv| async move {
            match srv.inspect(name).await? {
                Some(h) if h.owner == *owner => {
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
        let s = &self.shared;
        let tokens = s.tokens(grant)?;
        let sent_at = Instant::now();
        let replies = join_all(
            s.servers
                .iter()
                .zip(&tokens)
                .filter(|(_, &t)| t != 0)
                .map(|(srv, &t)| srv.renew(&grant.name, &grant.owner, t, ttl)),
        )
        .await;
        let renewed = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        if renewed >= s.quorum && Instant::now() < safe_until(sent_at, ttl) {
            return Ok(ttl);
        }
        if renewed + failed < s.quorum {
            return Err(lost(
                &grant.name,
                format!(
                    "only {renewed} of {} masters still hold the grant of owner {}, {} needed",
                    s.n(),
                    grant.owner,
                    s.quorum
                ),
            ));
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "renewal reached {renewed} of {} masters ({failed} failed) within its validity",
                s.n()
            ),
        ))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let s = &self.shared;
        let replies: Vec<Reply<Option<Holder>>> =
            join_all(s.servers.iter().map(|srv| srv.inspect(name))).await;
        let failed = replies.iter().filter(|r| r.is_err()).count();
        let holders: Vec<Holder> = replies
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .collect();
        let mut owners: Vec<&OwnerId> = holders.iter().map(|h| &h.owner).collect();
        owners.sort();
        owners.dedup();
        for owner in owners {
            let mine: Vec<&Holder> = holders.iter().filter(|h| &h.owner == owner).collect();
            if mine.len() < s.quorum {
                continue;
            }
            let token = mine
                .iter()
                .map(|h| if h.fence > 0 { h.fence } else { h.token })
                .max()
                .unwrap_or(0);
            return Ok(Some(LockInfo {
                owner: owner.clone(),
                hold_count: kth_largest(mine.iter().map(|h| h.count).collect(), s.quorum)
                    .unwrap_or(1),
                token: FencingToken(token),
                remaining: kth_largest(mine.iter().filter_map(|h| h.pttl).collect(), s.quorum),
            }));
        }
        // Nobody holds a majority; unless unanswered masters could hide one, the lock is free.
        let best = holders.len();
        if failed > 0 && best + failed >= s.quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "{failed} of {} masters did not answer; cannot tell who holds the lock",
                    s.n()
                ),
            ));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_keys_round_trip() {
        assert_eq!(encode_tokens(&[3, 0, 7]), "3,0,7");
        assert_eq!(decode_tokens("3,0,7", 3), Some(vec![3, 0, 7]));
        assert_eq!(decode_tokens("3,0", 3), None);
        assert_eq!(decode_tokens("", 3), None);
        assert_eq!(decode_tokens("a,b,c", 3), None);
    }

    #[test]
    fn kth_largest_is_the_majority_bound() {
        assert_eq!(kth_largest(vec![1, 3, 2], 2), Some(2));
        assert_eq!(kth_largest(vec![5], 2), None);
        assert_eq!(kth_largest(Vec::<u32>::new(), 1), None);
    }
}
