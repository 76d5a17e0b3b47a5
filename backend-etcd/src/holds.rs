//! The client's state and the locks it holds: per entry key (name, owner, lease) the local
//! hold count and the gate that serialises this client's operations on the key, the repair
//! that runs when such an operation stops half-way, and releasing, renewing and inspecting.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Armed, Cleanup};
use distlock_api::backend::{lost, AcquireRequest, ClientCore};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, Result};
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, DeleteResponse, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::sync::OwnedMutexGuard;

use crate::config::EtcdConfig;
use crate::endpoints::Endpoints;
use crate::keys;
use crate::lease::{LeaseCell, LeaseInfo};

/// The longest pause between retries of a background cleanup.
pub(crate) const CLEANUP_MAX_DELAY: Duration = Duration::from_secs(2);

/// The client's state, shared with its background tasks.
pub(crate) struct Shared {
    pub(crate) core: ClientCore,
    pub(crate) endpoints: Endpoints,
    pub(crate) config: EtcdConfig,
    pub(crate) lease: LeaseCell,
    /// Per entry key: the hold count and the gate that serialises this client's acquires and
    /// releases of that key.
    pub(crate) slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// The watches of lock directories that this client's waiters share.
    pub(crate) watches: Arc<crate::notices::Watches>,
    /// The entries of grants this client released lately (see [`Released`]).
    pub(crate) released: Mutex<Released>,
    /// How many requests [`Shared::call`] sent (test-only).
    #[cfg(feature = "testing")]
    pub(crate) requests: std::sync::atomic::AtomicU64,
}

/// How many released entries [`Released`] remembers.
const REMEMBER_RELEASED: usize = 256;

/// The entries (key and create-revision) of grants this client released lately. A granted
/// entry was the oldest of its lock and stays the oldest until it is deleted; the waiter queued
/// right behind it (no entry between them at its last look, and every later one is younger) is
/// therefore the holder once it is gone. So a waiter of this client whose predecessor is one of
/// these takes its turn at the delete event without reading the queue again: a hand-off between
/// tasks of one client costs the release's request alone.
pub(crate) type Released = distlock_api::backend::Recent<(Vec<u8>, i64), (), REMEMBER_RELEASED>;

/// The local state of one entry key (one name, one owner, one lease).
#[derive(Default)]
pub(crate) struct Slot {
    /// Held by whoever is creating, re-counting or deleting the key, including a background
    /// cleanup: while it is held, nothing else of this client touches the key.
    pub(crate) gate: Arc<tokio::sync::Mutex<()>>,
    pub(crate) holds: Mutex<Holds>,
}

/// How often the owner holds the lock through this key, and the key's create-revision.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Holds {
    pub(crate) count: u32,
    pub(crate) token: i64,
}

impl Holds {
    pub(crate) fn held_by(&self, token: FencingToken) -> bool {
        self.count > 0 && u64::try_from(self.token).ok() == Some(token.0)
    }
}
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single assignment or map operation, so a poisoned
    // lock still guards consistent state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A reference to a slot that removes it from the map when it is the last one and the slot
/// holds nothing, so slots of released locks do not pile up.
pub(crate) struct SlotRef {
    pub(crate) shared: Arc<Shared>,
    pub(crate) key: String,
    pub(crate) slot: Arc<Slot>,
}

impl SlotRef {
    pub(crate) fn holds(&self) -> Holds {
        *lock(&self.slot.holds)
    }

    pub(crate) fn set(&self, holds: Holds) {
        *lock(&self.slot.holds) = holds;
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        let mut slots = lock(&self.shared.slots);
        // References are only handed out under this lock, so the count cannot grow meanwhile:
        // two means the map's and ours.
        let unused = slots
            .get(&self.key)
            .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
            && Arc::strong_count(&self.slot) == 2
            && lock(&self.slot.holds).count == 0;
        if unused {
            slots.remove(&self.key);
        }
    }
}

/// What to do about an entry key if the operation that owns its gate stops half-way (its
/// future dropped, or a request failed).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Repair {
    /// Delete the key: it is a waiter's that gave up, or a grant nobody received or kept.
    /// Unconditional, which is safe because the gate is held and the slot holds nothing, so
    /// whatever sits at this client-and-owner-specific key is garbage.
    Delete,
    /// Write the local hold count back into the key's value (for `inspect`).
    RestoreCount { token: i64 },
}

