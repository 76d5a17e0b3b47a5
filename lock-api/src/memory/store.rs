//! The store: the in-memory backend's "server", with one slot per name ever locked, its holder,
//! its FIFO queue of waiters and its fencing counter.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

use crate::backend::wait::timeout;
use crate::error::LostReason;
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{drift, safe_until, AcquireRequest, FencingToken, Grant, LockInfo};
use crate::keeper::{Hold, HoldState};
use crate::name::{LockName, OwnerId};

/// The backend's name, as errors, traces and metrics show it.
pub(crate) const BACKEND: &str = "memory";

/// The shared state that [`MemoryLock`](super::MemoryLock) clients lock against: the "server".
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
pub(super) struct State {
    /// One slot per name ever locked. Slots are never removed, because each carries the name's
    /// fencing counter, which must never go back; so a slot's index never changes, and an
    /// in-process guard keeps it to find its slot again without hashing the name.
    pub(super) slots: Vec<Slot>,
    /// Each slot's index, by name.
    pub(super) index: HashMap<LockName, usize>,
    pub(super) next_waiter: u64,
}

pub(super) struct Slot {
    /// The name, shared by every grant of it: an `Arc` clone, no allocation.
    pub(super) name: LockName,
    pub(super) holder: Option<Holder>,
    pub(super) waiters: VecDeque<Waiter>,
    /// The last fencing token issued for this name.
    pub(super) token: u64,
    /// Why the last holder that did not release ended (expired, removed), by its token: what an
    /// in-process guard of it reports as its lost reason.
    pub(super) ended: Option<(FencingToken, LostReason)>,
    /// The `lost()` futures of in-process guards of the current holder, told when it goes.
    pub(super) watchers: Vec<Weak<HoldState>>,
    /// The owner id of the last holder, kept when it goes: a client that takes the name again
    /// (the usual pattern) gets it back instead of a fresh clone, so a lock cycle costs the
    /// owner's reference count nothing.
    pub(super) last_owner: Option<OwnerId>,
}

pub(super) struct Holder {
    pub(super) owner: OwnerId,
    pub(super) count: u32,
    pub(super) token: FencingToken,
    /// When the lease runs out, unless `kept` is above zero.
    pub(super) expires_at: Instant,
    /// How many of the holds are in-process guards with a watchdog-managed lease. While one is
    /// alive the store keeps the lease itself, as the watchdog would by renewing it; this
    /// backend's "server" lives and dies with its clients, so the renewal cannot fail.
    pub(super) kept: u32,
    /// The lease those guards renew with: what is left when the last of them goes.
    pub(super) kept_ttl: Duration,
    /// When the grant was made: [`LockInfo::since`].
    pub(super) granted_at: Instant,
}

impl Holder {
    pub(super) fn live(&self, now: Instant) -> bool {
        self.kept > 0 || self.expires_at > now
    }

    /// Whether this is `grant`'s holder (lease not checked): the one test every conditional
    /// release and renew makes.
    pub(super) fn is(&self, grant: &Grant) -> bool {
        self.token == grant.token && self.owner == grant.owner
    }
}

pub(super) struct Waiter {
    id: u64,
    owner: OwnerId,
    ttl: Duration,
    kept: bool,
    tx: oneshot::Sender<Grant>,
}

/// Whether an in-process guard still holds its lock, as the store sees it.
pub(super) enum LocalStatus {
    /// Held; safe until then (`None`: kept by the store while the guard lives).
    Held(Option<Instant>),
    Lost(LostReason),
}

fn grant(
    name: &LockName,
    owner: OwnerId,
    token: FencingToken,
    count: u32,
    ttl: Duration,
    now: Instant,
) -> Grant {
    Grant {
        name: name.clone(),
        owner,
        token,
        hold_count: count,
        ttl,
        sent_at: now,
        key: String::new(),
    }
}

/// The reason an in-process guard reports for a holder removed behind its back.
/// The wall-clock time of a monotonic instant, for [`LockInfo::since`]: the store's clock is
/// this process's. One anchor per process, so the same instant always maps to the same time.
fn wall_clock(at: Instant) -> SystemTime {
    static ANCHOR: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    let (mono, wall) = *ANCHOR.get_or_init(|| (Instant::now(), SystemTime::now()));
    match at.checked_duration_since(mono) {
        Some(after) => wall + after,
        None => wall - mono.duration_since(at),
    }
}

fn removed() -> LostReason {
    LostReason::Taken("the lock was removed from the store".into())
}

