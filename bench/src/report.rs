//! Turns [`Results`] into `report.md`, `report.html` and `results.json`.
//!
//! The report is built once as a list of blocks (headings, paragraphs, tables, charts) and
//! rendered twice, so the Markdown and the HTML can never disagree. Inline text uses a tiny
//! Markdown subset (`code` and **bold**) that the HTML renderer translates.

use std::fmt::Write as _;
use std::path::Path;

use crate::results::{BackendResult, PausedMaster, Results, Status, Uncontended};
use crate::svg::{self, Series};
use crate::Res;

/// The goal of issue 8: these backends' uncontended cycles within this factor of their floor.
const GOAL_RATIO: f64 = 1.25;
const GOAL_RATIO_BACKENDS: [&str; 4] = ["memory", "redis", "etcd", "zk"];
/// "A few round trips": the wake-up bound for notification backends over the network.
const GOAL_WAKE_ROUND_TRIPS: f64 = 5.0;
/// In-process there is no round trip to count; a notice must still beat any polling step.
const GOAL_WAKE_IN_PROCESS_US: f64 = 1000.0;

enum Block {
    H1(String),
    H2(String),
    P(String),
    List(Vec<String>),
    Table {
        head: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    /// Only in the HTML; the Markdown points to it.
    Chart(String),
}

/// Writes the three files into `dir`, creating it.
pub(crate) fn write(dir: &Path, results: &Results) -> Res<()> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let blocks = build(results);
    let put = |file: &str, text: String| {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    put("report.md", markdown(&blocks))?;
    put("report.html", html(&blocks))?;
    put(
        "results.json",
        serde_json::to_string_pretty(results)? + "\n",
    )?;
    put("readme-snippet.md", crate::readme::snippet(results))?;
    Ok(())
}

/// One line per backend for the terminal.
pub(crate) fn backend_line(b: &BackendResult) -> String {
    let mut line = format!("{:<18}", b.label);
    match &b.status {
        Status::Available { .. } => {
            if let Some(u) = &b.uncontended {
                let _ = write!(
                    line,
                    " cycle p50 {} ({:.2}× floor {})",
                    us(u.cycle.p50_us),
                    u.ratio_p50,
                    us(u.floor.p50_us)
                );
            }
            if let Some(w) = &b.wake {
                let _ = write!(line, ", wake-up p50 {}", us(w.latency.p50_us));
            }
            match &b.paused_master {
                Some(PausedMaster::Measured(p)) => {
                    let _ = write!(
                        line,
                        ", one master paused p50 {} ({} healthy {})",
                        us(p.paused_cycle.p50_us),
                        ratio(p.ratio_p50),
                        us(p.healthy.p50_us)
                    );
                }
                Some(PausedMaster::NotRun { reason }) => {
                    let _ = write!(line, ", one master paused: not run ({reason})");
                }
                None => {}
            }
            if !b.errors.is_empty() {
                let _ = write!(line, ", {} scenario(s) failed", b.errors.len());
            }
        }
        Status::Unavailable { error, .. } => {
            let _ = write!(line, " unavailable: {error}");
        }
        Status::NotRun => line.push_str(" not run"),
    }
    line
}

/// The headline numbers, for the terminal after the run.
pub(crate) fn summary_lines(r: &Results) -> Vec<String> {
    let mut lines: Vec<String> = r.backends.iter().map(backend_line).collect();
    for p in &r.peers {
        if let (Some(ours), Some(theirs)) = (&p.distlock_cycle, &p.peer_cycle) {
            lines.push(format!(
                "{:<18} cycle p50 {} vs distlock-{} {}",
                p.peer,
                us(theirs.p50_us),
                p.against,
                us(ours.p50_us)
            ));
        }
    }
    lines
}

// ---- formatting ---------------------------------------------------------------------------

/// A duration given in µs, in the unit that keeps 3 significant digits readable.
pub(crate) fn us(v: f64) -> String {
    if !v.is_finite() || v <= 0.0 {
        return "–".into();
    }
    if v < 1.0 {
        format!("{:.0} ns", v * 1000.0)
    } else if v < 10.0 {
        format!("{v:.2} µs")
    } else if v < 1000.0 {
        format!("{v:.0} µs")
    } else if v < 10_000.0 {
        format!("{:.2} ms", v / 1000.0)
    } else if v < 1_000_000.0 {
        format!("{:.0} ms", v / 1000.0)
    } else {
        format!("{:.2} s", v / 1_000_000.0)
    }
}

pub(crate) fn rate(v: f64) -> String {
    if !v.is_finite() || v <= 0.0 {
        "–".into()
    } else if v >= 1_000_000.0 {
        format!("{:.2}M/s", v / 1_000_000.0)
    } else if v >= 10_000.0 {
        format!("{:.0}k/s", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1}k/s", v / 1000.0)
    } else {
        format!("{v:.0}/s")
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

pub(crate) fn ratio(v: f64) -> String {
    if v.is_finite() && v > 0.0 {
        format!("{v:.2}×")
    } else {
        "–".into()
    }
}

fn or_dash<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| "–".into(), f)
}

// ---- content --------------------------------------------------------------------------------

fn available(r: &Results) -> impl Iterator<Item = &BackendResult> {
    r.backends.iter().filter(|b| b.available())
}

fn build(r: &Results) -> Vec<Block> {
    let mut doc = vec![Block::H1("distlock benchmark report".into())];
    header(r, &mut doc);
    summary(r, &mut doc);
    goals(r, &mut doc);
    uncontended(r, &mut doc);
    independent(r, &mut doc);
    hot(r, &mut doc);
    wake(r, &mut doc);
    many(r, &mut doc);
    peers(r, &mut doc);
    errors(r, &mut doc);
    method(&mut doc);
    doc
}

fn header(r: &Results, doc: &mut Vec<Block>) {
    let m = &r.meta;
    doc.push(Block::P(format!(
        "Generated by `{}` on {} — {} mode, {} build, {:.0} s.",
        m.command, m.date_utc, m.mode, m.profile, m.duration_s
    )));
    if m.mode == "quick" || m.profile == "debug" {
        doc.push(Block::P(
            "**This is a quick or debug run**: it checks that every scenario and the report \
             work; its numbers are not representative. Run `scripts/bench` for the real report."
                .into(),
        ));
    }
    let mc = &m.machine;
    doc.push(Block::List(vec![
        format!("**CPU:** {} ({} cores)", mc.cpu, mc.cores),
        format!(
            "**Memory:** {:.1} GiB",
            mc.memory_bytes as f64 / (1u64 << 30) as f64
        ),
        format!("**OS:** {}", mc.os),
        format!(
            "**Load average at start:** {} (servers and benchmark share this machine)",
            mc.load_at_start
        ),
        format!("**distlock-bench** {}", m.version),
    ]));
    doc.push(Block::H2("Servers".into()));
    let rows = r
        .backends
        .iter()
        .map(|b| match &b.status {
            Status::Available { server, url } => vec![
                b.label.clone(),
                "available".into(),
                server.clone(),
                format!("`{url}`"),
                format!("{:.0} s", b.took_s),
            ],
            Status::Unavailable {
                error,
                how_to_start,
            } => vec![
                b.label.clone(),
                "**unavailable**".into(),
                error.clone(),
                how_to_start.clone(),
            ],
            Status::NotRun => vec![
                b.label.clone(),
                "not run".into(),
                String::new(),
                String::new(),
            ],
        })
        .collect();
    doc.push(table(
        &[
            "Backend",
            "Status",
            "Server",
            "URL / how to start",
            "Run time",
        ],
        rows,
    ));
}

fn table(head: &[&str], rows: Vec<Vec<String>>) -> Block {
    Block::Table {
        head: head.iter().map(|s| s.to_string()).collect(),
        rows,
    }
}

fn summary(r: &Results, doc: &mut Vec<Block>) {
    doc.push(Block::H2("Summary".into()));
    let rows = available(r)
        .map(|b| {
            let u = b.uncontended.as_ref();
            vec![
                b.label.clone(),
                b.blocking.clone().unwrap_or_default(),
                or_dash(u, |u| us(u.cycle.p50_us)),
                or_dash(u, |u| us(u.cycle.p99_us)),
                or_dash(u, |u| rate(u.cycles_per_sec)),
                or_dash(u, |u| ratio(u.ratio_p50)),
                or_dash(
                    b.independent
                        .iter()
                        .max_by(|x, y| x.cycles_per_sec.total_cmp(&y.cycles_per_sec)),
                    |l| {
                        format!(
                            "{} ({} client{})",
                            rate(l.cycles_per_sec),
                            l.clients,
                            plural(l.clients)
                        )
                    },
                ),
                or_dash(
                    b.hot.iter().find(|h| h.clients == 8).or(b.hot.first()),
                    |h| format!("{} ({} clients)", us(h.handoff.p50_us), h.clients),
                ),
                or_dash(b.wake.as_ref(), |w| us(w.latency.p50_us)),
            ]
        })
        .collect();
    doc.push(table(
        &[
            "Backend",
            "Waiting",
            "Cycle p50",
            "Cycle p99",
            "Cycles/s",
            "Cycle ÷ floor",
            "Independent locks, peak",
            "Hot-lock hand-off p50",
            "Wake-up p50",
        ],
        rows,
    ));
}

fn goals(r: &Results, doc: &mut Vec<Block>) {
    doc.push(Block::H2("Goals".into()));
    let mut items = Vec::new();
    for id in GOAL_RATIO_BACKENDS {
        let Some(b) = r.backends.iter().find(|b| b.id == id) else {
            continue;
        };
        items.push(match (&b.status, &b.uncontended) {
            (Status::Available { .. }, Some(u)) => format!(
                "{} **{}** uncontended cycle within {GOAL_RATIO}× of its floor: {} ({} vs {}, \
                 {} per cycle; the backend's primitives alone, without guard and watchdog: {}).",
                mark(u.ratio_p50 <= GOAL_RATIO),
                b.label,
                ratio(u.ratio_p50),
                us(u.cycle.p50_us),
                us(u.floor.p50_us),
                overhead(u),
                us(u.primitive_cycle.p50_us)
            ),
            (Status::Available { .. }, None) => {
                format!(
                    "**missed**: **{}**: the uncontended scenario failed.",
                    b.label
                )
            }
            _ => format!("**not measured**: **{}** is unavailable.", b.label),
        });
    }
    for b in available(r).filter(|b| b.blocking.as_deref() == Some("notify")) {
        let Some(w) = &b.wake else { continue };
        let in_process = b.id == "memory";
        let line = match (in_process, w.idle_round_trips_p50, w.round_trips_p50) {
            (true, _, _) => format!(
                "{} **{}** (notify) wake-up p50 {} — in-process, well under any polling step.",
                mark(w.latency.p50_us <= GOAL_WAKE_IN_PROCESS_US),
                b.label,
                us(w.latency.p50_us)
            ),
            (false, Some(idle), busy) => format!(
                "{} **{}** (notify) wake-up p50 {} ≈ {idle:.1} round trips of an idle client \
                 (goal: a few, at most {GOAL_WAKE_ROUND_TRIPS}; the raw floor after the same \
                 idle delay takes {}){}{}.",
                mark(idle <= GOAL_WAKE_ROUND_TRIPS),
                b.label,
                us(w.latency.p50_us),
                or_dash(w.idle_floor, |f| us(f.p50_us)),
                or_dash(busy, |x| format!("; ≈ {x:.1} busy-loop round trips")),
                warm_handoff(b)
            ),
            (false, None, Some(rts)) => format!(
                "{} **{}** (notify) wake-up p50 {} ≈ {rts:.1} round trips (goal: a few, at \
                 most {GOAL_WAKE_ROUND_TRIPS}){}.",
                mark(rts <= GOAL_WAKE_ROUND_TRIPS),
                b.label,
                us(w.latency.p50_us),
                warm_handoff(b)
            ),
            (false, None, None) => format!(
                "**not judged**: **{}** (notify) wake-up p50 {}: no floor to count round trips \
                 against.",
                b.label,
                us(w.latency.p50_us)
            ),
        };
        items.push(line);
    }
    if items.is_empty() {
        items.push("Nothing measured.".into());
    }
    doc.push(Block::List(items));
}

/// Words, not emoji: they read the same in every terminal, font and Markdown renderer.
/// The same release-to-grant path with busy threads, for comparison: the wake-up scenario's
/// waiter has been idle, and waking idle threads (client and server) costs more than a warm
/// round trip on loopback.
fn warm_handoff(b: &BackendResult) -> String {
    let (Some(h), Some(u)) = (b.hot.iter().min_by_key(|h| h.clients), &b.uncontended) else {
        return String::new();
    };
    let rt = u.round_trip_us();
    if rt <= 0.0 {
        return String::new();
    }
    format!(
        "; the warm hand-off of the hot lock with {} clients takes {} ≈ {:.1}",
        h.clients,
        us(h.handoff.p50_us),
        h.handoff.p50_us / rt
    )
}

fn mark(ok: bool) -> &'static str {
    if ok {
        "**met**:"
    } else {
        "**missed**:"
    }
}

