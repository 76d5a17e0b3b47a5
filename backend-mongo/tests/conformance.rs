//! The shared conformance suite against a MongoDB server (`DISTLOCK_MONGO_URL`, default
//! `mongodb://127.0.0.1:27017`).

use std::process::ExitCode;
use std::time::Duration;

use distlock_conformance::Suite;
use distlock_mongo::{testing, DESCRIPTOR, POLL_CAP};

fn main() -> ExitCode {
    let suite = Suite::of(&DESCRIPTOR)
        .admin(|url| Box::pin(testing::admin(url)))
        // Without it the driver learns the server's own address from its handshake and
        // connects there, around the partition cases' proxy.
        .option_through_proxy("directConnection", "true")
        // A lock operation takes 2-40 ms on a loaded 2-core machine running several suites at
        // once; a case that holds 100 locks renews 100 leases per TTL/3 through one pool of 10
        // connections, so a lease of a few hundred ms can run out before its renewal is sent.
        // The test server renews about 160 a second when idle; 2 s leases (150 a second for
        // 100 locks) lost one once under a full CI run, so 3 s (100 a second).
        .short_ttl(Duration::from_secs(3))
        // A poller sleeps at most the backoff cap between attempts; the rest is round trips
        // on a machine shared with other test processes.
        .wake_bound(POLL_CAP + Duration::from_millis(400))
        .unreachable_at("mongodb://127.0.0.1:1");
    distlock_conformance::run(suite)
}
