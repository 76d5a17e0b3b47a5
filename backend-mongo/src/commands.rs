//! The filters and update pipelines the backend sends, in one place.
//!
//! One document per lock name, never deleted by the backend:
//!
//! ```text
//! { _id: <lock name>, owner: <owner id> | null, count: <i64 hold count>,
//!   token: <i64 fencing counter>, expires_at: <date> | null, granted_at: <date>,
//!   value: { epoch: <i64 token>, text: <string> } }
//! ```
//!
//! Every expiry judgement uses `$$NOW`, the server's clock, evaluated once per command. The
//! operators are those of MongoDB 5.0 (`$dateAdd` and `$dateDiff` are the newest), chosen to
//! also run on the MongoDB-compatible server the tests use: it lacks date arithmetic with
//! `$add`/`$subtract`, `$max` of dates and expressions in `find`/`findAndModify` projections,
//! so none of those is used.

use mongodb::bson::{doc, Bson, Document};

mod permit;

/// The holder's owner id, or `null` when the lock is free.
pub const OWNER: &str = "owner";
/// The holder's hold count (reentrant acquires), an `Int64`.
pub const COUNT: &str = "count";
/// The fencing counter: the token of the current or latest grant, an `Int64`; never reset.
pub const TOKEN: &str = "token";
/// When the holder's lease ends by the server's clock, a BSON date, or `null` when free.
pub const EXPIRES_AT: &str = "expires_at";
/// When the current (or latest) grant began by the server's clock, a BSON date: what an
/// operator sees, never used to judge a lease.
pub const GRANTED_AT: &str = "granted_at";
/// A semaphore's permits held now or lately, oldest first (absent until the name's first
/// permit): each `{ owner, count, token, expires_at, granted_at }` as the lock's own fields.
pub const PERMITS: &str = "permits";
/// The semaphore's size (its `max`), an `Int64`: set by the grant of a permit while none is
/// live; what other requests for a permit must ask for while any is.
pub const MAX: &str = "max";
/// Bumped (an `Int64`) by every release that frees a permit: the update the change streams pass
/// on to waiters, as they pass a lock's `owner` becoming `null`.
pub const FREED: &str = "freed";
/// What an election's leader proclaimed, `{ epoch, text }`: absent until the name's first
/// proclaim, then overwritten by each one (one slot per name). `epoch` is the token of the
/// grant that wrote it; the value is reported only while that token is the holder's, so a
/// value left by an earlier grant (a takeover rewrites the document in place) is never shown.
pub const VALUE: &str = "value";
/// The token of the grant that proclaimed [`VALUE`], an `Int64`.
pub(crate) const VALUE_EPOCH: &str = "epoch";
/// The proclaimed text.
pub(crate) const VALUE_TEXT: &str = "text";
/// Computed by the projections, never stored: the lease left by the server's clock, in ms.
pub(crate) const REMAINING_MS: &str = "remaining_ms";

/// The filter of every acquire: equality on `_id` alone, because an upsert's filter may not
/// use `$expr` and an equality lets the server retry a racing upsert's duplicate-key error.
pub(crate) fn by_name(name: &str) -> Document {
    doc! { "_id": name }
}

/// The acquire's update pipeline. It takes the lock when nobody holds it live (no document
/// yet, owner `null`, or `expires_at <= $$NOW`): owner = us, count = 1, token + 1, expiry =
/// now + ttl. When we already hold it live it adds a hold, keeps the token and never shortens
/// the lease. Otherwise the document stays as it was, which the server sees as a no-op write.
pub(crate) fn acquire_pipeline(owner: &str, ttl_ms: i64) -> Vec<Document> {
    let held = lock_held();
    let until = lease_end(ttl_ms);
    vec![
        doc! { "$set": {
            // Live permits keep a lock out too: a lock is a semaphore of one permit, and the
            // name is held with another number of them (the reply's read then says which).
            "_dl_take": { "$and": [
                { "$not": [ held.clone() ] },
                { "$eq": [ { "$size": live_permits() }, 0 ] },
            ] },
            "_dl_mine": { "$and": [ held, { "$eq": [ "$owner", owner ] } ] },
        } },
        doc! { "$set": {
            OWNER: { "$cond": [ { "$or": ["$_dl_take", "$_dl_mine"] }, owner, "$owner" ] },
            COUNT: { "$cond": [
                "$_dl_take",
                1_i64,
                { "$cond": [ "$_dl_mine", { "$add": ["$count", 1_i64] }, "$count" ] },
            ] },
            TOKEN: { "$cond": [
                "$_dl_take",
                { "$add": [ { "$ifNull": ["$token", 0_i64] }, 1_i64 ] },
                "$token",
            ] },
            EXPIRES_AT: { "$cond": [
                "$_dl_take",
                until.clone(),
                { "$cond": [ "$_dl_mine", at_least(until), "$expires_at" ] },
            ] },
            GRANTED_AT: { "$cond": [ "$_dl_take", "$$NOW", "$granted_at" ] },
        } },
        doc! { "$unset": ["_dl_take", "_dl_mine"] },
    ]
}