fn overhead(u: &Uncontended) -> String {
    let sign = if u.overhead_p50_us < 0.0 { "−" } else { "+" };
    format!("{sign}{}", us(u.overhead_p50_us.abs()))
}

fn uncontended(r: &Results, doc: &mut Vec<Block>) {
    doc.push(Block::H2("1–2. Uncontended cycle against the floor".into()));
    doc.push(Block::P(
        "One client acquires and releases one free name: `lock(name, wait)` + `release()` \
         (what applications call), `try_lock(name)` + `release()`, and the backend's \
         primitives `try_acquire` + `release` alone (no guard, no watchdog). The floor sends the raw \
         server operations one cycle needs at the least, with the raw driver over the same \
         kind of connection, in slices alternating with the cycle's. Cycle ÷ floor compares \
         medians."
            .into(),
    ));
    let with: Vec<&BackendResult> = available(r).filter(|b| b.uncontended.is_some()).collect();
    let rows = with
        .iter()
        .filter_map(|b| {
            let u = b.uncontended.as_ref()?;
            Some(vec![
                b.label.clone(),
                us(u.cycle.p50_us),
                us(u.cycle.p99_us),
                us(u.cycle.p999_us),
                rate(u.cycles_per_sec),
                us(u.try_cycle.p50_us),
                us(u.primitive_cycle.p50_us),
                us(u.floor.p50_us),
                us(u.floor.p99_us),
                u.floor_round_trips.to_string(),
                ratio(u.ratio_p50),
                overhead(u),
            ])
        })
        .collect();
    doc.push(table(
        &[
            "Backend",
            "Cycle p50",
            "p99",
            "p99.9",
            "Cycles/s",
            "try_lock cycle p50",
            "Primitives p50",
            "Floor p50",
            "Floor p99",
            "Floor round trips",
            "Cycle ÷ floor",
            "Overhead p50",
        ],
        rows,
    ));
    doc.push(Block::List(
        with.iter()
            .filter_map(|b| {
                let u = b.uncontended.as_ref()?;
                Some(format!("**{}** floor: {}.", b.label, u.floor_ops))
            })
            .collect(),
    ));
    paused_master(r, doc);
    let cats: Vec<String> = with.iter().map(|b| b.label.clone()).collect();
    let pick = |f: fn(&Uncontended) -> f64| -> Vec<Option<f64>> {
        with.iter().map(|b| b.uncontended.as_ref().map(f)).collect()
    };
    doc.push(Block::Chart(svg::bars(
        "Uncontended acquire + release latency (log scale)",
        &cats,
        &[
            Series {
                name: "cycle p50".into(),
                values: pick(|u| u.cycle.p50_us),
            },
            Series {
                name: "cycle p99".into(),
                values: pick(|u| u.cycle.p99_us),
            },
            Series {
                name: "floor p50".into(),
                values: pick(|u| u.floor.p50_us),
            },
        ],
        us,
    )));
}

