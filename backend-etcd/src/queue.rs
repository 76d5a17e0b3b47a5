//! The queue: a contender's entry key under the lock's directory, the oldest entry holding the
//! lock, and every waiter watching the delete of the entry just before its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use distlock_api::backend::wait::{self, Attempt};
use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, ErrorKind, Grant, Result};
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, Txn, TxnOp, TxnResponse};
use tokio::sync::broadcast::error::RecvError;

use crate::count_down::Older;
use crate::holds::{
    entries, lock, put_count, range_count, range_result, Gated, Holds, Pending, Repair, Shared,
};
use crate::keys::{self, keeps_reappearing};
use crate::lease::LeaseInfo;
use crate::notices::{Seen, Subscription, WATCH_RETRY};
use crate::permits::Taken;

/// The most entries the queueing reads back. A waiter that saw every entry older than its own
/// (a queue at most this deep) and was subscribed to the directory's deletes before it read
/// them takes its turn when the last of them is deleted, with no further read.
const QUEUE_READ: i64 = 64;

/// The entry a waiter waits on: the next-lower one.
#[derive(Clone, Debug)]
pub(crate) struct Pred {
    key: Vec<u8>,
    /// Its create-revision, which tells it apart from a later entry at the same key.
    rev: i64,
    /// Whether it was the oldest entry of the lock when read, so the holder: every entry made
    /// later is younger than ours, so once it is gone ours is the oldest.
    oldest: bool,
}

impl Pred {
    /// The entry before ours, `older`, and whether it was the oldest of the lock when read.
    fn from_read(older: Option<&KeyValue>, oldest: bool) -> Option<Self> {
        older.map(|kv| Pred {
            key: kv.key().to_vec(),
            rev: kv.create_revision(),
            oldest,
        })
    }
}

/// The read of a lock's oldest entry: its holder.
fn oldest_entry(dir: &str) -> TxnOp {
    TxnOp::get(dir, Some(entries(SortOrder::Ascend).with_limit(1)))
}

/// A waiting acquire: what it asked for and the entry it queued.
pub(crate) struct Turn<'a> {
    req: &'a AcquireRequest,
    key: &'a str,
    dir: &'a str,
    lease: LeaseInfo,
    /// The hold it gets at its turn: one, with its entry's create-revision as token.
    holds: Holds,
}

impl Shared {
    /// Acquires `req`; with no deadline, only if that needs no waiting (`None` otherwise).
    /// `Ok(None)` with a deadline means the deadline passed while waiting for this client's
    /// other acquire of the same key.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let lease = self.lease.current()?;
        let dir = keys::lock_dir(&self.config.key_prefix, req.name.as_str());
        let key = keys::key_for(&dir, req.permits, lease.id, &req.owner);
        let slot = self.slot(&key);
        let gate = match deadline {
            None => match slot.slot.gate.clone().try_lock_owned() {
                Ok(gate) => gate,
                // Another acquire or release of this key is under way. If the owner holds the
                // lock it is a quick re-count, worth waiting for; otherwise it is a waiter in
                // the queue, so someone else holds the lock.
                Err(_) if slot.holds().count > 0 => {
                    let gate = slot.slot.gate.clone().lock_owned();
                    tokio::time::timeout(self.config.client.operation_timeout, gate)
                        .await
                        .map_err(|_| {
                            Error::new(
                                ErrorKind::Unavailable,
                                "this owner's previous operation on the lock is still retrying",
                            )
                        })?
                }
                Err(_) => return Ok(None),
            },
            Some(deadline) => {
                let gate = slot.slot.gate.clone();
                match tokio::time::timeout_at(deadline.into(), gate.lock_owned()).await {
                    Ok(gate) => gate,
                    Err(_) => return Ok(None),
                }
            }
        };

