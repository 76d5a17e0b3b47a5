//! ZooKeeper. The floor is the lock recipe's three requests sent directly over a session of
//! its own: create an ephemeral-sequential node under the lock's container node, list the
//! children (the lowest sequence holds), delete the node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::SharedLock;
use distlock_zk::zookeeper_client as zk;
use distlock_zk::{ZkConfig, ZkLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Floor, FloorOps, Kind, Target};
use crate::error::Res;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub(crate) struct ZkTarget {
    config: ZkConfig,
}

impl ZkTarget {
    pub(crate) async fn open(url: &str) -> Res<Self> {
        let config = ZkConfig::from_url(url)?.connect_timeout(CONNECT_TIMEOUT);
        ZkLock::connect(config.clone()).await?;
        Ok(Self { config })
    }

    /// The first server's answer to the `srvr` four-letter word.
    async fn srvr(&self) -> Res<String> {
        let host = self
            .config
            .hosts()
            .split(',')
            .next()
            .unwrap_or_default()
            .to_string();
        let ask = async {
            let mut stream = TcpStream::connect(&host).await?;
            stream.write_all(b"srvr").await?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        Ok(tokio::time::timeout(CONNECT_TIMEOUT, ask)
            .await
            .map_err(|_| "no answer to `srvr`")??)
    }
}

#[async_trait]
impl Target for ZkTarget {
    fn kind(&self) -> Kind {
        Kind::Zk
    }

    /// ZooKeeper's client protocol does not carry the server version; the `srvr` four-letter
    /// word does (scripts/services whitelists it).
    async fn server_version(&self) -> Res<String> {
        let answer = self.srvr().await?;
        let version = answer
            .lines()
            .find_map(|l| l.strip_prefix("Zookeeper version: "))
            .ok_or("`srvr` is not whitelisted (4lw.commands.whitelist)")?;
        Ok(format!(
            "ZooKeeper {}",
            version.split(['-', ',']).next().unwrap_or(version).trim()
        ))
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(ZkLock::connect(self.config.clone()).await?))
    }

    async fn client_ttl(&self, ttl: std::time::Duration) -> Res<SharedLock> {
        Ok(Arc::new(
            ZkLock::connect(self.config.clone().default_ttl(ttl)).await?,
        ))
    }

    /// The `Received:` packet count of `srvr` (requests and session pings).
    async fn server_requests(&self) -> Res<Option<u64>> {
        let answer = self.srvr().await?;
        let n = answer
            .lines()
            .find_map(|l| l.strip_prefix("Received: "))
            .ok_or("no Received count in `srvr`")?
            .trim()
            .parse::<u64>()?;
        Ok(Some(n))
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        let lock = ZkLock::connect(self.config.clone()).await?;
        Ok(Box::new(ZkFloor {
            client: lock.client(),
            lock,
        }))
    }

    fn floor_ops(&self) -> FloorOps {
        FloorOps {
            what: "create ephemeral-sequential node + list children + delete",
            round_trips: 3,
        }
    }
}

struct ZkFloor {
    client: zk::Client,
    /// Keeps the session open and maps names to paths the way the backend does.
    lock: ZkLock,
}

#[async_trait]
impl Floor for ZkFloor {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        let dir = self.lock.lock_path(name)?;
        let prefix = format!("{dir}/floor-");
        let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let created = match self.client.create(&prefix, b"", &ephemeral).await {
            Err(zk::Error::NoNode) => {
                // The lock's container node is missing (first use, or the server reaped it
                // while empty): the backend pays the same extra create then.
                let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                match self.client.create(&dir, b"", &container).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(zk::Error::NoNode) => {
                        let persistent =
                            zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                        let base = dir.rsplit_once('/').map_or("/", |(b, _)| b);
                        self.client.mkdir(base, &persistent).await?;
                        self.client.create(&dir, b"", &container).await?;
                    }
                    Err(e) => return Err(e.into()),
                }
                self.client.create(&prefix, b"", &ephemeral).await?
            }
            other => other?,
        };
        let path = format!("{prefix}{}", created.1);
        let children = self.client.list_children(&dir).await?;
        let lowest = children.iter().min_by_key(|c| sequence(c));
        if lowest.map(|c| format!("{dir}/{c}")) != Some(path.clone()) {
            return Err(format!("floor: {path} is not the lowest of {children:?}").into());
        }
        let release = Instant::now();
        self.client.delete(&path, None).await?;
        Ok(release.elapsed())
    }
}

/// The sequence number ZooKeeper appended to a sequential node's name.
fn sequence(node: &str) -> u64 {
    let digits = node.len() - node.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    node[node.len() - digits..].parse().unwrap_or(u64::MAX)
}
