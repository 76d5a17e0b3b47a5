//! Turns [`Results`] into `report.md`, `report.html`, `results.json` and `readme-snippet.md`.
//! It reads the [model](crate::model) only, so a committed `results.json` renders the same
//! report as the run that wrote it.
//!
//! The report is built once as a list of blocks (headings, paragraphs, tables, charts) and
//! rendered twice, so the Markdown and the HTML can never disagree. Inline text uses a tiny
//! Markdown subset (`code` and **bold**) that the HTML renderer translates.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::Res;
use crate::model::{BackendResult, LibraryResult, PausedMaster, Results, Status, CONTENDERS};

mod content;
mod format;
mod goals;
mod libraries;
mod markup;
mod prims;
mod readme;
mod sections;
mod svg;
mod template;

use content::build;
use format::{rate, ratio, us};
use markup::{html, markdown};

/// One piece of the report, rendered alike in Markdown and HTML.
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

/// A table block with the column heads `head`.
fn table(head: &[&str], rows: Vec<Vec<String>>) -> Block {
    Block::Table {
        head: head.iter().map(|s| s.to_string()).collect(),
        rows,
    }
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
    put("readme-snippet.md", readme::snippet(results))?;
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
                "{:<18} cycle p50 {} vs {} {}",
                p.peer,
                us(theirs.p50_us),
                p.distlock_name(),
                us(ours.p50_us)
            ));
        }
    }
    lines.extend(r.libraries.iter().map(library_line));
    lines
}

/// One line for the terminal.
pub(crate) fn library_line(r: &LibraryResult) -> String {
    let name = format!(
        "{}{}",
        r.library,
        r.version
            .as_ref()
            .map_or(String::new(), |v| format!(" {v}"))
    );
    if let Some(reason) = &r.skipped {
        return format!("{name:<40} skipped: {reason}");
    }
    let mut s = format!("{name:<40}");
    if let (Some(p), Some(d)) = (&r.peer.cycle, &r.distlock.cycle) {
        s.push_str(&format!(
            " cycle p50 {} (distlock-{} {})",
            us(p.p50_us),
            r.against,
            us(d.p50_us)
        ));
    }
    if let Some(h) = &r.peer.hot {
        s.push_str(&format!(
            ", {CONTENDERS} contenders {} hand-off p50 {}",
            rate(h.grants_per_sec),
            us(h.handoff.p50_us)
        ));
    }
    if let Some(w) = &r.peer.wake {
        s.push_str(&format!(", wake-up p50 {}", us(w.p50_us)));
    }
    if !r.errors.is_empty() {
        s.push_str(&format!(", {} measurement(s) failed", r.errors.len()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed example report, with `f` applied to its RedLock result.
    fn example_with(f: impl FnOnce(&mut BackendResult)) -> Results {
        let json = include_str!("../../report/results.json");
        let mut r: Results = serde_json::from_str(json).expect("results.json parses");
        f(r.backends
            .iter_mut()
            .find(|b| b.id == "redlock")
            .expect("the example report has RedLock"));
        r
    }

    #[test]
    fn every_placeholder_of_the_template_is_filled() {
        let mut r = example_with(|_| {});
        r.meta.mode = "quick".into();
        let md = markdown(&build(&r));
        assert!(md.contains("**This is a quick or debug run**"), "{md}");
        assert!(!md.contains("{{"), "{md}");
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
        let l = |p50_us| crate::model::Latency {
            count: 10,
            p50_us,
            ..Default::default()
        };
        let r = example_with(|b| {
            b.paused_master = Some(PausedMaster::Measured(Box::new(
                crate::model::PausedCycles {
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
}
