//! Failing over between the members of a three-member cluster (the shared server on 2379 is a
//! single member). Each test starts its own cluster on loopback ports 20471-20496 (or 100 or
//! 200 above, if taken), from the `etcd` binary on the PATH or `DISTLOCK_ETCD_BIN`, and stops
//! it at the end.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_etcd::etcd_client::Client;
use distlock_etcd::{EtcdConfig, EtcdLock, LockExt};

/// The lease of the clients under test: long enough to outlast an election (1-2 s with etcd's
/// default 1 s election timeout).
const LEASE: Duration = Duration::from_secs(5);

struct Cluster {
    dir: PathBuf,
    urls: Vec<String>,
    members: Vec<Option<Child>>,
}

impl Cluster {
    /// Starts three members with client ports `base`, `base + 2`, `base + 4` and peer ports one
    /// above each, moving up by 100 if any of those ports is taken.
    fn start(base: u16) -> Self {
        let bin = std::env::var("DISTLOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".to_string());
        let free = |b: u16| (b..b + 6).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok());
        let base = [base, base + 100, base + 200]
            .into_iter()
            .find(|b| free(*b))
            .unwrap_or_else(|| panic!("ports {base}-{} (and +100, +200) are taken", base + 5));
        let dir = std::env::temp_dir().join(format!(
            "distlock-etcd-failover-{}-{base}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let peer = |i: u16| format!("http://127.0.0.1:{}", base + 2 * i + 1);
        let initial: Vec<String> = (0..3).map(|i| format!("m{i}={}", peer(i))).collect();
        let mut urls = Vec::new();
        let mut members = Vec::new();
        for i in 0..3u16 {
            let client = format!("http://127.0.0.1:{}", base + 2 * i);
            let log = std::fs::File::create(dir.join(format!("m{i}.log"))).expect("log file");
            let child = Command::new(&bin)
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.join(format!("m{i}")))
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer(i)])
                .args(["--initial-advertise-peer-urls", &peer(i)])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-state", "new"])
                .args([
                    "--initial-cluster-token",
                    &format!("distlock-failover-{base}"),
                ])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot run {bin:?}: {e}\n  install etcd (scripts/services up does) or \
                         set DISTLOCK_ETCD_BIN"
                    )
                });
            urls.push(client);
            members.push(Some(child));
        }
        Self { dir, urls, members }
    }

    /// Waits until every member agrees on a leader, and returns the leader's index.
    async fn leader(&self) -> usize {
        let since = Instant::now();
        loop {
            if let Some(i) = self.try_leader().await {
                return i;
            }
            assert!(
                since.elapsed() < Duration::from_secs(60),
                "the cluster never elected a leader; logs in {:?}",
                self.dir
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn try_leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leaders = Vec::new();
        for url in &self.urls {
            let mut c = Client::connect([url], None).await.ok()?;
            let status = tokio::time::timeout(Duration::from_secs(2), c.status())
                .await
                .ok()?
                .ok()?;
            ids.push(status.header()?.member_id());
            leaders.push(status.leader());
        }
        let leader = leaders[0];
        if leader == 0 || leaders.iter().any(|l| *l != leader) {
            return None;
        }
        ids.iter().position(|id| *id == leader)
    }

    /// Freezes (`STOP`) or thaws (`CONT`) member `i`: a paused member keeps its connections
    /// open and answers nothing, like a process in a long GC pause or a suspended VM.
    fn signal(&self, i: usize, signal: &str) {
        let Some(child) = &self.members[i] else {
            return;
        };
        distlock_conformance::send_signal(child.id(), signal);
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn client(&self, order: [usize; 3]) -> Arc<EtcdLock> {
        let config = EtcdConfig::new(order.map(|i| self.urls[i].clone()))
            .map(|c| c.default_ttl(LEASE))
            .map(|c| c.operation_timeout(Duration::from_secs(2)))
            .expect("config");
        Arc::new(
            EtcdLock::connect(config)
                .await
                .expect("connect to the private cluster"),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.signal(i, "CONT");
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

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
