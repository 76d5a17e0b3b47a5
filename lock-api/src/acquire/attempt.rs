//! One attempt at the server, safe to drop at any point.

use std::sync::Arc;

use crate::backend::wait::{self, Attempt};
use crate::error::Result;
use crate::grant::AcquireRequest;
use crate::lock::DistributedLock;

/// One attempt of `req`, safe to drop at any point: once its request may have been sent, a
/// grant nobody is left to receive is released ([`wait::detached`]). Every backend's attempts
/// go through here, so none wires cancellation of its own.
pub(super) async fn attempt_once(
    this: &Arc<dyn DistributedLock>,
    req: &AcquireRequest,
) -> Result<Attempt> {
    let (lock, req) = (this.clone(), req.clone());
    let undo = this.clone();
    wait::detached(
        async move { lock.attempt(&req).await },
        move |orphan| async move {
            let _ = undo.release(&orphan).await;
        },
    )
    .await
}
