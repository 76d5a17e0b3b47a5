//! Throw-away servers for the scenarios that pause, kill, restart or cut off a server: the
//! shared ones on the standard loopback ports belong to everyone's tests and are never faulted.
//!
//! A deployment is one to five members of one kind, each in a network namespace of its own
//! (`ip netns`), joined by a bridge the run creates on a private /24 of 10.77.0.0/16; the
//! runner and the client processes stay in the root namespace and reach each member at its
//! own address, on the server's standard port. A namespace per member lets a member be cut off
//! from its peers alone (an nftables table inside its namespace), which loopback cannot do:
//! every loopback connection leaves from 127.0.0.1. Everything is removed when the deployment
//! is dropped (the namespaces and the bridge; each member's data directory).
//!
//! Persistence: Redis runs with an fsync-always append-only file, so a kill -9 and restart
//! keeps its locks and fencing counters (without it a restart forgets both, as the Redis
//! backend's docs say); etcd, ZooKeeper, MariaDB, PostgreSQL and the MongoDB stand-in keep
//! their data directories across a restart.
//!
//! The clock rows start their member under libfaketime and move its wall clock while it runs
//! (`faked_clock.rs`); the one-way rows drop one client's packets in one direction with a table
//! in the root namespace, where the clients are (`one_way.rs`).
//!
//! Each member runs in a process group of its own, and every signal goes to the group:
//! PostgreSQL is a postmaster and one process per connection, and a pause or a kill must reach
//! them all.

mod cli;
mod cluster;
mod faked_clock;
mod launch;
mod nemesis;
mod net;
mod one_way;
mod probe;
mod sentinel;
mod sweep;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub(crate) use nemesis::Note;
use net::ip;
use sweep::remove_dir;
pub(crate) use sweep::sweep_stale;

use crate::matrix::{Scenario, Topology};

/// How long a start may take before it counts as failed: JVMs and MariaDB on a loaded
/// 2-core machine.
const START_BOUND: Duration = Duration::from_secs(40);

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Redis,
    Etcd,
    Zk,
    Mariadb,
    Mongo,
    Postgres,
}

impl Kind {
    /// The kind of server a backend talks to.
    pub(crate) fn of(backend: &str) -> Option<Kind> {
        Some(match backend {
            "redis" | "redlock" => Kind::Redis,
            "etcd" => Kind::Etcd,
            "zk" => Kind::Zk,
            "mysql" => Kind::Mariadb,
            "mongo" => Kind::Mongo,
            "postgres" => Kind::Postgres,
            _ => return None,
        })
    }

    fn port(self) -> u16 {
        match self {
            Kind::Redis => 6379,
            Kind::Etcd => 2379,
            Kind::Zk => 2181,
            Kind::Mariadb => 3306,
            Kind::Mongo => 27017,
            Kind::Postgres => 5432,
        }
    }
}

/// How Redis members run (the other kinds always keep their data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RedisMode {
    /// An fsync-always append-only file: a kill -9 and restart keeps every acknowledged write.
    Durable,
    /// No persistence: a restart starts empty.
    Volatile,
    /// Durable, and a Redis Cluster node (`cluster-enabled yes`; see `cluster.rs`).
    Cluster,
}

/// One member: a server process in its namespace.
struct Member {
    ns: String,
    ip: String,
    dir: PathBuf,
    child: Option<Child>,
}

/// A private deployment of `n` members.
pub(crate) struct Deployment {
    kind: Kind,
    /// Whether the members form one cluster (etcd, ZooKeeper) or are independent servers.
    clustered: bool,
    bridge: String,
    members: Vec<Member>,
    dir: PathBuf,
    /// Redis only: how its members run.
    redis: RedisMode,
    /// Redis through Sentinel: a sentinel in each member's namespace (see `sentinel.rs`).
    sentinels: Vec<Child>,
    /// The libfaketime timestamp file the members' clocks follow (see `faked_clock.rs`).
    clock: Option<PathBuf>,
    /// Whether a client's link is cut one way (a table in the root namespace, `one_way.rs`).
    one_way: bool,
}

impl Deployment {
    /// The deployment `scenario` faults: a Sentinel topology or a Redis Cluster for their rows,
    /// else `scenario.members()` members of `kind` (Redis without persistence for the volatile
    /// restarts; the member's wall clock under libfaketime for the clock rows).
    pub(crate) async fn start_for(kind: Kind, scenario: Scenario) -> Result<Self, String> {
        let n = scenario.members();
        match scenario.topology() {
            Some(Topology::Sentinel) => Self::start_sentinel(n).await,
            Some(Topology::Cluster) => Self::start_cluster(n).await,
            None => {
                let volatile = matches!(
                    scenario,
                    Scenario::ServerRestartVolatile | Scenario::MastersRestartVolatile
                );
                let redis = if volatile {
                    RedisMode::Volatile
                } else {
                    RedisMode::Durable
                };
                let clock = match scenario {
                    Scenario::Timing(t) if t.clock() => Some(t.initial_clock()),
                    _ => None,
                };
                Self::start_clocked(kind, n, redis, clock).await
            }
        }
    }

