//! The backends under test. Each module connects one backend through its crate's public API
//! (the cycle side) and opens a raw driver connection of the same kind that sends the server
//! operations one cycle needs at the least (the floor side), and asks the server its version.

mod etcd;
mod memory;
mod mongo;
mod mysql;
mod postgres;
mod private;
mod redis;
mod topology;
mod zk;

use std::time::Duration;

use async_trait::async_trait;
use distlock_api::SharedLock;

use crate::error::Res;
pub(crate) use crate::model::Kind;

pub(crate) use self::private::PrivateRedis;
pub(crate) use self::redis::redlock_urls;

/// The variable that hands this run's id to the leader processes of section 10, so that they
/// use the run's names and its MongoDB database.
pub(crate) const RUN_ID_VAR: &str = "DISTLOCK_BENCH_RUN_ID";

/// This run's id: the process id and a random number, in hex (or the id of the run that
/// started this process, from [`RUN_ID_VAR`]).
pub(crate) fn run_id() -> &'static str {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUN.get_or_init(|| match std::env::var(RUN_ID_VAR) {
        Ok(id) if !id.is_empty() => id,
        _ => format!("{:x}_{:04x}", std::process::id(), fastrand::u16(..)),
    })
}

/// The longest a backend may take to connect before the report calls it unavailable. Backends
/// bound their own connects too; this is the bench's guard against one that does not.
const CONNECT_BOUND: Duration = Duration::from_secs(10);

impl Kind {
    /// The environment variable with the server's URL, and its default.
    pub(crate) fn url_var(self) -> Option<(&'static str, &'static str)> {
        let d = self.descriptor();
        (!d.test_url_var.is_empty()).then_some((d.test_url_var, d.test_url_default))
    }

    /// The server URL this run uses ("in-process" for memory).
    pub(crate) fn url(self) -> String {
        match self.url_var() {
            Some(_) if self == Kind::PostgresAdvisory => {
                let url = self.descriptor().test_url();
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=advisory")
            }
            Some(_) if self.sync_replicas() > 0 => {
                let url = self.descriptor().test_url();
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}sync_replicas={}", self.sync_replicas())
            }
            Some(_) => self.descriptor().test_url(),
            None => "in-process".into(),
        }
    }

    /// What the report tells a reader whose server did not answer.
    pub(crate) fn how_to_start(self) -> String {
        let service = match self {
            Kind::Memory => return "nothing to start: the backend is in-process".into(),
            Kind::Redis
            | Kind::RedisSentinel
            | Kind::RedisSentinelSync
            | Kind::RedisCluster
            | Kind::RedisClusterSync
            | Kind::Redlock => "redis",
            Kind::Mysql => "mariadb",
            Kind::Postgres | Kind::PostgresAdvisory => "postgres",
            Kind::Mongo => "mongo",
            Kind::Zk => "zookeeper",
            Kind::Etcd => "etcd",
        };
        let var = self.url_var().map_or("", |(v, _)| v);
        format!(
            "start it with `scripts/services up {service}` (or `docker compose up -d {service}`), \
             or point {var} at a running server"
        )
    }
}

/// What one floor cycle sends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FloorOps {
    /// In words, for the report.
    pub(crate) what: &'static str,
    /// How many round trips.
    pub(crate) round_trips: u32,
}

/// The raw server operations one lock cycle needs at the least, over a raw driver connection
/// of the same kind the backend uses.
#[async_trait]
pub(crate) trait Floor: Send {
    /// Acquire and release `name` with raw operations, checking that each did what a lock
    /// needs (so a floor that silently does nothing cannot look fast). Returns how long the
    /// release (the cycle's last request or round) took: the bare cost of the request a
    /// hand-off between tasks of one handle sends.
    async fn cycle(&mut self, name: &str) -> Res<Duration>;
}

/// One backend, connected.
#[async_trait]
pub(crate) trait Target: Send + Sync {
    fn kind(&self) -> Kind;

    fn url(&self) -> String {
        self.kind().url()
    }

    /// The version the server reports about itself.
    async fn server_version(&self) -> Res<String>;

    /// A fresh client handle, with its own connections or session, as a separate process
    /// would have.
    async fn client(&self) -> Res<SharedLock>;

    /// The same with `ttl` as its default lease (the session timeout on ZooKeeper, the client
    /// lease on etcd): what a leader in section 10 holds. In-process, there is none.
    async fn client_ttl(&self, _ttl: Duration) -> Res<SharedLock> {
        Err("the in-process store has no lease setting of its own".into())
    }

    /// A raw driver connection running the floor.
    async fn floor(&self) -> Res<Box<dyn Floor>>;

    fn floor_ops(&self) -> FloorOps;

    /// How many requests the server (every server, for RedLock) has received so far, by its own
    /// count: two readings around a scenario give its requests per operation, whatever the
    /// client library does. `None` where the server keeps no such count.
    async fn server_requests(&self) -> Res<Option<u64>> {
        Ok(None)
    }

    /// How many durable log syncs the server has made so far, and how many of them took longer
    /// than [`SLOW_SYNC_MS`](crate::model::SLOW_SYNC_MS), by its own histogram (etcd's WAL fsyncs); `None` where it keeps
    /// none.
    async fn server_syncs(&self) -> Res<Option<(u64, u64)>> {
        Ok(None)
    }

    /// Removes what the run left on the server beyond what releasing does, where that state
    /// would skew later runs.
    async fn cleanup(&self) -> Res<()> {
        Ok(())
    }
}

/// Connects to `kind`'s server; an error means "unavailable" and says why.
pub(crate) async fn open(kind: Kind) -> Res<Box<dyn Target>> {
    let url = kind.url();
    let opened = tokio::time::timeout(CONNECT_BOUND, async {
        Ok::<Box<dyn Target>, crate::error::BoxError>(match kind {
            Kind::Memory => Box::new(memory::MemoryTarget::new()),
            Kind::Redis => Box::new(redis::RedisTarget::open(&url).await?),
            Kind::RedisSentinel
            | Kind::RedisSentinelSync
            | Kind::RedisCluster
            | Kind::RedisClusterSync => Box::new(topology::TopologyTarget::open(kind, &url).await?),
            Kind::Redlock => Box::new(redis::RedlockTarget::open(&url).await?),
            Kind::Mysql => Box::new(mysql::MysqlTarget::open(&url).await?),
            Kind::Postgres | Kind::PostgresAdvisory => {
                Box::new(postgres::PostgresTarget::open(kind, &url).await?)
            }
            Kind::Mongo => Box::new(mongo::MongoTarget::open(&url).await?),
            Kind::Zk => Box::new(zk::ZkTarget::open(&url).await?),
            Kind::Etcd => Box::new(etcd::EtcdTarget::open(&url).await?),
        })
    })
    .await;
    match opened {
        Ok(result) => result,
        Err(_) => Err(format!("no answer from {url} within {CONNECT_BOUND:?}").into()),
    }
}
