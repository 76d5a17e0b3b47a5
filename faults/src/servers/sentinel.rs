//! Redis through Sentinel: a private master, two replicas and three sentinels (quorum 2), each
//! sentinel in the namespace of one of the three Redis members (its own port space, so the
//! standard 26379 never meets the shared topology's), and the failover nemesis of the
//! sentinel-failover rows: the master killed, optionally after its replicas missed its last
//! writes (an nftables drop between the replicas and the master, in the replicas' namespaces).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::net::nft;
use super::{Deployment, Kind, START_BOUND};
use crate::matrix::Scenario;

/// The name the sentinels monitor the master under.
const MASTER_NAME: &str = "distlock-faults";
const SENTINEL_PORT: u16 = 26379;
/// How long the replicas drop the master's traffic before it is killed (lagging): short
/// beside Sentinel's bound on a replica's link-down time (ten down-after periods), so the
/// lagging replicas stay eligible.
const LAG: Duration = Duration::from_millis(1000);
/// Sentinel's down-after period: short, so that a failover (this, then the vote and the
/// promotion: 0.9 to 1.9 s after the kill in quick runs) ends within the campaign's 3 s
/// lease of a grant the master made just before it died.
const DOWN_AFTER_MS: u64 = 500;

/// What the nemesis notes: what, a killed client, whether it ends a fault, a deleted name.
pub(crate) type Note<'a> = &'a dyn Fn(String, Option<u32>, bool, Option<String>);

impl Deployment {
    /// The deployment `scenario` faults: a Sentinel topology for the sentinel-failover rows,
    /// else `scenario.members()` members of `kind` (Redis without persistence for the
    /// volatile restarts; the member's wall clock under libfaketime for the clock rows).
    pub(crate) async fn start_for(kind: Kind, scenario: Scenario) -> Result<Self, String> {
        if scenario.sentinel() {
            return Self::start_sentinel(scenario.members()).await;
        }
        let volatile = matches!(
            scenario,
            Scenario::ServerRestartVolatile | Scenario::MastersRestartVolatile
        );
        let clock = match scenario {
            Scenario::Timing(t) if t.clock() => Some(t.initial_clock()),
            _ => None,
        };
        Self::start_clocked(kind, scenario.members(), volatile, clock).await
    }

    /// Member 0 the master (fsync-always append-only file), the others its replicas, and a
    /// sentinel beside each; returns once the replicas are in sync and every sentinel knows
    /// both replicas and the two other sentinels.
    async fn start_sentinel(n: usize) -> Result<Self, String> {
        let mut d = Self::start(Kind::Redis, n, false).await?;
        let master = d.members[0].ip.clone();
        for (i, m) in d.members.iter().enumerate().skip(1) {
            let got = cli(&m.ip, 6379, &["REPLICAOF", &master, "6379"]).await?;
            if !got.starts_with("OK") {
                return Err(format!("REPLICAOF on member {i}: {got}"));
            }
        }
        let deadline = Instant::now() + START_BOUND;
        loop {
            let info = cli(&master, 6379, &["INFO", "replication"])
                .await
                .unwrap_or_default();
            if info.matches("state=online").count() == n - 1 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the replicas did not sync: {info}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut sentinels = Vec::new();
        for m in &d.members {
            let conf = m.dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {SENTINEL_PORT}\nbind {ip}\nprotected-mode no\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} {master} 6379 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                     sentinel failover-timeout {MASTER_NAME} 5000\n",
                    ip = m.ip,
                    dir = m.dir.display(),
                ),
            )
            .map_err(|e| format!("sentinel.conf: {e}"))?;
            let log = std::fs::File::create(m.dir.join("sentinel.log"))
                .map_err(|e| format!("sentinel.log: {e}"))?;
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &m.ns, "redis-server"])
                .arg(&conf)
                .arg("--sentinel");
            let child = std::os::unix::process::CommandExt::process_group(&mut cmd, 0)
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .spawn()
                .map_err(|e| format!("cannot start a sentinel: {e}"))?;
            sentinels.push(child);
        }
        d.sentinels = sentinels;
        for (i, m) in d.members.iter().enumerate() {
            loop {
                let got = cli(&m.ip, SENTINEL_PORT, &["SENTINEL", "MASTER", MASTER_NAME])
                    .await
                    .unwrap_or_default();
                let field = |f: &str| {
                    let lines: Vec<&str> = got.lines().collect();
                    let at = lines.iter().position(|l| *l == f)?;
                    lines.get(at + 1)?.parse::<usize>().ok()
                };
                if field("num-slaves") == Some(n - 1) && field("num-other-sentinels") == Some(n - 1)
                {
                    break;
                }
                if Instant::now() > deadline + START_BOUND {
                    return Err(format!("sentinel {i} not ready: {got}"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(d)
    }

    /// The lock URL through the three sentinels.
    pub(super) fn sentinel_url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}:{SENTINEL_PORT}", m.ip))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The nemesis: (lagging: the replicas drop the master's traffic for [`LAG`]) the master
    /// killed, the promotion awaited (the replicas healed then), the old master restarted a
    /// second later. `Ok(Some(e))`: a fault could not be undone.
    pub(crate) async fn failover(
        &mut self,
        lagging: bool,
        note: Note<'_>,
    ) -> Result<Option<String>, String> {
        let master = self.members[0].ip.clone();
        let mut undo = None;
        if lagging {
            for m in &self.members[1..] {
                nft(
                    &m.ns,
                    &format!(
                        "table inet distlock_lag {{\n\
                           chain input {{ type filter hook input priority 0; ip saddr {master} drop; }}\n\
                           chain output {{ type filter hook output priority 0; ip daddr {master} drop; }}\n\
                         }}\n"
                    ),
                )?;
            }
            note(
                "the replicas drop the master's traffic (replication cut)".into(),
                None,
                false,
                None,
            );
            tokio::time::sleep(LAG).await;
        }
        self.kill(0);
        note("SIGKILL master (member 0)".into(), None, false, None);
        let killed = Instant::now();
        // Asked of member 1's sentinel, which the replication cut leaves among the majority.
        let deadline = Instant::now() + Duration::from_secs(30);
        let promoted = loop {
            let got = cli(
                &self.members[1].ip,
                SENTINEL_PORT,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            )
            .await
            .unwrap_or_default();
            let now = got.lines().next().unwrap_or("").to_string();
            if !now.is_empty() && now != master {
                break Ok(now);
            }
            if Instant::now() > deadline {
                break Err("no replica promoted within 30 s of the kill".to_string());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if lagging {
            for m in &self.members[1..] {
                if let Err(e) = nft(&m.ns, "delete table inet distlock_lag\n") {
                    undo = Some(e);
                }
            }
        }
        let promoted = promoted?;
        note(
            format!(
                "sentinels promoted {promoted} {} ms after the kill{}",
                killed.elapsed().as_millis(),
                if lagging { "; replication healed" } else { "" }
            ),
            None,
            true,
            None,
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let restarted = self.restart(0).await;
        note(
            "old master restarted (Sentinel makes it a replica)".into(),
            None,
            true,
            None,
        );
        restarted.map_err(|e| format!("the old master did not come back: {e}"))?;
        Ok(undo)
    }
}

/// `redis-cli` against `host:port`: its output, or why not (2 s at most).
async fn cli(host: &str, port: u16, args: &[&str]) -> Result<String, String> {
    let out = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::process::Command::new("redis-cli")
            .args(["-h", host, "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("redis-cli {host}:{port} {args:?}: no answer in 2 s"))?
    .map_err(|e| format!("cannot run redis-cli: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
