//! MongoDB. The floor is the least a document lock needs per cycle: one `findAndModify` upsert
//! that creates the lock document only if it is absent (and returns it, so the client knows it
//! won), and a `delete` conditional on the owner — on the backend's own collection handle, so
//! the connection pool and the read and write concerns (majority, journaled) are the same.
//!
//! Each run keeps its locks in a database of its own, dropped at the end. The backend keeps one
//! document per lock name for good (it holds the name's fencing counter), and on the
//! MongoDB-compatible server `scripts/services` installs, acquire and release slow down as that
//! collection grows: documents left by earlier runs and tests would skew this run's numbers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::{OwnerId, SharedLock};
use distlock_mongo::mongodb::bson::{doc, DateTime, Document};
use distlock_mongo::mongodb::options::ReturnDocument;
use distlock_mongo::mongodb::Collection;
use distlock_mongo::{MongoConfig, MongoLock};

use super::{Floor, FloorOps, Kind, Target};
use crate::error::Res;
use crate::run::targets::run_id;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The floor's lease: long enough that nothing expires mid-cycle.
const FLOOR_TTL_MS: i64 = 30_000;

pub(crate) struct MongoTarget {
    config: MongoConfig,
    url: String,
    version: String,
}

impl MongoTarget {
    pub(crate) async fn open(url: &str) -> Res<Self> {
        let config = MongoConfig::from_url(url)?.connect_timeout(CONNECT_TIMEOUT);
        let database = format!("{}_bench_{}", config.get_database(), run_id());
        let config = config.database(&database);
        let lock = MongoLock::connect(config.clone()).await?;
        Ok(Self {
            version: lock.server().version.clone(),
            url: format!("{url} (database {database}, dropped after the run)"),
            config,
        })
    }
}

#[async_trait]
impl Target for MongoTarget {
    fn kind(&self) -> Kind {
        Kind::Mongo
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn server_version(&self) -> Res<String> {
        Ok(format!("MongoDB wire protocol, version {}", self.version))
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(MongoLock::connect(self.config.clone()).await?))
    }

    async fn client_ttl(&self, ttl: std::time::Duration) -> Res<SharedLock> {
        Ok(Arc::new(
            MongoLock::connect(self.config.clone().default_ttl(ttl)).await?,
        ))
    }

    /// The sum of `serverStatus`' opcounters (every operation and command received), less the
    /// `serverStatus` asking; `None` where the server does not keep them.
    async fn server_requests(&self) -> Res<Option<u64>> {
        let lock = MongoLock::connect(self.config.clone()).await?;
        let admin = lock.collection().client().database("admin");
        let Ok(status) = admin.run_command(doc! { "serverStatus": 1 }).await else {
            return Ok(None);
        };
        let Ok(counters) = status.get_document("opcounters") else {
            return Ok(None);
        };
        let total: i64 = counters
            .values()
            .filter_map(|v| match v {
                distlock_mongo::mongodb::bson::Bson::Int32(n) => Some(i64::from(*n)),
                distlock_mongo::mongodb::bson::Bson::Int64(n) => Some(*n),
                _ => None,
            })
            .sum();
        Ok(Some(u64::try_from(total)?.saturating_sub(1)))
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        let lock = MongoLock::connect(self.config.clone()).await?;
        Ok(Box::new(MongoFloor {
            locks: lock.collection().clone(),
            _lock: lock,
            owner: OwnerId::random().to_string(),
        }))
    }

    async fn cleanup(&self) -> Res<()> {
        let lock = MongoLock::connect(self.config.clone()).await?;
        lock.collection().drop().await?;
        Ok(())
    }

    fn floor_ops(&self) -> FloorOps {
        FloorOps {
            what: "`findAndModify` upsert that creates the lock document if absent + \
                   `delete` conditional on the owner (the backend's collection and concerns)",
            round_trips: 2,
        }
    }
}

struct MongoFloor {
    locks: Collection<Document>,
    /// Keeps the client (and its pool) the collection handle belongs to.
    _lock: MongoLock,
    owner: String,
}

#[async_trait]
impl Floor for MongoFloor {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        let expires = DateTime::from_millis(DateTime::now().timestamp_millis() + FLOOR_TTL_MS);
        let doc = self
            .locks
            .find_one_and_update(
                doc! { "_id": name },
                doc! { "$setOnInsert": { "owner": &self.owner, "expires_at": expires } },
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await?
            .ok_or("floor: the upsert returned no document")?;
        if doc.get_str("owner").ok() != Some(self.owner.as_str()) {
            return Err("floor: the lock document belongs to someone else".into());
        }
        let release = Instant::now();
        let deleted = self
            .locks
            .delete_one(doc! { "_id": name, "owner": &self.owner })
            .await?;
        if deleted.deleted_count != 1 {
            return Err("floor: the delete did not remove the lock document".into());
        }
        Ok(release.elapsed())
    }
}
