//! The report's goals: each run judged against the thresholds of `goals.toml`, with what the
//! run measured of a missed goal's causes.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::model::{BackendResult, Results, Status, SLOW_SYNC_MS};
use crate::render::format::{or_dash, rate, ratio, signed_us, us};

use super::format::mark;
use super::{template, Block};

/// The thresholds of `goals.toml`.
struct Goals {
    ratio: f64,
    ratio_backends: Vec<String>,
    in_process_cycle_us: f64,
    wake_round_trips: f64,
    wake_in_process_us: f64,
    poll_wake_us: f64,
    redlock_vs_rslock: f64,
    redis_vs_rslock: f64,
    etcd_handoff_p99_us: f64,
    etcd_grants_per_sec: f64,
    same_handle_round_trips: f64,
    permit_vs_peer: f64,
    failover_vs_peer: f64,
}

/// A value of `goals.toml`: a number or a list of strings.
enum Value {
    Number(f64),
    Strings(Vec<String>),
}

/// `goals.toml`, read once. It is compiled in, so a malformed file fails every rendering test.
fn thresholds() -> &'static Goals {
    static GOALS: OnceLock<Goals> = OnceLock::new();
    GOALS.get_or_init(|| {
        let mut values = parse(include_str!("goals.toml"));
        let mut num = |key: &str| match values.remove(key) {
            Some(Value::Number(n)) => n,
            _ => panic!("goals.toml: {key} must be a number"),
        };
        Goals {
            ratio: num("uncontended.ratio"),
            in_process_cycle_us: num("uncontended.in_process_us"),
            wake_round_trips: num("wake.round_trips"),
            wake_in_process_us: num("wake.in_process_us"),
            poll_wake_us: num("wake.poll_us"),
            redlock_vs_rslock: num("peers.redlock_vs_rslock"),
            redis_vs_rslock: num("peers.redis_vs_rslock"),
            etcd_handoff_p99_us: num("etcd_hot.handoff_p99_us"),
            etcd_grants_per_sec: num("etcd_hot.grants_per_sec"),
            same_handle_round_trips: num("same_handle.round_trips"),
            permit_vs_peer: num("primitives.permit_vs_peer"),
            failover_vs_peer: num("primitives.failover_vs_peer"),
            ratio_backends: match values.remove("uncontended.backends") {
                Some(Value::Strings(v)) => v,
                _ => panic!("goals.toml: uncontended.backends must be a list of names"),
            },
        }
    })
}

/// The little TOML the file uses: `[section]` lines, and `key = number` or
/// `key = ["name", ...]` under them, keyed `section.key`.
fn parse(text: &str) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    let mut section = "";
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            panic!("goals.toml: not `key = value`: {line}");
        };
        let value = value.trim();
        let value = match value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
            Some(list) => Value::Strings(
                list.split(',')
                    .map(|s| s.trim().trim_matches('"').to_string())
                    .filter(|s| !s.is_empty())
                    .collect(),
            ),
            None => Value::Number(
                value
                    .parse()
                    .unwrap_or_else(|_| panic!("goals.toml: not a number: {line}")),
            ),
        };
        out.insert(format!("{section}.{}", key.trim()), value);
    }
    out
}

