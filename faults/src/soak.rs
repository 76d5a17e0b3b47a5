//! The soak (`--soak DURATION`): one long run per backend, each on its private servers for the
//! whole DURATION in turn: 8 to 16 lock names, 5 to 10 client processes of 4 to 8 tasks (the
//! campaign's workload, one process also dropping acquire futures and one extending fixed
//! leases), a fault every 3 to 10 s drawn from the campaign's faults that apply to the backend
//! (sometimes one on the clients and one on the server at once), and the campaign's checker
//! over the whole history. The report (`soak.md`, `soak.json` in the output directory) adds
//! phase coverage: how many faults landed within 50 ms of an expiry, a renewal, a release or a
//! hand-over.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::checker::Expect;
use crate::clock;
use crate::matrix::{Backend, Scenario, Topology, SCENARIOS};
use crate::run::{self, Nemesis, Plan, RunResult, Shape};

/// The shortest soak: a lead, a few faults and the tail in which no fault starts.
const SHORTEST: Duration = Duration::from_secs(60);

/// Parses a soak's length: a whole number of seconds, minutes or hours (`90s`, `30m`, `1h`),
/// or several of them in a row (`1h30m`); at least a minute, at most a day.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!("--soak takes a length such as 90s, 30m, 1h or 1h30m (at least 1m), not {text:?}")
    };
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.chars() {
        match c {
            '0'..='9' => digits.push(c),
            's' | 'm' | 'h' if !digits.is_empty() => {
                let n: u64 = digits.parse().map_err(|_| bad())?;
                let unit = match c {
                    's' => 1,
                    'm' => 60,
                    _ => 3600,
                };
                total = n
                    .checked_mul(unit)
                    .and_then(|s| total.checked_add(s))
                    .ok_or_else(bad)?;
                digits.clear();
            }
            _ => return Err(bad()),
        }
    }
    let d = Duration::from_secs(total);
    if !digits.is_empty() || d < SHORTEST || d > Duration::from_secs(86_400) {
        return Err(bad());
    }
    Ok(d)
}

/// The private deployment a soak of `backend` runs on, as the scenario that starts it: one
/// server, RedLock's five masters, a 3-member cluster, Redis through Sentinel or a Redis
/// Cluster; or why there is no soak of it.
fn setup(backend: &Backend) -> Result<Scenario, &'static str> {
    match backend.key() {
        "memory" => Err("in-process only: client processes cannot share an in-memory store"),
        _ => match backend.topology() {
            Some(Topology::Sentinel) => Ok(Scenario::SentinelFailover),
            Some(Topology::Cluster) => Ok(Scenario::ClusterFailover),
            None => Ok(single(backend)),
        },
    }
}

/// The deployment of a backend without a topology of Redis servers.
fn single(backend: &Backend) -> Scenario {
    match backend.key() {
        "redlock" => Scenario::MastersRestart,
        "etcd" | "zk" => Scenario::LeaderKill,
        _ => Scenario::ServerPause,
    }
}

/// Whether `s`'s fault can be played, again and again, on `setup`'s deployment: faults on the
/// clients, and faults on the server that need no other kind of deployment (no restart without
/// persistence, no clock under libfaketime) and no client pinned to one member from the start
/// (the follower or leader rows: the leader moves during a soak). A Sentinel or Cluster
/// topology's faults find the member they fault each time (after a failover, another).
fn soakable(s: Scenario, setup: Scenario) -> bool {
    match s {
        Scenario::Baseline
        | Scenario::SharedHandle
        | Scenario::CancelStorm
        | Scenario::LeaseShrink
        | Scenario::ServerRestartVolatile
        | Scenario::MastersRestartVolatile
        | Scenario::FollowerKill
        | Scenario::MemberCut
        | Scenario::LeaderCut
        | Scenario::Timing(_) => false,
        s if s.topology() != setup.topology() => false,
        s => s.members() == 0 || s.members() == setup.members(),
    }
}

