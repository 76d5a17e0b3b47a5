//! Acquire attempts that survive their caller being dropped.
//!
//! Once an acquire script is sent, the server may grant the lock even if the caller's future is
//! dropped before the answer arrives. So each attempt runs as a task of its own and hands its
//! outcome over a oneshot channel: if the caller is gone by then, the task gives the grant back
//! itself; if the outcome arrived but the caller was dropped before reading it, the caller's
//! drop guard gives it back. Either way no lock is left held without a guard.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock_api::wait::Attempt;
use distlock_api::{Error, ErrorKind, Grant, Result};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Runs `attempt` detached from the caller; a grant nobody receives goes to `undo`.
pub(crate) async fn detached<A, U, UF>(attempt: A, undo: U) -> Result<Attempt>
where
    A: Future<Output = Result<Attempt>> + Send + 'static,
    U: Fn(Grant) -> UF + Send + Sync + 'static,
    UF: Future<Output = ()> + Send + 'static,
{
    let Ok(handle) = Handle::try_current() else {
        // Outside Tokio nothing can run in the background; the driver needs Tokio anyway.
        return attempt.await;
    };
    let undo: Undo = Arc::new(move |g| Box::pin(undo(g)));
    let (tx, rx) = oneshot::channel();
    let task_undo = undo.clone();
    handle.spawn(async move {
        if let Err(Ok(Attempt::Granted(grant))) = tx.send(attempt.await) {
            task_undo(grant).await;
        }
    });
    let mut pending = Pending {
        rx,
        undo: Some(undo),
        handle,
    };
    let outcome = (&mut pending.rx).await;
    pending.undo = None;
    outcome.unwrap_or_else(|_| {
        Err(Error::new(
            ErrorKind::Backend,
            "the acquire task ended without an answer (the runtime is shutting down)",
        ))
    })
}

type Undo = Arc<dyn Fn(Grant) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

struct Pending {
    rx: oneshot::Receiver<Result<Attempt>>,
    undo: Option<Undo>,
    handle: Handle,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        // Closing first makes the hand-over atomic: after it, either the outcome is already
        // here (and undone below) or the task's send fails (and the task undoes it).
        self.rx.close();
        if let Ok(Ok(Attempt::Granted(grant))) = self.rx.try_recv() {
            self.handle.spawn(undo(grant));
        }
    }
}
