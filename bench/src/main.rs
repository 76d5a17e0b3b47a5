//! `distlock-bench`: the benchmark report. It runs the same scenarios against every backend
//! whose server answers — uncontended cycles next to the raw-driver floor, independent locks,
//! one hot lock, wake-up, many held locks — plus a peer crate (`rslock`) on the same Redis and,
//! for RedLock, the cycle with one of three private masters paused; then the libraries a user
//! would pick instead (rslock, redis-py, python-redis-lock, Curator, etcd's Go mutex) on the
//! same servers; then semaphores (the permit cycle, a contended semaphore) and leader failover
//! after a SIGKILL, next to Curator's, etcd's and redis-semaphore's; and writes `report.md`, a self-contained `report.html` with SVG charts, and
//! `results.json`.
//!
//! ```text
//! distlock-bench [--quick] [--out DIR] [--only memory,redis,...]
//! distlock-bench --render-from results.json [--out DIR]
//! ```
//!
//! `scripts/bench` starts the servers and runs this in release mode; `scripts/test` runs
//! `--quick` in debug mode so the report generator cannot rot. A backend whose server does not
//! answer is reported as unavailable, with how to start it, and the report is written for the
//! rest.
//!
//! The crate is shaped model → run → render: [`model`] holds the results' data types,
//! [`run`](mod@run) fills them, [`render`] reads them only (its prose in
//! `render/report.md.tmpl`, its goals in `render/goals.toml`), and this file ties the two
//! together.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod cli;
mod error;
mod model;
mod render;
mod run;

use std::process::ExitCode;
use std::time::Instant;

use crate::cli::Cli;
use crate::error::Res;
use crate::model::Results;

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
    if let Some(words) = &cli.lead {
        return run::prims::lead(words).await;
    }
    if let Some(file) = &cli.render_from {
        let json = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let results: Results = serde_json::from_str(&json)?;
        return render::write(&cli.out, &results);
    }
    let started = Instant::now();
    let selection = run::Selection {
        quick: cli.quick,
        kinds: &cli.kinds,
        peer: cli.peer,
        libraries: &cli.libraries,
        args: &cli.args,
        sections: cli.sections,
    };
    let lines = run::Lines {
        backend: render::backend_line,
        library: render::library_line,
    };
    let results = run::all(&selection, &lines).await;
    render::write(&cli.out, &results)?;
    eprintln!(
        "distlock-bench: wrote {}/report.md, report.html and results.json in {:.0?}",
        cli.out.display(),
        started.elapsed()
    );
    for line in render::summary_lines(&results) {
        eprintln!("  {line}");
    }
    // The report is written either way; a scenario that failed on a server that answered is a
    // bug (here or in the backend), and the test command must notice it.
    let failed: usize = results.backends.iter().map(|b| b.errors.len()).sum();
    if failed > 0 {
        return Err(format!("{failed} scenario(s) failed; the report lists them").into());
    }
    let prims = results.primitives.as_ref();
    let failed: usize = prims.map_or(0, |p| {
        let rows = p.permits.iter().map(|r| &r.who);
        rows.chain(p.failover.iter().map(|r| &r.who))
            .filter(|w| w.against.is_none())
            .map(|w| w.errors.len())
            .sum()
    });
    if failed > 0 {
        return Err(format!("{failed} semaphore or failover measurement(s) failed").into());
    }
    let permit_violations = prims
        .into_iter()
        .flat_map(|p| &p.permits)
        .filter_map(|r| r.contended.as_ref());
    let violations: u64 = results
        .backends
        .iter()
        .flat_map(|b| &b.hot)
        .chain(permit_violations)
        .map(|h| h.exclusion_violations)
        .sum();
    if violations > 0 {
        return Err(
            format!("mutual exclusion violated {violations} time(s); see the report").into(),
        );
    }
    Ok(())
}
