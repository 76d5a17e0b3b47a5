//! The checker: reads a run's merged history and says whether mutual exclusion and fencing held.
//!
//! 1. No two grants' *believed* holding intervals — from the grant's completion to the earliest
//!    of release invoked, guard dropped, `lost()` fired and safe-until — overlap for one name.
//! 2. Among grants believed for any time at all, tokens strictly increase in grant order.
//! 3. The counter is exact: every set the resource saw was the value before it plus one.
//! 4. (The runner's residue check, after the leases ran out.)
//! 5. Each guard's safe-until is bounded by the history's own fields, not the library's word:
//!    a grant's by its completion plus the lease it reports minus the stated drift margin
//!    (the request was sent before the grant completed); an extend's by the longer of the
//!    safe-until before it and its own completion plus the lease asked for, minus the margin.
//! 6. A re-entry is the grant it re-enters: the same token; and a re-entry is not refused as
//!    lost while its grant is still believed, unless a fault came between the grant and it.
//!    And by the server's own word: a guard's safe-until, read before asking the server (through
//!    `holder()`) for the lease left, is not past the server's expiry — the answer's
//!    completion plus that lease.
//! 7. The lock stays available: outside fault windows, an acquire of a name is not refused
//!    while nobody has believed holding it for longer than a lease plus [`AVAILABILITY_SLACK_NS`]
//!    (a hold nobody owns: a cancelled acquire's, a lost reply's never given back).
//! 8. A semaphore's name never has more than its `max` grants believed at once, and a permit
//!    granted after another completed has a higher token. An election's proclaim is never
//!    taken once a later grant of the name completed before it was sent.
//!
//! A violation names the offending operations and prints their records.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::clock::ms_between;
use crate::history::{killed_end, Fault, OpId, Rec};
use crate::resource::Cell;

use self::deletion::deletion_race;

/// What the scenario makes legitimate.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Expect {
    /// Locks are deleted behind their holders' backs: a holder believes until its next
    /// renewal, so an overlap that starts after the deletion and ends within `allowance_ns`
    /// of it is the scenario's point, not the library's fault (the fence must catch it).
    pub(crate) oob_delete: bool,
    /// How long after an out-of-band deletion a holder may go on believing.
    pub(crate) allowance_ns: u64,
    /// Client processes are stopped: a stopped holder's increment that was under way when
    /// it stopped lands after its lease — the unfenced counter cannot be protected by any lock,
    /// so its lost updates are counted, not called violations.
    pub(crate) client_pause: bool,
    /// The server restarted without its data (volatile fencing): tokens granted after the
    /// kill (the server grants nothing until it is back, empty) start again at 1. Such a fall across a restart is counted, not called a
    /// violation; the register refuses the new holders' writes, which is what volatile
    /// fencing means. A fall with no restart in between is still a violation.
    pub(crate) volatile_restart: bool,
    /// The lease the run's clients were configured with (ZooKeeper's session timeout, etcd's
    /// lease), in ns: how long a dead holder's claim can outlive it on the server, where a
    /// guard's own lease (ZooKeeper's half a session) is shorter.
    pub(crate) server_lease_ns: u64,
}

/// One grant, with its believed interval.
#[derive(Clone, Debug)]
struct Grant {
    id: OpId,
    name: String,
    token: u64,
    owner: String,
    /// When its acquire was sent: a server-side change from then on may already be this grant's.
    sent: u64,
    start: u64,
    end: u64,
    why: String,
    /// Its guard learned the lock was lost: `lost()` fired (or a renewal failed), its release
    /// answered not held, or the register refused one of its writes.
    lost: bool,
    /// How many holders its name admits (a semaphore's `max`; 1 for a lock).
    permits: u32,
    /// A fixed lease (no watchdog): nothing tells its holder of a deletion before it speaks to
    /// the server again.
    fixed: bool,
    /// The safe-untils the server promised it: (when the request was sent, the safe-until its
    /// answer gave), from the acquire and each extend that took.
    promised: Vec<(u64, u64)>,
}

