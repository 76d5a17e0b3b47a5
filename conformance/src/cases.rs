//! The cases: plain async functions, one promise each, listed in [`CASES`].

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_api::{
    Capabilities, DistributedLock, ErrorKind, FencingToken, LeaseKind, LockExt, LockGuard,
    LockName, LockOptions, LostReason, OwnerId, MAX_TTL, MAX_WAIT,
};
use futures::future::join_all;

use crate::lease::*;
use crate::ownership::*;
use crate::proxy::Proxy;
use crate::runner::{Case, CaseFuture, Ctx};
use crate::scoped::*;

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
    reentering_a_hold_that_ended_fails_cleanly: reentrant_per_lock_ttl,
    explicit_owner_reenters_only_on_its_own_handle: reentrant,
    tasks_sharing_two_handles_keep_a_counter_exact: always,
    guard_dropped_on_a_plain_thread_frees_the_lock: always,
    an_acquire_whose_reply_is_lost_is_given_back: remote_per_lock_ttl,
    an_explicit_owners_acquire_whose_reply_is_lost_is_given_back: remote_per_lock_ttl,
    a_lost_reentry_is_given_back_and_the_live_hold_kept: remote_reentrant_per_lock_ttl,
    a_lost_acquire_by_an_owner_that_holds_leaves_its_hold_alone: remote_per_lock_ttl,
    a_release_the_server_never_got_is_sent_again: remote_per_lock_ttl,
    with_lock_runs_the_work_under_the_lock_and_releases: always,
    with_lock_stops_the_work_when_the_lock_is_lost: renewal,
    extend_to_a_shorter_lease_keeps_the_guard_honest: per_lock_ttl,
    reentrant_holds_with_different_ttls_keep_the_longest_lease: reentrant_per_lock_ttl,
    late_renewal_of_an_old_grant_leaves_a_newer_grant_of_its_owner_alone: per_lock_ttl,
}

// ---------------------------------------------------------------------------------------------
// Helpers

const LONG_WAIT: Duration = Duration::from_secs(30);

fn watchdog(ttl: Duration) -> LockOptions {
    LockOptions::new().watchdog_ttl(ttl)
}

async fn must_lock(c: &Arc<dyn DistributedLock>, name: &str) -> LockGuard {
    c.try_lock(name)
        .await
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {e}"))
        .unwrap_or_else(|| panic!("{name:?} should be free"))
}

async fn holder_of(c: &Arc<dyn DistributedLock>, name: &str) -> Option<OwnerId> {
    c.holder(name)
        .await
        .unwrap_or_else(|e| panic!("holder({name:?}) failed: {e}"))
        .map(|i| i.owner)
}

