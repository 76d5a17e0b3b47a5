//! What a run measured: the model `results.json` serializes and the report renders. Times are
//! in microseconds unless a field's name says otherwise; field names are the JSON keys, kept
//! stable so runs can be compared. The runner fills it, the renderer reads it; it depends on
//! neither.

use serde::{Deserialize, Serialize};

mod kind;
mod prims;

pub(crate) use self::kind::Kind;
pub(crate) use self::prims::{FailoverRow, PermitRow, Primitives, Who};

/// Percentiles of a latency distribution, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Latency {
    /// How many samples.
    pub(crate) count: u64,
    pub(crate) mean_us: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
}

/// The report header's machine line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) cpu: String,
    pub(crate) cores: usize,
    pub(crate) memory_bytes: u64,
    pub(crate) os: String,
    /// The 1-minute load average when the run started: a busy machine skews every number.
    pub(crate) load_at_start: String,
}

/// A server log sync slower than this, in ms, is counted as slow ([`HotLevel::server_syncs`]).
pub(crate) const SLOW_SYNC_MS: u64 = 4;

/// Contenders on one name in the hot-lock measure of the peer libraries ([`LibraryMeasures::hot`]).
pub(crate) const CONTENDERS: usize = 8;

/// One run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Results {
    pub(crate) meta: Meta,
    pub(crate) backends: Vec<BackendResult>,
    pub(crate) peers: Vec<PeerResult>,
    /// The libraries a user would pick instead, on the same servers (section 8). Empty in
    /// reports from before they were measured.
    #[serde(default)]
    pub(crate) libraries: Vec<LibraryResult>,
    /// Semaphores and leader failover (sections 9 and 10); `None` when not run.
    #[serde(default)]
    pub(crate) primitives: Option<Primitives>,
}

impl Results {
    /// The backends whose server answered.
    pub(crate) fn available(&self) -> impl Iterator<Item = &BackendResult> {
        self.backends.iter().filter(|b| b.available())
    }
}

/// Where and how the run happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Meta {
    /// The command as typed (`scripts/bench` passes itself in `DISTLOCK_BENCH_COMMAND`).
    pub(crate) command: String,
    /// The benchmark binary's own arguments.
    pub(crate) args: Vec<String>,
    /// Start of the run, UTC, RFC 3339.
    pub(crate) date_utc: String,
    /// `quick` or `full`.
    pub(crate) mode: String,
    /// `release` or `debug`: debug numbers are only good for checking the report generator.
    pub(crate) profile: String,
    pub(crate) machine: Machine,
    /// Wall time of the whole run, seconds.
    pub(crate) duration_s: f64,
    pub(crate) version: String,
}

/// Everything measured for one backend.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BackendResult {
    /// `memory`, `redis`, ... (the `--only` names).
    pub(crate) id: String,
    pub(crate) label: String,
    pub(crate) status: Status,
    /// `notify` or `poll`: how a waiter learns of a release.
    pub(crate) blocking: Option<String>,
    pub(crate) uncontended: Option<Uncontended>,
    pub(crate) independent: Vec<IndependentLevel>,
    pub(crate) hot: Vec<HotLevel>,
    /// The hot lock contended by tasks sharing one client handle.
    #[serde(default)]
    pub(crate) hot_one_handle: Option<HotLevel>,
    pub(crate) wake: Option<Wake>,
    pub(crate) many: Option<ManyHeld>,
    /// RedLock only: the uncontended cycle with one of three private masters paused. `None`
    /// for the other backends and in reports from before it was measured.
    #[serde(default)]
    pub(crate) paused_master: Option<PausedMaster>,
    /// Scenarios that failed, with their error; the others still ran.
    pub(crate) errors: Vec<ScenarioError>,
    /// Wall time spent on this backend, seconds.
    pub(crate) took_s: f64,
}

impl BackendResult {
    pub(crate) fn available(&self) -> bool {
        matches!(self.status, Status::Available { .. })
    }
}

