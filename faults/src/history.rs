//! What a run records: the operations of the client processes (one JSON line each, written as
//! they complete) and the nemesis' faults, all timestamped on CLOCK_MONOTONIC.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Which acquisition of which task of which process: the key of a grant in the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct OpId {
    /// The client process.
    pub(crate) pid: u32,
    /// The task within it.
    pub(crate) task: u32,
    /// The task's acquisition counter.
    pub(crate) seq: u64,
}

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.pid, self.task, self.seq)
    }
}

/// One line of a client's history.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub(crate) enum Rec {
    /// An acquire, granted or not.
    Acquire {
        /// The acquisition.
        id: OpId,
        /// The lock name.
        name: String,
        /// `try` or `wait`.
        how: String,
        /// When it was invoked.
        invoke: u64,
        /// When it completed.
        complete: u64,
        /// `granted`, `busy`, `timeout`, `cancelled` or `error`.
        outcome: String,
        /// The error, for `error`.
        error: Option<String>,
        /// The grant's token.
        token: Option<u64>,
        /// The grant's owner id, as the server stores it.
        owner: Option<String>,
        /// The guard's safe-until at the grant.
        safe_until: Option<u64>,
        /// The lease the server granted, in ms.
        ttl_ms: Option<u64>,
        /// Whether the task's handle is shared with other tasks of the process.
        shared: bool,
        /// Whether the lease is fixed (no watchdog): the guard then believes no longer than its
        /// safe-until, the grant's or the last extend's.
        #[serde(default)]
        fixed: bool,
        /// How many holders the name admits: 1 for a lock (an election's name included), the
        /// semaphore's `max` for a permit.
        #[serde(default = "one")]
        permits: u32,
    },
    /// The end of a grant's believed holding: the earliest of release invoked, the guard
    /// dropped, `lost()` fired and safe-until.
    End {
        /// The acquisition.
        id: OpId,
        /// The lock name.
        name: String,
        /// The end of belief.
        end: u64,
        /// What ended it: `release`, `drop`, `lost`, `safe_until`.
        why: String,
        /// Why `lost()` fired, if it did.
        lost: Option<String>,
    },
    /// The guard's `lost()` fired: written at once by a watcher, since the holding task writes
    /// the end only when it next runs (a holder killed while it sleeps writes none).
    Lost {
        /// The acquisition.
        id: OpId,
        /// When `lost()` fired.
        at: u64,
        /// Why.
        reason: String,
    },
    /// A release's answer.
    Release {
        /// The acquisition.
        id: OpId,
        /// When it was invoked.
        invoke: u64,
        /// When it completed.
        complete: u64,
        /// `held`, `not_held` or the error.
        result: String,
    },
    /// A fenced write to the resource's register.
    Write {
        /// The acquisition.
        id: OpId,
        /// The lock name.
        name: String,
        /// The token written with.
        token: u64,
        /// When it was invoked.
        invoke: u64,
        /// When it completed.
        complete: u64,
        /// Whether the register took it.
        accepted: bool,
        /// Written on purpose after the writer's lease ran out, with its old token and no
        /// check (a holder that stalled between its check and its write): the register must
        /// refuse it once a newer grant wrote.
        #[serde(default)]
        zombie: bool,
    },
    /// A read-sleep-write increment of the resource's counter.
    Incr {
        /// The acquisition.
        id: OpId,
        /// The lock name.
        name: String,
        /// When it was invoked.
        invoke: u64,
        /// When it completed.
        complete: u64,
        /// `done`, `aborted` (belief ended between read and write) or `error`.
        outcome: String,
    },
    /// A lease extension.
    Extend {
        /// The acquisition.
        id: OpId,
        /// The lease asked for.
        ttl_ms: u64,
        /// When it was invoked.
        invoke: u64,
        /// When it completed.
        complete: u64,
        /// Whether it took.
        ok: bool,
        /// The error, if it did not.
        error: Option<String>,
        /// The guard's safe-until after it.
        safe_until: Option<u64>,
    },
    /// The server's own word on a held lock's expiry, read through `holder()` while the guard
    /// held it: the guard's safe-until, read before, must not be past it.
    Expiry {
        /// The acquisition.
        id: OpId,
        /// The guard's safe-until, read just before asking.
        safe_until: Option<u64>,
        /// When the question was sent.
        invoke: u64,
        /// When it was answered.
        complete: u64,
        /// Whether the server named this grant (its owner and token) as the holder.
        holder_is_grant: bool,
        /// The lease the server said was left, in ms.
        remaining_ms: Option<u64>,
    },
    /// A leader's proclaim on an election's name, sent with the grant's identity through the
    /// backend's own call: the server must refuse it once a later grant of the name exists.
    Proclaim {
        /// The acquisition (the leadership).
        id: OpId,
        /// The election's name.
        name: String,
        /// When it was invoked.
        invoke: u64,
        /// When it completed.
        complete: u64,
        /// Whether the server took it (`false` also for an error).
        accepted: bool,
        /// The error, if any.
        error: Option<String>,
        /// Sent on purpose after the leader's lease ran out, without checking (a leader that
        /// stalled): the server must refuse it once a newer grant exists.
        zombie: bool,
    },
    /// A re-entry through the guard: one more hold of the same grant.
    Reenter {
        /// The acquisition re-entered.
        id: OpId,
        /// When it was invoked.
        invoke: u64,
        /// When it completed.
        complete: u64,
        /// The new hold's token, when granted.
        token: Option<u64>,
        /// The new hold's hold count, when granted.
        hold_count: Option<u32>,
        /// The error kind (`Lost`, `Unavailable`, …), when refused.
        error: Option<String>,
    },
}