/// Asserts that `name` is rejected with `InvalidArgument` before any I/O: by a working client,
/// and by one whose server is not there (which would answer `Unavailable` had it tried).
async fn rejects_name(cx: &Ctx, name: &str) {
    let c = cx.client().await;
    let e = c.try_lock(name).await.expect_err("bad name accepted");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{name:?}: {e}");
    let e = c.lock(name, Duration::from_millis(10)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{name:?}: {e}");
    let e = c.holder(name).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{name:?}: {e}");
    rejected_without_io(cx, name, &LockOptions::new()).await;
}

async fn rejects_options(cx: &Ctx, options: LockOptions) {
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

async fn rejected_without_io(cx: &Ctx, name: &str, options: &LockOptions) {
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
async fn distinct_working_locks(cx: &Ctx, names: &[String]) {
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

// ---------------------------------------------------------------------------------------------
// Names

async fn empty_name_is_invalid_argument(cx: Ctx) {
    rejects_name(&cx, "").await;
}

async fn name_over_255_bytes_is_invalid_argument_and_255_bytes_works(cx: Ctx) {
    let p = cx.name("");
    let ok = format!("{p}{}", "n".repeat(255 - p.len()));
    assert_eq!(ok.len(), 255);
    rejects_name(&cx, &format!("{ok}n")).await;
    // Multi-byte: 255 bytes made of 3-byte characters after the prefix, padded with ASCII.
    let room = 255 - p.len();
    let wide = format!("{p}{}{}", "€".repeat(room / 3), "w".repeat(room % 3));
    assert_eq!(wide.len(), 255);
    distinct_working_locks(&cx, &[ok, wide]).await;
}

async fn name_with_control_character_is_invalid_argument(cx: Ctx) {
    for bad in ["a\nb", "tab\there", "esc\u{1b}", "del\u{7f}", "c1\u{85}"] {
        rejects_name(&cx, &cx.name(bad)).await;
    }
}

async fn name_with_nul_is_invalid_argument(cx: Ctx) {
    rejects_name(&cx, &cx.name("nul\0byte")).await;
    rejects_name(&cx, "\0").await;
}

async fn whitespace_only_name_is_invalid_argument(cx: Ctx) {
    for bad in [" ", "   ", "\u{3000}", "\u{a0}"] {
        rejects_name(&cx, bad).await;
    }
}

async fn slash_and_dot_names_are_distinct_working_locks(cx: Ctx) {
    let mut names: Vec<String> = [
        "", "/", "a/b", "a", "a/", "/a", ".", "..", "a/./b", "a/../b", "a//b",
    ]
    .iter()
    .map(|s| cx.name(s))
    .collect();
    // Exactly these names matter to path-based backends; any leftover holder of them from an
    // earlier crashed run has a short lease, hence `lock` with a wait rather than `try_lock`.
    names.extend(["/", ".", "..", "zookeeper"].map(String::from));
    // Two suite runs against one server would race for those exact names, so runs take turns
    // through a lock of the backend itself.
    let turns = cx.client().await;
    let turn = turns
        .lock("distlock-conformance: exact names", Duration::from_secs(60))
        .await
        .expect("waiting for another suite run to finish with the exact names");
    distinct_working_locks(&cx, &names).await;
    assert!(turn.release().await.unwrap());
}

async fn unicode_names_are_distinct_working_locks(cx: Ctx) {
    // "é" precomposed and decomposed are different strings, so different locks.
    let names: Vec<String> = [
        "ключ", "锁", "🔒", "\u{e9}", "e\u{301}", "{tag}", "*?[]", "%2F", "'\"`;--",
    ]
    .iter()
    .map(|s| cx.name(s))
    .collect();
    distinct_working_locks(&cx, &names).await;
}

async fn names_are_case_sensitive(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let (upper, lower) = (cx.name("Lock"), cx.name("lock"));
    let ga = must_lock(&a, &upper).await;
    let gb = b
        .try_lock(&lower)
        .await
        .unwrap()
        .expect("\"lock\" must be a different lock from \"Lock\"");
    assert_eq!(holder_of(&a, &upper).await.as_ref(), Some(ga.owner()));
    assert_eq!(holder_of(&a, &lower).await.as_ref(), Some(gb.owner()));
    assert!(ga.release().await.unwrap());
    assert!(gb.release().await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Bad options

async fn zero_ttl_is_invalid_argument(cx: Ctx) {
    rejects_options(&cx, LockOptions::new().ttl(Duration::ZERO)).await;
    rejects_options(&cx, LockOptions::new().watchdog_ttl(Duration::ZERO)).await;
    rejects_options(&cx, LockOptions::new().ttl(Duration::from_micros(999))).await;
}

async fn ttl_over_limit_is_invalid_argument(cx: Ctx) {
    rejects_options(
        &cx,
        LockOptions::new().ttl(MAX_TTL + Duration::from_secs(1)),
    )
    .await;
    rejects_options(&cx, LockOptions::new().watchdog_ttl(Duration::MAX)).await;
}

async fn wait_over_limit_is_invalid_argument(cx: Ctx) {
    rejects_options(
        &cx,
        LockOptions::new().wait(MAX_WAIT + Duration::from_secs(1)),
    )
    .await;
    rejects_options(&cx, LockOptions::new().wait(Duration::MAX)).await;
    let c = cx.client().await;
    let e = c.lock(&cx.name("w"), Duration::MAX).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

async fn malformed_owner_id_is_invalid_argument(cx: Ctx) {
    for bad in ["", "has space", "slash/y", "ünï", &"o".repeat(65)] {
        let e = OwnerId::new(bad).expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    // A well-formed caller-chosen owner works (checked in caller_supplied_owner_is_the_holder).
    let c = cx.client().await;
    let g = c
        .try_lock_with(
            &cx.name("o"),
            &LockOptions::new().owner(OwnerId::new("ok-owner_1.x:y").unwrap()),
        )
        .await
        .unwrap()
        .expect("free");
    assert_eq!(g.owner().label(), "ok-owner_1.x:y");
    assert!(g.release().await.unwrap());
}

async fn unreachable_server_is_unavailable_within_connect_timeout(cx: Ctx) {
    let limit = cx.harness().connect_timeout() + Duration::from_secs(3);
    let started = Instant::now();
    let outcome = match cx.harness().unreachable_client().await {
        None => panic!("a remote backend must provide an unreachable client"),
        Some(Err(e)) => Err(e),
        Some(Ok(dead)) => dead.try_lock(&cx.name("u")).await.map(|_| ()),
    };
    let took = started.elapsed();
    let e = outcome.expect_err("an unreachable server cannot grant a lock");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_temporary(), "Unavailable should be retryable: {e}");
    assert!(
        took <= limit,
        "took {took:?}, more than the connect timeout + 3 s"
    );
}

// ---------------------------------------------------------------------------------------------
// Acquire, inspect, release

async fn try_acquire_free_lock_grants_with_holder_and_token(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("free");
    assert!(c.holder(&name).await.unwrap().is_none());
    let sent = Instant::now();
    let g = must_lock(&c, &name).await;
    assert_eq!(g.name().as_str(), name);
    assert_eq!(g.owner().label(), c.core().owner().label());
    assert_eq!(g.hold_count(), 1);
    assert!(!g.is_lost());
    if c.capabilities().fencing_tokens() {
        assert!(
            g.token() > FencingToken(0),
            "a fencing backend issued token 0"
        );
    }
    let info = c.holder(&name).await.unwrap().expect("held");
    assert_eq!(&info.owner, g.owner());
    assert_eq!(info.hold_count, 1);
    assert_eq!(info.token, g.token());
    if let Some(until) = g.safe_until() {
        assert!(
            until > Instant::now(),
            "fresh grant already past safe-until"
        );
        assert!(until <= sent + g.ttl() + Duration::from_millis(50) + (Instant::now() - sent));
    }
    if c.capabilities().per_lock_ttl() {
        let rem = info
            .remaining
            .expect("per-lock leases report the remaining lease");
        assert!(rem <= g.ttl(), "remaining {rem:?} > granted {:?}", g.ttl());
    }
    assert!(g.release().await.unwrap());
}

async fn try_acquire_held_lock_returns_none(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("held");
    let g = must_lock(&a, &name).await;
    assert!(b.try_lock(&name).await.unwrap().is_none());
    let e = b.lock(&name, Duration::ZERO).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(holder_of(&b, &name).await.as_ref(), Some(g.owner()));
    assert!(g.release().await.unwrap());
}

async fn caller_supplied_owner_is_the_holder(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("own");
    let me = OwnerId::new(format!("worker-{}", std::process::id())).unwrap();
    let g = c
        .try_lock_with(&name, &LockOptions::new().owner(me.clone()))
        .await
        .unwrap()
        .expect("free");
    // The label is the caller's; the id the server stores is qualified by the handle.
    assert_eq!(g.owner().label(), me.label());
    assert_eq!(holder_of(&c, &name).await.as_ref(), Some(g.owner()));
    // An acquisition without that owner is someone else for this lock.
    assert!(c.try_lock(&name).await.unwrap().is_none());
    assert!(g.release().await.unwrap());
}

async fn release_by_holder_frees_the_lock(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("rel");
    let g = must_lock(&a, &name).await;
    assert!(
        g.release().await.unwrap(),
        "holder's release must report held"
    );
    assert!(holder_of(&b, &name).await.is_none());
    let g2 = must_lock(&b, &name).await;
    assert!(g2.release().await.unwrap());
}

async fn release_by_other_owner_is_not_held_and_keeps_the_lock(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("foreign");
    let g = must_lock(&a, &name).await;
    let mut forged = g.grant().clone();
    forged.owner = b.core().owner().clone();
    assert!(
        !b.release(&forged).await.unwrap(),
        "foreign release reported held"
    );
    assert!(
        !a.release(&forged).await.unwrap(),
        "foreign release reported held"
    );
    assert_eq!(holder_of(&a, &name).await.as_ref(), Some(g.owner()));
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "foreign release freed the lock"
    );
    assert!(g.release().await.unwrap());
}

async fn release_twice_is_not_held_the_second_time(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("twice");
    let g = must_lock(&c, &name).await;
    let grant = g.grant().clone();
    assert!(g.release().await.unwrap());
    assert!(
        !c.release(&grant).await.unwrap(),
        "second release reported held"
    );
    assert!(holder_of(&c, &name).await.is_none());
}

async fn stale_release_never_frees_a_newer_holder(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("stale");
    let old = must_lock(&a, &name).await;
    let stale = old.grant().clone();
    assert!(old.release().await.unwrap());
    let newer = must_lock(&b, &name).await;
    // The stale grant, and the same owner's id with the newer grant's token, both fail.
    assert!(!a.release(&stale).await.unwrap());
    let mut mixed = newer.grant().clone();
    mixed.owner = stale.owner.clone();
    assert!(!a.release(&mixed).await.unwrap());
    assert_eq!(holder_of(&a, &name).await.as_ref(), Some(newer.owner()));
    assert!(!newer.is_lost());
    assert!(newer.release().await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Leases

async fn fixed_lease_expires_without_renewal(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("exp");
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "held within its lease"
    );
    tokio::time::sleep(ttl + ttl / 2 + Duration::from_millis(50)).await;
    assert!(g.is_lost(), "guard past its lease still claims the lock");
    assert!(holder_of(&b, &name).await.is_none(), "lease did not expire");
    let g2 = must_lock(&b, &name).await;
    assert!(
        !g.release().await.unwrap(),
        "expired grant's release reported held"
    );
    assert_eq!(holder_of(&b, &name).await.as_ref(), Some(g2.owner()));
    assert!(g2.release().await.unwrap());
}

async fn fixed_lease_guard_reports_lost_at_safe_until(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let c = cx.client().await;
    let sent = Instant::now();
    let g = c
        .try_lock_with(&cx.name("safe"), &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let until = g.safe_until().expect("leased");
    assert!(until <= Instant::now() + ttl, "safe-until beyond the lease");
    assert!(until > sent, "safe-until before the request");
    let reason = tokio::time::timeout(ttl * 3 + Duration::from_secs(1), g.lost())
        .await
        .expect("lost() did not fire after the fixed lease ran out");
    assert_eq!(reason, LostReason::Expired);
    assert!(Instant::now() >= until, "lost fired before safe-until");
    assert!(g.is_lost());
    assert_eq!(g.lost_reason(), Some(LostReason::Expired));
}

async fn takeover_after_expiry_gets_a_greater_token(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("take");
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let g2 = b
        .lock(&name, ttl * 10 + Duration::from_secs(2))
        .await
        .expect("waiter takes over after the lease");
    assert!(g2.token() > g.token(), "{} !> {}", g2.token(), g.token());
    assert!(!g.release().await.unwrap());
    assert!(g2.release().await.unwrap());
}

async fn extend_keeps_a_fixed_lease_alive(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("ext");
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let first_until = g.safe_until().unwrap();
    tokio::time::sleep(ttl / 2).await;
    g.extend(ttl * 4).await.expect("extend within the lease");
    assert!(
        g.safe_until().unwrap() > first_until,
        "safe-until not moved"
    );
    tokio::time::sleep(ttl).await; // past the original lease
    assert!(!g.is_lost());
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "extended lock was free"
    );
    assert!(g.release().await.unwrap());
}

async fn extend_after_expiry_fails_with_lost(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let c = cx.client().await;
    let g = c
        .try_lock_with(&cx.name("late"), &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    tokio::time::sleep(ttl + ttl / 2 + Duration::from_millis(50)).await;
    let e = g.extend(ttl).await.expect_err("extended an expired lease");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert!(g.is_lost());
}

async fn fixed_ttl_on_session_backend_is_unsupported(cx: Ctx) {
    let c = cx.client().await;
    let e = c
        .try_lock_with(
            &cx.name("fx"),
            &LockOptions::new().ttl(Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
}

async fn watchdog_keeps_the_lock_for_several_ttls(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("wd");
    let g = a
        .try_lock_with(&name, &watchdog(ttl))
        .await
        .unwrap()
        .expect("free");
    let first_until = g.safe_until();
    for _ in 0..4 {
        tokio::time::sleep(ttl).await;
        assert!(
            !g.is_lost(),
            "watchdog let the lock go: {:?}",
            g.lost_reason()
        );
        assert!(
            b.try_lock(&name).await.unwrap().is_none(),
            "lock free while renewed"
        );
    }
    assert!(
        g.safe_until() > first_until,
        "renewals did not move safe-until"
    );
    assert!(g.release().await.unwrap());
    assert!(holder_of(&b, &name).await.is_none());
}

async fn lost_fires_when_lock_is_removed_behind_the_holders_back(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("gone");
    let g = a
        .try_lock_with(&name, &watchdog(ttl))
        .await
        .unwrap()
        .expect("free");
    // Already waiting when the lock goes: it must be woken, not just answer when first polled.
    let lost = tokio::spawn(g.lost());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!lost.is_finished(), "lost() fired while the lock was held");
    cx.harness()
        .remove_behind_back(&LockName::new(&name).unwrap())
        .await
        .expect("remove hook");
    let reason = tokio::time::timeout(ttl * 3 + Duration::from_secs(2), lost)
        .await
        .expect("lost() did not fire after the lock was removed")
        .expect("the lost() task");
    assert!(
        matches!(
            reason,
            LostReason::Taken(_) | LostReason::Session(_) | LostReason::Expired
        ),
        "{reason:?}"
    );
    assert!(g.is_lost());
    // Someone else can take it, and the old guard's release does not touch them.
    let g2 = b.lock(&name, Duration::from_secs(10)).await.unwrap();
    assert!(
        !g.release().await.unwrap(),
        "lost guard's release reported held"
    );
    assert_eq!(holder_of(&b, &name).await.as_ref(), Some(g2.owner()));
    assert!(g2.release().await.unwrap());
}

/// Locks acquired together are renewed together (in one request where the backend batches
/// renewals); one of them removed behind the holder's back fires that guard alone, and the
/// others stay held past several leases.
async fn one_lock_removed_among_many_fires_only_its_own_guard(cx: Ctx) {
    const LOCKS: usize = 12;
    const GONE: usize = 5;
    let ttl = cx.harness().short_ttl();
    let a = cx.client().await;
    let mut guards = Vec::new();
    for i in 0..LOCKS {
        let g = a
            .try_lock_with(&cx.name(&format!("among-{i}")), &watchdog(ttl))
            .await
            .unwrap()
            .expect("free");
        guards.push(g);
    }
    let lost = guards[GONE].lost();
    cx.harness()
        .remove_behind_back(guards[GONE].name())
        .await
        .expect("remove hook");
    tokio::time::timeout(ttl * 3 + Duration::from_secs(2), lost)
        .await
        .expect("lost() did not fire after the lock was removed");
    // Two more leases: every other lock must have been renewed meanwhile.
    tokio::time::sleep(ttl * 2).await;
    for (i, g) in guards.iter().enumerate() {
        if i == GONE {
            continue;
        }
        assert!(!g.is_lost(), "{}: {:?}", g.name(), g.lost_reason());
        assert_eq!(
            holder_of(&a, g.name().as_str()).await.as_ref(),
            Some(g.owner()),
            "{} is no longer held",
            g.name()
        );
    }
    for (i, g) in guards.into_iter().enumerate() {
        assert_eq!(g.release().await.unwrap(), i != GONE, "release of lock {i}");
    }
}

async fn renew_by_other_owner_fails_with_lost(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("rn");
    let g = must_lock(&a, &name).await;
    let mut forged = g.grant().clone();
    forged.owner = b.core().owner().clone();
    let e = b
        .renew(&forged, Duration::from_secs(5))
        .await
        .expect_err("foreign renew succeeded");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert_eq!(holder_of(&a, &name).await.as_ref(), Some(g.owner()));
    assert!(g.release().await.unwrap());
    let e = a
        .renew(
            g_grant_after_release(&a, &name).await.grant(),
            Duration::from_secs(5),
        )
        .await;
    drop(e);
}

/// Re-acquires `name` so the renew case ends holding nothing but its own fresh grant.
async fn g_grant_after_release(c: &Arc<dyn DistributedLock>, name: &str) -> LockGuard {
    let g = must_lock(c, name).await;
    let grant = g.grant().clone();
    assert!(g.release().await.unwrap());
    let e = c.renew(&grant, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "renew after release: {e}");
    must_lock(c, name).await
}

// ---------------------------------------------------------------------------------------------
// Reentrancy

async fn reentrant_acquire_counts_holds_and_keeps_the_token(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("re");
    let g1 = must_lock(&a, &name).await;
    let g2 = g1.reenter().await.expect("re-enter through the guard");
    let g3 = g2
        .reenter()
        .await
        .expect("re-enter through the second guard");
    assert_eq!(
        (g1.hold_count(), g2.hold_count(), g3.hold_count()),
        (1, 2, 3)
    );
    assert_eq!(g2.token(), g1.token());
    assert_eq!(g3.token(), g1.token());
    assert_eq!(a.holder(&name).await.unwrap().unwrap().hold_count, 3);
    assert!(g3.release().await.unwrap());
    assert!(g2.release().await.unwrap());
    assert_eq!(a.holder(&name).await.unwrap().unwrap().hold_count, 1);
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "freed before the count hit zero"
    );
    assert!(g1.release().await.unwrap());
    assert!(holder_of(&b, &name).await.is_none());
    assert!(must_lock(&b, &name).await.release().await.unwrap());
}

async fn reacquire_by_holder_is_contended_without_reentrancy(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("nre");
    let g = must_lock(&c, &name).await;
    assert!(c.try_lock(&name).await.unwrap().is_none());
    let e = c.lock(&name, Duration::from_millis(200)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    // Explicit re-entry is refused, not left to deadlock.
    let e = g.reenter().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(g.release().await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Waiting

async fn wait_bound_is_honoured_with_timeout(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("wb");
    let g = must_lock(&a, &name).await;
    let wait = Duration::from_millis(600);
    let started = Instant::now();
    let e = b.lock(&name, wait).await.expect_err("acquired a held lock");
    let took = started.elapsed();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.is_temporary());
    assert!(
        took >= wait,
        "gave up after {took:?}, before the bound of {wait:?}"
    );
    assert!(
        took < wait + Duration::from_secs(3),
        "overran the bound: {took:?}"
    );
    assert!(g.release().await.unwrap());
}

async fn waiter_is_woken_promptly_by_release(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("wake");
    // A long lease, so that only the release can explain a prompt grant.
    let g = a
        .try_lock_with(&name, &watchdog(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let g = b.lock(&name, LONG_WAIT).await;
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = g.token();
    let released_at = Instant::now();
    assert!(g.release().await.unwrap());
    let (granted_at, g2) = waiter.await.expect("waiter panicked");
    let g2 = g2.expect("waiter failed");
    let delay = granted_at.saturating_duration_since(released_at);
    let bound = cx.harness().wake_bound();
    assert!(
        delay < bound,
        "waiter took {delay:?} after the release (bound {bound:?})"
    );
    if a.capabilities().fencing_tokens() {
        assert!(g2.token() > first);
    }
    assert!(g2.release().await.unwrap());
}

async fn waiter_takes_over_when_holder_lease_expires(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("crash");
    // A holder that never releases: a crashed process. Its lease must free the lock.
    let g = a
        .try_lock_with(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .expect("free");
    let started = Instant::now();
    let g2 = b
        .lock(&name, ttl * 10 + Duration::from_secs(5))
        .await
        .expect("waiter stuck behind an expired holder");
    assert!(
        started.elapsed() >= ttl / 2,
        "granted while the holder's lease was live"
    );
    assert_eq!(holder_of(&b, &name).await.as_ref(), Some(g2.owner()));
    std::mem::forget(g);
    assert!(g2.release().await.unwrap());
}

async fn cancelled_acquire_leaves_nothing_behind(cx: Ctx) {
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let name = cx.name("cancel");
    let lock_name = LockName::new(&name).unwrap();
    let g = must_lock(&a, &name).await;
    // Several waiters, each cancelled at a different point of its wait.
    for delay_ms in [0u64, 5, 50, 300] {
        let b = b.clone();
        let n = name.clone();
        let waiter = tokio::spawn(async move { b.lock(&n, LONG_WAIT).await });
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
    }
    // While the lock is still held, the server keeps no queue entry of theirs.
    let mut queued = None;
    for _ in 0..50 {
        queued = cx
            .harness()
            .waiters(&lock_name)
            .await
            .expect("waiters hook");
        if queued.unwrap_or(0) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        queued.unwrap_or(0) == 0,
        "cancelled waiters left {queued:?} queue entries"
    );
    assert!(g.release().await.unwrap());
    // No phantom holder or queue entry stands in the way of the next contender.
    let g2 = c
        .lock(&name, Duration::from_secs(5))
        .await
        .expect("a cancelled waiter left something that blocks the lock");
    assert_eq!(holder_of(&c, &name).await.as_ref(), Some(g2.owner()));
    assert!(g2.release().await.unwrap());
}

async fn grant_racing_a_cancellation_is_given_back(cx: Ctx) {
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let name = cx.name("race");
    let g = must_lock(&a, &name).await;
    // The waiter asks for a long lease: only giving the grant back, not its expiry, can free
    // the lock in time for the last contender.
    let long = watchdog(Duration::from_secs(60)).wait(LONG_WAIT);
    let mut waiting = Box::pin(b.lock_with(&name, &long));
    for _ in 0..5 {
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "acquired a held lock"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    // Hand the lock over while the waiter is not being polled, then drop the waiter unpolled:
    // whatever the server granted it must be given back.
    assert!(g.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(waiting);
    let g2 = c
        .lock(&name, Duration::from_secs(10))
        .await
        .expect("a grant that raced a cancellation was kept without a guard");
    assert_eq!(holder_of(&c, &name).await.as_ref(), Some(g2.owner()));
    assert!(g2.release().await.unwrap());
}

async fn waiters_are_granted_in_fifo_order(cx: Ctx) {
    const WAITERS: usize = 8;
    let holder = cx.client().await;
    let name = cx.name("fifo");
    let g = must_lock(&holder, &name).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let c = cx.client().await;
        let (n, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = c.lock(&n, Duration::from_secs(60)).await.expect("waiter");
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(g.release().await.unwrap());
        }));
        // Let each waiter queue before the next starts, so arrival order is defined.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(g.release().await.unwrap());
    for t in tasks {
        t.await.expect("waiter panicked");
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "not FIFO");
}

// ---------------------------------------------------------------------------------------------
// Fencing

async fn tokens_increase_across_release(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("tok");
    let mut last = FencingToken(0);
    for i in 0..10 {
        let g = must_lock(&c, &name).await;
        assert!(
            g.token() > last,
            "cycle {i}: token {} after {last}",
            g.token()
        );
        last = g.token();
        assert!(g.release().await.unwrap());
    }
}

async fn tokens_increase_across_owners(cx: Ctx) {
    let clients = [cx.client().await, cx.client().await, cx.client().await];
    let name = cx.name("toko");
    let mut last = FencingToken(0);
    for i in 0..12 {
        let c = &clients[i % clients.len()];
        let owner = OwnerId::new(format!("owner-{}", i % 5)).unwrap();
        let g = c
            .lock_with(
                &name,
                &LockOptions::new().owner(owner).wait(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        assert!(
            g.token() > last,
            "grant {i}: token {} after {last}",
            g.token()
        );
        last = g.token();
        assert!(g.release().await.unwrap());
    }
}

// ---------------------------------------------------------------------------------------------
// Guards and scale

async fn dropped_guard_frees_the_lock(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("drop");
    let g = a
        .try_lock_with(&name, &watchdog(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    drop(g);
    // Well inside the 60 s lease: only the drop's background release explains the grant.
    let g2 = b
        .lock(&name, Duration::from_secs(10))
        .await
        .expect("a dropped guard kept the lock");
    assert_eq!(
        a.core().guards_watched(),
        0,
        "the dropped guard is still being renewed"
    );
    assert!(g2.release().await.unwrap());
}

async fn many_distinct_names_held_at_once(cx: Ctx) {
    const N: usize = 100;
    let (a, b) = (cx.client().await, cx.client().await);
    let names: Vec<String> = (0..N).map(|i| cx.name(&format!("many-{i}"))).collect();
    let guards: Vec<LockGuard> = join_all(names.iter().map(|n| must_lock(&a, n))).await;
    let mut tokens_seen = std::collections::HashSet::new();
    for (g, n) in guards.iter().zip(&names) {
        assert_eq!(g.name().as_str(), n);
        tokens_seen.insert(g.token());
    }
    for n in names.iter().step_by(10) {
        assert!(b.try_lock(n).await.unwrap().is_none(), "{n} not held");
    }
    let released = join_all(guards.into_iter().map(|g| g.release())).await;
    assert!(
        released.into_iter().all(|r| r.unwrap()),
        "some lock was lost before release"
    );
    for n in names.iter().step_by(10) {
        assert!(holder_of(&b, n).await.is_none(), "{n} still held");
    }
}

async fn mutual_exclusion_under_contention(cx: Ctx) {
    const TASKS: usize = 16;
    const ROUNDS: u64 = 5;
    let name = cx.name("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU32::new(0));
    let log = Arc::new(Mutex::new(Vec::<(Instant, Instant, FencingToken)>::new()));
    let fencing = cx.harness().capabilities().fencing_tokens();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let c = cx.client().await;
        let (name, counter, inside, log) =
            (name.clone(), counter.clone(), inside.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = c
                    .lock(&name, Duration::from_secs(90))
                    .await
                    .expect("acquire");
                let entered = Instant::now();
                let others = inside.fetch_add(1, Ordering::SeqCst);
                // Read, sleep, write: an unsynchronised increment that only the lock protects.
                let v = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                let left = Instant::now();
                log.lock().unwrap().push((entered, left, g.token()));
                assert_eq!(others, 0, "two holders inside the critical section at once");
                assert!(!g.is_lost(), "lost while holding: {:?}", g.lost_reason());
                assert!(
                    g.release().await.unwrap(),
                    "lock lost during the critical section"
                );
            }
        }));
    }
    for t in tasks {
        t.await.expect("contender panicked");
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        TASKS as u64 * ROUNDS,
        "lost updates"
    );
    let mut log = log.lock().unwrap().clone();
    assert_eq!(log.len(), TASKS * ROUNDS as usize);
    log.sort_by_key(|e| e.0);
    for w in log.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "critical sections overlap: {:?} and {:?}",
            w[0],
            w[1]
        );
        if fencing {
            assert!(
                w[1].2 > w[0].2,
                "tokens out of order: {} then {}",
                w[0].2,
                w[1].2
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Faults

/// A child process of the suite's own test binary holding a lock (see the runner's holder mode).
struct HolderProcess {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// The token of the child's grant.
    token: u64,
}

impl HolderProcess {
    /// Starts the child (with `mode`, if any) and waits until it holds `name`.
    async fn spawn(name: &str, mode: Option<&str>) -> Self {
        use tokio::io::AsyncBufReadExt;
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = tokio::process::Command::new(exe);
        cmd.env(crate::runner::HOLDER_CHILD_ENV, name)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(mode) = mode {
            cmd.env(crate::runner::HOLDER_MODE_ENV, mode);
        }
        let mut child = cmd.spawn().expect("spawn the holder process");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut holder = Self {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
            token: 0,
        };
        let line = holder.next_line("take the lock").await;
        holder.token = line
            .strip_prefix("HELD ")
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected line from the holder: {line:?}"));
        holder
    }

    /// The child's next line of output; panics saying it did not `what` within 30 s.
    async fn next_line(&mut self, what: &str) -> String {
        tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the holder process did not {what} within 30 s"))
            .expect("read the holder's stdout")
            .unwrap_or_else(|| panic!("the holder process exited before it could {what}"))
    }
}

/// Waits for `name`, which only the lease of a holder process that was just `what` (killed,
/// paused) can free, and checks that the new grant's token is greater than that holder's.
async fn take_over(
    other: &Arc<dyn DistributedLock>,
    name: &str,
    holder_token: u64,
    what: &str,
) -> LockGuard {
    let since = Instant::now();
    let g = other
        .lock(name, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("the lock of a {what} holder was never freed: {e}"));
    eprintln!("freed {:?} after the holder was {what}", since.elapsed());
    if other.capabilities().fencing_tokens() {
        assert!(
            g.token().0 > holder_token,
            "token {} after the {what} holder's {holder_token}",
            g.token()
        );
    }
    g
}

async fn killed_holder_process_frees_the_lock_after_its_lease(cx: Ctx) {
    let name = cx.name("killed");
    let holder = HolderProcess::spawn(&name, None).await;
    let (mut child, child_token) = (holder.child, holder.token);
    let other = cx.client().await;
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "the holder process does not hold it"
    );
    // SIGKILL: no release, no session close, no lease revoke. Only the lease can free it.
    child.start_kill().expect("kill the holder");
    let _ = child.wait().await;
    let g = take_over(&other, &name, child_token, "killed").await;
    assert!(g.release().await.unwrap());
}

/// After an old holder's late release: `other`'s guard `g` still holds `name`.
async fn new_holder_still_holds(other: &Arc<dyn DistributedLock>, name: &str, g: &LockGuard) {
    assert!(!g.is_lost(), "the new holder's guard says lost");
    let info = other
        .holder(name)
        .await
        .unwrap()
        .expect("the late release freed the new holder's lock");
    assert_eq!(&info.owner, g.owner());
}

/// A holder frozen past its lease (a stop-the-world pause, a suspended VM): the server frees the
/// lock, a new holder gets a greater token, and when the old holder runs again its guard says
/// lost and its late release does not free the new holder's lock.
async fn paused_holder_process_learns_it_lost_the_lock_and_cannot_release_it(cx: Ctx) {
    use tokio::io::AsyncWriteExt;
    let name = cx.name("paused");
    let mut holder = HolderProcess::spawn(&name, Some("check")).await;
    let child_token = holder.token;
    let mut stdin = holder.child.stdin.take().expect("piped stdin");
    let pid = holder.child.id().expect("the holder process is running");
    let other = cx.client().await;
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "the holder process does not hold it"
    );
    crate::send_signal(pid, "STOP");
    let g = take_over(&other, &name, child_token, "paused").await;
    crate::send_signal(pid, "CONT");
    stdin.write_all(b"CHECK\n").await.expect("ask the holder");
    stdin.flush().await.expect("ask the holder");
    let line = holder.next_line("report after the pause").await;
    let report = line
        .strip_prefix("AFTER ")
        .unwrap_or_else(|| panic!("unexpected line from the holder: {line:?}"));
    eprintln!("the resumed holder: {report}");
    assert!(
        report.starts_with("lost=true "),
        "the resumed holder's guard does not say lost: {report}"
    );
    assert!(
        !report.ends_with("release=ok:true"),
        "the resumed holder's release claims it still held the lock: {report}"
    );
    let _ = holder.child.wait().await;
    // Whatever the late release did, the new holder still holds the lock.
    new_holder_still_holds(&other, &name, &g).await;
    assert!(g.release().await.unwrap());
}

/// A holder cut off from its server(s) by a partition (a loopback proxy that drops every byte)
/// while its process runs on: its guard reports lost, and its safe-until has passed before the
/// server lets another client have the lock, which gets a greater token. Once the partition
/// heals, the old holder's late release neither claims the lock nor frees it, and the old
/// client works again.
async fn partitioned_holder_is_lost_before_anyone_else_acquires(cx: Ctx) {
    let link = Link::new(&cx).await;
    let holder = link.client(&cx).await;
    let h = cx.harness();
    let other = cx.client().await;
    let name = cx.name("partitioned");
    let g = holder.lock(&name, LONG_WAIT).await.unwrap();
    let first = g.token();
    let lost = g.lost();
    // Renewals go through the proxy before the cut.
    tokio::time::sleep(h.short_ttl()).await;
    assert!(!g.is_lost(), "lost before the cut: {:?}", g.lost_reason());
    let waiting = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            let g = other.lock(&name, Duration::from_secs(60)).await;
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let cut_at = Instant::now();
    link.cut();
    let reason = tokio::time::timeout(Duration::from_secs(60), lost)
        .await
        .expect("lost() did not fire while the holder was cut off");
    let lost_after = cut_at.elapsed();
    assert_ne!(reason, LostReason::Released);
    let (acquired_at, g2) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the server never freed the cut-off holder's lock")
        .expect("waiter task");
    let g2 = g2.expect("the other client's acquire");
    if other.capabilities().fencing_tokens() {
        assert!(
            g2.token() > first,
            "token {} after the cut-off holder's {first}",
            g2.token()
        );
    }
    // The safety promise: the holder stops claiming the lock before anyone else has it.
    let until = g.safe_until().expect("a leased grant has a safe-until");
    assert!(
        until <= acquired_at,
        "the cut-off holder could claim the lock {:?} after another client acquired it",
        until - acquired_at
    );
    assert!(g.is_lost());
    eprintln!(
        "cut at 0: the holder's safe-until {:?}, lost() {lost_after:?} ({reason}), the other \
         client acquired {:?}",
        until.saturating_duration_since(cut_at),
        acquired_at.saturating_duration_since(cut_at)
    );

    link.heal();
    late_release_claims_nothing(g, "cut off").await;
    new_holder_still_holds(&other, &name, &g2).await;

    // The healed client recovers: a fresh lock works within a bound, errors on the way allowed
    // (connections that were cut end and are made anew).
    let fresh = cx.name("partitioned-healed");
    let by = Instant::now() + Duration::from_secs(30);
    let g3 = loop {
        match tokio::time::timeout(Duration::from_secs(5), holder.lock(&fresh, LONG_WAIT)).await {
            Ok(Ok(g3)) => break g3,
            outcome if Instant::now() >= by => {
                panic!("the old client did not recover after the partition healed: {outcome:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(g3.release().await.unwrap());
    assert!(g2.release().await.unwrap());
}

/// A proxy in front of every server of a backend: the network between one set of clients and
/// the servers.
struct Link {
    proxies: Arc<Vec<Proxy>>,
    addrs: Vec<String>,
}

impl Link {
    async fn new(cx: &Ctx) -> Self {
        let h = cx.harness();
        let upstreams = h.upstreams();
        assert!(
            !upstreams.is_empty(),
            "the {} harness names no server address to cut",
            h.backend()
        );
        let mut proxies = Vec::new();
        for upstream in upstreams {
            proxies.push(Proxy::start(upstream).await);
        }
        let addrs = proxies.iter().map(Proxy::addr).collect();
        // Work the case leaves to the background (a release sent again, a hold given back)
        // goes through the proxies: they stay until the leftovers are checked.
        let proxies = Arc::new(proxies);
        cx.keep_until_checked(proxies.clone());
        Link { proxies, addrs }
    }

    /// A client of `cx`'s backend through this link.
    async fn client(&self, cx: &Ctx) -> Arc<dyn DistributedLock> {
        let h = cx.harness();
        h.client_via(&self.addrs)
            .await
            .unwrap_or_else(|e| panic!("a {} client through a proxy: {e}", h.backend()))
    }

    fn cut(&self) {
        self.proxies.iter().for_each(Proxy::cut);
    }

    fn heal(&self) {
        self.proxies.iter().for_each(Proxy::heal);
    }

    fn mute(&self) {
        self.proxies.iter().for_each(|p| p.mute(true));
    }
}

/// The server applies an acquire whose answer is lost on the way back; the client reports
/// `Unavailable`. Once the link is back, the hold nobody has a guard for must be given back,
/// long before its 10-minute lease would end.
async fn an_acquire_whose_reply_is_lost_is_given_back(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-reply");
    // A fresh connection first, so the muted request is the acquire itself.
    assert!(holder_of(&c, &name).await.is_none());
    link.mute();
    let long = LockOptions::new().ttl(Duration::from_secs(600));
    let outcome = tokio::time::timeout(Duration::from_secs(60), c.try_lock_with(&name, &long))
        .await
        .expect("an acquire without an answer hung for a minute");
    let e = outcome.expect_err("granted without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Where the server applied it (a script or a single statement does; a transaction whose
    // commit was never sent does not), the lock is held by an owner no guard knows of.
    if let Some(ghost) = holder_of(&other, &name).await {
        assert_eq!(ghost.label(), c.core().owner().label(), "held by {ghost}");
    }
    link.heal();
    let started = Instant::now();
    let g = other
        .lock(&name, Duration::from_secs(30))
        .await
        .expect("the lost acquire's hold was never given back");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "given back after {:?}",
        started.elapsed()
    );
    assert_eq!(holder_of(&other, &name).await.as_ref(), Some(g.owner()));
    assert!(g.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// Like [`an_acquire_whose_reply_is_lost_is_given_back`], with an explicit owner: its hold is
/// given back too (this handle has no guard of that owner, so every hold of it is surplus).
async fn an_explicit_owners_acquire_whose_reply_is_lost_is_given_back(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-explicit");
    assert!(holder_of(&c, &name).await.is_none());
    link.mute();
    let long = LockOptions::new()
        .ttl(Duration::from_secs(600))
        .owner(OwnerId::new("batch-job").unwrap());
    let e = within_a_minute(c.try_lock_with(&name, &long))
        .await
        .expect_err("granted without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    link.heal();
    let g = other
        .lock(&name, Duration::from_secs(30))
        .await
        .expect("the explicit owner's lost acquire was never given back");
    assert_eq!(holder_of(&other, &name).await.as_ref(), Some(g.owner()));
    assert!(g.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// An explicit owner holds; its second acquire (a re-entry) is applied but the answer is lost.
/// The give-back takes that one hold away and leaves the guard's: the lock stays held by the
/// guard, with one hold, and is free as soon as the guard releases it.
async fn a_lost_reentry_is_given_back_and_the_live_hold_kept(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-reentry");
    let long = LockOptions::new()
        .ttl(Duration::from_secs(600))
        .owner(OwnerId::new("ledger").unwrap());
    let held = c.try_lock_with(&name, &long).await.unwrap().expect("free");
    link.mute();
    let e = within_a_minute(c.try_lock_with(&name, &long))
        .await
        .expect_err("re-entered without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    link.heal();
    // The surplus hold goes; the guard's stays.
    let started = Instant::now();
    let holds = loop {
        let info = other
            .holder(&name)
            .await
            .unwrap()
            .expect("the guard's hold ended");
        assert_eq!(&info.owner, held.owner(), "held by another owner");
        if info.hold_count == 1 || started.elapsed() > Duration::from_secs(30) {
            break info.hold_count;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(holds, 1, "the lost re-entry's hold was never given back");
    assert!(!held.is_lost());
    assert!(other.try_lock(&name).await.unwrap().is_none());
    assert!(held.release().await.unwrap());
    let g = other
        .try_lock(&name)
        .await
        .unwrap()
        .expect("free once the guard released its one hold");
    assert!(g.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// An explicit owner holds; its second acquire never reaches the server (the link is cut). The
/// give-back that follows must find nothing to give back: the one hold on the server is the
/// guard's, which this handle accounts for, and taking it would free a lock a guard relies on.
async fn a_lost_acquire_by_an_owner_that_holds_leaves_its_hold_alone(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-kept");
    let long = LockOptions::new()
        .ttl(Duration::from_secs(600))
        .owner(OwnerId::new("ledger").unwrap());
    let held = c.try_lock_with(&name, &long).await.unwrap().expect("free");
    link.cut();
    let e = within_a_minute(c.try_lock_with(&name, &long))
        .await
        .expect_err("acquired without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    link.heal();
    // The give-back looks at 50, 100, 200, 400, 800 ms: by 2 s it has looked several times
    // with the server answering.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let info = other
        .holder(&name)
        .await
        .unwrap()
        .expect("the guard's hold was taken");
    assert_eq!((&info.owner, info.token), (held.owner(), held.token()));
    assert_eq!(info.hold_count, 1);
    assert!(other.try_lock(&name).await.unwrap().is_none());
    assert!(held.release().await.unwrap(), "the guard no longer held");
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// A release cut off on its way to the server is `Unavailable` to the caller, and is sent again
/// once the server can be reached: the lock is free long before its 10-minute lease ends.
async fn a_release_the_server_never_got_is_sent_again(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-release");
    let long = LockOptions::new().ttl(Duration::from_secs(600));
    let g = c.try_lock_with(&name, &long).await.unwrap().expect("free");
    link.cut();
    let e = within_a_minute(g.release())
        .await
        .expect_err("released without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "freed while cut off"
    );
    link.heal();
    let next = other
        .lock(&name, Duration::from_secs(30))
        .await
        .expect("the release was never sent again");
    assert!(next.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// Awaits `f`, failing the case if it takes a minute: a request without an answer must end.
async fn within_a_minute<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("a request without an answer hung for a minute")
}

/// The late release of `g`, a guard whose lock was lost while it was `what`: it must answer
/// within 30 s and must not claim it still held the lock.
async fn late_release_claims_nothing(g: LockGuard, what: &str) {
    let late = tokio::time::timeout(Duration::from_secs(30), g.release())
        .await
        .unwrap_or_else(|_| panic!("the old holder's release hung after it was {what}"));
    assert!(
        !matches!(late, Ok(true)),
        "the old holder's late release claims it held the lock while it was {what}"
    );
}

/// The server is out of reach of a holder and a queued waiter alike (as if it were paused or
/// cut off) for longer than the lease, then comes back. The holder's guard reports lost; the
/// waiter's acquire ends within its bound, either with the lock (a greater token, and nobody
/// else can have it meanwhile) or with a temporary error; and whichever it was, nothing is left
/// behind: a third client gets the lock afterwards.
async fn waiter_outlives_a_server_outage_and_leaves_nothing_behind(cx: Ctx) {
    const WAIT: Duration = Duration::from_secs(60);
    let link = Link::new(&cx).await;
    let holder = link.client(&cx).await;
    let waiter = link.client(&cx).await;
    let third = cx.client().await;
    let name = cx.name("outage");
    let g = holder.lock(&name, LONG_WAIT).await.unwrap();
    let first = g.token();
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let g = waiter.lock(&name, WAIT).await;
            (started.elapsed(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter did not wait");

    link.cut();
    tokio::time::timeout(Duration::from_secs(60), g.lost())
        .await
        .expect("the holder's guard never said lost while the server was out of reach");
    // Past the holder's lease as the server counts it, too.
    tokio::time::sleep(cx.harness().short_ttl() + Duration::from_millis(500)).await;
    link.heal();

    let (took, outcome) = tokio::time::timeout(WAIT + Duration::from_secs(30), waiting)
        .await
        .expect("the waiter's acquire outran its wait bound")
        .expect("waiter task");
    eprintln!(
        "the waiter's acquire ended after {took:?}: {}",
        match &outcome {
            Ok(g2) => format!("granted, token {}", g2.token()),
            Err(e) => format!("error: {e}"),
        }
    );
    assert!(g.is_lost());
    late_release_claims_nothing(g, "out of reach").await;
    match outcome {
        Ok(g2) => {
            if waiter.capabilities().fencing_tokens() {
                assert!(g2.token() > first, "token {} after {first}", g2.token());
            }
            assert!(
                third.try_lock(&name).await.unwrap().is_none(),
                "a third client got the lock the waiter was granted"
            );
            assert!(
                tokio::time::timeout(Duration::from_secs(30), g2.release())
                    .await
                    .expect("the waiter's release hung")
                    .unwrap(),
                "the waiter's grant was not held at release"
            );
        }
        Err(e) => assert!(
            e.is_temporary(),
            "the waiter failed with a permanent error after a passing outage: {e}"
        ),
    }
    let g3 = tokio::time::timeout(Duration::from_secs(30), third.lock(&name, WAIT))
        .await
        .expect("the lock stayed taken after the outage: something was left behind")
        .unwrap();
    if third.capabilities().fencing_tokens() {
        assert!(g3.token() > first);
    }
    assert!(g3.release().await.unwrap());
}
