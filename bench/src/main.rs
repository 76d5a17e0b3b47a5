//! `distlock-bench`: the benchmark report. It runs the same scenarios against every backend
//! whose server answers — uncontended cycles next to the raw-driver floor, independent locks,
//! one hot lock, wake-up, many held locks — plus a peer crate (`rslock`) on the same Redis and,
//! for RedLock, the cycle with one of three private masters paused; then the libraries a user
//! would pick instead (rslock, redis-py, python-redis-lock, Curator, etcd's Go mutex) on the
//! same servers; and writes `report.md`, a self-contained `report.html` with SVG charts, and
//! `results.json`.
//!
//! ```text
//! distlock-bench [--quick] [--out DIR] [--only memory,redis,...]
//! ```
//!
//! `scripts/bench` starts the servers and runs this in release mode; `scripts/test` runs
//! `--quick` in debug mode so the report generator cannot rot. A backend whose server does not
//! answer is reported as unavailable, with how to start it, and the report is written for the
//! rest.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod cli;
mod contention;
mod counting;
mod format;
mod libraries;
mod machine;
mod peer;
mod plan;
mod progress;
mod readme;
mod report;
mod results;
mod scenarios;
mod stats;
mod svg;
mod targets;

use std::process::ExitCode;
use std::time::Instant;

use crate::cli::Cli;
use crate::plan::Plan;
use crate::progress::Progress;
use crate::results::{BackendResult, Meta, Results, Status};
use crate::targets::Kind;

/// Errors of the benchmark itself: a driver's, a backend's, or a message.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A result with [`BoxError`].
pub(crate) type Res<T> = Result<T, BoxError>;

fn main() -> ExitCode {
    let cli = match Cli::parse(std::env::args().skip(1)) {
        Ok(Some(cli)) => cli,
        Ok(None) => {
            print!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("distlock-bench: {e}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock-bench: cannot start the Tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // On a worker thread, like an application's tasks: a future polled by `block_on` itself
    // sits on a thread without the I/O driver, and every wake-up would cross threads — a cost
    // the floor would pay and the backends' own spawned tasks would not.
    match runtime.block_on(async { tokio::spawn(run(cli)).await }) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("distlock-bench: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("distlock-bench: the run panicked: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Res<()> {
    let started = Instant::now();
    let plan = if cli.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    let meta = Meta::collect(&cli, &plan);
    let steps: usize = cli.kinds.iter().map(|&k| Plan::steps(k)).sum();
    let progress =
        Progress::new(steps + cli.peer as usize + cli.libraries.len() * libraries::STEPS);

    let mut backends = Vec::new();
    for &kind in &cli.kinds {
        backends.push(run_backend(kind, &plan, &progress).await);
    }
    let mut peers = Vec::new();
    if cli.peer {
        progress.stage("rslock", "peer cycle");
        peers = peer::run(&plan, &progress, cli.kinds.contains(&Kind::Redlock)).await;
        progress.step();
    }
    let libraries = libraries::run(&cli.libraries, &plan, &progress, &backends).await;
    progress.finish();

    let results = Results {
        meta: meta.finish(started.elapsed()),
        backends,
        peers,
        libraries,
    };
    report::write(&cli.out, &results)?;
    eprintln!(
        "distlock-bench: wrote {}/report.md, report.html and results.json in {:.0?}",
        cli.out.display(),
        started.elapsed()
    );
    for line in report::summary_lines(&results) {
        eprintln!("  {line}");
    }
    // The report is written either way; a scenario that failed on a server that answered is a
    // bug (here or in the backend), and the test command must notice it.
    let failed: usize = results.backends.iter().map(|b| b.errors.len()).sum();
    if failed > 0 {
        return Err(format!("{failed} scenario(s) failed; the report lists them").into());
    }
    let violations: u64 = results
        .backends
        .iter()
        .flat_map(|b| &b.hot)
        .map(|h| h.exclusion_violations)
        .sum();
    if violations > 0 {
        return Err(
            format!("mutual exclusion violated {violations} time(s); see the report").into(),
        );
    }
    Ok(())
}

/// Connects to one backend and runs every scenario on it; a scenario that fails records its
/// error and the rest still run.
async fn run_backend(kind: Kind, plan: &Plan, progress: &Progress) -> BackendResult {
    progress.stage(kind.id(), "connecting");
    let started = Instant::now();
    let mut result = BackendResult::new(kind);
    let target = match targets::open(kind).await {
        Ok(t) => t,
        Err(e) => {
            result.status = Status::Unavailable {
                error: e.to_string(),
                how_to_start: kind.how_to_start(),
            };
            progress.note(&format!("{}: unavailable ({e})", kind.id()));
            progress.skip(Plan::steps(kind));
            return result;
        }
    };
    result.status = Status::Available {
        server: target
            .server_version()
            .await
            .unwrap_or_else(|e| format!("unknown ({e})")),
        url: target.url(),
    };
    scenarios::run_all(&*target, plan, progress, &mut result).await;
    if let Err(e) = target.cleanup().await {
        progress.note(&format!("{}: cleanup failed: {e}", kind.id()));
    }
    result.took_s = started.elapsed().as_secs_f64();
    progress.note(&report::backend_line(&result));
    result
}