/// Whether the backend's server answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum Status {
    NotRun,
    Available {
        /// The version the server reported.
        server: String,
        url: String,
    },
    Unavailable {
        error: String,
        how_to_start: String,
    },
}

/// A scenario that could not finish.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ScenarioError {
    pub(crate) scenario: String,
    pub(crate) error: String,
}

/// Scenarios 1 and 2: one client acquiring and releasing one name, next to the raw driver doing
/// the server operations such a cycle needs at the least, measured in alternating slices.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Uncontended {
    /// `lock(name, wait)` + `release()`: what an application calls.
    pub(crate) cycle: Latency,
    pub(crate) cycles_per_sec: f64,
    /// `try_lock(name)` + `release()`: the same without the waiting machinery.
    pub(crate) try_cycle: Latency,
    pub(crate) try_cycles_per_sec: f64,
    /// `try_acquire` + `release` on the backend itself: no guard, no watchdog.
    pub(crate) primitive_cycle: Latency,
    pub(crate) primitive_per_sec: f64,
    /// The raw-driver floor.
    pub(crate) floor: Latency,
    /// The floor's release step alone (its last request or round); `None` in reports from
    /// before it was measured.
    #[serde(default)]
    pub(crate) floor_release: Option<Latency>,
    pub(crate) floor_per_sec: f64,
    /// What the floor sends, in words.
    pub(crate) floor_ops: String,
    /// Round trips of one floor cycle.
    pub(crate) floor_round_trips: u32,
    /// Median cycle ÷ median floor: the library's overhead as a factor.
    pub(crate) ratio_p50: f64,
    /// Median cycle − median floor, µs: the overhead as time.
    pub(crate) overhead_p50_us: f64,
}

impl Uncontended {
    /// The floor's median time per round trip, µs: the yardstick for "a few round trips".
    pub(crate) fn round_trip_us(&self) -> f64 {
        self.floor.p50_us / f64::from(self.floor_round_trips.max(1))
    }
}

/// Scenario 3 at one level of concurrency.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct IndependentLevel {
    pub(crate) clients: usize,
    pub(crate) cycles: u64,
    pub(crate) cycles_per_sec: f64,
    pub(crate) latency: Latency,
}

/// Scenario 4 at one level of contention.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct HotLevel {
    pub(crate) clients: usize,
    pub(crate) grants: u64,
    pub(crate) grants_per_sec: f64,
    /// From the holder calling release to the next holder's acquire returning.
    pub(crate) handoff: Latency,
    /// From the holder calling release to that call returning: the release's own request(s),
    /// a hand-over's included. `None` where not measured (peers, older reports).
    #[serde(default)]
    pub(crate) release: Option<Latency>,
    /// From calling acquire to holding the lock.
    pub(crate) wait: Latency,
    pub(crate) longest_wait_ms: f64,
    /// Jain's index over per-client grants (1 = perfectly even).
    pub(crate) jain: f64,
    pub(crate) grants_min: u64,
    pub(crate) grants_max: u64,
    /// Times a client found the lock already held by another benchmark client when it was
    /// granted: must be 0.
    pub(crate) exclusion_violations: u64,
    /// Of the hand-offs, the share whose next holder was the client that had just released:
    /// 1/N when grants rotate at random, near 1 when the releaser barges back in. `None` in
    /// reports from before it was measured, or without a hand-off.
    #[serde(default)]
    pub(crate) self_regrant_share: Option<f64>,
    /// Requests the server received per grant over the scenario, by its own count
    /// (`Target::server_requests`); `None` where it
    /// keeps none, and in reports from before it was measured.
    #[serde(default)]
    pub(crate) server_requests_per_grant: Option<f64>,
    /// The server's durable log syncs over the scenario, and how many of them were slow
    /// (`Target::server_syncs`); `None` where it keeps
    /// no such histogram.
    #[serde(default)]
    pub(crate) server_syncs: Option<(u64, u64)>,
    /// The share of the machine's CPU time that was busy over the scenario (clients, servers
    /// and everything else; Linux's `/proc/stat`); `None` elsewhere.
    #[serde(default)]
    pub(crate) cpu_busy: Option<f64>,
}

