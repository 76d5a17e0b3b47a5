//! The shared conformance suite through Redis Sentinel with `sync_replicas=2`: every grant and
//! renewal waits for both replicas of the local topology (`DISTLOCK_REDIS_SENTINEL_URL`, by
//! default the master on 127.0.0.1:6390, its two replicas and three sentinels on 26379-26381
//! that `scripts/services up redis` starts). Every promise holds with the option on (no
//! hand-overs between tasks of one handle: every grant is an acquire).

mod common;

use std::process::ExitCode;

fn main() -> ExitCode {
    distlock_conformance::run(common::sentinel_suite(sync_url()))
}

/// The Sentinel URL with `sync_replicas=2` added.
fn sync_url() -> String {
    let url = common::redis_sentinel_url();
    let join = if url.contains('?') { '&' } else { '?' };
    format!("{url}{join}sync_replicas=2")
}
