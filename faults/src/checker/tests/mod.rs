//! The checker's verdicts on small hand-made histories, one per check.

use super::*;

fn acquire(pid: u32, seq: u64, token: u64, complete: u64) -> Rec {
    Rec::Acquire {
        id: OpId { pid, task: 0, seq },
        name: "n".into(),
        how: "try".into(),
        invoke: complete - 1,
        complete,
        outcome: "granted".into(),
        error: None,
        token: Some(token),
        owner: Some(format!("o{pid}")),
        safe_until: None,
        ttl_ms: None,
        shared: false,
        fixed: false,
        permits: 1,
    }
}

/// A permit of a semaphore of `max` on the name `n`.
fn permit(pid: u32, seq: u64, token: u64, invoke: u64, complete: u64, max: u32) -> Rec {
    let mut r = acquire_sent(pid, seq, token, invoke, complete);
    if let Rec::Acquire { permits, .. } = &mut r {
        *permits = max;
    }
    r
}

fn proclaim(pid: u32, seq: u64, invoke: u64, accepted: bool) -> Rec {
    Rec::Proclaim {
        id: OpId { pid, task: 0, seq },
        name: "n".into(),
        invoke,
        complete: invoke + 1,
        accepted,
        error: None,
        zombie: true,
    }
}

fn acquire_sent(pid: u32, seq: u64, token: u64, invoke: u64, complete: u64) -> Rec {
    let mut r = acquire(pid, seq, token, complete);
    if let Rec::Acquire { invoke: i, .. } = &mut r {
        *i = invoke;
    }
    r
}

fn end(pid: u32, seq: u64, end: u64) -> Rec {
    Rec::End {
        id: OpId { pid, task: 0, seq },
        name: "n".into(),
        end,
        why: "release".into(),
        lost: None,
    }
}

fn granted_with(pid: u32, token: u64, complete: u64, safe_until: u64, ttl_ms: u64) -> Rec {
    let mut r = acquire(pid, 1, token, complete);
    if let Rec::Acquire {
        safe_until: s,
        ttl_ms: t,
        ..
    } = &mut r
    {
        *s = Some(safe_until);
        *t = Some(ttl_ms);
    }
    r
}

/// An out-of-band deletion of the name `n`, sent at `at` and answered at `done`.
fn deletion(at: u64, done: u64) -> Fault {
    Fault {
        at,
        done,
        what: "deleted \"n\"".into(),
        killed: None,
        recover_from: false,
        deleted: Some("n".into()),
    }
}

#[test]
fn disjoint_intervals_with_rising_tokens_pass() {
    let h = [
        acquire(1, 1, 1, 10),
        end(1, 1, 20),
        acquire(2, 1, 2, 21),
        end(2, 1, 30),
    ];
    let c = check(&h, &[], &BTreeMap::new(), 100, Expect::default());
    assert_eq!((c.grants, c.violations.len()), (2, 0), "{:?}", c.violations);
}

#[test]
fn overlapping_beliefs_are_a_violation_that_names_both_grants() {
    let h = [
        acquire(1, 1, 1, 10),
        end(1, 1, 25),
        acquire(2, 1, 2, 20),
        end(2, 1, 30),
    ];
    let c = check(&h, &[], &BTreeMap::new(), 100, Expect::default());
    assert_eq!(c.violations.len(), 1);
    assert!(c.violations[0].contains("1/0/1") && c.violations[0].contains("2/0/1"));
}

#[test]
fn falling_tokens_and_lost_updates_are_violations() {
    let h = [
        acquire(1, 1, 5, 10),
        end(1, 1, 20),
        acquire(2, 1, 4, 21),
        end(2, 1, 30),
    ];
    let cell = Cell {
        counter: 1,
        sets: 2,
        lost_updates: 1,
        ..Cell::default()
    };
    let resource = BTreeMap::from([("n".to_string(), cell)]);
    let c = check(&h, &[], &resource, 100, Expect::default());
    assert_eq!(c.violations.len(), 2, "{:?}", c.violations);
    assert!(c.violations[0].starts_with("fencing"));
    assert!(c.violations[1].starts_with("counter"));
}

