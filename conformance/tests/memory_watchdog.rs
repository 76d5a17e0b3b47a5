//! The in-memory reference backend against the whole suite once more, behind a wrapper that
//! hides `DistributedLock::keeper`: its guards then take the path every networked
//! backend's take (watchdog enrolment, renewals through `renew`, release through the async
//! primitive), so that path is checked against the reference model too.

use std::process::ExitCode;

#[path = "support/memory.rs"]
mod support;

fn main() -> ExitCode {
    distlock_conformance::run(support::Memory::new(true))
}
