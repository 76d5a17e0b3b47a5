//! How a backend describes itself, once: its id, label, URL schemes, the server its tests use,
//! its capabilities and how to connect to it. The facade's `connect`, its capability table, the
//! benchmark and the test harnesses iterate over these descriptors instead of listing backends.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::capability::Capabilities;
use crate::error::{Error, Result};
use crate::lock::SharedLock;
use crate::memory::{self, MemoryStore};

/// Connects to a backend from a URL (one of its schemes).
pub type ConnectFn = fn(String) -> BoxFuture<'static, Result<SharedLock>>;

/// One backend, described once. Each backend crate exports one (`DESCRIPTOR`; the Redis
/// crate also `REDLOCK_DESCRIPTOR`) as a `pub static`.
pub struct BackendDescriptor {
    /// The short id: the Cargo feature of the facade that brings it, the `--only` name of the
    /// benchmark, the `DISTLOCK_SKIP` name of the scripts (`redis`, `redlock`, `mysql`, …).
    pub id: &'static str,
    /// The name documents and reports show (`MySQL/MariaDB`).
    pub label: &'static str,
    /// The URL schemes it connects to; the first is the usual one.
    pub schemes: &'static [&'static str],
    /// The environment variable with the URL of the server the tests and the benchmark use;
    /// empty for a backend without a server.
    pub test_url_var: &'static str,
    /// The URL used when that variable is unset: the loopback port `scripts/services` uses.
    pub test_url_default: &'static str,
    /// What it promises.
    pub capabilities: Capabilities,
    /// Parses the URL (no I/O for a bad one) and connects.
    pub connect: ConnectFn,
}

impl BackendDescriptor {
    /// The server URL for tests and the benchmark: the environment variable's value when it
    /// is set and not blank, otherwise the loopback default.
    pub fn test_url(&self) -> String {
        std::env::var(self.test_url_var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| self.test_url_default.to_string())
    }

    /// Whether `scheme` (any case) is one of its URL schemes.
    pub fn handles(&self, scheme: &str) -> bool {
        self.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }

    /// Connects to `url`, returning the client as a shared trait object.
    pub async fn connect(&self, url: &str) -> Result<SharedLock> {
        (self.connect)(url.to_string()).await
    }
}

impl fmt::Debug for BackendDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendDescriptor")
            .field("id", &self.id)
            .field("label", &self.label)
            .field("schemes", &self.schemes)
            .field("test_url_var", &self.test_url_var)
            .finish_non_exhaustive()
    }
}

/// The in-memory backend: `memory://` is one store for the whole process, `memory://NAME` a
/// named one, so code written against a URL behaves the same pointed at memory in tests.
pub static MEMORY: BackendDescriptor = BackendDescriptor {
    id: "memory",
    label: "in-memory",
    schemes: &["memory"],
    test_url_var: "",
    test_url_default: "memory://",
    capabilities: memory::CAPABILITIES,
    connect: |url| Box::pin(async move { connect_memory(&url) }),
};

fn connect_memory(url: &str) -> Result<SharedLock> {
    let rest = url
        .split_once("://")
        .filter(|(s, _)| s.eq_ignore_ascii_case("memory"))
        .map(|(_, r)| r)
        .ok_or_else(|| Error::invalid(format!("{url:?} is not a memory:// URL")))?;
    let store = rest.strip_suffix('/').unwrap_or(rest);
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if store.len() > 64 || !store.chars().all(ok) {
        return Err(Error::invalid(format!(
            "the memory backend takes only a store name of [A-Za-z0-9-_.] (up to 64): use \
             \"memory://\" or \"memory://NAME\", not {url:?}"
        )));
    }
    Ok(Arc::new(MemoryStore::named(store).client()))
}
