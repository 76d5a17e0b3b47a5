//! Elections: the leader's value, proclaimed under its grant and read back by inspect.
//!
//! The value lives in the lock document as `{ epoch, text }` (see [`commands::VALUE`]). A
//! proclaim is one `updateOne` with the filter of release and renew (the grant's `_id`, owner
//! and token) whose pipeline writes the value only while the lease is live by `$$NOW`, so a
//! deposed leader's proclaim writes nothing. Nothing
//! on the lock's own path reads or clears the value: a later grant of the name bumps the
//! token, and a value stamped with an older token is not reported.

use std::future::IntoFuture;
use std::time::Duration;

use distlock_api::{Grant, Result};
use mongodb::bson::{Bson, Document};
use mongodb::Collection;

use super::read_state;
use crate::commands::{self, VALUE, VALUE_EPOCH, VALUE_TEXT};
use crate::error::bounded;

/// Makes `value` the value of the election `grant` leads, if it still holds the name live by
/// the server's clock: `true` if it did (and the value is written), `false` otherwise.
pub(crate) async fn proclaim(
    locks: &Collection<Document>,
    timeout: Duration,
    grant: &Grant,
    value: &str,
) -> Result<bool> {
    // A token beyond i64 was never issued; a semaphore's permit is no leader (the filter
    // looks at the lock's holder, which a permit never is).
    let Ok(token) = i64::try_from(grant.token.0) else {
        return Ok(false);
    };
    if grant.permits > 1 {
        return Ok(false);
    }
    let owner = grant.owner.text();
    let done = bounded(
        timeout,
        "proclaim failed",
        locks
            .update_one(
                commands::grant_of(grant.name.as_str(), &owner, token),
                commands::proclaim_pipeline(token, value),
            )
            .into_future(),
    )
    .await
    .map_err(|e| e.with_lock(&grant.name))?;
    if done.modified_count == 1 {
        return Ok(true);
    }
    if done.matched_count == 0 {
        return Ok(false);
    }
    // Matched without a change: the lease had ended (nothing written), or the same value was
    // already there under this epoch (written). Live now means live at the update: a lease
    // never comes back to life under the same token.
    let state = read_state(locks, timeout, &grant.name, false).await?;
    Ok(state.is_some_and(|s| {
        s.is_held() && s.owner.as_deref() == Some(&*owner) && s.token == grant.token.0
    }))
}

/// The value `doc` holds for the grant of `token`: `None` if there is none, or if an earlier
/// grant wrote it (or it is not what this backend writes).
pub(super) fn value_of(doc: &Document, token: u64) -> Option<String> {
    let stored = doc.get_document(VALUE).ok()?;
    let epoch = match stored.get(VALUE_EPOCH)? {
        Bson::Int64(n) => u64::try_from(*n).ok()?,
        Bson::Int32(n) => u64::try_from(*n).ok()?,
        _ => return None,
    };
    if epoch != token {
        return None;
    }
    stored.get_str(VALUE_TEXT).ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    #[test]
    fn a_value_is_read_only_under_its_epoch() {
        let d = doc! { "token": 7_i64, "value": { "epoch": 7_i64, "text": "a:1" } };
        assert_eq!(value_of(&d, 7).as_deref(), Some("a:1"));
        assert_eq!(value_of(&d, 8), None, "an earlier grant's value");
        assert_eq!(value_of(&doc! { "token": 7_i64 }, 7), None);
        let empty = doc! { "value": { "epoch": 3_i32, "text": "" } };
        assert_eq!(value_of(&empty, 3).as_deref(), Some(""));
    }
}