impl Slot {
    pub(super) fn new(name: LockName) -> Self {
        Self {
            name,
            holder: None,
            waiters: VecDeque::new(),
            token: 0,
            ended: None,
            watchers: Vec::new(),
            last_owner: None,
        }
    }

    /// `owner`, as the new holder's own: the last holder's copy of the label, retagged, if it
    /// shares the label (each acquisition of a client has an id of its own, on one label).
    pub(super) fn take_owner(&mut self, owner: &OwnerId) -> OwnerId {
        match self.last_owner.take() {
            Some(last) if last.shares_label(owner) => last.with_tag_of(owner),
            _ => owner.clone(),
        }
    }

    pub(super) fn fresh_token(&mut self) -> FencingToken {
        self.token += 1;
        FencingToken(self.token)
    }

    /// The holder, unless its lease has run out.
    pub(super) fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.live(now))
    }

    /// Ends the current holder (recording `why`, if it did not simply release) and tells the
    /// in-process guards watching it.
    pub(super) fn end_holder(&mut self, why: Option<LostReason>) {
        if let Some(h) = self.holder.take() {
            if let Some(why) = why {
                self.ended = Some((h.token, why));
            }
            self.last_owner = Some(h.owner);
        }
        for w in self.watchers.drain(..) {
            if let Some(w) = w.upgrade() {
                w.changed.notify_waiters();
            }
        }
    }

    /// Drops an expired holder and, while the lock is free, hands it to the first waiter that
    /// is still listening. Called on every state change that can free a lock.
    pub(super) fn dispatch(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| !h.live(now)) {
            self.end_holder(Some(LostReason::Expired));
        }
        while self.holder.is_none() {
            let Some(w) = self.waiters.pop_front() else {
                break;
            };
            let token = self.fresh_token();
            if w.tx
                .send(grant(&self.name, w.owner.clone(), token, 1, w.ttl, now))
                .is_ok()
            {
                self.holder = Some(Holder {
                    owner: w.owner,
                    count: 1,
                    token,
                    expires_at: now + w.ttl,
                    kept: u32::from(w.kept),
                    kept_ttl: w.ttl,
                    granted_at: now,
                });
            }
        }
    }

    /// Grants at once if free or held by `owner`; `None` if held by someone else (or if others
    /// already queue for it: FIFO). `kept`: the grant is for an in-process guard whose lease
    /// the store keeps.
    pub(super) fn try_grant(
        &mut self,
        owner: OwnerId,
        ttl: Duration,
        kept: bool,
        now: Instant,
    ) -> std::result::Result<Grant, OwnerId> {
        if self.holder.is_some() || !self.waiters.is_empty() {
            self.dispatch(now);
        }
        if let Some(h) = self.holder.as_mut() {
            if h.owner != owner {
                return Err(owner);
            }
            h.count += 1;
            if kept {
                h.kept += 1;
                h.kept_ttl = h.kept_ttl.max(ttl);
            } else {
                h.expires_at = h.expires_at.max(now + ttl);
            }
            return Ok(grant(&self.name, owner, h.token, h.count, ttl, now));
        }
        let token = self.fresh_token();
        self.holder = Some(Holder {
            owner: self.take_owner(&owner),
            count: 1,
            token,
            expires_at: now + ttl,
            kept: u32::from(kept),
            kept_ttl: ttl,
            granted_at: now,
        });
        Ok(grant(&self.name, owner, token, 1, ttl, now))
    }

    /// What [`DistributedLock::inspect`](crate::DistributedLock::inspect) says of this name at `now`, its expired holder
    /// dropped and waiters served first.
    pub(super) fn info(&mut self, now: Instant) -> Option<LockInfo> {
        self.dispatch(now);
        let h = self.live_holder(now)?;
        let left = h.expires_at.saturating_duration_since(now);
        // A kept lease is renewed continuously: a full lease is always left.
        let remaining = Some(if h.kept > 0 {
            left.max(h.kept_ttl)
        } else {
            left
        });
        Some(
            LockInfo::new(h.owner.clone(), h.count, h.token, remaining)
                .with_since(wall_clock(h.granted_at)),
        )
    }

    /// The holder, if it is `grant`'s (lease not checked).
    pub(super) fn holder_of(&mut self, grant: &Grant) -> Option<&mut Holder> {
        self.holder.as_mut().filter(|h| h.is(grant))
    }

    /// The store stops keeping `grant`'s lease for one of its guards (let go of, its release
    /// on the way). The last such guard leaves the lease as if renewed just now.
    pub(super) fn unkeep(&mut self, grant: &Grant) {
        if let Some(h) = self.holder_of(grant).filter(|h| h.kept > 0) {
            h.kept -= 1;
            if h.kept == 0 {
                h.expires_at = h.expires_at.max(Instant::now() + h.kept_ttl);
            }
        }
    }

    /// Gives up one hold of `grant`; false if it no longer held the lock.
    pub(super) fn release(&mut self, grant: &Grant) -> bool {
        let Some(h) = self.holder_of(grant) else {
            return false;
        };
        // A kept lease is live without a look at the clock.
        if h.kept == 0 && h.expires_at <= Instant::now() {
            return false;
        }
        h.count -= 1;
        if h.count == 0 {
            self.end_holder(None);
            if !self.waiters.is_empty() {
                self.dispatch(Instant::now());
            }
        }
        true
    }
}

