//! The server operations behind [`MongoLock`](crate::MongoLock), each one or two commands on
//! the lock collection within the operation timeout: acquire, release, hand-over, renew, read.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, HandOver};
use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockInfo, LockName, Result};
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::Collection;

use crate::commands::{self, COUNT, GRANTED_AT, OWNER, REMAINING_MS, TOKEN};
use crate::error::bounded;
use crate::BACKEND;

pub(crate) mod elect;
pub(crate) mod permit;
mod renew;

pub(crate) use renew::{renew_grant, renew_grants, RENEW_BATCH};

/// One acquire attempt for `req` (see [`AcquireJob::run`]).
pub(crate) async fn acquire(
    locks: &Collection<Document>,
    timeout: Duration,
    req: &AcquireRequest,
) -> Result<Attempt> {
    if req.permits > 1 {
        return permit::acquire(locks, timeout, req).await;
    }
    let job = AcquireJob {
        locks: locks.clone(),
        req: req.clone(),
        timeout,
    };
    job.run().await
}

/// One acquire request and the collection and time limit it runs with.
struct AcquireJob {
    locks: Collection<Document>,
    req: AcquireRequest,
    timeout: Duration,
}

impl AcquireJob {
    async fn run(&self) -> Result<Attempt> {
        let ttl_ms = ttl_millis(self.req.ttl);
        // A duplicate key means a concurrent upsert created the document first; the next try
        // finds it and decides normally. mongod retries such upserts itself, so a second
        // duplicate key is all but impossible and is answered as "held".
        for _ in 0..2 {
            let sent_at = Instant::now();
            let op = self
                .locks
                .find_one_and_update(
                    commands::by_name(self.req.name.as_str()),
                    commands::acquire_pipeline(&self.req.owner.text(), ttl_ms),
                )
                .upsert(true)
                .return_document(ReturnDocument::After)
                .projection(commands::grant_projection());
            let doc = match bounded(self.timeout, "acquire failed", op.into_future()).await {
                Ok(doc) => doc,
                Err(e) if e.duplicate_key => continue,
                Err(e) => return Err(e.error.with_lock(&self.req.name)),
            };
            // An upsert returning the document after the update always has one on mongod; the
            // test server can answer a racing first upsert of a name with none. Like a
            // duplicate key, that means another contender created the document: try again.
            let Some(doc) = doc else {
                continue;
            };
            let state = State::read(&doc).map_err(|e| e.with_lock(&self.req.name))?;
            if state.owner.as_deref() != Some(&*self.req.owner.text()) {
                // Someone else holds it. The reply carries no server time, so ask how long the
                // holder's lease runs, by the server's clock, to wake no later than its end.
                let state = read_state(&self.locks, self.timeout, &self.req.name, false).await?;
                // Refused for live permits: the name is a semaphore's, of another size.
                if let Some(max) = state.as_ref().and_then(permit::held_size) {
                    return Err(permit::other_permits(&self.req, max));
                }
                let expires_in = state.filter(State::is_held).and_then(|s| s.remaining);
                return Ok(Attempt::Held { expires_in });
            }
            return Ok(Attempt::Granted(Grant::new(
                self.req.name.clone(),
                self.req.owner.clone(),
                FencingToken(state.token),
                state.count,
                Duration::from_millis(ttl_ms as u64),
                sent_at,
            )));
        }
        Ok(Attempt::Held { expires_in: None })
    }
}

/// The lease in whole milliseconds, rounded up: the server counts milliseconds, and rounding
/// down could turn 1.5 ms into 1 ms (or 0.5 ms into nothing).
fn ttl_millis(ttl: Duration) -> i64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX).max(1)
}

/// A lock document as the projections return it.
struct State {
    owner: Option<String>,
    count: u32,
    token: u64,
    remaining: Option<Duration>,
    /// When the grant began, in ms since the epoch by the server's clock.
    since_ms: Option<i64>,
    /// The name's permits, if it ever had any (never for a permit itself).
    semaphore: Option<permit::Semaphore>,
    /// What the holder of `token` proclaimed, if it did and the read asked for it.
    value: Option<String>,
}

