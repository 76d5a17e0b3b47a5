//! Acquiring: the acquire round, the derived fencing token's write-back, giving back what a
//! failed round was granted, and late grants joining a grant.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, Backoff};
use distlock_api::backend::{drift, safe_until, AcquireRequest};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockName, OwnerId, Result};
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::server::Acquired;

use super::*;

/// A won round's grant, which late answers join: its id in the late table, its token, and
/// whether it is a fresh grant (not a re-entry of a held one).
#[derive(Clone, Copy)]
pub(super) struct Join {
    id: u64,
    token: u64,
    fresh: bool,
}

impl Shared {
    pub(super) async fn attempt(self: &Arc<Self>, req: &AcquireRequest) -> Result<Attempt> {
        let (name, owner, ttl) = (&req.name, &req.owner, req.ttl);
        let n = self.n();
        let sent_at = Instant::now();
        let valid_until = safe_until(sent_at, ttl);
        let per_master = self.deadline(ttl);
        let mut deadline = Deadline::new(per_master, valid_until);
        let all: Vec<usize> = (0..n).collect();
        let mut pending = {
            let (name, owner) = (name.clone(), owner.clone());
            self.launch(&all, move |s, i| {
                let (name, owner) = (name.clone(), owner.clone());
                async move { s.servers[i].acquire(&name, &owner, ttl).await }
            })
        };

        let mut tokens = vec![0u64; n];
        let mut answered = vec![false; n];
        let mut granted = Vec::new(); // (index, token, count, fence)
        let mut held_pttls = Vec::new();
        let mut errors = Vec::new();
        loop {
            let won = granted.len() >= self.quorum;
            let lost = n - held_pttls.len() - errors.len() < self.quorum;
            // A lost round still waits (within the deadline) until it can tell contention
            // (a majority answered) from unavailability (a majority cannot answer).
            let told =
                granted.len() + held_pttls.len() >= self.quorum || errors.len() > n - self.quorum;
            if won || (lost && told) {
                break;
            }
            let Some((i, r)) = next_before(&mut pending, deadline.limit).await else {
                break;
            };
            answered[i] = true;
            deadline.answered();
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
        let waited = sent_at.elapsed();
        for (i, _) in answered.iter().enumerate().filter(|(_, a)| !**a) {
            if granted.len() < self.quorum {
                errors.push(no_answer(&self.servers[i], waited));
            }
        }

        let outcome = if granted.len() >= self.quorum && Instant::now() < valid_until {
            self.settle(req, &granted, valid_until).await
        } else {
            None
        };
        match outcome {
            Some(token) => {
                let id = (!pending.is_empty())
                    .then(|| self.late().open(n, sent_at + ttl + self.response_timeout));
                if let Some(id) = id {
                    // A fresh grant (a hold of count 1 on each master that answered) may find
                    // a late master's answer lost: whatever that master holds for this owner is
                    // then this round's, and is found by reading it.
                    let fresh = granted.iter().all(|g| g.2 == 1);
                    let join = Join { id, token, fresh };
                    self.settle_late(pending, name, owner, ttl, Some(join));
                }
                // Releases needed before fewer than a majority hold it: the quorum-th largest
                // count.
                let hold_count =
                    kth_largest(granted.iter().map(|g| g.2).collect(), self.quorum).unwrap_or(1);
                Ok(Attempt::Granted(
                    Grant::new(
                        name.clone(),
                        owner.clone(),
                        FencingToken(token),
                        hold_count,
                        ttl,
                        sent_at,
                    )
                    .with_key(encode_key(&tokens, id)),
                ))
            }
            None => {
                self.settle_late(pending, name, owner, ttl, None);
                if !granted.is_empty() {
                    let got: Vec<(usize, u64)> = granted.iter().map(|g| (g.0, g.1)).collect();
                    self.give_back(name, owner, &got, ttl, per_master).await;
                }
                self.contended(errors, held_pttls, ttl)
            }
        }
    }

    /// Decides the token of a round a majority granted, writing a fresh one back to a majority;
    /// `None` when that failed or the validity ran out meanwhile.
    pub(super) async fn settle(
        self: &Arc<Self>,
        req: &AcquireRequest,
        granted: &[(usize, u64, u32, u64)],
        valid_until: Instant,
    ) -> Option<u64> {
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
            // Masters whose own counter already returned the derived token need no write-back:
            // their counter stands at it from the moment of the grant. When a majority did (the
            // counters agree, as they do whenever grants reach every master), the round is not
            // sent at all: a fresh grant costs one round, like a lock without fencing.
            if granted.iter().filter(|g| g.1 == derived).count() >= self.quorum {
                return (Instant::now() < valid_until).then_some(derived);
            }
            let targets: Vec<usize> = granted.iter().map(|g| g.0).collect();
            let mine: Vec<u64> = {
                let mut t = vec![0; self.n()];
                for g in granted {
                    t[g.0] = g.1;
                }
                t
            };
            let (name, owner) = (req.name.clone(), req.owner.clone());
            let deadline = Deadline::new(self.deadline(req.ttl), valid_until);
            let tally = self
                .majority_round(&targets, deadline, move |s, i| {
                    let (name, owner, t) = (name.clone(), owner.clone(), mine[i]);
                    async move { s.servers[i].fence(&name, &owner, t, derived).await }
                })
                .await;
            if tally.yes < self.quorum {
                return None;
            }
            derived
        };
        (Instant::now() < valid_until).then_some(token)
    }