/// The gate of an entry key, with a repair that runs in the background, still holding the
/// gate, unless [`disarm`](Armed::disarm)ed. This is what makes a dropped `acquire` leave
/// nothing behind: not its waiter key, and not a grant that raced the cancellation. Without a
/// runtime the key stays until the lease ends (the client's drop revokes it).
pub(crate) struct Gated {
    pub(crate) gate: OwnedMutexGuard<()>,
    pub(crate) slot: SlotRef,
    repair: Repair,
    /// The request that creates the key, while it is under way. It runs as a task of its own,
    /// so a dropped acquire does not cut it off half-way: the repair waits for it to land
    /// before deleting. (Cut off, it may still be applied by the server after the repair's
    /// delete, and leave a queue entry that no guard owns, holding the lock forever.)
    pub(crate) in_flight: Option<tokio::task::JoinHandle<Result<TxnResponse>>>,
}

/// An operation on an entry key under way.
pub(crate) type Pending = Armed<Gated>;

impl Gated {
    /// Arms `repair` for the key of `slot`, whose `gate` the operation holds.
    pub(crate) fn armed(slot: SlotRef, gate: OwnedMutexGuard<()>, repair: Repair) -> Pending {
        Armed::new(Self {
            gate,
            slot,
            repair,
            in_flight: None,
        })
    }
}

impl Cleanup for Gated {
    async fn run(self) {
        if let Some(request) = self.in_flight {
            // Bounded by the request's own operation timeout.
            let _ = request.await;
        }
        repair(self.slot, self.gate, self.repair).await;
    }
}

/// Runs a [`Repair`] until it succeeds or the key's lease is gone (which takes the key with
/// it), then lets go of the gate.
pub(crate) async fn repair(slot: SlotRef, gate: OwnedMutexGuard<()>, what: Repair) {
    let shared = &slot.shared;
    let key = slot.key.as_str();
    let Some(lease_id) = keys::lease_of(key) else {
        return;
    };
    let mut delay = Duration::from_millis(50);
    while shared.lease.get(lease_id).is_some() {
        let done = match what {
            Repair::Delete => {
                let delete = |c: Client| async move { c.kv_client().delete(key, None).await };
                shared.call("cleaning up", delete).await.map(drop)
            }
            Repair::RestoreCount { token } => {
                let count = slot.holds().count;
                let txn = Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, token)])
                    .and_then([put_count(key, count, lease_id)]);
                shared.txn("restoring the hold count", txn).await.map(drop)
            }
        };
        if done.is_ok() {
            break;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(CLEANUP_MAX_DELAY);
    }
    drop(gate);
}

pub(crate) fn put_count(key: &str, count: u32, lease_id: i64) -> TxnOp {
    TxnOp::put(
        key,
        count.to_string(),
        Some(PutOptions::new().with_lease(lease_id)),
    )
}

/// The range of `dir`'s entries, oldest or newest first.
pub(crate) fn entries(order: SortOrder) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
}

/// The key-values of the `i`-th operation of a transaction, which must be a range read.
pub(crate) fn range_result(resp: &TxnResponse, i: usize) -> Result<Vec<KeyValue>> {
    match resp.op_responses().into_iter().nth(i) {
        Some(TxnOpResponse::Get(mut get)) => Ok(get.take_kvs()),
        _ => Err(Error::new(
            ErrorKind::Backend,
            "etcd answered a transaction with unexpected results",
        )),
    }
}

/// How many keys the `i`-th operation of a transaction, a range read, found in its range
/// (all of them, whatever its limit).
pub(crate) fn range_count(resp: &TxnResponse, i: usize) -> Result<i64> {
    match resp.op_responses().into_iter().nth(i) {
        Some(TxnOpResponse::Get(get)) => Ok(get.count()),
        _ => Err(Error::new(
            ErrorKind::Backend,
            "etcd answered a transaction with unexpected results",
        )),
    }
}

