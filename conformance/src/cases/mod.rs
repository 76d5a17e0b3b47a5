//! The cases: plain async functions, one promise each, listed in [`CASES`], in one module per
//! topic.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use distlock_api::{
    Capabilities, DistributedLock, ErrorKind, FencingToken, LeaseKind, LockExt, LockGuard,
    LockName, LockOptions, LostReason, OwnerId, MAX_PERMITS, MAX_TTL, MAX_WAIT,
};
use futures::future::join_all;

use crate::case::{Case, CaseFuture, Ctx};
use crate::proxy::Proxy;

mod basics;
mod election;
mod faults;
mod fencing;
mod guards;
mod leases;
mod lost_replies;
mod names;
mod operator;
mod options;
mod ownership;
mod reentrancy;
mod safe_until;
mod scoped;
mod semaphore;
mod waiting;
mod workload;

pub use faults::THROUGH_PROXIES;

use basics::*;
use election::*;
use faults::*;
use fencing::*;
use guards::*;
use leases::*;
use lost_replies::*;
use names::*;
use operator::*;
use options::*;
use ownership::*;
use reentrancy::*;
use safe_until::*;
use scoped::*;
use semaphore::*;
use waiting::*;
use workload::*;

type Gate = Result<(), &'static str>;

fn always(_: &Capabilities, _: bool) -> Gate {
    Ok(())
}
fn remote(_: &Capabilities, remote: bool) -> Gate {
    remote.then_some(()).ok_or("the backend has no server")
}
fn per_lock_ttl(c: &Capabilities, _: bool) -> Gate {
    c.per_lock_ttl()
        .then_some(())
        .ok_or("leases are not per lock")
}
fn session_ttl(c: &Capabilities, _: bool) -> Gate {
    (c.ttl.kind == LeaseKind::Session)
        .then_some(())
        .ok_or("leases are not session-bound")
}
fn renewal(c: &Capabilities, _: bool) -> Gate {
    c.renewal.then_some(()).ok_or("no lease renewal")
}
fn reentrant(c: &Capabilities, _: bool) -> Gate {
    c.reentrant.then_some(()).ok_or("not reentrant")
}
fn reentrant_renewal(c: &Capabilities, r: bool) -> Gate {
    reentrant(c, r).and(renewal(c, r))
}
fn reentrant_per_lock_ttl(c: &Capabilities, r: bool) -> Gate {
    reentrant(c, r).and(per_lock_ttl(c, r))
}
fn remote_per_lock_ttl(c: &Capabilities, r: bool) -> Gate {
    remote(c, r).and(per_lock_ttl(c, r))
}
fn remote_reentrant_per_lock_ttl(c: &Capabilities, r: bool) -> Gate {
    remote_per_lock_ttl(c, r).and(reentrant(c, r))
}
fn not_reentrant(c: &Capabilities, _: bool) -> Gate {
    (!c.reentrant).then_some(()).ok_or("reentrant")
}
fn fair(c: &Capabilities, _: bool) -> Gate {
    c.fair.then_some(()).ok_or("not fair (no FIFO promise)")
}
fn fencing(c: &Capabilities, _: bool) -> Gate {
    c.fencing_tokens().then_some(()).ok_or("no fencing tokens")
}
fn semaphore(c: &Capabilities, _: bool) -> Gate {
    c.semaphore.then_some(()).ok_or("no semaphores")
}
fn no_semaphore(c: &Capabilities, _: bool) -> Gate {
    (!c.semaphore).then_some(()).ok_or("has semaphores")
}
fn election(c: &Capabilities, _: bool) -> Gate {
    c.election.then_some(()).ok_or("no elections")
}
fn no_election(c: &Capabilities, _: bool) -> Gate {
    (!c.election).then_some(()).ok_or("has elections")
}
fn semaphore_per_lock_ttl(c: &Capabilities, r: bool) -> Gate {
    semaphore(c, r).and(per_lock_ttl(c, r))
}
fn semaphore_reentrant(c: &Capabilities, r: bool) -> Gate {
    semaphore(c, r).and(reentrant(c, r))
}
fn fencing_per_lock(c: &Capabilities, r: bool) -> Gate {
    fencing(c, r).and(per_lock_ttl(c, r))
}

macro_rules! cases {
    ($($name:ident : $gate:ident),* $(,)?) => {
        /// Every case, in the order they are listed and run.
        pub static CASES: &[Case] = &[
            $(Case {
                name: stringify!($name),
                applies: $gate,
                run: |cx| -> CaseFuture { Box::pin($name(cx)) },
            }),*
        ];
    };
}

