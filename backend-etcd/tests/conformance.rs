//! The etcd backend against the whole conformance suite, on the server `DISTLOCK_ETCD_URL`
//! names (default `etcd://127.0.0.1:2379`).

mod common;

use std::process::ExitCode;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use distlock_etcd::etcd_client::{GetOptions, SortOrder, SortTarget};
use distlock_etcd::{
    Capabilities, DistributedLock, Error, ErrorKind, EtcdConfig, EtcdLock, LockName, Result,
    CAPABILITIES,
};

struct Etcd {
    /// The lease of every client made, to check that a dropped client revoked it.
    clients: Mutex<Vec<(i64, Weak<EtcdLock>)>>,
}

impl Etcd {
    fn from_env() -> Self {
        Self {
            clients: Mutex::new(Vec::new()),
        }
    }

    fn raw_error(e: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::new(ErrorKind::Unavailable, "raw etcd client").with_source(e)
    }
}

#[async_trait]
impl distlock_conformance::Harness for Etcd {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn start_hint(&self) -> &'static str {
        "run `scripts/services up` (or `docker compose up -d etcd`), or point DISTLOCK_ETCD_URL at an etcd"
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        let client = Arc::new(EtcdLock::connect(common::config()).await?);
        if let Some(id) = client.lease_id() {
            let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            clients.push((id, Arc::downgrade(&client)));
        }
        Ok(client)
    }

    fn url(&self) -> Option<String> {
        Some(common::url())
    }

    async fn client_at(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let config = EtcdConfig::from_url(url)?.default_ttl(common::SHORT_TTL);
        Ok(Arc::new(EtcdLock::connect(config).await?))
    }

    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>> {
        let config = EtcdConfig::from_url("etcd://127.0.0.1:1")
            .map(|c| c.connect_timeout(self.connect_timeout()));
        Some(match config {
            Ok(config) => EtcdLock::connect(config)
                .await
                .map(|c| Arc::new(c) as Arc<dyn DistributedLock>),
            Err(e) => Err(e),
        })
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn remove_behind_back(&self, name: &LockName) -> Result<()> {
        let raw = common::raw().await;
        let dir = common::config().lock_dir(name);
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = raw
            .kv_client()
            .get(dir, Some(options))
            .await
            .map_err(Self::raw_error)?;
        if let Some(holder) = resp.kvs().first() {
            raw.kv_client()
                .delete(holder.key(), None)
                .await
                .map_err(Self::raw_error)?;
        }
        Ok(())
    }

    fn short_ttl(&self) -> Duration {
        common::SHORT_TTL
    }

    fn wake_bound(&self) -> Duration {
        Duration::from_millis(250)
    }

    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        // Every entry of the lock but the oldest (the holder's) is a waiter's.
        let raw = common::raw().await;
        let entries = common::entries_of(&raw, name).await;
        Ok(Some(entries.len().saturating_sub(1)))
    }

    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let raw = common::raw().await;
        let mut left = common::keys_under(&raw, prefix).await;
        // Leases of dropped clients: each client revokes its lease when dropped.
        let dead: Vec<i64> = {
            let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            clients
                .iter()
                .filter(|(_, c)| c.strong_count() == 0)
                .map(|(id, _)| *id)
                .collect()
        };
        for id in dead {
            if common::lease_alive(&raw, id).await {
                left.push(format!("lease {id:x} of a dropped client"));
            } else {
                let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
                clients.retain(|(c, _)| *c != id);
            }
        }
        Ok(left)
    }
}

fn main() -> ExitCode {
    distlock_conformance::run(Etcd::from_env())
}