        let held = slot.holds();
        let (gate, slot) = if held.count > 0 {
            // Reentrant: confirm the key is still ours and count the hold into its value.
            let next = held.count + 1;
            let pending = Gated::armed(slot, gate, Repair::RestoreCount { token: held.token });
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    held.token,
                )])
                .and_then([put_count(&key, next, lease.id)]);
            let resp = self.txn("re-acquiring", txn).await?;
            let Gated { gate, slot, .. } = pending.disarm();
            if resp.succeeded() {
                let holds = Holds {
                    count: next,
                    token: held.token,
                };
                slot.set(holds);
                return self.grant(req, &key, lease, holds).map(Some);
            }
            // The key is gone (removed, or its lease lost): those holds are stale, and their
            // guards learn it at their next renewal. Queue afresh.
            slot.set(Holds::default());
            (gate, slot)
        } else {
            (gate, slot)
        };

        let mut pending = Gated::armed(slot, gate, Repair::Delete);
        if req.permits > 1 {
            let taken = self.take_permit(req, &key, &dir, lease, deadline, &mut pending);
            let holds = match taken.await? {
                Taken::Granted(holds) => holds,
                // A try that found every permit taken, its entry deleted again.
                Taken::Left => {
                    drop(pending.disarm());
                    return Ok(None);
                }
                // Its entry is deleted in the background, still behind the gate.
                Taken::TimedOut => return Ok(None),
            };
            let grant = self.grant(req, &key, lease, holds)?;
            let Gated { gate, slot, .. } = pending.disarm();
            slot.set(holds);
            drop(gate);
            return Ok(Some(grant));
        }
        // A hot lock's directory is watched by this client already: subscribed before the
        // queueing, the waiter sees every delete after the queue it reads, and needs no
        // second look at its predecessor before it waits.
        let early = deadline.and_then(|_| self.watches.subscribe_if_live(&self.endpoints, &dir));
        let (my_rev, pred, older) = self.enqueue(&key, &dir, lease.id, &mut pending).await?;
        // Every older entry is known, and the subscription made before the read sees each of
        // their deletes: the waiter can count them down.
        let older = older.filter(|_| early.is_some());
        let holds = Holds {
            count: 1,
            token: my_rev,
        };
        let grant = match (pred, deadline) {
            (None, _) => self.grant(req, &key, lease, holds)?,
            (Some(_), None) => {
                // try-acquire: not first, so leave the queue at once.
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        my_rev,
                    )])
                    .and_then([TxnOp::delete(key.as_str(), None)]);
                self.txn("leaving the queue", txn).await?;
                drop(pending.disarm());
                return Ok(None);
            }
            (Some(pred), Some(deadline)) => {
                let turn = Turn {
                    req,
                    key: &key,
                    dir: &dir,
                    lease,
                    holds,
                };
                self.wait_turn(&turn, pred, deadline, early, older).await?
            }
        };
        let Gated { gate, slot, .. } = pending.disarm();
        slot.set(holds);
        drop(gate);
        Ok(Some(grant))
    }

    /// Creates this client's entry key for the lock (absent keys only), and returns its
    /// create-revision, the entry just before it, if any, and every entry older than it when
    /// the queue is at most [`QUEUE_READ`] deep.
    pub(crate) async fn enqueue(
        self: &Arc<Self>,
        key: &str,
        dir: &str,
        lease_id: i64,
        pending: &mut Pending,
    ) -> Result<(i64, Option<Pred>, Option<Older>)> {
        // A name held as a semaphore has permit entries, which keep a lock out: one more
        // compare (of a range that is empty for a lock) in the queueing transaction.
        let (permits, permits_end) = keys::permits_range(dir);
        for _ in 0..3 {
            // Our put is the newest write, so the newest entry is ours, the next the one we
            // queue behind, and the rest older still.
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key, CompareOp::Equal, 0),
                    Compare::create_revision(permits.as_str(), CompareOp::Equal, 0)
                        .with_range(permits_end.as_str()),
                ])
                .and_then([
                    put_count(key, 1, lease_id),
                    TxnOp::get(
                        dir,
                        Some(
                            entries(SortOrder::Descend)
                                .with_limit(QUEUE_READ)
                                .with_keys_only(),
                        ),
                    ),
                ])
                .or_else([
                    TxnOp::get(key, None),
                    TxnOp::get(
                        permits.as_str(),
                        Some(
                            GetOptions::new()
                                .with_range(permits_end.as_str())
                                .with_keys_only()
                                .with_limit(1),
                        ),
                    ),
                ]);
            let resp = self.queueing(txn, pending).await?;
            if resp.succeeded() {
                let kvs = range_result(&resp, 1)?;
                let mine = kvs
                    .first()
                    .filter(|kv| kv.key() == key.as_bytes())
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Backend,
                            "the new lock key is not the newest entry",
                        )
                    })?;
                // The read counts every entry of the lock: two means the one before ours is
                // the oldest.
                let count = range_count(&resp, 1)?;
                let pred = Pred::from_read(kvs.get(1), count == 2);
                let older = (usize::try_from(count).ok() == Some(kvs.len())).then(|| {
                    kvs[1..]
                        .iter()
                        .map(|kv| (kv.key().to_vec(), kv.create_revision()))
                        .collect()
                });
                return Ok((mine.create_revision(), pred, older));
            }
            if let Some(permit) = range_result(&resp, 1)?.first() {
                return Err(crate::permits::other_size(dir, permit.key(), 1));
            }
            self.clear_stale(key, &resp).await?;
        }
        Err(keeps_reappearing(key))
    }

    /// Sends a transaction that creates an entry key from a task of its own, which the key's
    /// repair waits for if the acquire is dropped meanwhile (see `Gated::in_flight`).
    pub(crate) async fn queueing(
        self: &Arc<Self>,
        txn: Txn,
        pending: &mut Pending,
    ) -> Result<TxnResponse> {
        let s = self.clone();
        let request = pending
            .in_flight
            .insert(tokio::spawn(async move { s.txn("queueing", txn).await }));
        let resp = request.await.map_err(|e| {
            Error::new(
                ErrorKind::Backend,
                format!("the queueing request failed: {e}"),
            )
        });
        pending.in_flight = None;
        resp?
    }

    /// After a queueing transaction found `key` present, whose first read of the failure
    /// branch is of `key`: the key exists though no acquire, hold or cleanup of ours uses it (a
    /// request that timed out but was applied after all), so it is cleared, to queue afresh.
    pub(crate) async fn clear_stale(&self, key: &str, resp: &TxnResponse) -> Result<()> {
        if let Some(stale) = range_result(resp, 0)?.first() {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key,
                    CompareOp::Equal,
                    stale.create_revision(),
                )])
                .and_then([TxnOp::delete(key, None)]);
            self.txn("clearing a stale key", txn).await?;
        }
        Ok(())
    }

    /// Waits until `turn`'s entry is the oldest of its lock, or the deadline passes, and
    /// returns the grant it then holds.
    pub(crate) async fn wait_turn(
        &self,
        turn: &Turn<'_>,
        first: Pred,
        deadline: Instant,
        early: Option<Subscription>,
        older: Option<Older>,
    ) -> Result<Grant> {
        let known = Mutex::new(Some(first));
        // Every entry older than ours, while the subscription has seen every delete since the
        // read that listed them: counted down, they say when ours is the oldest.
        let older = Mutex::new(older);
        let target = Mutex::new(None::<Pred>);
        // Set when the predecessor held the lock and is gone: this entry is the oldest now.
        let first_now = AtomicBool::new(false);
        // The subscription to the directory's deletes, kept from one wait to the next: made
        // before the last read of the queue, it misses no delete that read did not see.
        let subscription = Mutex::new(early);
        let (known, target, first_now, subscription, older) =
            (&known, &target, &first_now, &subscription, &older);
        wait::notified(
            deadline,
            move || async move {
                let known = lock(known).take();
                let next = match known {
                    Some(pred) => Some(pred),
                    None if first_now.swap(false, Ordering::SeqCst)
                        && self.lease.get(turn.lease.id).is_some() =>
                    {
                        None
                    }
                    None => self.predecessor(turn).await?,
                };
                Ok(match next {
                    None => {
                        Attempt::Granted(self.grant(turn.req, turn.key, turn.lease, turn.holds)?)
                    }
                    Some(pred) => {
                        *lock(target) = Some(pred);
                        Attempt::Held { expires_in: None }
                    }
                })
            },
            move |max| async move {
                let pred = lock(target).take();
                if let Some(pred) = pred {
                    let mut sub = lock(subscription).take();
                    let mut counting = lock(older).take().filter(|_| sub.is_some());
                    if counting.is_some() {
                        let lease = turn.lease.id;
                        if self.count_down(&mut counting, &mut sub, lease, max).await {
                            first_now.store(true, Ordering::SeqCst);
                        }
                        *lock(older) = counting;
                        *lock(subscription) = sub;
                        return;
                    }
                    // Our own entry goes with the lease: then there is nothing left to wait for.
                    let woken = async {
                        tokio::select! {
                            gone = self.wait_delete(turn.dir, &pred, &mut sub) => gone,
                            _ = self.lease.gone(turn.lease.id) => false,
                        }
                    };
                    let woken = tokio::time::timeout(max, woken).await;
                    *lock(subscription) = sub;
                    // Gone, and it held the lock (it was the oldest when read, or this client
                    // was granted it): ours is the oldest now.
                    if let Ok(true) = woken {
                        if pred.oldest
                            || lock(&self.released)
                                .get(&(pred.key.clone(), pred.rev))
                                .is_some()
                        {
                            first_now.store(true, Ordering::SeqCst);
                        }
                    }
                }
            },
        )
        .await
    }

    /// Why a waiter whose entry was made under lease `lease` has no entry any more: the lease
    /// is gone (closed, or lost and not replaced yet: which; replaced already: that it was
    /// lost), or else the entry was deleted.
    pub(crate) fn waiter_gone(&self, lease: i64) -> Error {
        if self.lease.get(lease).is_some() {
            return Error::new(
                ErrorKind::Unavailable,
                "this waiter's key was deleted while it waited (by an operator, or its lease \
                 expired)",
            );
        }
        match self.lease.current() {
            Err(e) => e,
            Ok(_) => Error::new(
                ErrorKind::Unavailable,
                "the client's lease was lost while waiting, and this waiter's key with it",
            ),
        }
    }

    /// The entry just before `turn`'s, if `turn`'s entry still exists; an error if not.
    pub(crate) async fn predecessor(&self, turn: &Turn<'_>) -> Result<Option<Pred>> {
        if self.lease.get(turn.lease.id).is_none() {
            return Err(self.waiter_gone(turn.lease.id));
        }
        let my_rev = turn.holds.token;
        let txn = Txn::new()
            .when([Compare::create_revision(turn.key, CompareOp::Equal, my_rev)])
            .and_then([
                TxnOp::get(
                    turn.dir,
                    Some(
                        entries(SortOrder::Descend)
                            .with_max_create_revision(my_rev - 1)
                            .with_limit(1),
                    ),
                ),
                oldest_entry(turn.dir),
            ]);
        let resp = self.txn("checking the queue", txn).await?;
        if !resp.succeeded() {
            return Err(self.waiter_gone(turn.lease.id));
        }
        let older = range_result(&resp, 0)?;
        let oldest = range_result(&resp, 1)?;
        let is_oldest = |kv: &KeyValue| {
            oldest
                .first()
                .is_some_and(|o| o.key() == kv.key() && o.create_revision() == kv.create_revision())
        };
        Ok(Pred::from_read(
            older.first(),
            older.first().is_some_and(is_oldest),
        ))
    }

    /// Returns when `pred` is gone (`true`), or the watch ends some other way (`false`); the
    /// caller looks at the queue again unless `pred` held the lock.
    ///
    /// `sub` is the waiter's subscription to the client's shared watch of the lock's directory
    /// ([`crate::notices`]), kept across waits. One made here misses the deletes from before
    /// it, so the predecessor is then read again; one made before the queue was last read
    /// (the caller's) misses nothing that read did not see.
    pub(crate) async fn wait_delete(
        &self,
        dir: &str,
        pred: &Pred,
        sub: &mut Option<Subscription>,
    ) -> bool {
        let events = match sub {
            Some(sub) => sub,
            None => {
                let fresh = match self.watches.subscribe(&self.endpoints, dir).await {
                    Ok(fresh) => fresh,
                    Err(_) => {
                        self.endpoints.failed(self.endpoints.index());
                        tokio::time::sleep(WATCH_RETRY).await;
                        return false;
                    }
                };
                let fresh = sub.insert(fresh);
                let still_there = Txn::new().when([Compare::create_revision(
                    pred.key.clone(),
                    CompareOp::Equal,
                    pred.rev,
                )]);
                match self.txn("watching the queue", still_there).await {
                    Ok(resp) if resp.succeeded() => {}
                    // Gone already.
                    Ok(_) => return true,
                    Err(_) => {
                        tokio::time::sleep(WATCH_RETRY).await;
                        return false;
                    }
                }
                fresh
            }
        };
        loop {
            match events.events.recv().await {
                // A delete at the predecessor's key after it was created: this entry is gone.
                Ok(Seen::Deleted { key, rev, .. }) if key == pred.key && rev > pred.rev => {
                    return true
                }
                Ok(Seen::Deleted { .. }) => {}
                Ok(Seen::Broken) | Err(RecvError::Closed) => {
                    self.endpoints.failed(events.endpoint);
                    *sub = None;
                    tokio::time::sleep(WATCH_RETRY).await;
                    return false;
                }
                // Fell behind the watch: the delete may be among what was skipped (the caller
                // reads the queue again, still subscribed).
                Err(RecvError::Lagged(_)) => return false,
            }
        }
    }
}
