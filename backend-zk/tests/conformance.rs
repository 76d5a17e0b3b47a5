//! The ZooKeeper backend against the whole conformance suite, on the server at
//! `DISTLOCK_ZK_URL` (default `zk://127.0.0.1:2181`).

use std::process::ExitCode;
use std::time::Duration;

use distlock_conformance::Suite;
use distlock_zk::{testing, DESCRIPTOR};

fn main() -> ExitCode {
    // The short lease is the session timeout the watchdog keeps renewing: short, so renewal
    // and loss cases run in seconds (the server allows down to 2 ticks).
    let suite = Suite::of(&DESCRIPTOR)
        .admin(|url| Box::pin(testing::admin(url)))
        .short_ttl(Duration::from_secs(1))
        .wake_bound(Duration::from_millis(250))
        .unreachable_at("zk://127.0.0.1:1");
    distlock_conformance::run(suite)
}
