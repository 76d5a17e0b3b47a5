//! Redis Cluster: the `redis+cluster://` URL, the command connection through the driver's
//! cluster client (routing by the first key's slot, following `MOVED`/`ASK`, reloading a script
//! on the node that answers `NOSCRIPT`), and listing keys node by node.
//!
//! Every key of one name shares the name's hash tag, so each script runs on the one primary
//! that owns the name's slot; the cluster scripts publish release notices on the name's shard
//! channel (`SPUBLISH`), which lives in the same slot, and waiters listen with `SSUBSCRIBE`
//! (see `notices.rs`).

use std::collections::HashMap;

use distlock_api::{Error, ErrorKind, Result};
use redis::cluster::{ClusterClient, ClusterClientBuilder, NodeAddress};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use crate::conn::{Conn, Remake};
use crate::endpoint::{ClusterSpec, Endpoint, Options};
use crate::ops::{driver_error, Server};
use crate::scripts;

impl ClusterSpec {
    /// The driver's cluster client: RESP3 with `push` for the notices' connection, without
    /// retries for the command connection.
    pub(crate) async fn client(
        &self,
        options: &Options,
        push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
    ) -> redis::RedisResult<ClusterClient> {
        let infos = self
            .seeds
            .iter()
            .map(|s| s.client.get_connection_info().clone());
        let mut builder = ClusterClientBuilder::new(infos)
            .connection_timeout(options.client.connect_timeout)
            .response_timeout(options.client.operation_timeout);
        builder = match push {
            Some(push) => builder
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(push),
            // The command connection sends each request once; `conn.rs` follows the
            // answers that say it did not run.
            None => builder.retries(0),
        };
        if self.map_seeds {
            builder = builder.node_address_map(self.seed_map(options).await);
        }
        builder.build()
    }

    /// Each seed's announced address (its `myself` line in `CLUSTER NODES`) → the address the
    /// URL reaches it at. A seed that does not answer is left out.
    async fn seed_map(&self, options: &Options) -> HashMap<NodeAddress, NodeAddress> {
        let mut map = HashMap::new();
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.client.connect_timeout))
            .set_response_timeout(Some(options.client.operation_timeout));
        for seed in &self.seeds {
            let Ok(mut conn) = seed
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await
            else {
                continue;
            };
            let Ok(nodes) = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut conn)
                .await
            else {
                continue;
            };
            let announced = nodes
                .lines()
                .map(|l| l.split(' ').collect::<Vec<_>>())
                .find(|f| f.get(2).is_some_and(|flags| flags.contains("myself")))
                .and_then(|f| address(f.get(1)?.split(['@', ',']).next()?));
            let addr = seed.client.get_connection_info().addr().to_string();
            if let (Some(from), Some(to)) = (announced, address(&addr)) {
                map.insert(from, to);
            }
        }
        map
    }
}

fn address(hostport: &str) -> Option<NodeAddress> {
    let (host, port) = hostport.rsplit_once(':')?;
    Some(NodeAddress::new(host.to_string(), port.parse().ok()?))
}

