//! The MySQL/MariaDB backend against the whole conformance suite, on the server at
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`).

use std::process::ExitCode;
use std::time::Duration;

use distlock_conformance::Suite;
use distlock_mysql::{testing, DESCRIPTOR};

fn main() -> ExitCode {
    let suite = Suite::of(&DESCRIPTOR)
        .admin(|url| Box::pin(testing::admin(url)))
        // Expired rows go within a quarter second, so expiry cases need not wait for a sweep.
        .option("sweep_interval_ms", "250")
        .short_ttl(Duration::from_secs(1))
        .wake_bound(Duration::from_millis(500))
        .unreachable_at("mysql://distlock:distlock@127.0.0.1:1/distlock")
        .start_hint(
            "run `scripts/services up` (MariaDB on 127.0.0.1:3306, database and user `distlock`), \
             or `docker compose up -d mysql`, or point DISTLOCK_MYSQL_URL at a server",
        );
    distlock_conformance::run(suite)
}
