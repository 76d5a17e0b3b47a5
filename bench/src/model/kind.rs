//! The backends under test, by name: what `results.json` calls them and the report prints.

use distlock_api::BackendDescriptor;
use serde::{Deserialize, Serialize};

/// The backends, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) enum Kind {
    Memory,
    Redis,
    RedisSentinel,
    RedisSentinelSync,
    RedisCluster,
    RedisClusterSync,
    Redlock,
    Mysql,
    Postgres,
    PostgresAdvisory,
    Mongo,
    Zk,
    Etcd,
}

impl Kind {
    pub(crate) const ALL: [Kind; 13] = [
        Kind::Memory,
        Kind::Redis,
        Kind::RedisSentinel,
        Kind::RedisSentinelSync,
        Kind::RedisCluster,
        Kind::RedisClusterSync,
        Kind::Redlock,
        Kind::Mysql,
        Kind::Postgres,
        Kind::PostgresAdvisory,
        Kind::Mongo,
        Kind::Zk,
        Kind::Etcd,
    ];

    /// How the backend describes itself: id, label, test URL.
    pub(crate) fn descriptor(self) -> &'static BackendDescriptor {
        match self {
            Kind::Memory => &distlock_api::MEMORY,
            Kind::Redis => &distlock_redis::DESCRIPTOR,
            Kind::RedisSentinel => &REDIS_SENTINEL,
            Kind::RedisSentinelSync => &REDIS_SENTINEL_SYNC,
            Kind::RedisCluster => &REDIS_CLUSTER,
            Kind::RedisClusterSync => &REDIS_CLUSTER_SYNC,
            Kind::Redlock => &distlock_redis::REDLOCK_DESCRIPTOR,
            Kind::Mysql => &distlock_mysql::DESCRIPTOR,
            Kind::Postgres => &distlock_postgres::DESCRIPTOR,
            Kind::PostgresAdvisory => &POSTGRES_ADVISORY,
            Kind::Mongo => &distlock_mongo::DESCRIPTOR,
            Kind::Zk => &distlock_zk::DESCRIPTOR,
            Kind::Etcd => &distlock_etcd::DESCRIPTOR,
        }
    }

    /// The `--only` name, also the JSON id.
    pub(crate) fn id(self) -> &'static str {
        self.descriptor().id
    }

    pub(crate) fn from_id(id: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.id() == id)
    }

    /// The name the report prints.
    pub(crate) fn label(self) -> &'static str {
        self.descriptor().label
    }

    /// Redis through Sentinel or as a Cluster, with or without `sync_replicas`: the single
    /// server's backend on a production topology, with rows of its own.
    pub(crate) fn is_redis_topology(self) -> bool {
        matches!(
            self,
            Kind::RedisSentinel
                | Kind::RedisSentinelSync
                | Kind::RedisCluster
                | Kind::RedisClusterSync
        )
    }

    /// The `sync_replicas` this kind's URL asks for (0: none).
    pub(crate) fn sync_replicas(self) -> u32 {
        u32::from(matches!(
            self,
            Kind::RedisSentinelSync | Kind::RedisClusterSync
        ))
    }
}

/// PostgreSQL's advisory mode, a backend of its own here (its own floor and rows), on the
/// PostgreSQL server: its URL gets `mode=advisory` ([`Kind::url`](crate::model::Kind)).
static POSTGRES_ADVISORY: BackendDescriptor = BackendDescriptor {
    id: "postgres-advisory",
    label: "PostgreSQL (advisory)",
    schemes: &["postgres", "postgresql"],
    test_url_var: "DISTLOCK_POSTGRES_URL",
    test_url_default: "postgres://distlock:distlock@127.0.0.1:5432/distlock",
    capabilities: distlock_postgres::ADVISORY_CAPABILITIES,
    connect: |url| {
        Box::pin(async move {
            let config = distlock_postgres::PostgresConfig::from_url(&url)?;
            let lock = distlock_postgres::PostgresLock::connect(config).await?;
            Ok(std::sync::Arc::new(lock) as distlock_api::SharedLock)
        })
    },
};

/// The Redis backend on the local Sentinel topology (`scripts/services up redis`: a master, two
/// replicas, three sentinels), or `DISTLOCK_REDIS_SENTINEL_URL`.
const SENTINEL_URL_VAR: &str = "DISTLOCK_REDIS_SENTINEL_URL";
const SENTINEL_URL: &str =
    "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/distlock";
/// The Redis backend on the local Cluster (3 primaries, 3 replicas), or
/// `DISTLOCK_REDIS_CLUSTER_URL`.
const CLUSTER_URL_VAR: &str = "DISTLOCK_REDIS_CLUSTER_URL";
const CLUSTER_URL: &str = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002";

/// A Redis topology's descriptor: the single server's backend and capabilities, its own id,
/// label and test URL. The `sync_replicas=1` kinds share their topology's URL;
/// [`Kind::url`](crate::model::Kind) adds the option.
const fn redis_topology(
    id: &'static str,
    label: &'static str,
    test_url_var: &'static str,
    test_url_default: &'static str,
) -> BackendDescriptor {
    BackendDescriptor {
        id,
        label,
        schemes: &[
            "redis+sentinel",
            "rediss+sentinel",
            "redis+cluster",
            "rediss+cluster",
        ],
        test_url_var,
        test_url_default,
        capabilities: distlock_redis::CAPABILITIES,
        connect: connect_redis,
    }
}

static REDIS_SENTINEL: BackendDescriptor = redis_topology(
    "redis-sentinel",
    "Redis (Sentinel)",
    SENTINEL_URL_VAR,
    SENTINEL_URL,
);
static REDIS_SENTINEL_SYNC: BackendDescriptor = redis_topology(
    "redis-sentinel-sync1",
    "Redis (Sentinel, sync_replicas=1)",
    SENTINEL_URL_VAR,
    SENTINEL_URL,
);
static REDIS_CLUSTER: BackendDescriptor = redis_topology(
    "redis-cluster",
    "Redis Cluster",
    CLUSTER_URL_VAR,
    CLUSTER_URL,
);
static REDIS_CLUSTER_SYNC: BackendDescriptor = redis_topology(
    "redis-cluster-sync1",
    "Redis Cluster (sync_replicas=1)",
    CLUSTER_URL_VAR,
    CLUSTER_URL,
);

/// The single server's connect, which takes the topology URLs too.
fn connect_redis(
    url: String,
) -> futures::future::BoxFuture<'static, distlock_api::Result<distlock_api::SharedLock>> {
    Box::pin(async move {
        let config = distlock_redis::RedisConfig::from_url(&url)?;
        let lock = distlock_redis::RedisLock::connect(config).await?;
        Ok(std::sync::Arc::new(lock) as distlock_api::SharedLock)
    })
}
