//! What the etcd test targets share: where the server is, and a raw client for looking behind
//! the backend's back.

#![allow(dead_code)] // each test target uses its own subset

use std::time::Duration;

use distlock_etcd::etcd_client::{self, GetOptions};
use distlock_etcd::{EtcdConfig, LockName};

/// Whether `DISTLOCK_SKIP` names etcd; then the test prints the skip and passes.
pub(crate) fn skip() -> bool {
    let skip = distlock_conformance::skipped_by_env("etcd");
    if skip {
        eprintln!("SKIPPING this etcd test: DISTLOCK_SKIP names etcd");
    }
    skip
}

/// The server the tests run against.
pub(crate) fn url() -> String {
    distlock_etcd::DESCRIPTOR.test_url()
}

/// The lease the tests ask for: etcd's minimum (2 s with default server settings, which is
/// what the server grants for any shorter request).
pub(crate) const SHORT_TTL: Duration = Duration::from_secs(2);

/// The config of a test client, with the short lease.
pub(crate) fn config() -> EtcdConfig {
    EtcdConfig::from_url(&url())
        .map(|c| c.default_ttl(SHORT_TTL))
        .unwrap_or_else(|e| panic!("bad DISTLOCK_ETCD_URL: {e}"))
}

/// A raw driver connection to the same cluster, separate from any lock client.
pub(crate) async fn raw() -> etcd_client::Client {
    let config = config();
    etcd_client::Client::connect(config.endpoints(), None)
        .await
        .unwrap_or_else(|e| panic!("cannot connect a raw etcd client to {}: {e}", url()))
}

/// The keys of every lock whose name starts with `name_prefix`.
pub(crate) async fn keys_under(raw: &etcd_client::Client, name_prefix: &str) -> Vec<String> {
    let dir = config().lock_dir(&LockName::new(name_prefix).expect("valid name prefix"));
    // The directory of the name itself ends in "/"; without it, it covers every name that
    // starts with the prefix.
    keys_with_prefix(raw, dir.strip_suffix('/').unwrap_or(&dir)).await
}

/// The entry keys of lock `name`, holder and waiters.
pub(crate) async fn entries_of(raw: &etcd_client::Client, name: &LockName) -> Vec<String> {
    keys_with_prefix(raw, &config().lock_dir(name)).await
}

async fn keys_with_prefix(raw: &etcd_client::Client, prefix: &str) -> Vec<String> {
    let resp = raw
        .kv_client()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap_or_else(|e| panic!("listing keys: {e}"));
    resp.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Whether lease `id` still exists on the server.
pub(crate) async fn lease_alive(raw: &etcd_client::Client, id: i64) -> bool {
    let resp = raw
        .lease_client()
        .time_to_live(id, None)
        .await
        .unwrap_or_else(|e| panic!("asking for lease {id:x}: {e}"));
    resp.ttl() > 0
}

/// A lock name no other run uses.
pub(crate) fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("etcd-test-{what}-{}-{nanos:08x}-", std::process::id())
}
