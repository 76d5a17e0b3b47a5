//! Semaphore permits (requests for more than one permit): the attempt, release, renewal and
//! what inspect, list, force-release and give-back see of them. The pipelines are in
//! [`crate::commands`]'s `permit` module.
//!
//! A permit is an entry of its name's `permits` array in the lock document. The server applies
//! the updates of one document one at a time, so each `findAndModify` of a permit attempt
//! counts the live permits and appends to them in one step, as the lock's attempt decides on
//! its holder; release and renewal are conditional on the permit (owner, token) being live, as
//! the lock's are on the grant.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::{lost, AcquireRequest};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockInfo, LockName, OwnerId, Result};
use mongodb::bson::{Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::Collection;

use super::{read_state, renew_grants, ttl_millis, State};
use crate::commands::{self, MAX, OWNER, PERMITS};
use crate::error::bounded;
use crate::BACKEND;

/// A semaphore's permits as the inspect projection returns them.
pub(super) struct Semaphore {
    /// The stored `max`.
    max: u32,
    /// The live permits, oldest first, each read as a lock's holder is.
    live: Vec<State>,
}

impl Semaphore {
    /// The permits of `doc`, `None` if it never had any.
    pub(super) fn read(doc: &Document) -> Result<Option<Self>> {
        let Ok(entries) = doc.get_array(PERMITS) else {
            return Ok(None);
        };
        let live = entries
            .iter()
            .map(|e| match e {
                Bson::Document(d) => State::read(d),
                other => Err(super::malformed(PERMITS, other)),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Self {
            max: stored_max(doc),
            live,
        }))
    }
}

/// The `max` stored with the permits (0 if there is none).
fn stored_max(doc: &Document) -> u32 {
    let max = match doc.get(MAX) {
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Int32(n)) => i64::from(*n),
        _ => 0,
    };
    u32::try_from(max).unwrap_or(u32::MAX)
}

/// The size of the semaphore `state` shows held live, if any: what refuses a lock request.
pub(super) fn held_size(state: &State) -> Option<u32> {
    state
        .semaphore
        .as_ref()
        .filter(|s| !s.live.is_empty())
        .map(|s| s.max)
}

/// The refusal of a request for `req.permits` on a name held with `held` (1: as a lock).
pub(super) fn other_permits(req: &AcquireRequest, held: u32) -> Error {
    Error::invalid(format!(
        "{} is held with {held} permit(s), not the {} this request asks for",
        req.name, req.permits
    ))
    .with_backend(BACKEND)
    .with_lock(&req.name)
}

/// What an operator sees of `state`: its lock if held, else its oldest live permit, with how
/// many are held of how many; `None` when neither is held.
pub(super) fn held_info(mut state: State, name: &LockName) -> Result<Option<LockInfo>> {
    if state.is_held() {
        return state.info(name).map(Some);
    }
    let Some(mut sem) = state.semaphore.take().filter(|s| !s.live.is_empty()) else {
        return Ok(None);
    };
    let held = u32::try_from(sem.live.len()).unwrap_or(u32::MAX);
    let oldest = sem.live.remove(0);
    Ok(Some(oldest.info(name)?.with_permits(held, sem.max)))
}