/// The verdict on one run.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Checked {
    /// Operations in the history (client records and faults).
    pub(crate) ops: usize,
    /// Grants.
    pub(crate) grants: usize,
    /// Violations, each with the operations that make it.
    pub(crate) violations: Vec<String>,
    /// Overlaps the scenario makes legitimate (out-of-band deletion).
    pub(crate) expected_overlaps: usize,
    /// Writes the register refused (a stale holder's).
    pub(crate) fenced_off: usize,
    /// Register writes taken although their writer no longer believed it held (only a
    /// stopped process can do that; the token order decides whether they were harmless).
    pub(crate) late_writes: usize,
    /// Lost counter updates the scenario makes legitimate: a stopped holder's update landing
    /// late ([`Expect::client_pause`]), or a holder's update before it learned that its lock
    /// was deleted behind its back ([`Expect::oob_delete`]). Only fencing protects against
    /// either; the counter is the resource without it.
    pub(crate) unfenced_lost_updates: u64,
    /// Token falls across a restart of a server without persistence ([`Expect::volatile_restart`]).
    pub(crate) token_restarts: usize,
    /// The longest time from a fault's end to the next grant, in ms; `None` when the run had
    /// no fault to recover from.
    pub(crate) recover_ms: Option<f64>,
    /// Faults after which nothing was granted again, though the clients kept asking for the
    /// recovery window ([`availability::recovery_window`]) after them.
    pub(crate) unrecovered: usize,
    /// Faults after which nothing was granted before the clients stopped asking, less than the
    /// recovery window after them: a lock's availability is not judged on so short a tail.
    pub(crate) unjudged: usize,
    /// Grants completed while a fault was in force (from a fault to the next fault that ends
    /// one): what stays available through it (RedLock with a minority of masters down, a
    /// cluster with a member lost).
    pub(crate) grants_during_faults: usize,
    /// Acquires by outcome.
    pub(crate) outcomes: BTreeMap<String, usize>,
    /// Zombie writes attempted (a holder writing with its old token after its lease ran out,
    /// without checking), and how many of them the register refused.
    pub(crate) zombie_writes: usize,
    /// Zombie writes the register refused: a newer grant had written.
    pub(crate) zombies_fenced: usize,
    /// Re-entries attempted, and granted.
    pub(crate) reentries: usize,
    /// Re-entries granted.
    pub(crate) reentries_granted: usize,
    /// Proclaims by election leaders, and how many of them the server took.
    pub(crate) proclaims: usize,
    /// Proclaims the server took.
    pub(crate) proclaims_taken: usize,
    /// Zombie proclaims (sent unchecked after the leader's lease ran out), and how many of them
    /// the server refused.
    pub(crate) zombie_proclaims: usize,
    /// Zombie proclaims the server refused.
    pub(crate) zombie_proclaims_refused: usize,
    /// The most permits of a semaphore name believed held at once.
    pub(crate) permits_peak: u32,
}

/// The drift margin the contract subtracts from a lease for a guard's safe-until: 1% of it
/// plus 2 ms (DESIGN.md, "Lease"), in ns.
fn drift_ns(ttl_ms: u64) -> u64 {
    (ttl_ms * 1_000_000) / 100 + 2_000_000
}

/// How long past a lease a lock may stay refused with no believed holder (a release on its
/// way, a dead holder's lease running out on a loaded machine), in ns.
const AVAILABILITY_SLACK_NS: u64 = 2_000_000_000;

/// Slack for converting instants between the client's clocks, in ns.
const CLOCK_SLACK_NS: u64 = 200_000;

