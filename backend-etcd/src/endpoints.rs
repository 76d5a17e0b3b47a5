//! Failing over between the configured endpoints.
//!
//! The driver's own multi-endpoint client balances every request over all endpoints, and an
//! endpoint it cannot connect to stays in the rotation (etcd-client issue #39): with one of two
//! members down, half the requests fail. So the client keeps one driver client per endpoint,
//! uses one endpoint at a time, as etcd's Go client does, and moves to the next when a request
//! cannot connect (retried at once there, since it was never sent) or gets no answer in time
//! (not retried: it may have been applied).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use distlock_api::{Error, ErrorKind, Result};
use etcd_client::{Client, ConnectOptions};
use tokio::sync::OnceCell;

use crate::error::driver_error;

pub(crate) struct Endpoints {
    urls: Vec<String>,
    options: ConnectOptions,
    /// Made on first use: with user authentication, making one is a round trip.
    clients: Vec<OnceCell<Client>>,
    active: AtomicUsize,
}

impl Endpoints {
    pub(crate) fn new(urls: Vec<String>, options: ConnectOptions) -> Self {
        let clients = urls.iter().map(|_| OnceCell::new()).collect();
        Self {
            urls,
            options,
            clients,
            active: AtomicUsize::new(0),
        }
    }

    /// One endpoint: the application's own client, already connected, named `label`.
    pub(crate) fn given(label: String, client: Client) -> Self {
        Self {
            urls: vec![label],
            options: ConnectOptions::new(),
            clients: vec![OnceCell::new_with(Some(client))],
            active: AtomicUsize::new(0),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.urls.len()
    }

    /// The index of the endpoint in use.
    pub(crate) fn index(&self) -> usize {
        self.active.load(Ordering::Relaxed) % self.urls.len()
    }

    /// The client of endpoint `i`.
    pub(crate) async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let client = self.clients[i]
            .get_or_try_init(|| Client::connect([&self.urls[i]], Some(self.options.clone())))
            .await?;
        Ok(client.clone())
    }

    /// Moves on from endpoint `i`, unless another request already did.
    pub(crate) fn failed(&self, i: usize) {
        let next = (i + 1) % self.urls.len();
        let _ = self
            .active
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }
}

impl Endpoints {
    /// Runs `op` on the endpoint in use, within `limit`. A request that could not connect is
    /// tried on each other endpoint in turn; one that failed or timed out once sent is not
    /// (it may have been applied), but the next request goes to the next endpoint.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, limit: Duration, mut op: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + limit;
        let mut others = self.len() - 1;
        loop {
            let i = self.index();
            let attempt = async {
                let client = self.client(i).await?;
                op(client).await
            };
            let e = match tokio::time::timeout_at(deadline.into(), attempt).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => e,
                Err(_) => {
                    self.failed(i);
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "{what}: no answer from etcd at {} within {limit:?}",
                            self.urls.join(",")
                        ),
                    ));
                }
            };
            if not_sent(&e) && others > 0 {
                self.failed(i);
                others -= 1;
                continue;
            }
            let e = driver_error(what, e);
            if e.kind() == ErrorKind::Unavailable {
                self.failed(i);
            }
            return Err(e);
        }
    }
}

/// Whether `e` says the request never left this process: it could not connect (refused,
/// unresolvable, connect timeout), so retrying it elsewhere cannot apply it twice.
pub(crate) fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            let m = s.message();
            [
                "connect error",
                "dns error",
                "open error",
                "Timeout expired",
            ]
            .iter()
            .any(|what| m.contains(what))
        }
        _ => false,
    }
}
