//! The campaign: every applicable scenario × backend cell, some runs each, and the report.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::matrix::{backends, Backend, Scenario, NEGATIVE_CONTROLS, SCENARIOS};
use crate::run::{self, Knobs, RunResult};
use crate::servers;

/// The command line, with every backend and scenario.
pub(crate) fn usage() -> String {
    let backends: Vec<&str> = backends().iter().map(Backend::key).collect();
    let scenarios: Vec<&str> = SCENARIOS.iter().map(|s| s.key()).collect();
    let controls: Vec<&str> = NEGATIVE_CONTROLS.iter().map(|s| s.key()).collect();
    format!(
        "usage: distlock-faults [--quick] [--backend B[,B..]] [--scenario S[,S..]] [--runs N] \
         [--out DIR] [--skip B[,B..]]\n  backends: {}\n  scenarios: {}\n  negative controls \
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
                "--runs" => {
                    let v = value()?;
                    o.runs = v
                        .parse()
                        .ok()
                        .filter(|&n| (1..=1000).contains(&n))
                        .ok_or(format!("--runs takes 1..=1000, not {v:?}"))?;
                }
                "--out" => o.out = PathBuf::from(value()?),
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
        if o.runs == 0 {
            o.runs = if o.quick { 1 } else { 10 };
        }
        Ok(o)
    }
}

/// Set, the histories of clean runs are kept too (to study a run that passed).
const KEEP_ENV: &str = "DISTLOCK_FAULTS_KEEP";

/// One cell of the report.
#[derive(Clone, Debug, Serialize)]
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
    grants_during_faults: usize,
    residue: usize,
    errors: usize,
    wall_s: f64,
    details: Vec<RunResult>,
}