    /// Hands the acquires of a round still in flight to the background. With `join` (the
    /// round's grant), each late grant gets the token written and joins the grant, or is
    /// released if the grant is gone by then; without, every late grant is released. A
    /// release is sent until it is answered or the lease (`ttl`) has run out, so a late grant
    /// never outlives its round's decision by a whole lease. For a fresh grant, a late answer
    /// that is lost (the master may have granted it) is settled by reading the master once it
    /// answers again.
    pub(super) fn settle_late(
        self: &Arc<Self>,
        pending: Pending<Acquired>,
        name: &LockName,
        owner: &OwnerId,
        ttl: Duration,
        join: Option<Join>,
    ) {
        let until = Instant::now() + ttl + drift(ttl);
        let (s, name, owner) = (self.clone(), name.clone(), owner.clone());
        finish_late(pending, move |i, r| {
            let t = match r {
                Ok(Acquired::Granted { token: t, .. }) => Some(t),
                Err(_) if join.is_some_and(|j| j.fresh) => None,
                _ => return None,
            };
            let (s, name, owner) = (s.clone(), name.clone(), owner.clone());
            Some(
                async move {
                    let t = match t {
                        Some(t) => t,
                        None => match s.read_lost_grant(i, &name, &owner, until).await {
                            Some(t) => t,
                            None => return,
                        },
                    };
                    if let Some(j) = join {
                        if s.join_until(i, &name, &owner, t, (j.id, j.token), until)
                            .await
                        {
                            return;
                        }
                    }
                    s.release_until(i, &name, &owner, t, until).await;
                }
                .boxed(),
            )
        });
    }

    /// Master `i`'s token of a fresh hold of `owner` whose acquire answer was lost, read once
    /// the master answers again (until `until`); `None` if it holds none (the acquire never
    /// applied, or its lease ran out).
    async fn read_lost_grant(
        &self,
        i: usize,
        name: &LockName,
        owner: &OwnerId,
        until: Instant,
    ) -> Option<u64> {
        // A hold of this owner there is this round's (owners are per acquisition), or, under an
        // explicit owner, one its other holds of the name share: joining it adds one release
        // there for the one hold this round may have added.
        self.holder_once_answered(i, name, until)
            .await
            .flatten()
            .filter(|h| h.owner == *owner)
            .map(|h| h.token)
    }