/// One attempt at a permit: one `findAndModify` (see [`commands::permit_pipeline`]) and, when
/// every permit is taken, one read of the soonest expiry, as the lock's attempt reads its
/// holder's. A duplicate key or a missing reply (a racing first upsert) is tried once more.
pub(crate) async fn acquire(
    locks: &Collection<Document>,
    timeout: Duration,
    req: &AcquireRequest,
) -> Result<Attempt> {
    let ttl_ms = ttl_millis(req.ttl);
    let owner = req.owner.text();
    for _ in 0..2 {
        let sent_at = Instant::now();
        let op = locks
            .find_one_and_update(
                commands::by_name(req.name.as_str()),
                commands::permit_pipeline(&owner, ttl_ms, req.permits),
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .projection(commands::permit_projection());
        let doc = match bounded(timeout, "acquiring a permit failed", op.into_future()).await {
            Ok(Some(doc)) => doc,
            Ok(None) => continue,
            Err(e) if e.duplicate_key => continue,
            Err(e) => return Err(e.with_lock(&req.name)),
        };
        // The pipeline cleared an expired lock holder and dropped expired permits: what is
        // left is live.
        if matches!(doc.get(OWNER), Some(Bson::String(_))) {
            return Err(other_permits(req, 1));
        }
        let live = Semaphore::read(&doc)
            .map_err(|e| e.with_lock(&req.name))?
            .filter(|s| !s.live.is_empty());
        if let Some(sem) = live {
            if sem.max != req.permits {
                return Err(other_permits(req, sem.max));
            }
            if let Some(mine) = sem
                .live
                .iter()
                .find(|p| p.owner.as_deref() == Some(&*owner))
            {
                return Ok(Attempt::Granted(Grant::new(
                    req.name.clone(),
                    req.owner.clone(),
                    FencingToken(mine.token),
                    mine.count,
                    Duration::from_millis(ttl_ms as u64),
                    sent_at,
                )));
            }
        }
        // Every permit is taken: wake no later than the soonest of their leases ends.
        let expires_in = read_state(locks, timeout, &req.name, false)
            .await?
            .and_then(|s| s.semaphore)
            .and_then(|s| s.live.iter().filter_map(|p| p.remaining).min());
        return Ok(Attempt::Held { expires_in });
    }
    Ok(Attempt::Held { expires_in: None })
}

/// The permit's token as stored; `None` for one beyond `i64`, which was never issued.
fn stored_token(grant: &Grant) -> Option<i64> {
    i64::try_from(grant.token.0).ok()
}

/// What one `updateOne` did.
struct Done {
    /// The filter found the document.
    matched: bool,
    /// The pipeline changed it: the permit's update applied.
    modified: bool,
}

/// One `updateOne` of `name`'s document filtered by `filter`.
async fn update(
    locks: &Collection<Document>,
    timeout: Duration,
    what: &'static str,
    filter: Document,
    pipeline: Vec<Document>,
) -> Result<Done> {
    let done = bounded(
        timeout,
        what,
        locks.update_one(filter, pipeline).into_future(),
    )
    .await
    .map_err(|e| e.error)?;
    Ok(Done {
        matched: done.matched_count == 1,
        modified: done.modified_count == 1,
    })
}

/// Gives up one hold of the permit `grant`: `true` if it was still held live. A permit found
/// expired is removed, so the document shows only what counts (as a lock's release frees a
/// document whose grant expired).
pub(crate) async fn release(
    locks: &Collection<Document>,
    timeout: Duration,
    grant: &Grant,
) -> Result<bool> {
    let Some(token) = stored_token(grant) else {
        return Ok(false);
    };
    let (name, owner) = (grant.name.as_str(), grant.owner.text());
    let what = "releasing a permit failed";
    let filter = commands::permit_of(name, &owner, token);
    let one = commands::permit_release_pipeline(token, 1, true);
    let done = update(locks, timeout, what, filter.clone(), one).await?;
    if done.modified {
        return Ok(true);
    }
    // Still recorded, unchanged: past its lease. Not recorded: released or removed.
    if done.matched {
        let all = commands::permit_release_pipeline(token, i64::MAX, false);
        update(locks, timeout, what, filter, all).await?;
    }
    Ok(false)
}

/// Extends the permit `grant` to `ttl` from the server's now (never shortened), if it is
/// still held live.
pub(crate) async fn renew(
    locks: &Collection<Document>,
    timeout: Duration,
    grant: &Grant,
    ttl: Duration,
) -> Result<Duration> {
    let ttl_ms = ttl_millis(ttl);
    let not_held = || {
        lost(
            &grant.name,
            "the permit is no longer held by this grant (expired, released or taken over)",
        )
    };
    let Some(token) = stored_token(grant) else {
        return Err(not_held());
    };
    let owner = grant.owner.text();
    let done = update(
        locks,
        timeout,
        "renewing a permit failed",
        commands::permit_of(grant.name.as_str(), &owner, token),
        commands::permit_renew_pipeline(token, ttl_ms),
    )
    .await
    .map_err(|e| e.with_lock(&grant.name))?;
    // Matched without a change: past its lease (not renewed), or live with a lease already
    // running past `ttl` from now (renewed: never shortened). Live now means live at the
    // update, which one read of the permits by the server's clock tells.
    let renewed = done.modified
        || (done.matched
            && read_state(locks, timeout, &grant.name, false)
                .await?
                .and_then(|s| s.semaphore)
                .is_some_and(|s| {
                    s.live
                        .iter()
                        .any(|p| p.owner.as_deref() == Some(&*owner) && p.token == grant.token.0)
                }));
    if renewed {
        Ok(Duration::from_millis(ttl_ms as u64))
    } else {
        Err(not_held())
    }
}

/// Renews `grants`, locks and permits: the locks in the batches of [`renew_grants`], each
/// permit by its own request, all of them at once.
pub(crate) async fn renew_all(
    locks: &Collection<Document>,
    timeout: Duration,
    grants: &[(Grant, Duration)],
) -> Vec<Result<Duration>> {
    let (permits, lock_grants): (Vec<_>, Vec<_>) =
        (0..grants.len()).partition(|&i| grants[i].0.permits > 1);
    if permits.is_empty() {
        return renew_grants(locks, timeout, grants).await;
    }
    let batch: Vec<(Grant, Duration)> = lock_grants.iter().map(|&i| grants[i].clone()).collect();
    let permit_renewals = permits
        .iter()
        .map(|&i| renew(locks, timeout, &grants[i].0, grants[i].1));
    let (of_locks, of_permits) = futures::join!(
        renew_grants(locks, timeout, &batch),
        futures::future::join_all(permit_renewals)
    );
    let mut results: Vec<Option<Result<Duration>>> = grants.iter().map(|_| None).collect();
    for (i, r) in lock_grants.into_iter().zip(of_locks) {
        results[i] = Some(r);
    }
    for (i, r) in permits.into_iter().zip(of_permits) {
        results[i] = Some(r);
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Backend, "no renewal result"))))
        .collect()
}

