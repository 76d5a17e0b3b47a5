//! What the server-fault tests of the backends share (the tests that crash, restart and pause a
//! private server of their own): waits that fail a test as hung instead of hanging it, settling
//! after a restart, a contender that keeps trying a held lock, and calls that must fail within
//! a bound.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_api::{DistributedLock, Error, ErrorKind, FencingToken, LockExt, LockInfo, Result};

/// Whole milliseconds of `d`, for messages.
pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// Signed milliseconds from `from` to `to`.
pub fn delta_ms(from: Instant, to: Instant) -> i128 {
    if to >= from {
        to.duration_since(from).as_millis() as i128
    } else {
        -(from.duration_since(to).as_millis() as i128)
    }
}

/// Awaits `fut`, failing the test if it does not finish within `limit` (a hang is a defect).
pub async fn bounded<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {limit:?}: it hangs"),
    }
}

/// Runs `op` until it answers without a temporary error, for up to `limit`, each try bounded
/// by `per_try`: right after a restart, a connection to the old server process fails before
/// it is replaced. Returns the answer and the temporary errors seen on the way; a permanent
/// error fails the test.
pub async fn settled<T, F, Fut>(
    what: &str,
    limit: Duration,
    per_try: Duration,
    mut op: F,
) -> (T, Vec<String>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + limit;
    let mut errors = Vec::new();
    loop {
        match bounded(what, per_try, op()).await {
            Ok(v) => return (v, errors),
            Err(e) if e.is_temporary() && Instant::now() < deadline => {
                errors.push(format!("{:?}: {e}", e.kind()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: {e:?} (temporary errors before it: {errors:?})"),
        }
    }
}

/// Whether a holder's [`LockInfo`] must show lease time left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseLeft {
    /// A per-lock lease: some time must be left.
    Required,
    /// A session lease: no time may be known, but a time known must not be zero.
    IfKnown,
}

/// Checks who holds the lock: `owner` with `token`, with lease left as `lease` says.
pub fn assert_held_by(
    info: Option<LockInfo>,
    owner: &str,
    token: FencingToken,
    lease: LeaseLeft,
    when: &str,
) {
    let info = info.unwrap_or_else(|| panic!("{when}: nobody holds the lock (holder() = None)"));
    assert_eq!(info.owner.label(), owner, "{when}: wrong holder: {info:?}");
    assert_eq!(info.token, token, "{when}: wrong token: {info:?}");
    let left = match lease {
        LeaseLeft::Required => info.remaining.is_some_and(|r| !r.is_zero()),
        LeaseLeft::IfKnown => info.remaining.is_none_or(|r| !r.is_zero()),
    };
    assert!(left, "{when}: no lease left: {info:?}");
}

/// What a [`Contender`] saw.
#[derive(Default, Debug)]
pub struct Tries {
    /// Grants it won (each a second holder), with when.
    pub grants: Vec<(FencingToken, Instant)>,
    /// Answers that the lock was held.
    pub refused: u32,
    /// Errors: kind, whether temporary, text.
    pub errors: Vec<(ErrorKind, bool, String)>,
    /// The longest a single `try_lock` took.
    pub slowest: Duration,
}

/// A task that tries a name every 100 ms until stopped, recording every answer; a grant is
/// kept (never released), so that an overlap with the holder stays visible.
pub struct Contender {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Tries>>,
    task: tokio::task::JoinHandle<()>,
}

impl Contender {
    /// Starts trying `name` through `client`.
    pub fn spawn(client: Arc<dyn DistributedLock>, name: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Tries::default()));
        let task = tokio::spawn({
            let (stop, seen) = (stop.clone(), seen.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let sent = Instant::now();
                    let answer = client.try_lock(name).await;
                    {
                        let mut s = seen.lock().expect("contender log");
                        s.slowest = s.slowest.max(sent.elapsed());
                        match answer {
                            Ok(Some(g)) => {
                                s.grants.push((g.token(), Instant::now()));
                                // Kept: a release would hide the overlap.
                                std::mem::forget(g);
                            }
                            Ok(None) => s.refused += 1,
                            Err(e) => s.errors.push((e.kind(), e.is_temporary(), e.to_string())),
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Self { stop, seen, task }
    }

    /// Asks it to stop: it starts no try after the one under way.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stops it (its current try must end within `limit`) and returns what it saw.
    pub async fn finish(self, limit: Duration) -> Tries {
        self.stop();
        bounded("the contender's loop", limit, self.task)
            .await
            .expect("contender task");
        std::mem::take(&mut *self.seen.lock().expect("contender log"))
    }
}

/// Runs one call against a server that does not answer and checks that it fails with a
/// temporary `Unavailable` of `backend` within `limit`; returns the error and how long the call
/// took. A call still waiting at three times the limit fails the test as hung.
pub async fn fails_in_time<T: std::fmt::Debug>(
    what: &str,
    backend: &str,
    limit: Duration,
    call: impl Future<Output = Result<T>>,
) -> (Error, Duration) {
    let sent = Instant::now();
    let answer = bounded(what, limit * 3, call).await;
    let took = sent.elapsed();
    eprintln!("paused: {what} answered in {} ms: {answer:?}", ms(took));
    let e = match answer {
        Err(e) => e,
        Ok(v) => panic!("{what} answered {v:?} while the server was stopped"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{what}: {e}");
    assert!(e.is_temporary(), "{what}: not temporary: {e}");
    assert_eq!(e.backend(), Some(backend), "{what}: {e}");
    assert!(
        took <= limit,
        "{what} took {} ms, more than the {} ms allowed",
        ms(took),
        ms(limit)
    );
    (e, took)
}
