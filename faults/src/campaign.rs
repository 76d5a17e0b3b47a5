//! The campaign: every applicable scenario × backend cell, some runs each, and the report.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::matrix::{backends, Backend, Scenario, NEGATIVE_CONTROLS, SCENARIOS};
use crate::run::{self, Knobs, RunResult};
use crate::servers;

mod report;
use report::write_report;

/// The command line, with every backend and scenario.
pub(crate) fn usage() -> String {
    let backends: Vec<&str> = backends().iter().map(Backend::key).collect();
    let scenarios: Vec<&str> = SCENARIOS.iter().map(|s| s.key()).collect();
    let controls: Vec<&str> = NEGATIVE_CONTROLS.iter().map(|s| s.key()).collect();
    format!(
        "usage: distlock-faults [--quick] [--backend B[,B..]] [--scenario S[,S..]] [--runs N] \
         [--jobs N] [--out DIR] [--skip B[,B..]]\n  --jobs: cells run at once (1 to 4; default \
         1): each faults only private servers of its own\n       distlock-faults --soak DURATION [--backend B[,B..]] \
         [--out DIR] [--skip B[,B..]]\n  --soak: one long run per backend, each for DURATION in \
         turn (90s, 30m, 1h30m; at least 1m), faults every 3-10 s; writes soak.md and soak.json \
         to --out\n  backends: {}\n  scenarios: {}\n  negative controls \
         (run only when named; they must be flagged): {}",
        backends.join(" "),
        scenarios.join(" "),
        controls.join(" ")
    )
}

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    quick: bool,
    backends: Vec<Backend>,
    scenarios: Vec<Scenario>,
    runs: usize,
    out: PathBuf,
    /// Backends DISTLOCK_SKIP left out: printed, and named in the report.
    skipped: Vec<&'static str>,
    /// `--soak DURATION`: a soak of each backend for that long instead of the cells.
    soak: Option<Duration>,
    /// `--jobs N`: how many cells run at once (each faults only servers of its own).
    jobs: usize,
}

