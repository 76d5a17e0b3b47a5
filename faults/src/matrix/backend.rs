//! The backends the campaign runs against: each crate's descriptor and test-only admin, and the
//! modes (URL options) that make a second set of cells of one crate.

use std::time::Duration;

use distlock_api::backend::testing::AdminFn;
use distlock_api::{BackendDescriptor, Capabilities, LeaseKind};

/// A backend the campaign runs against.
#[derive(Clone, Copy)]
pub(crate) struct Backend {
    /// What the backend crate says of itself.
    pub(crate) descriptor: &'static BackendDescriptor,
    /// Its test-only admin; `None` for the in-memory store (no server to act on).
    pub(crate) admin: Option<AdminFn>,
    /// A mode of the backend chosen by URL options: its key, the options, and what it
    /// promises (PostgreSQL's advisory mode). `None`: the descriptor's id and capabilities.
    pub(crate) mode: Option<Mode>,
}

/// A backend's mode: a second set of cells for one crate.
#[derive(Clone, Copy)]
pub(crate) struct Mode {
    pub(crate) key: &'static str,
    /// Appended to every URL of the backend.
    pub(crate) options: &'static str,
    pub(crate) capabilities: Capabilities,
    /// The private topology the mode runs on, if it has one.
    pub(crate) topology: Option<Topology>,
}

/// A Redis topology the campaign starts for the rows of its own: a backend on it runs those
/// rows only, and they run on no other backend (the single-server faults are the `redis` rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// A master, 2 replicas and 3 sentinels (`servers/sentinel.rs`).
    Sentinel,
    /// 3 primaries and 3 replicas with `cluster-enabled yes` (`servers/cluster.rs`).
    Cluster,
}

/// Both modes of a Redis topology: without and with `sync_replicas=1`.
fn redis_modes(topology: Topology, plain: &'static str, sync: &'static str) -> [Backend; 2] {
    [(plain, ""), (sync, "sync_replicas=1")].map(|(key, options)| Backend {
        descriptor: &distlock_redis::DESCRIPTOR,
        admin: Some(|url| Box::pin(distlock_redis::testing::redis_admin(url))),
        mode: Some(Mode {
            key,
            options,
            capabilities: distlock_redis::DESCRIPTOR.capabilities,
            topology: Some(topology),
        }),
    })
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// Every backend, in report order.
pub(crate) fn backends() -> Vec<Backend> {
    // Redis through Sentinel (a private master, 2 replicas and 3 sentinels: the
    // sentinel-failover rows) and on a private Redis Cluster (the cluster rows), each with and
    // without waiting for a replica.
    let [sentinel, sentinel_sync] =
        redis_modes(Topology::Sentinel, "redis-sentinel", "redis-sentinel-sync");
    let [cluster, cluster_sync] =
        redis_modes(Topology::Cluster, "redis-cluster", "redis-cluster-sync");
    vec![
        Backend {
            descriptor: &distlock_redis::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_redis::testing::redis_admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_redis::REDLOCK_DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_redis::testing::redlock_admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_mysql::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_mysql::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_postgres::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_postgres::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_postgres::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_postgres::testing::admin(url))),
            // The session bound is the campaign's session lease (see `ttl`).
            mode: Some(Mode {
                key: "postgres-advisory",
                options: "mode=advisory&session_timeout=2s",
                capabilities: distlock_postgres::ADVISORY_CAPABILITIES,
                topology: None,
            }),
        },
        sentinel,
        sentinel_sync,
        cluster,
        cluster_sync,
        Backend {
            descriptor: &distlock_mongo::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_mongo::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_zk::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_zk::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_etcd::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_etcd::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_api::MEMORY,
            admin: None,
            mode: None,
        },
    ]
}

impl Backend {
    /// Its key on the command line and in the report: the descriptor's id, or the mode's.
    pub(crate) fn key(&self) -> &'static str {
        self.mode.map_or(self.descriptor.id, |m| m.key)
    }

    /// Which server it talks to: the descriptor's id (a mode's server is its backend's).
    pub(crate) fn server_key(&self) -> &'static str {
        self.descriptor.id
    }

    /// What it promises.
    pub(crate) fn capabilities(&self) -> Capabilities {
        self.mode
            .map_or(self.descriptor.capabilities, |m| m.capabilities)
    }

    /// Whether each grant has its own lease (else it lives as long as the session or lease).
    pub(crate) fn per_lock(&self) -> bool {
        self.capabilities().ttl.kind == LeaseKind::PerLock
    }

    /// The private topology it runs on, if it has one.
    pub(crate) fn topology(&self) -> Option<Topology> {
        self.mode.and_then(|m| m.topology)
    }

    /// The shared server's URL (the descriptor's test URL).
    pub(crate) fn shared_url(&self) -> String {
        self.descriptor.test_url()
    }

    /// The lease the campaign's locks get: short, so that runs are short. Session backends
    /// take theirs from the URL; etcd's leases count in whole seconds and ZooKeeper's session
    /// must outlast a few of the shared server's 200 ms ticks, so both get 2 s. Through
    /// Sentinel and on a Redis Cluster, 3 s: longer than a failover (Sentinel: the 0.5 s
    /// down-after period, then the election and the promotion; Cluster: the 1 s node timeout,
    /// the failure reports' spread and the replica's election delay), so that a grant a
    /// promoted replica missed is still believed when the new primary hands the name out again
    /// (the hazard `sync_replicas` closes).
    pub(crate) fn ttl(&self) -> Duration {
        if self.topology().is_some() {
            Duration::from_millis(3000)
        } else if self.per_lock() {
            Duration::from_millis(1000)
        } else {
            Duration::from_millis(2000)
        }
    }

    /// `url` with the session settings the campaign needs (and the mode's options).
    pub(crate) fn with_session(&self, url: &str) -> String {
        let sep = if url.contains('?') { '&' } else { '?' };
        match (self.key(), self.mode) {
            ("zk", _) => format!("{url}{sep}session_timeout_ms={}", self.ttl().as_millis()),
            ("etcd", _) => format!("{url}{sep}lease_ttl_ms={}", self.ttl().as_millis()),
            (_, Some(mode)) if !mode.options.is_empty() => format!("{url}{sep}{}", mode.options),
            _ => url.to_string(),
        }
    }
}
