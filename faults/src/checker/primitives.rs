//! (8) The checks of the primitives built on grants: a semaphore's count and an election's
//! proclaims.

use std::collections::{BTreeMap, HashMap};

use super::{Checked, Expect, Grant};
use crate::clock::ms_between;
use crate::history::{Fault, OpId, Rec};

/// How many violations of one kind on one name are spelled out.
const SHOWN: usize = 3;

/// A semaphore's name: at no instant more than `max` grants believed held (a sweep over the
/// believed intervals, an end before a start at the same instant); and a permit whose acquire
/// was sent after another grant completed has a higher token (the real-time order of the
/// name's one counter).
pub(super) fn permits(
    name: &str,
    gs: &[&Grant],
    max: u32,
    expect: Expect,
    show: &dyn Fn(&Grant) -> String,
    out: &mut Checked,
) {
    let mut events: Vec<(u64, bool, &Grant)> = Vec::new();
    for g in gs.iter().filter(|g| g.end > g.start) {
        events.push((g.start, true, g));
        events.push((g.end, false, g));
    }
    events.sort_by_key(|&(at, starts, g)| (at, starts, g.id));
    let mut held: Vec<&Grant> = Vec::new();
    let mut over = 0;
    for (at, starts, g) in events {
        if !starts {
            held.retain(|h| h.id != g.id);
            continue;
        }
        held.push(g);
        let now = u32::try_from(held.len()).unwrap_or(u32::MAX);
        out.permits_peak = out.permits_peak.max(now);
        if now > max {
            over += 1;
            if over <= SHOWN {
                let mut s = format!(
                    "semaphore {name:?} of {max}: {now} permits believed held at {at}, when {} \
                     was granted\n",
                    g.id
                );
                for h in &held {
                    s.push_str(&show(h));
                }
                out.violations.push(s);
            }
        }
    }
    if over > SHOWN {
        out.violations.push(format!(
            "semaphore {name:?} of {max}: {} more grants over it",
            over - SHOWN
        ));
    }
    if expect.volatile_restart {
        return; // the counter starts again with the server: counted with the locks' tokens
    }
    let mut by_start: Vec<&Grant> = gs.to_vec();
    by_start.sort_by_key(|g| g.start);
    let mut by_sent: Vec<&Grant> = gs.to_vec();
    by_sent.sort_by_key(|g| g.sent);
    let mut before: Option<&Grant> = None; // the highest token completed so far
    let mut next = 0;
    let mut falls = 0;
    for g in by_sent {
        while next < by_start.len() && by_start[next].start < g.sent {
            let p = by_start[next];
            if before.is_none_or(|b| p.token > b.token) {
                before = Some(p);
            }
            next += 1;
        }
        if let Some(p) = before.filter(|p| g.token <= p.token) {
            falls += 1;
            if falls <= SHOWN {
                out.violations.push(format!(
                    "fencing on semaphore {name:?}: {} got token {} though {} had {} before it \
                     was asked for\n{}{}",
                    g.id,
                    g.token,
                    p.id,
                    p.token,
                    show(p),
                    show(g)
                ));
            }
        }
    }
}

/// Every proclaim the server took was sent while no later grant of the election's name had
/// completed: a deposed leader (a zombie past its lease above all) must be refused. Later is by
/// token, the server's own order; across a restart of a server without persistence (whose
/// tokens start again) grants are not compared.
pub(super) fn proclaims(
    recs: &[Rec],
    faults: &[Fault],
    expect: Expect,
    by_name: &BTreeMap<&str, Vec<&Grant>>,
    by_grant: &HashMap<OpId, &Grant>,
    show: &dyn Fn(&Grant) -> String,
    out: &mut Checked,
) {
    let mut taken_late = 0;
    for r in recs {
        let Rec::Proclaim {
            id,
            name,
            invoke,
            accepted,
            zombie,
            ..
        } = r
        else {
            continue;
        };
        out.proclaims += 1;
        out.proclaims_taken += usize::from(*accepted);
        if *zombie {
            out.zombie_proclaims += 1;
            out.zombie_proclaims_refused += usize::from(!accepted);
        }
        let Some(g) = by_grant.get(id).filter(|_| *accepted) else {
            continue;
        };
        let later = by_name.get(name.as_str()).and_then(|gs| {
            gs.iter()
                .filter(|n| n.token > g.token && n.start < *invoke)
                .filter(|n| {
                    let (a, b) = (g.start.min(n.start), g.start.max(n.start));
                    !(expect.volatile_restart && faults.iter().any(|f| a < f.at && f.at < b))
                })
                .min_by_key(|n| n.start)
        });
        if let Some(n) = later {
            taken_late += 1;
            if taken_late <= SHOWN {
                out.violations.push(format!(
                    "election {name:?}: a proclaim of {id} (epoch {}{}) was taken {:.1} ms after \
                     {} (epoch {}) was granted\n{}{}",
                    g.token,
                    if *zombie { ", a zombie's" } else { "" },
                    ms_between(n.start, *invoke),
                    n.id,
                    n.token,
                    show(g),
                    show(n)
                ));
            }
        }
    }
    if taken_late > SHOWN {
        out.violations.push(format!(
            "elections: {} more proclaims taken from deposed leaders",
            taken_late - SHOWN
        ));
    }
}
