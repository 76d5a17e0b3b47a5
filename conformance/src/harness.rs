//! What a backend provides to run the suite.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, DistributedLock, Error, ErrorKind, LockName, Result};

use crate::proxy::{hosts_of, reroute};

/// A backend under test. Creating the harness does no I/O (the runner lists the cases and gates
/// them by [`capabilities`](Harness::capabilities) before any server is touched); every case
/// then builds the clients it needs with [`client`](Harness::client).
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The backend's name, as `DISTLOCK_SKIP` names it (`memory`, `redis`, `redlock`, `mysql`,
    /// `mongo`, `zk`, `etcd`).
    fn backend(&self) -> &'static str;

    /// The backend's capabilities, known without I/O. Cases that do not apply are reported as
    /// ignored, with the reason printed.
    fn capabilities(&self) -> Capabilities;

    /// How to start the backend's server, printed when it cannot be reached.
    fn start_hint(&self) -> &'static str {
        "run `scripts/services up`"
    }

    /// A new client handle (own connection, own random owner id, own watchdog) with its default
    /// watchdog TTL set to [`short_ttl`](Harness::short_ttl) where the backend allows, so
    /// renewal cases run in seconds.
    async fn client(&self) -> Result<Arc<dyn DistributedLock>>;

    /// A client configured for a server that is not there (a closed loopback port) with a short
    /// connect timeout; `None` for backends without a server. Building it may itself fail with
    /// `Unavailable`: the suite accepts either place.
    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>>;

    /// The URL the suite's clients connect to, where one URL makes a client; `None` for
    /// backends without a server. With it and [`client_at`](Harness::client_at), the partition
    /// cases need nothing more: [`upstreams`](Harness::upstreams) and
    /// [`client_via`](Harness::client_via) are derived from them.
    fn url(&self) -> Option<String> {
        None
    }

    /// A client like [`client`](Harness::client), of the server(s) at `url` instead.
    async fn client_at(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let _ = url;
        Err(Error::new(
            ErrorKind::Unsupported,
            "this harness cannot make a client of another URL",
        ))
    }

    /// The addresses (`host:port`) of the servers this backend's clients connect to, in the
    /// order [`client_via`](Harness::client_via) takes their stand-ins: by default, those
    /// [`url`](Harness::url) names. Empty for backends without a server.
    fn upstreams(&self) -> Vec<String> {
        self.url().map(|url| hosts_of(&url)).unwrap_or_default()
    }

    /// A client like [`client`](Harness::client) whose connections go to `addrs` instead of
    /// [`upstreams`](Harness::upstreams), one stand-in per server, in the same order: the
    /// partition cases put a [`Proxy`](crate::Proxy) there. By default,
    /// [`client_at`](Harness::client_at) of [`url`](Harness::url) with the servers replaced.
    async fn client_via(&self, addrs: &[String]) -> Result<Arc<dyn DistributedLock>> {
        let Some(url) = self.url() else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "this harness names no URL to route through another address",
            ));
        };
        self.client_at(&reroute(&url, &self.upstreams(), addrs))
            .await
    }

    /// Why the case `case` (its name in [`CASES`](crate::cases::CASES)) does not apply to this
    /// harness beyond what the capabilities say, or `None`: the runner reports such a case as
    /// ignored with the reason, as for a capability the backend lacks. Known without I/O.
    fn not_applicable(&self, case: &str) -> Option<&'static str> {
        let _ = case;
        None
    }

    /// The connect timeout `unreachable_client` is configured with.
    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// Removes `name`'s current holder behind its back, the way an operator, a failover or a
    /// server restart would (delete the key/row/document/node). The holder's guard must then
    /// report lost at its next renewal.
    async fn remove_behind_back(&self, name: &LockName) -> Result<()>;

    /// A short lease this backend honours, for expiry and renewal cases (a few hundred ms where
    /// the server allows; etcd's and ZooKeeper's minimums are longer).
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(400)
    }

    /// How long after a release a waiter on this backend must have acquired: a few round trips
    /// for notify backends, the backoff cap plus round trips for polling ones. A correctness
    /// bound (woken by the release, not by the holder's long lease), generous on purpose.
    fn wake_bound(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// How many waiters the server has queued for `name`: contender nodes/keys other than the
    /// holder's (ZooKeeper, etcd), subscribers of its release channel (Redis), queue entries
    /// (memory). `None` where the backend keeps no waiter state on the server (polling ones).
    /// Lets the cancellation cases prove a dropped acquire left no queue entry behind.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        let _ = name;
        Ok(None)
    }

    /// Checks after the suite's cases ran that the backend left nothing behind for the
    /// suite's names (no lock keys, rows, nodes, waiters); `prefix` is the unique prefix every
    /// name of this run starts with. Default: nothing to check.
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let _ = prefix;
        Ok(Vec::new())
    }
}
