//! How acquires wait: [`Waiting`], which a backend picks, and the loops the core runs with its
//! attempts — one driven by server notices, one polling with capped exponential backoff and
//! jitter. Both honour the deadline (one last attempt at it, then [`ErrorKind::Timeout`]). The
//! core makes every attempt cancellation-safe (`detached`), so no backend wires its own.
//!
//! A backend that waits in a queue of its own ([`Waiting::Queue`]) leaves server state behind
//! while it waits (a queue node, a waiter key). [`Armed`] is the one way to undo it when the
//! acquire stops half-way: the state lives in a [`Cleanup`] that runs in the background if the
//! acquire's future is dropped (or fails) before it [`disarm`](Armed::disarm)s it. The core's
//! own cancellation safety is built on it too.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::error::{Error, ErrorKind, Result};
use crate::grant::Grant;

/// The outcome of one acquire attempt inside a wait loop.
#[derive(Debug)]
pub enum Attempt {
    /// The lock is ours.
    Granted(Grant),
    /// Someone else holds it; `expires_in` is the holder's remaining lease if the server said,
    /// so the waiter wakes no later than the holder's expiry (a crashed holder sends no notice).
    Held {
        /// The holder's remaining lease.
        expires_in: Option<Duration>,
    },
}

impl Attempt {
    /// The grant, if this attempt won one: what `try_acquire` returns.
    pub fn into_grant(self) -> Option<Grant> {
        match self {
            Attempt::Granted(grant) => Some(grant),
            Attempt::Held { .. } => None,
        }
    }
}

/// What a [`hand_over`](crate::DistributedLock::hand_over) request did.
#[derive(Debug)]
pub enum HandOver {
    /// The releasing grant's last hold ended and the waiter's request was granted in the same
    /// atomic step: the new grant, with a fresh fencing token and the waiter's lease counted
    /// from the request's send.
    Handed(Grant),
    /// Nothing was passed on; the request did what [`release`](crate::DistributedLock::release)
    /// does (one hold taken away when the grant has several), and says what release would:
    /// whether the grant still held the lock.
    Released(bool),
}

/// How a waiting acquire learns that the lock may be free between attempts
/// ([`Profile::waiting`](crate::Profile::waiting)).
#[derive(Clone, Debug)]
pub enum Waiting {
    /// It attempts again after a backoff step, and no later than the holder's expiry.
    Poll(Backoff),
    /// The server sends notices ([`DistributedLock::subscribe`](crate::DistributedLock::subscribe)):
    /// it attempts again on each, and at the holder's expiry or [`NOTICE_RECHECK`] at the latest.
    Notify,
    /// The server keeps a queue of waiters; the backend's
    /// [`acquire`](crate::DistributedLock::acquire) waits in it.
    Queue,
}

/// A subscription to notices that one lock may have come free.
#[async_trait::async_trait]
pub trait Notices: Send + Sync {
    /// Returns at the next notice, or after `max`.
    async fn wait(&self, max: Duration);
}

/// Capped exponential backoff with jitter: each delay is drawn from the upper half of the
/// current step, which doubles up to the cap.
#[derive(Clone, Debug)]
pub struct Backoff {
    step: Duration,
    cap: Duration,
}

impl Default for Backoff {
    /// 2 ms doubling to at most 100 ms.
    fn default() -> Self {
        Self::new(Duration::from_millis(2), Duration::from_millis(100))
    }
}

impl Backoff {
    /// The longest step a backend's config accepts.
    pub const MAX_STEP: Duration = Duration::from_secs(60);

    /// Checks a configured backoff: `InvalidArgument` unless 0 < `base` <= `cap` <=
    /// [`MAX_STEP`](Self::MAX_STEP).
    pub fn check(base: Duration, cap: Duration) -> crate::Result<()> {
        if base.is_zero() || base > cap || cap > Self::MAX_STEP {
            return Err(crate::Error::invalid(format!(
                "backoff {base:?}..{cap:?} must satisfy 0 < base <= cap <= {:?}",
                Self::MAX_STEP
            )));
        }
        Ok(())
    }

