//! Re-entry through a guard: an acquire that names the guard's owner exactly.

use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::options::LockOptions;

use super::try_lock_with;

/// Re-entry is an acquire, so it lives with the other acquires.
impl LockGuard {
    /// Takes one more hold of this guard's lock, as the same owner: the new guard has the same
    /// token and a hold count one higher, and the lock is free only when every guard of the
    /// hold has been released or dropped, in any order. This is how a holder re-enters: an
    /// acquire through the client (`try_lock`, `lock`) is a new owner, which this hold excludes
    /// like any other. The new hold's lease is the client's default watchdog lease; see
    /// [`reenter_with`](Self::reenter_with).
    ///
    /// `Unsupported` on a backend without reentrancy; `Lost` if this guard no longer holds,
    /// and then the guard reports lost too (as after an [`extend`](Self::extend) that finds the
    /// hold gone).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use distlock_api::{LockExt, MemoryLock};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = Arc::new(MemoryLock::new());
    /// let outer = locks.try_lock("ledger").await?.expect("free");
    /// // The same client asking again is another owner: excluded.
    /// assert!(locks.try_lock("ledger").await?.is_none());
    /// // The holder re-enters through its guard.
    /// let inner = outer.reenter().await?;
    /// assert_eq!((inner.token(), inner.hold_count()), (outer.token(), 2));
    /// assert!(outer.release().await?); // one hold left: still held
    /// assert!(locks.try_lock("ledger").await?.is_none());
    /// assert!(inner.release().await?); // the last hold: free
    /// assert!(locks.try_lock("ledger").await?.is_some());
    /// # Ok::<_, distlock_api::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn reenter(&self) -> Result<LockGuard> {
        reenter(&self.backend, self, &LockOptions::new()).await
    }

    /// Like [`reenter`](Self::reenter), with `options`' lease for the new hold (its wait bound
    /// is ignored; an owner in it is `InvalidArgument`: the hold's owner is this guard's).
    pub async fn reenter_with(&self, options: &LockOptions) -> Result<LockGuard> {
        reenter(&self.backend, self, options).await
    }
}

/// [`LockGuard::reenter_with`]: one more hold for `held`'s owner, which only an acquire that
/// names that owner exactly can take (every other acquisition has an owner of its own).
async fn reenter(
    this: &Arc<dyn DistributedLock>,
    held: &LockGuard,
    options: &LockOptions,
) -> Result<LockGuard> {
    let name = held.name();
    let error = |kind, msg: &str| {
        Error::new(kind, msg.to_string())
            .with_backend(this.core().backend())
            .with_lock(name)
    };
    let fail = |kind, msg: &str| Err(error(kind, msg));
    if !this.capabilities().reentrant {
        return fail(
            ErrorKind::Unsupported,
            "this backend is not reentrant: a holder cannot take its lock twice",
        );
    }
    if options.owner.is_some() {
        return fail(
            ErrorKind::InvalidArgument,
            "re-entry keeps the guard's owner: leave the options' owner unset",
        );
    }
    if let Some(why) = held.lost_reason() {
        return fail(
            ErrorKind::Lost,
            &format!("cannot re-enter a lock this guard no longer holds ({why})"),
        );
    }
    let permits = held.grant().permits;
    let ended = || error(ErrorKind::Lost, "the hold this guard re-enters has ended");
    let gone = match try_lock_with(
        this,
        name.as_str(),
        Some(options),
        permits,
        Some(held.owner()),
    )
    .await
    {
        Ok(Some(g)) if g.token() == held.token() => return Ok(g),
        Ok(Some(g)) => {
            // The hold ended and the owner was granted afresh: not the hold being re-entered.
            let _ = g.release().await;
            ended()
        }
        Ok(None) => ended(),
        Err(e) if e.kind() == ErrorKind::Lost => e,
        Err(e) => return Err(e),
    };
    // The server's answer found the hold gone: the guard learns it now, not at its next
    // renewal, so the library never says "ended" here while the guard still claims the lock.
    held.found_gone(&gone);
    Err(gone)
}
