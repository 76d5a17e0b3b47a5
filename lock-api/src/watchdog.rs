//! One renewal task per client: renews every watchdog-managed grant at TTL/3 and fires `lost()`
//! when a renewal finds the lock gone or safe-until passes without a successful renewal.
//!
//! Guards live in a slab, so enrolling one and letting it go are O(1) with no hashing: most
//! locks are released long before their first renewal is due, and for them the watchdog should
//! cost next to nothing. Only events due within the next two ticks sit in a deadline-ordered
//! queue; a sweep once a tick moves later ones in as they come near. So a wake-up touches only
//! what is due, and a client holding ten thousand locks renews each at its own time, at
//! O(log n) a step plus one pass over the slab a second.
//!
//! Renewals due at one wake-up go out in batches where the backend confirms many grants with
//! one request ([`Profile::renew_batch`](crate::Profile::renew_batch)); for those backends, renewals due within the
//! next 100 ms are brought forward to join the batch.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::error::ErrorKind;
use crate::grant::{safe_until, Grant};
use futures::future::BoxFuture;

use crate::error::{LostReason, Result};
use crate::keeper::HoldState;

/// How many renewal requests one client has in flight at most (a batch is one request).
const MAX_CONCURRENT_RENEWALS: usize = 64;
/// While it has nothing due sooner, the task still wakes this often to sweep the slab for
/// events coming near, so that enrolling a guard whose first event is later than two ticks away
/// needs no queue insertion and no cross-thread wake-up (the common case: a lock held for less
/// than a third of its lease costs the watchdog no work at all).
const TICK: Duration = Duration::from_secs(1);
/// How far ahead of its time a renewal may be sent, to share a batch with others due now.
const COALESCE: Duration = Duration::from_millis(100);
/// After this long with nothing to watch, the task ends; the next guard starts a new one.
const IDLE_EXIT: Duration = Duration::from_secs(30);

/// What the watchdog asks of the backend whose guards it keeps (the client's
/// [`DistributedLock`](crate::DistributedLock), which implements it).
pub(crate) trait Renewer: Send + Sync + 'static {
    /// The backend's name, for metrics.
    fn label(&self) -> &'static str;
    /// How many grants one renewal request may confirm.
    fn batch_size(&self) -> usize;
    /// Renews one grant.
    fn renew_one<'a>(&'a self, grant: &'a Grant, ttl: Duration) -> BoxFuture<'a, Result<Duration>>;
    /// Renews several grants with one request.
    fn renew_all<'a>(
        &'a self,
        grants: &'a [(Grant, Duration)],
    ) -> BoxFuture<'a, Vec<Result<Duration>>>;
}

pub(crate) struct Watchdog<B: ?Sized + Renewer> {
    shared: Arc<Shared<B>>,
}

struct Shared<B: ?Sized> {
    inner: Mutex<Inner<B>>,
    wake: Notify,
    permits: Semaphore,
}

struct Inner<B: ?Sized> {
    slots: Vec<Slot<B>>,
    /// Indices of empty slots.
    free: Vec<u32>,
    /// How many slots hold an entry.
    len: usize,
    /// Events before this instant are in `queue`; later ones wait for a sweep. `None` while no
    /// task has swept yet: a starting task's first sweep queues what is due.
    horizon: Option<Instant>,
    /// Queued entries' next events (renewal due or safe-until), earliest first.
    queue: BTreeSet<(Instant, u64)>,
    task: Option<JoinHandle<()>>,
    /// When the running task will next look at the queue by itself.
    wake_at: Option<Instant>,
}

/// A slab slot. An entry's id is its index with the slot's generation in the high half, so a
/// stale id (of an entry removed while its renewal was in flight) never finds a newer entry.
struct Slot<B: ?Sized> {
    generation: u32,
    entry: Option<Entry<B>>,
}

impl<B: ?Sized> Default for Slot<B> {
    fn default() -> Self {
        Self {
            generation: 0,
            entry: None,
        }
    }
}

impl<B: ?Sized> Default for Inner<B> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            horizon: None,
            queue: BTreeSet::new(),
            task: None,
            wake_at: None,
        }
    }
}

struct Entry<B: ?Sized> {
    backend: Weak<B>,
    grant: Grant,
    state: Arc<HoldState>,
    /// `Some` for watchdog-managed leases: the TTL to renew with and when to renew next.
    renew: Option<(Duration, Instant)>,
    in_flight: bool,
    /// The entry's key in `Inner::queue`, if queued.
    queued: Option<Instant>,
}

