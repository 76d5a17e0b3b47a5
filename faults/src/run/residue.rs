//! What a run leaves on the server once every lease has run out, looked for through the
//! backend's test-only admin (which the nemesis also uses to delete a lock behind its holder).

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::LockName;
use distlock_api::backend::testing::Admin;

use crate::matrix::Backend;

/// The backend's test-only admin for the server(s) at `url`.
pub(super) async fn admin(backend: &Backend, url: &str) -> Result<Arc<dyn Admin>, String> {
    let make = backend
        .admin
        .ok_or_else(|| format!("{} has no server to act on", backend.key()))?;
    make(url.to_string())
        .await
        .map_err(|e| format!("cannot reach {url} as its admin: {e}"))
}

/// What is left on the server once every lease has run out: a holder `inspect` still sees
/// (after waiting out the leases of killed or cut-off holders), and what the backend's admin
/// finds under the run's name prefix (keys, rows, documents, nodes, leases, waiters).
pub(super) async fn residue(
    backend: &Backend,
    url: &str,
    prefix: &str,
    names: &[String],
    ttl: Duration,
) -> Vec<String> {
    let mut left = Vec::new();
    let handle = match distlock::connect(url).await {
        Ok(h) => h,
        Err(e) => return vec![format!("cannot connect to look for residue: {e}")],
    };
    // A killed or cut-off holder's lease has to run out first (sessions: the session timeout).
    let patience = ttl * 3 + Duration::from_secs(3);
    let until = Instant::now() + patience;
    for name in names {
        let Ok(lock) = LockName::new(name) else {
            continue;
        };
        loop {
            match handle.inspect(&lock).await {
                Ok(None) => break,
                Ok(Some(info)) if Instant::now() >= until => {
                    left.push(format!(
                        "{name:?} still held by {} (token {}) {patience:?} after the run",
                        info.owner, info.token,
                    ));
                    break;
                }
                Err(e) if Instant::now() >= until => {
                    left.push(format!("{name:?}: inspect failed: {e}"));
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
    drop(handle);
    // Waiter entries and the like go with their clients' sessions and leases: wait for them
    // the same way before calling them residue.
    match admin(backend, url).await {
        Ok(admin) => loop {
            match admin.leftovers(prefix).await {
                Ok(found) if found.is_empty() => break,
                Ok(found) if Instant::now() >= until => {
                    left.extend(found);
                    break;
                }
                Err(e) if Instant::now() >= until => {
                    left.push(format!("listing leftovers failed: {e}"));
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        },
        Err(e) => left.push(e),
    }
    left
}