impl Shared {
    /// Runs `op` on the endpoint in use, within the request timeout.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, op: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        #[cfg(feature = "testing")]
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.endpoints
            .call(what, self.config.client.operation_timeout, op)
            .await
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, |c| {
            let txn = txn.clone();
            async move { c.kv_client().txn(txn).await }
        })
        .await
    }

    pub(crate) fn slot(self: &Arc<Self>, key: &str) -> SlotRef {
        let slot = lock(&self.slots)
            .entry(key.to_string())
            .or_default()
            .clone();
        SlotRef {
            shared: self.clone(),
            key: key.to_string(),
            slot,
        }
    }

    /// The slot of `grant`'s key, if `grant` names an entry this client made for its owner.
    pub(crate) fn slot_of(self: &Arc<Self>, grant: &Grant) -> Option<SlotRef> {
        let dir = keys::lock_dir(&self.config.key_prefix, grant.name.as_str());
        let entry = keys::parse_entry(&dir, grant.key.as_bytes())?;
        // A grant whose owner or name was changed does not match its key.
        if keys::key_for(&dir, entry.max, entry.lease, &grant.owner) != grant.key {
            return None;
        }
        let slot = lock(&self.slots).get(&grant.key)?.clone();
        Some(SlotRef {
            shared: self.clone(),
            key: grant.key.clone(),
            slot,
        })
    }

    pub(crate) fn grant(
        &self,
        req: &AcquireRequest,
        key: &str,
        lease: LeaseInfo,
        holds: Holds,
    ) -> Result<Grant> {
        // The key lives as long as the lease, whose expiry is no earlier than the latest
        // acknowledged keep-alive's send time plus its TTL: that, not this request's send
        // time, is what safe-until must count from.
        let lease = self.lease.get(lease.id).ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "the client's lease was lost while acquiring",
            )
        })?;
        Ok(Grant::new(
            req.name.clone(),
            req.owner.clone(),
            FencingToken(holds.token.unsigned_abs()),
            holds.count,
            lease.ttl,
            lease.anchor,
        )
        .with_key(key.to_string()))
    }

    pub(crate) async fn release(self: &Arc<Self>, grant: &Grant) -> Result<bool> {
        let Some(slot) = self.slot_of(grant) else {
            return Ok(false);
        };
        if !slot.holds().held_by(grant.token) {
            return Ok(false);
        }
        let gate = slot.slot.gate.clone().lock_owned().await;
        let held = slot.holds();
        if !held.held_by(grant.token) {
            return Ok(false);
        }
        let key = slot.key.clone();
        let Some(lease_id) = keys::lease_of(&key) else {
            return Ok(false);
        };
        if held.count > 1 {
            let is_ours = Compare::create_revision(key.as_str(), CompareOp::Equal, held.token);
            let count = held.count - 1;
            slot.set(Holds { count, ..held });
            let pending = Gated::armed(slot, gate, Repair::RestoreCount { token: held.token });
            let txn = Txn::new()
                .when([is_ours])
                .and_then([put_count(&key, count, lease_id)]);
            let resp = self.txn("releasing one hold", txn).await?;
            drop(pending.disarm());
            return Ok(resp.succeeded());
        }
        slot.set(Holds::default());
        lock(&self.released).insert((key.as_bytes().to_vec(), held.token), ());
        // If the delete fails, the repair keeps trying in the background: an orphaned key of
        // a live lease would block the lock for as long as this client lives.
        let pending = Gated::armed(slot, gate, Repair::Delete);
        let resp = self.release_delete(&key).await?;
        drop(pending.disarm());
        // Held until now if the key deleted was the entry of this grant.
        Ok(resp
            .prev_kvs()
            .iter()
            .any(|kv| kv.create_revision() == held.token))
    }

    /// The last release of an entry key: a plain delete that returns what it deleted, as the
    /// Go client's `Mutex.Unlock` sends, rather than a transaction conditioned on the key's
    /// create-revision (which etcd applies at a higher cost: about 40–60 µs a release on the
    /// benchmark's server). The condition adds nothing under the key's gate with the slot
    /// holding the grant: this client-and-owner-specific key is then either the grant's entry,
    /// absent (its lease lost, or deleted by `force_release` or an operator), or garbage of
    /// this owner (a queueing request applied after it timed out), which the repair would
    /// delete unconditionally too. The deleted key's create-revision says which it was.
    async fn release_delete(&self, key: &str) -> Result<DeleteResponse> {
        let delete = |c: Client| async move {
            let options = DeleteOptions::new().with_prev_key();
            c.kv_client().delete(key, Some(options)).await
        };
        self.call("releasing", delete).await
    }

    /// Confirms that `grant`'s key still exists with its create-revision while the lease is
    /// alive, and returns how long the lease surely lives on from now.
    pub(crate) async fn renew(self: &Arc<Self>, grant: &Grant) -> Result<Duration> {
        self.renew_many(&[grant])
            .await
            .pop()
            .unwrap_or_else(|| Err(Error::new(ErrorKind::Backend, "no renewal result")))
    }

    /// Confirms `grants` with one transaction: each grant's key must still exist with the
    /// create revision that is its token. One result per grant, in order.
    pub(crate) async fn renew_many(self: &Arc<Self>, grants: &[&Grant]) -> Vec<Result<Duration>> {
        let mut results: Vec<Option<Result<Duration>>> = Vec::with_capacity(grants.len());
        // (index, lease id, token) of the grants that pass the local checks.
        let mut asked = Vec::new();
        for (i, grant) in grants.iter().enumerate() {
            results.push(match self.renew_locally(grant) {
                Ok(lease_id) => {
                    asked.push((i, lease_id, i64::try_from(grant.token.0).unwrap_or(-1)));
                    None
                }
                Err(e) => Some(Err(e)),
            });
        }
        if !asked.is_empty() {
            let started = Instant::now();
            let compares: Vec<Compare> = asked
                .iter()
                .map(|&(i, _, token)| {
                    Compare::create_revision(grants[i].key.as_str(), CompareOp::Equal, token)
                })
                .collect();
            // When any compare fails, the answer says which keys are still there.
            let reads: Vec<TxnOp> = asked
                .iter()
                .map(|&(i, _, _)| {
                    TxnOp::get(
                        grants[i].key.as_str(),
                        Some(GetOptions::new().with_keys_only()),
                    )
                })
                .collect();
            let txn = Txn::new().when(compares).or_else(reads);
            match self.txn("renewing", txn).await {
                Ok(resp) if resp.succeeded() => {
                    for &(i, lease_id, _) in &asked {
                        results[i] = Some(self.lease_left(grants[i], lease_id, started));
                    }
                }
                Ok(resp) => {
                    let answers = resp.op_responses();
                    for (n, &(i, lease_id, token)) in asked.iter().enumerate() {
                        let present = matches!(
                            answers.get(n),
                            Some(TxnOpResponse::Get(got))
                                if got.kvs().first().is_some_and(|kv| kv.create_revision() == token)
                        );
                        results[i] = Some(if present {
                            self.lease_left(grants[i], lease_id, started)
                        } else {
                            Err(lost(&grants[i].name, "the lock's key was deleted"))
                        });
                    }
                }
                Err(e) => {
                    // Every grant asked gets the failure; the last one the error itself.
                    let (last, rest) = asked.split_last().expect("asked is not empty");
                    for &(i, _, _) in rest {
                        results[i] = Some(Err(Error::new(e.kind(), e.to_string())));
                    }
                    results[last.0] = Some(Err(e));
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Backend, "no renewal result"))))
            .collect()
    }

    /// What renewing `grant` can decide without the server: the lease id backing it, or why it
    /// no longer holds.
    pub(crate) fn renew_locally(self: &Arc<Self>, grant: &Grant) -> Result<i64> {
        let not_held = |why: &str| lost(&grant.name, why);
        let Some(slot) = self.slot_of(grant) else {
            return Err(not_held("this client made no such grant"));
        };
        if !slot.holds().held_by(grant.token) {
            return Err(not_held("the grant was released or replaced"));
        }
        drop(slot);
        let lease_id = keys::lease_of(&grant.key).unwrap_or_default();
        if self.lease.get(lease_id).is_none() {
            return Err(not_held(
                "the client's lease that backed the grant was lost",
            ));
        }
        Ok(lease_id)
    }

    /// After the server confirmed `grant`'s key: what remains of the lease backing it, counted
    /// from `started`, when the confirmation was sent.
    pub(crate) fn lease_left(
        &self,
        grant: &Grant,
        lease_id: i64,
        started: Instant,
    ) -> Result<Duration> {
        let not_held = |why: &str| lost(&grant.name, why);
        let Some(lease) = self.lease.get(lease_id) else {
            return Err(not_held(
                "the client's lease that backed the grant was lost",
            ));
        };
        // What remains of the lease, not its full TTL: the lease was last extended by the
        // latest acknowledged keep-alive, not by this request.
        let left = lease.alive_until().saturating_duration_since(started);
        if left.is_zero() {
            return Err(not_held(
                "no keep-alive of the client's lease was acknowledged in time",
            ));
        }
        Ok(left)
    }
}