impl<B: ?Sized> Entry<B> {
    /// The next instant something must happen to this entry, if ever.
    fn next_event(&self) -> Option<Instant> {
        let renew = self.renew.filter(|_| !self.in_flight).map(|(_, at)| at);
        match (self.state.safe_until(), renew) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Marks entry `id`'s renewal in flight and hands it to the sender.
    fn send(&mut self, id: u64, backend: Arc<B>, ttl: Duration) -> Due<B> {
        self.in_flight = true;
        Due {
            id,
            backend,
            grant: self.grant.clone(),
            ttl,
        }
    }
}

/// The id of the entry in slot `index` at `generation`.
fn id_of(index: usize, generation: u32) -> u64 {
    u64::from(generation) << 32 | index as u64
}

/// The slot index and generation an id names.
fn split(id: u64) -> (usize, u32) {
    ((id & u64::from(u32::MAX)) as usize, (id >> 32) as u32)
}

impl<B: ?Sized + Renewer> Inner<B> {
    fn insert(&mut self, entry: Entry<B>) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot::default());
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 guards per client")
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.entry = Some(entry);
        self.len += 1;
        id_of(index as usize, slot.generation)
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Entry<B>> {
        let (index, generation) = split(id);
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        slot.entry.as_mut()
    }

    fn remove(&mut self, id: u64) -> Option<Entry<B>> {
        let (index, generation) = split(id);
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let entry = slot.entry.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index as u32);
        self.len -= 1;
        if let Some(at) = entry.queued {
            self.queue.remove(&(at, id));
        }
        Some(entry)
    }

    /// (Re)queues entry `id` at its next event if that comes before the horizon. Returns the
    /// instant if it was queued: later events need nobody woken.
    fn schedule(&mut self, id: u64) -> Option<Instant> {
        let horizon = self.horizon;
        let entry = self.get_mut(id)?;
        let old = entry.queued.take();
        let at = entry
            .next_event()
            .filter(|&at| horizon.is_some_and(|h| at < h));
        entry.queued = at;
        if let Some(old) = old {
            self.queue.remove(&(old, id));
        }
        if let Some(at) = at {
            self.queue.insert((at, id));
        }
        at
    }

    /// Queues every entry whose next event comes before `now + 2 ticks`, the new horizon.
    fn sweep(&mut self, now: Instant) {
        let horizon = now + 2 * TICK;
        self.horizon = Some(horizon);
        for (index, slot) in self.slots.iter_mut().enumerate() {
            let Some(entry) = slot.entry.as_mut().filter(|e| e.queued.is_none()) else {
                continue;
            };
            if let Some(at) = entry.next_event().filter(|&at| at < horizon) {
                entry.queued = Some(at);
                self.queue.insert((at, id_of(index, slot.generation)));
            }
        }
    }

    /// For a backend that renews in batches: brings renewals due within the next
    /// [`COALESCE`] (and within a tenth of their TTL) forward into the batch being sent, so
    /// locks taken a few milliseconds apart share one request instead of each waking the task.
    /// Renewing that little early costs nothing: each lock is still renewed once a period.
    fn coalesce(&mut self, now: Instant, due: &mut Vec<Due<B>>) {
        let soon: Vec<u64> = self
            .queue
            .range(..(now + COALESCE, u64::MAX))
            .map(|&(_, id)| id)
            .collect();
        for id in soon {
            let Some(e) = self.get_mut(id) else {
                continue;
            };
            let Some((ttl, at)) = e.renew.filter(|_| !e.in_flight) else {
                continue;
            };
            if at > now + (ttl / 10).min(COALESCE) || e.state.is_fired() {
                continue;
            }
            let Some(backend) = e.backend.upgrade() else {
                continue; // the next pass finds the client gone and fires the guard
            };
            due.push(e.send(id, backend, ttl));
            self.schedule(id);
        }
    }

    /// Whether an event at `at` comes before the task would look by itself.
    fn sooner_than_planned(&self, at: Option<Instant>) -> bool {
        match (at, self.wake_at) {
            (Some(at), Some(wake)) => at < wake,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

fn lock<B: ?Sized>(m: &Mutex<Inner<B>>) -> std::sync::MutexGuard<'_, Inner<B>> {
    // Every update leaves `Inner` consistent before anything that could panic, so a poisoned
    // lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<B: ?Sized + Renewer> Watchdog<B> {
    pub(crate) fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner::default()),
                wake: Notify::new(),
                permits: Semaphore::new(MAX_CONCURRENT_RENEWALS),
            }),
        }
    }

    /// Starts looking after a guard: renewing it (if `renew_ttl` is set) and firing `lost()` when
    /// its safe-until passes. Must be called inside a Tokio runtime.
    pub(crate) fn register(
        &self,
        backend: Weak<B>,
        grant: Grant,
        state: Arc<HoldState>,
        renew_ttl: Option<Duration>,
        safe_until: Option<Instant>,
    ) -> u64 {
        let renew = renew_ttl.map(|ttl| (ttl, grant.sent_at + grant.ttl / 3));
        let first = match (safe_until, renew) {
            (Some(a), Some((_, b))) => Some(a.min(b)),
            (a, b) => a.or(b.map(|(_, at)| at)),
        };
        let mut inner = lock(&self.shared.inner);
        let id = inner.insert(Entry {
            backend,
            grant,
            state,
            renew,
            in_flight: false,
            queued: None,
        });
        let running = inner.task.as_ref().is_some_and(|t| !t.is_finished());
        if !running {
            // The new task's first sweep queues this entry.
            inner.wake_at = None;
            inner.horizon = None;
            inner.task = tokio::runtime::Handle::try_current()
                .ok()
                .map(|h| h.spawn(run(self.shared.clone())));
            return id;
        }
        // Most guards are released long before their first event: past the horizon, the
        // sweep queues them when it comes near, and there is nothing to do now.
        if first.is_none_or(|at| inner.horizon.is_some_and(|h| at >= h)) {
            return id;
        }
        let at = inner.schedule(id);
        let sooner = inner.sooner_than_planned(at);
        drop(inner);
        if sooner {
            self.shared.wake.notify_one();
        }
        id
    }

    /// Stops looking after a guard (released or dropped).
    pub(crate) fn deregister(&self, id: u64) {
        lock(&self.shared.inner).remove(id);
    }

    pub(crate) fn mark_lost(&self, which: impl Fn(&Grant) -> bool, reason: LostReason) {
        let mut inner = lock(&self.shared.inner);
        let ids: Vec<u64> = inner
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.entry.as_ref().is_some_and(|e| which(&e.grant)))
            .map(|(i, s)| id_of(i, s.generation))
            .collect();
        for id in ids {
            if let Some(e) = inner.remove(id) {
                e.state.fire(reason.clone(), &e.grant);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.shared.inner).len
    }
}

