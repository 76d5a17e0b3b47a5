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

use std::sync::atomic::AtomicU64;
use std::sync::PoisonError;
use std::time::Duration;

use distlock_api::{Error, ErrorKind, Result};
use futures::stream::{FuturesUnordered, StreamExt};
use redis::Value;
use tokio::sync::watch;

use crate::endpoint::{Endpoint, Options};

mod events;
mod url;

pub(crate) use url::{parse_sentinel_url, SentinelSpec};

/// A client's view of one Sentinel-monitored master, shared by its command connection and its
/// release notices.
pub(crate) struct Sentinel {
    pub(crate) spec: SentinelSpec,
    connect_timeout: Duration,
    backend: &'static str,
    /// The sentinels and master, as errors name them.
    display: String,
    /// Bumped after every attempt to follow the master: a call that failed before an attempt
    /// finished leaves the following to that attempt.
    pub(crate) rounds: AtomicU64,
    /// One attempt at a time.
    pub(crate) following: tokio::sync::Mutex<()>,
    /// The address (`host:port`) of the master last found, by the command connection or the
    /// release notices' connection.
    pub(crate) master: watch::Sender<String>,
    /// The address the command connection goes to.
    pub(crate) conn_at: std::sync::Mutex<String>,
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

/// A node's address as `host:port`.
pub(crate) fn address(node: &Endpoint) -> String {
    node.client.get_connection_info().addr().to_string()
}

pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
