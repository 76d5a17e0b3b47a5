//! (7) Availability, outside fault windows: an acquire of a name is not refused while nobody
//! has believed holding it for longer than a lease plus [`AVAILABILITY_SLACK_NS`].

use std::collections::BTreeMap;

use super::{Checked, Expect, Grant, AVAILABILITY_SLACK_NS};
use crate::clock::ms_between;
use crate::history::{Fault, Rec};

pub(super) fn check(
    recs: &[Rec],
    faults: &[Fault],
    by_name: &BTreeMap<&str, Vec<&Grant>>,
    server_lease_ns: u64,
    out: &mut Checked,
) {
    let lease_ns = recs
        .iter()
        .filter_map(|r| match r {
            Rec::Acquire {
                ttl_ms: Some(t), ..
            } => Some(t * 1_000_000),
            _ => None,
        })
        .max()
        .map(|ns| ns.max(server_lease_ns));
    if let Some(lease_ns) = lease_ns {
        let bound = lease_ns + AVAILABILITY_SLACK_NS;
        let first_try: BTreeMap<&str, u64> = recs.iter().fold(BTreeMap::new(), |mut m, r| {
            if let Rec::Acquire { name, invoke, .. } = r {
                let e = m.entry(name.as_str()).or_insert(*invoke);
                *e = (*e).min(*invoke);
            }
            m
        });
        let mut faulted = Vec::new();
        let mut open: Option<u64> = None;
        for f in faults {
            match (f.recover_from, open) {
                (false, None) => open = Some(f.at),
                (true, Some(from)) => {
                    faulted.push((from, f.at + bound));
                    open = None;
                }
                (false, Some(_)) => {}
                (true, None) => faulted.push((f.at, f.at + bound)),
            }
        }
        if let Some(from) = open {
            faulted.push((from, u64::MAX));
        }
        let mut reported: BTreeMap<&str, usize> = BTreeMap::new();
        for r in recs {
            let Rec::Acquire {
                id,
                name,
                invoke,
                complete,
                outcome,
                ..
            } = r
            else {
                continue;
            };
            // Refused at `at`: a try at some instant of its call (its start, to be safe), a
            // wait when it gave up. Nobody may have believed holding it for a lease and slack.
            let at = match outcome.as_str() {
                "busy" => *invoke,
                "timeout" => *complete,
                _ => continue,
            };
            let since = at.saturating_sub(bound);
            if since < first_try.get(name.as_str()).copied().unwrap_or(0)
                || faulted.iter().any(|&(a, b)| a <= at && since <= b)
            {
                continue;
            }
            let gs = by_name.get(name.as_str()).map_or(&[][..], |v| &v[..]);
            if !gs.iter().any(|g| g.start <= at && since <= g.end) {
                let n = reported.entry(name.as_str()).or_default();
                *n += 1;
                let last = gs.iter().filter(|g| g.end <= at).map(|g| g.end).max();
                let last = last.unwrap_or(0).max(first_try[name.as_str()]);
                if *n <= 3 {
                    out.violations.push(format!(
                        "availability of {name:?}: {id} was refused ({outcome}) though nobody \
                         had believed holding it for {:.0} ms (a lease plus slack is {:.0} ms)\n{}",
                        ms_between(last, at),
                        bound as f64 / 1e6,
                        super::faults_between(faults, last.saturating_sub(bound), at)
                    ));
                }
            }
        }
    }
}

/// Recovery: from each fault's end to the next grant; a fault with none after it is
/// unrecovered if the clients kept asking for the [`recovery_window`] after it, not judged if not.
pub(super) fn recovery(
    recs: &[Rec],
    faults: &[Fault],
    grants: &[Grant],
    expect: &Expect,
    out: &mut Checked,
) {
    let mut starts: Vec<u64> = grants.iter().map(|g| g.start).collect();
    starts.sort_unstable();
    let last_ask = recs
        .iter()
        .filter_map(|r| match r {
            Rec::Acquire { invoke, .. } => Some(*invoke),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    for f in faults.iter().filter(|f| f.recover_from) {
        match starts.iter().find(|&&s| s >= f.at) {
            Some(&s) => {
                let ms = ms_between(f.at, s);
                out.recover_ms = Some(out.recover_ms.map_or(ms, |m: f64| m.max(ms)));
            }
            None if last_ask >= f.at.saturating_add(recovery_window(expect)) => {
                out.unrecovered += 1
            }
            None => out.unjudged += 1,
        }
    }
}

/// How long the clients must have kept asking after a fault's end for a fault with no grant
/// after it to count as unrecovered: a lease the fault stranded may first have to run out (a
/// holder cut off or killed), and then the clients' waits and retries, and a failed-over
/// server's replicas catching up (`sync_replicas`), take up to another; the slack as in
/// [`Expect::allowance_ns`]. In a workload of two names and long holds, stretches of more than
/// one lease without a grant are common after a failover (measured: up to 3.6 s of 3 s leases
/// in clean runs), so one lease would flag healthy runs whose fault ended near their end.
pub(crate) fn recovery_window(expect: &Expect) -> u64 {
    expect.allowance_ns.saturating_mul(2)
}
