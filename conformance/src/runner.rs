//! Runs the cases as one test each (libtest-compatible, so `cargo test` and `cargo nextest`
//! list, filter and report them), gated by the backend's capabilities.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use libtest_mimic::{Arguments, Failed, Trial};

use crate::case::{unique_suffix, Case, Ctx, CASE_TIMEOUT, HOLDER_CHILD_ENV, HOLDER_MODE_ENV};
use crate::harness::Harness;

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
            let gate = (case.applies)(&caps, remote)
                .and_then(|()| h.not_applicable(case.name).map_or(Ok(()), Err));
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

fn panic_message(p: Box<dyn Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "case panicked".to_string()
    }
}
