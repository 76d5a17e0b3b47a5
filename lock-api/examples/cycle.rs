//! Uncontended in-memory lock cycles (`try_lock`, then `release`), for counting the
//! instructions a cycle costs, which unlike its time does not depend on what else the machine
//! runs: the difference between two counts over the number of extra cycles.
//!
//! ```text
//! cargo build --release -p distlock-api --example cycle
//! valgrind --tool=callgrind target/release/examples/cycle 100000
//! valgrind --tool=callgrind target/release/examples/cycle 200000
//! ```
use std::sync::Arc;

use distlock_api::{DistributedLock, LockExt, MemoryLock};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let lock: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        for _ in 0..n {
            let g = lock.try_lock("cycle").await.unwrap().unwrap();
            g.release().await.unwrap();
        }
    });
}
