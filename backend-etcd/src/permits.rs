//! Semaphores: a permit is a queue entry as a lock's is, and holds while fewer than `max`
//! entries of the name are older than it.
//!
//! A permit's entry, `~<max>~<lease>-<owner>` under the name's directory, is created with the
//! client's lease by one transaction that also asks that the directory holds no entry of
//! another kind: no lock entry and no permit of another size (two range compares, see
//! [`keys::other_than_size`]). The same transaction counts the directory's entries, so it says
//! at once how many are older than the new one (its rank). Since a create-revision only rises,
//! an entry's rank only falls, and at any revision the entries of rank below `max` are the
//! `max` oldest: never more than `max` permits are held.
//!
//! A waiter of rank `r ≥ max` holds once `r - max + 1` older entries are deleted. It counts
//! them on the client's shared watch of the directory ([`crate::notices`]), whose deletes carry
//! the deleted entry's create-revision: an older entry's delete counts one down, a younger one's
//! nothing. So a release wakes exactly the waiter it makes first in line, at the delete event
//! and with no request of its own; the others count one down and go on waiting, also without a
//! request. The count is exact as of a read (the queueing transaction, when the client watched
//! the directory already; otherwise a read of the older entries made after subscribing) and
//! every delete after that read reaches the subscription.

use std::sync::Arc;
use std::time::Instant;

use distlock_api::backend::wait::NOTICE_RECHECK;
use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, ErrorKind, Result};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::sync::broadcast::error::RecvError;

use crate::holds::{put_count, range_count, range_result, Holds, Pending, Shared};
use crate::keys;
use crate::keys::keeps_reappearing;
use crate::lease::LeaseInfo;
use crate::notices::{Seen, Subscription, WATCH_RETRY};

/// How a permit request ended.
pub(crate) enum Taken {
    /// Its entry holds a permit.
    Granted(Holds),
    /// A try found every permit taken, and its entry is deleted again.
    Left,
    /// The deadline passed while it waited; its entry is still there (the caller's repair
    /// deletes it).
    TimedOut,
}

/// The refusal of a request for `asked` permits (1: the lock) on the name whose directory `dir`
/// holds the entry `found`, of another kind or size.
pub(crate) fn other_size(dir: &str, found: &[u8], asked: u32) -> Error {
    let held = match keys::parse_entry(dir, found).map(|e| e.max) {
        Some(1) => "as a lock (1 permit)".to_string(),
        Some(max) => format!("as a semaphore of {max} permits"),
        None => "with another number of permits".to_string(),
    };
    Error::invalid(format!(
        "the name is held {held}, not the {asked} permit(s) this request asks for"
    ))
}

/// A permit's entry while it waits.
struct Waiter<'a> {
    key: &'a str,
    dir: &'a str,
    /// Its create-revision: the permit's token.
    rev: i64,
    max: i64,
    lease: i64,
}

/// How many entries are older than a waiter's, as of a revision.
#[derive(Clone, Copy, Debug)]
struct Ahead {
    older: i64,
    /// The revision of the read that counted them: deletes up to it are in the count.
    seen: i64,
}