impl<B: ?Sized + Renewer> Drop for Watchdog<B> {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.shared.inner).task.take() {
            task.abort();
        }
    }
}

struct Due<B: ?Sized> {
    id: u64,
    backend: Arc<B>,
    grant: Grant,
    ttl: Duration,
}

async fn run<B: ?Sized + Renewer>(shared: Arc<Shared<B>>) {
    let mut idle_since: Option<Instant> = None;
    let mut next_sweep = Instant::now();
    loop {
        let notified = shared.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let mut due = Vec::new();
        let next = {
            let mut inner = lock(&shared.inner);
            let now = Instant::now();
            if now >= next_sweep {
                inner.sweep(now);
                next_sweep = now + TICK;
            }
            while let Some(&(at, id)) = inner.queue.first() {
                if at > now {
                    break;
                }
                inner.queue.pop_first();
                let Some(e) = inner.get_mut(id) else {
                    continue;
                };
                e.queued = None;
                if e.state.is_fired() {
                    inner.remove(id);
                    continue;
                }
                if e.state.safe_until().is_some_and(|until| until <= now) {
                    e.state.fire(LostReason::Expired, &e.grant);
                    inner.remove(id);
                    continue;
                }
                if let Some((ttl, at)) = e.renew {
                    if !e.in_flight && at <= now {
                        let Some(backend) = e.backend.upgrade() else {
                            e.state.fire(LostReason::ClientGone, &e.grant);
                            inner.remove(id);
                            continue;
                        };
                        due.push(e.send(id, backend, ttl));
                    }
                }
                // Not due after all (safe-until was extended) or now in flight: requeue at
                // its next event.
                inner.schedule(id);
            }
            if due.first().is_some_and(|d| d.backend.batch_size() > 1) {
                inner.coalesce(now, &mut due);
            }
            if inner.len == 0 {
                let since = *idle_since.get_or_insert(now);
                if now.duration_since(since) >= IDLE_EXIT {
                    // Exit while holding the lock, so a concurrent `register` sees the task
                    // gone and starts a new one.
                    inner.task = None;
                    inner.wake_at = None;
                    inner.horizon = None;
                    return;
                }
            } else {
                idle_since = None;
            }
            let next = inner
                .queue
                .first()
                .map_or(next_sweep, |&(at, _)| at.min(next_sweep));
            inner.wake_at = Some(next);
            next
        };
        for batch in batches(due) {
            tokio::spawn(renew_batch(shared.clone(), batch));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = &mut notified => {}
        }
    }
}

