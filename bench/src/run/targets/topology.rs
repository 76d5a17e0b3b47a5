//! Redis on its production topologies: a master found through Sentinel, and Redis Cluster,
//! each with and without `sync_replicas=1`. The cycle side is distlock-redis on the topology's
//! URL; the floor side is the least a lock cycle needs there over the raw redis driver:
//!
//! - Sentinel: `SET key owner NX PX` then `DEL key` on the master, which the floor finds once
//!   through the sentinels when the target opens (the backend asks them at connect too, and
//!   again only after a failover), over a `ConnectionManager` as the single server's floor.
//! - Cluster: the same two commands through the driver's cluster client, routed to the primary
//!   that owns the key's slot (the backend's lock key, so the same slot as its scripts).
//! - With `sync_replicas=1`: `SET NX PX` and `WAIT 1 t` in one pipeline on the same connection,
//!   as `backend-redis/src/replicas.rs` sends its grants (on a cluster the pipeline is routed by
//!   the `SET`'s key, so the `WAIT` runs on the primary that wrote), then `DEL`.
//!
//! The single server's floor sends the backend's own scripts; these send the bare commands, so
//! their × floor also counts what the scripts do beyond a `SET NX PX` (the fencing counter, the
//! release notice). The server's own count of requests is `total_commands_processed` on the
//! master (Sentinel) or summed over the primaries (Cluster), as for the single server: it also
//! counts the few commands per second replicas and sentinels send (`REPLCONF ACK`, `PING`,
//! `INFO`, hello messages), small beside a contended second of grants.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::{LockName, OwnerId, SharedLock};
use distlock_redis::redis::aio::ConnectionLike;
use distlock_redis::redis::cluster::ClusterClient;
use distlock_redis::redis::{self, Value};
use distlock_redis::{RedisConfig, RedisLock};

use super::redis::{
    commands_processed, connect_raw, server_version, CONNECT_TIMEOUT, FLOOR_TTL_MS,
};
use super::{Floor, FloorOps, Kind, Target};
use crate::error::{BoxError, Res};

/// The floor's `WAIT` timeout: it answers as soon as one replica acknowledged, so this only
/// bounds a replica that does not (the floor then fails rather than measures a timeout).
const FLOOR_WAIT_MS: u64 = 1_000;

pub(crate) struct TopologyTarget {
    kind: Kind,
    config: RedisConfig,
    nodes: Nodes,
}

enum Nodes {
    /// The master's driver URL, found through the sentinels at open, and how many sentinels.
    Sentinel { master: String, sentinels: usize },
    /// The seeds' driver URLs, and the primaries (with slots) `CLUSTER NODES` named at open.
    Cluster {
        seeds: Vec<String>,
        primaries: Vec<String>,
    },
}

impl TopologyTarget {
    /// `kind` is one of the four [`Kind::is_redis_topology`] kinds and `url` its URL.
    pub(crate) async fn open(kind: Kind, url: &str) -> Res<Self> {
        let config = RedisConfig::from_url(url)?.connect_timeout(CONNECT_TIMEOUT);
        // Connecting once proves the topology answers (and, with sync_replicas, is valid).
        RedisLock::connect(config.clone()).await?;
        let parts = Parts::of(url)?;
        let nodes = if config.is_sentinel() {
            Nodes::Sentinel {
                master: find_master(&parts).await?,
                sentinels: parts.hosts.len(),
            }
        } else if config.is_cluster() {
            Nodes::Cluster {
                seeds: parts.hosts.iter().map(|h| parts.driver(h)).collect(),
                primaries: find_primaries(&parts).await?,
            }
        } else {
            return Err(format!("{url} is neither a Sentinel nor a Cluster URL").into());
        };
        Ok(Self {
            kind,
            config,
            nodes,
        })
    }

    fn sync(&self) -> bool {
        self.kind.sync_replicas() > 0
    }
}

#[async_trait]
impl Target for TopologyTarget {
    fn kind(&self) -> Kind {
        self.kind
    }

