//! One round: a request to every master at once, decided at a majority or the round's
//! deadline, with the requests not waited for finishing in the background.

use std::future::Future;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use distlock_api::{Error, ErrorKind, Result};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;

use crate::ops::Server;

use super::*;

/// The `k`-th largest value (1-based), if there are that many.
pub(super) fn kth_largest<T: Ord + Copy>(mut values: Vec<T>, k: usize) -> Option<T> {
    values.sort_unstable_by(|a, b| b.cmp(a));
    k.checked_sub(1).and_then(|i| values.get(i).copied())
}

/// The value at least `k` of `values` share, if any: the token a majority of masters keep.
pub(super) fn agreed(values: impl IntoIterator<Item = u64>, k: usize) -> Option<u64> {
    let mut values: Vec<u64> = values.into_iter().collect();
    values.sort_unstable();
    values
        .chunk_by(|a, b| a == b)
        .find(|run| run.len() >= k)
        .map(|run| run[0])
}

/// The requests of one round still in flight: master index and answer.
pub(super) type Pending<T> = FuturesUnordered<BoxFuture<'static, (usize, Result<T>)>>;

/// The next answer that arrives before `deadline`; `None` once none is in flight or the
/// deadline passed (the requests stay in `pending`).
pub(super) async fn next_before<T>(
    pending: &mut Pending<T>,
    deadline: Instant,
) -> Option<(usize, Result<T>)> {
    if pending.is_empty() {
        return None;
    }
    tokio::time::timeout_at(deadline.into(), pending.next())
        .await
        .ok()
        .flatten()
}

/// When a round stops waiting for the masters that have not answered: `per_master` after the
/// *first* answer, and never after `limit`. Counting from the first answer rather than from
/// the send means a stall of the client itself (a busy runtime or machine delays every answer
/// alike) is not taken for dead masters, while a master that is really down or paused costs
/// only `per_master` more than the quickest one.
pub(super) struct Deadline {
    pub(super) per_master: Duration,
    pub(super) limit: Instant,
    pub(super) anchored: bool,
}

impl Deadline {
    pub(super) fn new(per_master: Duration, limit: Instant) -> Self {
        Self {
            per_master,
            limit,
            anchored: false,
        }
    }

    pub(super) fn answered(&mut self) {
        if !self.anchored {
            self.anchored = true;
            self.limit = self.limit.min(Instant::now() + self.per_master);
        }
    }
}

/// Lets the requests a round did not wait for finish in a task of their own, handing each
/// answer to `late`. Outside a runtime they are dropped: what they may still cause on a master
/// ends with its lease.
pub(super) fn finish_late<T, F>(pending: Pending<T>, mut late: F)
where
    T: Send + 'static,
    F: FnMut(usize, Result<T>) -> Option<BoxFuture<'static, ()>> + Send + 'static,
{
    if pending.is_empty() {
        return;
    }
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let mut pending = pending;
            while let Some((i, r)) = pending.next().await {
                if let Some(reconcile) = late(i, r) {
                    reconcile.await;
                }
            }
        });
    }
}

pub(super) fn no_answer(server: &Server, within: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{}: no answer within {within:?}", server.endpoint.display),
    )
    .with_backend(server.backend)
}

pub(super) fn join_errors(errors: &[Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a round of conditional writes (release, renew, fence) counted.
pub(super) struct Tally {
    pub(super) yes: usize,
    pub(super) errors: Vec<Error>,
    /// The masters that answered with an error before the decision.
    pub(super) failed: Vec<usize>,
}

impl Shared {
    pub(super) fn n(&self) -> usize {
        self.servers.len()
    }

    pub(super) fn deadline(&self, ttl: Duration) -> Duration {
        master_deadline(ttl, self.response_timeout)
    }

    pub(super) fn late(&self) -> std::sync::MutexGuard<'_, LateTable> {
        self.late.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts `op` on every master in `targets` at once.
    pub(super) fn launch<T, F, Fut>(self: &Arc<Self>, targets: &[usize], op: F) -> Pending<T>
    where
        T: Send + 'static,
        F: Fn(Arc<Self>, usize) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        targets
            .iter()
            .map(|&i| {
                let fut = op(self.clone(), i);
                async move { (i, fut.await) }.boxed()
            })
            .collect()
    }

    /// Runs a conditional write (`Ok(true)`: it applied) on `targets` until a majority applied
    /// it, a majority can no longer apply it, or the deadline; the rest finish in the
    /// background. Masters that did not answer in time count among the errors.
    pub(super) async fn majority_round<F, Fut>(
        self: &Arc<Self>,
        targets: &[usize],
        deadline: Deadline,
        op: F,
    ) -> Tally
    where
        F: Fn(Arc<Self>, usize) -> Fut,
        Fut: Future<Output = Result<bool>> + Send + 'static,
    {
        self.majority_round_then(targets, deadline, op, |_, _| None)
            .await
    }

    /// [`majority_round`](Self::majority_round), handing each outcome that lands after the
    /// decision to `late`, whose future (if any) finishes in the background.
    pub(super) async fn majority_round_then<F, Fut, L>(
        self: &Arc<Self>,
        targets: &[usize],
        mut deadline: Deadline,
        op: F,
        late: L,
    ) -> Tally
    where
        F: Fn(Arc<Self>, usize) -> Fut,
        Fut: Future<Output = Result<bool>> + Send + 'static,
        L: FnMut(usize, Result<bool>) -> Option<BoxFuture<'static, ()>> + Send + 'static,
    {
        let started = Instant::now();
        let mut pending = self.launch(targets, op);
        let mut answered = vec![false; self.n()];
        let mut tally = Tally {
            yes: 0,
            errors: Vec::new(),
            failed: Vec::new(),
        };
        while tally.yes < self.quorum
            && tally.yes + tally.errors.len() + pending.len() >= self.quorum
        {
            let Some((i, r)) = next_before(&mut pending, deadline.limit).await else {
                break;
            };
            answered[i] = true;
            deadline.answered();
            match r {
                Ok(true) => tally.yes += 1,
                Ok(false) => {}
                Err(e) => {
                    tally.errors.push(e);
                    tally.failed.push(i);
                }
            }
        }
        let waited = started.elapsed();
        for &i in targets {
            if !answered[i] {
                tally.errors.push(no_answer(&self.servers[i], waited));
            }
        }
        // A conditional write that lands late changes nothing the decision relied on.
        finish_late(pending, late);
        tally
    }
}
