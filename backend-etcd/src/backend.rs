//! [`EtcdLock`]: the lock algorithm over one kept-alive lease per client.
//!
//! A contender creates its key `<prefix>/<name>/<lease>-<owner>` in a transaction that only
//! succeeds if the key is absent, attached to the client's lease. The key with the lowest
//! create-revision under the name's directory holds the lock; every other key waits for the
//! delete of the key created just before it (FIFO, no herd) and then looks again, because that
//! predecessor may have been a waiter who gave up rather than the holder. The holder key's
//! create-revision is the fencing token; release and renew are transactions conditioned on it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::wait::{self, Attempt, Waiting};
use distlock_api::{
    lost, AcquireRequest, Blocking, Capabilities, ClientCore, DistributedLock, Error, ErrorKind,
    Fencing, FencingToken, Grant, LeaseKind, LockInfo, LockName, LostReason, Result, TtlSupport,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use tokio::sync::OwnedMutexGuard;
use tokio::task::JoinHandle;

use crate::config::EtcdConfig;
use crate::endpoints::Endpoints;
use crate::keys;
use crate::lease::{self, LeaseCell, LeaseInfo};
use crate::BACKEND;

/// How many locks the watchdog confirms with one transaction (etcd allows 128 operations per
/// branch by default).
const RENEW_BATCH: usize = 64;

/// What the etcd backend promises.
///
/// The lease minimum is etcd's with default server settings (1.5 × the 1 s election timeout,
/// rounded up to whole seconds); a server configured otherwise grants its own, which every
/// grant reports.
pub const CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    blocking: Blocking::Notify,
    ttl: TtlSupport {
        kind: LeaseKind::Session,
        min: Duration::from_secs(2),
        granularity: Duration::from_secs(1),
    },
    fair: true,
    fencing: Fencing::Durable,
    renewal: true,
};

/// HTTP/2 pings on the connection, so a silently dead peer is noticed and the channel moves
/// to another endpoint. etcd's default `--grpc-keepalive-min-time` is 5 s; pinging more often
/// gets the connection closed.
const HTTP2_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(5));
/// The pause after a failed watch before the waiter looks again, so a broken watch cannot spin.
const WATCH_RETRY: Duration = Duration::from_millis(50);
/// The longest pause between retries of a background cleanup.
const CLEANUP_MAX_DELAY: Duration = Duration::from_secs(2);

/// A client of an etcd cluster: one connection (balanced over the configured endpoints), one
/// lease kept alive in the background, and the state of the locks its owners hold.
///
/// Dropping it stops the keep-alive and revokes the lease in the background (which deletes
/// every key it still has); [`close`](EtcdLock::close) does the same and waits for it.
pub struct EtcdLock {
    shared: Arc<Shared>,
    keeper: Mutex<Option<JoinHandle<()>>>,
}

/// The client's state, shared with its background tasks.
pub(crate) struct Shared {
    pub(crate) core: ClientCore,
    pub(crate) endpoints: Endpoints,
    pub(crate) config: EtcdConfig,
    pub(crate) lease: LeaseCell,
    /// Per entry key: the hold count and the gate that serialises this client's acquires and
    /// releases of that key.
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

/// The local state of one entry key (one name, one owner, one lease).
#[derive(Default)]
struct Slot {
    /// Held by whoever is creating, re-counting or deleting the key, including a background
    /// cleanup: while it is held, nothing else of this client touches the key.
    gate: Arc<tokio::sync::Mutex<()>>,
    holds: Mutex<Holds>,
}

/// How often the owner holds the lock through this key, and the key's create-revision.
#[derive(Clone, Copy, Default, Debug)]
struct Holds {
    count: u32,
    token: i64,
}

impl Holds {
    fn held_by(&self, token: FencingToken) -> bool {
        self.count > 0 && u64::try_from(self.token).ok() == Some(token.0)
    }
}

/// The entry a waiter waits on: the next-lower one.
#[derive(Clone, Debug)]
struct Pred {
    key: Vec<u8>,
    /// Its create-revision, which tells it apart from a later entry at the same key.
    rev: i64,
}

/// A waiting acquire: what it asked for and the entry it queued.
struct Turn<'a> {
    req: &'a AcquireRequest,
    key: &'a str,
    dir: &'a str,
    lease: LeaseInfo,
    /// The hold it gets at its turn: one, with its entry's create-revision as token.
    holds: Holds,
}

