//! The backends under test, by name: what `results.json` calls them and the report prints.

use distlock_api::BackendDescriptor;
use serde::{Deserialize, Serialize};

/// The backends, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) enum Kind {
    Memory,
    Redis,
    Redlock,
    Mysql,
    Postgres,
    PostgresAdvisory,
    Mongo,
    Zk,
    Etcd,
}

impl Kind {
    pub(crate) const ALL: [Kind; 9] = [
        Kind::Memory,
        Kind::Redis,
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