#[test]
fn a_fault_with_no_grant_after_it_is_unrecovered_only_if_the_clients_kept_asking() {
    let expect = Expect {
        allowance_ns: 100,
        ..Expect::default()
    };
    assert_eq!(availability::recovery_window(&expect), 200);
    let healed = [Fault {
        at: 50,
        done: 50,
        what: "old master restarted".into(),
        killed: None,
        recover_from: true,
        deleted: None,
    }];
    // An acquire of client 2 refused at `invoke`.
    let refused = |seq, invoke| {
        let mut r = acquire_sent(2, seq, 0, invoke, invoke + 1);
        if let Rec::Acquire { outcome, token, .. } = &mut r {
            (*outcome, *token) = ("busy".into(), None);
        }
        r
    };
    let before = [acquire(1, 1, 1, 10), end(1, 1, 20)];
    let run = |asks: &[Rec]| {
        let h: Vec<Rec> = before.iter().chain(asks).cloned().collect();
        let c = check(&h, &healed, &BTreeMap::new(), 400, expect);
        (c.unrecovered, c.unjudged, c.recover_ms)
    };
    // Refused up to 300, past the end of the window (50 + 200): the lock stayed unavailable.
    assert_eq!(run(&[refused(1, 100), refused(2, 300)]), (1, 0, None));
    // The clients stopped asking at 200, inside the window: too short a tail to judge.
    assert_eq!(run(&[refused(1, 100), refused(2, 200)]), (0, 1, None));
    // A grant after the fault's end is a recovery, measured from it.
    assert_eq!(
        run(&[refused(1, 100), acquire(2, 2, 2, 150), end(2, 2, 160)]),
        (0, 0, Some(100.0 / 1e6))
    );
}

#[test]
fn tokens_restarting_after_a_volatile_restart_are_counted_not_violations() {
    let h = [
        acquire(1, 1, 7, 10),
        end(1, 1, 20),
        acquire(2, 1, 1, 60),
        end(2, 1, 70),
        acquire(3, 1, 1, 80),
        end(3, 1, 90),
    ];
    let restart = [Fault {
        at: 50,
        done: 50,
        what: "server restarted empty".into(),
        killed: None,
        recover_from: true,
        deleted: None,
    }];
    let volatile = Expect {
        volatile_restart: true,
        ..Expect::default()
    };
    let c = check(&h, &restart, &BTreeMap::new(), 100, volatile);
    assert_eq!(c.token_restarts, 1, "7 then 1 across the restart");
    // 1 then 1 with no restart in between is still a violation.
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    assert!(c.violations[0].starts_with("fencing"));
    // Without the expectation, the fall across the restart is a violation too.
    let c = check(&h, &restart, &BTreeMap::new(), 100, Expect::default());
    assert_eq!((c.token_restarts, c.violations.len()), (0, 2));
}

#[test]
fn a_safe_until_past_the_lease_is_a_violation() {
    let ms = 1_000_000;
    // A 1000 ms lease completed at 10 ms: the bound is 10 + 1000 - 12 = 998 ms.
    let ok = [
        granted_with(1, 1, 10 * ms, 998 * ms, 1000),
        end(1, 1, 20 * ms),
    ];
    let c = check(&ok, &[], &BTreeMap::new(), 2000 * ms, Expect::default());
    assert!(c.violations.is_empty(), "{:?}", c.violations);
    let late = [
        granted_with(1, 1, 10 * ms, 1005 * ms, 1000),
        end(1, 1, 20 * ms),
    ];
    let c = check(&late, &[], &BTreeMap::new(), 2000 * ms, Expect::default());
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    assert!(c.violations[0].starts_with("safe-until of 1/0/1"));
    // An extend to a shorter lease cannot move safe-until past the longer one before it;
    // a longer one is bounded by what it asked for.
    let extend = |ttl_ms, complete, su| Rec::Extend {
        id: OpId {
            pid: 1,
            task: 0,
            seq: 1,
        },
        ttl_ms,
        invoke: complete - 1,
        complete,
        ok: true,
        error: None,
        safe_until: Some(su),
    };
    let h = [
        granted_with(1, 1, 10 * ms, 998 * ms, 1000),
        extend(200, 100 * ms, 998 * ms),
        extend(2000, 200 * ms, 2178 * ms),
        end(1, 1, 300 * ms),
    ];
    let c = check(&h, &[], &BTreeMap::new(), 3000 * ms, Expect::default());
    assert!(c.violations.is_empty(), "{:?}", c.violations);
    let h = [
        granted_with(1, 1, 10 * ms, 998 * ms, 1000),
        extend(2000, 200 * ms, 2300 * ms),
        end(1, 1, 300 * ms),
    ];
    let c = check(&h, &[], &BTreeMap::new(), 3000 * ms, Expect::default());
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
}

