//! Semaphore permits on one Redis server: the permit scripts and what their answers mean.
//!
//! A name held as a semaphore of several permits has two keys beside its fencing counter: the
//! holders (a sorted set of owner ids scored by the expiry of each one's lease, on the server's
//! clock) and the permit data (`#max`, and each holder's token, hold count and grant time). Each
//! script drops the holders whose lease has ended before it counts, and sets both keys to
//! expire with the latest lease, so they exist exactly while a permit may be live. A lock
//! request (one permit) keeps to the lock's own scripts; `acquire.lua` checks only that the
//! permit data does not exist.

use std::time::Duration;

use crate::ops::{int, ints, millis, other_permits, pttl_of, Acquired, Server};
use crate::replicas::Call;
use distlock_api::{LockName, OwnerId, Result};

/// What the permit-of script found for an owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PermitOf {
    /// The name is not held as a semaphore.
    NoSemaphore,
    /// It is, but not by this owner.
    NotHeld,
    /// The owner's live permit: its token and hold count.
    Held { token: u64, count: u32 },
}

impl Server {
    /// Runs the permit acquire script: a permit of `max` for `owner` with a lease of `ttl`.
    pub(crate) async fn acquire_permit(
        &self,
        name: &LockName,
        owner: &OwnerId,
        ttl: Duration,
        max: u32,
    ) -> Result<Acquired> {
        let call = Call::new(&self.permit_scripts.acquire)
            .key(self.keys.lock_key(name))
            .key(self.keys.fence_key(name))
            .key(self.keys.holders_key(name))
            .key(self.keys.semaphore_key(name))
            .arg(&*owner.text())
            .arg(millis(ttl))
            .arg(max);
        let bad = || self.bad_reply("permit acquire");
        let (reply, acks) = self.write("permit acquire", call, ttl).await?;
        let reply = ints(reply).ok_or_else(bad)?;
        match reply[..] {
            [1, token, count] => {
                let token = u64::try_from(token).map_err(|_| bad())?;
                self.check_grant(acks, name, (owner, token), true).await?;
                Ok(Acquired::Granted {
                    token,
                    count: u32::try_from(count).map_err(|_| bad())?,
                    fence: 0,
                })
            }
            [0, pttl] => Ok(Acquired::Held {
                pttl: pttl_of(pttl),
            }),
            [2, held] => Err(other_permits(name, held, max)),
            _ => Err(bad()),
        }
    }

    /// Runs the permit release script: the holds left (0: freed and published), or `None` if
    /// the grant `(owner, token)` holds no live permit.
    pub(crate) async fn release_permit(
        &self,
        name: &LockName,
        owner: &OwnerId,
        token: u64,
    ) -> Result<Option<u32>> {
        let mut inv = self.permit_scripts.release.script.prepare_invoke();
        inv.key(self.keys.holders_key(name))
            .key(self.keys.semaphore_key(name))
            .arg(&*owner.text())
            .arg(token)
            .arg(self.keys.channel(name));
        let reply = self.run("permit release", inv).await?;
        self.holds_left("permit release", reply)
    }

    /// Runs the permit renew script: whether the grant `(owner, token)` still held its permit;
    /// if it did, its lease now ends no sooner than `ttl` from now.
    pub(crate) async fn renew_permit(
        &self,
        name: &LockName,
        owner: &OwnerId,
        token: u64,
        ttl: Duration,
    ) -> Result<bool> {
        let call = Call::new(&self.permit_scripts.renew)
            .key(self.keys.holders_key(name))
            .key(self.keys.semaphore_key(name))
            .arg(&*owner.text())
            .arg(token)
            .arg(millis(ttl));
        let (reply, acks) = self.write("permit renew", call, ttl).await?;
        match int(reply) {
            Some(1) => self.check_renewal(acks, name).map(|()| true),
            Some(0) => Ok(false),
            _ => Err(self.bad_reply("permit renew")),
        }
    }

    /// Runs the permit force-release script: `Some(freed)` if the name is held as a semaphore
    /// (freed: the permit of `token` was live and is freed), `None` if it is not.
    pub(crate) async fn force_release_permit(
        &self,
        name: &LockName,
        token: u64,
    ) -> Result<Option<bool>> {
        let mut inv = self.permit_scripts.force.script.prepare_invoke();
        inv.key(self.keys.holders_key(name))
            .key(self.keys.semaphore_key(name))
            .arg(token)
            .arg(self.keys.channel(name));
        match int(self.run("permit force release", inv).await?) {
            Some(1) => Ok(Some(true)),
            Some(0) => Ok(Some(false)),
            Some(-1) => Ok(None),
            _ => Err(self.bad_reply("permit force release")),
        }
    }

    /// Runs the permit-of script: `owner`'s own permit of `name`, whichever it is.
    pub(crate) async fn permit_of(&self, name: &LockName, owner: &OwnerId) -> Result<PermitOf> {
        let mut inv = self.permit_scripts.owner.script.prepare_invoke();
        inv.key(self.keys.holders_key(name))
            .key(self.keys.semaphore_key(name))
            .arg(&*owner.text());
        let bad = || self.bad_reply("permit of");
        let reply = ints(self.run("permit of", inv).await?).ok_or_else(bad)?;
        match reply[..] {
            [] => Ok(PermitOf::NoSemaphore),
            [0] => Ok(PermitOf::NotHeld),
            [1, token, count] => Ok(PermitOf::Held {
                token: u64::try_from(token).map_err(|_| bad())?,
                count: u32::try_from(count).map_err(|_| bad())?,
            }),
            _ => Err(bad()),
        }
    }
}
