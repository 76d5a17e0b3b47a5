//! How a polling backend's waiters share one client handle: one of them polls the server for a
//! name at a time, the rest queue in the handle in FIFO order, and a release through the handle
//! hands the lock to the polling one at once. Checked over the history of tasks contending on
//! one handle, with a backoff so long (60 s) that any hand-off not made by a same-handle
//! wake-up would run into the acquire's wait bound and fail. A notified backend's waiters are
//! woken by a release through their own handle too, without waiting for the server's notice.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::backend::wait::{Attempt, Backoff, Notices, Waiting};
use distlock_api::backend::{AcquireRequest, ClientCore};
use distlock_api::Profile;
use distlock_api::{
    DistributedLock, ErrorKind, FencingToken, Grant, LockExt, LockInfo, LockName, MemoryStore,
    Result,
};

/// A memory client seen as a networked backend that waits the given way, counting the attempts
/// it sends. Polling waits as MySQL, MongoDB and RedLock do; notified waits for server notices
/// that never come (a lost notice), so only a same-handle wake-up, or the 5 s re-check, gets a
/// waiter going again.
struct Remote {
    inner: distlock_api::MemoryLock,
    waiting: Waiting,
    attempts: AtomicUsize,
    /// The notices a polling client subscribes to, if its server has any (a `Notify` client
    /// gets [`Silence`]).
    signal: Option<Arc<Signal>>,
    subscribed: AtomicUsize,
}

/// A server's wait channel that the test fires by hand.
#[derive(Default)]
struct Signal(tokio::sync::Notify);

struct Signalled(Arc<Signal>);

#[distlock_api::backend::async_trait]
impl Notices for Signalled {
    async fn wait(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.0 .0.notified()).await;
    }
}

struct Silence;

#[distlock_api::backend::async_trait]
impl Notices for Silence {
    async fn wait(&self, max: Duration) {
        tokio::time::sleep(max).await;
    }
}

#[distlock_api::backend::async_trait]
impl DistributedLock for Remote {
    fn profile(&self) -> Profile {
        Profile::new(self.inner.capabilities()).waiting(self.waiting.clone())
    }

    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        distlock_api::backend::force_release_by_releases(self, name, token).await
    }
    async fn give_back(&self, surplus: &distlock_api::backend::Surplus) -> Result<bool> {
        distlock_api::backend::give_back_by_release(self, surplus).await
    }
    fn core(&self) -> &ClientCore {
        self.inner.core()
    }
    async fn subscribe(&self, _name: &LockName) -> Result<Box<dyn Notices>> {
        self.subscribed.fetch_add(1, Ordering::SeqCst);
        match (&self.waiting, &self.signal) {
            (Waiting::Notify, _) => Ok(Box::new(Silence)),
            (_, Some(signal)) => Ok(Box::new(Signalled(signal.clone()))),
            _ => Err(distlock_api::Error::new(
                ErrorKind::Unsupported,
                "no notices on this server",
            )),
        }
    }
    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        self.inner.attempt(req).await
    }
    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.inner.release(grant).await
    }
    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        self.inner.renew(grant, ttl).await
    }
    async fn proclaim(
        &self,
        grant: &distlock_api::Grant,
        value: &str,
    ) -> distlock_api::Result<bool> {
        self.inner.proclaim(grant, value).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
    fn capabilities(&self) -> distlock_api::Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(
        &self,
        req: &distlock_api::backend::AcquireRequest,
        wait: std::time::Duration,
    ) -> distlock_api::Result<distlock_api::Grant> {
        self.inner.acquire(req, wait).await
    }
    async fn hand_over(
        &self,
        from: &distlock_api::Grant,
        to: &distlock_api::backend::AcquireRequest,
    ) -> distlock_api::Result<distlock_api::backend::wait::HandOver> {
        self.inner.hand_over(from, to).await
    }
    /// The watchdog's, not the wrapped backend's: this wrapper's guards take the networked
    /// backends' path.
    fn keeper(&self) -> &dyn distlock_api::backend::LeaseKeeper {
        self.core().watchdog_keeper()
    }
    async fn renew_many(
        &self,
        grants: &[(distlock_api::Grant, std::time::Duration)],
    ) -> Vec<distlock_api::Result<std::time::Duration>> {
        self.inner.renew_many(grants).await
    }
    async fn list(
        &self,
        prefix: &str,
    ) -> distlock_api::Result<Vec<(distlock_api::LockName, distlock_api::LockInfo)>> {
        self.inner.list(prefix).await
    }
}