/// Splits the renewals due at one wake-up into the batches they are sent in: one grant each,
/// unless the backend confirms several with one request (`renew_batch`), then up to that many
/// grants of that backend together.
fn batches<B: ?Sized + Renewer>(mut due: Vec<Due<B>>) -> Vec<Vec<Due<B>>> {
    // Guards of one client normally share one backend handle; group by it all the same.
    due.sort_by_key(|d| Arc::as_ptr(&d.backend).cast::<()>() as usize);
    let mut out: Vec<Vec<Due<B>>> = Vec::new();
    for d in due {
        let size = d.backend.batch_size().max(1);
        match out.last_mut() {
            Some(last) if last.len() < size && Arc::ptr_eq(&last[0].backend, &d.backend) => {
                last.push(d);
            }
            _ => out.push(vec![d]),
        }
    }
    out
}

/// Renews one batch (all of one backend) and settles each grant's outcome.
async fn renew_batch<B: ?Sized + Renewer>(shared: Arc<Shared<B>>, batch: Vec<Due<B>>) {
    let Some(backend) = batch.first().map(|d| d.backend.clone()) else {
        return;
    };
    let one = match batch.as_slice() {
        [d] => Some((d.grant.name.as_str(), d.grant.token.0)),
        _ => None,
    };
    let span = crate::observe::renew_span(backend.label(), one, batch.len());
    let (sent, results) = async {
        // One permit per request: the bound is on what the server is asked at once. (A permit
        // per grant would cap a batch at the permits there are, whatever the backend's
        // `renew_batch`, and let only one batch be in flight at a time.)
        let _permit = shared.permits.acquire().await;
        let sent = Instant::now();
        let results = if let [d] = batch.as_slice() {
            vec![backend.renew_one(&d.grant, d.ttl).await]
        } else {
            let grants: Vec<(Grant, Duration)> =
                batch.iter().map(|d| (d.grant.clone(), d.ttl)).collect();
            backend.renew_all(&grants).await
        };
        (sent, results)
    }
    .instrument(span.clone())
    .await;
    span.record("outcome", crate::observe::renewal_outcome(&results));
    let mut results = results.into_iter();
    let mut sooner = false;
    {
        let mut inner = lock(&shared.inner);
        for d in &batch {
            let result = results.next().unwrap_or_else(|| {
                Err(crate::Error::new(
                    ErrorKind::Backend,
                    "renew_many returned fewer results than grants",
                ))
            });
            let g = &d.grant;
            span.in_scope(|| {
                crate::observe::renewed(d.backend.label(), g.name.as_str(), g.token.0, &result)
            });
            sooner |= settle(&mut inner, d, sent, result);
        }
    }
    if sooner {
        shared.wake.notify_one();
    }
}

/// Applies one renewal's outcome to its entry; whether the entry's next event is now sooner
/// than the task planned to look.
fn settle<B: ?Sized + Renewer>(
    inner: &mut Inner<B>,
    d: &Due<B>,
    sent: Instant,
    result: Result<Duration>,
) -> bool {
    let Some(e) = inner.get_mut(d.id) else {
        return false; // released while the renewal was in flight
    };
    e.in_flight = false;
    match result {
        // An answer that comes after safe-until passed (the task that checks it was held up)
        // finds the guard already lost: `is_lost()` has said so, and lost stays lost.
        Ok(_)
            if e.state
                .safe_until()
                .is_some_and(|until| until <= Instant::now()) =>
        {
            e.state.fire(LostReason::Expired, &d.grant);
            inner.remove(d.id);
            return false;
        }
        Ok(granted) => {
            e.state.extend(safe_until(sent, granted));
            e.renew = Some((d.ttl, sent + granted / 3));
        }
        Err(err) if matches!(err.kind(), ErrorKind::Lost | ErrorKind::NotHeld) => {
            e.state.fire(LostReason::Taken(err.to_string()), &d.grant);
            inner.remove(d.id);
            return false;
        }
        Err(_) => {
            // A failed round trip: try again soon; safe-until decides when to give up.
            let retry = (d.ttl / 10).clamp(Duration::from_millis(10), TICK);
            e.renew = Some((d.ttl, Instant::now() + retry));
        }
    }
    let at = inner.schedule(d.id);
    inner.sooner_than_planned(at)
}
