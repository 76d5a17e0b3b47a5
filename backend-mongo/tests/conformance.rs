//! The shared conformance suite against a MongoDB server (`DISTLOCK_MONGO_URL`, default
//! `mongodb://127.0.0.1:27017`).

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::async_trait;
use distlock_api::{Capabilities, DistributedLock, Error, LockName, Result};
use distlock_mongo::mongodb::bson::{doc, Bson, Document};
use distlock_mongo::{fields, mongodb, MongoConfig, MongoLock};
use futures::TryStreamExt;

struct Mongo {
    url: String,
}

impl Mongo {
    fn from_env() -> Self {
        Self {
            url: distlock_mongo::DESCRIPTOR.test_url(),
        }
    }

    /// A plain driver handle on the lock collection, separate from every lock client: what an
    /// operator (or a failing server) would use behind the clients' backs.
    async fn raw(&self) -> Result<mongodb::Collection<Document>> {
        let config = MongoConfig::from_url(&self.url)?;
        let client = mongodb::Client::with_uri_str(&self.url)
            .await
            .map_err(|e| Error::unavailable("raw client", e))?;
        Ok(client
            .database(config.get_database())
            .collection(config.get_collection()))
    }
}

#[async_trait]
impl distlock_conformance::Harness for Mongo {
    fn backend(&self) -> &'static str {
        "mongo"
    }

    fn capabilities(&self) -> Capabilities {
        distlock_mongo::CAPABILITIES
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        self.client_at(&self.url).await
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn client_at(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let config = MongoConfig::from_url(url)?.default_ttl(self.short_ttl());
        Ok(Arc::new(MongoLock::connect(config).await?))
    }

    async fn client_via(&self, addrs: &[String]) -> Result<Arc<dyn DistributedLock>> {
        let mut url = distlock_conformance::reroute(&self.url, &self.upstreams(), addrs);
        // Without it the driver learns the server's own address from its handshake and
        // connects there, around the proxy.
        if addrs.len() == 1 && !url.contains("directConnection") {
            let sep = match (
                url.contains('?'),
                url.split_once("://").is_some_and(|(_, r)| r.contains('/')),
            ) {
                (true, _) => "&",
                (false, true) => "?",
                (false, false) => "/?",
            };
            url = format!("{url}{sep}directConnection=true");
        }
        self.client_at(&url).await
    }

    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>> {
        let connect = async {
            let config = MongoConfig::from_url("mongodb://127.0.0.1:1")?
                .connect_timeout(self.connect_timeout());
            let lock: Arc<dyn DistributedLock> = Arc::new(MongoLock::connect(config).await?);
            Ok(lock)
        };
        Some(connect.await)
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn remove_behind_back(&self, name: &LockName) -> Result<()> {
        // Clears the holder the way an operator would, keeping the fencing counter: deleting
        // the document would also restart the counter, which the backend's docs forbid.
        self.raw()
            .await?
            .update_one(
                doc! { "_id": name.as_str() },
                doc! { "$set": { fields::OWNER: Bson::Null, fields::COUNT: 0_i64, fields::EXPIRES_AT: Bson::Null } },
            )
            .await
            .map_err(|e| Error::unavailable("remove behind back", e))?;
        Ok(())
    }

    fn short_ttl(&self) -> Duration {
        // A lock operation takes 2-40 ms on a loaded 2-core machine running several suites at
        // once; a case that holds 100 locks renews 100 leases per TTL/3 through one pool of 10
        // connections, so a lease of a few hundred ms can run out before its renewal is sent.
        // The test server renews about 160 a second when idle; 2 s leases (150 a second for
        // 100 locks) lost one once under a full CI run, so 3 s (100 a second).
        Duration::from_secs(3)
    }

    fn wake_bound(&self) -> Duration {
        // A poller sleeps at most the backoff cap between attempts; the rest is round trips
        // on a machine shared with other test processes.
        distlock_mongo::POLL_CAP + Duration::from_millis(400)
    }

    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        // Any document of this run that still names an owner, live or expired: a release
        // clears the owner, and so does the release of a guard that outlived its lease.
        let docs: Vec<Document> = self
            .raw()
            .await?
            .find(doc! {
                "_id": { "$regex": common::prefix_regex(prefix) },
                fields::OWNER: { "$ne": Bson::Null },
            })
            .await
            .map_err(|e| Error::unavailable("leftovers", e))?
            .try_collect()
            .await
            .map_err(|e| Error::unavailable("leftovers", e))?;
        Ok(docs.iter().map(|d| format!("{d}")).collect())
    }
}

fn main() -> ExitCode {
    distlock_conformance::run(Mongo::from_env())
}
