//! Sections 9 and 10: counting semaphores and leader failover, for distlock's backends and the
//! peer libraries on the same servers.

use serde::{Deserialize, Serialize};

use super::{HotLevel, Latency, ScenarioError};

/// What the run measured of the two primitives.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Primitives {
    /// The semaphore size of the permit cycle.
    pub(crate) permit_max: u32,
    /// The semaphore size and the contenders of the contended run.
    pub(crate) contended_max: u32,
    pub(crate) contenders: usize,
    /// The lease (or session / client lease) every leader had in the failover runs, ms.
    pub(crate) lease_ms: u64,
    /// Section 9: one row per backend with semaphores, then per peer.
    pub(crate) permits: Vec<PermitRow>,
    /// Section 10: one row per backend, then per peer.
    pub(crate) failover: Vec<FailoverRow>,
}

/// Who a row measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Who {
    /// The backend id or the peer's `--only` name.
    pub(crate) id: String,
    /// The backend's label, or the peer's recipe.
    pub(crate) label: String,
    /// For a peer: the distlock backend on the same server; `None` for distlock's own rows.
    pub(crate) against: Option<String>,
    /// The peer's version and runtime, as its harness said.
    pub(crate) version: Option<String>,
    /// Why it did not run (no such primitive, not installed, server unavailable).
    pub(crate) skipped: Option<String>,
    /// Measurements that failed; the others still ran.
    pub(crate) errors: Vec<ScenarioError>,
}

/// Section 9, one row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PermitRow {
    pub(crate) who: Who,
    /// One client: take one permit of a free semaphore of `permit_max`, release it.
    pub(crate) cycle: Option<Latency>,
    pub(crate) cycles_per_sec: f64,
    /// Measured in slices alternating with `cycle`: on distlock's rows the backend's own
    /// `try_lock` + `release` cycle; on a peer's, distlock's permit cycle on the same server.
    pub(crate) beside: Option<Latency>,
    /// distlock only: `contenders` clients on a semaphore of `contended_max`; its
    /// `exclusion_violations` count grants made while `contended_max` others held.
    pub(crate) contended: Option<HotLevel>,
    /// The most permits the contenders believed they held at once.
    pub(crate) peak_held: Option<u64>,
}

/// Section 10, one row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FailoverRow {
    pub(crate) who: Who,
    /// From the leader process's SIGKILL to an observer seeing the next leader, one per
    /// sample, ms.
    pub(crate) samples_ms: Vec<f64>,
    pub(crate) failover: Option<Latency>,
    /// distlock only: from the SIGKILL to the waiting campaigner's `campaign` returning.
    pub(crate) elected: Option<Latency>,
}