impl Plan {
    /// The faults that apply to `backend` and can be played on its soak's deployment.
    fn of(backend: &Backend) -> Result<(Scenario, Plan), &'static str> {
        let setup = setup(backend)?;
        let pool: Vec<Scenario> = SCENARIOS
            .iter()
            .copied()
            .filter(|&s| s.applies(backend).is_ok() && soakable(s, setup))
            .collect();
        if pool.is_empty() {
            // Redis through Sentinel without sync_replicas: the failover rows are its only
            // faults, and without waiting for a replica they can hand a name out again.
            return Err(
                "no fault applies: its only faults are failovers, which without \
                 sync_replicas can hand a name out again (the campaign's negative controls)",
            );
        }
        Ok((
            setup,
            Plan {
                pool,
                drawn: Mutex::default(),
            },
        ))
    }
}

/// One backend's soak, for the report.
#[derive(Debug, Serialize)]
struct SoakResult {
    backend: &'static str,
    /// `ran`, or `not soaked: <why>`.
    status: String,
    names: usize,
    procs: usize,
    tasks: u32,
    /// The faults the nemesis drew from, and how often it drew each.
    pool: Vec<&'static str>,
    drawn: BTreeMap<&'static str, usize>,
    /// The peak resident memory of the runner after the check, in MiB (the checker holds the
    /// whole history): the process's peak so far, so a soak after a larger one shows that one's.
    peak_rss_mib: Option<f64>,
    run: Option<RunResult>,
}