impl Server {
    /// Connects to a cluster through its seeds, bounded by the connect timeout, and loads the
    /// scripts on every node (best effort: a node that missed them answers `NOSCRIPT` and gets
    /// them then).
    pub(crate) async fn connect_cluster(
        spec: &ClusterSpec,
        endpoint: &Endpoint,
        options: &Options,
        backend: &'static str,
    ) -> Result<Self> {
        #[cfg(feature = "tls")]
        distlock_api::backend::ensure_crypto_provider();
        let limit = options.client.connect_timeout + options.client.operation_timeout;
        let connecting = async {
            let client = spec.client(options, None).await?;
            let conn = client.get_async_connection().await?;
            Ok::<_, redis::RedisError>((client, conn))
        };
        let (client, conn) = match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(made)) => made,
            Ok(Err(e)) => return Err(driver_error(backend, endpoint, "connect", e)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{}: no connection within {limit:?}", endpoint.display),
                )
                .with_backend(backend))
            }
        };
        let mut server = Self::new(Conn::Cluster(conn), endpoint, options, backend);
        server.remake = Some(Remake::new(client, limit));
        let mut conn = server.conn();
        for lua in scripts::all(true) {
            let load = redis::cmd("SCRIPT").arg("LOAD").arg(lua.source).to_owned();
            let _ = load.query_async::<Value>(&mut conn).await;
        }
        Ok(server)
    }

    /// Every key matching `pattern`: one `SCAN` over the server, or over each primary of a
    /// cluster.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut conn = self.conn();
        let nodes = match &mut conn {
            Conn::Single(_) => vec![None],
            Conn::Cluster(c) => primaries(c)
                .await
                .map_err(|e| self.error("listing nodes", e))?
                .into_iter()
                .map(Some)
                .collect(),
        };
        let mut found = Vec::new();
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let scan = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .to_owned();
                let reply = match (&mut conn, &node) {
                    (Conn::Cluster(c), Some((host, port))) => {
                        let to = SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        };
                        c.route_command(scan, RoutingInfo::SingleNode(to)).await
                    }
                    _ => scan.query_async::<Value>(&mut conn).await,
                };
                let (next, keys): (u64, Vec<String>) = reply
                    .and_then(|v| redis::from_redis_value(v).map_err(redis::RedisError::from))
                    .map_err(|e| self.error("listing", e))?;
                found.extend(keys);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(found)
    }

    /// Runs `cmd` on every primary of a cluster (on the server itself otherwise) and returns
    /// each answer (for the test-only admin).
    #[cfg(feature = "testing")]
    pub(crate) async fn on_primaries(&self, cmd: &redis::Cmd) -> Result<Vec<Value>> {
        let mut conn = self.conn();
        let Conn::Cluster(c) = &mut conn else {
            let reply = cmd.query_async::<Value>(&mut conn).await;
            return Ok(vec![reply.map_err(|e| self.error("command", e))?]);
        };
        let mut replies = Vec::new();
        for (host, port) in primaries(c).await.map_err(|e| self.error("nodes", e))? {
            let to = SingleNodeRoutingInfo::ByAddress { host, port };
            let reply = c
                .route_command(cmd.clone(), RoutingInfo::SingleNode(to))
                .await;
            replies.push(reply.map_err(|e| self.error("command", e))?);
        }
        Ok(replies)
    }
}

/// The primaries of the cluster, as `CLUSTER SLOTS` names them (`host`, `port`).
async fn primaries(c: &mut ClusterConnection) -> redis::RedisResult<Vec<(String, u16)>> {
    let slots: Vec<Vec<Value>> = redis::cmd("CLUSTER").arg("SLOTS").query_async(c).await?;
    let mut nodes = Vec::new();
    for range in slots {
        let Some(Value::Array(primary)) = range.get(2) else {
            continue;
        };
        let (Some(host), Some(Value::Int(port))) = (primary.first(), primary.get(1)) else {
            continue;
        };
        let host: String =
            redis::from_redis_value(host.clone()).map_err(redis::RedisError::from)?;
        if let Ok(port) = u16::try_from(*port) {
            if !nodes.contains(&(host.clone(), port)) {
                nodes.push((host, port));
            }
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use distlock_api::ErrorKind;

    use crate::RedisConfig;

    #[test]
    fn cluster_urls_name_their_seeds() {
        let c = RedisConfig::from_url(
            "redis+cluster://u:pw@127.0.0.1:7000, 127.0.0.1:7001?key_prefix=app&map_seeds=true",
        )
        .unwrap();
        assert!(c.is_cluster());
        assert_eq!(c.endpoint(), "cluster 127.0.0.1:7000,127.0.0.1:7001");
        let spec = c.cluster.as_ref().unwrap();
        assert!(spec.map_seeds);
        assert_eq!(spec.seeds.len(), 2);
        assert_eq!(c.options.key_prefix, "app");
        assert!(!format!("{c:?}").contains("pw"));
        assert!(!RedisConfig::from_url("redis://h:1").unwrap().is_cluster());
        for bad in [
            "redis+cluster://",
            "redis+cluster://h:1,,h:2",
            "redis+cluster://h:1/2",
            "redis+cluster://h:x",
            "redis+cluster://h:1?default_ttl=10",
        ] {
            let e = RedisConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}");
        }
        let tls = RedisConfig::from_url("rediss+cluster://h:1");
        assert_eq!(tls.is_ok(), cfg!(feature = "tls"));
    }
}
