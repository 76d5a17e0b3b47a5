//! Held grants: release and renew, master by master, including the late grants that joined.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::Backoff;
use distlock_api::backend::{drift, lost, safe_until};
use distlock_api::{Error, ErrorKind, Grant, LockName, OwnerId, Result};
use futures::FutureExt;

use super::*;

/// One more hold of a name by an owner counted on the client's core while it lives.
struct StillCounted {
    shared: Arc<Shared>,
    name: LockName,
    owner: OwnerId,
}

impl StillCounted {
    fn new(shared: &Arc<Shared>, name: &LockName, owner: &OwnerId) -> Self {
        shared.core.count_hold(name, owner);
        Self {
            shared: shared.clone(),
            name: name.clone(),
            owner: owner.clone(),
        }
    }
}

impl Drop for StillCounted {
    fn drop(&mut self) {
        self.shared.core.uncount_hold(&self.name, &self.owner);
    }
}

impl Shared {
    /// Whether a release of one of `owner`'s holds on `name` whose answer was lost may simply be
    /// sent again. Only while no other hold of `owner`'s is accounted for on this handle (call
    /// it while the caller's own is counted): a release applied twice would take a hold a live
    /// guard relies on, and that master would be free for another client's majority. Where
    /// other holds are accounted for, the master keeps the one extra hold instead, until the
    /// grant's last release there or its lease ends: the lock stays safe, and frees on that one
    /// master late. (A release the core settles goes master by master through `give_back`,
    /// which takes a hold only where the master has more than the handle accounts for.)
    pub(super) fn may_resend(&self, name: &LockName, owner: &OwnerId) -> bool {
        self.core.holds_accounted(name, owner) <= 1
    }

    /// Sends master `i`'s release of `owner`'s hold (token `t`), and if its answer is lost,
    /// again until it answers or `until` when `resend` ([`may_resend`](Self::may_resend)).
    pub(super) async fn release_until(
        &self,
        i: usize,
        name: &LockName,
        owner: &OwnerId,
        (t, resend): (u64, bool),
        until: Instant,
    ) {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        while self.servers[i].release(name, owner, t).await.is_err() && resend {
            let pause = backoff.next_delay();
            if Instant::now() + pause >= until {
                return;
            }
            tokio::time::sleep(pause).await;
        }
    }

