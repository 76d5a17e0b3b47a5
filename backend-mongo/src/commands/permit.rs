//! The filters and update pipelines of semaphore permits (requests for more than one permit).
//!
//! A name's permits live in its one lock document, beside the lock's fields:
//!
//! ```text
//! { ..., max: <i64 size>, freed: <i64>,
//!   permits: [ { owner, count: <i64>, token: <i64>, expires_at: <date>, granted_at: <date> } ] }
//! ```
//!
//! Every permit is granted by one `findAndModify` of that document judged by `$$NOW`, as the
//! lock is: the server applies one document's updates one at a time, so the count of live
//! permits a grant sees is the count it writes against, and its token comes from the `token`
//! counter the lock uses.

use mongodb::bson::{doc, Bson, Document};

use super::{later_of, lease_end, lock_held, COUNT, EXPIRES_AT, FREED, MAX, OWNER, PERMITS, TOKEN};
use super::{GRANTED_AT, REMAINING_MS};

/// The permits whose lease has not ended by the server's clock, oldest first (`[]` when the
/// document has none).
pub(crate) fn live_permits() -> Document {
    doc! { "$filter": {
        "input": { "$ifNull": ["$permits", []] },
        "cond": { "$gt": ["$$this.expires_at", "$$NOW"] },
    } }
}

/// The live permits as inspect reads them: each with the lease left in ms, by the server's
/// clock, in place of its expiry.
pub(super) fn live_permits_seen() -> Document {
    doc! { "$map": { "input": live_permits(), "in": {
        OWNER: "$$this.owner",
        COUNT: "$$this.count",
        TOKEN: "$$this.token",
        GRANTED_AT: "$$this.granted_at",
        REMAINING_MS: { "$dateDiff": {
            "startDate": "$$NOW", "endDate": "$$this.expires_at", "unit": "millisecond",
        } },
    } } }
}

/// A permit entry like `$$this` with `changes` applied: written out field by field rather than
/// with `$mergeObjects`, so that it means the same on every server.
fn entry_with(changes: Document) -> Document {
    let mut entry = doc! {
        OWNER: "$$this.owner",
        COUNT: "$$this.count",
        TOKEN: "$$this.token",
        EXPIRES_AT: "$$this.expires_at",
        GRANTED_AT: "$$this.granted_at",
    };
    entry.extend(changes);
    entry
}

/// Whether `$$this` is the permit with `token` (a name's tokens are never issued twice).
fn is_token(token: i64) -> Document {
    doc! { "$eq": ["$$this.token", token] }
}

/// The permit attempt's update pipeline, for `owner` asking for one of `max` permits.
///
/// First it forgets what no longer counts: expired permits, and the lock's holder if its lease
/// ended. Then, unless the lock is held live or live permits were granted with another `max`:
/// `owner`'s own live permit gets one more hold (same token, the lease never shortened), or a
/// new permit is appended while fewer than `max` are live, with the next token of the counter;
/// `max` is stored with it. Otherwise nothing changes but the forgetting (a no-op write when
/// there was nothing to forget, which the change streams never see). The reply (the document
/// after) tells the caller which: every permit left in it is live.
pub(crate) fn permit_pipeline(owner: &str, ttl_ms: i64, max: u32) -> Vec<Document> {
    let max = i64::from(max);
    let until = lease_end(ttl_ms);
    let rejoined = entry_with(doc! {
        COUNT: { "$add": ["$$this.count", 1_i64] },
        EXPIRES_AT: later_of(until.clone(), "$$this.expires_at"),
    });
    let fresh = doc! {
        OWNER: owner, COUNT: 1_i64, TOKEN: "$_dl_next", EXPIRES_AT: until, GRANTED_AT: "$$NOW",
    };
    vec![
        doc! { "$set": { "_dl_lock": lock_held(), PERMITS: live_permits() } },
        doc! { "$set": {
            "_dl_ok": { "$and": [
                { "$not": ["$_dl_lock"] },
                { "$or": [ { "$eq": [{ "$size": "$permits" }, 0] }, { "$eq": ["$max", max] } ] },
            ] },
            "_dl_mine": { "$anyElementTrue": [
                { "$map": { "input": "$permits", "in": { "$eq": ["$$this.owner", owner] } } },
            ] },
            "_dl_next": { "$add": [{ "$ifNull": ["$token", 0_i64] }, 1_i64] },
        } },
        doc! { "$set": {
            "_dl_join": { "$and": ["$_dl_ok", "$_dl_mine"] },
            "_dl_new": { "$and": [
                "$_dl_ok",
                { "$not": ["$_dl_mine"] },
                { "$lt": [{ "$size": "$permits" }, max] },
            ] },
        } },
        doc! { "$set": {
            OWNER: { "$cond": ["$_dl_lock", "$owner", Bson::Null] },
            COUNT: { "$cond": ["$_dl_lock", "$count", 0_i64] },
            EXPIRES_AT: { "$cond": ["$_dl_lock", "$expires_at", Bson::Null] },
            PERMITS: { "$cond": [
                "$_dl_join",
                { "$map": { "input": "$permits", "in": { "$cond": [
                    { "$eq": ["$$this.owner", owner] }, rejoined, "$$this",
                ] } } },
                { "$cond": ["$_dl_new", { "$concatArrays": ["$permits", [fresh]] }, "$permits"] },
            ] },
            TOKEN: { "$cond": ["$_dl_new", "$_dl_next", "$token"] },
            MAX: { "$cond": ["$_dl_new", max, "$max"] },
        } },
        doc! { "$unset": ["_dl_lock", "_dl_ok", "_dl_mine", "_dl_next", "_dl_join", "_dl_new"] },
    ]
}