impl Rec {
    /// The acquisition the record belongs to.
    pub(crate) fn id(&self) -> OpId {
        match self {
            Rec::Acquire { id, .. }
            | Rec::End { id, .. }
            | Rec::Lost { id, .. }
            | Rec::Release { id, .. }
            | Rec::Write { id, .. }
            | Rec::Incr { id, .. }
            | Rec::Extend { id, .. }
            | Rec::Reenter { id, .. }
            | Rec::Proclaim { id, .. }
            | Rec::Expiry { id, .. } => *id,
        }
    }
}

fn one() -> u32 {
    1
}

/// A fault the nemesis injected or undid.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Fault {
    /// When: for a request to a server (an out-of-band deletion), when it was sent.
    pub(crate) at: u64,
    /// When it was done: the server's answer to a request (which it may apply at any time in
    /// between, e.g. a deletion waiting on a row lock); `at` for a signal or a cut.
    #[serde(default)]
    pub(crate) done: u64,
    /// What, in words (`SIGKILL client 1234`, `SIGCONT redis-server`).
    pub(crate) what: String,
    /// The client process it hit, if any: a killed process believes nothing after `at`.
    pub(crate) killed: Option<u32>,
    /// Whether the system should recover from here: the time to the next grant is measured
    /// from it.
    pub(crate) recover_from: bool,
    /// An out-of-band deletion of this lock name.
    pub(crate) deleted: Option<String>,
}

/// When the holder of a grant (`recs`: its records) killed at `at` stopped believing: at the
/// kill, or earlier at the last safe-until its guard was given (by the acquire or the last
/// extend) if its lease was `fixed`, as a zombie killed while it stalls past it. A watchdog
/// lease's safe-until moves with renewals the history does not record: the kill, then.
pub(crate) fn killed_end(recs: &[&Rec], fixed: bool, at: u64) -> u64 {
    let last = recs.iter().filter_map(|r| match r {
        Rec::Acquire { safe_until, .. } | Rec::Extend { safe_until, .. } => *safe_until,
        _ => None,
    });
    match last.max() {
        Some(until) if fixed => until.min(at),
        _ => at,
    }
}

/// Every record of the client histories (`*.jsonl`) under `dir`.
pub(crate) fn read_dir(dir: &Path) -> Result<Vec<Rec>, String> {
    let mut recs = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path: PathBuf = entry.path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for line in text.lines() {
            // A killed process may leave a half-written last line; nothing else is skipped.
            match serde_json::from_str::<Rec>(line) {
                Ok(r) => recs.push(r),
                Err(_) if !text.ends_with('\n') && text.lines().last() == Some(line) => {}
                Err(e) => {
                    return Err(format!(
                        "{}: bad history line {line:?}: {e}",
                        path.display()
                    ))
                }
            }
        }
    }
    Ok(recs)
}
