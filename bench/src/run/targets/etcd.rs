//! etcd. The floor sends the backend's two requests directly over a gRPC connection of its
//! own, with a lease of its own: the put-if-absent transaction of the lock key (which also reads
//! the two newest keys of the lock's directory, to learn whether it is first), and a plain delete
//! of the key that returns what it deleted (checked to be the key just made). These are the two
//! requests etcd's Go `concurrency.Mutex` sends, the least a queue-ordered lock on etcd needs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::{LockName, SharedLock};
use distlock_etcd::etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse,
};
use distlock_etcd::{EtcdConfig, EtcdLock};

use super::{Floor, FloorOps, Kind, Target};
use crate::error::Res;
use crate::model::SLOW_SYNC_MS;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The floor's own lease, in seconds; its keys are deleted every cycle, the lease just backs
/// them as the client's lease backs the backend's.
const FLOOR_LEASE_S: i64 = 60;

pub(crate) struct EtcdTarget {
    config: EtcdConfig,
}

impl EtcdTarget {
    /// The first member's `/metrics` text; `None` behind TLS.
    async fn metrics(&self) -> Res<Option<String>> {
        let Some(endpoint) = self.config.endpoints().first() else {
            return Ok(None);
        };
        if endpoint.starts_with("https://") {
            return Ok(None);
        }
        let host = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let ask = async {
            let mut stream = tokio::net::TcpStream::connect(&host).await?;
            let request = format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n");
            tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes()).await?;
            let mut answer = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        let answer = tokio::time::timeout(CONNECT_TIMEOUT, ask)
            .await
            .map_err(|_| "no answer from /metrics")??;
        Ok(Some(answer))
    }

    pub(crate) async fn open(url: &str) -> Res<Self> {
        let config = EtcdConfig::from_url(url)?.connect_timeout(CONNECT_TIMEOUT);
        EtcdLock::connect(config.clone()).await?.close().await?;
        Ok(Self { config })
    }

    async fn raw(&self) -> Res<Client> {
        // The backend's connection options that matter per request: none change the path of
        // a unary call, so defaults plus the connect bound are the same kind of connection.
        let options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
        Ok(Client::connect(self.config.endpoints(), Some(options)).await?)
    }
}

#[async_trait]
impl Target for EtcdTarget {
    fn kind(&self) -> Kind {
        Kind::Etcd
    }

    async fn server_version(&self) -> Res<String> {
        let status = self.raw().await?.status().await?;
        Ok(format!("etcd {}", status.version()))
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(EtcdLock::connect(self.config.clone()).await?))
    }

    async fn client_ttl(&self, ttl: std::time::Duration) -> Res<SharedLock> {
        Ok(Arc::new(
            EtcdLock::connect(self.config.clone().default_ttl(ttl)).await?,
        ))
    }

    /// The gRPC request messages the first member has received (`grpc_server_msg_received_total`
    /// of its `/metrics`, unary calls and stream messages alike).
    async fn server_requests(&self) -> Res<Option<u64>> {
        let Some(metrics) = self.metrics().await? else {
            return Ok(None);
        };
        let mut total = 0.0;
        for line in metrics.lines() {
            if let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") {
                if let Some((_, value)) = rest.rsplit_once(' ') {
                    total += value.trim().parse::<f64>().unwrap_or(0.0);
                }
            }
        }
        Ok(Some(total as u64))
    }

    /// The first member's WAL fsyncs, and those over [`SLOW_SYNC_MS`] (its
    /// `etcd_disk_wal_fsync_duration_seconds` histogram, whose buckets double from 1 ms).
    async fn server_syncs(&self) -> Res<Option<(u64, u64)>> {
        let Some(metrics) = self.metrics().await? else {
            return Ok(None);
        };
        let value = |prefix: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        let bucket = format!(
            "etcd_disk_wal_fsync_duration_seconds_bucket{{le=\"{}\"}} ",
            SLOW_SYNC_MS as f64 / 1000.0
        );
        match (
            value("etcd_disk_wal_fsync_duration_seconds_count "),
            value(&bucket),
        ) {
            (Some(count), Some(fast)) => Ok(Some((count as u64, (count - fast).max(0.0) as u64))),
            _ => Ok(None),
        }
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        let mut client = self.raw().await?;
        let lease = client.lease_grant(FLOOR_LEASE_S, None).await?.id();
        Ok(Box::new(EtcdFloor {
            client,
            config: self.config.clone(),
            lease,
        }))
    }

    fn floor_ops(&self) -> FloorOps {
        FloorOps {
            what: "txn put-if-absent of the lock key (+ read of the directory's two newest keys) \
                   + delete of the key (returning it, to check its create-revision)",
            round_trips: 2,
        }
    }
}

struct EtcdFloor {
    client: Client,
    config: EtcdConfig,
    lease: i64,
}

#[async_trait]
impl Floor for EtcdFloor {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        let dir = self.config.lock_dir(&LockName::new(name)?);
        let key = format!("{dir}{:016x}-floor", self.lease);
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2);
        let put = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    "1",
                    Some(PutOptions::new().with_lease(self.lease)),
                ),
                TxnOp::get(dir.as_str(), Some(newest)),
            ]);
        let resp = self.client.txn(put).await?;
        if !resp.succeeded() {
            return Err(format!("floor: {key} already existed").into());
        }
        let kvs = match resp.op_responses().into_iter().nth(1) {
            Some(TxnOpResponse::Get(get)) => get.kvs().to_vec(),
            _ => return Err("floor: the put-if-absent answered without the range".into()),
        };
        let rev = match kvs.as_slice() {
            [mine] if mine.key() == key.as_bytes() => mine.create_revision(),
            _ => return Err(format!("floor: {key} is not alone in its directory").into()),
        };
        let release = Instant::now();
        // A plain delete that returns what it deleted (as the Go Mutex's unlock, and the
        // backend's release, send): the cheapest write that frees the lock, checked after.
        let deleted = self
            .client
            .delete(key.as_str(), Some(DeleteOptions::new().with_prev_key()))
            .await?;
        if !deleted
            .prev_kvs()
            .iter()
            .any(|kv| kv.create_revision() == rev)
        {
            return Err(format!("floor: {key} changed under the floor").into());
        }
        Ok(release.elapsed())
    }
}
