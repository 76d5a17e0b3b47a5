//! A release through a handle hands the lock to a task of the same handle that waits for it:
//! one script gives up the releasing grant and grants the task, so the hand-off is the
//! release's own round trip, where a release and the task's next attempt would take two.
//! Counted by a loopback proxy between the client and the server.

mod common;

use std::time::Duration;

use distlock_api::backend::HANDED_IN_A_ROW;
use distlock_api::{DistributedLock, LockName};
use distlock_conformance::given::handoff_round_trips;
use distlock_conformance::hand_over;
use distlock_redis::{LockExt, LockOptions};

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redis");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
    }
    skip
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_between_tasks_of_one_client_is_the_release_alone() {
    if skipped() {
        return;
    }
    let (client, proxy) = common::client_behind_proxy().await;
    let name = common::unique("hand-off-trips");
    // The client's pub/sub connection stays subscribed to the name's channel throughout: a
    // task that got the lock and leaves the channel then sends no UNSUBSCRIBE, which the
    // proxy would count in the hand-off when it came before the count was read (on a loaded
    // machine it did, every time).
    let _subscribed = client
        .subscribe(&LockName::new(name.as_str()).unwrap())
        .await
        .unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(30));
    for depth in [1, 3] {
        let counts = handoff_round_trips(&client, &client, &proxy, &name, &opts, depth, 5).await;
        // A connection's health check may land in a hand-off now and then: the fewest of
        // five shows what a hand-off takes (two without the hand-over: the release, then the
        // task's attempt).
        assert_eq!(
            counts.iter().min(),
            Some(&1),
            "round trips from release to the waiting task's grant, {depth} waiting: {counts:?}"
        );
    }
}

/// The script itself: a last hold passes with the next token and the new owner's lease
/// ([`hand_over::a_last_hold_passes`]); a grant with holds left gives one up and keeps the
/// lock, and a grant that no longer holds changes nothing
/// ([`hand_over::only_a_last_hold_of_a_holding_grant_passes`]).
#[tokio::test]
async fn the_hand_over_script_passes_only_a_last_hold_and_only_of_a_holding_grant() {
    if skipped() {
        return;
    }
    let (lock, other) = (common::client().await, common::client().await);
    let name = LockName::new(common::unique("hand-over-script")).unwrap();
    hand_over::a_last_hold_passes(&*lock, &name).await;
    let expired =
        hand_over::only_a_last_hold_of_a_holding_grant_passes(&*lock, &*other, &name).await;
    hand_over::next_grant_follows(&*lock, &name, &expired).await;
}

/// A handle passes a lock to its own tasks at most `HANDED_IN_A_ROW` times in a row; the next
/// release frees it on the server (as a release does), where another client may take it.
/// Tasks of one handle queue behind a holder and the lock passes down the line; the proxy's
/// count of requests shows which releases went to the server as a plain release and which as a
/// hand-over: a plain one is followed by the waiting tasks' own attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_passes_a_lock_to_its_own_tasks_only_so_many_times_in_a_row() {
    if skipped() {
        return;
    }
    let (client, proxy) = common::client_behind_proxy().await;
    let name = common::unique("in-a-row");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(30));
    let rounds = 2 * HANDED_IN_A_ROW as usize + 4;
    // `rounds` tasks queue behind a holder; the lock passes down the line.
    // After a release that frees the lock, any of them may get it: each hands its guard in.
    let mut holder = client.lock_with(&name, &opts).await.unwrap();
    let (granted, mut guards) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..rounds {
        let (c, name, opts, granted) =
            (client.clone(), name.clone(), opts.clone(), granted.clone());
        tokio::spawn(async move {
            let _ = granted.send(c.lock_with(&name, &opts).await.unwrap());
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut trips = Vec::new();
    for _ in 0..rounds {
        let before = proxy.round_trips();
        let old = holder.token();
        holder.release().await.unwrap();
        holder = guards.recv().await.expect("a waiting task was granted");
        trips.push(proxy.round_trips() - before);
        assert!(holder.token() > old);
        // Waiters that a freed lock woke try it and wait again: their requests settle before
        // the next count.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The last task's grant leaves the channel without waiters: its UNSUBSCRIBE may be counted.
    trips.pop();
    holder.release().await.unwrap();
    let plain: Vec<usize> = trips
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 1)
        .map(|(i, _)| i)
        .collect();
    let every = HANDED_IN_A_ROW as usize + 1;
    let expected: Vec<usize> = (0..rounds - 1).filter(|i| (i + 1) % every == 0).collect();
    assert_eq!(
        plain, expected,
        "hand-offs that were not the release alone: {trips:?}"
    );
}

/// An attempt of an acquisition takes the lock afresh over a hold an earlier attempt of it left
/// (its answer lost), rather than stacking on it: one release then frees the lock, and the
/// left hold's give-back takes nothing.
#[tokio::test]
async fn an_attempt_takes_afresh_the_hold_a_lost_attempt_of_its_acquisition_left() {
    if skipped() {
        return;
    }
    let (lock, other) = (common::client().await, common::client().await);
    let name = LockName::new(common::unique("lost-attempt")).unwrap();
    common::an_attempt_takes_afresh_the_hold_a_lost_attempt_left(&*lock, &*other, &name).await;
}
