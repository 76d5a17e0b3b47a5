//! What the API crate's integration tests share: a runtime to drive them and two clients of
//! one in-memory store.

use std::sync::Arc;

use distlock_api::{MemoryLock, MemoryStore};

/// A multi-threaded runtime with one worker, so spawned tasks (the watchdog, background
/// releases) run beside the test's own future.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A fresh store and two clients of it, each with its own owner id.
pub(crate) fn two_clients() -> (MemoryStore, Arc<MemoryLock>, Arc<MemoryLock>) {
    let store = MemoryStore::new();
    let (a, b) = (Arc::new(store.client()), Arc::new(store.client()));
    (store, a, b)
}