impl EtcdLock {
    /// Connects to the cluster and is granted the client's lease, all within the config's
    /// connect timeout: an unreachable cluster is
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) after it, never a hang.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        // Each endpoint gets its share of the connect timeout, so one that swallows packets
        // leaves time to try the others.
        let endpoints = u32::try_from(config.endpoints.len()).unwrap_or(u32::MAX);
        let per_endpoint =
            (config.client.connect_timeout / endpoints).max(Duration::from_millis(10));
        let mut options = ConnectOptions::new()
            .with_connect_timeout(per_endpoint)
            .with_keep_alive(HTTP2_KEEPALIVE.0, HTTP2_KEEPALIVE.1);
        if let Some((user, password)) = &config.user {
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        let endpoints = Endpoints::new(config.endpoints.clone(), options);
        let ttl_secs = config.lease_ttl_secs();
        let info = endpoints
            .call(
                "connecting and being granted a lease",
                config.client.connect_timeout,
                |client| lease::grant(client, ttl_secs),
            )
            .await
            .and_then(lease::granted)
            .map_err(|e| e.with_backend(BACKEND))?;
        let mut core = ClientCore::new(BACKEND).with_default_ttl(info.ttl)?;
        if let Some(owner) = &config.client.owner {
            core = core.with_owner(owner.clone());
        }
        let shared = Arc::new(Shared {
            core,
            endpoints,
            config,
            lease: LeaseCell::new(info),
            slots: Mutex::new(HashMap::new()),
        });
        let keeper = tokio::spawn(lease::keep_alive(Arc::downgrade(&shared)));
        Ok(Self {
            shared,
            keeper: Mutex::new(Some(keeper)),
        })
    }

    /// The id of the client's lease; `None` while a lost lease is being replaced, or after
    /// [`close`](EtcdLock::close).
    pub fn lease_id(&self) -> Option<i64> {
        self.shared.lease.current().ok().map(|l| l.id)
    }

    /// The TTL the server granted the client's lease (etcd raises short requests to its
    /// minimum); every grant reports it as its lease.
    pub fn lease_ttl(&self) -> Option<Duration> {
        self.shared.lease.current().ok().map(|l| l.ttl)
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &EtcdConfig {
        &self.shared.config
    }

    /// Stops the keep-alive, fires `lost()` on every guard of this client, and revokes the
    /// lease, which deletes every key the client still has: its locks are free, its waiters
    /// leave their queues. Later acquires fail with a non-temporary
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable). Idempotent.
    pub async fn close(&self) -> Result<()> {
        if let Some(task) = lock(&self.keeper).take() {
            task.abort();
        }
        let id = self.shared.lease.close();
        self.shared.core.mark_lost(|_| true, LostReason::ClientGone);
        let Some(id) = id else { return Ok(()) };
        let revoked = self
            .shared
            .call("revoking the lease", |c| async move {
                c.lease_client().revoke(id).await
            })
            .await;
        match revoked {
            Err(e) if e.message().contains("lease not found") => Ok(()),
            r => r.map(drop).map_err(|e| e.with_backend(BACKEND)),
        }
    }
}

impl Drop for EtcdLock {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.keeper).take() {
            task.abort();
        }
        // Without a runtime there is nothing to revoke on; the lease expires after its TTL.
        if let (Some(id), Ok(rt)) = (
            self.shared.lease.close(),
            tokio::runtime::Handle::try_current(),
        ) {
            let shared = self.shared.clone();
            rt.spawn(async move {
                let revoke = |c: Client| async move { c.lease_client().revoke(id).await };
                let _ = shared.call("revoking the lease", revoke).await;
            });
        }
    }
}