/// Runs the campaign and writes the report; `Ok(false)` if any cell found a violation, residue
/// or a failed run.
pub(crate) async fn run(o: Options) -> Result<bool, String> {
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
    let mut cells = Vec::new();
    let mut clean = true;
    for &scenario in &o.scenarios {
        for backend in &o.backends {
            let mut cell = CellResult {
                scenario: scenario.key(),
                backend: backend.key(),
                status: "ran".into(),
                runs: 0,
                ops: 0,
                grants: 0,
                violations: 0,
                expected_overlaps: 0,
                fenced_off: 0,
                late_writes: 0,
                zombie_writes: 0,
                zombies_fenced: 0,
                reentries: 0,
                reentries_granted: 0,
                proclaims: 0,
                zombie_proclaims: 0,
                zombie_proclaims_refused: 0,
                permits_peak: 0,
                unfenced_lost_updates: 0,
                token_restarts: 0,
                recover_ms: None,
                unrecovered: 0,
                grants_during_faults: 0,
                residue: 0,
                errors: 0,
                wall_s: 0.0,
                details: Vec::new(),
            };
            if let Err(why) = scenario.applies(backend) {
                cell.status = format!("not applicable: {why}");
                eprintln!("{:<15} {:<8} not applicable", scenario.key(), backend.key());
                cells.push(cell);
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
            for i in 0..o.runs {
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
                cell.grants_during_faults += c.grants_during_faults;
                if let Some(ms) = c.recover_ms {
                    cell.recover_ms = Some(cell.recover_ms.map_or(ms, |m: f64| m.max(ms)));
                }
                cell.residue += r.residue.len();
                cell.errors += usize::from(r.error.is_some());
                cell.wall_s += r.wall_s;
                eprintln!(
                    "{:<15} {:<8} run {}: {} grants, {} violations, {} fenced off, {} residue{} \
                     ({:.1} s)",
                    scenario.key(),
                    backend.key(),
                    i + 1,
                    c.grants,
                    c.violations.len(),
                    c.fenced_off,
                    r.residue.len(),
                    r.error
                        .as_ref()
                        .map(|e| format!(", error: {e}"))
                        .unwrap_or_default(),
                    r.wall_s
                );
                for v in &c.violations {
                    eprintln!("VIOLATION {v}");
                }
                for left in &r.residue {
                    eprintln!("RESIDUE {left}");
                }
                if c.grants > 0 || r.error.is_some() {
                    // Histories of clean runs are not kept.
                    if c.violations.is_empty()
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
            if cell.violations > 0
                || cell.residue > 0
                || cell.errors > 0
                || cell.grants == 0
                || cell.unrecovered > 0
                || no_zombie
            {
                clean = false;
            }
            cells.push(cell);
        }
    }
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

fn write_report(o: &Options, cells: &[CellResult], wall: Duration) -> Result<(), String> {
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let json = serde_json::json!({
        "mode": if o.quick { "quick" } else { "full" },
        "runs_per_cell": o.runs,
        "wall_s": wall.as_secs_f64(),
        "cells": cells,
    });
    let path = o.out.join("results.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;

    let mut md = String::new();
    let command =
        std::env::var("DISTLOCK_FAULTS_COMMAND").unwrap_or_else(|_| "scripts/faults".into());
    let _ = writeln!(md, "# Fault campaign report\n");
    let _ = writeln!(
        md,
        "Generated by `{command}` ({} mode, {} run(s) per cell, {} client processes × 3–4 tasks, \
         2 lock names, a semaphore of 2 and an election per run where the backend has them). \
         Total wall time: **{:.0} s**.\n",
        if o.quick { "quick" } else { "full" },
        o.runs,
        3,
        wall.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "Checks: (1) no two grants' believed intervals overlap for a name; (2) tokens of \
         believed grants strictly increase; (3) the read-sleep-write counter is exact; (4) no \
         residue on the server once the leases ran out; (5) safe-until bounded by the history and \
         the server; (6) re-entries; (7) availability; (8) no more than `max` permits believed \
         at once, and no proclaim taken from a deposed leader. *Fenced off* counts writes the token \
         register refused (a stale holder's); *recover* is the longest time from a fault's end \
         to the next grant.\n"
    );
    let _ = writeln!(
        md,
        "| scenario | backend | runs | ops | grants | violations | fenced off | grants during faults | recover (ms) | residue | notes |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for c in cells.iter().filter(|c| c.status == "ran") {
        let mut notes = Vec::new();
        if c.errors > 0 {
            notes.push(format!("{} run(s) failed", c.errors));
        }
        if c.expected_overlaps > 0 {
            notes.push(format!(
                "{} overlap(s) right after an out-of-band delete (expected; fenced)",
                c.expected_overlaps
            ));
        }
        if c.late_writes > 0 {
            notes.push(format!(
                "{} write(s) by a stopped holder landed late",
                c.late_writes
            ));
        }
        if c.unfenced_lost_updates > 0 {
            notes.push(format!(
                "{} counter update(s) lost to a holder that had not yet learned of the fault \
                 (expected: the counter is the unfenced resource)",
                c.unfenced_lost_updates
            ));
        }
        if c.token_restarts > 0 {
            notes.push(format!(
                "{} name(s) whose tokens started again at 1 after the restart without \
                 persistence (expected: volatile fencing; the register refused the new holders' \
                 writes)",
                c.token_restarts
            ));
        }
        if c.unrecovered > 0 {
            notes.push(format!("{} fault(s) never recovered from", c.unrecovered));
        }
        if c.proclaims > 0 {
            notes.push(format!(
                "{} proclaim(s), {} of {} zombie proclaim(s) refused; at most {} permit(s) held",
                c.proclaims, c.zombie_proclaims_refused, c.zombie_proclaims, c.permits_peak
            ));
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.scenario,
            c.backend,
            c.runs,
            c.ops,
            c.grants,
            c.violations,
            c.fenced_off,
            if c.details.iter().any(|r| !r.faults.is_empty()) {
                c.grants_during_faults.to_string()
            } else {
                "–".into()
            },
            c.recover_ms.map_or("–".into(), |m| format!("{m:.0}")),
            c.residue,
            notes.join("; ")
        );
    }
    let _ = writeln!(md, "\n## Scenarios\n");
    for s in SCENARIOS.iter().chain(NEGATIVE_CONTROLS) {
        let _ = writeln!(md, "- `{}`: {}", s.key(), s.what());
    }
    let _ = writeln!(md, "\n## Not applicable\n");
    for c in cells.iter().filter(|c| c.status != "ran") {
        let _ = writeln!(
            md,
            "- `{}` × `{}`: {}",
            c.scenario,
            c.backend,
            c.status.trim_start_matches("not applicable: ")
        );
    }
    let failing: Vec<&CellResult> = cells
        .iter()
        .filter(|c| c.violations > 0 || c.residue > 0 || c.errors > 0)
        .collect();
    if !failing.is_empty() {
        let _ = writeln!(md, "\n## Violations, residue and failed runs\n");
        for c in failing {
            for (i, r) in c.details.iter().enumerate() {
                for v in r.checked.violations.iter().take(3) {
                    let _ = writeln!(
                        md,
                        "`{}` × `{}` run {}:\n```text\n{v}```\n",
                        c.scenario,
                        c.backend,
                        i + 1
                    );
                }
                for left in &r.residue {
                    let _ = writeln!(
                        md,
                        "- `{}` × `{}` run {}: residue: {left}",
                        c.scenario,
                        c.backend,
                        i + 1
                    );
                }
                if let Some(e) = &r.error {
                    let _ = writeln!(
                        md,
                        "- `{}` × `{}` run {}: failed: {e}",
                        c.scenario,
                        c.backend,
                        i + 1
                    );
                }
            }
        }
    }
    // What the campaign found in deliberately broken builds is kept by hand next to the report.
    if let Ok(known) = std::fs::read_to_string(o.out.join("known-defects.md")) {
        let _ = writeln!(md, "\n{}", known.trim_end());
    }
    let path = o.out.join("report.md");
    std::fs::write(&path, md).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!(
        "wrote {} and {}",
        path.display(),
        o.out.join("results.json").display()
    );
    Ok(())
}