/// Scenario 5.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Wake {
    /// From the holder calling release to the waiter's acquire returning.
    pub(crate) latency: Latency,
    /// Median wake-up ÷ the floor's time per round trip (measured in a busy loop).
    pub(crate) round_trips_p50: Option<f64>,
    /// The raw-driver floor cycle run once after each sample's kind of idle delay (notified
    /// backends over the network only).
    #[serde(default)]
    pub(crate) idle_floor: Option<Latency>,
    /// Median wake-up ÷ the idle floor's median time per round trip: the wake-up in round trips
    /// taken under the same idle conditions.
    #[serde(default)]
    pub(crate) idle_round_trips_p50: Option<f64>,
}

/// Scenario 6.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ManyHeld {
    /// Locks asked for.
    pub(crate) locks_requested: usize,
    /// Locks held during the measurement (fewer if acquiring ran out of its time budget).
    pub(crate) locks: usize,
    pub(crate) ttl_ms: u64,
    /// The lease the server granted (session-bound backends grant their session's).
    pub(crate) granted_ttl_ms: u64,
    /// Time to acquire them all (32 at a time).
    pub(crate) acquire_s: f64,
    /// Time to release them all (32 at a time), or until the time budget ran out.
    pub(crate) release_s: f64,
    /// Locks released within the time budget; the rest are dropped, which releases them in the
    /// background. `None` in reports from before it was counted.
    #[serde(default)]
    pub(crate) released: Option<usize>,
    pub(crate) rss_before_bytes: u64,
    pub(crate) rss_holding_bytes: u64,
    /// (holding − before) ÷ locks.
    pub(crate) bytes_per_lock: f64,
    /// Grants the watchdog renewed per second, measured.
    pub(crate) renewals_per_sec: f64,
    /// Renewal requests per second: one per grant, or one per batch where the backend confirms
    /// many grants at once. `None` in reports from before it was measured.
    #[serde(default)]
    pub(crate) requests_per_sec: Option<f64>,
    /// How often each lock was renewed, on average, seconds.
    pub(crate) interval_s: f64,
    /// locks ÷ (granted TTL / 3): what the watchdog aims for with a fixed lease (session-bound
    /// backends answer a renewal with what is left of their lease, so theirs varies).
    pub(crate) expected_per_sec: f64,
    pub(crate) renew_errors: u64,
    /// The first failed renewal's error, if any.
    pub(crate) first_renew_error: Option<String>,
    /// Guards that reported lost during the hold: must be 0.
    pub(crate) lost: usize,
}

/// RedLock's uncontended cycle (`lock` + `release`, as in [`Uncontended::cycle`]) on three
/// private redis-servers the benchmark starts itself, in slices alternating between healthy and
/// one of them stopped (`SIGSTOP`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum PausedMaster {
    /// The private servers could not be started (no `redis-server`, say); nothing measured.
    NotRun {
        reason: String,
    },
    Measured(Box<PausedCycles>),
}

/// What [`PausedMaster::Measured`] measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PausedCycles {
    pub(crate) masters: usize,
    /// Masters stopped during the second measurement.
    pub(crate) paused: usize,
    /// The lease of each cycle's grant, ms.
    pub(crate) ttl_ms: u64,
    /// How long a round waits for a master that has not answered, after the first answer
    /// (`distlock_redis::master_deadline` of the TTL), ms.
    pub(crate) master_deadline_ms: f64,
    pub(crate) healthy: Latency,
    pub(crate) healthy_per_sec: f64,
    pub(crate) paused_cycle: Latency,
    pub(crate) paused_per_sec: f64,
    /// Median paused cycle ÷ median healthy cycle.
    pub(crate) ratio_p50: f64,
    /// Then with a second master paused too (a majority down): `try_lock` refused.
    #[serde(default)]
    pub(crate) majority_down: Option<MajorityDown>,
}