#[async_trait]
impl DistributedLock for EtcdLock {
    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn core(&self) -> &ClientCore {
        &self.shared.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        match self.shared.acquire(req, None).await {
            Ok(Some(grant)) => Ok(Attempt::Granted(grant)),
            // A lease-bound lock: the holder's lease is the client's, not the lock's.
            Ok(None) => Ok(Attempt::Held { expires_in: None }),
            Err(e) => Err(context(e, &req.name)),
        }
    }

    /// Waiters queue by creation revision, each watching its predecessor's key.
    fn waiting(&self) -> Waiting {
        Waiting::Queue
    }

    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        let started = Instant::now();
        let deadline = started
            .checked_add(wait)
            .ok_or_else(|| Error::invalid(format!("wait bound {wait:?} is too long")))?;
        match self.shared.acquire(req, Some(deadline)).await {
            Ok(Some(grant)) => Ok(grant),
            Ok(None) => Err(wait::timeout(wait)),
            Err(e) => Err(context(e, &req.name)),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.shared
            .release(grant)
            .await
            .map_err(|e| context(e, &grant.name))
    }

    async fn renew(&self, grant: &Grant, _ttl: Duration) -> Result<Duration> {
        self.shared
            .renew(grant)
            .await
            .map_err(|e| context(e, &grant.name))
    }

    fn renew_batch(&self) -> usize {
        RENEW_BATCH
    }

    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        let grants: Vec<&Grant> = grants.iter().map(|(g, _)| g).collect();
        self.shared
            .renew_many(&grants)
            .await
            .into_iter()
            .zip(grants)
            .map(|(r, g)| r.map_err(|e| context(e, &g.name)))
            .collect()
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.shared
            .inspect(name)
            .await
            .map_err(|e| context(e, name))
    }
}

