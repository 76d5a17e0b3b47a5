//! Leader election on the lock's grants: a campaign is a long-held grant of the election's
//! name, its fencing token is the leader's *epoch*, and the leader's *value* (an address, a
//! shard map) is proclaimed on the server under that grant. Written once for every backend: a
//! backend only stores the value ([`DistributedLock::proclaim`]) and reports it
//! ([`LockInfo::value`]).

mod observe;

use std::future::Future;
use std::time::{Instant, SystemTime};

pub use observe::Observer;

use crate::acquire::{lock_with, try_lock_with};
use crate::error::{Error, ErrorKind, LostReason, Result};
use crate::grant::{check_value, FencingToken, LockInfo, MAX_WAIT};
use crate::guard::{context, LockGuard};
use crate::lock::SharedLock;
use crate::name::{LockName, OwnerId};
use crate::options::LockOptions;

/// One election: a name that at most one campaigner leads at a time. Made with
/// [`LockExt::election`](crate::LockExt::election).
///
/// ```
/// use std::sync::Arc;
/// use distlock_api::{LockExt, LockOptions, MemoryStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let (a, b) = (Arc::new(store.client()), Arc::new(store.client()));
/// let opts = LockOptions::new();
///
/// let mut leading = a.election("scheduler")?.campaign("10.0.0.7:8080", &opts).await?;
/// assert!(b.election("scheduler")?.try_campaign("10.0.0.8:8080", &opts).await?.is_none());
///
/// let leader = b.election("scheduler")?.leader().await?.expect("led");
/// assert_eq!((leader.epoch, leader.value.as_deref()), (leading.epoch(), Some("10.0.0.7:8080")));
///
/// leading.proclaim("10.0.0.7:9090").await?; // a new value under the same epoch
/// assert!(leading.resign().await?);
/// assert!(b.election("scheduler")?.leader().await?.is_none());
/// # Ok::<_, distlock_api::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Election {
    locks: SharedLock,
    name: LockName,
}

/// Who leads an election, as the server says: the holder of its name.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's owner id.
    pub owner: OwnerId,
    /// The leader's epoch: its grant's fencing token, higher than every earlier leader's.
    pub epoch: FencingToken,
    /// What the leader proclaimed; `None` in the moment between its grant and its first
    /// proclaim.
    pub value: Option<String>,
    /// When its grant began, by the server's clock, where the server keeps it (for display).
    pub since: Option<SystemTime>,
}

impl Leader {
    fn of(info: LockInfo) -> Self {
        Self {
            owner: info.owner,
            epoch: info.token,
            value: info.value,
            since: info.since,
        }
    }
}

impl Election {
    /// The election `name` on `locks`: `InvalidArgument` for a bad name, `Unsupported` where
    /// the backend keeps no leader's value ([`Capabilities::election`](crate::Capabilities)).
    pub(crate) fn new(locks: SharedLock, name: &str) -> Result<Self> {
        let backend = locks.core().backend();
        let name = LockName::new(name).map_err(|e| e.with_backend(backend))?;
        if !locks.capabilities().election {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "this backend keeps no leader's value: it has no elections",
            )
            .with_backend(backend)
            .with_lock(name));
        }
        Ok(Self { locks, name })
    }

    /// The election's name: the lock name its leader holds.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Campaigns with `value`: waits up to `options.wait` (without a bound, until it leads),
    /// then proclaims `value` and returns the [`Leadership`]. Its lease is kept as a lock's is
    /// (the watchdog renews it unless `options` fix one). `Timeout` if the wait runs out.
    pub async fn campaign(&self, value: &str, options: &LockOptions) -> Result<Leadership> {
        self.check(value)?;
        let wait = options.wait.unwrap_or(MAX_WAIT);
        let guard = lock_with(
            &self.locks,
            self.name.as_str(),
            Some(options),
            1,
            Some(wait),
        )
        .await?;
        self.lead(guard, value).await
    }

    /// Campaigns with `value` if nobody leads: the [`Leadership`], or `None` if someone does
    /// (`options.wait` is ignored).
    pub async fn try_campaign(
        &self,
        value: &str,
        options: &LockOptions,
    ) -> Result<Option<Leadership>> {
        self.check(value)?;
        match try_lock_with(&self.locks, self.name.as_str(), Some(options), 1, None).await? {
            Some(guard) => self.lead(guard, value).await.map(Some),
            None => Ok(None),
        }
    }

    /// Who leads now, as the server says; `None` if nobody does.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let info = self
            .locks
            .inspect(&self.name)
            .await
            .map_err(|e| context(e, &*self.locks, &self.name))?;
        Ok(info.map(Leader::of))
    }

    /// Watches who leads: see [`Observer`].
    pub fn observe(&self) -> Observer {
        Observer::new(self.locks.clone(), self.name.clone())
    }

    /// Runs `work` whenever this campaigner leads: campaigns with `value` (waiting as long as
    /// it takes; `options.wait` is ignored), hands `work` the epoch, and resigns when `work`
    /// finishes, returning its output. If leadership is lost first, `work` is dropped at its
    /// next await point and the campaign starts again, so work that must not run without
    /// leadership does not. An error of the backend ends it.
    pub async fn run<F, Fut, T>(&self, value: &str, options: &LockOptions, mut work: F) -> Result<T>
    where
        F: FnMut(FencingToken) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let options = LockOptions {
            wait: None,
            ..options.clone()
        };
        loop {
            let leading = match self.campaign(value, &options).await {
                Ok(leading) => leading,
                // Deposed between the grant and the first proclaim: campaign again.
                Err(e) if e.kind() == ErrorKind::Lost => continue,
                Err(e) => return Err(e),
            };
            let lost = leading.lost();
            tokio::select! {
                biased;
                done = work(leading.epoch()) => {
                    let _ = leading.resign().await;
                    return Ok(done);
                }
                why = lost => {
                    tracing::warn!(
                        backend = self.locks.core().backend(),
                        lock = %self.name,
                        reason = %why,
                        "leadership lost: the work was stopped; campaigning again"
                    );
                    let _ = leading.resign().await;
                }
            }
        }
    }

    fn check(&self, value: &str) -> Result<()> {
        check_value(value).map_err(|e| {
            e.with_backend(self.locks.core().backend())
                .with_lock(self.name.clone())
        })
    }

    /// Proclaims `value` under a fresh grant; a grant already gone is given up and `Lost`.
    async fn lead(&self, guard: LockGuard, value: &str) -> Result<Leadership> {
        let mut leading = Leadership {
            guard,
            value: String::new(),
        };
        match leading.proclaim(value).await {
            Ok(()) => Ok(leading),
            Err(e) => {
                let _ = leading.resign().await;
                Err(e)
            }
        }
    }
}