/// Soaks each of `backends` for `length`, in turn, and writes `soak.md` and `soak.json` to
/// `out`; `Ok(false)` if any soak found a violation, residue or failed.
pub(crate) async fn run(
    length: Duration,
    backends: &[Backend],
    out: &Path,
    skipped: &[&str],
) -> Result<bool, String> {
    let started = Instant::now();
    crate::servers::sweep_stale();
    let scratch = std::env::temp_dir().join(format!("distlock-faults-soak-{}", std::process::id()));
    let mut results = Vec::new();
    let mut clean = true;
    for (i, backend) in backends.iter().enumerate() {
        let (setup, plan) = match Plan::of(backend) {
            Ok(p) => p,
            Err(why) => {
                eprintln!("soak {:<8} not soaked: {why}", backend.key());
                results.push(SoakResult {
                    backend: backend.key(),
                    status: format!("not soaked: {why}"),
                    names: 0,
                    procs: 0,
                    tasks: 0,
                    pool: Vec::new(),
                    drawn: BTreeMap::new(),
                    peak_rss_mib: None,
                    run: None,
                });
                continue;
            }
        };
        let ttl = backend.ttl();
        let tasks = fastrand::u32(4..=8);
        let shape = Shape {
            setup,
            nemesis: Nemesis::Soak(&plan),
            names: fastrand::usize(8..=16),
            procs: fastrand::usize(5..=10),
            tasks,
            shared: tasks / 2,
            lead: Duration::from_secs(3),
            run_for: length,
            proxied: plan.pool.iter().any(|s| s.proxied()),
            hold_ms: ttl.as_millis() as u64,
            cancel_storm: |p| p % 5 == 1,
            lease_shrink: |p| p % 5 == 2,
            expect: Expect {
                oob_delete: plan.pool.contains(&Scenario::OobDelete),
                allowance_ns: clock::nanos(ttl + Duration::from_millis(300)),
                server_lease_ns: clock::nanos(ttl),
                client_pause: plan.pool.contains(&Scenario::HolderPause),
                volatile_restart: false,
            },
        };
        let (names, procs) = (shape.names, shape.procs);
        eprintln!(
            "soak {:<8} {} s: {names} names, {procs} processes × {tasks} tasks, faults from: {}",
            backend.key(),
            length.as_secs(),
            plan.pool
                .iter()
                .map(|s| s.key())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let dir = scratch.join(format!("{}-{i}", backend.key()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let r = run::run_shape(backend, shape, i, &dir).await;
        let c = &r.checked;
        eprintln!(
            "soak {:<8} {} grants, {} violations, {} fenced off, {} residue, {} unrecovered; \
             checked {} records in {:.2} s{}",
            backend.key(),
            c.grants,
            c.violations.len(),
            c.fenced_off,
            r.residue.len(),
            c.unrecovered,
            r.history_recs,
            r.check_s,
            r.error
                .as_ref()
                .map(|e| format!("; error: {e}"))
                .unwrap_or_default()
        );
        for v in &c.violations {
            eprintln!("VIOLATION {v}");
        }
        let failed = !c.violations.is_empty()
            || !r.residue.is_empty()
            || r.error.is_some()
            || c.grants == 0
            || c.unrecovered > 0;
        if failed {
            clean = false;
        } else if std::env::var_os("DISTLOCK_FAULTS_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        results.push(SoakResult {
            backend: backend.key(),
            status: "ran".into(),
            names,
            procs,
            tasks,
            pool: plan.pool.iter().map(|s| s.key()).collect(),
            drawn: plan.drawn.lock().expect("drawn").clone(),
            peak_rss_mib: peak_rss_mib(),
            run: Some(r),
        });
    }
    write_report(length, &results, skipped, started.elapsed(), out)?;
    let keep = std::env::var_os("DISTLOCK_FAULTS_KEEP").is_some();
    if clean && !keep {
        let _ = std::fs::remove_dir_all(&scratch);
    } else {
        eprintln!("histories kept under {}", scratch.display());
    }
    Ok(clean)
}

/// This process's peak resident memory (VmHWM), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn write_report(
    length: Duration,
    results: &[SoakResult],
    skipped: &[&str],
    wall: Duration,
    out: &Path,
) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let command = std::env::var("DISTLOCK_FAULTS_COMMAND")
        .unwrap_or_else(|_| format!("scripts/faults --soak {}s", length.as_secs()));
    let json = serde_json::json!({
        "command": command,
        "length_s": length.as_secs(),
        "wall_s": wall.as_secs_f64(),
        "skipped": skipped,
        "within_ms": run::WITHIN_NS / 1_000_000,
        "soaks": results,
    });
    let path = out.join("soak.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;

    let commit = std::env::var("DISTLOCK_FAULTS_COMMIT").unwrap_or_else(|_| "unknown".into());
    let mut md = String::new();
    let _ = writeln!(md, "# Soak report\n");
    let _ = writeln!(
        md,
        "Generated by `{command}` on commit {commit}: each backend soaked for {} s in turn, on private servers; \
         total wall time {:.0} s. A *fault* is one drawn from the pool (two at once count \
         twice); an *action* is each injection and undo the nemesis made. Phase coverage counts \
         the actions within {} ms of an event of the history (watchdog renewals placed every \
         TTL/3 after the grant: the history does not record them).\n",
        length.as_secs(),
        wall.as_secs_f64(),
        run::WITHIN_NS / 1_000_000
    );
    let _ = writeln!(
        md,
        "With holder pauses or out-of-band deletions in the pool, a lost update of the unfenced \
         counter is counted (*excused*), not called a violation, over the whole history, as in \
         those scenarios' cells: only the fencing token protects against either.\n"
    );
    if !skipped.is_empty() {
        let _ = writeln!(md, "Left out by DISTLOCK_SKIP: {}.\n", skipped.join(", "));
    }
    let _ = writeln!(
        md,
        "| backend | names | processes × tasks | faults (two at once) | grants | violations | \
         fenced off | zombie writes (fenced) | excused lost counter updates | unrecovered | worst recovery (ms) | residue | \
         records | check (s) | peak RSS so far (MiB) |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for s in results {
        let Some(r) = &s.run else { continue };
        let c = &r.checked;
        let faults: usize = s
            .drawn
            .iter()
            .filter(|(k, _)| !k.starts_with('('))
            .map(|(_, n)| n)
            .sum();
        let pairs = s.drawn.get("(two at once)").copied().unwrap_or(0);
        let _ = writeln!(
            md,
            "| {} | {} | {} × {} | {faults} ({pairs}) | {} | {} | {} | {} ({}) | {} | {} | {} | {} | \
             {} | {:.2} | {} |",
            s.backend,
            s.names,
            s.procs,
            s.tasks,
            c.grants,
            c.violations.len(),
            c.fenced_off,
            c.zombie_writes,
            c.zombies_fenced,
            c.unfenced_lost_updates,
            c.unrecovered,
            c.recover_ms.map_or("–".into(), |m| format!("{m:.0}")),
            r.residue.len(),
            r.history_recs,
            r.check_s,
            s.peak_rss_mib.map_or("–".into(), |m| format!("{m:.0}")),
        );
    }
    let _ = writeln!(md, "\n## Phase coverage\n");
    let _ = writeln!(
        md,
        "Actions within {} ms of each kind of event, and how many such events the history holds.\n",
        run::WITHIN_NS / 1_000_000
    );
    let _ = writeln!(
        md,
        "| backend | actions | near an expiry | near a renewal | near a release | near a \
         hand-over | near any | expiries | renewals | releases | hand-overs |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for s in results {
        let Some(p) = s.run.as_ref().and_then(|r| r.phases.as_ref()) else {
            continue;
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.backend,
            p.actions,
            p.near_expiry,
            p.near_renewal,
            p.near_release,
            p.near_handover,
            p.near_any,
            p.expiries,
            p.renewals,
            p.releases,
            p.handovers
        );
    }
    let _ = writeln!(md, "\n## Faults drawn\n");
    for s in results.iter().filter(|s| s.run.is_some()) {
        let drawn: Vec<String> = s.drawn.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(md, "- `{}`: {}", s.backend, drawn.join(", "));
    }
    let problems: Vec<&SoakResult> = results
        .iter()
        .filter(|s| {
            s.run.as_ref().is_some_and(|r| {
                !r.checked.violations.is_empty() || !r.residue.is_empty() || r.error.is_some()
            })
        })
        .collect();
    if !problems.is_empty() {
        let _ = writeln!(md, "\n## Violations, residue and errors\n");
        for s in problems {
            let r = s.run.as_ref().expect("ran");
            for v in r.checked.violations.iter().take(5) {
                let _ = writeln!(md, "`{}`:\n```text\n{v}```\n", s.backend);
            }
            for left in &r.residue {
                let _ = writeln!(md, "- `{}`: residue: {left}", s.backend);
            }
            if let Some(e) = &r.error {
                let _ = writeln!(md, "- `{}`: failed: {e}", s.backend);
            }
        }
    }
    let not: Vec<&SoakResult> = results.iter().filter(|s| s.run.is_none()).collect();
    if !not.is_empty() {
        let _ = writeln!(md, "\n## Not soaked\n");
        for s in not {
            let why = s.status.trim_start_matches("not soaked: ");
            let _ = writeln!(md, "- `{}`: {why}", s.backend);
        }
    }
    let path = out.join("soak.md");
    std::fs::write(&path, md).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!(
        "wrote {} and {}",
        path.display(),
        out.join("soak.json").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::backends;

    #[test]
    fn soak_lengths_parse_in_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in [
            "",
            "30",
            "m",
            "30x",
            "-1m",
            "1.5m",
            "30s ",
            "59s",
            "0m",
            "25h",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_soaked_backend_draws_only_faults_that_apply_and_fit_its_deployment() {
        for b in backends() {
            let Ok((setup, plan)) = Plan::of(&b) else {
                assert!(matches!(b.key(), "memory" | "redis-sentinel"), "{b:?}");
                continue;
            };
            assert!(!plan.pool.is_empty(), "{b:?}");
            for s in &plan.pool {
                assert!(s.applies(&b).is_ok(), "{b:?} {s:?}");
                assert!(
                    s.members() == 0 || s.members() == setup.members(),
                    "{b:?} {s:?}"
                );
            }
        }
        let redis = backends()
            .into_iter()
            .find(|b| b.key() == "redis")
            .expect("redis");
        let keys: Vec<&str> = Plan::of(&redis)
            .expect("a plan")
            .1
            .pool
            .iter()
            .map(|s| s.key())
            .collect();
        assert!(
            keys.contains(&"holder-kill") && keys.contains(&"server-restart"),
            "{keys:?}"
        );
        assert!(!keys.contains(&"server-restart-volatile"), "{keys:?}");
        // Redis through Sentinel or on a Cluster: its topology's own faults, those that are
        // safe with its mode (a failover needs sync_replicas).
        let pool = |key: &str| {
            let b = backends().into_iter().find(|b| b.key() == key).expect(key);
            let keys: Vec<&str> = Plan::of(&b)
                .expect(key)
                .1
                .pool
                .iter()
                .map(|s| s.key())
                .collect();
            keys
        };
        assert_eq!(
            pool("redis-sentinel-sync"),
            ["sentinel-failover", "sentinel-failover-lagging"]
        );
        assert_eq!(
            pool("redis-cluster-sync"),
            [
                "cluster-failover",
                "cluster-slot-migration",
                "cluster-primary-cut"
            ]
        );
        assert_eq!(pool("redis-cluster"), ["cluster-slot-migration"]);
    }

    /// Measures the checker on a kept soak history (`DISTLOCK_FAULTS_KEEP=1`) laid end to end
    /// `DISTLOCK_FAULTS_SOAK_TIMES` times (15: a 2-minute soak as a 30-minute one), each copy
    /// shifted past the one before, its processes renumbered:
    /// `DISTLOCK_FAULTS_SOAK_HISTORY=/tmp/distlock-faults-soak-N/redis-0 cargo test -p
    /// distlock-faults -- --ignored --nocapture checking_a_long_history`.
    #[test]
    #[ignore = "needs a kept soak history"]
    fn checking_a_long_history_stays_fast() {
        let Some(dir) = std::env::var_os("DISTLOCK_FAULTS_SOAK_HISTORY") else {
            return;
        };
        let times: u64 = std::env::var("DISTLOCK_FAULTS_SOAK_TIMES")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(15);
        let one = crate::history::read_dir(Path::new(&dir)).expect("a history");
        let stamps = ["invoke", "complete", "end", "safe_until"];
        let (lo, hi) = one
            .iter()
            .filter_map(|r| serde_json::to_value(r).ok())
            .flat_map(|v| stamps.map(|k| v.get(k).and_then(serde_json::Value::as_u64)))
            .flatten()
            .fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        let span = hi - lo + 1_000_000_000;
        let mut recs = Vec::new();
        for k in 0..times {
            for r in &one {
                let mut v = serde_json::to_value(r).expect("a record");
                for key in stamps {
                    if let Some(t) = v.get(key).and_then(serde_json::Value::as_u64) {
                        v[key] = (t + k * span).into();
                    }
                }
                let pid = v["id"]["pid"].as_u64().expect("a pid");
                v["id"]["pid"] = (pid + k * 10_000_000).into();
                recs.push(serde_json::from_value(v).expect("a record"));
            }
        }
        let started = Instant::now();
        let checked = crate::checker::check(
            &recs,
            &[],
            &BTreeMap::new(),
            lo + times * span,
            Expect::default(),
        );
        let check_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let p = run::phases(&recs, &[], true);
        eprintln!(
            "{} records ({times} × {}): checked in {check_s:.2} s ({} grants, {} violations), \
             phases in {:.2} s ({} renewals); peak RSS {:.0} MiB",
            recs.len(),
            one.len(),
            checked.grants,
            checked.violations.len(),
            started.elapsed().as_secs_f64(),
            p.renewals,
            peak_rss_mib().unwrap_or(0.0)
        );
    }
}
