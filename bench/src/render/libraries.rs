//! Sections 7 and 8 of the report: the rslock peer, and the libraries a user would pick
//! instead, next to distlock.

use crate::model::{Kind, Latency, LibraryResult, Results, CONTENDERS};
use crate::render::format::{rate, ratio, us};

use super::{table, template, Block};

/// `library vs distlock (distlock ÷ library)` for a time or a rate.
fn versus(theirs: Option<f64>, ours: Option<f64>, show: fn(f64) -> String) -> String {
    match (theirs, ours) {
        (Some(t), Some(o)) => format!("{} vs {} ({})", show(t), show(o), ratio(o / t)),
        (Some(t), None) => format!("{} vs –", show(t)),
        (None, Some(o)) => format!("– vs {}", show(o)),
        (None, None) => "–".into(),
    }
}

/// `library vs distlock` for a share or an index, where a quotient says nothing useful.
fn beside(theirs: Option<f64>, ours: Option<f64>, show: fn(f64) -> String) -> String {
    let s = |v: Option<f64>| v.map_or_else(|| "–".into(), show);
    if theirs.is_none() && ours.is_none() {
        return "–".into();
    }
    format!("{} vs {}", s(theirs), s(ours))
}

fn percent(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

fn two_decimals(v: f64) -> String {
    format!("{v:.2}")
}

fn name(l: &LibraryResult) -> String {
    format!("**{}**", l.library)
}

fn row(l: &LibraryResult) -> Vec<String> {
    let against =
        Kind::from_id(&l.against).map_or_else(|| l.against.clone(), |k| k.label().to_string());
    let server = match &l.server {
        Some(s) => format!("{s} (distlock-{})", l.against),
        None => format!("{against} (distlock-{})", l.against),
    };
    if let Some(reason) = &l.skipped {
        return vec![
            name(l),
            l.source.clone(),
            "–".into(),
            server,
            format!("**skipped**: {reason}"),
        ];
    }
    let version = match &l.version {
        Some(v) => format!("{v} ({})", l.source),
        None => l.source.clone(),
    };
    let runtime = match (&l.runtime, &l.contenders) {
        (Some(rt), Some(c)) => format!("{rt}; {c}"),
        (Some(rt), None) => rt.clone(),
        _ => "–".into(),
    };
    let (p, d) = (&l.peer, &l.distlock);
    let lat = |c: &Option<Latency>, f: fn(&Latency) -> f64| c.as_ref().map(f);
    let (ph, dh) = (p.hot.as_ref(), d.hot.as_ref());
    vec![
        name(l),
        version,
        runtime,
        server,
        versus(lat(&p.cycle, |c| c.p50_us), lat(&d.cycle, |c| c.p50_us), us),
        versus(lat(&p.cycle, |c| c.p99_us), lat(&d.cycle, |c| c.p99_us), us),
        versus(
            ph.map(|h| h.grants_per_sec),
            dh.map(|h| h.grants_per_sec),
            rate,
        ),
        versus(
            ph.map(|h| h.handoff.p50_us),
            dh.map(|h| h.handoff.p50_us),
            us,
        ),
        versus(
            ph.map(|h| h.handoff.p99_us),
            dh.map(|h| h.handoff.p99_us),
            us,
        ),
        beside(
            ph.and_then(|h| h.self_regrant_share),
            dh.and_then(|h| h.self_regrant_share),
            percent,
        ),
        beside(ph.map(|h| h.jain), dh.map(|h| h.jain), two_decimals),
        versus(lat(&p.wake, |w| w.p50_us), lat(&d.wake, |w| w.p50_us), us),
    ]
}

pub(super) fn section(r: &Results, doc: &mut Vec<Block>) {
    if r.libraries.is_empty() {
        return;
    }
    let hot_s = r
        .libraries
        .iter()
        .filter_map(|l| l.peer.hot.as_ref())
        .map(|h| h.grants as f64 / h.grants_per_sec.max(1e-9))
        .next();
    let hot_for = hot_s.map_or(String::new(), |s| format!(" (about {s:.0} s)"));
    let share = 100.0 / CONTENDERS as f64;
    let vars: template::Vars = &[
        ("contenders", &CONTENDERS),
        ("hot_for", &hot_for),
        ("share", &share),
    ];
    doc.extend(template::blocks("libraries", vars));
    let rows = r.libraries.iter().map(row).collect();
    doc.push(table(
        &[
            "Library",
            "Version (source)",
            "Runtime; contenders",
            "Server",
            "Cycle p50",
            "Cycle p99",
            "Grants/s, 8 contenders",
            "Hand-off p50",
            "Hand-off p99",
            "Self-regrant",
            "Jain",
            "Wake-up p50",
        ],
        rows,
    ));
    let mut notes: Vec<String> = r
        .libraries
        .iter()
        .filter(|l| l.skipped.is_none())
        .map(|l| format!("{}: {}.", name(l), l.note))
        .collect();
    for l in &r.libraries {
        if let Some(h) = l.peer.hot.as_ref().filter(|h| h.exclusion_violations > 0) {
            notes.push(format!(
                "{}: **{} grant(s) while another contender held the lock** (mutual exclusion \
                 violated).",
                name(l),
                h.exclusion_violations
            ));
        }
        for e in &l.errors {
            notes.push(format!(
                "{} {}: **not measured**: {}",
                name(l),
                e.scenario,
                e.error
            ));
        }
    }
    notes.push(template::text("libraries-zk", &[]));
    doc.push(Block::List(notes));
}

pub(super) fn peers(r: &Results, doc: &mut Vec<Block>) {
    if r.peers.is_empty() {
        return;
    }
    doc.extend(template::blocks("peers", &[]));
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for p in &r.peers {
        let ours_name = p.distlock_name();
        match (&p.distlock_cycle, &p.peer_cycle) {
            (Some(ours), Some(theirs)) => rows.push(vec![
                format!("{ours_name} vs {}", p.peer),
                us(ours.p50_us),
                us(ours.p99_us),
                rate(p.distlock_per_sec),
                us(theirs.p50_us),
                us(theirs.p99_us),
                rate(p.peer_per_sec),
                ratio(ours.p50_us / theirs.p50_us),
            ]),
            _ => rows.push(vec![
                format!("{ours_name} vs {}", p.peer),
                format!(
                    "not measured: {}",
                    p.error.clone().unwrap_or_else(|| "no result".into())
                ),
            ]),
        }
        notes.push(format!("**{ours_name} vs {}:** {}.", p.peer, p.note));
    }
    doc.push(table(
        &[
            "Comparison",
            "distlock p50",
            "distlock p99",
            "distlock cycles/s",
            "peer p50",
            "peer p99",
            "peer cycles/s",
            "distlock ÷ peer (p50)",
        ],
        rows,
    ));
    doc.push(Block::List(notes));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HotLevel, LibraryMeasures};
    use crate::render::content::build;
    use crate::render::markup::markdown;

    fn latency(p50_us: f64, p99_us: f64) -> Latency {
        Latency {
            count: 100,
            mean_us: p50_us,
            p50_us,
            p99_us,
            p999_us: p99_us,
            max_us: p99_us,
        }
    }

    fn hot(grants_per_sec: f64, p50: f64, p99: f64, share: f64, jain: f64) -> HotLevel {
        HotLevel {
            clients: 8,
            grants: (grants_per_sec * 3.0) as u64,
            grants_per_sec,
            handoff: latency(p50, p99),
            release: None,
            wait: latency(p50, p99),
            longest_wait_ms: 1.0,
            jain,
            grants_min: 1,
            grants_max: 2,
            exclusion_violations: 0,
            self_regrant_share: Some(share),
            server_requests_per_grant: None,
            server_syncs: None,
            cpu_busy: None,
        }
    }

    fn example() -> Results {
        let json = include_str!("../../report/results.json");
        let mut r: Results = serde_json::from_str(json).expect("results.json parses");
        r.libraries = vec![
            LibraryResult {
                id: "curator".into(),
                library: "Apache Curator InterProcessMutex".into(),
                version: Some("5.4.0".into()),
                source: "Debian libcurator-recipes-java 5.4.0-3".into(),
                runtime: Some("Java 17.0.15".into()),
                contenders: Some("threads".into()),
                against: "zk".into(),
                server: Some("ZooKeeper 3.8.0".into()),
                skipped: None,
                note: "acquire + release".into(),
                peer: LibraryMeasures {
                    cycle: Some(latency(1000.0, 2000.0)),
                    cycles_per_sec: 1000.0,
                    hot: Some(hot(500.0, 1000.0, 4000.0, 0.125, 1.0)),
                    wake: Some(latency(2000.0, 3000.0)),
                },
                distlock: LibraryMeasures {
                    cycle: Some(latency(800.0, 1800.0)),
                    cycles_per_sec: 1250.0,
                    hot: Some(hot(1500.0, 700.0, 1100.0, 0.0, 1.0)),
                    wake: Some(latency(1200.0, 1500.0)),
                },
                errors: Vec::new(),
            },
            LibraryResult {
                id: "redis-py".into(),
                library: "redis-py Lock".into(),
                version: None,
                source: "PyPI".into(),
                runtime: None,
                contenders: None,
                against: "redis".into(),
                server: None,
                skipped: Some("not installed (scripts/bench installs it)".into()),
                note: String::new(),
                peer: LibraryMeasures::default(),
                distlock: LibraryMeasures::default(),
                errors: Vec::new(),
            },
        ];
        r
    }

    #[test]
    fn each_cell_shows_library_distlock_and_the_quotient() {
        let md = markdown(&build(&example()));
        assert!(md.contains("## 8. Libraries on the same servers"), "{md}");
        assert!(
            md.contains(
                "| **Apache Curator InterProcessMutex** | 5.4.0 (Debian libcurator-recipes-java \
                 5.4.0-3) | Java 17.0.15; threads | ZooKeeper 3.8.0 (distlock-zk) | 1.00 ms vs \
                 800 µs (0.80×) | 2.00 ms vs 1.80 ms (0.90×) | 500/s vs 1.5k/s (3.00×) | \
                 1.00 ms vs 700 µs (0.70×) | 4.00 ms vs 1.10 ms (0.28×) | 12% vs 0% | 1.00 vs \
                 1.00 | 2.00 ms vs 1.20 ms (0.60×) |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| **redis-py Lock** | PyPI | – | Redis (distlock-redis) | **skipped**: not \
                 installed (scripts/bench installs it) |"
            ),
            "{md}"
        );
        assert!(md.contains("(about 3 s)"), "{md}");
    }

    #[test]
    fn a_peer_row_names_the_distlock_side_it_was_measured_against() {
        let mut r = example();
        r.peers = vec![crate::model::PeerResult {
            peer: "sqlx 0.9 PgAdvisoryLock".into(),
            against: "postgres".into(),
            peer_cycle: Some(latency(20.0, 40.0)),
            peer_per_sec: 40_000.0,
            distlock_cycle: Some(latency(360.0, 900.0)),
            distlock_per_sec: 2_500.0,
            note: "what each sends".into(),
            distlock: Some("distlock-postgres (advisory mode)".into()),
            error: None,
            server_us_per_cycle: None,
        }];
        let md = markdown(&build(&r));
        assert!(md.contains("## 7. Rust crates on the same servers"), "{md}");
        assert!(
            md.contains(
                "| distlock-postgres (advisory mode) vs sqlx 0.9 PgAdvisoryLock | 360 µs | 900 µs \
                 | 2.5k/s | 20 µs | 40 µs | 40k/s | 18.00× |"
            ),
            "{md}"
        );
        assert!(
            md.contains("**distlock-postgres (advisory mode) vs sqlx 0.9 PgAdvisoryLock:** what each sends."),
            "{md}"
        );
    }
}
