//! Hand-written SVG charts for `report.html`. Two chart kinds cover the report (grouped
//! horizontal bars, lines over a few x values), both on a log axis because the backends span
//! four orders of magnitude. Writing them directly keeps the report self-contained and the
//! build free of a plotting stack and its font dependencies.

use std::fmt::Write;

/// One named series of values, `None` where there is no measurement.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) values: Vec<Option<f64>>,
}

/// How an axis value is printed.
pub(crate) type Format = fn(f64) -> String;

const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#edc948", "#9c755f",
];
const FONT: &str = "font-family=\"system-ui, sans-serif\" font-size=\"12\"";

/// A log10 axis over the values, widened to whole decades.
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl LogAxis {
    fn over<'a>(values: impl Iterator<Item = &'a Option<f64>>) -> Option<Self> {
        let positive: Vec<f64> = values.flatten().copied().filter(|v| *v > 0.0).collect();
        let min = positive.iter().copied().fold(f64::INFINITY, f64::min);
        let max = positive.iter().copied().fold(0.0, f64::max);
        if positive.is_empty() {
            return None;
        }
        let lo = min.log10().floor();
        let hi = max.log10().ceil().max(lo + 1.0);
        Some(Self { lo, hi })
    }

    /// Position of `v` in 0..=1.
    fn frac(&self, v: f64) -> f64 {
        ((v.max(f64::MIN_POSITIVE).log10() - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }

    fn decades(&self) -> impl Iterator<Item = f64> + '_ {
        (self.lo as i32..=self.hi as i32).map(|e| 10f64.powi(e))
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn legend(out: &mut String, series: &[Series], x: f64, y: f64) {
    let mut cx = x;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let _ = write!(
            out,
            r#"<rect x="{cx:.1}" y="{:.1}" width="10" height="10" fill="{color}"/><text x="{:.1}" y="{:.1}" {FONT}>{}</text>"#,
            y - 9.0,
            cx + 14.0,
            y,
            esc(&s.name)
        );
        cx += 24.0 + 7.0 * s.name.chars().count() as f64;
    }
}

/// Grouped horizontal bars: one group per category, one bar per series, log-scaled.
pub(crate) fn bars(title: &str, categories: &[String], series: &[Series], fmt: Format) -> String {
    let Some(axis) = LogAxis::over(series.iter().flat_map(|s| s.values.iter())) else {
        return String::new();
    };
    let (width, left, right, top) = (820.0, 150.0, 90.0, 56.0);
    let bar_h = 13.0;
    let group_h = series.len() as f64 * (bar_h + 2.0) + 12.0;
    let plot_w = width - left - right;
    let height = top + group_h * categories.len() as f64 + 30.0;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height:.0}" width="{width}" height="{height:.0}" role="img" aria-label="{t}"><text x="{left}" y="18" {FONT} font-size="15" font-weight="600">{t}</text>"#,
        t = esc(title)
    );
    legend(&mut out, series, left, 40.0);
    let bottom = height - 30.0;
    for d in axis.decades() {
        let x = left + axis.frac(d) * plot_w;
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{bottom:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" {FONT} text-anchor="middle" fill="#555">{}</text>"##,
            bottom + 16.0,
            esc(&fmt(d))
        );
    }
    for (ci, cat) in categories.iter().enumerate() {
        let gy = top + ci as f64 * group_h + 6.0;
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" {FONT} text-anchor="end">{}</text>"#,
            left - 8.0,
            gy + group_h / 2.0 - 4.0,
            esc(cat)
        );
        for (si, s) in series.iter().enumerate() {
            let Some(v) = s.values.get(ci).copied().flatten() else {
                continue;
            };
            let y = gy + si as f64 * (bar_h + 2.0);
            let w = (axis.frac(v) * plot_w).max(1.0);
            let color = PALETTE[si % PALETTE.len()];
            let _ = write!(
                out,
                r#"<rect x="{left}" y="{y:.1}" width="{w:.1}" height="{bar_h}" fill="{color}"><title>{}: {}</title></rect><text x="{:.1}" y="{:.1}" {FONT} font-size="11">{}</text>"#,
                esc(&format!("{cat}, {}", s.name)),
                esc(&fmt(v)),
                left + w + 4.0,
                y + bar_h - 2.5,
                esc(&fmt(v))
            );
        }
    }
    out.push_str("</svg>");
    out
}

/// Lines over a few x values (evenly spaced, labelled), log-scaled y.
pub(crate) fn lines(
    title: &str,
    x_label: &str,
    xs: &[String],
    series: &[Series],
    fmt: Format,
) -> String {
    let Some(axis) = LogAxis::over(series.iter().flat_map(|s| s.values.iter())) else {
        return String::new();
    };
    let (width, height, left, right, top, bottom) = (820.0, 380.0, 80.0, 30.0, 56.0, 330.0);
    let plot_w = width - left - right;
    let x_at = |i: usize| left + plot_w * (i as f64 + 0.5) / xs.len().max(1) as f64;
    let y_at = |v: f64| bottom - axis.frac(v) * (bottom - top);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{t}"><text x="{left}" y="18" {FONT} font-size="15" font-weight="600">{t}</text>"#,
        t = esc(title)
    );
    legend(&mut out, series, left, 40.0);
    for d in axis.decades() {
        let y = y_at(d);
        let _ = write!(
            out,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" {FONT} text-anchor="end" fill="#555">{}</text>"##,
            width - right,
            left - 6.0,
            y + 4.0,
            esc(&fmt(d))
        );
    }
    for (i, x) in xs.iter().enumerate() {
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" {FONT} text-anchor="middle" fill="#555">{}</text>"##,
            x_at(i),
            bottom + 18.0,
            esc(x)
        );
    }
    let _ = write!(
        out,
        r##"<text x="{:.1}" y="{:.1}" {FONT} text-anchor="middle" fill="#555">{}</text>"##,
        left + plot_w / 2.0,
        bottom + 38.0,
        esc(x_label)
    );
    for (si, s) in series.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        let points: Vec<(f64, f64, f64)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.filter(|v| *v > 0.0).map(|v| (x_at(i), y_at(v), v)))
            .collect();
        let path: Vec<String> = points
            .iter()
            .map(|(x, y, _)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = write!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for (x, y, v) in points {
            let _ = write!(
                out,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}"><title>{}: {}</title></circle>"#,
                esc(&s.name),
                esc(&fmt(v))
            );
        }
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(v: f64) -> String {
        format!("{v}")
    }

    #[test]
    fn bars_draw_one_rect_per_value_and_escape_text() {
        let svg = bars(
            "a <b>",
            &["x".into(), "y&z".into()],
            &[Series {
                name: "s".into(),
                values: vec![Some(10.0), None],
            }],
            fmt,
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<rect x=\"150\"").count(), 1);
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("y&amp;z"));
    }

    #[test]
    fn charts_without_values_are_empty() {
        let empty = [Series {
            name: "s".into(),
            values: vec![None],
        }];
        assert!(bars("t", &["x".into()], &empty, fmt).is_empty());
        assert!(lines("t", "x", &["1".into()], &empty, fmt).is_empty());
    }

    #[test]
    fn log_axis_spans_whole_decades() {
        let axis = LogAxis::over([Some(3.0), Some(420.0), None].iter()).unwrap();
        assert_eq!((axis.lo, axis.hi), (0.0, 3.0));
        assert!((axis.frac(10.0) - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(axis.decades().count(), 4);
    }
}