    async fn server_version(&self) -> Res<String> {
        match &self.nodes {
            Nodes::Sentinel { master, sentinels } => Ok(format!(
                "{} (master found through {sentinels} sentinels)",
                server_version(master).await?
            )),
            Nodes::Cluster { primaries, .. } => {
                let first = primaries.first().ok_or("the cluster named no primary")?;
                Ok(format!(
                    "{} (cluster, {} primaries)",
                    server_version(first).await?,
                    primaries.len()
                ))
            }
        }
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(RedisLock::connect(self.config.clone()).await?))
    }

    async fn client_ttl(&self, ttl: Duration) -> Res<SharedLock> {
        Ok(Arc::new(
            RedisLock::connect(self.config.clone().default_ttl(ttl)).await?,
        ))
    }

    async fn server_requests(&self) -> Res<Option<u64>> {
        let total = match &self.nodes {
            Nodes::Sentinel { master, .. } => commands_processed(master).await?,
            Nodes::Cluster { primaries, .. } => {
                let mut total = 0;
                for url in primaries {
                    total += commands_processed(url).await?;
                }
                total
            }
        };
        Ok(Some(total))
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        let (config, owner, wait) = (self.config.clone(), OwnerId::random(), self.sync());
        Ok(match &self.nodes {
            Nodes::Sentinel { master, .. } => Box::new(KeyFloor {
                conn: connect_raw(master).await?,
                config,
                owner,
                wait,
            }),
            Nodes::Cluster { seeds, .. } => {
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(CONNECT_TIMEOUT)
                    .build()?;
                let conn = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_connection())
                    .await
                    .map_err(|_| "no connection to the cluster's seeds in time")??;
                Box::new(KeyFloor {
                    conn,
                    config,
                    owner,
                    wait,
                })
            }
        })
    }

    fn floor_ops(&self) -> FloorOps {
        let what = match (&self.nodes, self.sync()) {
            (Nodes::Sentinel { .. }, false) => {
                "`SET NX PX` + `DEL` on the master (found once through the sentinels)"
            }
            (Nodes::Sentinel { .. }, true) => {
                "`SET NX PX` and `WAIT 1` pipelined, then `DEL`, on the master (found once \
                 through the sentinels)"
            }
            (Nodes::Cluster { .. }, false) => {
                "`SET NX PX` + `DEL` through the cluster client, routed to the key's slot"
            }
            (Nodes::Cluster { .. }, true) => {
                "`SET NX PX` and `WAIT 1` pipelined to the key's primary (routed by the key), \
                 then `DEL`, through the cluster client"
            }
        };
        FloorOps {
            what,
            round_trips: 2,
        }
    }
}

/// A topology URL's pieces: `redis[s]+sentinel://[auth@]h1,h2/master` or
/// `redis[s]+cluster://[auth@]h1,h2`, options dropped (the driver rejects distlock's).
struct Parts {
    tls: bool,
    auth: String,
    hosts: Vec<String>,
    path: String,
}

impl Parts {
    fn of(url: &str) -> Res<Self> {
        let url = url.trim();
        let (scheme, rest) = url.split_once("://").ok_or("the URL has no scheme")?;
        let rest = rest.split('?').next().unwrap_or(rest);
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        let (auth, hosts) = authority
            .rsplit_once('@')
            .map_or((String::new(), authority), |(a, h)| (format!("{a}@"), h));
        Ok(Self {
            tls: scheme.starts_with("rediss"),
            auth,
            hosts: hosts
                .split(',')
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect(),
            path: path.trim_start_matches('/').to_string(),
        })
    }

    fn scheme(&self) -> &'static str {
        if self.tls {
            "rediss"
        } else {
            "redis"
        }
    }

    /// The driver URL of a data node (with the URL's credentials).
    fn driver(&self, host: &str) -> String {
        format!("{}://{}{host}", self.scheme(), self.auth)
    }
}

/// Asks the sentinels in turn for the master's address: the first that names it wins.
async fn find_master(parts: &Parts) -> Res<String> {
    let name = parts
        .path
        .split('/')
        .next()
        .filter(|n| !n.is_empty())
        .ok_or("the Sentinel URL names no master")?;
    let mut last: Option<BoxError> = None;
    for host in &parts.hosts {
        let asked = async {
            let mut conn = connect_raw(&format!("{}://{host}", parts.scheme())).await?;
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .query_async(&mut conn)
                .await?;
            let (ip, port) = addr.ok_or_else(|| format!("{host} knows no master {name:?}"))?;
            Ok::<_, BoxError>(parts.driver(&format!("{ip}:{port}")))
        };
        match asked.await {
            Ok(master) => return Ok(master),
            Err(e) => last = Some(e),
        }
    }
    Err(format!(
        "no sentinel named the master {name:?}: {}",
        last.map_or_else(|| "no sentinels".to_string(), |e| e.to_string())
    )
    .into())
}

