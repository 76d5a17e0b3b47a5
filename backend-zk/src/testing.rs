//! The test-only admin of the ZooKeeper backend (feature `testing`): requests in the client's
//! own session, under its base path.

use std::sync::Arc;

use distlock_api::backend::async_trait;
use distlock_api::backend::testing::Admin;
use distlock_api::{Error, ErrorKind, LockName, Result};
use zookeeper_client as zk;

use crate::path;
use crate::{ZkConfig, ZkLock};

fn failed(what: &str, e: zk::Error) -> Error {
    Error::new(ErrorKind::Backend, what.to_string()).with_source(e)
}

#[async_trait]
impl Admin for ZkLock {
    /// Deletes the holder's queue node: the one with the lowest sequence number.
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        let client = self.client();
        let dir = self.lock_path(name.as_str())?;
        let gone = || Error::invalid(format!("{name} has no holder to remove"));
        let children = match client.list_children(&dir).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Err(gone()),
            Err(e) => return Err(failed("listing the queue", e)),
        };
        let holder = path::queue(children).into_iter().next().ok_or_else(gone)?;
        // Released (or its session ended) between the look and the delete: nothing to remove,
        // as when the queue was empty.
        match client.delete(&path::join(&dir, &holder.name), None).await {
            Ok(()) => Ok(()),
            Err(zk::Error::NoNode) => Err(gone()),
            Err(e) => Err(failed("deleting the holder's node", e)),
        }
    }

    /// Every queue node but the lowest (the holder's) is a waiter.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        let dir = self.lock_path(name.as_str())?;
        match self.client().list_children(&dir).await {
            Ok(queue) => Ok(Some(queue.len().saturating_sub(1))),
            Err(zk::Error::NoNode) => Ok(Some(0)),
            Err(e) => Err(failed("listing the queue", e)),
        }
    }

    /// Lock nodes of names starting with `prefix` that are still there, with their queues.
    /// (The name encoding goes character by character, so those names' segments start with
    /// the prefix's.)
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let client = self.client();
        let base = self.base_path();
        let children = match client.list_children(base).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(failed("listing the base path", e)),
        };
        let mark = path::encode_name(prefix);
        let mut left = Vec::new();
        for segment in children.into_iter().filter(|c| c.starts_with(&mark)) {
            let name = path::decode_name(&segment).unwrap_or_else(|| segment.clone());
            match client.list_children(&path::join(base, &segment)).await {
                Ok(queue) if queue.is_empty() => left.push(format!("{name:?}: empty lock node")),
                Ok(queue) => left.push(format!("{name:?}: queue nodes {queue:?}")),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(failed("listing a queue", e)),
            }
        }
        Ok(left)
    }
}

/// The admin of the ensemble at `url` (a [`ZkLock`] client of it).
pub async fn admin(url: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(ZkLock::connect(ZkConfig::from_url(&url)?).await?))
}
