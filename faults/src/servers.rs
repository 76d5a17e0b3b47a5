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
//! backend's docs say); etcd, ZooKeeper, MariaDB and the MongoDB stand-in keep their data
//! directories across a restart.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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
        }
    }
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
    /// Redis only: no append-only file, so a restart starts empty.
    volatile: bool,
}

/// Runs `ip` with `args`; the error has its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip(8): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `nft -f -` with `script` inside namespace `ns`.
fn nft(ns: &str, script: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft in {ns}: {e} (scripts/faults installs nftables)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Sends `line` to `addr` and reads what comes back within a second.
fn ask(addr: SocketAddr, line: &[u8]) -> Option<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    if !line.is_empty() {
        conn.write_all(line).ok()?;
    }
    let mut buf = vec![0; 4096];
    let mut got = Vec::new();
    // 4-letter words answer and close; Redis answers one line; MariaDB greets first.
    while let Ok(n) = conn.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if !line.starts_with(b"srvr") {
            break;
        }
    }
    (!got.is_empty()).then(|| String::from_utf8_lossy(&got).into_owned())
}

impl Deployment {
    /// Starts `n` members of `kind` (a cluster for etcd and ZooKeeper, independent masters for
    /// Redis) and waits until every one serves; the error says why not.
    /// A `volatile` Redis keeps no append-only file (other kinds always persist).
    pub(crate) async fn start(kind: Kind, n: usize, volatile: bool) -> Result<Self, String> {
        static RUNS: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        // A /24 of its own per deployment; a taken bridge name moves on to the next.
        let mut subnet = 0;
        let mut bridge = String::new();
        for _ in 0..200 {
            subnet = (pid + RUNS.fetch_add(1, Ordering::Relaxed)) % 200 + 20;
            bridge = format!("dlf{subnet}");
            if ip(&["link", "add", &bridge, "type", "bridge"]).is_ok() {
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
            volatile,
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
            Kind::Redis if self.members.len() > 1 => format!("redlock://{hosts}"),
            Kind::Redis => format!("redis://{hosts}"),
            Kind::Etcd => format!("etcd://{hosts}"),
            Kind::Zk => format!("zk://{hosts}"),
            Kind::Mariadb => format!("mysql://distlock:distlock@{hosts}/distlock"),
            Kind::Mongo => format!("mongodb://{hosts}"),
        }
    }

    /// Writes what a member needs before its first start (configuration, an initialised
    /// database).
    fn prepare(&self, i: usize) -> Result<(), String> {
        let m = &self.members[i];
        let data = m.dir.join("data");
        match self.kind {
            Kind::Zk => {
                let mut cfg = format!(
                    "tickTime=200\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort=2181\n\
                     clientPortAddress={}\nmaxSessionTimeout=60000\nmaxClientCnxns=0\n\
                     admin.enableServer=false\n4lw.commands.whitelist=srvr,conf\n",
                    data.display(),
                    m.ip
                );
                if self.members.len() > 1 {
                    for (j, other) in self.members.iter().enumerate() {
                        cfg.push_str(&format!("server.{}={}:2888:3888\n", j + 1, other.ip));
                    }
                    std::fs::write(data.join("myid"), format!("{}\n", i + 1))
                        .map_err(|e| format!("myid: {e}"))?;
                }
                std::fs::write(m.dir.join("zoo.cfg"), cfg).map_err(|e| format!("zoo.cfg: {e}"))
            }
            Kind::Mariadb => {
                std::fs::create_dir_all(m.dir.join("tmp")).map_err(|e| e.to_string())?;
                let log =
                    std::fs::File::create(m.dir.join("install.log")).map_err(|e| e.to_string())?;
                let status = Command::new("mariadb-install-db")
                    .arg("--no-defaults")
                    .arg("--user=root")
                    .arg(format!("--datadir={}", data.display()))
                    .arg(format!("--tmpdir={}", m.dir.join("tmp").display()))
                    .args(["--auth-root-authentication-method=socket", "--skip-test-db"])
                    .args(MARIADB_SIZING)
                    .stdout(log.try_clone().map_err(|e| e.to_string())?)
                    .stderr(log)
                    .status()
                    .map_err(|e| {
                        format!("cannot run mariadb-install-db ({e}): scripts/services up mariadb")
                    })?;
                if !status.success() {
                    return Err(format!("mariadb-install-db failed ({status})"));
                }
                std::fs::write(
                    m.dir.join("init.sql"),
                    "CREATE DATABASE IF NOT EXISTS distlock;\n\
                     CREATE USER IF NOT EXISTS 'distlock'@'%' IDENTIFIED BY 'distlock';\n\
                     GRANT ALL PRIVILEGES ON distlock.* TO 'distlock'@'%';\n",
                )
                .map_err(|e| format!("init.sql: {e}"))
            }
            Kind::Redis | Kind::Etcd | Kind::Mongo => Ok(()),
        }
    }

    /// Starts member `i` in its namespace (without waiting for it).
    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let m = &self.members[i];
        let data = m.dir.join("data");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &m.ns]);
        match self.kind {
            Kind::Redis => {
                cmd.args([
                    "redis-server",
                    "--port",
                    "6379",
                    "--bind",
                    &m.ip,
                    "--save",
                    "",
                ])
                .args(if self.volatile {
                    ["--appendonly", "no", "--appendfsync", "no"]
                } else {
                    ["--appendonly", "yes", "--appendfsync", "always"]
                })
                .args(["--protected-mode", "no", "--dir"])
                .arg(&data);
            }
            Kind::Etcd => {
                let bin = std::env::var("DISTLOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
                let client = format!("http://{}:2379", m.ip);
                let peer = format!("http://{}:2380", m.ip);
                let cluster: Vec<String> = self
                    .members
                    .iter()
                    .enumerate()
                    .map(|(j, o)| format!("m{j}=http://{}:2380", o.ip))
                    .collect();
                cmd.arg(bin)
                    .args(["--name", &format!("m{i}"), "--data-dir"])
                    .arg(&data)
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &cluster.join(",")])
                    .args(["--initial-cluster-token", &self.bridge])
                    .args(["--log-level", "error"]);
            }
            Kind::Zk => {
                cmd.args([
                    "java",
                    "-Xmx128m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                ])
                .arg(format!("-Dzookeeper.log.dir={}", m.dir.display()))
                .arg("-Dzookeeper.preAllocSize=1024")
                .arg("-Dznode.container.checkIntervalMs=1000")
                .args(["-cp", "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"])
                .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
                .arg(m.dir.join("zoo.cfg"));
            }
            Kind::Mariadb => {
                cmd.args(["mariadbd", "--no-defaults", "--user=root"])
                    .arg(format!("--datadir={}", data.display()))
                    .arg(format!("--tmpdir={}", m.dir.join("tmp").display()))
                    .arg(format!("--socket={}", m.dir.join("mysqld.sock").display()))
                    .arg(format!("--pid-file={}", m.dir.join("mysqld.pid").display()))
                    .args(["--port=3306", &format!("--bind-address={}", m.ip)])
                    .arg(format!("--init-file={}", m.dir.join("init.sql").display()))
                    .arg("--max-connections=1000")
                    .args(MARIADB_SIZING);
            }
            Kind::Mongo => {
                let home = std::env::var("CARGO_HOME")
                    .map(PathBuf::from)
                    .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cargo")))
                    .unwrap_or_default();
                cmd.arg(home.join("bin").join("secantusd-rs"))
                    .args(["--host", &m.ip, "--port", "27017", "--storage-path"])
                    .arg(&data)
                    // Without it, SecantusDB acknowledges `j: true` writes before they reach
                    // its journal, and a kill loses them (as `mongod` does not).
                    .args(["--cache-size", "64M", "--sync-on-commit"]);
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.dir.join("server.log"))
            .map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {:?} ({e}); `scripts/services up` installs it",
                    self.kind
                )
            })?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Waits until member `i` serves requests (not only accepts connections).
    async fn wait_serving(&mut self, i: usize) -> Result<(), String> {
        let deadline = Instant::now() + START_BOUND;
        loop {
            if let Some(Ok(Some(status))) = self.members[i].child.as_mut().map(Child::try_wait) {
                self.members[i].child = None;
                return Err(format!(
                    "{:?} member {i} exited at start ({status}): {}",
                    self.kind,
                    self.log_tail(i)
                ));
            }
            if self.serves(i).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{:?} member {i} did not serve within {START_BOUND:?}: {}",
                    self.kind,
                    self.log_tail(i)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self, i: usize) -> String {
        let log =
            std::fs::read_to_string(self.members[i].dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    async fn serves(&self, i: usize) -> bool {
        let addr = self.addr(i);
        match self.kind {
            Kind::Redis => {
                let answer = tokio::task::spawn_blocking(move || ask(addr, b"PING\r\n")).await;
                answer
                    .ok()
                    .flatten()
                    .is_some_and(|a| a.starts_with("+PONG"))
            }
            Kind::Zk => {
                let answer = tokio::task::spawn_blocking(move || ask(addr, b"srvr")).await;
                answer.ok().flatten().is_some_and(|a| {
                    a.contains("Mode: leader")
                        || a.contains("Mode: follower")
                        || a.contains("Mode: standalone")
                })
            }
            Kind::Mariadb => {
                // The greeting comes once the init file ran and the server takes clients.
                let answer = tokio::task::spawn_blocking(move || ask(addr, b"")).await;
                answer.ok().flatten().is_some_and(|a| a.contains("MariaDB"))
            }
            Kind::Mongo => {
                tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
                    .await
                    .is_ok_and(|c| c.is_ok())
            }
            Kind::Etcd => self.etcd_status(i).await.is_some(),
        }
    }

    /// (member id, leader id) as member `i` sees them.
    async fn etcd_status(&self, i: usize) -> Option<(u64, u64)> {
        let url = format!("http://{}", self.addr(i));
        let fut = async {
            let options = distlock::etcd::etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_millis(500))
                .with_timeout(Duration::from_millis(800));
            let mut c = distlock::etcd::etcd_client::Client::connect([url], Some(options))
                .await
                .ok()?;
            let s = c.status().await.ok()?;
            Some((s.header()?.member_id(), s.leader()))
        };
        tokio::time::timeout(Duration::from_secs(2), fut)
            .await
            .ok()
            .flatten()
    }

    /// The member the others follow, if they agree on one now.
    pub(crate) async fn leader(&self) -> Option<usize> {
        match self.kind {
            Kind::Etcd => {
                let mut ids = Vec::new();
                let mut leader = None;
                for i in 0..self.members.len() {
                    let (id, l) = self.etcd_status(i).await.unwrap_or((0, 0));
                    ids.push(id);
                    if l != 0 {
                        leader = Some(l);
                    }
                }
                let leader = leader?;
                ids.iter().position(|&id| id == leader)
            }
            Kind::Zk => {
                for i in 0..self.members.len() {
                    let addr = self.addr(i);
                    let answer = tokio::task::spawn_blocking(move || ask(addr, b"srvr"))
                        .await
                        .ok()
                        .flatten();
                    if answer.is_some_and(|a| a.contains("Mode: leader")) {
                        return Some(i);
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// A member other than the leader (the first one when there is no leader).
    pub(crate) async fn follower(&self) -> usize {
        let leader = self.leader().await;
        (0..self.members.len())
            .find(|&i| Some(i) != leader)
            .unwrap_or(0)
    }

    /// SIGSTOP member `i`: it accepts connections but answers nothing, and its timers stop.
    pub(crate) fn pause(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, "STOP")
    }

    /// SIGCONT member `i`.
    pub(crate) fn resume(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, "CONT")
    }

    /// SIGKILL member `i`, keeping its data for a restart.
    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data and waits until it serves.
    pub(crate) async fn restart(&mut self, i: usize) -> Result<(), String> {
        self.kill(i);
        let mut last = String::new();
        for _ in 0..3 {
            self.spawn(i)?;
            match self.wait_serving(i).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            self.kill(i);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Err(last)
    }

    /// Cuts member `i` off from its peers (both ways), leaving its clients connected.
    pub(crate) fn cut(&self, i: usize) -> Result<(), String> {
        let others: Vec<&str> = self
            .members
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, m)| m.ip.as_str())
            .collect();
        let set = others.join(", ");
        nft(
            &self.members[i].ns,
            &format!(
                "table inet distlock_cut {{\n\
                   chain input {{ type filter hook input priority 0; ip saddr {{ {set} }} drop; }}\n\
                   chain output {{ type filter hook output priority 0; ip daddr {{ {set} }} drop; }}\n\
                 }}\n"
            ),
        )
    }

    /// Undoes [`cut`](Self::cut).
    pub(crate) fn heal(&self, i: usize) -> Result<(), String> {
        nft(&self.members[i].ns, "delete table inet distlock_cut\n")
    }

    /// Through kill(1), and only while the child is unreaped, so that its pid cannot be
    /// another process's.
    fn signal(&mut self, i: usize, signal: &str) -> Result<(), String> {
        let Some(child) = self.members[i].child.as_mut() else {
            return Err(format!("{:?} member {i} is not running", self.kind));
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return Err(format!("{:?} member {i} has exited", self.kind));
        }
        crate::signal(child.id(), signal)
    }
}

/// A small MariaDB: the campaign's tables hold a handful of rows.
const MARIADB_SIZING: [&str; 4] = [
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=4M",
    "--innodb-autoextend-increment=1",
    "--skip-name-resolve",
];

impl Drop for Deployment {
    fn drop(&mut self) {
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

/// Removes what an earlier campaign that was killed before its cleanup left behind: network
/// namespaces (and the servers still running in them), bridges and data directories named after
/// a process that no longer exists. Those of live campaigns are left alone.
pub(crate) fn sweep_stale() {
    let alive = |pid: &str| Path::new("/proc").join(pid).exists();
    let mut live_subnets = Vec::new();
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(ns) = line.split_whitespace().next() else {
                continue;
            };
            // distlock-faults-{pid}-{subnet}-{member}
            let Some(rest) = ns.strip_prefix("distlock-faults-") else {
                continue;
            };
            let parts: Vec<&str> = rest.split('-').collect();
            if parts.len() != 3 {
                continue;
            }
            if alive(parts[0]) {
                live_subnets.push(parts[1].to_string());
                continue;
            }
            if let Ok(pids) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            eprintln!("removing network namespace {ns} left by an earlier campaign");
            let _ = ip(&["netns", "delete", ns]);
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/class/net") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(subnet) = name.strip_prefix("dlf") else {
                continue;
            };
            if !subnet.bytes().all(|b| b.is_ascii_digit())
                || live_subnets.iter().any(|s| s == subnet)
            {
                continue;
            }
            // A bridge with ports belongs to a deployment being set up right now.
            let ports = std::fs::read_dir(e.path().join("brif")).map_or(0, |d| d.count());
            if ports == 0 {
                let _ = ip(&["link", "delete", &name]);
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("distlock-faults-") else {
                continue;
            };
            // Server data is distlock-faults-{Kind}-{pid}-{subnet}; the histories of failed runs
            // (distlock-faults-{pid}) are kept for the user to read.
            let parts: Vec<&str> = rest.split('-').collect();
            if parts.len() == 3 && parts[0].parse::<u32>().is_err() && !alive(parts[1]) {
                remove_dir(&e.path());
            }
        }
    }
}

fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