    /// Starts `n` members of `kind` (a cluster for etcd and ZooKeeper, independent masters or
    /// not yet joined cluster nodes for Redis, as `redis` says) and waits until every one
    /// serves; the error says why not.
    async fn start(kind: Kind, n: usize, redis: RedisMode) -> Result<Self, String> {
        Self::start_clocked(kind, n, redis, None).await
    }

    /// As [`start`](Self::start), with the members' wall clocks under libfaketime from
    /// `clock`, the timestamp file's first content, when given.
    async fn start_clocked(
        kind: Kind,
        n: usize,
        redis: RedisMode,
        clock: Option<String>,
    ) -> Result<Self, String> {
        static RUNS: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        // A /24 of its own per deployment; a taken bridge name moves on to the next.
        let mut subnet = 0;
        let mut bridge = String::new();
        for _ in 0..200 {
            subnet = (pid + RUNS.fetch_add(1, Ordering::Relaxed)) % 200 + 20;
            bridge = format!("dlf{subnet}");
            // A deleted namespace's link can outlive it for a while (seen beside other
            // campaigns): its subnet counts as taken.
            let stale = ip(&["link", "show", &format!("dlf{subnet}v0")]).is_ok();
            if !stale && ip(&["link", "add", &bridge, "type", "bridge"]).is_ok() {
                break;
            }
            bridge.clear();
        }
        if bridge.is_empty() {
            return Err("no free bridge name dlf20..dlf219".into());
        }
        let dir = std::env::temp_dir().join(format!("distlock-faults-{kind:?}-{pid}-{subnet}"));
        let mut d = Self {
            kind,
            clustered: matches!(kind, Kind::Etcd | Kind::Zk) && n > 1,
            bridge: bridge.clone(),
            members: Vec::new(),
            dir,
            redis,
            sentinels: Vec::new(),
            clock: None,
            one_way: false,
        };
        ip(&[
            "addr",
            "add",
            &format!("10.77.{subnet}.254/24"),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..n {
            let ns = format!("distlock-faults-{pid}-{subnet}-{i}");
            let member_ip = format!("10.77.{subnet}.{}", i + 1);
            let veth = format!("dlf{subnet}v{i}");
            let member_dir = d.dir.join(format!("m{i}"));
            std::fs::create_dir_all(member_dir.join("data"))
                .map_err(|e| format!("cannot create {}: {e}", member_dir.display()))?;
            ip(&["netns", "add", &ns])?;
            d.members.push(Member {
                ns: ns.clone(),
                ip: member_ip.clone(),
                dir: member_dir,
                child: None,
            });
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            ip(&["link", "set", &veth, "master", &bridge, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{member_ip}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        for i in 0..n {
            d.prepare(i)?;
        }
        if let Some(spec) = clock {
            let path = faked_clock::file(&d.dir);
            faked_clock::write(&path, &spec)?;
            d.clock = Some(path);
        }
        for i in 0..n {
            d.spawn(i)?;
        }
        for i in 0..n {
            d.wait_serving(i).await?;
        }
        if d.clustered {
            let deadline = Instant::now() + START_BOUND;
            while d.leader().await.is_none() {
                if Instant::now() > deadline {
                    return Err(format!("the {kind:?} cluster elected no leader"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(d)
    }

    /// How many members.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::new(
            self.members[i].ip.parse().expect("member address"),
            self.kind.port(),
        )
    }

    /// The lock URL of all members (RedLock: every master).
    pub(crate) fn url(&self) -> String {
        let all: Vec<usize> = (0..self.members.len()).collect();
        self.url_of(&all)
    }

    /// The lock URL of member `i` alone.
    pub(crate) fn member_url(&self, i: usize) -> String {
        self.url_of(&[i])
    }

    fn url_of(&self, which: &[usize]) -> String {
        let hosts: Vec<String> = which.iter().map(|&i| self.addr(i).to_string()).collect();
        let hosts = hosts.join(",");
        match self.kind {
            Kind::Redis if !self.sentinels.is_empty() => self.sentinel_url(),
            Kind::Redis if self.redis == RedisMode::Cluster => format!("redis+cluster://{hosts}"),
            Kind::Redis if self.members.len() > 1 => format!("redlock://{hosts}"),
            Kind::Redis => format!("redis://{hosts}"),
            Kind::Etcd => format!("etcd://{hosts}"),
            Kind::Zk => format!("zk://{hosts}"),
            Kind::Mariadb => format!("mysql://distlock:distlock@{hosts}/distlock"),
            Kind::Mongo => format!("mongodb://{hosts}"),
            Kind::Postgres => format!("postgres://postgres@{hosts}/postgres"),
        }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        if self.one_way {
            let _ = self.heal_one_way();
        }
        for c in &mut self.sentinels {
            let _ = c.kill();
            let _ = c.wait();
        }
        for i in 0..self.members.len() {
            let _ = self.resume(i);
            self.kill(i);
        }
        for m in &self.members {
            let _ = ip(&["netns", "delete", &m.ns]);
        }
        let _ = ip(&["link", "delete", &self.bridge]);
        remove_dir(&self.dir);
    }
}