fn context(e: Error, name: &LockName) -> Error {
    e.with_backend(BACKEND).with_lock(name)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single assignment or map operation, so a poisoned
    // lock still guards consistent state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A reference to a slot that removes it from the map when it is the last one and the slot
/// holds nothing, so slots of released locks do not pile up.
struct SlotRef {
    shared: Arc<Shared>,
    key: String,
    slot: Arc<Slot>,
}

impl SlotRef {
    fn holds(&self) -> Holds {
        *lock(&self.slot.holds)
    }

    fn set(&self, holds: Holds) {
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
enum Repair {
    /// Delete the key: it is a waiter's that gave up, or a grant nobody received or kept.
    /// Unconditional, which is safe because the gate is held and the slot holds nothing, so
    /// whatever sits at this client-and-owner-specific key is garbage.
    Delete,
    /// Write the local hold count back into the key's value (for `inspect`).
    RestoreCount { token: i64 },
}

/// The gate of an entry key, with a repair that runs in the background, still holding the
/// gate, unless [`disarm`](Pending::disarm)ed. This is what makes a dropped `acquire` leave
/// nothing behind: not its waiter key, and not a grant that raced the cancellation.
struct Pending {
    held: Option<(OwnedMutexGuard<()>, SlotRef)>,
    repair: Repair,
}

impl Pending {
    fn new(slot: SlotRef, gate: OwnedMutexGuard<()>, repair: Repair) -> Self {
        Self {
            held: Some((gate, slot)),
            repair,
        }
    }

    fn disarm(mut self) -> (OwnedMutexGuard<()>, SlotRef) {
        match self.held.take() {
            Some(held) => held,
            // `held` is only taken here and in `drop`, each of which consumes `self`.
            None => unreachable!("Pending disarmed twice"),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some((gate, slot)) = self.held.take() else {
            return;
        };
        // Without a runtime the key stays until the lease ends (the client's drop revokes it).
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(repair(slot, gate, self.repair));
        }
    }
}

/// Runs a [`Repair`] until it succeeds or the key's lease is gone (which takes the key with
/// it), then lets go of the gate.
async fn repair(slot: SlotRef, gate: OwnedMutexGuard<()>, what: Repair) {
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

fn put_count(key: &str, count: u32, lease_id: i64) -> TxnOp {
    TxnOp::put(
        key,
        count.to_string(),
        Some(PutOptions::new().with_lease(lease_id)),
    )
}

/// The range of `dir`'s entries, oldest or newest first.
fn entries(order: SortOrder) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
}

/// The key-values of the `i`-th operation of a transaction, which must be a range read.
fn range_result(resp: &TxnResponse, i: usize) -> Result<Vec<KeyValue>> {
    match resp.op_responses().into_iter().nth(i) {
        Some(TxnOpResponse::Get(mut get)) => Ok(get.take_kvs()),
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
        self.endpoints
            .call(what, self.config.client.operation_timeout, op)
            .await
    }

    async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, |c| {
            let txn = txn.clone();
            async move { c.kv_client().txn(txn).await }
        })
        .await
    }

    fn slot(self: &Arc<Self>, key: &str) -> SlotRef {
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
    fn slot_of(self: &Arc<Self>, grant: &Grant) -> Option<SlotRef> {
        let lease_id = keys::lease_of(&grant.key)?;
        let dir = keys::lock_dir(&self.config.key_prefix, grant.name.as_str());
        // A grant whose owner or name was changed does not match its key.
        if keys::entry_key(&dir, lease_id, &grant.owner) != grant.key {
            return None;
        }
        let slot = lock(&self.slots).get(&grant.key)?.clone();
        Some(SlotRef {
            shared: self.clone(),
            key: grant.key.clone(),
            slot,
        })
    }

    fn grant(
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
        Ok(Grant {
            name: req.name.clone(),
            owner: req.owner.clone(),
            token: FencingToken(holds.token.unsigned_abs()),
            hold_count: holds.count,
            ttl: lease.ttl,
            sent_at: lease.anchor,
            key: key.to_string(),
        })
    }

    /// Acquires `req`; with no deadline, only if that needs no waiting (`None` otherwise).
    /// `Ok(None)` with a deadline means the deadline passed while waiting for this client's
    /// other acquire of the same key.
    async fn acquire(
        self: &Arc<Self>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let lease = self.lease.current()?;
        let dir = keys::lock_dir(&self.config.key_prefix, req.name.as_str());
        let key = keys::entry_key(&dir, lease.id, &req.owner);
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
            let pending = Pending::new(slot, gate, Repair::RestoreCount { token: held.token });
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    held.token,
                )])
                .and_then([put_count(&key, next, lease.id)]);
            let resp = self.txn("re-acquiring", txn).await?;
            let (gate, slot) = pending.disarm();
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

        let pending = Pending::new(slot, gate, Repair::Delete);
        let (my_rev, pred) = self.enqueue(&key, &dir, lease.id).await?;
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
                self.wait_turn(&turn, pred, deadline).await?
            }
        };
        let (gate, slot) = pending.disarm();
        slot.set(holds);
        drop(gate);
        Ok(Some(grant))
    }

    /// Creates this client's entry key for the lock (absent keys only), and returns its
    /// create-revision and the entry just before it, if any.
    async fn enqueue(&self, key: &str, dir: &str, lease_id: i64) -> Result<(i64, Option<Pred>)> {
        for _ in 0..3 {
            // Our put is the newest write, so the two newest entries are ours and the one we
            // queue behind.
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([
                    put_count(key, 1, lease_id),
                    TxnOp::get(dir, Some(entries(SortOrder::Descend).with_limit(2))),
                ])
                .or_else([TxnOp::get(key, None)]);
            let resp = self.txn("queueing", txn).await?;
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
                let pred = kvs.get(1).map(|kv| Pred {
                    key: kv.key().to_vec(),
                    rev: kv.create_revision(),
                });
                return Ok((mine.create_revision(), pred));
            }
            // The key exists though no acquire, hold or cleanup of ours uses it (a request
            // that timed out but was applied after all): clear it and queue afresh.
            if let Some(stale) = range_result(&resp, 0)?.first() {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        key,
                        CompareOp::Equal,
                        stale.create_revision(),
                    )])
                    .and_then([TxnOp::delete(key, None)]);
                self.txn("clearing a stale key", txn).await?;
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            format!("could not create the lock key {key:?}: it keeps reappearing"),
        ))
    }

    /// Waits until `turn`'s entry is the oldest of its lock, or the deadline passes, and
    /// returns the grant it then holds.
    async fn wait_turn(&self, turn: &Turn<'_>, first: Pred, deadline: Instant) -> Result<Grant> {
        let known = Mutex::new(Some(first));
        let target = Mutex::new(None::<Pred>);
        let (known, target) = (&known, &target);
        wait::notified(
            deadline,
            move || async move {
                let known = lock(known).take();
                let next = match known {
                    Some(pred) => Some(pred),
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
                    // Our own entry goes with the lease: then there is nothing left to wait for.
                    let woken = async {
                        tokio::select! {
                            _ = self.wait_delete(&pred) => {}
                            _ = self.lease.gone(turn.lease.id) => {}
                        }
                    };
                    let _ = tokio::time::timeout(max, woken).await;
                }
            },
        )
        .await
    }

    /// The entry just before `turn`'s, if `turn`'s entry still exists; an error if not.
    async fn predecessor(&self, turn: &Turn<'_>) -> Result<Option<Pred>> {
        // Closed, or lost and not replaced yet: say which; replaced already: say it was lost.
        let lease_lost = || match self.lease.current() {
            Err(e) => e,
            Ok(_) => Error::new(
                ErrorKind::Unavailable,
                "the client's lease was lost while waiting, and this waiter's key with it",
            ),
        };
        if self.lease.get(turn.lease.id).is_none() {
            return Err(lease_lost());
        }
        let my_rev = turn.holds.token;
        let txn = Txn::new()
            .when([Compare::create_revision(turn.key, CompareOp::Equal, my_rev)])
            .and_then([TxnOp::get(
                turn.dir,
                Some(
                    entries(SortOrder::Descend)
                        .with_max_create_revision(my_rev - 1)
                        .with_limit(1),
                ),
            )]);
        let resp = self.txn("checking the queue", txn).await?;
        if !resp.succeeded() {
            if self.lease.get(turn.lease.id).is_none() {
                return Err(lease_lost());
            }
            return Err(Error::new(
                ErrorKind::Unavailable,
                "this waiter's key was deleted while it waited (by an operator, or its lease \
                 expired)",
            ));
        }
        Ok(range_result(&resp, 0)?.first().map(|kv| Pred {
            key: kv.key().to_vec(),
            rev: kv.create_revision(),
        }))
    }

    /// Returns when `pred` is gone, or its watch ends some other way (the caller looks at the
    /// queue again either way).
    ///
    /// The watch starts "now", and once it is in place the predecessor is read again. The
    /// obvious alternative, starting the watch one past the revision the predecessor was seen
    /// at, is only live if no other write lands in between: etcd serves a watch that starts
    /// at or below its current revision from its "unsynced" group, which it catches up every
    /// 100 ms, and under contention some write nearly always lands in between (measured: a
    /// hand-off stalled for over 100 ms every few grants). A watch from "now" is live, and the
    /// second read covers a delete that happened before it was in place.
    async fn wait_delete(&self, pred: &Pred) {
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let i = self.endpoints.index();
        let broken = || async {
            self.endpoints.failed(i);
            tokio::time::sleep(WATCH_RETRY).await;
        };
        let Ok(client) = self.endpoints.client(i).await else {
            return broken().await;
        };
        let Ok(mut stream) = client
            .watch_client()
            .watch(pred.key.clone(), Some(options))
            .await
        else {
            return broken().await;
        };
        // The first answer says the watch is in place.
        match stream.message().await {
            Ok(Some(resp)) if resp.created() && !resp.canceled() => {}
            _ => return broken().await,
        }
        let still_there = Txn::new().when([Compare::create_revision(
            pred.key.clone(),
            CompareOp::Equal,
            pred.rev,
        )]);
        match self.txn("watching the queue", still_there).await {
            Ok(resp) if resp.succeeded() => {}
            Ok(_) => return,
            Err(_) => {
                tokio::time::sleep(WATCH_RETRY).await;
                return;
            }
        }
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    let deleted = resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete);
                    if deleted || resp.canceled() {
                        return;
                    }
                }
                Ok(None) | Err(_) => return broken().await,
            }
        }
    }

    async fn release(self: &Arc<Self>, grant: &Grant) -> Result<bool> {
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
        let is_ours = Compare::create_revision(key.as_str(), CompareOp::Equal, held.token);
        if held.count > 1 {
            let count = held.count - 1;
            slot.set(Holds { count, ..held });
            let pending = Pending::new(slot, gate, Repair::RestoreCount { token: held.token });
            let txn = Txn::new()
                .when([is_ours])
                .and_then([put_count(&key, count, lease_id)]);
            let resp = self.txn("releasing one hold", txn).await?;
            drop(pending.disarm());
            return Ok(resp.succeeded());
        }
        slot.set(Holds::default());
        // If the delete fails, the repair keeps trying in the background: an orphaned key of
        // a live lease would block the lock for as long as this client lives.
        let pending = Pending::new(slot, gate, Repair::Delete);
        let txn = Txn::new()
            .when([is_ours])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let resp = self.txn("releasing", txn).await?;
        drop(pending.disarm());
        Ok(resp.succeeded())
    }

    /// Confirms that `grant`'s key still exists with its create-revision while the lease is
    /// alive, and returns how long the lease surely lives on from now.
    async fn renew(self: &Arc<Self>, grant: &Grant) -> Result<Duration> {
        self.renew_many(&[grant])
            .await
            .pop()
            .unwrap_or_else(|| Err(Error::new(ErrorKind::Backend, "no renewal result")))
    }

    /// Confirms `grants` with one transaction: each grant's key must still exist with the
    /// create revision that is its token. One result per grant, in order.
    async fn renew_many(self: &Arc<Self>, grants: &[&Grant]) -> Vec<Result<Duration>> {
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
    fn renew_locally(self: &Arc<Self>, grant: &Grant) -> Result<i64> {
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
    fn lease_left(&self, grant: &Grant, lease_id: i64, started: Instant) -> Result<Duration> {
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

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let dir = keys::lock_dir(&self.config.key_prefix, name.as_str());
        let range = dir.clone();
        let mut resp = self
            .call("inspecting", |c| {
                let range = range.clone();
                async move {
                    let options = entries(SortOrder::Ascend).with_limit(1);
                    c.kv_client().get(range, Some(options)).await
                }
            })
            .await?;
        let Some(holder) = resp.take_kvs().into_iter().next() else {
            return Ok(None);
        };
        let unexpected = || {
            Error::new(
                ErrorKind::Backend,
                format!(
                    "unexpected key {:?} in the lock's directory",
                    String::from_utf8_lossy(holder.key())
                ),
            )
        };
        let (_, owner) = keys::parse_entry(&dir, holder.key()).ok_or_else(unexpected)?;
        let hold_count = std::str::from_utf8(holder.value())
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(unexpected)?;
        Ok(Some(LockInfo {
            owner,
            hold_count,
            token: FencingToken(holder.create_revision().unsigned_abs()),
            remaining: None,
        }))
    }
}

/// Maps a driver error: no answer or no connection is `Unavailable` (temporary), anything
/// the server said is `Backend`.
pub(crate) fn driver_error(what: &str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    // gRPC status codes (tonic's `Code` numbering).
    const CANCELLED: i32 = 1;
    const DEADLINE_EXCEEDED: i32 = 4;
    const NOT_FOUND: i32 = 5;
    const RESOURCE_EXHAUSTED: i32 = 8;
    const ABORTED: i32 = 10;
    const UNAVAILABLE: i32 = 14;
    let kind = match &e {
        E::GRpcStatus(s) => match i32::from(s.code()) {
            CANCELLED | DEADLINE_EXCEEDED | RESOURCE_EXHAUSTED | ABORTED | UNAVAILABLE => {
                ErrorKind::Unavailable
            }
            // The client's lease is gone; the keep-alive task is replacing it.
            NOT_FOUND if s.message().contains("lease not found") => ErrorKind::Unavailable,
            _ => ErrorKind::Backend,
        },
        E::TransportError(_) | E::IoError(_) => ErrorKind::Unavailable,
        _ => ErrorKind::Backend,
    };
    Error::new(kind, format!("{what}: {e}"))
        .with_source(e)
        .with_backend(BACKEND)
}
