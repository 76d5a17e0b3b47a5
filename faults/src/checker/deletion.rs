//! The out-of-band deletion's own race, which the checker counts rather than calls a
//! violation.

use super::{Expect, Grant};
use crate::history::Fault;

/// Whether the overlap of `a` and `b` on `name` is the out-of-band deletion scenario's own race:
/// a deletion of `name` was sent no later than the later grant, and one of the two is its
/// victim, which could not know sooner (the fencing token protects the resource meanwhile):
/// - a grant whose guard reported the lock lost within the allowance after the deletion (a
///   watchdog lease learns at its next renewal);
/// - a grant that held at the deletion and was released or dropped within that allowance,
///   before the notice could reach it: its belief ended as soon as a learning one's would have;
/// - a fixed lease held (or being granted) at the deletion whose belief ended by the
///   safe-until the server had promised it before the deletion was done: such a holder does
///   not speak to the server until it extends or releases, so nothing can tell it sooner.
///
/// Overlaps between grants that never learned of a deletion, or that went on believing past
/// what was promised before it, are still violations.
pub(super) fn deletion_race(
    faults: &[Fault],
    name: &str,
    a: &Grant,
    b: &Grant,
    expect: Expect,
) -> bool {
    let later = a.start.max(b.start);
    faults.iter().any(|x| {
        x.deleted.as_deref() == Some(name)
            && x.at <= later
            && [a, b].iter().any(|v| {
                let ended_in_time = x.at <= v.end && v.end <= x.done + expect.allowance_ns;
                let learned = ended_in_time && (v.lost || v.start <= x.at);
                let promised = v
                    .promised
                    .iter()
                    .filter(|(sent, _)| *sent <= x.done)
                    .map(|(_, until)| *until)
                    .max();
                let unaware = v.fixed
                    && v.sent <= x.at
                    && x.at <= v.end
                    && promised.is_some_and(|until| v.end <= until);
                learned || unaware
            })
    })
}
