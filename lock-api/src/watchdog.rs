//! One renewal task per client: renews every watchdog-managed grant at TTL/3 and fires `lost()`
//! when a renewal finds the lock gone or safe-until passes without a successful renewal.
//!
//! Entries sit in a deadline-ordered queue, so a wake-up touches only what is due: a client
//! holding ten thousand locks renews each at its own time at O(log n) a step, not by rescanning
//! them all.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::error::ErrorKind;
use crate::grant::{safe_until, Grant};
use crate::guard::{GrantState, LostReason};
use crate::lock::DistributedLock;

/// How many renewals one client has in flight at most.
const MAX_CONCURRENT_RENEWALS: usize = 64;
/// While it has nothing due sooner, the task still wakes this often, so that enrolling a guard
/// whose first deadline is later than that needs no cross-thread wake-up (the common case: a
/// lock held for less than a third of its lease costs the watchdog no work at all).
const IDLE_TICK: Duration = Duration::from_secs(1);
/// After this long with nothing to watch, the task ends; the next guard starts a new one.
const IDLE_EXIT: Duration = Duration::from_secs(30);

pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Mutex<Inner>,
    wake: Notify,
    permits: Semaphore,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// Each entry's next event (renewal due or safe-until), earliest first.
    queue: BTreeSet<(Instant, u64)>,
    task: Option<JoinHandle<()>>,
    /// When the running task will next look at the queue by itself.
    wake_at: Option<Instant>,
}

struct Entry {
    backend: Weak<dyn DistributedLock>,
    grant: Grant,
    state: Arc<GrantState>,
    /// `Some` for watchdog-managed leases: the TTL to renew with and when to renew next.
    renew: Option<(Duration, Instant)>,
    in_flight: bool,
    /// The entry's key in `Inner::queue`, if queued.
    queued: Option<Instant>,
}

impl Entry {
    /// The next instant something must happen to this entry, if ever.
    fn next_event(&self) -> Option<Instant> {
        let renew = self.renew.filter(|_| !self.in_flight).map(|(_, at)| at);
        match (self.state.safe_until(), renew) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Inner {
    /// (Re)queues entry `id` at its next event; returns that instant.
    fn schedule(&mut self, id: u64) -> Option<Instant> {
        let entry = self.entries.get_mut(&id)?;
        if let Some(old) = entry.queued.take() {
            self.queue.remove(&(old, id));
        }
        let at = entry.next_event()?;
        entry.queued = Some(at);
        self.queue.insert((at, id));
        Some(at)
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(at) = entry.queued {
            self.queue.remove(&(at, id));
        }
        Some(entry)
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

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    // Every update leaves `Inner` consistent before anything that could panic, so a poisoned
    // lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watchdog {
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
        backend: Weak<dyn DistributedLock>,
        grant: Grant,
        state: Arc<GrantState>,
        renew_ttl: Option<Duration>,
    ) -> u64 {
        let mut inner = lock(&self.shared.inner);
        let id = inner.next_id;
        inner.next_id += 1;
        let renew = renew_ttl.map(|ttl| (ttl, grant.sent_at + grant.ttl / 3));
        inner.entries.insert(
            id,
            Entry {
                backend,
                grant,
                state,
                renew,
                in_flight: false,
                queued: None,
            },
        );
        let at = inner.schedule(id);
        let running = inner.task.as_ref().is_some_and(|t| !t.is_finished());
        if !running {
            inner.wake_at = None;
            inner.task = tokio::runtime::Handle::try_current()
                .ok()
                .map(|h| h.spawn(run(self.shared.clone())));
            return id;
        }
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
            .entries
            .iter()
            .filter(|(_, e)| which(&e.grant))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if let Some(e) = inner.remove(id) {
                e.state.fire(reason.clone());
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.shared.inner).entries.len()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.shared.inner).task.take() {
            task.abort();
        }
    }
}

struct Due {
    id: u64,
    backend: Arc<dyn DistributedLock>,
    grant: Grant,
    ttl: Duration,
}

async fn run(shared: Arc<Shared>) {
    let mut idle_since: Option<Instant> = None;
    loop {
        let notified = shared.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let mut due = Vec::new();
        let next = {
            let mut inner = lock(&shared.inner);
            let now = Instant::now();
            while let Some(&(at, id)) = inner.queue.first() {
                if at > now {
                    break;
                }
                inner.queue.pop_first();
                let Some(e) = inner.entries.get_mut(&id) else {
                    continue;
                };
                e.queued = None;
                if e.state.is_fired() {
                    inner.remove(id);
                    continue;
                }
                if e.state.safe_until().is_some_and(|until| until <= now) {
                    e.state.fire(LostReason::Expired);
                    inner.remove(id);
                    continue;
                }
                if let Some((ttl, at)) = e.renew {
                    if !e.in_flight && at <= now {
                        let Some(backend) = e.backend.upgrade() else {
                            e.state.fire(LostReason::ClientGone);
                            inner.remove(id);
                            continue;
                        };
                        e.in_flight = true;
                        due.push(Due {
                            id,
                            backend,
                            grant: e.grant.clone(),
                            ttl,
                        });
                    }
                }
                // Not due after all (safe-until was extended) or now in flight: requeue at
                // its next event.
                inner.schedule(id);
            }
            if inner.entries.is_empty() {
                let since = *idle_since.get_or_insert(now);
                if now.duration_since(since) >= IDLE_EXIT {
                    // Exit while holding the lock, so a concurrent `register` sees the task
                    // gone and starts a new one.
                    inner.task = None;
                    inner.wake_at = None;
                    return;
                }
            } else {
                idle_since = None;
            }
            let tick = now + IDLE_TICK;
            let next = inner.queue.first().map_or(tick, |&(at, _)| at.min(tick));
            inner.wake_at = Some(next);
            next
        };
        for d in due {
            tokio::spawn(renew_one(shared.clone(), d));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = &mut notified => {}
        }
    }
}

async fn renew_one(shared: Arc<Shared>, d: Due) {
    let result = {
        let _permit = shared.permits.acquire().await;
        let sent = Instant::now();
        d.backend.renew(&d.grant, d.ttl).await.map(|g| (sent, g))
    };
    let sooner = {
        let mut inner = lock(&shared.inner);
        let Some(e) = inner.entries.get_mut(&d.id) else {
            return; // released while the renewal was in flight
        };
        e.in_flight = false;
        match result {
            Ok((sent, granted)) => {
                e.state.extend(safe_until(sent, granted));
                e.renew = Some((d.ttl, sent + granted / 3));
            }
            Err(err) if matches!(err.kind(), ErrorKind::Lost | ErrorKind::NotHeld) => {
                e.state.fire(LostReason::Taken(err.to_string()));
                inner.remove(d.id);
                return;
            }
            Err(_) => {
                // A failed round trip: try again soon; safe-until decides when to give up.
                let retry = (d.ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
                e.renew = Some((d.ttl, Instant::now() + retry));
            }
        }
        let at = inner.schedule(d.id);
        inner.sooner_than_planned(at)
    };
    if sooner {
        shared.wake.notify_one();
    }
}
