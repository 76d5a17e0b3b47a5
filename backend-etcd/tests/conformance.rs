//! The etcd backend against the whole conformance suite, on the server `DISTLOCK_ETCD_URL`
//! names (default `etcd://127.0.0.1:2379`).

use std::process::ExitCode;
use std::time::Duration;

use distlock_conformance::Suite;
use distlock_etcd::{testing, DESCRIPTOR};

fn main() -> ExitCode {
    let suite = Suite::of(&DESCRIPTOR)
        // Clients whose leases the admin follows, to check a dropped client revoked its lease.
        .connect_with(testing::connect_tracked)
        .admin(|url| Box::pin(testing::admin(url)))
        // etcd's minimum lease with default server settings: shorter requests get this.
        .short_ttl(Duration::from_secs(2))
        .wake_bound(Duration::from_millis(250))
        .unreachable_at("etcd://127.0.0.1:1")
        .start_hint(
            "run `scripts/services up` (or `docker compose up -d etcd`), or point \
             DISTLOCK_ETCD_URL at an etcd",
        );
    distlock_conformance::run(suite)
}