impl Shared {
    /// Queues `key` as a permit of `req.permits` and, with a deadline, waits until fewer than
    /// that many entries are older than it.
    pub(crate) async fn take_permit(
        self: &Arc<Self>,
        req: &AcquireRequest,
        key: &str,
        dir: &str,
        lease: LeaseInfo,
        deadline: Option<Instant>,
        pending: &mut Pending,
    ) -> Result<Taken> {
        let max = i64::from(req.permits);
        // Subscribed before the queueing, to a watch the client has already, the waiter sees
        // every delete after the queueing's count: it needs no read of its own to wait.
        let early = deadline.and_then(|_| self.watches.subscribe_if_live(&self.endpoints, dir));
        let (rev, older) = self
            .enqueue_permit(key, dir, req.permits, lease.id, pending)
            .await?;
        let holds = Holds {
            count: 1,
            token: rev,
        };
        if older < max {
            return Ok(Taken::Granted(holds));
        }
        let Some(deadline) = deadline else {
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, rev)])
                .and_then([TxnOp::delete(key, None)]);
            self.txn("leaving the queue", txn).await?;
            return Ok(Taken::Left);
        };
        let waiter = Waiter {
            key,
            dir,
            rev,
            max,
            lease: lease.id,
        };
        let ahead = early.is_some().then_some(Ahead { older, seen: rev });
        let wait = self.wait_permit(&waiter, early, ahead);
        match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(waited) => waited.map(|()| Taken::Granted(holds)),
            Err(_) => Ok(Taken::TimedOut),
        }
    }

    /// Creates this client's permit entry `key` of a semaphore of `max` (absent keys only, and
    /// only while the name has no entry of another kind or size), and returns its
    /// create-revision and how many entries are older.
    async fn enqueue_permit(
        self: &Arc<Self>,
        key: &str,
        dir: &str,
        max: u32,
        lease_id: i64,
        pending: &mut Pending,
    ) -> Result<(i64, i64)> {
        let others = keys::other_than_size(dir, max);
        let none_in = |(start, end): &(String, String)| {
            Compare::create_revision(start.as_str(), CompareOp::Equal, 0).with_range(end.as_str())
        };
        let first_in = |(start, end): &(String, String)| {
            let options = GetOptions::new()
                .with_range(end.as_str())
                .with_keys_only()
                .with_limit(1);
            TxnOp::get(start.as_str(), Some(options))
        };
        for _ in 0..3 {
            // Our put is the newest write: every other entry the count finds is older.
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key, CompareOp::Equal, 0),
                    none_in(&others[0]),
                    none_in(&others[1]),
                ])
                .and_then([
                    put_count(key, 1, lease_id),
                    TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
                    TxnOp::get(dir, Some(GetOptions::new().with_prefix().with_count_only())),
                ])
                .or_else([
                    TxnOp::get(key, None),
                    first_in(&others[0]),
                    first_in(&others[1]),
                ]);
            let resp = self.queueing(txn, pending).await?;
            if resp.succeeded() {
                let rev = range_result(&resp, 1)?
                    .first()
                    .map(|kv| kv.create_revision())
                    .ok_or_else(|| {
                        Error::new(ErrorKind::Backend, "the new permit key was not read back")
                    })?;
                return Ok((rev, range_count(&resp, 2)? - 1));
            }
            for other in [1, 2] {
                if let Some(kv) = range_result(&resp, other)?.first() {
                    return Err(other_size(dir, kv.key(), max));
                }
            }
            self.clear_stale(key, &resp).await?;
        }
        Err(keeps_reappearing(key))
    }

    /// Waits until fewer than `w.max` entries are older than `w`'s, counting the older ones
    /// down as the subscription sees them deleted. `ahead` is their count as of a read that
    /// `sub` has seen every later delete of; without one, the waiter subscribes and counts.
    async fn wait_permit(
        &self,
        w: &Waiter<'_>,
        mut sub: Option<Subscription>,
        mut ahead: Option<Ahead>,
    ) -> Result<()> {
        loop {
            if sub.is_none() {
                ahead = None;
                match self.watches.subscribe(&self.endpoints, w.dir).await {
                    Ok(fresh) => sub = Some(fresh),
                    Err(_) => {
                        // The count below fails if the lease or the entry is gone; else the
                        // waiter subscribes again.
                        self.endpoints.failed(self.endpoints.index());
                        tokio::time::sleep(WATCH_RETRY).await;
                    }
                }
            }
            let count = match ahead {
                Some(count) => count,
                None => *ahead.insert(self.count_ahead(w).await?),
            };
            if count.older < w.max {
                return Ok(());
            }
            let Some(events) = sub.as_mut() else {
                continue;
            };
            let seen = tokio::select! {
                seen = tokio::time::timeout(NOTICE_RECHECK, events.events.recv()) => seen,
                // The entry goes with the lease: the count says so.
                _ = self.lease.gone(w.lease) => {
                    ahead = None;
                    continue;
                }
            };
            match seen {
                Ok(Ok(Seen::Deleted { key, rev, created })) => {
                    let Some(count) = ahead.as_mut() else {
                        continue;
                    };
                    if rev <= count.seen || created > w.rev {
                        // Counted already, or younger than ours.
                    } else if created == 0 || (created == w.rev && key == w.key.as_bytes()) {
                        // Of unknown age, or our own entry: look.
                        ahead = None;
                    } else if created < w.rev {
                        count.older -= 1;
                    }
                }
                Ok(Ok(Seen::Broken) | Err(RecvError::Closed)) => {
                    self.endpoints.failed(events.endpoint);
                    sub = None;
                    tokio::time::sleep(WATCH_RETRY).await;
                }
                // Fell behind the watch: count again, still subscribed.
                Ok(Err(RecvError::Lagged(_))) => ahead = None,
                // Quiet for a while: count again, in case a delete was missed.
                Err(_) => ahead = None,
            }
        }
    }

    /// Counts the entries older than `w`'s, if `w`'s still exists; an error if not.
    async fn count_ahead(&self, w: &Waiter<'_>) -> Result<Ahead> {
        if self.lease.get(w.lease).is_none() {
            return Err(self.waiter_gone(w.lease));
        }
        // etcd counts a range before its create-revision filter: the filtered keys are read.
        let older = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(w.rev - 1);
        let txn = Txn::new()
            .when([Compare::create_revision(w.key, CompareOp::Equal, w.rev)])
            .and_then([TxnOp::get(w.dir, Some(older))]);
        let resp = self.txn("counting the permits ahead", txn).await?;
        if !resp.succeeded() {
            return Err(self.waiter_gone(w.lease));
        }
        let seen = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| Error::new(ErrorKind::Backend, "etcd answered without a revision"))?;
        let older = i64::try_from(range_result(&resp, 0)?.len()).unwrap_or(i64::MAX);
        Ok(Ahead { older, seen })
    }
}
