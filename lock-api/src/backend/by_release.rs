//! The common way of the two operations whose right behaviour depends on the backend
//! ([`DistributedLock::force_release`] and [`DistributedLock::give_back`]): find the hold with
//! `inspect`, then take holds away with `release`, each conditional on owner and token on the
//! server. Right wherever a release needs no [`Grant::key`]; a backend whose grants carry one
//! writes its own.

use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::grant::{FencingToken, Grant, Surplus};
use crate::lock::{DistributedLock, DEFAULT_TTL};

use crate::name::LockName;

/// How many holds past the ones it saw [`force_release_by_releases`] gives up before it stops.
const FORCE_RELEASE_SLACK: u32 = 64;

/// [`DistributedLock::force_release`] by `inspect` and `release`: gives up the holds of the
/// grant of `token` one by one, while that grant holds `name`.
pub async fn force_release_by_releases<B: DistributedLock + ?Sized>(
    backend: &B,
    name: &LockName,
    token: FencingToken,
) -> Result<bool> {
    let Some(info) = backend.inspect(name).await? else {
        return Ok(false);
    };
    if info.token != token {
        return Ok(false);
    }
    let grant = Grant {
        name: name.clone(),
        hold_count: info.hold_count,
        ttl: info
            .remaining
            .unwrap_or(DEFAULT_TTL)
            .max(Duration::from_millis(1)),
        owner: info.owner,
        token,
        sent_at: Instant::now(),
        key: String::new(),
        permits: info.permits.1,
    };
    // The holder may re-enter meanwhile, adding holds: give them up until the grant holds
    // no more, within a bound so that a holder re-entering without end cannot keep this
    // going.
    let mut freed = false;
    for _ in 0..info.hold_count.saturating_add(FORCE_RELEASE_SLACK) {
        if !backend.release(&grant).await? {
            return Ok(freed);
        }
        freed = true;
    }
    Err(Error::new(
        ErrorKind::Backend,
        "the holder kept re-entering while its holds were given up: try again",
    )
    .with_lock(name))
}

/// [`DistributedLock::give_back`] by `inspect` and `release`: one hold of the owner's, if the
/// server has one that this handle does not account for ([`ClientCore::has_surplus`](crate::backend::ClientCore::has_surplus)).
pub async fn give_back_by_release<B: DistributedLock + ?Sized>(
    backend: &B,
    surplus: &Surplus,
) -> Result<bool> {
    let Surplus {
        name, owner, ttl, ..
    } = surplus;
    match backend.inspect(name).await? {
        Some(info)
            if info.owner == *owner && backend.core().has_surplus(surplus, info.hold_count) =>
        {
            let grant = Grant {
                name: name.clone(),
                owner: owner.clone(),
                token: info.token,
                hold_count: info.hold_count,
                ttl: *ttl,
                sent_at: Instant::now(),
                key: String::new(),
                permits: info.permits.1,
            };
            backend.release(&grant).await
        }
        _ => Ok(false),
    }
}