impl State {
    fn read(doc: &Document) -> Result<Self> {
        let owner = match doc.get(OWNER) {
            Some(Bson::String(s)) => Some(s.clone()),
            None | Some(Bson::Null) => None,
            Some(other) => return Err(malformed(OWNER, other)),
        };
        let int = |field: &str| -> Result<i64> {
            match doc.get(field) {
                None | Some(Bson::Null) => Ok(0),
                Some(Bson::Int64(n)) => Ok(*n),
                Some(Bson::Int32(n)) => Ok(i64::from(*n)),
                Some(other) => Err(malformed(field, other)),
            }
        };
        let count = u32::try_from(int(COUNT)?).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                "the lock document's hold count is out of range",
            )
        })?;
        let token = u64::try_from(int(TOKEN)?).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                "the lock document's fencing counter is negative",
            )
        })?;
        // `remaining_ms` is null when there is no expiry (a free lock).
        let remaining = match doc.get(REMAINING_MS) {
            Some(Bson::Int64(ms)) => Some(*ms),
            Some(Bson::Int32(ms)) => Some(i64::from(*ms)),
            Some(Bson::Double(ms)) => Some(*ms as i64),
            _ => None,
        }
        .map(|ms| Duration::from_millis(ms.max(0) as u64));
        let since_ms = match doc.get(GRANTED_AT) {
            Some(Bson::DateTime(at)) => Some(at.timestamp_millis()),
            _ => None,
        };
        Ok(Self {
            owner,
            count,
            token,
            remaining,
            since_ms,
            semaphore: permit::Semaphore::read(doc)?,
            value: elect::value_of(doc, token),
        })
    }

    /// What an operator sees of a held lock.
    fn info(self, name: &LockName) -> Result<LockInfo> {
        let owner = self.owner.as_deref().unwrap_or_default();
        let owner = distlock_api::OwnerId::parse(owner).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                format!("the lock document's owner {owner:?} is not an owner id"),
            )
            .with_lock(name)
        })?;
        let mut info = LockInfo::new(owner, self.count, FencingToken(self.token), self.remaining);
        if let Some(ms) = self.since_ms {
            info = info.with_since_unix_ms(ms);
        }
        Ok(match self.value {
            Some(value) => info.with_value(value),
            None => info,
        })
    }

    /// Held by someone, by the server's clock.
    fn is_held(&self) -> bool {
        self.owner.is_some() && self.remaining.is_some_and(|r| !r.is_zero())
    }
}

fn malformed(field: &str, value: &Bson) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!(
            "the lock document's {field:?} is a {:?}, not what this backend writes; is the \
             collection used for something else?",
            value.element_type()
        ),
    )
}

/// The lock's document with the lease left by the server's clock; `None` if it has none. With
/// the leader's value only if `value` (inspect asks for it; a waiter does not).
async fn read_state(
    locks: &Collection<Document>,
    timeout: Duration,
    name: &LockName,
    value: bool,
) -> Result<Option<State>> {
    let read = async {
        let cursor = locks
            .aggregate(commands::inspect_pipeline(name.as_str(), value))
            .await?;
        cursor.try_collect::<Vec<Document>>().await
    };
    let docs = bounded(timeout, "inspect failed", read)
        .await
        .map_err(|e| e.with_lock(name))?;
    docs.first()
        .map(State::read)
        .transpose()
        .map_err(|e| e.with_lock(name))
}

/// Gives up one hold of `grant`: `true` if it still held the lock. One `updateOne` of the
/// grant's document (found by equalities the `_id` index answers) whose pipeline gives up the
/// hold only if the lease is live by the server's clock: an applied release always changes the
/// document, so the modified count says whether it applied. A grant found recorded but expired
/// (not taken over) is then cleared so the document shows the lock free; that changes nothing
/// else, since an expired holder already counts as none.
pub(crate) async fn release_grant(
    locks: &Collection<Document>,
    timeout: Duration,
    grant: &Grant,
) -> Result<bool> {
    let owner_text = grant.owner.text();
    let (name, owner) = (grant.name.as_str(), &*owner_text);
    let Ok(token) = i64::try_from(grant.token.0) else {
        return Ok(false);
    };
    let done = bounded(
        timeout,
        "release failed",
        locks
            .update_one(
                commands::grant_of(name, owner, token),
                commands::release_pipeline(),
            )
            .into_future(),
    )
    .await
    .map_err(|e| e.error)?;
    if done.modified_count == 1 {
        return Ok(true);
    }
    // Matched but unchanged: the grant is still recorded, its lease ended. Unmatched: released
    // or taken over (a token is never issued twice), nothing to tidy.
    if done.matched_count == 1 {
        free_expired(locks, timeout, "release failed", name, owner, token).await?;
    }
    Ok(false)
}

/// Frees the lock document of `name` if its grant `(owner, token)` has expired (by the
/// server's clock) and nobody took it over: what a release of a grant that no longer holds
/// leaves tidy. `what` names the operation in an error.
async fn free_expired(
    locks: &Collection<Document>,
    timeout: Duration,
    what: &'static str,
    name: &str,
    owner: &str,
    token: i64,
) -> Result<()> {
    bounded(
        timeout,
        what,
        locks
            .update_one(
                commands::grant_of(name, owner, token),
                commands::free_if_expired(),
            )
            .into_future(),
    )
    .await
    .map_err(|e| e.error)?;
    Ok(())
}

