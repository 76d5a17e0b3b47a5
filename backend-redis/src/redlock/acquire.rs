//! Acquiring: the acquire round, the derived fencing token's write-back, giving back what a
//! failed round was granted, and late grants joining a grant.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, Backoff};
use distlock_api::backend::{drift, safe_until, AcquireRequest};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockName, OwnerId, Result};
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::ops::Acquired;

use super::round::agreed;
use super::*;

/// One master's grant in an acquire round.
#[derive(Clone, Copy)]
pub(super) struct Answer {
    pub(super) master: usize,
    /// The master's own token of the hold (its counter's value at the grant).
    pub(super) token: u64,
    /// The owner's holds there now: 1 for a fresh hold, more for a re-entry.
    pub(super) count: u32,
    /// The token derived over the masters and written on this one (0: none written).
    pub(super) fence: u64,
}

impl Answer {
    /// The grant's token as this master keeps it.
    pub(super) fn effective(&self) -> u64 {
        if self.fence > 0 {
            self.fence
        } else {
            self.token
        }
    }

    fn granted(self) -> Acquired {
        Acquired::Granted {
            token: self.token,
            count: self.count,
            fence: self.fence,
        }
    }
}

/// The tokens the masters keep for holds this round re-entered.
fn reentries(granted: &[Answer]) -> impl Iterator<Item = u64> + '_ {
    granted
        .iter()
        .filter(|g| g.count > 1)
        .map(Answer::effective)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fresh,
    Reentry,
}

/// A won round's grant, which late answers join: its id in the late table, its token, and
/// whether it is a fresh grant (not a re-entry of a held one).
#[derive(Clone, Copy)]
pub(super) struct Join {
    id: u64,
    token: u64,
    fresh: bool,
}