/// Whether the lock (not a permit) is held live by someone.
fn lock_held() -> Document {
    doc! { "$and": [
        { "$ne": [ { "$ifNull": ["$owner", Bson::Null] }, Bson::Null ] },
        { "$gt": [ "$expires_at", "$$NOW" ] },
    ] }
}

/// `$$NOW + ttl_ms`, the end of a lease granted now by the server's clock.
fn lease_end(ttl_ms: i64) -> Document {
    doc! { "$dateAdd": { "startDate": "$$NOW", "unit": "millisecond", "amount": ttl_ms } }
}

/// The later of the current `expires_at` and `until`: a held lease is only ever lengthened,
/// because every guard of the grant (an earlier extend, another reentrant hold) was promised
/// the expiry it has now and keeps trusting it. Written as `$cond`, not `$max`, which the test
/// server does not apply to dates.
fn at_least(until: Document) -> Document {
    later_of(until, "$expires_at")
}

/// The later of the date at `current` (a field path) and `until`, as a `$cond` (see [`at_least`]).
fn later_of(until: Document, current: &str) -> Document {
    doc! { "$cond": [ { "$gt": [until.clone(), current] }, until, current ] }
}

/// What acquire reads back from its own update: the holder (if it is us, we hold the lock).
pub(crate) fn grant_projection() -> Document {
    doc! { OWNER: 1, COUNT: 1, TOKEN: 1 }
}

/// Inspect (and a waiter learning when the holder's lease ends): the holder and the lease
/// left by the server's clock, in one read; with the leader's value for inspect (`value`), not
/// for a waiter, which has no use for it.
pub(crate) fn inspect_pipeline(name: &str, value: bool) -> Vec<Document> {
    vec![doc! { "$match": { "_id": name } }, state_projection(value)]
}

/// Listing: every lock document from `prefix` on in name order, as [`inspect_pipeline`] reads
/// one. The caller stops at the first name past the prefix and skips free locks: a range and
/// a sort on `_id` only, which every server indexes, rather than a regular expression.
pub(crate) fn list_pipeline(prefix: &str) -> Vec<Document> {
    vec![
        doc! { "$match": { "_id": { "$gte": prefix } } },
        doc! { "$sort": { "_id": 1 } },
        state_projection(true),
    ]
}

fn state_projection(value: bool) -> Document {
    let mut fields = doc! {
        OWNER: 1,
        COUNT: 1,
        TOKEN: 1,
        GRANTED_AT: 1,
        REMAINING_MS: { "$dateDiff": {
            "startDate": "$$NOW", "endDate": "$expires_at", "unit": "millisecond",
        } },
        MAX: 1,
        PERMITS: live_permits_seen(),
    };
    if value {
        fields.insert(VALUE, 1);
    }
    doc! { "$project": fields }
}

/// The filter of release and renew: this grant (owner and token) still holds the lock live.
/// `$expr` with `$$NOW` is allowed here because these updates never upsert.
pub(crate) fn held_by(name: &str, owner: &str, token: i64) -> Document {
    doc! {
        "_id": name,
        OWNER: owner,
        TOKEN: token,
        "$expr": { "$gt": [ "$expires_at", "$$NOW" ] },
    }
}

/// The filter of a batch renewal: the documents that one of `grants` (name, owner and token)
/// still holds live. Owner and token are part of the filter, not checked afterwards: a late
/// batch holding an old grant must not lengthen the lease of a newer grant of that name, which
/// its own guard does not expect; and every acquisition has an owner id of its own, so one
/// batch carries many owners. `$in` on `_id` is one index lookup per name on every server,
/// which an `$or` of per-grant filters is not (the test server scans the collection for that);
/// the exact (name, owner, token) triple is then matched by `$expr`, with the triples as a
/// `$literal` so that a name starting with `$` is not read as a field path.
pub(crate) fn held_as(grants: &[(&str, &str, i64)]) -> Document {
    let names: Vec<&str> = grants.iter().map(|&(name, _, _)| name).collect();
    let triples: Vec<Bson> = grants
        .iter()
        .map(|&(name, owner, token)| {
            Bson::Array(vec![
                Bson::from(name),
                Bson::from(owner),
                Bson::Int64(token),
            ])
        })
        .collect();
    doc! {
        "_id": { "$in": names },
        "$expr": { "$and": [
            { "$gt": [ "$expires_at", "$$NOW" ] },
            { "$in": [ [ "$_id", "$owner", "$token" ], { "$literal": triples } ] },
        ] },
    }
}

