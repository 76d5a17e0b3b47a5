//! A private Redis Cluster for the cluster rows: six members, each in its namespace as every
//! member is, members 0 to 2 primaries with a third of the slots each (in order) and members 3
//! to 5 their replicas (3 follows 0, 4 follows 1, 5 follows 2), on a short node timeout. The
//! nodes announce their namespace addresses, which the clients in the root namespace reach over
//! the bridge, so the URL needs no `map_seeds`. A run's names take suffixes until all of them
//! hash to primary 0's slots, so the faults in `cluster/faults.rs` hit every name; each fault asks
//! the cluster which members serve those slots now (after a failover, the promoted replica).

mod faults;
mod slots;

use distlock::LockName;

use super::cli::{cli, cli_ok, info_field, poll};
use super::{Deployment, Kind, RedisMode, START_BOUND};
use slots::{initial_slots, key_slot};

/// The cluster's node timeout: short, so that a failover (this, the failure reports' spread,
/// then the replica's election delay of 0.5 to 1 s: about 2 to 3 s) ends within the campaign's
/// 3 s lease of a grant the old primary made just before it failed.
pub(super) const NODE_TIMEOUT_MS: u64 = 1000;
/// The port every member serves on (the cluster bus is this + 10000).
const PORT: u16 = 6379;
/// The primary whose slots hold the run's names when the cluster starts.
const FAULTED: usize = 0;

impl Deployment {
    /// Starts `n` members as cluster nodes, joins them, gives the first half the slots and
    /// makes each of the second half a replica of one of them; returns once every node sees
    /// the whole cluster with every slot served and every replica is in sync.
    pub(super) async fn start_cluster(n: usize) -> Result<Self, String> {
        let d = Self::start(Kind::Redis, n, RedisMode::Cluster).await?;
        let primaries = n / 2;
        let mut ids = Vec::new();
        for i in 0..n {
            ids.push(d.node_id(i).await?);
        }
        let first = d.members[0].ip.as_str();
        for m in &d.members[1..] {
            cli_ok(first, PORT, &["CLUSTER", "MEET", &m.ip, &PORT.to_string()]).await?;
        }
        for p in 0..primaries {
            let slots = initial_slots(p, primaries);
            let (lo, hi) = (slots.start().to_string(), slots.end().to_string());
            cli_ok(
                &d.members[p].ip,
                PORT,
                &["CLUSTER", "ADDSLOTSRANGE", &lo, &hi],
            )
            .await?;
        }
        for r in primaries..n {
            // Refused ("Unknown node") until the replica has heard of its primary.
            let (ip, of) = (&d.members[r].ip, &ids[r - primaries]);
            let what = format!("member {r} did not become a replica");
            poll(START_BOUND, &what, async || {
                cli_ok(ip, PORT, &["CLUSTER", "REPLICATE", of]).await
            })
            .await?;
        }
        for (i, m) in d.members.iter().enumerate() {
            let what = format!("member {i} did not see the whole cluster serving");
            poll(START_BOUND, &what, async || {
                let info = cli(&m.ip, PORT, &["CLUSTER", "INFO"]).await?;
                let all = n.to_string();
                let ok = info_field(&info, "cluster_state") == Some("ok")
                    && info_field(&info, "cluster_known_nodes") == Some(all.as_str())
                    && info_field(&info, "cluster_slots_ok") == Some("16384");
                ok.then_some(()).ok_or(info)
            })
            .await?;
        }
        for (p, m) in d.members[..primaries].iter().enumerate() {
            let what = format!("primary {p}'s replica did not sync");
            poll(START_BOUND, &what, async || {
                let info = cli(&m.ip, PORT, &["INFO", "replication"]).await?;
                info.contains("state=online").then_some(()).ok_or(info)
            })
            .await?;
        }
        Ok(d)
    }

    /// Member `i`'s node id (kept across restarts in its `nodes.conf`).
    async fn node_id(&self, i: usize) -> Result<String, String> {
        let id = cli(&self.members[i].ip, PORT, &["CLUSTER", "MYID"]).await?;
        if id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(id)
        } else {
            Err(format!("CLUSTER MYID on member {i}: {id:?}"))
        }
    }

    /// Whether every one of `names` hashes to the faulted primary's slots (always, off a Redis
    /// Cluster): on the cluster a run's name takes a suffix until it does, so that its fault
    /// hits every name, and a slot migration moves them all.
    pub(crate) fn keeps_together(&self, names: &[String]) -> bool {
        if self.redis != RedisMode::Cluster {
            return true;
        }
        let own = initial_slots(FAULTED, self.members.len() / 2);
        names
            .iter()
            .all(|n| slot_of(n).is_some_and(|s| own.contains(&s)))
    }
}

/// The slot of every key of the lock name `name` (`None` for a name that is not one).
fn slot_of(name: &str) -> Option<u16> {
    let name = LockName::new(name).ok()?;
    Some(key_slot(&distlock_redis::testing::lock_key(&name)))
}