cases! {
    empty_name_is_invalid_argument: always,
    name_over_255_bytes_is_invalid_argument_and_255_bytes_works: always,
    name_with_control_character_is_invalid_argument: always,
    name_with_nul_is_invalid_argument: always,
    whitespace_only_name_is_invalid_argument: always,
    slash_and_dot_names_are_distinct_working_locks: always,
    unicode_names_are_distinct_working_locks: always,
    names_are_case_sensitive: always,
    zero_ttl_is_invalid_argument: always,
    ttl_over_limit_is_invalid_argument: always,
    wait_over_limit_is_invalid_argument: always,
    malformed_owner_id_is_invalid_argument: always,
    unreachable_server_is_unavailable_within_connect_timeout: remote,
    try_acquire_free_lock_grants_with_holder_and_token: always,
    the_profile_agrees_with_itself_and_with_the_descriptor: always,
    try_acquire_held_lock_returns_none: always,
    caller_supplied_owner_is_the_holder: always,
    release_by_holder_frees_the_lock: always,
    release_by_other_owner_is_not_held_and_keeps_the_lock: always,
    release_twice_is_not_held_the_second_time: always,
    stale_release_never_frees_a_newer_holder: always,
    fixed_lease_expires_without_renewal: per_lock_ttl,
    fixed_lease_guard_reports_lost_at_safe_until: per_lock_ttl,
    takeover_after_expiry_gets_a_greater_token: fencing_per_lock,
    extend_keeps_a_fixed_lease_alive: per_lock_ttl,
    extend_after_expiry_fails_with_lost: per_lock_ttl,
    fixed_ttl_on_session_backend_is_unsupported: session_ttl,
    watchdog_keeps_the_lock_for_several_ttls: renewal,
    lost_fires_when_lock_is_removed_behind_the_holders_back: renewal,
    one_lock_removed_among_many_fires_only_its_own_guard: renewal,
    renew_by_other_owner_fails_with_lost: renewal,
    reentrant_acquire_counts_holds_and_keeps_the_token: reentrant,
    concurrent_releases_of_reentrant_holds_free_the_lock: reentrant,
    reacquire_by_holder_is_contended_without_reentrancy: not_reentrant,
    wait_bound_is_honoured_with_timeout: always,
    waiter_is_woken_promptly_by_release: always,
    waiter_takes_over_when_holder_lease_expires: per_lock_ttl,
    cancelled_acquire_leaves_nothing_behind: always,
    grant_racing_a_cancellation_is_given_back: always,
    waiters_are_granted_in_fifo_order: fair,
    tokens_increase_across_release: fencing,
    tokens_increase_across_owners: fencing,
    dropped_guard_frees_the_lock: always,
    many_distinct_names_held_at_once: always,
    mutual_exclusion_under_contention: always,
    killed_holder_process_frees_the_lock_after_its_lease: remote,
    paused_holder_process_learns_it_lost_the_lock_and_cannot_release_it: remote,
    partitioned_holder_is_lost_before_anyone_else_acquires: remote,
    waiter_outlives_a_server_outage_and_leaves_nothing_behind: remote,
    two_tasks_on_one_handle_exclude_each_other: always,
    the_same_task_asking_twice_is_excluded: always,
    reentered_holds_share_the_token_and_free_after_the_last_release: reentrant,
    guards_of_one_hold_release_in_any_order: reentrant,
    reentered_watchdog_holds_are_all_renewed: reentrant_renewal,
    reentering_a_hold_that_ended_fails_cleanly: reentrant_per_lock_ttl,
    explicit_owner_reenters_only_on_its_own_handle: reentrant,
    tasks_sharing_two_handles_keep_a_counter_exact: always,
    guard_dropped_on_a_plain_thread_frees_the_lock: always,
    a_task_granted_at_its_handles_release_holds_its_own_lease: per_lock_ttl,
    a_task_leaving_as_its_handle_releases_leaves_the_lock_free: always,
    a_guard_dropped_on_a_plain_thread_passes_the_lock_to_a_waiting_task: always,
    an_acquire_whose_reply_is_lost_is_given_back: remote_per_lock_ttl,
    an_explicit_owners_acquire_whose_reply_is_lost_is_given_back: remote_per_lock_ttl,
    a_lost_reentry_is_given_back_and_the_live_hold_kept: remote_reentrant_per_lock_ttl,
    a_lost_acquire_by_an_owner_that_holds_leaves_its_hold_alone: remote_per_lock_ttl,
    a_release_the_server_never_got_is_sent_again: remote_per_lock_ttl,
    a_release_applied_before_its_connection_closed_is_not_applied_again: remote_reentrant_per_lock_ttl,
    a_client_whose_connections_went_silent_works_again_on_new_ones: remote,
    with_lock_runs_the_work_under_the_lock_and_releases: always,
    with_lock_stops_the_work_when_the_lock_is_lost: renewal,
    extend_to_a_shorter_lease_keeps_the_guard_honest: per_lock_ttl,
    reentrant_holds_with_different_ttls_keep_the_longest_lease: reentrant_per_lock_ttl,
    late_renewal_of_an_old_grant_leaves_a_newer_grant_of_its_owner_alone: per_lock_ttl,
    list_shows_exactly_the_held_locks_under_a_prefix: always,
    bad_list_prefix_is_invalid_argument: always,
    force_release_frees_only_the_grant_of_its_token: always,
    a_reentry_that_finds_its_hold_gone_reports_the_guard_lost: reentrant,
    holder_tells_when_the_grant_began: always,
    a_mixed_workload_with_reentry_never_has_two_holders: always,
    permits_out_of_range_are_invalid_argument: always,
    permits_are_unsupported_without_a_semaphore: no_semaphore,
    never_more_than_max_permits_are_held_at_once: semaphore,
    permit_tokens_rise_across_all_permits: semaphore,
    a_conflicting_max_is_refused_while_permits_are_held: semaphore,
    a_release_wakes_a_permit_waiter: semaphore,
    a_dead_holders_permit_returns_by_its_lease: semaphore_per_lock_ttl,
    a_permit_reenters_its_own_grant: semaphore_reentrant,
    a_mixed_workload_of_permits_never_has_more_than_max_holders: semaphore,
    elections_are_unsupported_without_a_value_store: no_election,
    a_leaders_value_is_what_it_proclaimed_under_its_epoch: election,
    at_most_one_campaigner_believes_it_leads: election,
    every_observer_sees_a_takeover_and_a_vacancy: election,
    a_deposed_leaders_proclaim_is_refused: election,
    a_new_leader_never_shows_an_old_leaders_value: election,
    run_stops_the_work_when_leadership_is_lost_and_campaigns_again: election,
}

