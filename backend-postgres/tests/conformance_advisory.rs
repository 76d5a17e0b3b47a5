//! The PostgreSQL backend in advisory mode (`mode=advisory`: session advisory locks) against
//! the whole conformance suite, on the server at `DISTLOCK_POSTGRES_URL` (default
//! `postgres://distlock:distlock@127.0.0.1:5432/distlock`).

use std::process::ExitCode;
use std::time::Duration;

use distlock_conformance::Suite;
use distlock_postgres::{testing, ADVISORY_CAPABILITIES, DESCRIPTOR};

fn main() -> ExitCode {
    let suite = Suite::new(
        DESCRIPTOR.id,
        ADVISORY_CAPABILITIES,
        DESCRIPTOR.test_url(),
        DESCRIPTOR.connect,
    )
    .admin(|url| Box::pin(testing::admin(url)))
    .option("mode", "advisory")
    // A short session bound: a cut-off or paused holder's session ends within 2 s.
    .option("session_timeout_ms", "2000")
    .option("sweep_interval_ms", "250")
    .short_ttl(Duration::from_secs(1))
    .wake_bound(Duration::from_millis(500))
    .unreachable_at("postgres://distlock:distlock@127.0.0.1:1/distlock?mode=advisory")
    .start_hint(
        "run `scripts/services up postgres` (PostgreSQL on 127.0.0.1:5432, database and \
         user `distlock`), or `docker compose up -d postgres`, or point \
         DISTLOCK_POSTGRES_URL at a server",
    );
    distlock_conformance::run(suite)
}