    /// Starts at `base` and doubles up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            step: base.max(Duration::from_micros(100)),
            cap: cap.max(base),
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.cap);
        let half = step / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// The longest a notice-driven waiter sleeps without re-checking, in case a notice was lost
/// (a dropped connection, a holder that crashed before publishing).
pub const NOTICE_RECHECK: Duration = Duration::from_secs(5);

/// Runs `attempt` until it grants or `deadline` passes; between attempts, awaits
/// `wait_notice(max)`, which must return when the backend hears the lock may be free, or after
/// `max` (already bounded by the deadline and the holder's expiry). Subscribe to notices
/// *before* calling this, so a release between an attempt and the wait is not missed.
pub async fn notified<A, AF, W, WF>(
    deadline: Instant,
    mut attempt: A,
    mut wait_notice: W,
) -> Result<Grant>
where
    A: FnMut() -> AF,
    AF: Future<Output = Result<Attempt>>,
    W: FnMut(Duration) -> WF,
    WF: Future<Output = ()>,
{
    let started = Instant::now();
    loop {
        let expires_in = match attempt().await? {
            Attempt::Granted(grant) => return Ok(grant),
            Attempt::Held { expires_in } => expires_in,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(timeout(deadline.saturating_duration_since(started)));
        }
        let mut max = (deadline - now).min(NOTICE_RECHECK);
        if let Some(e) = expires_in {
            // One millisecond past the holder's expiry, so the retry finds it expired.
            max = max.min(e + Duration::from_millis(1));
        }
        wait_notice(max).await;
    }
}

/// Polls `attempt` with `backoff` until it grants or `deadline` passes.
pub async fn poll<A, AF>(deadline: Instant, mut backoff: Backoff, attempt: A) -> Result<Grant>
where
    A: FnMut() -> AF,
    AF: Future<Output = Result<Attempt>>,
{
    notified(deadline, attempt, move |max| {
        let d = backoff.next_delay().min(max);
        tokio::time::sleep(d)
    })
    .await
}

/// The error of a wait that ran out.
pub fn timeout(waited: Duration) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("not acquired within the wait bound of {waited:?}"),
    )
}

/// Runs one acquire attempt so that dropping the caller's future at any point never loses a
/// grant: once a request is sent, the server may grant the lock whether or not anyone is left
/// to hear the answer, and a grant nobody receives is handed to `undo` (which releases it).
///
/// The attempt is polled in the caller's own task, so its request is written in the same tick
/// as the wake-up that prompted it. (Spawning it instead, as an earlier version did, added a
/// task hand-off to every attempt; on the notified path — connection driver → notice → waiter →
/// attempt → connection driver — that exceeded Tokio's budget of three hand-offs in a row, so
/// the driver was queued behind a cross-thread wake-up: about 45 µs more per wake-up on Redis,
/// measured.) If the caller's future is dropped after the attempt was first polled, the
/// unfinished attempt moves into a task of its own, which finishes it and hands a grant it won
/// to `undo`. A completed outcome is returned in the very poll that produced it, so a grant
/// belongs to the caller or to `undo`, never to nobody. Dropped outside a Tokio runtime, an
/// unfinished attempt is dropped too and a grant it may have caused ends with its lease.
pub(crate) fn detached<A, U, UF>(attempt: A, undo: U) -> Detached
where
    A: Future<Output = Result<Attempt>> + Send + 'static,
    U: FnOnce(Grant) -> UF + Send + 'static,
    UF: Future<Output = ()> + Send + 'static,
{
    Detached {
        // Armed now, inside the runtime that runs the attempt: the drop may happen elsewhere.
        unfinished: Some(Armed::new(Unfinished {
            attempt: Box::pin(attempt),
            undo: Box::new(move |g| Box::pin(undo(g))),
        })),
        started: false,
        polling: false,
    }
}

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Undo = Box<dyn FnOnce(Grant) -> Boxed<()> + Send>;

/// Server state an operation leaves behind until it completes, and how to undo it.
pub trait Cleanup: Send + 'static {
    /// The work that undoes the state, run in the background by a dropped [`Armed`].
    fn run(self) -> impl Future<Output = ()> + Send + 'static;

    /// Called instead of [`run`](Cleanup::run) when an [`Armed`] is dropped where no Tokio
    /// runtime is around to run it (and none was when it was armed). The default does nothing:
    /// the state ends with its lease or session.
    fn without_runtime(self)
    where
        Self: Sized,
    {
    }
}

