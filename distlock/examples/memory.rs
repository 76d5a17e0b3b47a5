//! The in-memory backend: no server, one process. `cargo run -p distlock --example memory`
//!
//! It is the reference model of every promise the server backends make, and a lock for tasks
//! of one process.

mod common;

use distlock::memory::MemoryLock;
use std::sync::Arc;

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = Arc::new(MemoryLock::new());
    println!("memory:");
    common::walk_through(locks, &common::run_prefix()).await
}