impl Options {
    /// Parses the arguments (bad ones are an error before anything runs).
    pub(crate) fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options {
            quick: false,
            backends: backends(),
            scenarios: SCENARIOS.to_vec(),
            runs: 0,
            out: PathBuf::from("faults"),
            skipped: Vec::new(),
            soak: None,
            jobs: 1,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
            match a.as_str() {
                "--quick" => o.quick = true,
                "--backend" => {
                    let v = value()?;
                    o.backends = v
                        .split(',')
                        .map(|k| {
                            backends()
                                .into_iter()
                                .find(|b| b.key() == k)
                                .ok_or(format!("unknown backend {k:?}"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                "--scenario" => {
                    let v = value()?;
                    o.scenarios = v
                        .split(',')
                        .map(|k| Scenario::parse(k).ok_or(format!("unknown scenario {k:?}")))
                        .collect::<Result<_, _>>()?;
                }
                "--runs" => o.runs = count(a, &value()?, 1000)?,
                "--jobs" => o.jobs = count(a, &value()?, 4)?,
                "--out" => o.out = PathBuf::from(value()?),
                "--soak" => o.soak = Some(crate::soak::parse_duration(&value()?)?),
                "--skip" => {
                    // DISTLOCK_SKIP, passed on by scripts/faults: ids of backends left out.
                    let v = value()?;
                    let skip: Vec<&str> = v.split(',').map(str::trim).collect();
                    // A mode goes with its backend (postgres takes postgres-advisory along).
                    let skipped =
                        |b: &Backend| skip.contains(&b.key()) || skip.contains(&b.server_key());
                    o.skipped = o
                        .backends
                        .iter()
                        .filter(|b| skipped(b))
                        .map(|b| b.key())
                        .collect();
                    o.backends.retain(|b| !skipped(b));
                }
                "-h" | "--help" => return Err("help".into()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if o.soak.is_some()
            && args
                .iter()
                .any(|a| matches!(a.as_str(), "--quick" | "--scenario" | "--runs" | "--jobs"))
        {
            return Err("--soak takes no --quick, --scenario, --runs or --jobs".into());
        }
        if o.runs == 0 {
            o.runs = if o.quick { 1 } else { 10 };
        }
        Ok(o)
    }
}

/// `v` as a count of 1 to `max`, or why not (`flag` names the option).
fn count(flag: &str, v: &str, max: usize) -> Result<usize, String> {
    v.parse()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or(format!("{flag} takes 1..={max}, not {v:?}"))
}

/// Set, the histories of clean runs are kept too (to study a run that passed).
const KEEP_ENV: &str = "DISTLOCK_FAULTS_KEEP";

/// One cell of the report.
#[derive(Clone, Debug, Default, Serialize)]
struct CellResult {
    scenario: &'static str,
    backend: &'static str,
    /// `ran`, or `not applicable: <why>`.
    status: String,
    runs: usize,
    ops: usize,
    grants: usize,
    violations: usize,
    expected_overlaps: usize,
    fenced_off: usize,
    late_writes: usize,
    zombie_writes: usize,
    zombies_fenced: usize,
    reentries: usize,
    reentries_granted: usize,
    /// Election proclaims, and the zombie ones among them and how many of those were refused.
    proclaims: usize,
    zombie_proclaims: usize,
    zombie_proclaims_refused: usize,
    /// The most permits of a semaphore name believed held at once, over the cell's runs.
    permits_peak: u32,
    unfenced_lost_updates: u64,
    token_restarts: usize,
    recover_ms: Option<f64>,
    unrecovered: usize,
    unjudged: usize,
    grants_during_faults: usize,
    residue: usize,
    errors: usize,
    wall_s: f64,
    details: Vec<RunResult>,
}

/// Runs the campaign and writes the report; `Ok(false)` if any cell found a violation, residue
/// or a failed run.
pub(crate) async fn run(o: Options) -> Result<bool, String> {
    if let Some(length) = o.soak {
        return crate::soak::run(length, &o.backends, &o.out, &o.skipped).await;
    }
    let started = Instant::now();
    servers::sweep_stale();
    let knobs = Knobs {
        procs: 3,
        // Short runs, many of them: a full campaign of 10 runs per cell fits in about 2 hours
        // on 2 cores.
        base: if o.quick {
            Duration::from_secs(3)
        } else {
            Duration::from_millis(2500)
        },
    };
    let scratch = std::env::temp_dir().join(format!("distlock-faults-{}", std::process::id()));
    // The cells in matrix order, those that run filled in as they finish. With `--jobs N`, N
    // threads take the cells in matrix order, each running one at a time on a runtime of its
    // own: a cell faults only servers and clients of its own, and on the shared servers its
    // names are its own.
    let mut slots: Vec<Option<CellResult>> = Vec::new();
    let mut queue = VecDeque::new();
    for &scenario in &o.scenarios {
        for backend in &o.backends {
            if let Err(why) = scenario.applies(backend) {
                eprintln!("{:<15} {:<8} not applicable", scenario.key(), backend.key());
                slots.push(Some(CellResult {
                    status: format!("not applicable: {why}"),
                    ..CellResult::of(scenario, backend)
                }));
                continue;
            }
            if o.quick && !scenario.quick(backend) {
                eprintln!(
                    "{:<15} {:<8} full campaign only",
                    scenario.key(),
                    backend.key()
                );
                continue;
            }
            queue.push_back((slots.len(), scenario, *backend));
            slots.push(None);
        }
    }
    let queue = Mutex::new(queue);
    let work = || -> Result<Vec<(usize, CellResult, bool)>, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let mut done = Vec::new();
        while let Some((slot, scenario, backend)) =
            queue.lock().ok().and_then(|mut q| q.pop_front())
        {
            let (cell, clean) =
                runtime.block_on(run_cell(scenario, &backend, knobs, o.runs, &scratch))?;
            done.push((slot, cell, clean));
        }
        Ok(done)
    };
    let done = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..o.jobs).map(|_| scope.spawn(work)).collect();
            let mut done = Vec::new();
            for w in workers {
                done.extend(
                    w.join()
                        .map_err(|_| "a cell's thread panicked".to_string())??,
                );
            }
            Ok::<_, String>(done)
        })
    })?;
    let mut clean = true;
    for (slot, cell, ok) in done {
        clean &= ok;
        slots[slot] = Some(cell);
    }
    let cells: Vec<CellResult> = slots.into_iter().flatten().collect();
    let wall = started.elapsed();
    write_report(&o, &cells, wall)?;
    if clean && std::env::var_os(KEEP_ENV).is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    } else {
        eprintln!("histories of failed runs kept under {}", scratch.display());
    }
    eprintln!(
        "fault campaign: {} cells in {:.0} s: {}",
        cells.len(),
        wall.as_secs_f64(),
        if clean { "clean" } else { "FAILED" }
    );
    Ok(clean)
}

