//! A [`Harness`] made of data: a backend's id, capabilities, test URL and connect function (its
//! descriptor) and its test-only [`Admin`], plus the few numbers the cases need. The suite's
//! clients are made from URLs, with the shared URL options every backend accepts
//! (`default_ttl_ms`, `connect_timeout_ms`), so a backend's harness is a few lines.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::testing::{Admin, AdminFn};
use distlock_api::{
    BackendDescriptor, Capabilities, ConnectFn, DistributedLock, Error, ErrorKind, LockName, Result,
};

use crate::harness::Harness;
use crate::proxy::reroute;

/// A backend under test, described by data.
pub struct Suite {
    id: &'static str,
    capabilities: Capabilities,
    url: String,
    connect: ConnectFn,
    admin: Option<AdminFn>,
    options: Vec<(String, String)>,
    proxied: Vec<(String, String)>,
    short_ttl: Duration,
    wake_bound: Duration,
    connect_timeout: Duration,
    unreachable_url: Option<String>,
    start_hint: &'static str,
    without_proxies: Option<&'static str>,
}

impl Suite {
    /// The backend `id` with `capabilities`, whose server is at `url` and whose clients
    /// `connect` makes. Its admin, the numbers and the URL that reaches no server have
    /// defaults below.
    pub fn new(
        id: &'static str,
        capabilities: Capabilities,
        url: impl Into<String>,
        connect: ConnectFn,
    ) -> Self {
        Self {
            id,
            capabilities,
            url: url.into(),
            connect,
            admin: None,
            options: Vec::new(),
            proxied: Vec::new(),
            short_ttl: Duration::from_millis(400),
            wake_bound: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            unreachable_url: None,
            start_hint: "run `scripts/services up`",
            without_proxies: None,
        }
    }

    /// The backend's test-only admin (behind its `testing` feature).
    pub fn admin(mut self, admin: AdminFn) -> Self {
        self.admin = Some(admin);
        self
    }

    /// Makes the suite's clients with `connect` instead.
    pub fn connect_with(mut self, connect: ConnectFn) -> Self {
        self.connect = connect;
        self
    }

    /// One more URL option for every client the suite makes (`sweep_interval_ms=250`).
    pub fn option(mut self, key: &str, value: &str) -> Self {
        self.options.push((key.to_string(), value.to_string()));
        self
    }

    /// One more URL option for clients whose connections go through the partition cases'
    /// proxies (MongoDB's `directConnection=true`, without which the driver learns the
    /// server's own address and connects around the proxy).
    pub fn option_through_proxy(mut self, key: &str, value: &str) -> Self {
        self.proxied.push((key.to_string(), value.to_string()));
        self
    }

    /// The short lease clients get as their default TTL ([`Harness::short_ttl`]).
    pub fn short_ttl(mut self, ttl: Duration) -> Self {
        self.short_ttl = ttl;
        self
    }

    /// [`Harness::wake_bound`].
    pub fn wake_bound(mut self, bound: Duration) -> Self {
        self.wake_bound = bound;
        self
    }

    /// A URL of this backend's scheme where no server listens (a closed loopback port), for
    /// the unreachable-server case; the suite adds `connect_timeout`.
    pub fn unreachable_at(mut self, url: &str) -> Self {
        self.unreachable_url = Some(url.to_string());
        self
    }

    /// Marks the cases that cut clients off through proxies
    /// ([`THROUGH_PROXIES`](crate::cases::THROUGH_PROXIES)) not applicable, for `reason`: the
    /// clients learn their servers' addresses from the servers they are given (say, Redis
    /// Sentinel naming the master) and would reach them around the proxies.
    pub fn without_proxies(mut self, reason: &'static str) -> Self {
        self.without_proxies = Some(reason);
        self
    }

    /// How to start the server, printed when it cannot be reached.
    pub fn start_hint(mut self, hint: &'static str) -> Self {
        self.start_hint = hint;
        self
    }

    /// The backend `descriptor` describes, on its test server.
    pub fn of(descriptor: &'static BackendDescriptor) -> Self {
        Self::new(
            descriptor.id,
            descriptor.capabilities,
            descriptor.test_url(),
            descriptor.connect,
        )
    }

    fn admin_of(&self) -> Result<AdminFn> {
        self.admin.ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} harness has no admin (its `testing` feature)",
                    self.id
                ),
            )
        })
    }

    async fn with_admin(&self) -> Result<Arc<dyn Admin>> {
        (self.admin_of()?)(self.url.clone()).await
    }
}

/// `url` with `options` set in its query (replacing any of the same key).
pub fn with_options(url: &str, options: &[(String, String)]) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut pairs: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let key = p.split_once('=').map_or(*p, |(k, _)| k);
            !options.iter().any(|(k, _)| k == key)
        })
        .map(str::to_string)
        .collect();
    pairs.extend(options.iter().map(|(k, v)| format!("{k}={v}")));
    if pairs.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", pairs.join("&"))
    }
}

/// A duration as the `<option>_ms` spelling every backend's URL takes: whole milliseconds.
fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

#[async_trait]
impl Harness for Suite {
    fn backend(&self) -> &'static str {
        self.id
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn start_hint(&self) -> &'static str {
        self.start_hint
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        self.client_at(&self.url).await
    }

    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>> {
        let url = self.unreachable_url.as_ref()?;
        let options = [(
            "connect_timeout_ms".to_string(),
            millis(self.connect_timeout),
        )];
        Some((self.connect)(with_options(url, &options)).await)
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn client_at(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let mut options = vec![("default_ttl_ms".to_string(), millis(self.short_ttl))];
        options.extend(self.options.iter().cloned());
        (self.connect)(with_options(url, &options)).await
    }

    async fn client_via(&self, addrs: &[String]) -> Result<Arc<dyn DistributedLock>> {
        let url = reroute(&self.url, &self.upstreams(), addrs);
        self.client_at(&with_options(&url, &self.proxied)).await
    }

    fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    fn not_applicable(&self, case: &str) -> Option<&'static str> {
        self.without_proxies
            .filter(|_| crate::cases::THROUGH_PROXIES.contains(&case))
    }

    async fn remove_behind_back(&self, name: &LockName) -> Result<()> {
        self.with_admin().await?.remove_holder(name).await
    }

    fn short_ttl(&self) -> Duration {
        self.short_ttl
    }

    fn wake_bound(&self) -> Duration {
        self.wake_bound
    }

    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        match self.admin {
            Some(_) => self.with_admin().await?.waiters(name).await,
            None => Ok(None),
        }
    }

    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        match self.admin {
            Some(_) => self.with_admin().await?.leftovers(prefix).await,
            None => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cases_through_proxies_are_cases() {
        for name in crate::cases::THROUGH_PROXIES {
            assert!(
                crate::cases::CASES.iter().any(|c| c.name == *name),
                "{name} is not a case"
            );
        }
    }

    #[test]
    fn options_are_added_or_replaced_in_the_query() {
        let set = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert_eq!(
            with_options("redis://h:1", &set("default_ttl", "400ms")),
            "redis://h:1?default_ttl=400ms"
        );
        assert_eq!(
            with_options(
                "zk://h/p?owner=a&default_ttl=9s",
                &set("default_ttl", "1000ms")
            ),
            "zk://h/p?owner=a&default_ttl=1000ms"
        );
        assert_eq!(with_options("etcd://h?x=1", &[]), "etcd://h?x=1");
    }
}
