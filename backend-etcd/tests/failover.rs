//! Failing over between the members of a three-member cluster (the shared server on 2379 is a
//! single member). Each test starts its own cluster on loopback ports 20471-20496 (or 100 or
//! 200 above, if taken), from the `etcd` binary on the PATH or `DISTLOCK_ETCD_BIN`, and stops
//! it at the end.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::time::{Duration, Instant};

use cluster::{Cluster, LEASE};
use distlock_etcd::LockExt;

/// How a member is lost.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL: its connections are reset at once.
    Kill,
    /// SIGSTOP for the whole test: its connections stay open and nothing answers on them.
    Pause,
}

/// Holds a lock through the loss of member `victim` (the client's first endpoint), then shows
/// the client still works.
async fn hold_through_the_loss_of(
    cluster: &mut Cluster,
    victim: usize,
    rest: [usize; 2],
    role: &str,
    fault: Fault,
) {
    let a = cluster.client([victim, rest[0], rest[1]]).await;
    let b = cluster.client([rest[1], rest[0], victim]).await;
    let name = common::unique("failover");
    let g = a.try_lock(&name).await.unwrap().expect("free");
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.lock(&name, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    match fault {
        Fault::Kill => cluster.kill(victim),
        Fault::Pause => cluster.signal(victim, "STOP"),
    }
    // Several keep-alive rounds, and past the lease as it stood when the member died.
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    assert!(
        !g.is_lost(),
        "lost after the member died: {:?}",
        g.lost_reason()
    );
    assert!(
        !waiter.is_finished(),
        "the waiter got a lock that is still held"
    );
    let other = format!("{name}other");
    let g2 = a
        .try_lock(&other)
        .await
        .expect("lock after failover")
        .expect("free");
    assert!(g2.release().await.unwrap());
    let token = g.token();
    assert!(
        g.release().await.expect("release after failover"),
        "the lock was lost"
    );
    let g3 = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not handed the lock after failover")
        .expect("waiter panicked")
        .expect("waiter failed");
    assert!(g3.token() > token);
    assert!(g3.release().await.unwrap());
    let how = match fault {
        Fault::Kill => "killed",
        Fault::Pause => "paused",
    };
    eprintln!(
        "{role} m{victim} {how}; lock kept and handed on {:?} later",
        killed.elapsed()
    );
}

/// Which member the test takes away.
#[derive(Clone, Copy)]
enum Victim {
    Follower,
    Leader,
}

/// Starts a cluster on `base` and holds a lock through `fault` of its leader or a follower.
async fn hold_through(base: u16, victim: Victim, fault: Fault) {
    let mut cluster = Cluster::start(base);
    let leader = cluster.leader().await;
    let f: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let (victim, rest, role) = match victim {
        Victim::Follower => (f[0], [leader, f[1]], "follower"),
        Victim::Leader => (leader, [f[0], f[1]], "leader"),
    };
    hold_through_the_loss_of(&mut cluster, victim, rest, role, fault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_fails_over_when_its_member_dies() {
    if !common::skip() {
        hold_through(20471, Victim::Follower, Fault::Kill).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_survives_the_leaders_death() {
    if !common::skip() {
        hold_through(20481, Victim::Leader, Fault::Kill).await;
    }
}

/// The leader freezes (SIGSTOP) instead of dying: nothing resets the client's connections to
/// it, so the client must notice the silence itself and carry on through the other members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_survives_a_paused_leader() {
    if !common::skip() {
        hold_through(20491, Victim::Leader, Fault::Pause).await;
    }
}