/// An operator's force-release of the live permit of `name` with `token`, all its holds at
/// once: whether there was one. The other permits are untouched.
pub(crate) async fn force_release(
    locks: &Collection<Document>,
    timeout: Duration,
    name: &LockName,
    token: FencingToken,
) -> Result<bool> {
    let Ok(token) = i64::try_from(token.0) else {
        return Ok(false);
    };
    let done = update(
        locks,
        timeout,
        "force-releasing a permit failed",
        commands::permit_with_token(name.as_str(), token),
        commands::permit_release_pipeline(token, i64::MAX, true),
    )
    .await
    .map_err(|e| e.with_lock(name))?;
    // Removing a live permit always changes the document.
    Ok(done.modified)
}

/// `owner`'s own live permit of `name`, as a grant (with its hold count and the semaphore's
/// size) that releases one hold; `None` if it holds none. Read directly, not through inspect,
/// which shows only the oldest permit.
pub(crate) async fn own_permit(
    locks: &Collection<Document>,
    timeout: Duration,
    name: &LockName,
    owner: &OwnerId,
    ttl: Duration,
) -> Result<Option<Grant>> {
    let Some(sem) = read_state(locks, timeout, name, false)
        .await?
        .and_then(|s| s.semaphore)
    else {
        return Ok(None);
    };
    let text = owner.text();
    let Some(mine) = sem.live.iter().find(|p| p.owner.as_deref() == Some(&*text)) else {
        return Ok(None);
    };
    let mut grant = Grant::new(
        name.clone(),
        owner.clone(),
        FencingToken(mine.token),
        mine.count,
        ttl,
        Instant::now(),
    );
    grant.permits = sem.max;
    Ok(Some(grant))
}
