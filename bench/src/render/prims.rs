//! Sections 9 and 10 of the report: counting semaphores and leader failover, distlock's
//! backends first, then the peer libraries on the same servers.

use crate::model::{FailoverRow, Kind, PermitRow, Primitives, Results, Who};
use crate::render::format::{or_dash, rate, ratio, us};

use super::template::{self, blocks};
use super::{table, Block};

/// A row's first cells: its name, and why it did not run or what failed.
fn name(w: &Who) -> String {
    let mut s = match &w.version {
        Some(v) => format!("**{}** {v}", w.label),
        None => format!("**{}**", w.label),
    };
    if let Some(against) = w.against.as_deref().and_then(Kind::from_id) {
        s.push_str(&format!(" on {}", against.label()));
    }
    s
}

/// Why a row has no numbers, if it has none.
fn empty(w: &Who) -> Option<String> {
    if let Some(why) = &w.skipped {
        return Some(format!("skipped: {why}"));
    }
    w.errors
        .first()
        .map(|e| format!("failed ({}): {}", e.scenario, e.error))
}

/// distlock's row for the server `who` runs on.
fn ours<'a, T>(rows: &'a [T], who: &Who, of: fn(&T) -> &Who) -> Option<&'a T> {
    let against = who.against.as_deref()?;
    rows.iter()
        .find(|r| of(r).against.is_none() && of(r).id == against)
}

pub(super) fn permits(r: &Results, doc: &mut Vec<Block>) {
    let Some(p) = &r.primitives else { return };
    if p.permits.is_empty() {
        return;
    }
    let vars: template::Vars = &[
        ("max", &p.permit_max),
        ("contended_max", &p.contended_max),
        ("contenders", &p.contenders),
    ];
    doc.extend(blocks("permits", vars));
    let mut rows = Vec::new();
    for row in p.permits.iter().filter(|r| r.who.against.is_none()) {
        let mut cells = vec![name(&row.who)];
        match (&row.cycle, empty(&row.who)) {
            (Some(c), _) => {
                let lock = row.beside.map(|l| l.p50_us);
                cells.extend([
                    us(c.p50_us),
                    us(c.p99_us),
                    rate(row.cycles_per_sec),
                    or_dash(lock, us),
                    or_dash(lock.filter(|l| *l > 0.0), |l| ratio(c.p50_us / l)),
                ]);
                let h = row.contended.as_ref();
                cells.extend([
                    or_dash(h, |h| rate(h.grants_per_sec)),
                    or_dash(h, |h| us(h.wait.p50_us)),
                    or_dash(h, |h| us(h.wait.p99_us)),
                    or_dash(row.peak_held, |n| format!("{n} of {}", p.contended_max)),
                    or_dash(h, |h| h.exclusion_violations.to_string()),
                ]);
            }
            (None, why) => cells.push(why.unwrap_or_else(|| "no result".into())),
        }
        rows.push(cells);
    }
    doc.push(table(
        &[
            "Backend",
            "Permit cycle p50",
            "p99",
            "Cycles/s",
            "Lock cycle p50",
            "Permit ÷ lock",
            "Contended grants/s",
            "Wait p50",
            "Wait p99",
            "Most held at once",
            "Violations",
        ],
        rows,
    ));
    let peers: Vec<Vec<String>> = p
        .permits
        .iter()
        .filter(|r| r.who.against.is_some())
        .map(|row| peer_permit_row(p, row))
        .collect();
    if !peers.is_empty() {
        doc.extend(blocks("permits-peers", &[]));
        doc.push(table(
            &[
                "Library",
                "Permit cycle p50",
                "p99",
                "distlock permit cycle p50 (same slices)",
                "distlock ÷ library",
                "distlock permit cycle p50, its row above",
            ],
            peers,
        ));
    }
}

fn peer_permit_row(p: &Primitives, row: &PermitRow) -> Vec<String> {
    let mut cells = vec![name(&row.who)];
    let Some(c) = &row.cycle else {
        cells.push(empty(&row.who).unwrap_or_else(|| "no result".into()));
        return cells;
    };
    let mine = row.beside.map(|l| l.p50_us);
    let own = ours(&p.permits, &row.who, |r| &r.who).and_then(|r| r.cycle);
    cells.extend([
        us(c.p50_us),
        us(c.p99_us),
        or_dash(mine, us),
        or_dash(mine, |m| ratio(m / c.p50_us)),
        or_dash(own, |o| us(o.p50_us)),
    ]);
    cells
}

pub(super) fn failover(r: &Results, doc: &mut Vec<Block>) {
    let Some(p) = &r.primitives else { return };
    if p.failover.is_empty() {
        return;
    }
    let lease = format!("{} s", p.lease_ms as f64 / 1000.0);
    doc.extend(blocks("failover", &[("lease", &lease)]));
    let lease_us = p.lease_ms as f64 * 1000.0;
    let rows = p
        .failover
        .iter()
        .map(|row| failover_row(&p.failover, row, lease_us))
        .collect();
    doc.push(table(
        &[
            "Implementation",
            "Kills",
            "Failover p50",
            "Max",
            "Reaction p50 (− lease)",
            "Campaign returned p50",
            "distlock ÷ library",
        ],
        rows,
    ));
}

