//! The benchmark table of `docs/benchmark.md` (linked from the README), generated from a run so
//! the numbers a reader sees are the numbers of the committed example report. Every run writes it
//! to `readme-snippet.md` next to the report; a test keeps the page equal to the snippet of the
//! committed `bench/report/results.json`.

use std::fmt::Write as _;

use crate::model::Results;
use crate::render::format::{rate, ratio, us};

/// The line before the generated block in docs/benchmark.md.
pub(crate) const BEGIN: &str =
    "<!-- bench:begin (generated from bench/report/results.json; paste bench/report/readme-snippet.md) -->";
/// The line after it.
pub(crate) const END: &str = "<!-- bench:end -->";

/// The page's block, [`BEGIN`] and [`END`] lines included.
pub(crate) fn snippet(r: &Results) -> String {
    let mut out = String::new();
    out.push_str(BEGIN);
    out.push('\n');
    out.push_str(
        "| backend | acquire + release p50 | × raw floor | waiter woken after a release, p50 \
         | hand-off, 8 contenders, p50 | 10,000 held locks: renewals, lost |\n\
         |---|---|---|---|---|---|\n",
    );
    for b in r.backends.iter().filter(|b| b.available()) {
        let u = b.uncontended.as_ref();
        let cell = |v: Option<String>| v.unwrap_or_else(|| "–".into());
        let how = match b.blocking.as_deref() {
            Some("notify") => "notified",
            Some("poll") => "polls",
            Some("signal") => "signalled",
            Some(other) => other,
            None => "?",
        };
        let wake = b.wake.as_ref().map(|w| {
            let mut s = format!("{} ({how}", us(w.latency.p50_us));
            if let Some(rt) = w
                .idle_round_trips_p50
                .filter(|_| matches!(how, "notified" | "signalled"))
            {
                let _ = write!(s, ", {rt:.1} idle round trips");
            }
            s + ")"
        });
        let handoff = b
            .hot
            .iter()
            .find(|h| h.clients == 8)
            .map(|h| us(h.handoff.p50_us));
        let many = b.many.as_ref().map(|m| {
            let requests = match m.requests_per_sec {
                Some(q) if q < m.renewals_per_sec * 0.9 => {
                    format!(" in {} requests/s", rate(q).trim_end_matches("/s"))
                }
                _ => String::new(),
            };
            let renewals = if m.expected_per_sec == 0.0 && m.renewals_per_sec == 0.0 {
                "no renewals needed".to_string()
            } else {
                format!("{}{requests}", rate(m.renewals_per_sec))
            };
            format!(
                "{renewals} for {} held, {} lost",
                thousands(m.locks),
                thousands(m.lost)
            )
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            b.label,
            cell(u.map(|u| us(u.cycle.p50_us))),
            cell(u.map(|u| ratio(u.ratio_p50))),
            cell(wake),
            cell(handoff),
            cell(many),
        );
    }
    for p in &r.peers {
        if let (Some(ours), Some(theirs)) = (&p.distlock_cycle, &p.peer_cycle) {
            let _ = writeln!(
                out,
                "\n{} on the same server in the same run: {} a cycle against {}'s {} ({}).",
                p.peer,
                us(theirs.p50_us),
                p.distlock_name(),
                us(ours.p50_us),
                ratio(ours.p50_us / theirs.p50_us)
            );
        }
    }
    let _ = write!(
        out,
        "\nRun of {} ({} mode, `{}`).\n{END}\n",
        r.meta.date_utc, r.meta.mode, r.meta.command
    );
    out
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(7120), "7,120");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }

    /// docs/benchmark.md quotes the committed example report, number for number.
    #[test]
    fn readme_quotes_the_committed_report() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let json = std::fs::read_to_string(format!("{root}/bench/report/results.json"))
            .expect("bench/report/results.json is committed");
        let results: Results = serde_json::from_str(&json).expect("results.json parses");
        assert_eq!(
            results.meta.mode, "full",
            "the example report is a full run"
        );
        let readme = std::fs::read_to_string(format!("{root}/docs/benchmark.md")).unwrap();
        let start = readme
            .find(BEGIN)
            .expect("docs/benchmark.md has the bench:begin marker");
        let end = readme
            .find(END)
            .expect("docs/benchmark.md has the bench:end marker")
            + END.len();
        let quoted = readme[start..end].trim();
        let expected = snippet(&results);
        assert_eq!(
            quoted,
            expected.trim(),
            "docs/benchmark.md's benchmark block differs from bench/report/results.json: paste \
             bench/report/readme-snippet.md over the block"
        );
    }
}
