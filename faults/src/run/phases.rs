//! Phase coverage: for each nemesis action of a soak, whether it landed within
//! [`WITHIN_NS`] of an expiry, a renewal, a release or a hand-over in the history.
//!
//! - an *expiry*: a belief ended at the guard's safe-until (a fixed lease run out);
//! - a *renewal*: an `extend` sent or answered; and, for a watchdog lease on a per-lock backend,
//!   each TTL/3 after its grant while it was believed (the watchdog's schedule: the history
//!   does not record its renewals);
//! - a *release*: a release sent or answered;
//! - a *hand-over*: a waiting acquire granted after another holder of the name stopped
//!   believing while it waited (at the grant).

use std::collections::HashMap;

use serde::Serialize;

use crate::history::{Fault, OpId, Rec};

/// How close an action must land to an event to count, in ns.
pub(crate) const WITHIN_NS: u64 = 50_000_000;

/// How many of each kind of event the history holds, and how many actions landed near one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Phases {
    /// Nemesis actions (each injection and each undo).
    pub(crate) actions: usize,
    /// Actions within [`WITHIN_NS`] of an expiry, a renewal, a release, a hand-over, and of
    /// any of them.
    pub(crate) near_expiry: usize,
    pub(crate) near_renewal: usize,
    pub(crate) near_release: usize,
    pub(crate) near_handover: usize,
    pub(crate) near_any: usize,
    /// Events of each kind in the history.
    pub(crate) expiries: usize,
    pub(crate) renewals: usize,
    pub(crate) releases: usize,
    pub(crate) handovers: usize,
}

/// Counts the phases hit by the actions among `faults` (the soak's own end-of-fault notes,
/// `recover_from`, are not actions). `per_lock`: whether watchdog renewals can be placed.
pub(crate) fn phases(recs: &[Rec], faults: &[Fault], per_lock: bool) -> Phases {
    let mut ends: HashMap<OpId, u64> = HashMap::new();
    let mut ends_by_name: HashMap<&str, Vec<u64>> = HashMap::new();
    let (mut expiry, mut renewal, mut release) = (Vec::new(), Vec::new(), Vec::new());
    for r in recs {
        match r {
            Rec::End {
                id, name, end, why, ..
            } => {
                ends.insert(*id, *end);
                ends_by_name.entry(name).or_default().push(*end);
                if why == "safe_until" {
                    expiry.push(*end);
                }
            }
            Rec::Extend {
                invoke, complete, ..
            } => renewal.extend([*invoke, *complete]),
            Rec::Release {
                invoke, complete, ..
            } => release.extend([*invoke, *complete]),
            _ => {}
        }
    }
    for v in ends_by_name.values_mut() {
        v.sort_unstable();
    }
    let mut handover = Vec::new();
    let mut renewals = renewal.len() / 2;
    for r in recs {
        let Rec::Acquire {
            id,
            name,
            how,
            invoke,
            complete,
            outcome,
            ttl_ms,
            fixed,
            ..
        } = r
        else {
            continue;
        };
        if outcome != "granted" {
            continue;
        }
        let ended_meanwhile = ends_by_name.get(name.as_str()).is_some_and(|v| {
            let i = v.partition_point(|&e| e < *invoke);
            v.get(i).is_some_and(|&e| e <= *complete)
        });
        if how == "wait" && ended_meanwhile {
            handover.push(*complete);
        }
        if let (true, false, Some(ttl), Some(&end)) = (per_lock, *fixed, ttl_ms, ends.get(id)) {
            let period = ttl * 1_000_000 / 3;
            let mut at = complete + period;
            while period > 0 && at < end {
                renewal.push(at);
                renewals += 1;
                at += period;
            }
        }
    }
    let mut out = Phases {
        expiries: expiry.len(),
        renewals,
        releases: release.len() / 2,
        handovers: handover.len(),
        ..Phases::default()
    };
    for v in [&mut expiry, &mut renewal, &mut release, &mut handover] {
        v.sort_unstable();
    }
    for f in faults.iter().filter(|f| !f.recover_from) {
        out.actions += 1;
        let hits = [
            near(&expiry, f.at),
            near(&renewal, f.at),
            near(&release, f.at),
            near(&handover, f.at),
        ];
        out.near_expiry += usize::from(hits[0]);
        out.near_renewal += usize::from(hits[1]);
        out.near_release += usize::from(hits[2]);
        out.near_handover += usize::from(hits[3]);
        out.near_any += usize::from(hits.iter().any(|&h| h));
    }
    out
}

