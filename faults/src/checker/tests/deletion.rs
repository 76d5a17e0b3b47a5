//! The out-of-band deletion's race: when an overlap is the deletion's, and when not.

use super::*;

#[test]
fn a_deletion_race_is_expected_only_when_the_victim_learned_of_it() {
    // The victim (pid 1, token 5) finishes acquiring just after the next holder (pid 2,
    // token 6) that the deletion let in, then learns of the deletion.
    let lost_end = Rec::End {
        id: OpId {
            pid: 1,
            task: 0,
            seq: 1,
        },
        name: "n".into(),
        end: 60,
        why: "release".into(),
        lost: Some("the lock's key was deleted".into()),
    };
    let h = [
        acquire(2, 1, 6, 20),
        end(2, 1, 90),
        acquire(1, 1, 5, 21),
        lost_end,
    ];
    let deletion = [deletion(19, 19)];
    let expect = Expect {
        oob_delete: true,
        allowance_ns: 100,
        ..Expect::default()
    };
    let c = check(&h, &deletion, &BTreeMap::new(), 100, expect);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
    assert_eq!(c.expected_overlaps, 1);
    // The same overlap when the victim never learned of a deletion is two violations
    // (exclusion and the falling token).
    let h = [
        acquire(2, 1, 6, 20),
        end(2, 1, 90),
        acquire(1, 1, 5, 21),
        end(1, 1, 60),
    ];
    let c = check(&h, &deletion, &BTreeMap::new(), 100, expect);
    assert_eq!(c.violations.len(), 2, "{:?}", c.violations);
    // A victim learns of the deletion as well when its release finds the lock not its own,
    // or when the register refuses its write: both make the overlap the expected race.
    let victim = OpId {
        pid: 1,
        task: 0,
        seq: 1,
    };
    let not_held = Rec::Release {
        id: victim,
        invoke: 60,
        complete: 61,
        result: "not_held".into(),
    };
    let refused = Rec::Write {
        id: victim,
        name: "n".into(),
        token: 5,
        invoke: 50,
        complete: 51,
        accepted: false,
        zombie: false,
    };
    for learned in [not_held, refused] {
        let h = [
            acquire(2, 1, 6, 20),
            end(2, 1, 90),
            acquire(1, 1, 5, 21),
            end(1, 1, 60),
            learned,
        ];
        let c = check(&h, &deletion, &BTreeMap::new(), 100, expect);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        assert_eq!(c.expected_overlaps, 1);
    }
}

#[test]
fn a_fixed_lease_deleted_behind_its_holder_may_believe_until_what_it_was_promised() {
    let ms = 1_000_000;
    let victim = OpId {
        pid: 1,
        task: 0,
        seq: 1,
    };
    // A fixed lease granted at 10 ms and promised until 990 ms; an extend that took.
    let mut granted = acquire(1, 1, 5, 10 * ms);
    if let Rec::Acquire {
        fixed, safe_until, ..
    } = &mut granted
    {
        *fixed = true;
        *safe_until = Some(990 * ms);
    }
    let extend = |invoke: u64| Rec::Extend {
        id: victim,
        ttl_ms: 1700,
        invoke,
        complete: invoke + ms,
        ok: true,
        error: None,
        safe_until: Some(invoke + 1680 * ms),
    };
    // Deleted at 300 ms; another client is granted at 400 ms and holds until 600 ms.
    let deletion = [deletion(300 * ms, 301 * ms)];
    let expect = Expect {
        oob_delete: true,
        allowance_ns: 1300 * ms,
        ..Expect::default()
    };
    let run = |extended_at: u64, victim_end: u64| {
        let h = [
            granted.clone(),
            extend(extended_at),
            end(1, 1, victim_end),
            acquire(2, 1, 6, 400 * ms),
            end(2, 1, 600 * ms),
        ];
        check(&h, &deletion, &BTreeMap::new(), 3000 * ms, expect)
    };
    // The holder speaks to nobody until it releases at 1,700 ms, within the 1,780 ms it was
    // promised before the deletion, past the allowance a watchdog lease gets: the race.
    let c = run(100 * ms, 1700 * ms);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
    assert_eq!(c.expected_overlaps, 1);
    // Believing past what it was promised is still a violation, and names the deletion.
    let c = run(100 * ms, 1900 * ms);
    assert!(
        c.violations
            .iter()
            .any(|v| v.starts_with("mutual exclusion") && v.contains("deleted \"n\"")),
        "{:?}",
        c.violations
    );
    // An extend sent after the deletion was done cannot have taken: its promise does not count.
    let c = run(350 * ms, 1700 * ms);
    assert!(
        c.violations
            .iter()
            .any(|v| v.starts_with("mutual exclusion")),
        "{:?}",
        c.violations
    );
}

#[test]
fn a_holder_that_lets_go_before_the_deletion_reaches_it_is_the_race_only_within_the_allowance() {
    // A watchdog hold (pid 1) granted at 10; its node is deleted at 30 (answered at 31), and
    // another client is granted at 33. The victim's release or drop, which knew nothing of the
    // deletion, ends its belief at `victim_end`.
    let deletion = [deletion(30, 31)];
    let expect = Expect {
        oob_delete: true,
        allowance_ns: 100,
        ..Expect::default()
    };
    let run = |victim_end: u64, newcomer_end: u64| {
        let h = [
            acquire(1, 1, 5, 10),
            end(1, 1, victim_end),
            acquire(2, 1, 6, 33),
            end(2, 1, newcomer_end),
        ];
        check(&h, &deletion, &BTreeMap::new(), 400, expect)
    };
    // Let go 24 after the deletion: as soon as a renewal would have told it.
    let c = run(55, 300);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
    assert_eq!(c.expected_overlaps, 1);
    // Still believing past the allowance (31 + 100): a violation that names the deletion.
    let c = run(140, 300);
    assert!(
        c.violations
            .iter()
            .any(|v| v.starts_with("mutual exclusion") && v.contains("deleted \"n\"")),
        "{:?}",
        c.violations
    );
    // The newcomer's early release excuses nothing: it did not hold at the deletion.
    let c = run(250, 40);
    assert!(
        c.violations
            .iter()
            .any(|v| v.starts_with("mutual exclusion")),
        "{:?}",
        c.violations
    );
}
