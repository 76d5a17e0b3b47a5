//! What the report says, in order: its header, summary and goals, the sections built from
//! [`Results`] as [`Block`]s, and the failures.

use crate::model::{Results, Status};
use crate::render::format::{or_dash, plural, rate, ratio, us};

use super::template::{self, blocks};
use super::{goals, libraries, prims, sections, table, Block};

pub(super) fn build(r: &Results) -> Vec<Block> {
    let mut doc = blocks("title", &[]);
    header(r, &mut doc);
    summary(r, &mut doc);
    goals::section(r, &mut doc);
    sections::uncontended(r, &mut doc);
    sections::independent(r, &mut doc);
    sections::hot(r, &mut doc);
    sections::wake(r, &mut doc);
    sections::many(r, &mut doc);
    libraries::peers(r, &mut doc);
    libraries::section(r, &mut doc);
    prims::permits(r, &mut doc);
    prims::failover(r, &mut doc);
    errors(r, &mut doc);
    doc.extend(blocks("method", &[]));
    doc
}

fn header(r: &Results, doc: &mut Vec<Block>) {
    let m = &r.meta;
    let duration = format!("{:.0}", m.duration_s);
    let vars: template::Vars = &[
        ("command", &m.command),
        ("date", &m.date_utc),
        ("mode", &m.mode),
        ("profile", &m.profile),
        ("duration", &duration),
    ];
    doc.extend(blocks("generated", vars));
    if m.mode == "quick" || m.profile == "debug" {
        doc.extend(blocks("quick", &[]));
    }
    let mc = &m.machine;
    let memory = format!("{:.1}", mc.memory_bytes as f64 / (1u64 << 30) as f64);
    let vars: template::Vars = &[
        ("cpu", &mc.cpu),
        ("cores", &mc.cores),
        ("memory", &memory),
        ("os", &mc.os),
        ("load", &mc.load_at_start),
        ("version", &m.version),
    ];
    doc.extend(blocks("machine", vars));
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

fn summary(r: &Results, doc: &mut Vec<Block>) {
    doc.extend(blocks("summary", &[]));
    let rows = r
        .available()
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
    doc.extend(blocks("failed", &[]));
    doc.push(Block::List(items));
}