/// Release: one hold less; at zero the lock is free (owner and expiry `null`). The document,
/// and with it the fencing counter, stays.
pub(crate) fn release_pipeline() -> Vec<Document> {
    vec![
        doc! { "$set": { COUNT: { "$subtract": ["$count", 1_i64] } } },
        doc! { "$set": {
            OWNER: { "$cond": [ { "$gt": ["$count", 0_i64] }, "$owner", Bson::Null ] },
            EXPIRES_AT: { "$cond": [ { "$gt": ["$count", 0_i64] }, "$expires_at", Bson::Null ] },
            COUNT: { "$max": ["$count", 0_i64] },
        } },
    ]
}

/// Hand-over (applied with the [`held_by`] filter of the releasing grant, so only to a lock
/// it holds live): its last hold passes to `to` with the next token from the counter, hold
/// count 1 and a lease of `ttl_ms` from the server's now, as a fresh grant would; a grant with
/// several holds gives up one, as by [`release_pipeline`], and keeps the lock. Decided and
/// written by the server in one step on the one document. `owner` is never set to `null`
/// here: the lock never comes free, so the change streams' filter (which passes the events
/// that can free a lock) lets none of it through to other clients' waiters.
pub(crate) fn hand_over_pipeline(to: &str, ttl_ms: i64) -> Vec<Document> {
    let last = doc! { "$eq": ["$count", 1_i64] };
    vec![
        doc! { "$set": { "_dl_last": last } },
        doc! { "$set": {
            OWNER: { "$cond": [ "$_dl_last", to, "$owner" ] },
            COUNT: { "$cond": [ "$_dl_last", 1_i64, { "$subtract": ["$count", 1_i64] } ] },
            TOKEN: { "$cond": [ "$_dl_last", { "$add": ["$token", 1_i64] }, "$token" ] },
            EXPIRES_AT: { "$cond": [ "$_dl_last", lease_end(ttl_ms), "$expires_at" ] },
            GRANTED_AT: { "$cond": [ "$_dl_last", "$$NOW", "$granted_at" ] },
        } },
        doc! { "$unset": ["_dl_last"] },
    ]
}

/// The filter of a tidy-up after a release that found its grant expired: the same grant,
/// still recorded but past its lease, which nobody has taken over.
pub(crate) fn expired_grant(name: &str, owner: &str, token: i64) -> Document {
    doc! {
        "_id": name,
        OWNER: owner,
        TOKEN: token,
        "$expr": { "$lte": [ "$expires_at", "$$NOW" ] },
    }
}

/// Marks the lock free without touching the fencing counter: the document of an expired grant
/// means the same as a free one, so clearing it changes nothing but what an operator sees.
pub(crate) fn free() -> Document {
    doc! { "$set": { OWNER: Bson::Null, COUNT: 0_i64, EXPIRES_AT: Bson::Null } }
}

/// Proclaim (applied with the [`held_by`] filter of the leader's grant, so only while it holds
/// the name live by the server's clock): the value, stamped with the grant's token, replacing
/// whatever value the name had. A plain update document, not a pipeline, so a value that starts
/// with `$` is stored as text, never read as a field path.
pub(crate) fn proclaim_update(token: i64, value: &str) -> Document {
    doc! { "$set": { VALUE: { VALUE_EPOCH: token, VALUE_TEXT: value } } }
}

/// Renew: the lease runs at least `ttl_ms` from the server's now, and is never shortened.
pub(crate) fn renew_pipeline(ttl_ms: i64) -> Vec<Document> {
    vec![doc! { "$set": { EXPIRES_AT: at_least(lease_end(ttl_ms)) } }]
}

pub(crate) use permit::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_filter_has_no_expr() {
        // An upsert's filter may not use $expr (mongod rejects it): the pipeline decides.
        assert!(!by_name("x").contains_key("$expr"));
        assert_eq!(acquire_pipeline("me", 5).len(), 3);
        assert_eq!(hand_over_pipeline("you", 5).len(), 3);
    }
}
