//! Wait loops for backends: one driven by server notices, one polling with capped exponential
//! backoff and jitter. Both honour the deadline (one last attempt at it, then
//! [`ErrorKind::Timeout`]) and are cancellation-safe wherever the attempt is.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

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

/// Runs one acquire attempt as a task of its own, so that dropping the caller's future at any
/// point never loses a grant: once a request is sent the server may grant the lock even if the
/// caller is gone, and a grant nobody receives is handed to `undo` (which releases it). If the
/// outcome arrived but the caller was dropped before reading it, the caller's drop guard hands
/// it to `undo` instead; exactly one side does. Outside a Tokio runtime the attempt runs inline.
pub async fn detached<A, U, UF>(attempt: A, undo: U) -> Result<Attempt>
where
    A: Future<Output = Result<Attempt>> + Send + 'static,
    U: Fn(Grant) -> UF + Send + Sync + 'static,
    UF: Future<Output = ()> + Send + 'static,
{
    let Ok(handle) = Handle::try_current() else {
        // Outside Tokio nothing can run in the background; the driver needs Tokio anyway.
        return attempt.await;
    };
    let undo: Undo = Arc::new(move |g| Box::pin(undo(g)));
    let (tx, rx) = oneshot::channel();
    let task_undo = undo.clone();
    handle.spawn(async move {
        if let Err(Ok(Attempt::Granted(grant))) = tx.send(attempt.await) {
            task_undo(grant).await;
        }
    });
    let mut pending = Pending {
        rx,
        undo: Some(undo),
        handle,
    };
    let outcome = (&mut pending.rx).await;
    pending.undo = None;
    outcome.unwrap_or_else(|_| {
        Err(Error::new(
            ErrorKind::Backend,
            "the acquire task ended without an answer (the runtime is shutting down)",
        ))
    })
}

type Undo = Arc<dyn Fn(Grant) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

struct Pending {
    rx: oneshot::Receiver<Result<Attempt>>,
    undo: Option<Undo>,
    handle: Handle,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        // Closing first makes the hand-over atomic: after it, either the outcome is already
        // here (and undone below) or the task's send fails (and the task undoes it).
        self.rx.close();
        if let Ok(Ok(Attempt::Granted(grant))) = self.rx.try_recv() {
            self.handle.spawn(undo(grant));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