#[test]
fn a_reentry_of_another_token_or_refused_while_believed_is_a_violation() {
    let ms = 1_000_000;
    let id = OpId {
        pid: 1,
        task: 0,
        seq: 1,
    };
    let reenter = |token: Option<u64>, error: Option<&str>| Rec::Reenter {
        id,
        invoke: 10 * ms,
        complete: 11 * ms,
        token,
        hold_count: token.map(|_| 2),
        error: error.map(String::from),
    };
    let run = |r: Rec, faults: &[Fault]| {
        let h = [acquire(1, 1, 7, ms), r, end(1, 1, 100 * ms)];
        check(&h, faults, &BTreeMap::new(), 200 * ms, Expect::default())
    };
    assert!(run(reenter(Some(7), None), &[]).violations.is_empty());
    let c = run(reenter(Some(8), None), &[]);
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    assert_eq!((c.reentries, c.reentries_granted), (1, 1));
    let c = run(reenter(None, Some("Lost: ended")), &[]);
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    // Refused under a fault, or as unavailable: not the library's word against itself.
    let fault = Fault {
        at: 5 * ms,
        done: 5 * ms,
        what: "SIGSTOP redis-server".into(),
        killed: None,
        recover_from: false,
        deleted: None,
    };
    assert!(run(reenter(None, Some("Lost: ended")), &[fault])
        .violations
        .is_empty());
    assert!(run(reenter(None, Some("Unavailable: down")), &[])
        .violations
        .is_empty());
    // A deletion sent while the acquire was in flight may have taken what it was granted.
    let h = [
        acquire_sent(1, 1, 7, ms / 2, ms),
        reenter(None, Some("Lost: ended")),
        end(1, 1, 100 * ms),
    ];
    let check_with = |f: Fault| check(&h, &[f], &BTreeMap::new(), 200 * ms, Expect::default());
    assert!(check_with(deletion(3 * ms / 4, ms)).violations.is_empty());
    assert_eq!(check_with(deletion(ms / 4, ms / 4)).violations.len(), 1);
    // One sent before the acquire but answered after it was sent (a row lock held it back)
    // may have been applied to the new grant.
    assert!(check_with(deletion(ms / 4, 3 * ms / 4))
        .violations
        .is_empty());
}

#[test]
fn a_lock_refused_long_after_its_last_believer_is_unavailable() {
    let ms = 1_000_000;
    let busy = |pid: u32, at: u64| {
        let mut r = acquire(pid, 9, 0, at + 1);
        if let Rec::Acquire {
            outcome,
            token,
            invoke,
            ..
        } = &mut r
        {
            *outcome = "busy".into();
            *token = None;
            *invoke = at;
        }
        r
    };
    // A 1000 ms lease: refused 2.5 s after the last belief ended is within lease plus
    // slack; 3.5 s after is a hold nobody owns.
    let granted = granted_with(1, 1, 10 * ms, 900 * ms, 1000);
    let run = |refused_at: u64, faults: &[Fault]| {
        let h = [granted.clone(), end(1, 1, 100 * ms), busy(2, refused_at)];
        check(&h, faults, &BTreeMap::new(), 10_000 * ms, Expect::default())
    };
    assert!(run(2_600 * ms, &[]).violations.is_empty());
    let c = run(3_600 * ms, &[]);
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    assert!(c.violations[0].starts_with("availability"));
    // Within a fault window (and a lease plus slack after it), refusals are the fault's.
    let fault = |at, recover_from| Fault {
        at,
        done: at,
        what: "SIGSTOP redis-server".into(),
        killed: None,
        recover_from,
        deleted: None,
    };
    let faults = [fault(3_000 * ms, false), fault(3_200 * ms, true)];
    assert!(run(3_600 * ms, &faults).violations.is_empty());
    // A violation names the faults around it (none here).
    assert!(
        c.violations[0].contains("no fault recorded"),
        "{:?}",
        c.violations
    );
    // Where the server keeps a dead holder's claim longer than the guard's lease (ZooKeeper's
    // session is twice the guard's lease), the bound is the server's: 3.6 s after a belief
    // that ended is within a 2 s session plus slack, and 4.6 s is not.
    let on_sessions = |refused_at: u64| {
        let h = [granted.clone(), end(1, 1, 100 * ms), busy(2, refused_at)];
        let expect = Expect {
            server_lease_ns: 2_000 * ms,
            ..Expect::default()
        };
        check(&h, &[], &BTreeMap::new(), 10_000 * ms, expect)
    };
    assert!(on_sessions(3_600 * ms).violations.is_empty());
    assert_eq!(on_sessions(4_600 * ms).violations.len(), 1);
}

#[test]
fn a_leased_grant_without_safe_until_is_a_violation() {
    let mut r = granted_with(1, 1, 10, 900, 1000);
    if let Rec::Acquire { safe_until, .. } = &mut r {
        *safe_until = None;
    }
    let c = check(
        &[r, end(1, 1, 20)],
        &[],
        &BTreeMap::new(),
        100,
        Expect::default(),
    );
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
}

