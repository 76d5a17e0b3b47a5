//! Redis through Sentinel: a private master, two replicas and three sentinels (quorum 2), each
//! sentinel in the namespace of one of the three Redis members (its own port space, so the
//! standard 26379 never meets the shared topology's), and the failover nemesis of the
//! sentinel-failover rows: the master killed, optionally after its replicas missed its last
//! writes (an nftables drop between the replicas and the master, in the replicas' namespaces).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::cli::{cli, cli_ok, poll};
use super::nemesis::PROMOTION_BOUND;
use super::net::nft;
use super::{Deployment, Kind, Note, RedisMode, START_BOUND};

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

impl Deployment {
    /// Member 0 the master (fsync-always append-only file), the others its replicas, and a
    /// sentinel beside each; returns once the replicas are in sync and every sentinel knows
    /// both replicas and the two other sentinels.
    pub(super) async fn start_sentinel(n: usize) -> Result<Self, String> {
        let mut d = Self::start(Kind::Redis, n, RedisMode::Durable).await?;
        let master = d.members[0].ip.clone();
        for m in &d.members[1..] {
            cli_ok(&m.ip, 6379, &["REPLICAOF", &master, "6379"]).await?;
        }
        poll(START_BOUND, "the replicas did not sync", async || {
            replicas_online(&master, n - 1).await
        })
        .await?;
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
            let what = format!("sentinel {i} was not ready");
            poll(START_BOUND, &what, async || {
                let got = cli(&m.ip, SENTINEL_PORT, &["SENTINEL", "MASTER", MASTER_NAME]).await?;
                let field = |f: &str| {
                    let lines: Vec<&str> = got.lines().collect();
                    let at = lines.iter().position(|l| *l == f)?;
                    lines.get(at + 1)?.parse::<usize>().ok()
                };
                if field("num-slaves") == Some(n - 1) && field("num-other-sentinels") == Some(n - 1)
                {
                    Ok(())
                } else {
                    Err(got)
                }
            })
            .await?;
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
    /// second later, and the fault's end awaited: the new master with both replicas (the old
    /// master made one by Sentinel). The master is whichever member Sentinel names now, so a
    /// soak can fail over again and again. `Ok(Some(e))`: a fault could not be undone.
    pub(crate) async fn failover(
        &mut self,
        lagging: bool,
        note: Note<'_>,
    ) -> Result<Option<String>, String> {
        let (old, master) = self.master().await?;
        let mut undo = None;
        if lagging {
            for m in self.replicas_of(old) {
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
        self.kill(old);
        note(format!("SIGKILL master (member {old})"), None, false, None);
        let killed = Instant::now();
        // Asked of a replica's sentinel, which the replication cut leaves among the majority.
        let sentinel = self.members[(old + 1) % self.members.len()].ip.clone();
        let promoted = poll(PROMOTION_BOUND, "no replica promoted", async || {
            let now = current_master(&sentinel).await?;
            if now != master {
                Ok(now)
            } else {
                Err(now)
            }
        })
        .await;
        if lagging {
            for m in self.replicas_of(old) {
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
        // The old master comes back a master of its own data; Sentinel makes it a replica of
        // the new one only once it has reported that role for eight seconds (Sentinel's
        // SENTINEL_PUBLISH_PERIOD * 4). Until then a client that reaches it, or a new master
        // whose other replica was not yet moved over, acknowledges no grant with
        // sync_replicas: the fault ends when the master has both replicas again. That master
        // is asked of Sentinel at each look, not assumed to be the promoted one: a failover
        // that Sentinel aborts (its failover-timeout passed on a loaded machine) leaves the
        // restarted old master in charge, with the promoted replica turned back.
        self.rejoin(old, "old master restarted", false, note)
            .await?;
        let back = Instant::now();
        let replicas = self.members.len() - 1;
        let whole = poll(
            PROMOTION_BOUND,
            "the master did not get its replicas back",
            async || {
                let now = current_master(&sentinel).await?;
                replicas_online(&now, replicas)
                    .await
                    .map(|()| now.clone())
                    .map_err(|info| format!("master {now}: {info}"))
            },
        )
        .await;
        if let Ok(now) = &whole {
            note(
                format!(
                    "the master ({now}{}) has {replicas} replicas again {} ms after the old \
                     master's restart",
                    if *now == promoted {
                        ", the promoted one"
                    } else {
                        ", not the promoted one: Sentinel aborted the failover"
                    },
                    back.elapsed().as_millis()
                ),
                None,
                true,
                None,
            );
        }
        Ok(undo.or(whole.err()))
    }
}

impl Deployment {
    /// Every member but `master`.
    fn replicas_of(&self, master: usize) -> impl Iterator<Item = &super::Member> {
        (self.members.iter().enumerate())
            .filter(move |(i, _)| *i != master)
            .map(|(_, m)| m)
    }

    /// The member that is the master now, and its address, as the first sentinel that answers
    /// names it (member 0 until a failover).
    async fn master(&self) -> Result<(usize, String), String> {
        let mut last = String::new();
        for m in &self.members {
            match current_master(&m.ip).await {
                Ok(ip) => {
                    return match self.members.iter().position(|m| m.ip == ip) {
                        Some(i) => Ok((i, ip)),
                        None => Err(format!(
                            "Sentinel names a master not of this topology: {ip}"
                        )),
                    }
                }
                Err(e) => last = e,
            }
        }
        Err(format!("no sentinel named the master (last: {last})"))
    }
}

/// The master's address as the sentinel at `sentinel` names it now.
async fn current_master(sentinel: &str) -> Result<String, String> {
    let got = cli(
        sentinel,
        SENTINEL_PORT,
        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
    )
    .await?;
    match got.lines().next() {
        Some(ip) if !ip.is_empty() => Ok(ip.to_string()),
        _ => Err(got),
    }
}

/// Whether the master at `host` has `count` replicas online; its `INFO replication` if not.
async fn replicas_online(host: &str, count: usize) -> Result<(), String> {
    let info = cli(host, 6379, &["INFO", "replication"]).await?;
    if info.matches("state=online").count() == count {
        Ok(())
    } else {
        Err(info)
    }
}
