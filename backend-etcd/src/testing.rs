//! The test-only admin of the etcd backend (feature `testing`): requests on the client's own
//! connection, in its key layout; and clients whose leases it follows, to check that a dropped
//! client revoked its lease.

use std::sync::{Arc, Mutex, Weak};

use distlock_api::backend::async_trait;
use distlock_api::backend::testing::Admin;
use distlock_api::{DistributedLock, LockName, Result};
use etcd_client::{Client, GetOptions, SortOrder, SortTarget};

use crate::keys;
use crate::{EtcdConfig, EtcdLock};

/// The clients made by [`connect_tracked`], by lease id.
static TRACKED: Mutex<Vec<(i64, Weak<EtcdLock>)>> = Mutex::new(Vec::new());

fn tracked() -> std::sync::MutexGuard<'static, Vec<(i64, Weak<EtcdLock>)>> {
    TRACKED.lock().unwrap_or_else(|p| p.into_inner())
}

/// What [`connect_tracked`] returns.
pub type Connecting =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Arc<dyn DistributedLock>>> + Send>>;

/// Connects like [`EtcdLock::connect`] and follows the client's lease: once the client is
/// dropped, [`Admin::leftovers`] reports the lease while the server still has it.
pub fn connect_tracked(url: String) -> Connecting {
    Box::pin(async move {
        let client = Arc::new(EtcdLock::connect(EtcdConfig::from_url(&url)?).await?);
        if let Some(id) = client.lease_id() {
            tracked().push((id, Arc::downgrade(&client)));
        }
        Ok(client as Arc<dyn DistributedLock>)
    })
}

impl EtcdLock {
    async fn keys_with_prefix(&self, prefix: String, oldest: bool) -> Result<Vec<Vec<u8>>> {
        let mut options = GetOptions::new().with_prefix().with_keys_only();
        if oldest {
            options = options
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1);
        }
        let get = |c: Client| {
            let (prefix, options) = (prefix.clone(), options.clone());
            async move { c.kv_client().get(prefix, Some(options)).await }
        };
        let resp = self.shared().call("listing keys", get).await?;
        Ok(resp.kvs().iter().map(|kv| kv.key().to_vec()).collect())
    }

    fn dir(&self, name: &str) -> String {
        keys::lock_dir(&self.shared().config.key_prefix, name)
    }

    async fn lease_alive(&self, id: i64) -> Result<bool> {
        let ask = |c: Client| async move { c.lease_client().time_to_live(id, None).await };
        Ok(self.shared().call("asking for a lease", ask).await?.ttl() > 0)
    }
}

#[async_trait]
impl Admin for EtcdLock {
    /// Deletes the oldest entry of the lock: the holder's.
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        let holder = self.keys_with_prefix(self.dir(name.as_str()), true).await?;
        if let Some(key) = holder.into_iter().next() {
            let delete = |c: Client| {
                let key = key.clone();
                async move { c.kv_client().delete(key, None).await }
            };
            self.shared()
                .call("deleting the holder's key", delete)
                .await?;
        }
        Ok(())
    }

    /// Every entry of the lock but the oldest (the holder's) is a waiter's; of a semaphore of
    /// `max`, every entry but the `max` oldest.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        let dir = self.dir(name.as_str());
        let entries = self.keys_with_prefix(dir.clone(), false).await?;
        let max = entries
            .first()
            .and_then(|k| keys::parse_entry(&dir, k))
            .map_or(1, |e| e.max as usize);
        Ok(Some(entries.len().saturating_sub(max)))
    }

    /// Keys of names starting with `prefix`, and the leases of dropped tracked clients that
    /// the server still has (a client revokes its lease when dropped).
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let dir = self.dir(prefix);
        // The directory of the name itself ends in "/"; without it, it covers every name that
        // starts with the prefix.
        let range = dir.strip_suffix('/').unwrap_or(&dir).to_string();
        let mut left: Vec<String> = self
            .keys_with_prefix(range, false)
            .await?
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        let dead: Vec<i64> = tracked()
            .iter()
            .filter(|(_, c)| c.strong_count() == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            if self.lease_alive(id).await? {
                left.push(format!("lease {id:x} of a dropped client"));
            } else {
                tracked().retain(|(c, _)| *c != id);
            }
        }
        Ok(left)
    }
}

/// The admin of the cluster at `url` (an [`EtcdLock`] client of it, not tracked).
pub async fn admin(url: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(
        EtcdLock::connect(EtcdConfig::from_url(&url)?).await?,
    ))
}
