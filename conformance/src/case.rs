//! What a case is and what it gets: [`Case`], [`Ctx`], and the few constants cases and the
//! runner share.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{Capabilities, DistributedLock, ErrorKind};

use crate::harness::Harness;

/// The longest one case may run before it fails.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// A case's body.
pub type CaseFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One promise, checked by one async function.
pub struct Case {
    /// The test's name: the promise it checks.
    pub name: &'static str,
    /// `Err(reason)` where the backend's capabilities say the promise does not apply.
    pub applies: fn(&Capabilities, remote: bool) -> Result<(), &'static str>,
    /// The check; it panics (via `assert!`) when the promise is broken.
    pub run: fn(Ctx) -> CaseFuture,
}

/// What a case gets: the harness and a prefix that makes its lock names unique to this run.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) harness: Arc<dyn Harness>,
    pub(crate) prefix: String,
    /// What the case asked to keep until its leftovers are checked.
    pub(crate) kept: Arc<std::sync::Mutex<Vec<Box<dyn std::any::Any + Send>>>>,
}

impl Ctx {
    /// The harness.
    pub fn harness(&self) -> &dyn Harness {
        &*self.harness
    }

    /// Keeps `thing` alive until the case's leftovers have been checked: a proxy that work the
    /// case leaves to the background (a release sent again, a hold given back) still needs.
    pub fn keep_until_checked(&self, thing: impl std::any::Any + Send) {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Box::new(thing));
    }

    /// Waits until the server holds nothing of this case's names ([`Harness::leftovers`]), for
    /// work the case left to the background that may first wait out a request's timeout (a
    /// release sent again, a hold given back); panics with what is left after `within`.
    pub async fn until_nothing_is_left(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = self
                .harness
                .leftovers(&self.prefix)
                .await
                .unwrap_or_else(|e| panic!("leftover check failed: {e}"));
            if left.is_empty() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "still on the server after {within:?}: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A lock name unique to this case and run.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// The prefix of every name this case uses.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A new client; a server that cannot be reached fails the case with how to start it.
    pub async fn client(&self) -> Arc<dyn DistributedLock> {
        match self.harness.client().await {
            Ok(c) => c,
            Err(e) => panic!("{}", unreachable_message(&*self.harness, &e)),
        }
    }
}

pub(crate) fn unreachable_message(h: &dyn Harness, e: &distlock_api::Error) -> String {
    let b = h.backend();
    if e.kind() == ErrorKind::Unavailable {
        format!(
            "the {b} server cannot be reached: {e}\n  start it: {}\n  or skip this backend: DISTLOCK_SKIP={b}",
            h.start_hint()
        )
    } else {
        format!("could not create a {b} client: {e}")
    }
}

/// Set on a child process of the suite's own test binary that acquires the named lock, says
/// so on stdout, and holds it until it is killed: a holder that dies without releasing.
pub(crate) const HOLDER_CHILD_ENV: &str = "DISTLOCK_CONFORMANCE_HOLDER";
/// With [`HOLDER_CHILD_ENV`]: set to `check`, the child also waits for a `CHECK` line on stdin
/// (sent after it was paused and resumed), then reports whether its guard says lost and what
/// its release answered: `AFTER lost=<bool> release=<ok:bool|err:Kind>`.
pub(crate) const HOLDER_MODE_ENV: &str = "DISTLOCK_CONFORMANCE_HOLDER_MODE";

/// A random 32-bit value for names unique to one run (no RNG dependency: a fresh `RandomState`
/// is randomly keyed per process and mixed with the clock).
pub fn unique_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() as u32
}