    pub(super) async fn release(self: &Arc<Self>, grant: &Grant) -> Result<bool> {
        let (mut tokens, id) = self.decode(grant)?;
        // Taken out, so a grant arriving late from now on releases itself instead of joining.
        let joined = id.and_then(|id| self.late().joined.remove(&id));
        if let Some(joined) = &joined {
            for (t, &j) in tokens.iter_mut().zip(&joined.tokens) {
                if *t == 0 {
                    *t = j;
                }
            }
        }
        let targets: Vec<usize> = (0..self.n()).filter(|&i| tokens[i] != 0).collect();
        // Releases have no validity to respect; the driver's response timeout ends them anyway.
        let deadline = Deadline::new(
            self.deadline(grant.ttl),
            Instant::now() + self.response_timeout,
        );
        let (name, owner) = (grant.name.clone(), grant.owner.clone());
        // A master whose release failed keeps the hold for its whole lease, and counts as held
        // when a later round needs a majority without it: its release is sent again until it
        // answers or the lease has run out, whatever the round decided, where that is safe.
        let until = Instant::now() + grant.ttl + drift(grant.ttl);
        let resend = self.may_resend(&name, &owner);
        let retry = {
            let (s, name, owner, tokens) =
                (self.clone(), name.clone(), owner.clone(), tokens.clone());
            move |i: usize| {
                let (s, name, owner, t) = (s.clone(), name.clone(), owner.clone(), tokens[i]);
                async move { s.release_until(i, &name, &owner, (t, true), until).await }.boxed()
            }
        };
        let late_retry = retry.clone();
        // Counted until every master has answered (the closure of the late answers goes when
        // the last has): the core uncounts the hold once the round is decided, and the
        // masters that have not answered by then are still to take it.
        let straggling = StillCounted::new(self, &name, &owner);
        let tally = self
            .majority_round_then(
                &targets,
                deadline,
                {
                    let tokens = tokens.clone();
                    move |s, i| {
                        let (name, owner, t) = (name.clone(), owner.clone(), tokens[i]);
                        async move { Ok(s.servers[i].release(&name, &owner, t).await?.is_some()) }
                    }
                },
                move |i, r| {
                    let _ = &straggling;
                    (r.is_err() && resend).then(|| late_retry(i))
                },
            )
            .await;
        for &i in tally.failed.iter().filter(|_| resend) {
            tokio::spawn(retry(i));
        }
        if tally.yes >= self.quorum || tally.yes + tally.errors.len() < self.quorum {
            return Ok(tally.yes >= self.quorum);
        }
        if let (Some(id), Some(joined)) = (id, joined) {
            // Undecided: a retry of this release must reach the late joiners too.
            self.late().joined.insert(id, joined);
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "release reached {} of {} masters; {} failed: {}",
                tally.yes,
                self.n(),
                tally.errors.len(),
                join_errors(&tally.errors)
            ),
        ))
    }

    /// Extends the grant on every master that holds it (late joiners included); granted once
    /// a majority renewed within the renewal's own validity.
    pub(super) async fn renew(self: &Arc<Self>, grant: &Grant, ttl: Duration) -> Result<Duration> {
        let (mut tokens, id) = self.decode(grant)?;
        let joined = id.and_then(|id| self.late().joined.get(&id).map(|j| j.tokens.clone()));
        if let Some(joined) = joined {
            for (t, j) in tokens.iter_mut().zip(joined) {
                if *t == 0 {
                    *t = j;
                }
            }
        }
        let sent_at = Instant::now();
        let valid_until = safe_until(sent_at, ttl);
        let deadline = Deadline::new(self.deadline(ttl), valid_until);
        let targets: Vec<usize> = (0..self.n()).filter(|&i| tokens[i] != 0).collect();
        let (name, owner) = (grant.name.clone(), grant.owner.clone());
        let tally = self
            .majority_round(&targets, deadline, move |s, i| {
                let (name, owner, t) = (name.clone(), owner.clone(), tokens[i]);
                async move { s.servers[i].renew(&name, &owner, t, ttl).await }
            })
            .await;
        if tally.yes >= self.quorum && Instant::now() < valid_until {
            if let Some(id) = id {
                if let Some(j) = self.late().joined.get_mut(&id) {
                    j.until = j.until.max(sent_at + ttl + self.response_timeout);
                }
            }
            return Ok(ttl);
        }
        if tally.yes + tally.errors.len() < self.quorum {
            return Err(lost(
                &grant.name,
                format!(
                    "only {} of {} masters still hold the grant of owner {}, {} needed",
                    tally.yes,
                    self.n(),
                    grant.owner,
                    self.quorum
                ),
            ));
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "renewal reached {} of {} masters ({} failed) within its validity: {}",
                tally.yes,
                self.n(),
                tally.errors.len(),
                join_errors(&tally.errors)
            ),
        ))
    }

    /// Writes an election leader's value, under the grant's (derived) token, on every master
    /// that holds the grant (late joiners included), each write conditional on that master's
    /// own token of the grant: `true` once a majority wrote it, `false` when a majority can no
    /// longer hold the grant, `Unavailable` when unanswered masters leave it undecided.
    pub(super) async fn proclaim(self: &Arc<Self>, grant: &Grant, value: &str) -> Result<bool> {
        let (mut tokens, id) = self.decode(grant)?;
        let joined = id.and_then(|id| self.late().joined.get(&id).map(|j| j.tokens.clone()));
        for (t, j) in tokens.iter_mut().zip(joined.unwrap_or_default()) {
            if *t == 0 {
                *t = j;
            }
        }
        let deadline = Deadline::new(
            self.deadline(grant.ttl),
            Instant::now() + self.response_timeout,
        );
        let targets: Vec<usize> = (0..self.n()).filter(|&i| tokens[i] != 0).collect();
        let (name, owner, epoch) = (grant.name.clone(), grant.owner.clone(), grant.token.0);
        let value: Arc<str> = value.into();
        let tally = self
            .majority_round(&targets, deadline, move |s, i| {
                let (name, owner, t, value) =
                    (name.clone(), owner.clone(), tokens[i], value.clone());
                async move {
                    s.servers[i]
                        .proclaim(&name, &owner, (t, epoch), &value)
                        .await
                }
            })
            .await;
        if tally.yes >= self.quorum || tally.yes + tally.errors.len() < self.quorum {
            return Ok(tally.yes >= self.quorum);
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "proclaim reached {} of {} masters; {} failed: {}",
                tally.yes,
                self.n(),
                tally.errors.len(),
                join_errors(&tally.errors)
            ),
        )
        .with_lock(&grant.name))
    }

    pub(super) fn decode(&self, grant: &Grant) -> Result<(Vec<u64>, Option<u64>)> {
        decode_key(&grant.key, self.n()).ok_or_else(|| {
            Error::invalid(format!(
                "grant key {:?} is not a RedLock grant of {} masters",
                grant.key,
                self.n()
            ))
            .with_lock(&grant.name)
        })
    }
}
