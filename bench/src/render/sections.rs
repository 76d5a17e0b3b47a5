//! Sections 1 to 6 of the report: distlock's own scenarios, backend by backend.

use crate::model::{BackendResult, Latency, PausedMaster, Results, Uncontended};
use crate::render::format::{mib, or_dash, plural, rate, ratio, signed_us, us};
use crate::render::svg::{self, Series};

use super::template::{self, blocks};
use super::{table, Block};

pub(super) fn uncontended(r: &Results, doc: &mut Vec<Block>) {
    doc.extend(blocks("uncontended", &[]));
    let with: Vec<&BackendResult> = r.available().filter(|b| b.uncontended.is_some()).collect();
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
                signed_us(u.overhead_p50_us),
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
    let (deadline, ttl) = (us(p.master_deadline_ms * 1000.0), secs(p.ttl_ms));
    let vars: template::Vars = &[
        ("case", &CASE),
        ("masters", &p.masters),
        ("paused", &p.paused),
        ("deadline", &deadline),
        ("ttl", &ttl),
    ];
    doc.extend(blocks("paused", vars));
    let row = |case: String, l: &Latency, per_sec: f64, vs: String| {
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
        let (after, max) = (us(m.refused_after.p50_us), us(m.refused_after.max_us));
        let temporary = if m.temporary {
            " temporary"
        } else {
            " **permanent**"
        };
        let vars: template::Vars = &[
            ("after", &after),
            ("count", &m.refused_after.count),
            ("max", &max),
            ("temporary", &temporary),
            ("kind", &m.kind),
            ("error", &m.error),
        ];
        doc.extend(blocks("majority-down", vars));
    }
}

/// Milliseconds as seconds, without decimals that say nothing.
fn secs(ms: u64) -> String {
    format!("{} s", ms as f64 / 1000.0)
}

pub(super) fn independent(r: &Results, doc: &mut Vec<Block>) {
    doc.extend(blocks("independent", &[]));
    let levels: Vec<usize> = {
        let mut l: Vec<usize> = r
            .available()
            .flat_map(|b| b.independent.iter().map(|x| x.clients))
            .collect();
        l.sort_unstable();
        l.dedup();
        l
    };
    let with: Vec<&BackendResult> = r
        .available()
        .filter(|b| !b.independent.is_empty())
        .collect();
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

pub(super) fn hot(r: &Results, doc: &mut Vec<Block>) {
    doc.extend(blocks("hot", &[]));
    let with: Vec<&BackendResult> = r.available().filter(|b| !b.hot.is_empty()).collect();
    let mut rows = Vec::new();
    for b in &with {
        let one_handle = b.hot_one_handle.iter().map(|h| (h, true));
        for (h, shared) in b.hot.iter().map(|h| (h, false)).chain(one_handle) {
            rows.push(vec![
                b.label.clone(),
                if shared {
                    format!("{} tasks, one handle", h.clients)
                } else {
                    h.clients.to_string()
                },
                rate(h.grants_per_sec),
                us(h.handoff.p50_us),
                us(h.handoff.p99_us),
                us(h.wait.p99_us),
                us(h.longest_wait_ms * 1000.0),
                format!("{:.2}", h.jain),
                or_dash(h.self_regrant_share, |s| format!("{:.0}%", s * 100.0)),
                format!("{}–{}", h.grants_min, h.grants_max),
                or_dash(h.server_requests_per_grant, |n| format!("{n:.1}")),
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
            "Self-regrant",
            "Grants per client",
            "Server requests per grant",
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

pub(super) fn wake(r: &Results, doc: &mut Vec<Block>) {
    doc.extend(blocks("wake", &[]));
    let with: Vec<&BackendResult> = r.available().filter(|b| b.wake.is_some()).collect();
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

pub(super) fn many(r: &Results, doc: &mut Vec<Block>) {
    doc.extend(blocks("many", &[]));
    let rows = r
        .available()
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
    let errors: Vec<String> = r
        .available()
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
