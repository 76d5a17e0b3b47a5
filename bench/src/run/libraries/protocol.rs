//! The line protocol between the bench and a peer's harness program (bench/peers/README.md):
//! the bench writes one command per line on the harness's stdin, the harness answers each with
//! one JSON object on one line of stdout. Harnesses print raw measurements only — latencies in
//! nanoseconds, per-contender grant counts, a self-regrant count — and this module turns them
//! into the bench's own [`Recorder`]s and [`HotRecord`]s, so every library is summarised by the
//! same code as distlock's backends.

use std::time::Duration;

use serde::Deserialize;

use crate::error::Res;
use crate::run::contention::HotRecord;
use crate::run::scenarios::Measured;
use crate::run::stats::Recorder;

/// One line a harness prints.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Reply {
    /// First, once connected to the server.
    Hello(Hello),
    Cycle(Samples),
    Hot(RawHot),
    Wake(Samples),
    /// An election command (`lead`, `follow`, `observe`, `resign`) did what it says.
    Ok {},
    /// The command failed; the harness goes on reading commands.
    Error(String),
}

/// What the harness says about itself, read at run time from what is installed.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub(crate) struct Hello {
    /// The lock's name, e.g. `Apache Curator InterProcessMutex`.
    pub(crate) library: String,
    pub(crate) version: String,
    /// Language and runtime version.
    pub(crate) runtime: String,
    /// How the contenders run, e.g. `threads, one client each`.
    pub(crate) contenders: String,
}

/// Latencies, in nanoseconds.
#[derive(Debug, Deserialize)]
pub(crate) struct Samples {
    pub(crate) ns: Vec<u64>,
}

/// What a `hot` command measured, raw.
#[derive(Debug, Deserialize)]
pub(crate) struct RawHot {
    /// Grants per contender.
    pub(crate) grants: Vec<u64>,
    /// From a holder calling release to the next grant, ns.
    pub(crate) handoff_ns: Vec<u64>,
    /// From calling acquire to holding the lock, ns, one per grant.
    pub(crate) wait_ns: Vec<u64>,
    /// Hand-offs whose next holder was the contender that had just released.
    pub(crate) self_regrants: u64,
    /// Grants made while another contender believed it held the lock.
    pub(crate) violations: u64,
    /// From the start signal to the last contender stopping, ns.
    pub(crate) elapsed_ns: u64,
}

/// Parses one line of harness output.
pub(crate) fn parse(line: &str) -> Res<Reply> {
    serde_json::from_str(line.trim()).map_err(|e| {
        let shown: String = line.chars().take(200).collect();
        format!("unreadable harness output ({e}): {shown:?}").into()
    })
}

fn recorder(ns: &[u64]) -> Recorder {
    let mut rec = Recorder::new();
    for &n in ns {
        rec.record(Duration::from_nanos(n));
    }
    rec
}

impl Samples {
    /// The latencies as a histogram.
    pub(crate) fn recorder(&self) -> Res<Recorder> {
        if self.ns.is_empty() {
            return Err("the harness measured nothing".into());
        }
        Ok(recorder(&self.ns))
    }

    /// A cycle slice: its latencies, and the time spent running them (their sum).
    pub(crate) fn measured(&self) -> Res<Measured> {
        Ok(Measured {
            latencies: self.recorder()?,
            busy: Duration::from_nanos(self.ns.iter().sum()),
        })
    }
}

impl RawHot {
    /// The record of a run with `clients` contenders, checked for consistency.
    pub(crate) fn record(&self, clients: usize) -> Res<HotRecord> {
        if self.grants.len() != clients {
            return Err(format!(
                "the harness reported {} contenders for {clients}",
                self.grants.len()
            )
            .into());
        }
        let record = HotRecord {
            grants: self.grants.clone(),
            handoff: recorder(&self.handoff_ns),
            release: Recorder::default(),
            wait: recorder(&self.wait_ns),
            self_regrants: self.self_regrants,
            violations: self.violations,
            elapsed: Duration::from_nanos(self.elapsed_ns),
        };
        record
            .check()
            .map_err(|e| format!("inconsistent harness output: {e}"))?;
        Ok(record)
    }
}

/// A lock name as one word of a command line.
fn word(name: &str) -> Res<&str> {
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        return Err(format!("{name:?} cannot be sent to a harness as one word").into());
    }
    Ok(name)
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// `cycle NAME MILLIS`: one client, acquire + release on NAME until MILLIS have passed.
pub(crate) fn cycle_command(name: &str, run: Duration) -> Res<String> {
    Ok(format!("cycle {} {}", word(name)?, ms(run)))
}

/// `permit NAME MAX MILLIS`: one client, take + release one permit of a MAX-permit
/// semaphore on NAME until MILLIS have passed.
pub(crate) fn permit_command(name: &str, max: u32, run: Duration) -> Res<String> {
    Ok(format!("permit {} {max} {}", word(name)?, ms(run)))
}

/// `lead NAME VALUE TTL_MS`, `follow NAME VALUE TTL_MS`: campaign on a session or lease of
/// TTL_MS; `lead` answers once leading, `follow` at once.
pub(crate) fn campaign_command(verb: &str, name: &str, value: &str, ttl: Duration) -> Res<String> {
    Ok(format!(
        "{verb} {} {} {}",
        word(name)?,
        word(value)?,
        ms(ttl)
    ))
}

