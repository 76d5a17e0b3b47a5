//! What every example does once it has a client: two workers of one process share the handle
//! and take turns on a lock, writing to a store that checks fencing tokens; then a holder whose
//! lease is taken from it sees `lost()` fire and its late write rejected.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{FencingToken, LeaseKind, LockExt, LockOptions, Result, SharedLock};

/// A stand-in for the resource a lock protects: it remembers the highest token it accepted and
/// rejects writes that carry a lower one, so a holder that lost its lock cannot overwrite the
/// work of the one after it.
#[derive(Default)]
pub(crate) struct FencedStore {
    state: Mutex<(u64, Vec<String>)>,
}

impl FencedStore {
    /// Appends `line` unless a newer holder has written already.
    pub(crate) fn write(&self, token: FencingToken, line: String) -> bool {
        let mut state = self.state.lock().unwrap();
        if token.0 < state.0 {
            return false;
        }
        state.0 = token.0;
        state.1.push(line);
        true
    }

    fn lines(&self) -> Vec<String> {
        self.state.lock().unwrap().1.clone()
    }
}

/// Runs the walk-through on `locks` with lock names under `prefix` (unique per run).
pub(crate) async fn walk_through(locks: SharedLock, prefix: &str) -> Result<()> {
    let name = format!("{prefix}/invoice-42");
    let store = Arc::new(FencedStore::default());

    // Two workers sharing one client handle: each acquisition is its own owner, so they
    // exclude each other exactly as two machines would.
    let mut workers = Vec::new();
    for worker in 0..2 {
        let (locks, store, name) = (locks.clone(), store.clone(), name.clone());
        workers.push(tokio::spawn(async move {
            let options = LockOptions::new().wait(Duration::from_secs(10));
            for round in 0..2 {
                locks
                    .with_lock(&name, &options, |token| {
                        let store = store.clone();
                        async move {
                            store.write(
                                token,
                                format!("worker {worker} round {round} token {token}"),
                            );
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    })
                    .await?;
            }
            Ok::<_, distlock::Error>(())
        }));
    }
    for w in workers {
        w.await.expect("worker panicked")?;
    }
    for line in store.lines() {
        println!("  {line}");
    }

    // A holder whose lock is taken from it: with a fixed 1 s lease and no renewal, the lease
    // runs out while it "works", lost() fires, and the next holder's token fences it off.
    let capabilities = locks.capabilities();
    if capabilities.ttl.kind == LeaseKind::PerLock {
        let slow = locks
            .lock_with(&name, &LockOptions::new().ttl(Duration::from_secs(1)))
            .await?;
        let reason = slow.lost().await;
        println!("  the slow holder lost {name}: {reason}");
        let next = locks.lock(&name, Duration::from_secs(10)).await?;
        assert!(store.write(next.token(), "the next holder".into()));
        let late = store.write(slow.token(), "the slow holder, late".into());
        println!("  the slow holder's late write accepted: {late}");
        assert!(!late);
        next.release().await?;
    } else {
        println!(
            "  ({} keeps leases per session, not per lock: no fixed-lease part)",
            locks.core().backend()
        );
    }
    Ok(())
}

/// A prefix of lock names no earlier run used (process id and clock nanoseconds).
pub(crate) fn run_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("examples-{}-{nanos:08x}", std::process::id())
}

/// The URL to use: `DISTLOCK_URL` if set, else `default` (where `scripts/services up` serves).
#[allow(dead_code)] // the memory example needs no URL
pub(crate) fn url_or(default: &str) -> String {
    std::env::var("DISTLOCK_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| default.to_string())
}