/// The cluster's primaries that serve slots, by the first seed that lists them.
async fn find_primaries(parts: &Parts) -> Res<Vec<String>> {
    let mut last: Option<BoxError> = None;
    for host in &parts.hosts {
        let listed = async {
            let mut conn = connect_raw(&parts.driver(host)).await?;
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut conn)
                .await?;
            Ok::<_, BoxError>(primaries_of(&nodes))
        };
        match listed.await {
            Ok(list) if !list.is_empty() => {
                return Ok(list.iter().map(|a| parts.driver(a)).collect())
            }
            Ok(_) => last = Some(format!("{host} listed no primary with slots").into()),
            Err(e) => last = Some(e),
        }
    }
    Err(format!(
        "no seed listed the cluster's primaries: {}",
        last.map_or_else(|| "no seeds".to_string(), |e| e.to_string())
    )
    .into())
}

/// `host:port` of each healthy primary with slots in a `CLUSTER NODES` reply.
fn primaries_of(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let flags = f.get(2)?;
            let serving = flags.contains("master") && !flags.contains("fail") && f.len() > 8;
            serving.then_some(())?;
            Some(f.get(1)?.split(['@', ',']).next()?.to_string())
        })
        .collect()
}

/// `SET NX PX` (with `WAIT 1` pipelined behind it when `wait`) and `DEL` of the backend's lock
/// key, over `conn`: a master's `ConnectionManager` or a cluster connection.
struct KeyFloor<C> {
    conn: C,
    config: RedisConfig,
    owner: OwnerId,
    wait: bool,
}

#[async_trait]
impl<C: ConnectionLike + Send + 'static> Floor for KeyFloor<C> {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        let key = self.config.lock_key(&LockName::new(name)?);
        let owner_text = self.owner.text();
        let mut set = redis::cmd("SET");
        set.arg(&key)
            .arg(&*owner_text)
            .arg("NX")
            .arg("PX")
            .arg(FLOOR_TTL_MS);
        let granted: Value = if self.wait {
            let mut pipe = redis::pipe();
            pipe.add_command(set).cmd("WAIT").arg(1).arg(FLOOR_WAIT_MS);
            let (granted, acks): (Value, i64) = pipe.query_async(&mut self.conn).await?;
            if acks < 1 {
                return Err(format!(
                    "floor: no replica acknowledged the SET within {FLOOR_WAIT_MS} ms"
                )
                .into());
            }
            granted
        } else {
            set.query_async(&mut self.conn).await?
        };
        if matches!(granted, Value::Nil) {
            return Err(format!("floor: SET NX found {key} taken").into());
        }
        let release = Instant::now();
        let deleted: i64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut self.conn)
            .await?;
        if deleted != 1 {
            return Err(format!("floor: DEL found no {key}").into());
        }
        Ok(release.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_urls_split_into_driver_urls_without_options() {
        let p = Parts::of("redis+sentinel://u:p@a:1,b:2/distlock?sync_replicas=1").unwrap();
        assert_eq!(p.hosts, vec!["a:1", "b:2"]);
        assert_eq!(p.path, "distlock");
        assert_eq!(p.driver("m:3"), "redis://u:p@m:3");
        let p = Parts::of("rediss+cluster://a:1, b:2").unwrap();
        assert_eq!(p.driver(&p.hosts[1]), "rediss://b:2");
    }

    #[test]
    fn primaries_are_the_masters_serving_slots() {
        let nodes = "\
id1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
id2 127.0.0.1:7003@17003 slave id1 0 1 4 connected
id3 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922
id4 127.0.0.1:7002@17002 master,fail - 0 1 3 connected 10923-16383
id5 127.0.0.1:7006@17006 master - 0 1 5 connected
";
        assert_eq!(
            primaries_of(nodes),
            vec!["127.0.0.1:7000", "127.0.0.1:7001"]
        );
    }
}
