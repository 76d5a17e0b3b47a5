//! Handing a lock over between two tasks of one client: one round in which every master the
//! releasing grant holds passes it to the waiting task's owner (the hand-over script), where a
//! release round and the task's acquire round would take two.
//!
//! The round is an acquire round for the new owner and a release round for the old one at
//! once, and it is decided like an acquire: the new owner holds the lock once a majority of
//! masters passed it on within the new lease's validity, under a token derived as an acquire's
//! is (the largest of the majority's fresh counter values, written back to a majority unless a
//! majority returned it). Each master's script takes its counter's next value while the old
//! grant still holds that master, so the derived token is above the old grant's by the same
//! argument as for two grants one after the other (see the module docs of `redlock`).
//!
//! A round that does not reach a majority passes nothing on: what the minority passed is given
//! back, the old grant's holds still left are released (it was giving up its last hold), and
//! the outcome is that of a release. Answers that land after the decision are reconciled in
//! the background, as an acquire's are: a late pass joins the new grant (or is released when
//! the round failed or the grant is gone), a late "holds left" is released for the old grant,
//! and a master whose answer was lost is read once it answers again.

use std::sync::Arc;
use std::time::Instant;

use distlock_api::backend::wait::HandOver;
use distlock_api::backend::{drift, safe_until, AcquireRequest};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockName, OwnerId, Result};
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::ops::HandedOver;

use super::acquire::Answer;
use super::*;

/// What the late answers of a hand-over round are reconciled against.
#[derive(Clone)]
struct Parties {
    name: LockName,
    from: OwnerId,
    /// The releasing grant's token on each master (0: it holds none there).
    from_tokens: Vec<u64>,
    to: OwnerId,
    /// The new grant's id in the late table and its token, when the round won.
    join: Option<(u64, u64)>,
    /// Until when late answers are chased: the longer of the two leases, from now.
    until: Instant,
    /// Whether the old grant gave up its last hold (its holds still left anywhere are
    /// released), or one of several, or nobody knows (they are left to the core's release).
    from_done: bool,
}