/// Whether sorted `events` has one within [`WITHIN_NS`] of `at`.
fn near(events: &[u64], at: u64) -> bool {
    let i = events.partition_point(|&e| e < at.saturating_sub(WITHIN_NS));
    events.get(i).is_some_and(|&e| e <= at + WITHIN_NS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn id(task: u32, seq: u64) -> OpId {
        OpId { pid: 1, task, seq }
    }

    fn grant(i: OpId, how: &str, invoke: u64, complete: u64, fixed: bool) -> Rec {
        Rec::Acquire {
            id: i,
            name: "n".into(),
            how: how.into(),
            invoke,
            complete,
            outcome: "granted".into(),
            error: None,
            token: Some(i.seq),
            owner: None,
            safe_until: None,
            ttl_ms: Some(900),
            shared: false,
            fixed,
            permits: 1,
        }
    }

    fn end(i: OpId, at: u64, why: &str) -> Rec {
        Rec::End {
            id: i,
            name: "n".into(),
            end: at,
            why: why.into(),
            lost: None,
        }
    }

    fn action(at: u64, recover_from: bool) -> Fault {
        Fault {
            at,
            done: at,
            what: "x".into(),
            killed: None,
            recover_from,
            deleted: None,
        }
    }

    #[test]
    fn actions_near_expiries_renewals_releases_and_handovers_are_counted() {
        let (a, b, c) = (id(0, 1), id(1, 1), id(2, 1));
        let recs = vec![
            // A watchdog hold from 1000 ms to 2000 ms: renewals placed at 1300, 1600, 1900 ms;
            // released at 2000 ms (answered at 2002 ms).
            grant(a, "try", 990 * MS, 1000 * MS, false),
            end(a, 2000 * MS, "release"),
            Rec::Release {
                id: a,
                invoke: 2000 * MS,
                complete: 2002 * MS,
                result: "held".into(),
            },
            // Waiting since 1500 ms, granted at 2010 ms after a's end: a hand-over.
            grant(b, "wait", 1500 * MS, 2010 * MS, true),
            Rec::Extend {
                id: b,
                ttl_ms: 500,
                invoke: 2500 * MS,
                complete: 2501 * MS,
                ok: true,
                error: None,
                safe_until: None,
            },
            end(b, 3000 * MS, "safe_until"),
            // A try granted after b's expiry: no hand-over (it did not wait).
            grant(c, "try", 3100 * MS, 3101 * MS, true),
            end(c, 3200 * MS, "release"),
        ];
        let faults = vec![
            action(1290 * MS, false), // renewal (1300)
            action(2040 * MS, false), // release (2002), hand-over (2010)
            action(2549 * MS, false), // renewal (extend answered at 2501)
            action(2960 * MS, false), // expiry (3000)
            action(2965 * MS, true),  // the soak's end-of-fault note: not an action
            action(5000 * MS, false), // nothing
        ];
        let p = phases(&recs, &faults, true);
        assert_eq!(
            p,
            Phases {
                actions: 5,
                near_expiry: 1,
                near_renewal: 2,
                near_release: 1,
                near_handover: 1,
                near_any: 4,
                expiries: 1,
                renewals: 4,
                releases: 1,
                handovers: 1,
            }
        );
        // Session backends: no watchdog renewals are placed.
        let p = phases(&recs, &faults, false);
        assert_eq!((p.renewals, p.near_renewal), (1, 1));
    }

    #[test]
    fn near_is_inclusive_at_fifty_ms_and_not_beyond() {
        let events = [100 * MS];
        assert!(near(&events, 150 * MS));
        assert!(near(&events, 50 * MS));
        assert!(!near(&events, 150 * MS + 1));
        assert!(!near(&events, 50 * MS - 1));
        assert!(!near(&[], 0));
    }
}