/// What the permit attempt reads back from its own update.
pub(crate) fn permit_projection() -> Document {
    doc! { OWNER: 1, MAX: 1, PERMITS: 1 }
}

/// The filter of a permit's release, renew and tidy-up: `name`'s document while it records
/// the permit `(owner, token)`, live or not. Equalities only (`$elemMatch` of two equalities
/// beside `_id`), which every server answers from the `_id` index; an `$expr` (as this filter
/// had, to find the permit live) makes the test server scan the whole collection. Whether the
/// permit is live is judged inside the update, by the same `$$NOW`.
pub(crate) fn permit_of(name: &str, owner: &str, token: i64) -> Document {
    doc! { "_id": name, PERMITS: { "$elemMatch": { OWNER: owner, TOKEN: token } } }
}

/// The filter of an operator's force-release: `name`'s document while it records a permit with
/// `token` (a name's tokens are never issued twice), live or not.
pub(crate) fn permit_with_token(name: &str, token: i64) -> Document {
    doc! { "_id": name, format!("{PERMITS}.{TOKEN}"): token }
}

/// Whether `$$this`, a permit entry, is live by the server's clock (`live`) or past its lease.
fn entry_live(live: bool) -> Document {
    if live {
        doc! { "$gt": ["$$this.expires_at", "$$NOW"] }
    } else {
        doc! { "$lte": ["$$this.expires_at", "$$NOW"] }
    }
}

/// Gives up `holds` holds (at most `i64::MAX`: all of them) of the permit with `token`, if it
/// is live (`live`; else if it is past its lease, the tidy-up after a release that found it
/// so); a permit left with none is removed, and `freed` bumped so that the change streams wake
/// the name's waiters. A permit in the other state is left as it is, a no-op write: an applied
/// release always changes the document, so the modified count says whether it applied.
pub(crate) fn permit_release_pipeline(token: i64, holds: i64, live: bool) -> Vec<Document> {
    let less = entry_with(doc! { COUNT: { "$subtract": ["$$this.count", holds] } });
    vec![
        doc! { "$set": {
            "_dl_n": { "$size": "$permits" },
            PERMITS: { "$filter": {
                "input": { "$map": { "input": "$permits", "in": {
                    "$cond": [{ "$and": [is_token(token), entry_live(live)] }, less, "$$this"],
                } } },
                "cond": { "$gt": ["$$this.count", 0_i64] },
            } },
        } },
        doc! { "$set": { FREED: { "$cond": [
            { "$lt": [{ "$size": "$permits" }, "$_dl_n"] },
            { "$add": [{ "$ifNull": ["$freed", 0_i64] }, 1_i64] },
            "$freed",
        ] } } },
        doc! { "$unset": ["_dl_n"] },
    ]
}

/// Renews the permit with `token`, if it is live: its lease runs at least `ttl_ms` from the
/// server's now (never shortened); a permit past its lease is left as it is.
pub(crate) fn permit_renew_pipeline(token: i64, ttl_ms: i64) -> Vec<Document> {
    let longer = entry_with(doc! {
        EXPIRES_AT: later_of(lease_end(ttl_ms), "$$this.expires_at"),
    });
    vec![
        doc! { "$set": { PERMITS: { "$map": { "input": "$permits", "in": {
            "$cond": [{ "$and": [is_token(token), entry_live(true)] }, longer, "$$this"],
        } } } } },
    ]
}