/// Leading an election: the grant of its name (its token is the epoch) and the value
/// proclaimed under it. Lost as a lock guard is lost ([`lost`](Self::lost),
/// [`is_lost`](Self::is_lost)); stop acting as leader then, and no later than
/// [`safe_until`](Self::safe_until). Dropping it resigns in the background.
#[must_use = "dropping the leadership resigns at once"]
pub struct Leadership {
    guard: LockGuard,
    value: String,
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &LockName {
        self.guard.name()
    }

    /// The epoch: this leadership's fencing token, higher than every earlier leader's. Pass it
    /// to what the leader writes to, so a deposed leader's late writes are refused.
    pub fn epoch(&self) -> FencingToken {
        self.guard.token()
    }

    /// The value last proclaimed.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Until when this campaigner may act as leader; `None` if its lease never expires.
    pub fn safe_until(&self) -> Option<Instant> {
        self.guard.safe_until()
    }

    /// Whether leadership is lost (or its safe-until has passed).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when leadership is lost, with the reason.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.guard.lost()
    }

    /// The lock guard of the leadership's grant (lease, extend, owner).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Makes `value` the leader's value, under this epoch only: `Lost` (and nothing written) if
    /// leadership is lost, past its safe-until, or the server no longer has this grant as the
    /// holder. `InvalidArgument` for a value over [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN) bytes.
    pub async fn proclaim(&mut self, value: &str) -> Result<()> {
        let backend = self.guard.backend.clone();
        let name = self.guard.name().clone();
        check_value(value).map_err(|e| {
            e.with_backend(backend.core().backend())
                .with_lock(name.clone())
        })?;
        let deposed = |why: String| {
            Err(
                Error::new(ErrorKind::Lost, format!("proclaim refused: {why}"))
                    .with_backend(backend.core().backend())
                    .with_lock(name.clone()),
            )
        };
        if let Some(why) = self.guard.lost_reason() {
            return deposed(why.to_string());
        }
        let proclaimed = backend
            .proclaim(self.guard.grant(), value)
            .await
            .map_err(|e| context(e, &*backend, &name))?;
        tracing::debug!(
            backend = backend.core().backend(),
            lock = %name,
            epoch = self.epoch().0,
            proclaimed,
            "proclaim"
        );
        if !proclaimed {
            return deposed(format!("epoch {} no longer leads", self.epoch()));
        }
        value.clone_into(&mut self.value);
        Ok(())
    }

    /// Gives leadership up: `Ok(true)` if it was still held.
    pub async fn resign(self) -> Result<bool> {
        self.guard.release().await
    }
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("backend", &self.locks.core().backend())
            .field("name", &self.name)
            .finish()
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("guard", &self.guard)
            .field("value", &self.value)
            .finish()
    }
}
