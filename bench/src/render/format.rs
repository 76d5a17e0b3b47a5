//! Numbers as the report and the README print them.

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

pub(crate) fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

pub(crate) fn ratio(v: f64) -> String {
    if v.is_finite() && v > 0.0 {
        format!("{v:.2}×")
    } else {
        "–".into()
    }
}

pub(crate) fn or_dash<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| "–".into(), f)
}

/// A signed time difference: `+3 µs`, `−2 µs`.
pub(crate) fn signed_us(v: f64) -> String {
    let sign = if v < 0.0 { "−" } else { "+" };
    format!("{sign}{}", us(v.abs()))
}

/// The plural ending for `n` things.
pub(crate) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A goal's verdict, in words, not emoji: they read the same in every terminal, font and
/// Markdown renderer.
pub(super) fn mark(ok: bool) -> &'static str {
    if ok {
        "**met**:"
    } else {
        "**missed**:"
    }
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
}
