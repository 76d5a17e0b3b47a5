//! What the tests of this crate share: the server's URL and clients of it.

#![allow(dead_code)]

use std::sync::Arc;

use distlock_postgres::{PostgresConfig, PostgresLock};

/// The test server's URL (`DISTLOCK_POSTGRES_URL`, or the one `scripts/services` starts).
pub(crate) fn url() -> String {
    std::env::var("DISTLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| distlock_postgres::DESCRIPTOR.test_url_default.to_string())
}

/// A client of the test server with `config`'s changes, or a panic saying how to start it.
pub(crate) async fn client_with(
    change: impl FnOnce(PostgresConfig) -> PostgresConfig,
) -> Arc<PostgresLock> {
    let config = change(PostgresConfig::from_url(&url()).unwrap());
    match PostgresLock::connect(config).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!(
            "no PostgreSQL at {}: {e} (run `scripts/services up postgres`, or `docker compose up \
             -d postgres`)",
            url()
        ),
    }
}

/// A name no other test run uses.
pub(crate) fn name(topic: &str) -> distlock_postgres::LockName {
    distlock_postgres::LockName::new(format!(
        "pg-test/{topic}/{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ))
    .unwrap()
}
