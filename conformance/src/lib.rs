//! The conformance suite every distlock backend runs against its real server.
//!
//! A backend implements [`Harness`] (how to make clients, remove a lock behind its holder's
//! back, what short lease it honours) and registers with one line in a `harness = false` test
//! target: `distlock_conformance::run(MyHarness::from_env())`. Every case in [`cases::CASES`]
//! then runs as its own test, named after the promise it checks; cases the backend's
//! [`Capabilities`](distlock_api::Capabilities) rule out are reported as *ignored* with the
//! reason printed, never as passed.
//!
//! Cases use names under a per-run unique prefix, so they run in parallel against one shared
//! server. A backend named in `DISTLOCK_SKIP` (comma-separated) has every case ignored, and the
//! skip is printed.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod case;
pub mod cases;
pub mod given;
pub mod hand_over;
mod harness;
mod local;
mod proxy;
mod runner;
pub mod server_faults;
mod suite;
pub mod tls;

pub use case::{unique_suffix, Case, CaseFuture, Ctx, CASE_TIMEOUT};
pub use harness::Harness;
pub use local::{free_ports, send_signal, watch_lost};
pub use proxy::{hosts_of, reroute, Proxy};
pub use runner::{run, skipped_by_env};
pub use suite::{with_options, Suite};