pub(super) fn section(r: &Results, doc: &mut Vec<Block>) {
    let g = thresholds();
    doc.extend(template::blocks("goals", &[]));
    let mut items = Vec::new();
    for id in &g.ratio_backends {
        let Some(b) = r.backends.iter().find(|b| &b.id == id) else {
            continue;
        };
        items.push(match (&b.status, &b.uncontended) {
            (Status::Available { .. }, Some(u)) => format!(
                "{} **{}** uncontended cycle within {}× of its floor: {} ({} vs {}, \
                 {} per cycle; the backend's primitives alone, without guard and watchdog: {}).",
                mark(u.ratio_p50 <= g.ratio),
                b.label,
                g.ratio,
                ratio(u.ratio_p50),
                us(u.cycle.p50_us),
                us(u.floor.p50_us),
                signed_us(u.overhead_p50_us),
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
    if let Some((b, u)) = r
        .available()
        .find(|b| b.id == "memory")
        .and_then(|b| Some((b, b.uncontended.as_ref()?)))
    {
        items.push(format!(
            "{} **{}** uncontended cycle under {}: {}.",
            mark(u.cycle.p50_us <= g.in_process_cycle_us),
            b.label,
            us(g.in_process_cycle_us),
            us(u.cycle.p50_us)
        ));
    }
    for b in r
        .available()
        .filter(|b| b.blocking.as_deref() == Some("notify"))
    {
        let Some(w) = &b.wake else { continue };
        let in_process = b.id == "memory";
        let line = match (in_process, w.idle_round_trips_p50, w.round_trips_p50) {
            (true, _, _) => format!(
                "{} **{}** (notify) wake-up p50 {} — in-process, well under any polling step.",
                mark(w.latency.p50_us <= g.wake_in_process_us),
                b.label,
                us(w.latency.p50_us)
            ),
            (false, Some(idle), busy) => format!(
                "{} **{}** (notify) wake-up p50 {} ≈ {idle:.1} round trips of an idle client \
                 (goal: a few, at most {}; the raw floor after the same \
                 idle delay takes {}){}{}.",
                mark(idle <= g.wake_round_trips),
                b.label,
                us(w.latency.p50_us),
                g.wake_round_trips,
                or_dash(w.idle_floor, |f| us(f.p50_us)),
                or_dash(busy, |x| format!("; ≈ {x:.1} busy-loop round trips")),
                warm_handoff(b)
            ),
            (false, None, Some(rts)) => format!(
                "{} **{}** (notify) wake-up p50 {} ≈ {rts:.1} round trips (goal: a few, at \
                 most {}){}.",
                mark(rts <= g.wake_round_trips),
                b.label,
                us(w.latency.p50_us),
                g.wake_round_trips,
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
    items.extend(speed_goals(r));
    items.extend(super::prims::goals(r, g.permit_vs_peer, g.failover_vs_peer));
    if items.is_empty() {
        items.push("Nothing measured.".into());
    }
    doc.push(Block::List(items));
}

/// Peers' cycles, etcd's hot lock, same-handle hand-offs and wake-ups of polling backends.
fn speed_goals(r: &Results) -> Vec<String> {
    let g = thresholds();
    let cores = r.meta.machine.cores;
    let mut items = Vec::new();
    for (against, goal) in [
        ("redlock", g.redlock_vs_rslock),
        ("redis", g.redis_vs_rslock),
    ] {
        let Some(p) = r.peers.iter().find(|p| p.against == against) else {
            continue;
        };
        let (Some(ours), Some(theirs)) = (&p.distlock_cycle, &p.peer_cycle) else {
            continue;
        };
        let x = ours.p50_us / theirs.p50_us;
        let cause = match (&p.server_us_per_cycle, x <= goal, against) {
            (Some((o, t)), false, which) => {
                let part = format!("cause-{which}");
                let (o, t) = (format!("{o:.1}"), format!("{t:.1}"));
                let vars: template::Vars = &[("ours", &o), ("theirs", &t), ("cores", &cores)];
                format!(" {}", template::text(&part, vars))
            }
            _ => String::new(),
        };
        items.push(format!(
            "{} **{}** cycle within {goal}× of {}: {} ({} vs {}).{cause}",
            mark(x <= goal),
            p.against,
            p.peer,
            ratio(x),
            us(ours.p50_us),
            us(theirs.p50_us)
        ));
    }
    if let Some(b) = r.available().find(|b| b.id == "etcd") {
        if let Some(h) = b.hot.iter().find(|h| h.clients == 8) {
            let met = h.handoff.p99_us <= g.etcd_handoff_p99_us
                && h.grants_per_sec >= g.etcd_grants_per_sec;
            // What the run measured of a missed goal's causes: the server's slow log syncs (a
            // hand-off waits for the release's commit), the requests per grant, and how busy
            // the machine's CPUs were (clients and server share them).
            let cause = if met {
                String::new()
            } else {
                let mut parts = Vec::new();
                if let Some((syncs, slow)) = h.server_syncs.filter(|(n, _)| *n > 0) {
                    let share = format!("{:.2}", 100.0 * slow as f64 / syncs as f64);
                    let vars: template::Vars = &[
                        ("syncs", &syncs),
                        ("slow", &slow),
                        ("share", &share),
                        ("slow_ms", &SLOW_SYNC_MS),
                    ];
                    parts.push(template::text("etcd-syncs", vars));
                }
                if let Some(n) = h.server_requests_per_grant {
                    let n = format!("{n:.1}");
                    parts.push(template::text("etcd-requests", &[("n", &n)]));
                }
                if let Some(busy) = h.cpu_busy {
                    let busy = format!("{:.0}", 100.0 * busy);
                    let vars: template::Vars = &[("busy", &busy), ("cores", &cores)];
                    parts.push(template::text("etcd-cpu", vars));
                }
                if parts.is_empty() {
                    String::new()
                } else {
                    format!(" Measured: {}.", parts.join("; "))
                }
            };
            items.push(format!(
                "{} **etcd** hot lock, 8 contenders: hand-off p99 {} (goal ≤ {}), {} (goal ≥ \
                 {}).{cause}",
                mark(met),
                us(h.handoff.p99_us),
                us(g.etcd_handoff_p99_us),
                rate(h.grants_per_sec),
                rate(g.etcd_grants_per_sec)
            ));
        }
    }
    for b in r.available() {
        let (Some(h), Some(u)) = (&b.hot_one_handle, &b.uncontended) else {
            continue;
        };
        if b.id == "memory" {
            continue;
        }
        let rts = h.handoff.p50_us / u.round_trip_us();
        let met = rts <= g.same_handle_round_trips;
        // The measured cause of a miss. What a hand-off sends is fixed by the backend (each
        // backend's round-trip test checks it through a counting proxy); what it costs beyond
        // that is the server's time per request, which the uncontended cycle shows against the
        // floor's (both the same number of requests: an acquire and a release).
        let sends = matches!(
            b.id.as_str(),
            "redis" | "redlock" | "mysql" | "mongo" | "zk" | "etcd"
        )
        .then(|| template::text(&format!("sends-{}", b.id), &[]));
        // Where a hand-off's time goes: the release call (its request, whose reply grants the
        // waiting task on a hand-over backend, or whose deletion event is the waiter's turn),
        // against the floor's bare release on the same server; the rest is the waiting task's
        // wake-up.
        let split = match (&h.release, &u.floor_release) {
            (Some(rel), Some(bare)) => {
                let after = h.handoff.p50_us - rel.p50_us;
                format!(
                    " The release call took {} at p50, ≈ {:.1} round trips (the floor's bare \
                     release: {}); {}.",
                    us(rel.p50_us),
                    rel.p50_us / u.round_trip_us(),
                    us(bare.p50_us),
                    if after > 0.0 {
                        format!(
                            "the waiting task held the lock {} after it, by the medians",
                            us(after)
                        )
                    } else {
                        "by the medians, the waiting task held the lock before it returned (its \
                         event or reply came first)"
                            .to_string()
                    }
                )
            }
            _ => String::new(),
        };
        // Why the release call costs more than the floor's, where the backend's request is
        // known to do more (what each sends is checked request by request in its tests).
        // Said for ZooKeeper only where the run shows it: the release call well above the bare
        // delete.
        let session_bound = h
            .release
            .zip(u.floor_release)
            .is_some_and(|(rel, bare)| rel.p50_us > 1.2 * bare.p50_us);
        let why = match b.id.as_str() {
            "mysql" => format!(" {}", template::text("why-mysql", &[])),
            "zk" if session_bound => format!(" {}", template::text("why-zk", &[])),
            _ => String::new(),
        };
        let cause = match (met, sends) {
            (false, Some(sends)) => {
                let counted = h.server_requests_per_grant.map_or(String::new(), |n| {
                    format!(
                        " (The server counted {n:.1} requests per grant over the run, renewals, \
                         re-queueing and the client's pings included{}.)",
                        if b.id == "mysql" {
                            "; MariaDB's count is of statements"
                        } else {
                            ""
                        }
                    )
                });
                if split.is_empty() {
                    format!(
                        " Measured: a hand-off sends {sends}; the time beyond is the server's: \
                         this backend's uncontended cycle takes {} the floor's with as many \
                         requests, and its writes are the ones a hand-off waits for.{counted}",
                        ratio(u.ratio_p50)
                    )
                } else {
                    format!(" Measured: a hand-off sends {sends}.{split}{why}{counted}")
                }
            }
            _ => split,
        };
        items.push(format!(
            "{} **{}** hand-off between {} tasks of one handle: p50 {} ≈ {rts:.1} round trips \
             (goal: the release's own and one more, ≤ {}).{cause}",
            mark(met),
            b.label,
            h.clients,
            us(h.handoff.p50_us),
            g.same_handle_round_trips
        ));
    }
    for b in r
        .available()
        .filter(|b| matches!(b.blocking.as_deref(), Some("poll" | "signal")))
    {
        let Some(w) = &b.wake else { continue };
        let met = w.latency.p50_us <= g.poll_wake_us;
        let how = b.blocking.as_deref().unwrap_or("poll");
        let cause = match (met, how) {
            (true, _) => ".".to_string(),
            (false, "signal") => {
                let warm = warm_handoff(b);
                let warm = match warm.is_empty() {
                    true => String::new(),
                    false => format!("{warm} round trips"),
                };
                format!(": {}", template::text("signal-cause", &[("warm", &warm)]))
            }
            (false, _) => format!(": {}", template::text("poll-cause", &[])),
        };
        items.push(format!(
            "{} **{}** ({how}) wake-up of a waiter in another client p50 {} (goal ≤ {}){cause}",
            mark(met),
            b.label,
            us(w.latency.p50_us),
            us(g.poll_wake_us),
        ));
    }
    items
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Latency;

    fn p50(us: f64) -> Latency {
        Latency {
            count: 100,
            mean_us: us,
            p50_us: us,
            p99_us: us,
            p999_us: us,
            max_us: us,
        }
    }

    /// The committed results with one backend's same-handle hand-off, release call and bare
    /// floor release set, and the goal line the report prints for it.
    fn same_handle_line(id: &str, handoff: f64, release: f64, bare: f64) -> String {
        let mut r: Results =
            serde_json::from_str(include_str!("../../report/results.json")).unwrap();
        let b = r.backends.iter_mut().find(|b| b.id == id).unwrap();
        let u = b.uncontended.as_mut().unwrap();
        u.floor = p50(200.0);
        u.floor_round_trips = 2;
        u.floor_release = Some(p50(bare));
        let h = b.hot_one_handle.as_mut().unwrap();
        h.handoff = p50(handoff);
        h.release = Some(p50(release));
        let label = b.label.clone();
        speed_goals(&r)
            .into_iter()
            .find(|l| l.contains(&format!("**{label}** hand-off between")))
            .unwrap()
    }

    #[test]
    fn a_missed_same_handle_goal_splits_the_hand_off_at_the_release_call() {
        // 100 µs a round trip: 360 µs is 3.6 of them, the release call 3.4 against 150 µs bare.
        let line = same_handle_line("mysql", 360.0, 340.0, 150.0);
        assert!(line.starts_with("**missed**:"), "{line}");
        assert!(
            line.contains("The release call took 340 µs at p50, ≈ 3.4 round trips (the floor's bare release: 150 µs); the waiting task held the lock 20 µs after it"),
            "{line}"
        );
        assert!(line.contains("a fresh grant's writes"), "{line}");
    }

    #[test]
    fn a_waiter_granted_before_the_release_returns_is_told_so_and_the_session_cause_needs_the_gap()
    {
        // The release call well above the bare delete: the session's ordering is named.
        let line = same_handle_line("zk", 300.0, 320.0, 100.0);
        assert!(line.starts_with("**missed**:"), "{line}");
        assert!(line.contains("before it returned"), "{line}");
        assert!(
            line.contains("answers one session's requests in order"),
            "{line}"
        );
        // Close to the bare delete: it is not.
        let line = same_handle_line("zk", 300.0, 110.0, 100.0);
        assert!(
            !line.contains("answers one session's requests in order"),
            "{line}"
        );
        // Met: the split is still shown, with no cause.
        let line = same_handle_line("zk", 150.0, 120.0, 100.0);
        assert!(line.starts_with("**met**:"), "{line}");
        assert!(line.contains("The release call took 120 µs") && !line.contains("Measured"));
    }
}