    /// What master `i` holds for `name`, read once it answers again after a lost answer: asked
    /// with backoff until `until`, `None` if it never answered by then.
    pub(super) async fn holder_once_answered(
        &self,
        i: usize,
        name: &LockName,
        until: Instant,
    ) -> Option<Option<Holder>> {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            if let Ok(holder) = self.servers[i].inspect(name).await {
                return Some(holder);
            }
            let pause = backoff.next_delay();
            if Instant::now() + pause >= until {
                return None;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Releases the holds (master, token) a failed round got, waiting up to `within` for every
    /// one of those masters (they answered a moment ago), so a refusal leaves nothing behind on
    /// them; a release that fails or is late is sent again in the background until it is
    /// answered or the lease (`ttl`) has run out.
    pub(super) async fn give_back(
        self: &Arc<Self>,
        name: &LockName,
        owner: &OwnerId,
        got: &[(usize, u64)],
        ttl: Duration,
        within: Duration,
    ) {
        let until = Instant::now() + ttl + drift(ttl);
        let targets: Vec<usize> = got.iter().map(|g| g.0).collect();
        let mut tokens = vec![0; self.n()];
        for &(i, t) in got {
            tokens[i] = t;
        }
        let retry = {
            let (s, name, owner, tokens) =
                (self.clone(), name.clone(), owner.clone(), tokens.clone());
            move |i: usize| -> BoxFuture<'static, ()> {
                let (s, name, owner, t) = (s.clone(), name.clone(), owner.clone(), tokens[i]);
                async move { s.release_until(i, &name, &owner, t, until).await }.boxed()
            }
        };
        let (name, owner) = (name.clone(), owner.clone());
        let mut pending = self.launch(&targets, move |s, i| {
            let (name, owner, t) = (name.clone(), owner.clone(), tokens[i]);
            async move { s.servers[i].release(&name, &owner, t).await }
        });
        let deadline = Instant::now() + within;
        while let Some((i, r)) = next_before(&mut pending, deadline).await {
            if r.is_err() {
                tokio::spawn(retry(i));
            }
        }
        finish_late(pending, move |i, r| r.is_err().then(|| retry(i)));
    }

    /// The outcome of a failed attempt: `Held` while a majority answered, else the errors.
    pub(super) fn contended(
        &self,
        errors: Vec<Error>,
        held_pttls: Vec<Option<Duration>>,
        ttl: Duration,
    ) -> Result<Attempt> {
        let answered = self.n() - errors.len();
        if answered < self.quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "only {answered} of {} RedLock masters answered, {} needed: {}",
                    self.n(),
                    self.quorum,
                    join_errors(&errors)
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

    /// Releases one hold on every master that holds the grant (late joiners included).
    /// `Ok(true)` as soon as a majority still held it; `Ok(false)` once a majority cannot.
    /// Joins master `i`'s late grant (token `t`) to grant `id` by writing the grant's `token`
    /// there, sending the write until it is answered or `until`: a write whose answer was lost
    /// may have been applied, and a hold the grant does not count would outlive its release.
    /// `false` if the grant is gone, the write was refused, or no answer came in time.
    pub(super) async fn join_until(
        &self,
        i: usize,
        name: &LockName,
        owner: &OwnerId,
        t: u64,
        (id, token): (u64, u64),
        until: Instant,
    ) -> bool {
        if t == token {
            // This master's counter gave the grant's token itself: nothing to write.
            return match self.late().joined.get_mut(&id) {
                Some(j) => {
                    j.tokens[i] = t;
                    true
                }
                None => false,
            };
        }
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            if !self.late().joined.contains_key(&id) {
                return false;
            }
            match self.servers[i].fence(name, owner, t, token).await {
                Ok(true) => {
                    return match self.late().joined.get_mut(&id) {
                        Some(j) => {
                            j.tokens[i] = t;
                            true
                        }
                        None => false,
                    }
                }
                Ok(false) => return false,
                Err(_) => {}
            }
            let pause = backoff.next_delay();
            if Instant::now() + pause >= until {
                return false;
            }
            tokio::time::sleep(pause).await;
        }
    }
}