impl Shared {
    pub(super) async fn hand_over(
        self: &Arc<Self>,
        from: &Grant,
        to: &AcquireRequest,
    ) -> Result<HandOver> {
        let (mut from_tokens, id) = self.decode(from)?;
        // Taken out, as a release takes it: a grant arriving late from now on releases itself.
        let joined = id.and_then(|id| self.late().joined.remove(&id));
        if let Some(joined) = &joined {
            for (t, &j) in from_tokens.iter_mut().zip(&joined.tokens) {
                if *t == 0 {
                    *t = j;
                }
            }
        }
        let n = self.n();
        let name = &from.name;
        let targets: Vec<usize> = (0..n).filter(|&i| from_tokens[i] != 0).collect();
        let sent_at = Instant::now();
        let valid_until = safe_until(sent_at, to.ttl);
        let per_master = self.deadline(to.ttl);
        let mut deadline = Deadline::new(per_master, valid_until);
        let mut pending = {
            let (name, owner, tokens) = (name.clone(), from.owner.clone(), from_tokens.clone());
            let (to_owner, ttl) = (to.owner.clone(), to.ttl);
            self.launch(&targets, move |s, i| {
                let (name, owner, t, to_owner) =
                    (name.clone(), owner.clone(), tokens[i], to_owner.clone());
                async move {
                    s.servers[i]
                        .hand_over(&name, &owner, t, &to_owner, ttl)
                        .await
                }
            })
        };

        let mut handed: Vec<(usize, u64)> = Vec::new();
        let mut kept: Vec<usize> = Vec::new();
        let mut failed: Vec<usize> = Vec::new();
        let mut errors: Vec<Error> = Vec::new();
        let mut answered = vec![false; n];
        loop {
            // Waits (within the deadline) while an answer still to come could change the
            // outcome: whether the lock passes, whether the grant kept holds on a majority (one
            // of several given up), whether it held a majority at all.
            let (q, left) = (self.quorum, pending.len());
            let held = handed.len() + kept.len();
            let open = |got: usize| got < q && got + left >= q;
            if handed.len() >= q || !(open(handed.len()) || open(kept.len()) || open(held)) {
                break;
            }
            let Some((i, r)) = next_before(&mut pending, deadline.limit).await else {
                break;
            };
            answered[i] = true;
            deadline.answered();
            match r {
                Ok(HandedOver::To { token }) => handed.push((i, token)),
                Ok(HandedOver::Kept) => kept.push(i),
                Ok(HandedOver::NotHeld) => {}
                Err(e) => {
                    errors.push(e);
                    failed.push(i);
                }
            }
        }
        let waited = sent_at.elapsed();
        for &i in &targets {
            if !answered[i] && handed.len() < self.quorum {
                errors.push(no_answer(&self.servers[i], waited));
            }
        }

        let won = handed.len() >= self.quorum && Instant::now() < valid_until;
        let token = if won {
            let granted: Vec<Answer> = handed
                .iter()
                .map(|&(master, token)| Answer {
                    master,
                    token,
                    count: 1,
                    fence: 0,
                })
                .collect();
            self.settle(to, &granted, valid_until).await
        } else {
            None
        };
        let until = Instant::now() + from.ttl.max(to.ttl) + drift(from.ttl.max(to.ttl));
        let mut parties = Parties {
            name: name.clone(),
            from: from.owner.clone(),
            from_tokens: from_tokens.clone(),
            to: to.owner.clone(),
            join: None,
            until,
            from_done: true,
        };
        if let Some(token) = token {
            let late_id = (!pending.is_empty() || !failed.is_empty()).then(|| {
                self.late()
                    .open(n, sent_at + to.ttl + self.response_timeout)
            });
            parties.join = late_id.map(|id| (id, token));
            self.settle_rest(&kept, &failed, pending, parties);
            let mut tokens = vec![0u64; n];
            for &(i, t) in &handed {
                tokens[i] = t;
            }
            return Ok(HandOver::Handed(
                Grant::new(
                    name.clone(),
                    to.owner.clone(),
                    FencingToken(token),
                    1,
                    to.ttl,
                    sent_at,
                )
                .with_key(encode_key(&tokens, late_id)),
            ));
        }

        // Nothing passed: what a minority passed goes back. The outcome is a release's: one
        // hold given up where the grant kept holds on a majority; otherwise it was giving up
        // its last hold, and lets go of those it kept; undecided when too many masters did not
        // answer (the core then sends a release again, and gives the new owner's holds back).
        let held = handed.len() + kept.len();
        let decided = held >= self.quorum || held + errors.len() < self.quorum;
        parties.from_done = decided && kept.len() < self.quorum;
        if !handed.is_empty() {
            self.give_back(to, &handed, per_master).await;
        }
        self.settle_rest(&kept, &failed, pending, parties);
        if decided {
            return Ok(HandOver::Released(held >= self.quorum));
        }
        if let (Some(id), Some(joined)) = (id, joined) {
            // Undecided: the release sent again for the old grant must reach its late joiners.
            self.late().joined.insert(id, joined);
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "hand-over reached {held} of {n} masters holding the grant; {} failed: {}",
                errors.len(),
                join_errors(&errors)
            ),
        ))
    }

    /// Settles in the background what the round's decision left: the old grant's holds on the
    /// masters that `kept` one (released when it gave up its last hold), the masters whose
    /// answer was lost (`failed`), and the answers still to come.
    fn settle_rest(
        self: &Arc<Self>,
        kept: &[usize],
        failed: &[usize],
        pending: Pending<HandedOver>,
        parties: Parties,
    ) {
        if parties.from_done {
            for &i in kept {
                tokio::spawn(self.clone().release_from(i, parties.clone()));
            }
        }
        for &i in failed {
            tokio::spawn(self.clone().reconcile(i, parties.clone()));
        }
        let s = self.clone();
        finish_late(pending, move |i, r| {
            let p = parties.clone();
            let s = s.clone();
            match r {
                Ok(HandedOver::To { token }) => {
                    Some(async move { s.settle_pass(i, &p, token).await }.boxed())
                }
                Ok(HandedOver::Kept) if p.from_done => Some(s.release_from(i, p)),
                Ok(HandedOver::Kept | HandedOver::NotHeld) => None,
                Err(_) => Some(s.reconcile(i, p)),
            }
        });
    }

    /// Releases the old grant's hold on master `i`.
    fn release_from(self: Arc<Self>, i: usize, p: Parties) -> BoxFuture<'static, ()> {
        async move {
            self.release_until(i, &p.name, &p.from, (p.from_tokens[i], true), p.until)
                .await
        }
        .boxed()
    }

    /// Master `i` passed the lock to the new owner under its token `t`: the pass joins the new
    /// grant, or is released if the round failed or the grant is gone.
    async fn settle_pass(&self, i: usize, p: &Parties, t: u64) {
        if let Some(join) = p.join {
            if self.join_until(i, &p.name, &p.to, t, join, p.until).await {
                return;
            }
        }
        self.release_until(i, &p.name, &p.to, (t, true), p.until)
            .await;
    }

    /// Master `i`'s answer was lost: once it answers again, whichever of the two owners holds
    /// it there is settled (the new one's hold joins the grant the round won, the old one's is
    /// released when it gave up its last hold).
    fn reconcile(self: Arc<Self>, i: usize, p: Parties) -> BoxFuture<'static, ()> {
        async move {
            match self
                .holder_once_answered(i, &p.name, p.until)
                .await
                .flatten()
            {
                // Only into a grant that won: else the waiting task goes on under the same
                // owner, and the hold read now may be its own later grant's (taken afresh over
                // the pass), which the waiter's next attempt or the core's give-back settles.
                Some(h) if h.owner == p.to && p.join.is_some() => {
                    self.settle_pass(i, &p, h.token).await
                }
                Some(h) if h.owner == p.from && p.from_done => {
                    self.release_until(i, &p.name, &p.from, (h.token, true), p.until)
                        .await
                }
                _ => {}
            }
        }
        .boxed()
    }
}