/// The RedLock cycle with one of three private masters paused, next to the same cycle on the
/// same servers healthy.
fn paused_master(r: &Results, doc: &mut Vec<Block>) {
    const CASE: &str = "RedLock, one master paused";
    let Some(b) = r.backends.iter().find(|b| b.id == "redlock") else {
        return;
    };
    let head = [
        "Case",
        "Cycle p50",
        "p99",
        "p99.9",
        "Cycles/s",
        "÷ healthy (p50)",
    ];
    let not_run = |why: String| table(&head, vec![vec![CASE.into(), format!("not run: {why}")]]);
    let p = match &b.paused_master {
        Some(PausedMaster::Measured(p)) => p,
        Some(PausedMaster::NotRun { reason }) => {
            doc.push(not_run(reason.clone()));
            return;
        }
        None => {
            let why = match b.errors.iter().find(|e| e.scenario == "paused-master") {
                Some(e) => format!("failed: {}", e.error),
                None if !b.available() => "the RedLock backend is unavailable".into(),
                None => "no result".into(),
            };
            doc.push(not_run(why));
            return;
        }
    };
    doc.push(Block::P(format!(
        "**{CASE}.** The `lock(name, wait)` + `release()` cycle of the RedLock row above, on \
         {} private redis-servers the benchmark starts on free loopback ports (the shared ones \
         are never paused), in slices alternating between all healthy and {} of them stopped \
         (`SIGSTOP`: connected, silent). A round ends as soon as a majority has answered, so the live \
         masters decide it; a round that misses the majority waits for the silent master at \
         most the per-master deadline after the first answer, {} for this cycle's {} lease. \
         ÷ healthy compares the medians of the two measurements.",
        p.masters,
        p.paused,
        us(p.master_deadline_ms * 1000.0),
        secs(p.ttl_ms)
    )));
    let row = |case: String, l: &crate::stats::Latency, per_sec: f64, vs: String| {
        vec![
            case,
            us(l.p50_us),
            us(l.p99_us),
            us(l.p999_us),
            rate(per_sec),
            vs,
        ]
    };
    doc.push(table(
        &head,
        vec![
            row(
                format!("RedLock, healthy ({} private masters)", p.masters),
                &p.healthy,
                p.healthy_per_sec,
                "–".into(),
            ),
            row(
                CASE.into(),
                &p.paused_cycle,
                p.paused_per_sec,
                ratio(p.ratio_p50),
            ),
        ],
    ));
    if let Some(m) = &p.majority_down {
        doc.push(Block::List(vec![format!(
            "**With a majority paused** (a second master stopped too), `try_lock` on a free \
             name was refused after {} (median of {}, max {}) with a{} `{}` error: {}",
            us(m.refused_after.p50_us),
            m.refused_after.count,
            us(m.refused_after.max_us),
            if m.temporary {
                " temporary"
            } else {
                " **permanent**"
            },
            m.kind,
            m.error
        )]));
    }
}