fn remote(store: &MemoryStore, waiting: Waiting) -> Arc<Remote> {
    Arc::new(Remote {
        inner: store.client(),
        waiting,
        attempts: AtomicUsize::new(0),
        signal: None,
        subscribed: AtomicUsize::new(0),
    })
}

/// Polling with a 60 s backoff.
fn polled(store: &MemoryStore) -> Arc<Remote> {
    remote(
        store,
        Waiting::Poll(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        )),
    )
}

const TASKS: usize = 6;
const ROUNDS: usize = 15;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_one_handle_take_turns_fifo_with_one_poller_and_no_barging() {
    let store = MemoryStore::new();
    let lock = polled(&store);
    let inside = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(Vec::new()));
    // The first holder keeps the lock until every task is queued behind it.
    let first = lock.try_lock("hot").await.unwrap().expect("free");
    let queued = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (lock, inside, history, queued) = (
            lock.clone(),
            inside.clone(),
            history.clone(),
            queued.clone(),
        );
        // Start them one by one so the queue's order is the task order.
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let acquiring = lock.lock("hot", Duration::from_secs(30));
                if round == 0 {
                    queued.fetch_add(1, Ordering::SeqCst);
                }
                let guard = acquiring.await.unwrap();
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two tasks of one handle held the lock at once"
                );
                history.lock().unwrap().push(t);
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                assert!(guard.release().await.unwrap());
            }
        }));
        // Let task t reach its place in the queue before the next one starts.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while queued.load(Ordering::SeqCst) < TASKS {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = lock.attempts.load(Ordering::SeqCst);
    assert!(first.release().await.unwrap());
    for task in tasks {
        task.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    assert_eq!(history.len(), TASKS * ROUNDS);
    // FIFO with no barging: a task that releases and asks again queues behind all the others,
    // so the grants go round in the order the tasks first queued.
    let expected: Vec<usize> = (0..TASKS * ROUNDS).map(|i| i % TASKS).collect();
    assert_eq!(history, expected, "grants out of FIFO order");
    // One poller, which waits for the handle's release before it asks: each grant costs the
    // attempt that wins it (a waiter that takes the turn from one that lost it, e.g. the
    // first, asks at once). Every waiter polling would cost about one attempt per waiter per
    // release; a poller asking as soon as it takes the turn, two per grant.
    let attempts = lock.attempts.load(Ordering::SeqCst) - before;
    assert!(
        attempts <= TASKS * ROUNDS + TASKS,
        "{attempts} attempts for {} grants",
        TASKS * ROUNDS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_times_out_at_its_bound_and_a_dropped_one_leaves_the_queue() {
    let store = MemoryStore::new();
    let lock = polled(&store);
    let held = lock.try_lock("q").await.unwrap().expect("free");
    // The poller: its backoff (60 s) is longer than everything below.
    let poller = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock("q", Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Queued behind the poller: times out at its bound, with one last attempt.
    let before = lock.attempts.load(Ordering::SeqCst);
    let started = std::time::Instant::now();
    let err = lock
        .lock("q", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        lock.attempts.load(Ordering::SeqCst) - before,
        1,
        "a queued waiter sends only its last attempt"
    );
    // Another queued waiter, dropped while it waits: it leaves no place behind.
    let dropped = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock("q", Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    // The release wakes the poller, which gets the lock; then a new waiter gets its turn.
    assert!(held.release().await.unwrap());
    let second = poller.await.unwrap().unwrap();
    let third = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock("q", Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(second.release().await.unwrap());
    let third = third.await.unwrap().unwrap();
    assert!(third.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_is_woken_by_a_release_through_its_own_handle() {
    let store = MemoryStore::new();
    let lock = remote(&store, Waiting::Notify);
    for _ in 0..5 {
        let held = lock.try_lock("n").await.unwrap().expect("free");
        let waiter = {
            let lock = lock.clone();
            tokio::spawn(async move {
                let g = lock.lock("n", Duration::from_secs(30)).await;
                (std::time::Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = std::time::Instant::now();
        assert!(held.release().await.unwrap());
        let (granted, next) = waiter.await.unwrap();
        // Without the wake-up, the waiter would look again only at the 5 s re-check: the bound
        // tells one from the other, not how fast the wake-up is.
        let after = granted.saturating_duration_since(released);
        assert!(
            after < Duration::from_millis(2500),
            "granted {after:?} after the release"
        );
        assert!(next.unwrap().release().await.unwrap());
    }
}

/// A polling backend whose server also signals releases (MariaDB's `GET_LOCK`, MongoDB's change
/// streams) subscribes only once an attempt found the lock held, attempts once more (a release
/// before the subscription sends it nothing), and then waits for the signal, not the backoff:
/// with a 60 s backoff, only the signal can hand the lock over within the test's bound. A
/// waiter whose server has no notices keeps polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_waiter_with_server_signals_subscribes_when_held_and_is_woken_by_them() {
    let store = MemoryStore::new();
    let signal = Arc::new(Signal::default());
    let backoff = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
    let waiter = Arc::new(Remote {
        inner: store.client(),
        waiting: Waiting::Poll(backoff),
        attempts: AtomicUsize::new(0),
        signal: Some(signal.clone()),
        subscribed: AtomicUsize::new(0),
    });
    let holder = polled(&store);
    // Uncontended: one attempt, no subscription.
    let g = waiter.lock("n", Duration::from_secs(5)).await.unwrap();
    assert!(g.release().await.unwrap());
    assert_eq!(waiter.attempts.load(Ordering::SeqCst), 1);
    assert_eq!(waiter.subscribed.load(Ordering::SeqCst), 0);

    let held = holder.try_lock("n").await.unwrap().expect("free");
    let task = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock("n", Duration::from_secs(30)).await })
    };
    // Held: attempt, subscribe, attempt again, then wait for the signal.
    while waiter.attempts.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(waiter.subscribed.load(Ordering::SeqCst), 1);
    assert_eq!(
        waiter.attempts.load(Ordering::SeqCst),
        3,
        "no attempt while waiting for the signal"
    );
    assert!(!task.is_finished());
    // Released through another handle: no same-handle wake-up, only the server's signal.
    assert!(held.release().await.unwrap());
    signal.0.notify_waiters();
    let got = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the signal hands the lock over, not the 60 s backoff")
        .unwrap()
        .unwrap();
    assert_eq!(waiter.attempts.load(Ordering::SeqCst), 4);
    assert!(got.release().await.unwrap());

    // No notices on this server: the waiter subscribes, is refused, and polls with its backoff.
    let poller = remote(
        &store,
        Waiting::Poll(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(20),
        )),
    );
    let held = holder.try_lock("n").await.unwrap().expect("free");
    let task = {
        let poller = poller.clone();
        tokio::spawn(async move { poller.lock("n", Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(poller.subscribed.load(Ordering::SeqCst), 1, "asked once");
    let polls = poller.attempts.load(Ordering::SeqCst);
    assert!(polls >= 4, "kept polling: {polls} attempts in 200 ms");
    assert!(held.release().await.unwrap());
    let got = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("found free by polling")
        .unwrap()
        .unwrap();
    assert!(got.release().await.unwrap());
}