fn failover_row(all: &[FailoverRow], row: &FailoverRow, lease_us: f64) -> Vec<String> {
    let mut cells = vec![name(&row.who)];
    let Some(f) = &row.failover else {
        cells.push(empty(&row.who).unwrap_or_else(|| "no result".into()));
        return cells;
    };
    let mine = ours(all, &row.who, |r| &r.who).and_then(|r| r.failover);
    cells.extend([
        f.count.to_string(),
        us(f.p50_us),
        us(f.max_us),
        signed_ms(f.p50_us - lease_us),
        or_dash(row.elected, |e| us(e.p50_us)),
        match (&row.who.against, mine) {
            (None, _) => "–".into(),
            (Some(_), Some(m)) => ratio(m.p50_us / f.p50_us),
            (Some(_), None) => "no distlock row".into(),
        },
    ]);
    if !row.who.errors.is_empty() {
        cells[0].push_str(&format!(" ({} kill(s) failed)", row.who.errors.len()));
    }
    cells
}

fn signed_ms(v_us: f64) -> String {
    if v_us.abs() < 0.5 {
        return "0".into();
    }
    let sign = if v_us < 0.0 { "−" } else { "+" };
    format!("{sign}{}", us(v_us.abs()))
}

/// The goals of the issue: distlock ahead of each peer on the permit cycle and on failover.
pub(super) fn goals(r: &Results, permit_goal: f64, failover_goal: f64) -> Vec<String> {
    let Some(p) = &r.primitives else {
        return Vec::new();
    };
    let mut items = Vec::new();
    for row in p.permits.iter().filter(|r| r.who.against.is_some()) {
        let (Some(c), Some(m)) = (&row.cycle, &row.beside) else {
            continue;
        };
        let q = m.p50_us / c.p50_us;
        items.push(format!(
            "{} permit acquire + release at most {}× of **{}**'s (same server, same slices): \
             {} vs {} ({}).",
            super::format::mark(q <= permit_goal),
            permit_goal,
            row.who.label,
            us(m.p50_us),
            us(c.p50_us),
            ratio(q)
        ));
    }
    for row in p.failover.iter().filter(|r| r.who.against.is_some()) {
        let mine = ours(&p.failover, &row.who, |r| &r.who).and_then(|r| r.failover);
        let (Some(f), Some(m)) = (&row.failover, mine) else {
            continue;
        };
        let q = m.p50_us / f.p50_us;
        items.push(format!(
            "{} leader failover at most {}× of **{}**'s with the same {} s lease: {} vs {} ({}).",
            super::format::mark(q <= failover_goal),
            failover_goal,
            row.who.label,
            p.lease_ms as f64 / 1000.0,
            us(m.p50_us),
            us(f.p50_us),
            ratio(q)
        ));
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Latency;
    use crate::render::content::build;
    use crate::render::markup::markdown;

    fn who(id: &str, label: &str, against: Option<&str>) -> Who {
        Who {
            id: id.into(),
            label: label.into(),
            against: against.map(Into::into),
            version: None,
            skipped: None,
            errors: Vec::new(),
        }
    }

    fn p50(us: f64) -> Option<Latency> {
        Some(Latency {
            count: 4,
            p50_us: us,
            max_us: us,
            ..Latency::default()
        })
    }

    #[test]
    fn rows_compare_distlock_with_each_peer_on_its_server() {
        let json = include_str!("../../report/results.json");
        let mut r: Results = serde_json::from_str(json).expect("results.json parses");
        let permit = |who, cycle, beside| PermitRow {
            who,
            cycle,
            cycles_per_sec: 1000.0,
            beside,
            contended: None,
            peak_held: None,
        };
        let failover = |who, failover| FailoverRow {
            who,
            samples_ms: vec![1800.0],
            failover,
            elected: None,
        };
        r.primitives = Some(Primitives {
            permit_max: 4,
            contended_max: 2,
            contenders: 8,
            lease_ms: 2000,
            permits: vec![
                permit(who("zk", "ZooKeeper", None), p50(1000.0), p50(900.0)),
                permit(
                    who("curator", "Curator", Some("zk")),
                    p50(4000.0),
                    p50(1000.0),
                ),
            ],
            failover: vec![
                failover(who("zk", "ZooKeeper", None), p50(1_800_000.0)),
                failover(who("etcd-go", "Election", Some("etcd")), p50(2_000_000.0)),
            ],
        });
        let md = markdown(&build(&r));
        assert!(md.contains("| **ZooKeeper** | 1.00 ms |"), "{md}");
        assert!(md.contains("| 900 µs | 1.11× |"), "{md}");
        assert!(
            md.contains("| **Curator** on ZooKeeper | 4.00 ms |"),
            "{md}"
        );
        assert!(md.contains("| 1.00 ms | 0.25× |"), "{md}");
        assert!(md.contains("**met**: permit acquire + release"), "{md}");
        assert!(
            md.contains("| **ZooKeeper** | 4 | 1.80 s | 1.80 s | −200 ms |"),
            "{md}"
        );
        assert!(
            md.contains("| 2.00 s | 2.00 s | 0 | – | no distlock row |"),
            "{md}"
        );
        assert!(md.contains("same lease: 2 s"), "{md}");
    }
}
