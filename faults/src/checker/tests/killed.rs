//! Where a killed holder's belief ends: at the kill, a fixed lease's safe-until, or the
//! lost() watcher's record.

use super::*;

#[test]
fn a_killed_holder_believes_until_its_death_and_recovery_is_measured() {
    let h = [acquire(1, 1, 1, 10), acquire(2, 1, 2, 60), end(2, 1, 70)];
    let faults = [Fault {
        at: 50,
        done: 50,
        what: "SIGKILL".into(),
        killed: Some(1),
        recover_from: true,
        deleted: None,
    }];
    let c = check(&h, &faults, &BTreeMap::new(), 100, Expect::default());
    assert!(c.violations.is_empty(), "{:?}", c.violations);
    assert_eq!(c.recover_ms, Some(10.0 / 1e6));
    let early = [acquire(1, 1, 1, 10), acquire(2, 1, 2, 40), end(2, 1, 70)];
    let c = check(&early, &faults, &BTreeMap::new(), 100, Expect::default());
    assert_eq!(
        c.violations.len(),
        1,
        "granted while the killed one still believed"
    );
    // Unless its guard had said lost before that grant (a watchdog hold whose renewals failed,
    // killed while its task slept): the lost() watcher's record ends the belief.
    let lost = |at| Rec::Lost {
        id: OpId {
            pid: 1,
            task: 0,
            seq: 1,
        },
        at,
        reason: "lease expired without a successful renewal".into(),
    };
    for (at, violations) in [(35, 0), (45, 1)] {
        let told = [
            acquire(1, 1, 1, 10),
            lost(at),
            acquire(2, 1, 2, 40),
            end(2, 1, 70),
        ];
        let c = check(&told, &faults, &BTreeMap::new(), 100, Expect::default());
        assert_eq!(
            c.violations.len(),
            violations,
            "told at {at}: {:?}",
            c.violations
        );
    }
    // A fixed lease stops the killed holder's belief at its safe-until (a zombie killed while it
    // stalls past it), not at the kill: a grant after the safe-until is no violation, one before
    // it still is.
    let fixed = |complete, until| {
        let mut r = acquire(1, 1, 1, complete);
        if let Rec::Acquire {
            safe_until, fixed, ..
        } = &mut r
        {
            (*safe_until, *fixed) = (Some(until), true);
        }
        r
    };
    let after = [fixed(10, 30), acquire(2, 1, 2, 40), end(2, 1, 70)];
    let c = check(&after, &faults, &BTreeMap::new(), 100, Expect::default());
    assert!(c.violations.is_empty(), "{:?}", c.violations);
    let before = [fixed(10, 45), acquire(2, 1, 2, 40), end(2, 1, 70)];
    let c = check(&before, &faults, &BTreeMap::new(), 100, Expect::default());
    assert_eq!(c.violations.len(), 1, "granted before the safe-until");
}