/// `try_lock` on a free name with a majority of the masters paused.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MajorityDown {
    /// From calling `try_lock` to its error.
    pub(crate) refused_after: Latency,
    /// The last refusal, as displayed.
    pub(crate) error: String,
    /// Its kind (`unavailable` expected) and whether it is temporary (worth retrying).
    pub(crate) kind: String,
    pub(crate) temporary: bool,
}

/// Scenario 7: another crate on the same server, measured in alternating slices with ours.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PeerResult {
    /// e.g. `rslock 0.10 (1 instance)`, `sqlx 0.9 PgAdvisoryLock`.
    pub(crate) peer: String,
    /// The distlock backend it is compared with (`redis`, `redlock`, `postgres`).
    pub(crate) against: String,
    pub(crate) peer_cycle: Option<Latency>,
    pub(crate) peer_per_sec: f64,
    pub(crate) distlock_cycle: Option<Latency>,
    pub(crate) distlock_per_sec: f64,
    /// What each side sends per cycle.
    pub(crate) note: String,
    /// The distlock side, where it is not the backend's default (e.g. PostgreSQL's advisory
    /// mode).
    #[serde(default)]
    pub(crate) distlock: Option<String>,
    pub(crate) error: Option<String>,
    /// On one server: the server's own microseconds per cycle (`INFO commandstats`),
    /// distlock's and the peer's.
    #[serde(default)]
    pub(crate) server_us_per_cycle: Option<(f64, f64)>,
}

impl PeerResult {
    /// The distlock side as the report names it: `distlock-redis`, or what `distlock` says.
    pub(crate) fn distlock_name(&self) -> String {
        self.distlock
            .clone()
            .unwrap_or_else(|| format!("distlock-{}", self.against))
    }
}

/// Section 8: a library a user would pick instead of distlock, on the same server in the same
/// run, with the matching distlock backend's numbers beside it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LibraryResult {
    /// The `--only` name: `rslock`, `redis-py`, `python-redis-lock`, `curator`, `etcd-go`.
    pub(crate) id: String,
    /// What the library calls its lock, as the harness reported it (or the expected name when
    /// it did not run).
    pub(crate) library: String,
    /// The library's version, read at run time from what was installed.
    pub(crate) version: Option<String>,
    /// Where it came from: a registry, a Debian package and its version.
    pub(crate) source: String,
    /// Language and runtime, e.g. `Java 17.0.15 (OpenJDK 64-Bit Server VM)`.
    pub(crate) runtime: Option<String>,
    /// How the contenders run: threads, goroutines, tasks; one client each.
    pub(crate) contenders: Option<String>,
    /// The distlock backend on the same server (`redis`, `zk`, `etcd`).
    pub(crate) against: String,
    /// The server's version, as the distlock target reported it.
    pub(crate) server: Option<String>,
    /// Why it did not run (not installed, server unavailable); `None` when it ran.
    pub(crate) skipped: Option<String>,
    /// What one cycle sends and how a waiter waits, in words.
    pub(crate) note: String,
    pub(crate) peer: LibraryMeasures,
    pub(crate) distlock: LibraryMeasures,
    /// Measurements that failed, with their error; the others still ran.
    pub(crate) errors: Vec<ScenarioError>,
}

/// The three measures of section 8, for one side.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct LibraryMeasures {
    /// One client, acquire + release on one free name, in slices alternating with the other
    /// side's.
    pub(crate) cycle: Option<Latency>,
    pub(crate) cycles_per_sec: f64,
    /// [`CONTENDERS`] contenders on one name.
    pub(crate) hot: Option<HotLevel>,
    /// From the holder calling release to the waiter holding the lock.
    pub(crate) wake: Option<Latency>,
}