/// Runs `runs` runs of one cell; the cell, and whether it is clean (no violation, residue or
/// failed run, some grants, every fault recovered from).
async fn run_cell(
    scenario: Scenario,
    backend: &Backend,
    knobs: Knobs,
    runs: usize,
    scratch: &Path,
) -> Result<(CellResult, bool), String> {
    let mut cell = CellResult::of(scenario, backend);
    for i in 0..runs {
        let dir = scratch.join(format!("{}-{}-{i}", scenario.key(), backend.key()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let r = run::run(backend, scenario, knobs, i, &dir).await;
        let c = &r.checked;
        cell.runs += 1;
        cell.ops += c.ops;
        cell.grants += c.grants;
        cell.violations += c.violations.len();
        cell.expected_overlaps += c.expected_overlaps;
        cell.fenced_off += c.fenced_off;
        cell.late_writes += c.late_writes;
        cell.zombie_writes += c.zombie_writes;
        cell.zombies_fenced += c.zombies_fenced;
        cell.reentries += c.reentries;
        cell.reentries_granted += c.reentries_granted;
        cell.proclaims += c.proclaims;
        cell.zombie_proclaims += c.zombie_proclaims;
        cell.zombie_proclaims_refused += c.zombie_proclaims_refused;
        cell.permits_peak = cell.permits_peak.max(c.permits_peak);
        cell.unfenced_lost_updates += c.unfenced_lost_updates;
        cell.token_restarts += c.token_restarts;
        cell.unrecovered += c.unrecovered;
        cell.unjudged += c.unjudged;
        cell.grants_during_faults += c.grants_during_faults;
        if let Some(ms) = c.recover_ms {
            cell.recover_ms = Some(cell.recover_ms.map_or(ms, |m: f64| m.max(ms)));
        }
        cell.residue += r.residue.len();
        cell.errors += usize::from(r.error.is_some());
        cell.wall_s += r.wall_s;
        let mut said = format!(
            "{:<15} {:<8} run {}: {} grants, {} violations, {} fenced off, {} residue{}{} \
             ({:.1} s)\n",
            scenario.key(),
            backend.key(),
            i + 1,
            c.grants,
            c.violations.len(),
            c.fenced_off,
            r.residue.len(),
            if c.unrecovered > 0 {
                format!(", {} fault(s) never recovered from", c.unrecovered)
            } else {
                String::new()
            },
            r.error
                .as_ref()
                .map(|e| format!(", error: {e}"))
                .unwrap_or_default(),
            r.wall_s
        );
        for v in &c.violations {
            let _ = writeln!(said, "VIOLATION {v}");
        }
        for left in &r.residue {
            let _ = writeln!(said, "RESIDUE {left}");
        }
        // One write, so that cells running at once do not interleave within a run's lines.
        eprint!("{said}");
        if c.grants > 0 || r.error.is_some() {
            // Histories of clean runs are not kept.
            if c.violations.is_empty()
                && c.unrecovered == 0
                && r.error.is_none()
                && std::env::var_os(KEEP_ENV).is_none()
            {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        cell.details.push(r);
    }
    // A fault the system never recovered from is a lock left unavailable; a holder-pause
    // cell that never saw a zombie write did not test fencing against one.
    let no_zombie =
        scenario.key() == "holder-pause" && backend.per_lock() && cell.zombie_writes == 0;
    if no_zombie {
        eprintln!(
            "{:<15} {:<8} FAILED: no zombie write was attempted",
            scenario.key(),
            backend.key()
        );
    }
    let clean = cell.violations == 0
        && cell.residue == 0
        && cell.errors == 0
        && cell.grants > 0
        && cell.unrecovered == 0
        && !no_zombie;
    Ok((cell, clean))
}

impl CellResult {
    /// An empty cell of `scenario` × `backend` that ran.
    fn of(scenario: Scenario, backend: &Backend) -> Self {
        CellResult {
            scenario: scenario.key(),
            backend: backend.key(),
            status: "ran".into(),
            ..CellResult::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &str) -> Result<Options, String> {
        let args: Vec<String> = args.split_whitespace().map(String::from).collect();
        Options::parse(&args)
    }

    #[test]
    fn soak_takes_a_length_and_backends_and_refuses_cell_options() {
        let o = parse("--soak 30m --backend redis,etcd --out /tmp/x").expect("a soak");
        assert_eq!(o.soak, Some(Duration::from_secs(1800)));
        let keys: Vec<&str> = o.backends.iter().map(Backend::key).collect();
        assert_eq!(keys, ["redis", "etcd"]);
        assert_eq!(
            parse("--soak 90s").expect("a soak").soak,
            Some(Duration::from_secs(90))
        );
        for bad in [
            "--soak",
            "--soak 30",
            "--soak 10s",
            "--soak half-an-hour",
            "--soak 30m --runs 3",
            "--soak 30m --scenario holder-kill",
            "--soak 30m --quick",
            "--soak 30m --backend nosuch",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse("--quick").expect("cells").soak, None);
    }

    #[test]
    fn jobs_is_one_unless_asked_and_bounded() {
        assert_eq!(parse("--quick").expect("cells").jobs, 1);
        assert_eq!(parse("--quick --jobs 2").expect("cells").jobs, 2);
        for bad in [
            "--jobs",
            "--jobs 0",
            "--jobs 5",
            "--jobs two",
            "--soak 30m --jobs 2",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
