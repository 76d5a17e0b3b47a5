//! The PostgreSQL backend against the whole conformance suite, on the server at
//! `DISTLOCK_POSTGRES_URL` (default `postgres://distlock:distlock@127.0.0.1:5432/distlock`).

use std::process::ExitCode;
use std::time::Duration;

use distlock_conformance::Suite;
use distlock_postgres::{testing, DESCRIPTOR};

fn main() -> ExitCode {
    let suite = Suite::of(&DESCRIPTOR)
        .admin(|url| Box::pin(testing::admin(url)))
        // Expired rows go within a quarter second, so expiry cases need not wait for a sweep.
        .option("sweep_interval_ms", "250")
        .short_ttl(Duration::from_secs(1))
        .wake_bound(Duration::from_millis(500))
        .unreachable_at("postgres://distlock:distlock@127.0.0.1:1/distlock")
        .start_hint(
            "run `scripts/services up postgres` (PostgreSQL on 127.0.0.1:5432, database and \
             user `distlock`), or `docker compose up -d postgres`, or point \
             DISTLOCK_POSTGRES_URL at a server",
        );
    distlock_conformance::run(suite)
}
