//! The shared conformance suite through Redis Sentinel (`DISTLOCK_REDIS_SENTINEL_URL`, by
//! default the local master on 127.0.0.1:6390, its two replicas and three sentinels on
//! 26379-26381 that `scripts/services up redis` starts).

mod common;

use std::process::ExitCode;

fn main() -> ExitCode {
    distlock_conformance::run(common::sentinel_suite(common::redis_sentinel_url()))
}
