//! Renewals: one grant's ([`renew_grant`]) and the watchdog's batches ([`renew_grants`]).
//!
//! Every renewal finds its documents by equalities the `_id` index answers (`_id`, owner and
//! token of one grant; `$in` on `_id` for a batch) and judges the lease inside the update, by
//! the server's clock: a lease that has ended is never extended.

use std::collections::HashSet;
use std::future::IntoFuture;
use std::time::Duration;

use distlock_api::backend::lost;
use distlock_api::{Error, ErrorKind, Grant, Result};
use futures::TryStreamExt;
use mongodb::bson::Document;
use mongodb::Collection;

use super::{read_state, ttl_millis, State};
use crate::commands;
use crate::error::bounded;

/// Extends the lease of `grant` to `ttl` from now, if it still holds the lock live: one
/// `updateOne` of the grant's document whose pipeline extends the lease only if it is live.
/// A change means it applied. A match without a change is either a lease that had ended (not
/// applied) or a live one already running past `ttl` from now (applied: it is never
/// shortened); one read of the lease by the server's clock tells them apart (a lease never
/// comes back to life under the same token, so live now means live at the update).
pub(crate) async fn renew_grant(
    locks: &Collection<Document>,
    timeout: Duration,
    grant: &Grant,
    ttl: Duration,
) -> Result<Duration> {
    let ttl_ms = ttl_millis(ttl);
    let not_held = || {
        lost(
            &grant.name,
            "the lock is no longer held by this grant (expired, released or taken over)",
        )
    };
    let Ok(token) = i64::try_from(grant.token.0) else {
        return Err(not_held());
    };
    let owner = grant.owner.text();
    let done = bounded(
        timeout,
        "renew failed",
        locks
            .update_one(
                commands::grant_of(grant.name.as_str(), &owner, token),
                commands::renew_pipeline(ttl_ms),
            )
            .into_future(),
    )
    .await
    .map_err(|e| e.with_lock(&grant.name))?;
    let renewed = done.modified_count == 1
        || (done.matched_count == 1 && {
            let state = read_state(locks, timeout, &grant.name, false).await?;
            state.is_some_and(|s| {
                s.is_held() && s.owner.as_deref() == Some(&*owner) && s.token == grant.token.0
            })
        });
    if renewed {
        Ok(Duration::from_millis(ttl_ms as u64))
    } else {
        Err(not_held())
    }
}

/// Extends the lease of every lock that one of `grants` (name, owner and token) still holds
/// live, then reads back which those are: the (name, token) pairs now renewed. Two requests
/// for the whole batch, both by `$in` on `_id`.
async fn renew_held(
    locks: &Collection<Document>,
    timeout: Duration,
    grants: &[(&str, &str, i64)],
    ttl_ms: i64,
) -> Result<HashSet<(String, i64)>> {
    let update = locks
        .update_many(
            commands::named(grants),
            commands::renew_batch_pipeline(grants, ttl_ms),
        )
        .into_future();
    bounded(timeout, "renew failed", update)
        .await
        .map_err(|e| e.error)?;
    let read = async {
        let cursor = locks.aggregate(commands::renewed_pipeline(grants)).await?;
        cursor.try_collect::<Vec<Document>>().await
    };
    let docs = bounded(timeout, "renew failed", read)
        .await
        .map_err(|e| e.error)?;
    let asked: HashSet<(&str, &str, i64)> = grants.iter().copied().collect();
    let mut held = HashSet::new();
    for doc in &docs {
        let Ok(name) = doc.get_str("_id") else {
            continue;
        };
        let state = State::read(doc)?;
        let (Some(owner), Ok(token)) = (state.owner.as_deref(), i64::try_from(state.token)) else {
            continue;
        };
        // Still this grant's and live now, so live at the update, which extended it.
        if state.is_held() && asked.contains(&(name, owner, token)) {
            held.insert((name.to_owned(), token));
        }
    }
    Ok(held)
}

/// Renews `grants`, each to its own TTL: one request pair per TTL shared by several grants,
/// the single request of [`renew_grant`] for a TTL of one grant.
pub(crate) async fn renew_grants(
    locks: &Collection<Document>,
    timeout: Duration,
    grants: &[(Grant, Duration)],
) -> Vec<Result<Duration>> {
    // Grants renewed for one TTL share a request pair; in practice that is every grant of
    // the client (each has an owner id of its own, which the filter checks per grant).
    let mut groups: Vec<(i64, Vec<usize>)> = Vec::new();
    for (i, (_, ttl)) in grants.iter().enumerate() {
        let key = ttl_millis(*ttl);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let mut results: Vec<Option<Result<Duration>>> = grants.iter().map(|_| None).collect();
    for (ttl_ms, members) in groups {
        if let [i] = members[..] {
            // One request instead of two.
            results[i] = Some(renew_grant(locks, timeout, &grants[i].0, grants[i].1).await);
            continue;
        }
        // A token beyond i64 was never issued: such a grant matches nothing, and is lost.
        let owners: Vec<String> = members
            .iter()
            .map(|&i| grants[i].0.owner.to_string())
            .collect();
        let asked: Vec<(&str, &str, i64)> = members
            .iter()
            .zip(&owners)
            .filter_map(|(&i, owner)| {
                let grant = &grants[i].0;
                Some((
                    grant.name.as_str(),
                    owner.as_str(),
                    i64::try_from(grant.token.0).ok()?,
                ))
            })
            .collect();
        match renew_held(locks, timeout, &asked, ttl_ms).await {
            Ok(held) => {
                for &i in &members {
                    let grant = &grants[i].0;
                    let renewed = i64::try_from(grant.token.0)
                        .is_ok_and(|t| held.contains(&(grant.name.as_str().to_owned(), t)));
                    results[i] = Some(if renewed {
                        Ok(Duration::from_millis(ttl_ms as u64))
                    } else {
                        Err(lost(
                            &grant.name,
                            "the lock is no longer held by this grant (expired, released \
                             or taken over)",
                        ))
                    });
                }
            }
            Err(e) => {
                for &i in &members {
                    let e = Error::new(e.kind(), e.to_string()).with_lock(&grants[i].0.name);
                    results[i] = Some(Err(e));
                }
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Backend, "no renewal result"))))
        .collect()
}

/// How many grants one batch renewal confirms: two requests for up to this many locks. The
/// names go in one `$in` list (at most 255 bytes each, so a request stays far below MongoDB's
/// 16 MiB document limit). Large, because a request's cost on the test server is mostly fixed:
/// with 10,000 lock documents it confirmed 3.6k locks a second in batches of 64, 11k in batches
/// of 256 and 23k in batches of 1,024 (measured while the batch's filter had an `$expr`, which
/// made every request scan the collection; not measured again since).
pub(crate) const RENEW_BATCH: usize = 512;
