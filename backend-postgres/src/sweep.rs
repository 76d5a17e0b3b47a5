//! The expiry sweeper: one background task per client that deletes expired rows now and then.
//! Expired rows block nobody (an acquire takes them over); the sweeper only keeps the table
//! small when many names are used once. The fencing table is never swept.

use std::sync::Arc;
use std::time::Duration;

use crate::ops::Inner;

/// Sweeps every `every` (the first time after a random part of it, so clients started
/// together do not sweep together) until aborted.
pub(crate) async fn sweep_loop(inner: Arc<Inner>, every: Duration) {
    tokio::time::sleep(every.mul_f64(fastrand_fraction())).await;
    loop {
        match inner.sweep().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(rows = n, "postgres sweeper: deleted expired rows"),
            Err(e) => tracing::debug!(error = %e, "postgres sweeper: sweep failed"),
        }
        tokio::time::sleep(every).await;
    }
}

/// A fraction in [0, 1) from the clock's nanoseconds: enough to spread clients apart.
fn fastrand_fraction() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(nanos) / 1e9
}