impl State {
    /// `name`'s slot, made on first use, and its index.
    pub(super) fn slot(&mut self, name: &LockName) -> (usize, &mut Slot) {
        let next = self.slots.len();
        // The owned key is an `Arc` clone: no allocation.
        let at = *self.index.entry(name.clone()).or_insert(next);
        if at == next {
            self.slots.push(Slot::new(name.clone()));
        }
        (at, &mut self.slots[at])
    }

    /// `name`'s slot, if it has one: at index `at` if given and right, else looked up.
    pub(super) fn find(&mut self, name: &LockName, at: Option<usize>) -> Option<&mut Slot> {
        // Names compare by pointer first: a grant's name is its slot's.
        let at = match at.filter(|&i| self.slots.get(i).is_some_and(|s| s.name == *name)) {
            Some(i) => i,
            None => *self.index.get(name.as_str())?,
        };
        self.slots.get_mut(at)
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide store named `name`, made on first use: what `memory://NAME` connects
    /// to (`memory://` is the one named `""`). Every client of it, made anywhere in the process,
    /// sees the same locks, as clients of one server do.
    pub fn named(name: &str) -> Self {
        static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
        let mut stores = STORES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        stores.entry(name.to_string()).or_default().clone()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation of `State` completes before anything that could panic, so a poisoned
        // lock still guards consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes `name`'s holder behind its back, as an operator or a failing server would; the
    /// next waiter gets the lock. For tests of the lost signal.
    pub fn remove(&self, name: &LockName) {
        if let Some(slot) = self.lock().find(name, None) {
            slot.end_holder(Some(removed()));
            slot.dispatch(Instant::now());
        }
    }

    /// How many names have a holder or waiters (expired holders included until touched).
    pub fn active_names(&self) -> usize {
        self.lock()
            .slots
            .iter()
            .filter(|s| s.holder.is_some() || !s.waiters.is_empty())
            .count()
    }

    /// How many waiters are queued for `name`.
    pub fn waiters_for(&self, name: &LockName) -> usize {
        self.lock().find(name, None).map_or(0, |s| s.waiters.len())
    }

    /// How many waiters are queued, over all names.
    pub fn waiters(&self) -> usize {
        self.lock().slots.iter().map(|s| s.waiters.len()).sum()
    }
}
impl MemoryStore {
    /// The acquire attempt: granted at once if free or held by `owner`, with the index of
    /// the name's slot. `name` has passed [`check_name`](crate::name::check_name); a name locked
    /// before (the common case) is found by `&str` and its grant shares the slot's name, so
    /// nothing is allocated.
    /// `owner` moves into the grant, or comes back when the lock is held by someone else.
    #[inline(always)]
    pub(super) fn grant(
        &self,
        name: &str,
        owner: OwnerId,
        ttl: Duration,
        kept: bool,
    ) -> std::result::Result<(Grant, usize), OwnerId> {
        let mut s = self.lock();
        let now = Instant::now();
        if let Some(&at) = s.index.get(name) {
            return s.slots[at]
                .try_grant(owner, ttl, kept, now)
                .map(|g| (g, at));
        }
        let (at, slot) = s.slot(&LockName::checked(name));
        slot.try_grant(owner, ttl, kept, now).map(|g| (g, at))
    }

    /// Gives up one hold of `grant`; false if it no longer held the lock.
    pub(super) fn release(&self, grant: &Grant) -> bool {
        self.lock()
            .find(&grant.name, None)
            .is_some_and(|slot| slot.release(grant))
    }

    /// The store stops keeping `hold`'s lease, if it kept it.
    pub(super) fn unkeep(&self, hold: &Hold) {
        if hold.kept {
            if let Some(slot) = self.lock().find(&hold.grant.name, None) {
                slot.unkeep(&hold.grant);
            }
        }
    }

    /// Whether `hold` (of an in-process guard) still holds its lock. With `watch`, the store
    /// also tells it when the holder goes.
    pub(super) fn status(&self, hold: &Hold, watch: Option<&Arc<HoldState>>) -> LocalStatus {
        let (grant, kept) = (&hold.grant, hold.kept);
        let mut s = self.lock();
        let now = Instant::now();
        let Some(slot) = s.find(&grant.name, usize::try_from(hold.ticket).ok()) else {
            return LocalStatus::Lost(removed());
        };
        if let Some(h) = slot.holder_of(grant) {
            let until = if h.kept > 0 {
                None
            } else {
                Some(h.expires_at.checked_sub(drift(grant.ttl)).unwrap_or(now))
            };
            if until.is_some_and(|u| now >= u) {
                return LocalStatus::Lost(LostReason::Expired);
            }
            if let Some(w) = watch {
                slot.watchers.retain(|x| x.strong_count() > 0);
                if !slot.watchers.iter().any(|x| x.as_ptr() == Arc::as_ptr(w)) {
                    slot.watchers.push(Arc::downgrade(w));
                }
            }
            return LocalStatus::Held(until);
        }
        LocalStatus::Lost(match &slot.ended {
            Some((token, why)) if *token == grant.token => why.clone(),
            // Superseded more than once since: judge by the grant's own lease.
            _ if !kept && now >= safe_until(grant.sent_at, grant.ttl) => LostReason::Expired,
            _ => removed(),
        })
    }

    /// Waits up to `wait` for `req`'s lock in the name's queue; `kept` as for
    /// [`LeaseKeeper::grant_now`](crate::backend::LeaseKeeper::grant_now).
    pub(super) async fn queue(
        &self,
        req: &AcquireRequest,
        wait: Duration,
        kept: bool,
    ) -> Result<Grant> {
        tokio::task::coop::consume_budget().await;
        let started = Instant::now();
        let deadline = started + wait;
        let mut queued = {
            let mut s = self.lock();
            s.next_waiter += 1;
            let id = s.next_waiter;
            let (_, slot) = s.slot(&req.name);
            if let Ok(g) = slot.try_grant(req.owner.clone(), req.ttl, kept, started) {
                return Ok(g);
            }
            let (tx, rx) = oneshot::channel();
            slot.waiters.push_back(Waiter {
                id,
                owner: req.owner.clone(),
                ttl: req.ttl,
                kept,
                tx,
            });
            QueuedWaiter {
                store: self,
                name: &req.name,
                id,
                rx,
                done: false,
            }
        };
        loop {
            // Wake at the deadline or when the holder's lease runs out, whichever is first: an
            // expired holder sends no notice.
            let wake = {
                let mut s = self.lock();
                let expiry = s
                    .find(&req.name, None)
                    .and_then(|slot| slot.holder.as_ref())
                    .filter(|h| h.kept == 0)
                    .map(|h| h.expires_at);
                expiry.map_or(deadline, |e| e.min(deadline))
            };
            tokio::select! {
                granted = &mut queued.rx => {
                    // The sender is only dropped with the waiter entry, which only this
                    // future removes; an error here means the store broke that invariant.
                    queued.done = granted.is_ok();
                    return granted.map_err(|_| {
                        Error::new(ErrorKind::Backend, "memory store dropped a queued waiter")
                    });
                }
                _ = tokio::time::sleep_until(wake.into()) => {
                    let now = Instant::now();
                    self.lock().slot(&req.name).1.dispatch(now);
                    if now >= deadline {
                        if let Ok(grant) = queued.rx.try_recv() {
                            queued.done = true;
                            return Ok(grant);
                        }
                        return Err(timeout(wait));
                    }
                }
            }
        }
    }
}

/// Removes a queued waiter if its acquire is dropped, and releases a grant that was handed to
/// it after it stopped listening.
struct QueuedWaiter<'a> {
    store: &'a MemoryStore,
    name: &'a LockName,
    id: u64,
    rx: oneshot::Receiver<Grant>,
    done: bool,
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = self.store.lock();
        let Some(slot) = s.find(self.name, None) else {
            return;
        };
        slot.waiters.retain(|w| w.id != self.id);
        // Dispatch sends under the store lock, so under it the grant is either queued or here.
        if let Ok(grant) = self.rx.try_recv() {
            if slot.holder.as_ref().is_some_and(|h| h.token == grant.token) {
                slot.end_holder(None);
            }
        }
        slot.dispatch(Instant::now());
    }
}