/// Whether a release of a hold one of `req`'s attempts got, whose answer was lost, may simply be
/// sent again: only for an acquisition under its own owner id ([`AcquireRequest::fresh`]). Each
/// of its attempts takes a hold of its own there (the acquire script grants afresh over a hold
/// an earlier attempt left), under a token no other hold has, so a release applied twice finds
/// the second time nothing of its own to take. Under an owner whose holds are re-entered, the
/// next attempt may have re-entered the very hold being given back, and a second application
/// would take the grant's: the master keeps the one extra hold instead, until its lease ends.
fn resends_give_back(req: &AcquireRequest) -> bool {
    req.fresh
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
            let req = Arc::new(req.clone());
            self.launch(&all, move |s, i| {
                let req = req.clone();
                async move { s.servers[i].acquire(&req).await }
            })
        };

        let mut answered = vec![false; n];
        let mut granted: Vec<Answer> = Vec::new();
        let mut held_pttls = Vec::new();
        let mut errors = Vec::new();
        let q = self.quorum;
        loop {
            // A hold of a grant this owner has already (count > 1: a re-entry) and a fresh
            // hold belong to two different grants: a round is won by a majority of one kind.
            // A re-entry's majority must also keep one token (a late master of the grant may
            // not have had it written yet: then the others are waited for).
            let joining = granted.iter().filter(|g| g.count > 1).count();
            let fresh = granted.len() - joining;
            let won = agreed(reentries(&granted), q).is_some() || fresh >= q;
            let open = pending.len();
            let lost = joining + open < q && fresh + open < q;
            // A lost round still waits (within the deadline) until it can tell contention
            // (a majority answered) from unavailability (a majority cannot answer).
            let told = granted.len() + held_pttls.len() >= q || errors.len() > n - q;
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
                }) => granted.push(Answer {
                    master: i,
                    token,
                    count,
                    fence,
                }),
                Ok(Acquired::Held { pttl }) => held_pttls.push(pttl),
                Err(e) => errors.push(e),
            }
        }
        let waited = sent_at.elapsed();
        // The grant this round is about: a re-entry of the grant a majority of masters keep
        // for this owner under one token, or a fresh grant on a majority. What else the round
        // got is not part of it, and is settled below as a late answer would be.
        let (kind, (mine, others)): (Kind, (Vec<Answer>, Vec<Answer>)) =
            if let Some(t) = agreed(reentries(&granted), q) {
                let split = granted
                    .iter()
                    .partition(|g| g.count > 1 && g.effective() == t);
                (Kind::Reentry, split)
            } else if granted.iter().filter(|g| g.count == 1).count() >= q {
                (Kind::Fresh, granted.iter().partition(|g| g.count == 1))
            } else {
                (Kind::Fresh, (Vec::new(), granted.clone()))
            };
        for (i, _) in answered.iter().enumerate().filter(|(_, a)| !**a) {
            if mine.is_empty() {
                errors.push(no_answer(&self.servers[i], waited));
            }
        }

        let outcome = match kind {
            _ if mine.is_empty() || Instant::now() >= valid_until => None,
            Kind::Reentry => Some(mine[0].effective()),
            Kind::Fresh => self.settle(req, &mine, valid_until).await,
        };
        match outcome {
            Some(token) => {
                // What the other kind got in this round is settled as a late answer would be:
                // a fresh hold joins a re-entered grant; a hold of another grant of this owner
                // gets its one hold back.
                for g in others {
                    pending.push(async move { (g.master, Ok(g.granted())) }.boxed());
                }
                let id = (!pending.is_empty())
                    .then(|| self.late().open(n, sent_at + ttl + self.response_timeout));
                if let Some(id) = id {
                    let join = Join {
                        id,
                        token,
                        fresh: kind == Kind::Fresh,
                    };
                    self.settle_late(pending, req, Some(join));
                }
                // Releases needed before fewer than a majority hold it: the quorum-th largest
                // count.
                let hold_count =
                    kth_largest(mine.iter().map(|g| g.count).collect(), q).unwrap_or(1);
                let mut tokens = vec![0u64; n];
                for g in &mine {
                    tokens[g.master] = g.token;
                }
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
                let outcome = self.contended(errors, held_pttls, ttl);
                // Unavailable leaves the outcome unknown, and the core gives back what the
                // round may have left, master by master, down to the holds it accounts for
                // (`give_back` of the trait). Releasing here as well would give one hold back
                // twice: under a re-entered owner the second takes a hold a live guard of the
                // owner relies on. So this round settles only what the core will not.
                if outcome.is_ok() {
                    self.settle_late(pending, req, None);
                    if !granted.is_empty() {
                        let got: Vec<(usize, u64)> =
                            granted.iter().map(|g| (g.master, g.token)).collect();
                        self.give_back(req, &got, per_master).await;
                    }
                }
                outcome
            }
        }
    }

    /// Decides the token of a fresh grant on a majority (`granted`), writing it back to a
    /// majority where their counters disagree; `None` when that failed or the validity ran out
    /// meanwhile.
    pub(super) async fn settle(
        self: &Arc<Self>,
        req: &AcquireRequest,
        granted: &[Answer],
        valid_until: Instant,
    ) -> Option<u64> {
        let derived = granted.iter().map(|g| g.token).max().unwrap_or(0);
        // Masters whose own counter already returned the derived token need no write-back:
        // their counter stands at it from the moment of the grant. When a majority did (the
        // counters agree, as they do whenever grants reach every master), the round is not
        // sent at all: a fresh grant costs one round, like a lock without fencing.
        if granted.iter().filter(|g| g.token == derived).count() >= self.quorum {
            return (Instant::now() < valid_until).then_some(derived);
        }
        let targets: Vec<usize> = granted.iter().map(|g| g.master).collect();
        let mut mine = vec![0; self.n()];
        for g in granted {
            mine[g.master] = g.token;
        }
        let (name, owner) = (req.name.clone(), req.owner.clone());
        let deadline = Deadline::new(self.deadline(req.ttl), valid_until);
        let tally = self
            .majority_round(&targets, deadline, move |s, i| {
                let (name, owner, t) = (name.clone(), owner.clone(), mine[i]);
                async move { s.servers[i].fence(&name, &owner, t, derived).await }
            })
            .await;
        (tally.yes >= self.quorum && Instant::now() < valid_until).then_some(derived)
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
        req: &AcquireRequest,
        join: Option<Join>,
    ) {
        let until = Instant::now() + req.ttl + drift(req.ttl);
        let resend = resends_give_back(req);
        let (s, name, owner) = (self.clone(), req.name.clone(), req.owner.clone());
        finish_late(pending, move |i, r| {
            let (t, joins) = match r {
                // A fresh hold joins the grant; a hold of a grant this owner already had there
                // joins only if it is this grant (a re-entry), else its one hold goes back.
                Ok(Acquired::Granted {
                    token: t,
                    count,
                    fence,
                }) => {
                    let here = Answer {
                        master: i,
                        token: t,
                        count,
                        fence,
                    };
                    let ours =
                        count == 1 || join.is_some_and(|j| !j.fresh && here.effective() == j.token);
                    (Some(t), ours)
                }
                Err(_) if join.is_some_and(|j| j.fresh) => (None, true),
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
                    if let Some(j) = join.filter(|_| joins) {
                        if s.join_until(i, &name, &owner, t, (j.id, j.token), until)
                            .await
                        {
                            return;
                        }
                    }
                    s.release_until(i, &name, &owner, (t, resend), until).await;
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
    /// answered or the lease has run out, where [that is safe](resends_give_back).
    pub(super) async fn give_back(
        self: &Arc<Self>,
        req: &AcquireRequest,
        got: &[(usize, u64)],
        within: Duration,
    ) {
        let (name, owner) = (&req.name, &req.owner);
        let until = Instant::now() + req.ttl + drift(req.ttl);
        let resend = resends_give_back(req);
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
                async move { s.release_until(i, &name, &owner, (t, true), until).await }.boxed()
            }
        };
        let (name, owner) = (name.clone(), owner.clone());
        let mut pending = self.launch(&targets, move |s, i| {
            let (name, owner, t) = (name.clone(), owner.clone(), tokens[i]);
            async move { s.servers[i].release(&name, &owner, t).await }
        });
        let deadline = Instant::now() + within;
        while let Some((i, r)) = next_before(&mut pending, deadline).await {
            if r.is_err() && resend {
                tokio::spawn(retry(i));
            }
        }
        finish_late(pending, move |i, r| {
            (r.is_err() && resend).then(|| retry(i))
        });
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