/// Checks a run: the clients' records, the nemesis' faults, the resource's final state, and
/// when the run ended (the end of belief of a grant whose process never recorded one).
pub(crate) fn check(
    recs: &[Rec],
    faults: &[Fault],
    resource: &BTreeMap<String, Cell>,
    run_end: u64,
    expect: Expect,
) -> Checked {
    let mut out = Checked {
        ops: recs.len() + faults.len(),
        ..Checked::default()
    };
    let mut by_id: HashMap<OpId, Vec<&Rec>> = HashMap::new();
    for r in recs {
        by_id.entry(r.id()).or_default().push(r);
    }
    let killed: HashMap<u32, u64> = faults
        .iter()
        .filter_map(|f| f.killed.map(|pid| (pid, f.at)))
        .fold(HashMap::new(), |mut m, (pid, at)| {
            m.entry(pid)
                .and_modify(|t: &mut u64| *t = (*t).min(at))
                .or_insert(at);
            m
        });
    let mut grants = Vec::new();
    for r in recs {
        if let Rec::Acquire { outcome, .. } = r {
            *out.outcomes.entry(outcome.clone()).or_default() += 1;
        }
        let Rec::Acquire {
            id,
            name,
            outcome,
            invoke,
            complete,
            token: Some(token),
            owner,
            fixed,
            permits,
            ..
        } = r
        else {
            continue;
        };
        if outcome != "granted" {
            continue;
        }
        let ended = by_id[id].iter().find_map(|r| match r {
            Rec::End { end, why, lost, .. } => Some((*end, why.clone(), lost.is_some())),
            _ => None,
        });
        // The guard learned its hold was gone: `lost()` fired, its release found the lock no
        // longer its own, or the register refused one of its writes (a later token got there).
        let learned = by_id[id].iter().any(|r| match r {
            Rec::Release { result, .. } => result == "not_held",
            Rec::Write {
                accepted, zombie, ..
            } => !accepted && !zombie,
            _ => false,
        });
        let promised = by_id[id]
            .iter()
            .filter_map(|r| match r {
                Rec::Acquire {
                    invoke, safe_until, ..
                } => safe_until.map(|u| (*invoke, u)),
                Rec::Extend {
                    invoke,
                    ok: true,
                    safe_until,
                    ..
                } => safe_until.map(|u| (*invoke, u)),
                _ => None,
            })
            .collect();
        let recorded = ended.is_some();
        let (end, why, lost) = match (ended, killed.get(&id.pid)) {
            (Some((end, why, lost)), _) => (end, why, lost || learned),
            (None, Some(&at)) => (killed_end(&by_id[id], *fixed, at), "killed".into(), false),
            (None, None) => (run_end, "no end recorded: the run's end".to_string(), false),
        };
        // A holder that wrote no end may still have been told first, by its lost() watcher.
        let told = by_id[id].iter().find_map(|r| match r {
            Rec::Lost { at, .. } => Some(*at),
            _ => None,
        });
        let (end, why, lost) = match told {
            Some(at) if !recorded && at < end => (at, "lost (no end recorded)".into(), true),
            _ => (end, why, lost),
        };
        grants.push(Grant {
            id: *id,
            name: name.clone(),
            token: *token,
            owner: owner.clone().unwrap_or_default(),
            sent: *invoke,
            start: *complete,
            end,
            why,
            lost,
            permits: *permits,
            fixed: *fixed,
            promised,
        });
    }
    out.grants = grants.len();

    let mut by_name: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in &grants {
        by_name.entry(g.name.as_str()).or_default().push(g);
    }
    let show = |g: &Grant| -> String {
        let mut s = format!(
            "  grant {} owner {} token {} believed {:.1} ms from {} to {} (ended by {})\n",
            g.id,
            g.owner,
            g.token,
            ms_between(g.start, g.end),
            g.start,
            g.end,
            g.why
        );
        for r in by_id.get(&g.id).into_iter().flatten().take(12) {
            s.push_str("    ");
            s.push_str(&serde_json::to_string(r).unwrap_or_default());
            s.push('\n');
        }
        s
    };
    for (name, gs) in &mut by_name {
        gs.sort_by_key(|g| (g.start, g.end));
        let max = gs.iter().map(|g| g.permits).max().unwrap_or(1);
        if max > 1 {
            primitives::permits(name, gs, max, expect, &show, &mut out);
            continue;
        }
        // (1) Overlaps: every believed interval against the one reaching furthest before it.
        let mut furthest: Option<&Grant> = None;
        let mut overlaps = 0;
        for g in gs.iter().filter(|g| g.end > g.start) {
            if let Some(f) = furthest {
                if g.start < f.end {
                    if expect.oob_delete && deletion_race(faults, name, f, g, expect) {
                        out.expected_overlaps += 1;
                    } else {
                        overlaps += 1;
                        if overlaps <= 3 {
                            out.violations.push(format!(
                                "mutual exclusion on {name:?}: {} was granted {:.1} ms before {} \
                                 stopped believing it held\n{}{}{}",
                                g.id,
                                ms_between(g.start, f.end),
                                f.id,
                                show(f),
                                show(g),
                                faults_between(
                                    faults,
                                    g.start.saturating_sub(2_000_000_000),
                                    g.start
                                )
                            ));
                        }
                    }
                }
                if g.end > f.end {
                    furthest = Some(g);
                }
            } else {
                furthest = Some(g);
            }
        }
        if overlaps > 3 {
            out.violations.push(format!(
                "mutual exclusion on {name:?}: {} more overlaps",
                overlaps - 3
            ));
        }
        // (2) Tokens.
        let mut last: Option<&Grant> = None;
        for g in gs.iter().filter(|g| g.end > g.start) {
            if let Some(p) = last.filter(|p| {
                // A holder whose lock was deleted as its grant came back may finish acquiring
                // after the next holder: its lower token is what fences it off.
                !(expect.oob_delete && deletion_race(faults, name, p, g, expect))
            }) {
                let restarted_between = expect.volatile_restart
                    && faults.iter().any(|f| p.start < f.at && f.at < g.start);
                if g.token <= p.token && restarted_between {
                    out.token_restarts += 1;
                } else if g.token <= p.token {
                    out.violations.push(format!(
                        "fencing on {name:?}: {} got token {} after {} had {}\n{}{}",
                        g.id,
                        g.token,
                        p.id,
                        p.token,
                        show(p),
                        show(g)
                    ));
                }
            }
            last = Some(g);
        }
    }

    // (5) Safe-until from the history's own fields.
    let mut believed_until: HashMap<OpId, u64> = HashMap::new();
    for r in recs {
        match r {
            Rec::Acquire {
                id,
                complete,
                outcome,
                safe_until: Some(su),
                ttl_ms: Some(ttl),
                ..
            } if outcome == "granted" => {
                let bound = (complete + ttl * 1_000_000).saturating_sub(drift_ns(*ttl));
                if *su > bound + CLOCK_SLACK_NS {
                    out.violations.push(format!(
                        "safe-until of {id}: {:.1} ms past its completion plus its {ttl} ms lease \
                         minus the drift margin",
                        ms_between(bound, *su)
                    ));
                }
                believed_until.insert(*id, *su);
            }
            Rec::Extend {
                id,
                ttl_ms,
                complete,
                ok: true,
                safe_until: Some(su),
                ..
            } => {
                let asked = (complete + ttl_ms * 1_000_000).saturating_sub(drift_ns(*ttl_ms));
                let bound = believed_until.get(id).copied().unwrap_or(0).max(asked);
                if *su > bound + CLOCK_SLACK_NS {
                    out.violations.push(format!(
                        "safe-until of {id} after extend({ttl_ms} ms): {:.1} ms past both the \
                         lease before it and the one asked for",
                        ms_between(bound, *su)
                    ));
                }
                believed_until.insert(*id, *su);
            }
            _ => {}
        }
    }

    for r in recs {
        if let Rec::Acquire {
            id,
            outcome,
            safe_until: None,
            ttl_ms: Some(ttl),
            ..
        } = r
        {
            if outcome == "granted" {
                out.violations.push(format!(
                    "safe-until of {id}: none, for a grant with a {ttl} ms lease"
                ));
            }
        }
    }

    availability::check(recs, faults, &by_name, expect.server_lease_ns, &mut out);

    // (5b) Safe-until against the server's expiry.
    for r in recs {
        if let Rec::Expiry {
            id,
            safe_until: Some(su),
            complete,
            holder_is_grant: true,
            remaining_ms: Some(left),
            ..
        } = r
        {
            // The server counts its lease in whole ms.
            let expiry = complete + (left + 1) * 1_000_000;
            if *su > expiry + CLOCK_SLACK_NS {
                out.violations.push(format!(
                    "safe-until of {id}: {:.1} ms past the server's expiry ({left} ms left when \
                     asked)",
                    ms_between(expiry, *su)
                ));
            }
        }
    }

    // (6) Re-entries.
    let by_grant: HashMap<OpId, &Grant> = grants.iter().map(|g| (g.id, g)).collect();
    for r in recs {
        let Rec::Reenter {
            id,
            complete,
            token,
            error,
            ..
        } = r
        else {
            continue;
        };
        out.reentries += 1;
        let Some(g) = by_grant.get(id) else { continue };
        match (token, error) {
            (Some(t), _) => {
                out.reentries_granted += 1;
                if *t != g.token {
                    out.violations.push(format!(
                        "re-entry of {id} was granted token {t}, its grant holds {}\n{}",
                        g.token,
                        show(g)
                    ));
                }
            }
            (None, Some(e)) if e.starts_with("Lost") => {
                // A deletion in flight (send to answer) while the acquire was can take the node,
                // key or row the server had just granted it (a row lock may hold it back).
                let fault_between = faults.iter().any(|f| g.sent <= f.done && f.at <= *complete);
                if g.end > complete + 20_000_000 && !fault_between {
                    out.violations.push(format!(
                        "re-entry of {id} was refused as lost while its grant was believed for \
                         {:.1} ms more, with no fault in between: {e}\n{}",
                        ms_between(*complete, g.end),
                        show(g)
                    ));
                }
            }
            _ => {}
        }
    }

    // (3) The counter, and what the register saw.
    let mut done: BTreeMap<&str, u64> = BTreeMap::new();
    for r in recs {
        if let Rec::Incr { name, outcome, .. } = r {
            if outcome == "done" {
                *done.entry(name.as_str()).or_default() += 1;
            }
        }
    }
    for (name, cell) in resource {
        out.fenced_off += cell.rejected.len();
        if cell.lost_updates > 0 || cell.counter != cell.sets {
            if expect.client_pause || expect.oob_delete {
                out.unfenced_lost_updates += cell.lost_updates;
            } else {
                out.violations.push(format!(
                    "counter of {name:?}: {} after {} increments ({} lost updates)",
                    cell.counter, cell.sets, cell.lost_updates
                ));
            }
        }
        let acked = done.get(name.as_str()).copied().unwrap_or(0);
        if acked > cell.sets {
            out.violations.push(format!(
                "counter of {name:?}: clients saw {acked} increments done, the resource {}",
                cell.sets
            ));
        }
    }
    for r in recs {
        if let Rec::Write {
            zombie: true,
            accepted,
            ..
        } = r
        {
            out.zombie_writes += 1;
            out.zombies_fenced += usize::from(!accepted);
        }
    }
    let ends: HashMap<OpId, u64> = grants.iter().map(|g| (g.id, g.end)).collect();
    out.late_writes = recs
        .iter()
        .filter(|r| {
            matches!(r, Rec::Write { id, invoke, accepted: true, .. }
                if ends.get(id).is_some_and(|&end| *invoke > end))
        })
        .count();

    // (8) Proclaims.
    primitives::proclaims(recs, faults, expect, &by_name, &by_grant, &show, &mut out);

    // Availability: grants while a fault was in force.
    let mut windows = Vec::new();
    let mut open: Option<u64> = None;
    for f in faults {
        match (f.recover_from, open) {
            (false, None) => open = Some(f.at),
            (true, Some(from)) => {
                windows.push((from, f.at));
                open = None;
            }
            _ => {}
        }
    }
    out.grants_during_faults = grants
        .iter()
        .filter(|g| windows.iter().any(|&(a, b)| a <= g.start && g.start < b))
        .count();

    availability::recovery(recs, faults, &grants, &expect, &mut out);
    out
}

/// The faults of `faults` sent from `from` to `to`, a line each, for a violation's message.
pub(super) fn faults_between(faults: &[Fault], from: u64, to: u64) -> String {
    let lines: Vec<String> = faults
        .iter()
        .filter(|f| from <= f.at && f.at <= to)
        .map(|f| format!("  fault at {} (done {}): {}\n", f.at, f.done, f.what))
        .collect();
    if lines.is_empty() {
        "  no fault recorded in that span\n".into()
    } else {
        lines.concat()
    }
}

mod availability;
mod deletion;
mod primitives;
#[cfg(test)]
mod tests;
