//! The in-memory reference backend against the whole suite.

use std::process::ExitCode;

#[path = "support/memory.rs"]
mod support;

fn main() -> ExitCode {
    distlock_conformance::run(support::Memory::new(false))
}