/// Milliseconds as seconds, without decimals that say nothing.
fn secs(ms: u64) -> String {
    format!("{} s", ms as f64 / 1000.0)
}

fn independent(r: &Results, doc: &mut Vec<Block>) {
    doc.push(Block::H2("3. Independent locks".into()));
    doc.push(Block::P(
        "N clients (separate connections or sessions), each acquiring and releasing its own \
         name in a loop: total cycles per second, and p99 cycle latency."
            .into(),
    ));
    let levels: Vec<usize> = {
        let mut l: Vec<usize> = available(r)
            .flat_map(|b| b.independent.iter().map(|x| x.clients))
            .collect();
        l.sort_unstable();
        l.dedup();
        l
    };
    let with: Vec<&BackendResult> = available(r).filter(|b| !b.independent.is_empty()).collect();
    let mut head = vec!["Backend".to_string()];
    head.extend(levels.iter().map(|n| format!("{n} client{}", plural(*n))));
    let rows = with
        .iter()
        .map(|b| {
            let mut row = vec![b.label.clone()];
            row.extend(levels.iter().map(|n| {
                or_dash(b.independent.iter().find(|l| l.clients == *n), |l| {
                    format!("{} (p99 {})", rate(l.cycles_per_sec), us(l.latency.p99_us))
                })
            }));
            row
        })
        .collect();
    doc.push(Block::Table { head, rows });
    let series: Vec<Series> = with
        .iter()
        .map(|b| Series {
            name: b.label.clone(),
            values: levels
                .iter()
                .map(|n| {
                    b.independent
                        .iter()
                        .find(|l| l.clients == *n)
                        .map(|l| l.cycles_per_sec)
                })
                .collect(),
        })
        .collect();
    let xs: Vec<String> = levels.iter().map(|n| n.to_string()).collect();
    doc.push(Block::Chart(svg::lines(
        "Throughput against clients, independent locks (cycles/s, log scale)",
        "concurrent clients",
        &xs,
        &series,
        rate,
    )));
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn hot(r: &Results, doc: &mut Vec<Block>) {
    doc.push(Block::H2("4. One hot lock".into()));
    doc.push(Block::P(
        "N clients contend for one name and release as soon as they hold it. Hand-off: from \
         the holder calling release to the next holder's acquire returning. Fairness: Jain's \
         index over per-client grants (1 = even; 1/N = one client got them all). \
         Violations: times two benchmark clients held the lock at once (must be 0)."
            .into(),
    ));
    let with: Vec<&BackendResult> = available(r).filter(|b| !b.hot.is_empty()).collect();
    let mut rows = Vec::new();
    for b in &with {
        for h in &b.hot {
            rows.push(vec![
                b.label.clone(),
                h.clients.to_string(),
                rate(h.grants_per_sec),
                us(h.handoff.p50_us),
                us(h.handoff.p99_us),
                us(h.wait.p99_us),
                us(h.longest_wait_ms * 1000.0),
                format!("{:.2}", h.jain),
                format!("{}–{}", h.grants_min, h.grants_max),
                h.exclusion_violations.to_string(),
            ]);
        }
    }
    doc.push(table(
        &[
            "Backend",
            "Clients",
            "Grants/s",
            "Hand-off p50",
            "Hand-off p99",
            "Wait p99",
            "Longest wait",
            "Jain",
            "Grants per client",
            "Violations",
        ],
        rows,
    ));
    let levels: Vec<usize> = {
        let mut l: Vec<usize> = with
            .iter()
            .flat_map(|b| b.hot.iter().map(|h| h.clients))
            .collect();
        l.sort_unstable();
        l.dedup();
        l
    };
    let series: Vec<Series> = levels
        .iter()
        .map(|n| Series {
            name: format!("{n} clients"),
            values: with
                .iter()
                .map(|b| {
                    b.hot
                        .iter()
                        .find(|h| h.clients == *n)
                        .map(|h| h.handoff.p50_us)
                })
                .collect(),
        })
        .collect();
    let cats: Vec<String> = with.iter().map(|b| b.label.clone()).collect();
    doc.push(Block::Chart(svg::bars(
        "Hot-lock hand-off latency p50 (log scale)",
        &cats,
        &series,
        us,
    )));
}

fn wake(r: &Results, doc: &mut Vec<Block>) {
    doc.push(Block::H2("5. Wake-up".into()));
    doc.push(Block::P(
        "One holder with a long lease, one waiter that has been waiting for a random 0.1–0.4 s \
         (quick mode: less); the time from the holder calling release to the waiter holding \
         the lock. Busy round trips: the median divided by the floor's time per round trip in \
         the uncontended scenario's tight loop. Idle round trips: the median divided by the \
         time per round trip of the same floor cycle run once after the same kind of idle \
         delay, so that both sides of the ratio pay for waking idle threads."
            .into(),
    ));
    let with: Vec<&BackendResult> = available(r).filter(|b| b.wake.is_some()).collect();
    let rows = with
        .iter()
        .filter_map(|b| {
            let w = b.wake.as_ref()?;
            Some(vec![
                b.label.clone(),
                b.blocking.clone().unwrap_or_default(),
                w.latency.count.to_string(),
                us(w.latency.p50_us),
                us(w.latency.mean_us),
                us(w.latency.max_us),
                if b.id == "memory" {
                    "in-process".into()
                } else {
                    or_dash(w.round_trips_p50, |x| format!("{x:.1}"))
                },
                or_dash(w.idle_floor, |f| us(f.p50_us)),
                or_dash(w.idle_round_trips_p50, |x| format!("{x:.1}")),
            ])
        })
        .collect();
    doc.push(table(
        &[
            "Backend",
            "Waiting",
            "Samples",
            "p50",
            "Mean",
            "Max",
            "≈ Busy round trips (p50)",
            "Idle floor p50",
            "≈ Idle round trips (p50)",
        ],
        rows,
    ));
    let cats: Vec<String> = with.iter().map(|b| b.label.clone()).collect();
    doc.push(Block::Chart(svg::bars(
        "Wake-up latency after release (log scale)",
        &cats,
        &[
            Series {
                name: "p50".into(),
                values: with
                    .iter()
                    .map(|b| b.wake.as_ref().map(|w| w.latency.p50_us))
                    .collect(),
            },
            Series {
                name: "max".into(),
                values: with
                    .iter()
                    .map(|b| b.wake.as_ref().map(|w| w.latency.max_us))
                    .collect(),
            },
        ],
        us,
    )));
}

fn many(r: &Results, doc: &mut Vec<Block>) {
    doc.push(Block::H2("6. Many held locks".into()));
    doc.push(Block::P(
        "One client holds many locks with the watchdog renewing them (requested TTL 3 s, so a \
         renewal per lock every second on per-lock leases; session-bound backends grant their \
         session's or lease's TTL instead). Memory is this process's resident set (the whole \
         benchmark, so the difference is what counts); renewals are the grants the watchdog \
         renewed and requests the calls that carried them (etcd and ZooKeeper confirm up to 64 \
         locks with one transaction or multi-read), both counted by a wrapper around the \
         backend over a whole number of renewal periods. The in-memory store keeps a \
         watchdog-managed lease itself for as long as its guard lives, so it has nothing to \
         renew. Lost: guards that reported their lock lost during the hold (must be 0)."
            .into(),
    ));
    let rows = available(r)
        .filter_map(|b| {
            let m = b.many.as_ref()?;
            Some(vec![
                b.label.clone(),
                if m.locks < m.locks_requested {
                    format!("{} of {} (budget spent)", m.locks, m.locks_requested)
                } else {
                    m.locks.to_string()
                },
                format!("{:.2} s", m.acquire_s),
                match m.released {
                    Some(n) if n < m.locks => {
                        format!("{:.2} s ({n} of {}, budget spent)", m.release_s, m.locks)
                    }
                    _ => format!("{:.2} s", m.release_s),
                },
                mib(m.rss_before_bytes as f64),
                mib(m.rss_holding_bytes as f64),
                format!("{:.0} B", m.bytes_per_lock),
                us(m.granted_ttl_ms as f64 * 1000.0),
                rate(m.renewals_per_sec),
                m.requests_per_sec.map_or_else(|| "–".into(), rate),
                if m.interval_s > 0.0 {
                    format!("{:.2} s", m.interval_s)
                } else {
                    "–".into()
                },
                rate(m.expected_per_sec),
                m.renew_errors.to_string(),
                m.lost.to_string(),
            ])
        })
        .collect();
    doc.push(table(
        &[
            "Backend",
            "Locks",
            "Acquire all",
            "Release all",
            "RSS before",
            "RSS holding",
            "Per lock",
            "Granted TTL",
            "Renewals/s",
            "Requests/s",
            "Each lock every",
            "TTL/3 target",
            "Renew errors",
            "Lost",
        ],
        rows,
    ));
    let errors: Vec<String> = available(r)
        .filter_map(|b| {
            let m = b.many.as_ref()?;
            let e = m.first_renew_error.as_ref()?;
            Some(format!("**{}** first failed renewal: {e}", b.label))
        })
        .collect();
    if !errors.is_empty() {
        doc.push(Block::List(errors));
    }
}

fn peers(r: &Results, doc: &mut Vec<Block>) {
    if r.peers.is_empty() {
        return;
    }
    doc.push(Block::H2("7. Peer: rslock".into()));
    doc.push(Block::P(
        "`rslock`, the most-used Rust Redis lock crate, on the same servers in the same run, \
         in slices alternating with distlock's. One client, one free name, acquire + release."
            .into(),
    ));
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for p in &r.peers {
        match (&p.distlock_cycle, &p.peer_cycle) {
            (Some(ours), Some(theirs)) => rows.push(vec![
                format!("distlock-{} vs {}", p.against, p.peer),
                us(ours.p50_us),
                us(ours.p99_us),
                rate(p.distlock_per_sec),
                us(theirs.p50_us),
                us(theirs.p99_us),
                rate(p.peer_per_sec),
                ratio(ours.p50_us / theirs.p50_us),
            ]),
            _ => rows.push(vec![
                format!("distlock-{} vs {}", p.against, p.peer),
                format!(
                    "not measured: {}",
                    p.error.clone().unwrap_or_else(|| "no result".into())
                ),
            ]),
        }
        notes.push(format!("**vs {}:** {}.", p.peer, p.note));
    }
    doc.push(table(
        &[
            "Comparison",
            "distlock p50",
            "distlock p99",
            "distlock cycles/s",
            "rslock p50",
            "rslock p99",
            "rslock cycles/s",
            "distlock ÷ rslock (p50)",
        ],
        rows,
    ));
    doc.push(Block::List(notes));
}

fn errors(r: &Results, doc: &mut Vec<Block>) {
    let items: Vec<String> = r
        .backends
        .iter()
        .flat_map(|b| {
            b.errors
                .iter()
                .map(move |e| format!("**{}** {}: {}", b.label, e.scenario, e.error))
        })
        .collect();
    if items.is_empty() {
        return;
    }
    doc.push(Block::H2("Scenarios that failed".into()));
    doc.push(Block::List(items));
}

fn method(doc: &mut Vec<Block>) {
    doc.push(Block::H2("How this was measured".into()));
    doc.push(Block::List(vec![
        "Every number comes from this run: the servers run on the same machine as the \
         benchmark, over loopback, so a round trip is tens of microseconds and CPU contention \
         between client and server is part of every number."
            .into(),
        "Latencies are recorded in HDR histograms (3 significant digits); cycles/s is cycles \
         divided by the time spent running them."
            .into(),
        "Each client is its own client handle (own connections, session or lease), as a \
         separate process would have; lock names are unique per run."
            .into(),
        "MongoDB runs in a database of its own, dropped after the run: the backend keeps one \
         document per lock name for good (its fencing counter), and acquire and release on the \
         MongoDB-compatible server that `scripts/services` installs slow down as that \
         collection grows, so documents left by earlier runs and tests would skew this one."
            .into(),
        "Scenario 6 acquires and releases under a time budget each (30 s in the full run): a \
         backend that cannot keep its locks renewed while acquiring more is reported with the \
         locks it got, and one whose releases run out of time with the locks it released (the \
         rest are dropped, which releases them in the background)."
            .into(),
        "`results.json` holds every number of this report for comparison across runs.".into(),
    ]));
}

// ---- rendering ------------------------------------------------------------------------------

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn markdown(blocks: &[Block]) -> String {
    let mut out = String::new();
    let mut charts = 0;
    for b in blocks {
        match b {
            Block::H1(t) => {
                let _ = writeln!(out, "# {t}\n");
            }
            Block::H2(t) => {
                let _ = writeln!(out, "## {t}\n");
            }
            Block::P(t) => {
                let _ = writeln!(out, "{t}\n");
            }
            Block::List(items) => {
                for i in items {
                    let _ = writeln!(out, "- {i}");
                }
                out.push('\n');
            }
            Block::Table { head, rows } => {
                let cells: Vec<String> = head.iter().map(|h| md_cell(h)).collect();
                let _ = writeln!(out, "| {} |", cells.join(" | "));
                let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
                for row in rows {
                    let mut cells: Vec<String> = row.iter().map(|c| md_cell(c)).collect();
                    cells.resize(head.len(), String::new());
                    let _ = writeln!(out, "| {} |", cells.join(" | "));
                }
                out.push('\n');
            }
            Block::Chart(svg) if !svg.is_empty() => charts += 1,
            Block::Chart(_) => {}
        }
    }
    if charts > 0 {
        let _ = writeln!(
            out,
            "The charts ({charts}) are in [report.html](report.html), next to this file."
        );
    }
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Escapes, then turns `code` and **bold** into tags.
fn inline(s: &str) -> String {
    let escaped = html_escape(s);
    let mut out = String::with_capacity(escaped.len());
    let (mut code, mut bold) = (false, false);
    let mut rest = escaped.as_str();
    while let Some(c) = rest.chars().next() {
        if c == '`' {
            out.push_str(if code { "</code>" } else { "<code>" });
            code = !code;
            rest = &rest[1..];
        } else if !code && rest.starts_with("**") {
            out.push_str(if bold { "</strong>" } else { "<strong>" });
            bold = !bold;
            rest = &rest[2..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    if code {
        out.push_str("</code>");
    }
    if bold {
        out.push_str("</strong>");
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;\
padding:0 1em;color:#222;line-height:1.45}table{border-collapse:collapse;margin:1em 0;\
display:block;overflow-x:auto;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}\
td.n{text-align:right;white-space:nowrap}th{background:#f3f3f3}\
code{background:#f3f3f3;padding:0 3px;border-radius:3px}figure{margin:1em 0}\
svg{max-width:100%;height:auto}h2{margin-top:2em;border-bottom:1px solid #ddd}";

/// Cells that hold a measurement are right-aligned, text stays left-aligned.
fn is_number(cell: &str) -> bool {
    cell.starts_with(|c: char| c.is_ascii_digit() || "+−–".contains(c))
}

fn html(blocks: &[Block]) -> String {
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>distlock benchmark report</title><style>{STYLE}</style></head><body>\n"
    );
    for b in blocks {
        match b {
            Block::H1(t) => {
                let _ = writeln!(out, "<h1>{}</h1>", inline(t));
            }
            Block::H2(t) => {
                let _ = writeln!(out, "<h2>{}</h2>", inline(t));
            }
            Block::P(t) => {
                let _ = writeln!(out, "<p>{}</p>", inline(t));
            }
            Block::List(items) => {
                out.push_str("<ul>");
                for i in items {
                    let _ = write!(out, "<li>{}</li>", inline(i));
                }
                out.push_str("</ul>\n");
            }
            Block::Table { head, rows } => {
                out.push_str("<table><thead><tr>");
                for h in head {
                    let _ = write!(out, "<th>{}</th>", inline(h));
                }
                out.push_str("</tr></thead><tbody>");
                for row in rows {
                    out.push_str("<tr>");
                    for c in row {
                        let class = if is_number(c) { " class=\"n\"" } else { "" };
                        let _ = write!(out, "<td{class}>{}</td>", inline(c));
                    }
                    out.push_str("</tr>");
                }
                out.push_str("</tbody></table>\n");
            }
            Block::Chart(svg) if !svg.is_empty() => {
                let _ = writeln!(out, "<figure>{svg}</figure>");
            }
            Block::Chart(_) => {}
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_pick_a_readable_unit() {
        assert_eq!(us(0.25), "250 ns");
        assert_eq!(us(3.456), "3.46 µs");
        assert_eq!(us(123.4), "123 µs");
        assert_eq!(us(1234.0), "1.23 ms");
        assert_eq!(us(123_456.0), "123 ms");
        assert_eq!(us(2_500_000.0), "2.50 s");
        assert_eq!(us(0.0), "–");
        assert_eq!(rate(12_345.0), "12k/s");
        assert_eq!(rate(1_234.0), "1.2k/s");
    }

    #[test]
    fn inline_markup_becomes_tags_after_escaping() {
        assert_eq!(
            inline("run `a<b` **now**"),
            "run <code>a&lt;b</code> <strong>now</strong>"
        );
        assert_eq!(inline("`x**y`"), "<code>x**y</code>");
    }

    /// The committed example report, with `f` applied to its RedLock result.
    fn example_with(f: impl FnOnce(&mut BackendResult)) -> Results {
        let json = include_str!("../report/results.json");
        let mut r: Results = serde_json::from_str(json).expect("results.json parses");
        f(r.backends
            .iter_mut()
            .find(|b| b.id == "redlock")
            .expect("the example report has RedLock"));
        r
    }

    #[test]
    fn paused_master_row_says_why_it_was_not_run() {
        let r = example_with(|b| {
            b.paused_master = Some(PausedMaster::NotRun {
                reason: "no redis-server".into(),
            })
        });
        let md = markdown(&build(&r));
        assert!(
            md.contains("| RedLock, one master paused | not run: no redis-server |"),
            "{md}"
        );
        let redlock = r.backends.iter().find(|b| b.id == "redlock").unwrap();
        assert!(backend_line(redlock).contains("not run (no redis-server)"));
    }

    #[test]
    fn paused_master_row_shows_the_ratio_to_healthy() {
        let l = |p50_us| crate::stats::Latency {
            count: 10,
            p50_us,
            ..Default::default()
        };
        let r = example_with(|b| {
            b.paused_master = Some(PausedMaster::Measured(Box::new(
                crate::results::PausedCycles {
                    masters: 3,
                    paused: 1,
                    ttl_ms: 30_000,
                    master_deadline_ms: 150.0,
                    healthy: l(400.0),
                    healthy_per_sec: 2500.0,
                    paused_cycle: l(300.0),
                    paused_per_sec: 3333.0,
                    ratio_p50: 0.75,
                    majority_down: None,
                },
            )))
        });
        let blocks = build(&r);
        let md = markdown(&blocks);
        assert!(
            md.contains("| RedLock, one master paused | 300 µs | – | – | 3.3k/s | 0.75× |"),
            "{md}"
        );
        assert!(md.contains("150 ms for this cycle's 30 s lease"), "{md}");
        assert!(html(&blocks).contains("<td>RedLock, one master paused</td>"));
    }

    #[test]
    fn markdown_tables_pad_short_rows_and_escape_pipes() {
        let md = markdown(&[table(&["a", "b"], vec![vec!["x|y".into()]])]);
        assert!(md.contains("| a | b |\n|---|---|\n| x\\|y |  |\n"), "{md}");
    }
}
