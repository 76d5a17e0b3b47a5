//! Starting a member: what it needs before its first start, the server command of each kind
//! in the member's namespace, and the wait until it serves.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::NODE_TIMEOUT_MS;
use super::{Deployment, Kind, RedisMode, START_BOUND};

impl Deployment {
    /// Writes what a member needs before its first start (configuration, an initialised
    /// database).
    pub(super) fn prepare(&self, i: usize) -> Result<(), String> {
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
                install(
                    Command::new("mariadb-install-db")
                        .arg("--no-defaults")
                        .arg("--user=root")
                        .arg(format!("--datadir={}", data.display()))
                        .arg(format!("--tmpdir={}", m.dir.join("tmp").display()))
                        .args(["--auth-root-authentication-method=socket", "--skip-test-db"])
                        .args(MARIADB_SIZING),
                    &m.dir,
                    "mariadb-install-db",
                    "mariadb",
                )?;
                std::fs::write(
                    m.dir.join("init.sql"),
                    "CREATE DATABASE IF NOT EXISTS distlock;\n\
                     CREATE USER IF NOT EXISTS 'distlock'@'%' IDENTIFIED BY 'distlock';\n\
                     GRANT ALL PRIVILEGES ON distlock.* TO 'distlock'@'%';\n",
                )
                .map_err(|e| format!("init.sql: {e}"))
            }
            Kind::Postgres => {
                // The server refuses to run as root: its directory belongs to `postgres`.
                run(Command::new("chown").args(["-R", "postgres:"]).arg(&m.dir))?;
                install(
                    Command::new("runuser")
                        .args(["-u", "postgres", "--"])
                        .arg(format!("{PG_BIN}/initdb"))
                        .arg("-D")
                        .arg(&data)
                        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"]),
                    &m.dir,
                    "initdb",
                    "postgres",
                )?;
                // The runner and the clients reach the member from the bridge's subnet.
                let mut hba = std::fs::OpenOptions::new()
                    .append(true)
                    .open(data.join("pg_hba.conf"))
                    .map_err(|e| format!("pg_hba.conf: {e}"))?;
                std::io::Write::write_all(&mut hba, b"host all all 10.77.0.0/16 trust\n")
                    .map_err(|e| format!("pg_hba.conf: {e}"))
            }
            Kind::Redis | Kind::Etcd | Kind::Mongo => Ok(()),
        }
    }

    /// Starts member `i` in its namespace (without waiting for it).
    pub(super) fn spawn(&mut self, i: usize) -> Result<(), String> {
        let m = &self.members[i];
        let data = m.dir.join("data");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &m.ns]);
        // Under a faked clock: only the servers the matrix moves the clock of take these.
        let faked = match &self.clock {
            Some(path) => super::faked_clock::env_args(path)?,
            None => Vec::new(),
        };
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
                .args(if self.redis == RedisMode::Volatile {
                    ["--appendonly", "no", "--appendfsync", "no"]
                } else {
                    ["--appendonly", "yes", "--appendfsync", "always"]
                })
                .args(["--protected-mode", "no", "--dir"])
                .arg(&data);
                if self.redis == RedisMode::Cluster {
                    // In the data directory: a restart finds its node id, epochs and peers.
                    // A rejoining replica is sent its full copy at once (not after the 5 s a
                    // primary waits by default for more replicas to share one transfer).
                    cmd.args(["--cluster-enabled", "yes"])
                        .args(["--cluster-config-file", "nodes.conf"])
                        .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
                        .args(["--repl-diskless-sync-delay", "0"]);
                }
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
                cmd.args(&faked)
                    .args(["mariadbd", "--no-defaults", "--user=root"])
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
                cmd.args(&faked)
                    .arg(home.join("bin").join("secantusd-rs"))
                    .args(["--host", &m.ip, "--port", "27017", "--storage-path"])
                    .arg(&data)
                    // Without it, SecantusDB acknowledges `j: true` writes before they reach
                    // its journal, and a kill loses them (as `mongod` does not).
                    .args(["--cache-size", "64M", "--sync-on-commit"]);
            }
            Kind::Postgres => {
                // `ip netns exec` and `setpriv` both exec, so the child is the postmaster.
                cmd.args([
                    "setpriv",
                    "--reuid=postgres",
                    "--regid=postgres",
                    "--init-groups",
                ])
                .arg("--")
                .args(&faked)
                .arg(format!("{PG_BIN}/postgres"))
                .arg("-D")
                .arg(&data)
                .args(["-p", "5432", "-k"])
                .arg(&m.dir)
                .args(["-c", &format!("listen_addresses={}", m.ip)])
                .args(["-c", "max_connections=1000", "-c", "shared_buffers=16MB"]);
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.dir.join("server.log"))
            .map_err(|e| e.to_string())?;
        // A process group of its own, which the nemesis signals as one.
        let child = std::os::unix::process::CommandExt::process_group(&mut cmd, 0)
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
    pub(super) async fn wait_serving(&mut self, i: usize) -> Result<(), String> {
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
}

/// A small MariaDB: the campaign's tables hold a handful of rows.
const MARIADB_SIZING: [&str; 4] = [
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=4M",
    "--innodb-autoextend-increment=1",
    "--skip-name-resolve",
];

/// Where Debian's PostgreSQL 15 keeps its server binaries.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// Runs `cmd` to completion; an error says what failed.
fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{:?} failed ({status})", cmd.get_program()))
    }
}

/// Runs `what`, a server's first-start setup, with its output in `install.log` under `dir`; an
/// error says what failed, and which service `scripts/services up` installs it with.
fn install(cmd: &mut Command, dir: &Path, what: &str, service: &str) -> Result<(), String> {
    let log = std::fs::File::create(dir.join("install.log")).map_err(|e| e.to_string())?;
    let status = cmd
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .status()
        .map_err(|e| format!("cannot run {what} ({e}): scripts/services up {service}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}
