//! A private three-member etcd cluster on loopback, started by a test from the `etcd` binary
//! on the PATH or `DISTLOCK_ETCD_BIN`, and stopped when dropped.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_etcd::etcd_client::Client;
use distlock_etcd::{EtcdConfig, EtcdLock};

/// The lease of the clients under test: long enough to outlast an election (1-2 s with etcd's
/// default 1 s election timeout).
pub(crate) const LEASE: Duration = Duration::from_secs(5);

pub(crate) struct Cluster {
    dir: PathBuf,
    pub(crate) urls: Vec<String>,
    members: Vec<Option<Child>>,
}

impl Cluster {
    /// Starts three members with client ports `base`, `base + 2`, `base + 4` and peer ports one
    /// above each, moving up by 100 if any of those ports is taken.
    pub(crate) fn start(base: u16) -> Self {
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
    pub(crate) async fn leader(&self) -> usize {
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
    pub(crate) fn signal(&self, i: usize, signal: &str) {
        let Some(child) = &self.members[i] else {
            return;
        };
        distlock_conformance::send_signal(child.id(), signal);
    }

    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) async fn client(&self, order: [usize; 3]) -> Arc<EtcdLock> {
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