#[test]
fn a_safe_until_past_the_servers_expiry_is_a_violation() {
    let ms = 1_000_000;
    let id = OpId {
        pid: 1,
        task: 0,
        seq: 1,
    };
    let expiry = |su: u64, left: u64| Rec::Expiry {
        id,
        safe_until: Some(su),
        invoke: 100 * ms,
        complete: 101 * ms,
        holder_is_grant: true,
        remaining_ms: Some(left),
    };
    let run = |r: Rec| {
        let h = [acquire(1, 1, 7, ms), r, end(1, 1, 150 * ms)];
        check(&h, &[], &BTreeMap::new(), 200 * ms, Expect::default())
    };
    assert!(run(expiry(500 * ms, 400)).violations.is_empty());
    let c = run(expiry(900 * ms, 400));
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    assert!(c.violations[0].contains("server's expiry"));
}

#[test]
fn up_to_max_permits_at_once_pass_and_one_more_is_a_violation() {
    // Three permits of 2: the third granted while both others are believed held.
    let two = [
        permit(1, 1, 1, 5, 10, 2),
        permit(2, 1, 2, 6, 12, 2),
        end(1, 1, 20),
        permit(3, 1, 3, 15, 20, 2), // granted as the first ends: two at once
        end(2, 1, 30),
        end(3, 1, 30),
    ];
    let c = check(&two, &[], &BTreeMap::new(), 100, Expect::default());
    assert_eq!(
        (c.violations.len(), c.permits_peak),
        (0, 2),
        "{:?}",
        c.violations
    );
    let three = [
        permit(1, 1, 1, 5, 10, 2),
        permit(2, 1, 2, 6, 12, 2),
        permit(3, 1, 3, 13, 15, 2),
        end(1, 1, 20),
        end(2, 1, 30),
        end(3, 1, 30),
    ];
    let c = check(&three, &[], &BTreeMap::new(), 100, Expect::default());
    assert_eq!(c.permits_peak, 3);
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    assert!(
        c.violations[0].starts_with("semaphore"),
        "{}",
        c.violations[0]
    );
}

#[test]
fn a_permit_asked_for_after_another_completed_needs_a_higher_token() {
    // Concurrent acquires may complete out of token order; one sent after a grant may not.
    let fine = [
        permit(1, 1, 2, 5, 10, 2),
        permit(2, 1, 1, 6, 11, 2),
        end(1, 1, 20),
        end(2, 1, 20),
    ];
    let c = check(&fine, &[], &BTreeMap::new(), 100, Expect::default());
    assert_eq!(c.violations.len(), 0, "{:?}", c.violations);
    let falls = [
        permit(1, 1, 2, 5, 10, 2),
        end(1, 1, 20),
        permit(2, 1, 1, 11, 12, 2),
        end(2, 1, 20),
    ];
    let c = check(&falls, &[], &BTreeMap::new(), 100, Expect::default());
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    assert!(
        c.violations[0].starts_with("fencing on semaphore"),
        "{}",
        c.violations[0]
    );
}

#[test]
fn a_proclaim_taken_after_a_later_grant_is_a_violation() {
    let h = [
        acquire(1, 1, 1, 10),
        end(1, 1, 20),
        acquire(2, 1, 2, 30),
        end(2, 1, 40),
        proclaim(1, 1, 15, true),  // while it led: fine
        proclaim(1, 1, 35, false), // a zombie's, refused: fine
    ];
    let c = check(&h, &[], &BTreeMap::new(), 100, Expect::default());
    assert_eq!(c.violations.len(), 0, "{:?}", c.violations);
    assert_eq!((c.zombie_proclaims, c.zombie_proclaims_refused), (2, 1));
    let mut taken = h.to_vec();
    taken.push(proclaim(1, 1, 36, true));
    let c = check(&taken, &[], &BTreeMap::new(), 100, Expect::default());
    assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    assert!(
        c.violations[0].starts_with("election"),
        "{}",
        c.violations[0]
    );
}

#[test]
fn across_a_restart_without_persistence_proclaims_are_not_compared_by_token() {
    // Epoch 2 before the restart; the empty server grants epoch 1 again after it.
    let h = [
        acquire(1, 1, 2, 10),
        end(1, 1, 20),
        acquire(2, 1, 1, 60),
        end(2, 1, 90),
        proclaim(2, 1, 70, true),
    ];
    let restart = Fault {
        at: 30,
        done: 30,
        what: "SIGKILL server (no persistence)".into(),
        killed: None,
        recover_from: false,
        deleted: None,
    };
    let volatile = Expect {
        volatile_restart: true,
        ..Expect::default()
    };
    let c = check(&h, &[restart], &BTreeMap::new(), 100, volatile);
    assert!(
        c.violations.iter().all(|v| !v.starts_with("election")),
        "{:?}",
        c.violations
    );
    // With no restart in between, epoch 2 is the later grant and the proclaim is flagged.
    let c = check(&h, &[], &BTreeMap::new(), 100, Expect::default());
    assert!(
        c.violations.iter().any(|v| v.starts_with("election")),
        "{:?}",
        c.violations
    );
}

mod deletion;
mod killed;