/// `observe VALUE`: answers when the follower's observer sees VALUE lead.
pub(crate) fn observe_command(value: &str) -> Res<String> {
    Ok(format!("observe {}", word(value)?))
}

/// `hot NAME CLIENTS MILLIS`: CLIENTS contenders on NAME for MILLIS.
pub(crate) fn hot_command(name: &str, clients: usize, run: Duration) -> Res<String> {
    Ok(format!("hot {} {clients} {}", word(name)?, ms(run)))
}

/// `wake PREFIX SAMPLES MIN_MS MAX_MS`: wake-ups on PREFIX-0, PREFIX-1, ...
pub(crate) fn wake_command(prefix: &str, samples: u32, delay: (Duration, Duration)) -> Res<String> {
    Ok(format!(
        "wake {} {samples} {} {}",
        word(prefix)?,
        ms(delay.0),
        ms(delay.1)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_is_read() {
        let line = r#"{"hello":{"library":"Apache Curator InterProcessMutex","version":"5.4.0","runtime":"Java 17.0.15","contenders":"threads"}}"#;
        match parse(line).unwrap() {
            Reply::Hello(h) => {
                assert_eq!(h.library, "Apache Curator InterProcessMutex");
                assert_eq!(h.version, "5.4.0");
                assert_eq!(h.runtime, "Java 17.0.15");
                assert_eq!(h.contenders, "threads");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cycle_samples_become_latencies_and_busy_time() {
        let Reply::Cycle(s) = parse(r#"{"cycle":{"ns":[100000,200000,300000,400000]}}"#).unwrap()
        else {
            panic!("not a cycle reply")
        };
        let m = s.measured().unwrap();
        let l = m.latencies.summary();
        assert_eq!(l.count, 4);
        assert!((l.p50_us - 200.0).abs() < 0.5, "{l:?}");
        assert!((l.max_us - 400.0).abs() < 0.5, "{l:?}");
        assert_eq!(m.busy, Duration::from_millis(1));
        assert!((m.per_sec() - 4000.0).abs() < 1e-6);
        let Reply::Wake(empty) = parse(r#"{"wake":{"ns":[]}}"#).unwrap() else {
            panic!("not a wake reply")
        };
        assert!(empty.recorder().is_err());
    }

    #[test]
    fn hot_output_is_summarised_by_the_bench() {
        // 2 contenders, 6 grants over 1.5 s, 5 hand-offs (1, 2, 3, 4, 5 ms), 4 of them back
        // to the releaser.
        let line = r#"{"hot":{"grants":[5,1],"handoff_ns":[1000000,2000000,3000000,4000000,5000000],
            "wait_ns":[1,2,3,4,5,6],"self_regrants":4,"violations":0,"elapsed_ns":1500000000}}"#;
        let Reply::Hot(raw) = parse(&line.replace('\n', "")).unwrap() else {
            panic!("not a hot reply")
        };
        let h = raw.record(2).unwrap().summary();
        assert_eq!(h.clients, 2);
        assert_eq!(h.grants, 6);
        assert!((h.grants_per_sec - 4.0).abs() < 1e-9);
        assert!((h.handoff.p50_us - 3000.0).abs() < 3.0, "{:?}", h.handoff);
        assert!((h.handoff.p99_us - 5000.0).abs() < 5.0, "{:?}", h.handoff);
        assert_eq!(h.self_regrant_share, Some(0.8));
        // Jain: 6² / (2 × (25 + 1)) = 36 / 52.
        assert!((h.jain - 36.0 / 52.0).abs() < 1e-12);
        assert_eq!((h.grants_min, h.grants_max), (1, 5));
        assert_eq!(h.exclusion_violations, 0);
        assert!(
            raw.record(8).is_err(),
            "contender count must match the command"
        );
    }

    #[test]
    fn inconsistent_or_unreadable_output_is_an_error() {
        let line = r#"{"hot":{"grants":[1,1],"handoff_ns":[5,5,5],"wait_ns":[1,1],"self_regrants":0,"violations":0,"elapsed_ns":10}}"#;
        let Reply::Hot(raw) = parse(line).unwrap() else {
            panic!("not a hot reply")
        };
        assert!(raw.record(2).is_err());
        assert!(parse("SLF4J: no binding").is_err());
        assert!(parse(r#"{"cycle":{"ns":[-5]}}"#).is_err());
        assert!(parse(r#"{"surprise":{}}"#).is_err());
        match parse(r#"{"error":"no route to host"}"#).unwrap() {
            Reply::Error(e) => assert_eq!(e, "no route to host"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn commands_are_one_line_of_words() {
        let d = Duration::from_millis;
        assert_eq!(cycle_command("a/b", d(200)).unwrap(), "cycle a/b 200");
        assert_eq!(hot_command("a/b", 8, d(3000)).unwrap(), "hot a/b 8 3000");
        assert_eq!(
            wake_command("w", 25, (d(100), d(400))).unwrap(),
            "wake w 25 100 400"
        );
        assert!(cycle_command("a b", d(1)).is_err());
        assert_eq!(permit_command("s", 4, d(200)).unwrap(), "permit s 4 200");
        assert_eq!(
            campaign_command("lead", "e", "A", d(2000)).unwrap(),
            "lead e A 2000"
        );
        assert_eq!(observe_command("B").unwrap(), "observe B");
        assert!(matches!(parse(r#"{"ok":{}}"#).unwrap(), Reply::Ok {}));
        assert!(cycle_command("", d(1)).is_err());
    }
}
