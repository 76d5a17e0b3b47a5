//! Following a Sentinel-monitored master from the command connection: connecting through the
//! sentinels, moving to the master the release notices found, and asking the sentinels again
//! when a call fails as a moved master fails it. Beside `ops.rs` as `cluster.rs` is: it adds to
//! [`Server`], which only names [`Sentinel`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use distlock_api::Result;
use redis::aio::ConnectionManager;

use crate::conn::Conn;
use crate::endpoint::{Endpoint, Options};
use crate::ops::Server;
use crate::sentinel::{address, lock, Sentinel};

fn master_may_have_moved(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(e.kind(), K::Server(S::ReadOnly | S::MasterDown))
}

impl Server {
    /// Finds the master through the sentinels, connects to it (bounded by the connect timeout)
    /// and loads the scripts there.
    pub(crate) async fn connect_sentinel(
        sentinel: Arc<Sentinel>,
        endpoint: &Endpoint,
        options: &Options,
        backend: &'static str,
    ) -> Result<Self> {
        let master = sentinel.find_master().await?;
        let mut server = Self::connect(&master, options, backend).await?;
        *lock(&sentinel.conn_at) = address(&master);
        sentinel.moved_to(&master);
        server.endpoint = endpoint.clone();
        server.sentinel = Some(sentinel);
        Ok(server)
    }

    /// With Sentinel, before a call: if the master was found elsewhere since the command
    /// connection was made (by the release notices' connection), moves the command connection
    /// there (no request is sent). Returns how many attempts to follow the master had finished,
    /// for [`follow_master`](Self::follow_master) if the call fails.
    pub(crate) fn sync_master(&self) -> u64 {
        let Some(sentinel) = &self.sentinel else {
            return 0;
        };
        let master = sentinel.master.borrow().clone();
        if !master.is_empty() && *lock(&sentinel.conn_at) != master {
            let node = master
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse().ok()?)))
                .and_then(|(host, port)| sentinel.spec.node.at(host, port).ok());
            if let Some(node) = node {
                self.connect_lazily(sentinel, &node);
            }
        }
        sentinel.rounds.load(Ordering::Acquire)
    }

    fn connect_lazily(&self, sentinel: &Sentinel, master: &Endpoint) -> bool {
        let Ok(fresh) =
            ConnectionManager::new_lazy_with_config(master.client.clone(), self.manager.clone())
        else {
            return false;
        };
        let mut conn = self.conn.write().unwrap_or_else(PoisonError::into_inner);
        *conn = Conn::Single(fresh);
        *lock(&sentinel.conn_at) = address(master);
        true
    }

    /// After a call failed with `e`: if the master may have moved, and no attempt to follow it
    /// finished since the call began (`seen`), asks the sentinels where the master is and
    /// puts a fresh connection to it (made on first use) in place of the current one. True if
    /// the call can be sent again: the connection moved to another node, and the failure
    /// shows the call never ran (refused, or `READONLY` from a demoted master).
    pub(crate) async fn follow_master(&self, e: &redis::RedisError, seen: u64) -> bool {
        let Some(sentinel) = &self.sentinel else {
            return false;
        };
        if !master_may_have_moved(e) {
            return false;
        }
        let before = lock(&sentinel.conn_at).clone();
        {
            let _one = sentinel.following.lock().await;
            if sentinel.rounds.load(Ordering::Acquire) == seen {
                if let Ok(master) = sentinel.find_master().await {
                    if self.connect_lazily(sentinel, &master) {
                        sentinel.moved_to(&master);
                    }
                }
                sentinel.rounds.fetch_add(1, Ordering::AcqRel);
            }
        }
        let never_ran = e.is_connection_refusal()
            || matches!(
                e.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
            );
        never_ran && *lock(&sentinel.conn_at) != before
    }
}