// Helpers shared by the topics.

pub(super) const LONG_WAIT: Duration = Duration::from_secs(30);

pub(super) fn watchdog(ttl: Duration) -> LockOptions {
    LockOptions::new().watchdog_ttl(ttl)
}

pub(super) async fn must_lock(c: &Arc<dyn DistributedLock>, name: &str) -> LockGuard {
    c.try_lock(name)
        .await
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {e}"))
        .unwrap_or_else(|| panic!("{name:?} should be free"))
}

pub(super) async fn holder_of(c: &Arc<dyn DistributedLock>, name: &str) -> Option<OwnerId> {
    c.holder(name)
        .await
        .unwrap_or_else(|e| panic!("holder({name:?}) failed: {e}"))
        .map(|i| i.owner)
}

/// Asserts that `name` is rejected with `InvalidArgument` before any I/O: by a working client,
/// and by one whose server is not there (which would answer `Unavailable` had it tried).
pub(super) async fn rejects_name(cx: &Ctx, name: &str) {
    let c = cx.client().await;
    let e = c.try_lock(name).await.expect_err("bad name accepted");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{name:?}: {e}");
    let e = c.lock(name, Duration::from_millis(10)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{name:?}: {e}");
    let e = c.holder(name).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{name:?}: {e}");
    rejected_without_io(cx, name, &LockOptions::new()).await;
}

pub(super) async fn rejects_options(cx: &Ctx, options: LockOptions) {
    let c = cx.client().await;
    let name = cx.name("opts");
    let e = c
        .lock_with(&name, &options)
        .await
        .expect_err("bad options accepted");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{options:?}: {e}");
    assert!(
        holder_of(&c, &name).await.is_none(),
        "rejected acquire took the lock"
    );
    rejected_without_io(cx, &name, &options).await;
}

pub(super) async fn rejected_without_io(cx: &Ctx, name: &str, options: &LockOptions) {
    if let Some(Ok(dead)) = cx.harness().unreachable_client().await {
        let e = dead.try_lock_with(name, options).await.unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::InvalidArgument,
            "bad input must be rejected before any I/O, got {e}"
        );
    }
}

/// Acquires and releases every name, all held at once by one client, each seen by inspect.
pub(super) async fn distinct_working_locks(cx: &Ctx, names: &[String]) {
    let c = cx.client().await;
    let other = cx.client().await;
    let mut guards = Vec::new();
    for n in names {
        let g = c
            .lock(n, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{n:?}: {e}"));
        assert_eq!(g.name().as_str(), n);
        guards.push(g);
    }
    for (n, g) in names.iter().zip(&guards) {
        assert_eq!(
            holder_of(&other, n).await.as_ref(),
            Some(g.owner()),
            "{n:?}"
        );
        assert!(
            other.try_lock(n).await.unwrap().is_none(),
            "{n:?} not exclusive"
        );
    }
    for g in guards {
        let n = g.name().clone();
        assert!(g.release().await.unwrap(), "{n:?} lost before release");
        assert!(
            holder_of(&other, n.as_str()).await.is_none(),
            "{n:?} still held"
        );
    }
}