/// Hands the lock from `from` to `to` (see [`commands::hand_over_pipeline`]): one
/// `findAndModify` of the grant's document (found by equalities the `_id` index answers) whose
/// pipeline, if `from` holds it live, passes a last hold on with a fresh token or gives up one
/// hold of several, and if `from`'s lease has ended marks the lock free (the tidy-up a release
/// makes). The document returned says which.
pub(crate) async fn hand_over_grant(
    locks: &Collection<Document>,
    timeout: Duration,
    from: &Grant,
    to: &AcquireRequest,
) -> Result<HandOver> {
    let owner_text = from.owner.text();
    let (name, owner) = (from.name.as_str(), &*owner_text);
    let Ok(token) = i64::try_from(from.token.0) else {
        return Ok(HandOver::Released(false));
    };
    let ttl_ms = ttl_millis(to.ttl);
    let sent_at = Instant::now();
    let after = bounded(
        timeout,
        "hand-over failed",
        locks
            .find_one_and_update(
                commands::grant_of(name, owner, token),
                commands::hand_over_pipeline(&to.owner.text(), ttl_ms),
            )
            .return_document(ReturnDocument::After)
            .projection(commands::grant_projection())
            .into_future(),
    )
    .await
    .map_err(|e| e.error)?;
    // No document: released or taken over (a token is never issued twice).
    if let Some(doc) = after {
        let state = State::read(&doc)?;
        // The token moves only when the lock was passed on; a grant whose lease had ended is
        // marked free, so its owner is gone.
        if state.token == from.token.0 {
            return Ok(HandOver::Released(state.owner.as_deref() == Some(owner)));
        }
        if state.owner.as_deref() != Some(&*to.owner.text()) || state.count != 1 {
            return Err(Error::new(
                ErrorKind::Backend,
                "the hand-over's answer shows neither the old grant nor the new one",
            )
            .with_backend(BACKEND));
        }
        return Ok(HandOver::Handed(Grant::new(
            to.name.clone(),
            to.owner.clone(),
            FencingToken(state.token),
            1,
            Duration::from_millis(ttl_ms as u64),
            sent_at,
        )));
    }
    Ok(HandOver::Released(false))
}

/// The lock `name` as an operator sees it, `None` unless it is held.
pub(crate) async fn inspect(
    locks: &Collection<Document>,
    timeout: Duration,
    name: &LockName,
) -> Result<Option<LockInfo>> {
    match read_state(locks, timeout, name, true).await? {
        Some(state) => permit::held_info(state, name),
        None => Ok(None),
    }
}

/// The held locks whose names start with `prefix`, in name order.
pub(crate) async fn list(
    locks: &Collection<Document>,
    timeout: Duration,
    prefix: &str,
) -> Result<Vec<(LockName, LockInfo)>> {
    let read = async {
        let mut cursor = locks.aggregate(commands::list_pipeline(prefix)).await?;
        let mut docs = Vec::new();
        while let Some(doc) = cursor.try_next().await? {
            // In name order: the first name past the prefix ends the listing.
            match doc.get_str("_id") {
                Ok(id) if id.starts_with(prefix) => docs.push(doc),
                Ok(id) if id < prefix => {}
                _ => break,
            }
        }
        Ok::<_, mongodb::error::Error>(docs)
    };
    let docs = bounded(timeout, "listing failed", read)
        .await
        .map_err(|e| e.error)?;
    let mut held = Vec::new();
    for doc in docs {
        let Some(name) = doc.get_str("_id").ok().and_then(|n| LockName::new(n).ok()) else {
            continue;
        };
        let state = State::read(&doc).map_err(|e| e.with_lock(&name))?;
        if let Some(info) = permit::held_info(state, &name)? {
            held.push((name, info));
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    #[test]
    fn ttl_is_whole_milliseconds_rounded_up() {
        assert_eq!(ttl_millis(Duration::from_millis(400)), 400);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
        assert_eq!(ttl_millis(Duration::from_secs(7 * 24 * 3600)), 604_800_000);
    }

    #[test]
    fn state_reads_what_the_projection_returns() {
        let s = State::read(&doc! { "_id": "n", "owner": "me", "count": 2_i64, "token": 7_i64, "remaining_ms": 250_i64 }).unwrap();
        assert_eq!(s.owner.as_deref(), Some("me"));
        assert_eq!((s.count, s.token), (2, 7));
        assert_eq!(s.remaining, Some(Duration::from_millis(250)));
        assert!(s.is_held());
        let expired = State::read(
            &doc! { "owner": "me", "count": 1_i64, "token": 7_i64, "remaining_ms": -5_i64 },
        )
        .unwrap();
        assert!(!expired.is_held());
        let free = State::read(&doc! { "owner": Bson::Null, "count": 0_i64, "token": 7_i64, "remaining_ms": Bson::Null }).unwrap();
        assert!(!free.is_held());
        assert_eq!(
            State::read(&doc! { "owner": 5 }).err().map(|e| e.kind()),
            Some(ErrorKind::Backend)
        );
    }
}
