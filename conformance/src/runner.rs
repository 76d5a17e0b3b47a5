//! Runs the cases as one test each (libtest-compatible, so `cargo test` and `cargo nextest`
//! list, filter and report them), gated by the backend's capabilities.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{Capabilities, DistributedLock, ErrorKind};
use futures::FutureExt;
use libtest_mimic::{Arguments, Failed, Trial};

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
    harness: Arc<dyn Harness>,
    prefix: String,
    /// What the case asked to keep until its leftovers are checked.
    kept: Arc<std::sync::Mutex<Vec<Box<dyn std::any::Any + Send>>>>,
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

fn unreachable_message(h: &dyn Harness, e: &distlock_api::Error) -> String {
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

/// Whether `DISTLOCK_SKIP` (comma-separated) names `backend`.
pub fn skipped_by_env(backend: &str) -> bool {
    std::env::var("DISTLOCK_SKIP")
        .map(|v| v.split(',').any(|s| s.trim() == backend))
        .unwrap_or(false)
}

/// Runs every case against `harness`, as the `main` of a `harness = false` test target:
///
/// ```toml
/// [[test]]
/// name = "conformance"
/// harness = false
/// ```
/// ```ignore
/// fn main() -> std::process::ExitCode {
///     distlock_conformance::run(my_backend::TestHarness::from_env())
/// }
/// ```
pub fn run<H: Harness>(harness: H) -> ExitCode {
    let h: Arc<dyn Harness> = Arc::new(harness);
    if let Ok(name) = std::env::var(HOLDER_CHILD_ENV) {
        return holder_child(h, &name);
    }
    let args = Arguments::from_args();
    let backend = h.backend();
    let caps = h.capabilities();
    let remote = !matches!(backend, "memory");
    let skip = skipped_by_env(backend);
    let listing = args.list;
    if skip && !listing {
        eprintln!(
            "distlock-conformance: SKIPPING every {backend} case: DISTLOCK_SKIP names {backend}"
        );
    }
    let trials = crate::cases::CASES
        .iter()
        .map(|case| {
            let gate = (case.applies)(&caps, remote);
            if let (Err(reason), false, false) = (gate, skip, listing) {
                eprintln!(
                    "distlock-conformance: {backend}: {} does not apply: {reason}",
                    case.name
                );
            }
            let h = h.clone();
            let not_applicable = gate.err();
            Trial::test(case.name, move || {
                if let Some(reason) = not_applicable {
                    return Err(format!("not applicable to this backend: {reason}").into());
                }
                run_case(h, case)
            })
            .with_kind(backend)
            .with_ignored_flag(skip || gate.is_err())
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Set on a child process of the suite's own test binary that acquires the named lock, says
/// so on stdout, and holds it until it is killed: a holder that dies without releasing.
pub(crate) const HOLDER_CHILD_ENV: &str = "DISTLOCK_CONFORMANCE_HOLDER";
/// With [`HOLDER_CHILD_ENV`]: set to `check`, the child also waits for a `CHECK` line on stdin
/// (sent after it was paused and resumed), then reports whether its guard says lost and what
/// its release answered: `AFTER lost=<bool> release=<ok:bool|err:Kind>`.
pub(crate) const HOLDER_MODE_ENV: &str = "DISTLOCK_CONFORMANCE_HOLDER_MODE";

fn holder_child(h: Arc<dyn Harness>, name: &str) -> ExitCode {
    use distlock_api::LockExt;
    use std::io::Write;
    let Ok(rt) = tokio::runtime::Runtime::new() else {
        return ExitCode::FAILURE;
    };
    rt.block_on(async {
        let client = match h.client().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("holder child: {e}");
                return ExitCode::FAILURE;
            }
        };
        let guard = match client.lock(name, Duration::from_secs(20)).await {
            Ok(g) => g,
            Err(e) => {
                eprintln!("holder child: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("HELD {}", guard.token().0);
        let _ = std::io::stdout().flush();
        if std::env::var(HOLDER_MODE_ENV).as_deref() == Ok("check") {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            // Bounded, in case the parent dies before asking.
            let asked = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
            if !matches!(asked, Ok(Ok(Some(ref l))) if l.trim() == "CHECK") {
                eprintln!("holder child: no CHECK from the parent: {asked:?}");
                return ExitCode::FAILURE;
            }
            let lost = guard.is_lost();
            let released = match guard.release().await {
                Ok(held) => format!("ok:{held}"),
                Err(e) => format!("err:{:?}", e.kind()),
            };
            println!("AFTER lost={lost} release={released}");
            let _ = std::io::stdout().flush();
            return ExitCode::SUCCESS;
        }
        // Bounded, in case the parent dies before killing us.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(guard);
        ExitCode::SUCCESS
    })
}

fn run_case(h: Arc<dyn Harness>, case: &'static Case) -> Result<(), Failed> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build a Tokio runtime: {e}"))?;
    let prefix = format!("dlc-{}-{:08x}-", short(case.name), unique_suffix());
    let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ctx = Ctx {
        harness: h.clone(),
        prefix: prefix.clone(),
        kept: kept.clone(),
    };
    let result = rt.block_on(async move {
        let body = AssertUnwindSafe((case.run)(ctx)).catch_unwind();
        let outcome = match tokio::time::timeout(CASE_TIMEOUT, body).await {
            Err(_) => Err(format!("case did not finish within {CASE_TIMEOUT:?}")),
            Ok(Err(panic)) => Err(panic_message(panic)),
            Ok(Ok(())) => check_leftovers(&*h, &prefix).await,
        };
        drop(kept);
        outcome
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    result.map_err(Failed::from)
}

/// Guards dropped at the end of a case release in the background, so leftovers get a moment.
async fn check_leftovers(h: &dyn Harness, prefix: &str) -> Result<(), String> {
    let mut last = Vec::new();
    for _ in 0..40 {
        match h.leftovers(prefix).await {
            Ok(left) if left.is_empty() => return Ok(()),
            Ok(left) => last = left,
            Err(e) => return Err(format!("leftover check failed: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "the case left state behind on the server: {last:?}"
    ))
}

fn short(name: &str) -> String {
    name.split('_').filter_map(|w| w.chars().next()).collect()
}

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

fn panic_message(p: Box<dyn Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "case panicked".to_string()
    }
}
