//! Redis Sentinel: the `redis+sentinel://` URL, finding the master through the sentinels, and
//! following it to another node after a failover.
//!
//! At connect, every sentinel is asked at once (`SENTINEL get-master-addr-by-name`, each
//! bounded by the connect timeout) and the first address named whose node says it is a master
//! (`ROLE`) is used. The command connection is one server's, as for `redis://`; when a script
//! fails the way a lost or demoted master makes it fail (connection refused, dropped or timed
//! out, `READONLY`, `MASTERDOWN`), the client asks the sentinels again and puts a connection
//! to the master they name in place of the old one before the failing call returns
//! `Unavailable`, so the next call reaches the new master. Scripts missing there are loaded by
//! the driver on `NOSCRIPT`. The release notices' connection follows too: it is opened on the
//! master the sentinels name, and dropped (its waiters woken, its channels subscribed again on
//! the new master) when the command connection moves to another node. A listener of the
//! sentinels' `+switch-master` (`events.rs`) moves both as soon as a failover is announced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use distlock_api::{Error, ErrorKind, Result};
use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManager;
use redis::Value;
use tokio::sync::watch;

use crate::endpoint::{Endpoint, Options};
use crate::ops::{Conn, Server};

mod events;
mod url;

pub(crate) use url::{parse_sentinel_url, SentinelSpec};

/// A client's view of one Sentinel-monitored master, shared by its command connection and its
/// release notices.
pub(crate) struct Sentinel {
    spec: SentinelSpec,
    connect_timeout: Duration,
    backend: &'static str,
    /// The sentinels and master, as errors name them.
    display: String,
    /// Bumped after every attempt to follow the master: a call that failed before an attempt
    /// finished leaves the following to that attempt.
    rounds: AtomicU64,
    /// One attempt at a time.
    following: tokio::sync::Mutex<()>,
    /// The address (`host:port`) of the master last found, by the command connection or the
    /// release notices' connection.
    master: watch::Sender<String>,
    /// The address the command connection goes to.
    conn_at: std::sync::Mutex<String>,
}

impl Sentinel {
    pub(crate) fn new(
        spec: SentinelSpec,
        endpoint: &Endpoint,
        options: &Options,
        backend: &'static str,
    ) -> Self {
        Self {
            spec,
            connect_timeout: options.client.connect_timeout,
            backend,
            display: endpoint.display.clone(),
            rounds: AtomicU64::new(0),
            following: tokio::sync::Mutex::new(()),
            master: watch::channel(String::new()).0,
            conn_at: std::sync::Mutex::new(String::new()),
        }
    }

    /// The master's address as last found, to watch for moves.
    pub(crate) fn master_moves(&self) -> watch::Receiver<String> {
        self.master.subscribe()
    }

    /// Records `master` as the master found last (telling the watchers if it moved).
    pub(crate) fn moved_to(&self, master: &Endpoint) {
        let addr = address(master);
        self.master.send_if_modified(|a| {
            let changed = *a != addr;
            if changed {
                *a = addr;
            }
            changed
        });
    }

    /// Asks every sentinel at once for the master's address and returns the first one named
    /// whose node says it is a master. Each sentinel's answer and each node's check is bounded
    /// by the connect timeout. `Unavailable` when none of them leads to a master;
    /// `InvalidArgument` when every sentinel answered and none knows the master's name.
    pub(crate) async fn find_master(&self) -> Result<Endpoint> {
        let mut asks: FuturesUnordered<_> = self
            .spec
            .sentinels
            .iter()
            .map(|s| async move { (s, self.ask(s).await) })
            .collect();
        let mut tried: Vec<(String, u16)> = Vec::new();
        let mut why = Vec::new();
        let mut unknown = 0;
        while let Some((sentinel, answer)) = asks.next().await {
            match answer {
                Ok(Some(addr)) if !tried.contains(&addr) => {
                    match self.check(&addr.0, addr.1).await {
                        Ok(master) => return Ok(master),
                        Err(e) => why.push(format!("{}:{} {e}", addr.0, addr.1)),
                    }
                    tried.push(addr);
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    unknown += 1;
                    why.push(format!(
                        "sentinel {} knows no master {:?}",
                        sentinel.display, self.spec.master
                    ));
                }
                Err(e) => why.push(format!("sentinel {} {e}", sentinel.display)),
            }
        }
        let kind = if unknown == self.spec.sentinels.len() {
            ErrorKind::InvalidArgument
        } else {
            ErrorKind::Unavailable
        };
        Err(Error::new(
            kind,
            format!("{}: no master found ({})", self.display, why.join("; ")),
        )
        .with_backend(self.backend))
    }

    fn conn_config(&self) -> redis::AsyncConnectionConfig {
        redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.connect_timeout))
    }

    /// One sentinel's answer: the master's address, or `None` if it does not know the name.
    async fn ask(&self, sentinel: &Endpoint) -> std::result::Result<Option<(String, u16)>, String> {
        let asking = async {
            let mut conn = sentinel
                .client
                .get_multiplexed_async_connection_with_config(&self.conn_config())
                .await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.spec.master)
                .query_async::<Option<(String, String)>>(&mut conn)
                .await
        };
        match tokio::time::timeout(self.connect_timeout, asking).await {
            Ok(Ok(Some((host, port)))) => match port.parse() {
                Ok(port) => Ok(Some((host, port))),
                Err(_) => Err(format!("named port {port:?}")),
            },
            Ok(Ok(None)) => Ok(None),
            Ok(Err(e)) => Err(format!("failed: {e}")),
            Err(_) => Err(format!("did not answer within {:?}", self.connect_timeout)),
        }
    }

    /// The node at `host:port`, if it answers `ROLE` as a master.
    async fn check(&self, host: &str, port: u16) -> std::result::Result<Endpoint, String> {
        let node = self
            .spec
            .node
            .at(host, port)
            .map_err(|e| format!("cannot be reached: {e}"))?;
        let checking = async {
            let mut conn = node
                .client
                .get_multiplexed_async_connection_with_config(&self.conn_config())
                .await?;
            redis::cmd("ROLE").query_async::<Value>(&mut conn).await
        };
        let role = match tokio::time::timeout(self.connect_timeout, checking).await {
            Ok(Ok(Value::Array(items))) => items
                .into_iter()
                .next()
                .and_then(|v| redis::from_redis_value::<String>(v).ok()),
            Ok(Ok(_)) => None,
            Ok(Err(e)) => return Err(format!("failed: {e}")),
            Err(_) => return Err(format!("did not answer within {:?}", self.connect_timeout)),
        };
        match role.as_deref() {
            Some("master") => Ok(node),
            Some(other) => Err(format!("is a {other}, not the master")),
            None => Err("gave an unexpected answer to ROLE".to_string()),
        }
    }
}

/// Whether a script's failure is one a lost or demoted master causes: worth asking the
/// sentinels where the master is now.
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

/// A node's address as `host:port`.
fn address(node: &Endpoint) -> String {
    node.client.get_connection_info().addr().to_string()
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