/// A [`Cleanup`] that runs in the background if this is dropped before
/// [`disarm`](Armed::disarm) (the operation completed, and the state is the caller's now).
/// The operation reaches its state through `Deref`/`DerefMut` while it goes on.
///
/// The runtime is the one the `Armed` was made in (an acquire's), so a drop on another thread
/// still cleans up; without one, [`Cleanup::without_runtime`] is called.
#[must_use = "dropping it at once runs the cleanup"]
pub struct Armed<C: Cleanup> {
    cleanup: Option<C>,
    handle: Option<Handle>,
}

impl<C: Cleanup> Armed<C> {
    /// Arms `cleanup`.
    pub fn new(cleanup: C) -> Self {
        Self {
            cleanup: Some(cleanup),
            handle: Handle::try_current().ok(),
        }
    }

    /// The operation completed: its state is kept, and is returned.
    pub fn disarm(mut self) -> C {
        match self.cleanup.take() {
            Some(cleanup) => cleanup,
            // `cleanup` is only taken here and in `drop`, each of which consumes `self`.
            None => unreachable!("Armed disarmed twice"),
        }
    }

    fn state(&self) -> &C {
        self.cleanup
            .as_ref()
            .expect("an Armed holds its cleanup until it is consumed")
    }
}

impl<C: Cleanup> std::ops::Deref for Armed<C> {
    type Target = C;

    fn deref(&self) -> &C {
        self.state()
    }
}

impl<C: Cleanup> std::ops::DerefMut for Armed<C> {
    fn deref_mut(&mut self) -> &mut C {
        self.cleanup
            .as_mut()
            .expect("an Armed holds its cleanup until it is consumed")
    }
}

impl<C: Cleanup> Drop for Armed<C> {
    fn drop(&mut self) {
        let Some(cleanup) = self.cleanup.take() else {
            return;
        };
        match Handle::try_current().ok().or_else(|| self.handle.take()) {
            Some(handle) => drop(handle.spawn(cleanup.run())),
            None => cleanup.without_runtime(),
        }
    }
}

/// What a dropped [`Detached`] leaves to finish: the attempt under way, whose grant, if it
/// wins one, goes to `undo`.
struct Unfinished {
    attempt: Boxed<Result<Attempt>>,
    undo: Undo,
}

impl Cleanup for Unfinished {
    async fn run(self) {
        if let Ok(Attempt::Granted(grant)) = self.attempt.await {
            (self.undo)(grant).await;
        }
    }
}

/// The future [`detached`] returns.
#[must_use = "futures do nothing unless awaited"]
pub(crate) struct Detached {
    /// `None` once the outcome was returned.
    unfinished: Option<Armed<Unfinished>>,
    /// Polled at least once: a request may have been sent.
    started: bool,
    /// Inside the attempt's `poll`: a drop that sees this comes from a panic in it, and the
    /// attempt cannot be polled again.
    polling: bool,
}

