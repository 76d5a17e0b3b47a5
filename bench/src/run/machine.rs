//! Reads the machine the run happened on, the date, and this process's resident memory — read from
//! `/proc` (Linux, where the servers run) with a fallback of "unknown" elsewhere.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::Machine;

impl Machine {
    pub(crate) fn collect() -> Self {
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let memory_bytes = kb_field(&read("/proc/meminfo"), "MemTotal:").unwrap_or(0);
        let distro = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string());
        let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
        let os = match (distro, kernel.is_empty()) {
            (Some(d), false) => format!("{d}, Linux {kernel}"),
            (Some(d), true) => d,
            (None, false) => format!("Linux {kernel}"),
            (None, true) => std::env::consts::OS.to_string(),
        };
        let load_at_start = read("/proc/loadavg")
            .split_whitespace()
            .next()
            .unwrap_or("unknown")
            .to_string();
        Self {
            cpu,
            cores,
            memory_bytes,
            os,
            load_at_start,
        }
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A `Name:   1234 kB` field of a `/proc` status-like file, in bytes.
fn kb_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line[field.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// This process's resident set size, from `/proc/self/status` (0 where there is none).
pub(crate) fn rss_bytes() -> u64 {
    kb_field(&read("/proc/self/status"), "VmRSS:").unwrap_or(0)
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm: a date crate for one timestamp is not worth it.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_format_like_rfc3339() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_767_225_599), "2025-12-31T23:59:59Z");
    }

    #[test]
    fn kb_fields_parse_to_bytes() {
        let status = "Name:\tx\nVmRSS:\t   2048 kB\nThreads: 3\n";
        assert_eq!(kb_field(status, "VmRSS:"), Some(2 * 1024 * 1024));
        assert_eq!(kb_field(status, "VmHWM:"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_a_resident_size() {
        assert!(rss_bytes() > 0);
    }
}
