//! A private, throw-away Sentinel topology for failover tests: a master, one replica and three
//! sentinels (quorum 2, `down-after-milliseconds 1000`, `failover-timeout 5000`) on ports the
//! kernel reports free, under a temp dir of its own; every process killed when dropped, panics
//! included. Disruptive tests fail this one over, never the shared topology.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock_redis::redis;

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "failover";

pub struct SentinelTopology {
    pub master: u16,
    pub replica: u16,
    pub sentinels: [u16; 3],
    dir: PathBuf,
    /// The master, the replica, then the sentinels.
    children: Vec<Option<Child>>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

fn redis_server(args: &[String]) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start redis-server ({e}): run `scripts/services up redis`, which installs it")
        })
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on {port} 10 s after its start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl SentinelTopology {
    /// Starts the five processes and waits (up to 30 s) until the replica is in sync and every
    /// sentinel names the master, knows the replica and the two other sentinels.
    pub async fn start() -> Self {
        let mut ports = Vec::new();
        while ports.len() < 5 {
            let p = free_port();
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let dir = std::env::temp_dir().join(format!(
            "distlock-sentinel-test-{}-{}",
            ports[0],
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut t = Self {
            master: ports[0],
            replica: ports[1],
            sentinels: [ports[2], ports[3], ports[4]],
            dir,
            children: Vec::new(),
        };
        for port in [
            t.master,
            t.replica,
            t.sentinels[0],
            t.sentinels[1],
            t.sentinels[2],
        ] {
            assert!(
                TcpStream::connect(("127.0.0.1", port)).is_err(),
                "port {port} is already in use"
            );
        }
        let node = |port: u16, dir: &PathBuf| -> Vec<String> {
            let data = dir.join(format!("node-{port}"));
            std::fs::create_dir_all(&data).expect("node dir");
            [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                data.to_str().expect("utf-8 temp dir"),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        t.children.push(Some(redis_server(&node(t.master, &t.dir))));
        wait_port(t.master);
        let mut replica = node(t.replica, &t.dir);
        replica.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            t.master.to_string(),
        ]);
        t.children.push(Some(redis_server(&replica)));
        wait_port(t.replica);
        for port in t.sentinels {
            let conf = t.dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 5000\n",
                    dir = t.dir.display(),
                    master = t.master,
                ),
            )
            .expect("write the sentinel's config");
            let args = vec![
                conf.to_str().expect("utf-8").to_string(),
                "--sentinel".into(),
            ];
            t.children.push(Some(redis_server(&args)));
            wait_port(port);
        }
        t.wait_until_ready().await;
        t
    }

    /// The client URL: the three sentinels and the master's name, with `options`.
    pub fn url(&self, options: &str) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "redis+sentinel://{}/{MASTER_NAME}{}{options}",
            hosts.join(","),
            if options.is_empty() { "" } else { "?" }
        )
    }

    async fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.not_ready().await {
                None => return,
                Some(why) if Instant::now() >= deadline => {
                    panic!("the private Sentinel topology is not ready after 30 s: {why}")
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// What is not ready yet, or `None`.
    async fn not_ready(&self) -> Option<String> {
        self.readiness().await.err()
    }

    async fn readiness(&self) -> Result<(), String> {
        let info: String = query(self.replica, redis::cmd("INFO").arg("replication"))
            .await
            .map_err(|e| format!("the replica: {e}"))?;
        if !info.contains("master_link_status:up") {
            return Err("the replica is not in sync".into());
        }
        for port in self.sentinels {
            if self.master_of(port).await != Some(self.master) {
                return Err(format!("sentinel {port} does not name the master"));
            }
            // Each replica and sentinel is a flat list of field names and values.
            let replicas: Vec<Vec<String>> = query(
                port,
                redis::cmd("SENTINEL").arg("replicas").arg(MASTER_NAME),
            )
            .await
            .map_err(|e| format!("sentinel {port}: {e}"))?;
            let flags = |fields: &Vec<String>| {
                fields
                    .chunks(2)
                    .find(|kv| kv[0] == "flags")
                    .and_then(|kv| kv.get(1).cloned())
                    .unwrap_or_default()
            };
            if !replicas.iter().any(|r| flags(r) == "slave") {
                return Err(format!("sentinel {port} knows no live replica"));
            }
            let others: Vec<Vec<String>> = query(
                port,
                redis::cmd("SENTINEL").arg("sentinels").arg(MASTER_NAME),
            )
            .await
            .map_err(|e| format!("sentinel {port}: {e}"))?;
            if others.len() < 2 {
                return Err(format!("sentinel {port} knows {} others", others.len()));
            }
        }
        Ok(())
    }

    /// The master's port as the sentinel on `port` names it.
    pub async fn master_of(&self, port: u16) -> Option<u16> {
        let addr: Option<(String, String)> = query(
            port,
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(MASTER_NAME),
        )
        .await
        .ok()?;
        addr?.1.parse().ok()
    }

    /// Kills the master (SIGKILL): the sentinels fail over to the replica.
    pub fn kill_master(&mut self) {
        if let Some(mut child) = self.children[0].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One command on the server at `port`, over a connection of its own (2 s bounds).
pub async fn query<T: redis::FromRedisValue>(
    port: u16,
    cmd: &mut redis::Cmd,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    cmd.query_async(&mut conn).await
}

impl Drop for SentinelTopology {
    fn drop(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