impl Future for Detached {
    type Output = Result<Attempt>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(unfinished) = this.unfinished.as_mut() else {
            return Poll::Ready(Err(Error::new(
                ErrorKind::Backend,
                "acquire attempt polled after it completed",
            )));
        };
        this.started = true;
        this.polling = true;
        let polled = unfinished.attempt.as_mut().poll(cx);
        this.polling = false;
        if polled.is_ready() {
            // From here on the outcome is the caller's: nothing is left to undo.
            if let Some(done) = this.unfinished.take() {
                drop(done.disarm());
            }
        }
        polled
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        // Never polled: nothing was sent. Panicked inside its poll: it cannot be resumed.
        if !self.started || self.polling {
            if let Some(done) = self.unfinished.take() {
                drop(done.disarm());
            }
        }
        // Otherwise the `Armed` finishes the attempt in the background as it drops, and gives
        // back a grant it wins.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records which way a cleanup went.
    struct Note(std::sync::mpsc::Sender<&'static str>);

    impl Cleanup for Note {
        async fn run(self) {
            let _ = self.0.send("ran in the background");
        }

        fn without_runtime(self) {
            let _ = self.0.send("no runtime");
        }
    }

    #[tokio::test]
    async fn armed_cleanup_runs_when_dropped_and_not_when_disarmed() {
        let (tx, rx) = std::sync::mpsc::channel();
        drop(Armed::new(Note(tx.clone())).disarm());
        drop(Armed::new(Note(tx)));
        // The dropped one's task runs on this runtime once we yield.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), ["ran in the background"]);
    }

    #[test]
    fn armed_dropped_on_a_plain_thread_cleans_up_on_its_runtime_or_says_there_is_none() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let armed = rt.block_on(async { Armed::new(Note(tx.clone())) });
        std::thread::spawn(move || drop(armed)).join().unwrap();
        let got = rx.recv_timeout(Duration::from_secs(5));
        assert_eq!(got, Ok("ran in the background"));
        let orphan = Armed::new(Note(tx));
        std::thread::spawn(move || drop(orphan)).join().unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("no runtime"));
    }

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter() {
        let mut b = Backoff::new(Duration::from_millis(4), Duration::from_millis(32));
        let delays: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        let steps = [4u64, 8, 16, 32, 32, 32, 32, 32];
        for (d, s) in delays.iter().zip(steps) {
            let s = Duration::from_millis(s);
            assert!(*d >= s / 2 && *d <= s, "{d:?} not in [{:?}, {s:?}]", s / 2);
        }
    }

    #[tokio::test]
    async fn poll_times_out_after_the_deadline_with_a_last_attempt() {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(250);
        let mut attempts = 0;
        let err = poll(deadline, Backoff::default(), || {
            attempts += 1;
            async { Ok(Attempt::Held { expires_in: None }) }
        })
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        assert!(Instant::now() >= deadline);
        assert!(attempts >= 4, "only {attempts} attempts");
    }

    fn grant() -> Grant {
        Grant {
            name: crate::LockName::new("detached-test").unwrap(),
            owner: crate::OwnerId::new("o").unwrap(),
            token: crate::FencingToken(7),
            hold_count: 1,
            ttl: Duration::from_secs(1),
            sent_at: Instant::now(),
            key: String::new(),
            permits: 1,
        }
    }

    /// An attempt that grants once `go` fires, and an undo that records what it was given.
    #[allow(clippy::type_complexity)]
    fn parts() -> (
        tokio::sync::oneshot::Sender<()>,
        impl Future<Output = Result<Attempt>> + Send + 'static,
        impl FnOnce(Grant) -> std::future::Ready<()> + Send + 'static,
        std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    ) {
        let (go, gate) = tokio::sync::oneshot::channel::<()>();
        let attempt = async move {
            let _ = gate.await;
            Ok(Attempt::Granted(grant()))
        };
        let undone = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = undone.clone();
        let undo = move |g: Grant| {
            seen.lock().unwrap().push(g.token.0);
            std::future::ready(())
        };
        (go, attempt, undo, undone)
    }

    #[tokio::test]
    async fn a_completed_grant_is_the_callers() {
        let (go, attempt, undo, undone) = parts();
        go.send(()).unwrap();
        let outcome = detached(attempt, undo).await.unwrap();
        assert!(matches!(outcome, Attempt::Granted(_)));
        tokio::task::yield_now().await;
        assert!(undone.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_grant_that_lands_after_the_caller_left_is_undone() {
        let (go, attempt, undo, undone) = parts();
        let mut fut = Box::pin(detached(attempt, undo));
        // Started (a request may be out), then the caller goes away.
        assert!(futures::poll!(fut.as_mut()).is_pending());
        drop(fut);
        go.send(()).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(*undone.lock().unwrap(), vec![7]);
    }

    #[tokio::test]
    async fn an_attempt_never_started_is_not_run() {
        let (go, attempt, undo, undone) = parts();
        drop(detached(attempt, undo));
        // The attempt was dropped with the future: nobody waits for the gate any more.
        assert!(go.send(()).is_err());
        tokio::task::yield_now().await;
        assert!(undone.lock().unwrap().is_empty());
    }
}
