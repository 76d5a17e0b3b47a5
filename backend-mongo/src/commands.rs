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

/// The filter of release, renew, hand-over and proclaim: the document of this grant (owner and
/// token), live or not. Plain equalities, with `_id` among them, so every server answers it from
/// the `_id` index; an `$expr` (as this filter had, to compare the lease with `$$NOW`) makes the
/// test server scan the whole collection. Whether the lease is live is judged inside the update
/// instead (see [`lease_live`]), by the same `$$NOW`, in the same step on the same document.
pub(crate) fn grant_of(name: &str, owner: &str, token: i64) -> Document {
    doc! { "_id": name, OWNER: owner, TOKEN: token }
}

/// Whether the document's lease is live by the server's clock: `expires_at > $$NOW` (false for
/// a `null` or missing expiry, a free lock).
pub(crate) fn lease_live() -> Document {
    doc! { "$gt": [ "$expires_at", "$$NOW" ] }
}

/// The filter of a batch renewal: the documents named by `grants` (name, owner, token), by
/// `$in` on `_id`, one index lookup per name on every server (an `$or` of per-grant filters,
/// or any `$expr`, makes the test server scan the collection). Which of them a grant of the
/// batch still holds live is judged inside the update ([`renew_batch_pipeline`]).
pub(crate) fn named(grants: &[(&str, &str, i64)]) -> Document {
    let names: Vec<&str> = grants.iter().map(|&(name, _, _)| name).collect();
    doc! { "_id": { "$in": names } }
}

/// Whether the document is held live by one of `grants`: the exact (name, owner, token) triple,
/// not only the name. Owner and token are checked per grant: a late batch holding an old grant
/// must not lengthen the lease of a newer grant of that name, which its own guard does not
/// expect; and every acquisition has an owner id of its own, so one batch carries many owners.
/// The triples are a `$literal` so that a name starting with `$` is not read as a field path.
fn held_by_one_of(grants: &[(&str, &str, i64)]) -> Document {
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
    doc! { "$and": [
        lease_live(),
        { "$in": [ [ "$_id", "$owner", "$token" ], { "$literal": triples } ] },
    ] }
}

/// Release (with the [`grant_of`] filter): if the grant's lease is live, one hold less, and at
/// zero the lock is free (owner and expiry `null`); otherwise the document stays exactly as it
/// was, a no-op write. An applied release always changes the hold count, so the update's
/// modified count (1 or 0) says whether the grant still held the lock. The document, and with
/// it the fencing counter, stays.
pub(crate) fn release_pipeline() -> Vec<Document> {
    vec![
        doc! { "$set": { "_dl_live": lease_live() } },
        doc! { "$set": {
            "_dl_free": { "$and": [ "$_dl_live", { "$lte": ["$count", 1_i64] } ] },
            COUNT: { "$cond": [
                "$_dl_live",
                { "$max": [ { "$subtract": ["$count", 1_i64] }, 0_i64 ] },
                "$count",
            ] },
        } },
        doc! { "$set": {
            OWNER: { "$cond": [ "$_dl_free", Bson::Null, "$owner" ] },
            EXPIRES_AT: { "$cond": [ "$_dl_free", Bson::Null, "$expires_at" ] },
        } },
        doc! { "$unset": ["_dl_live", "_dl_free"] },
    ]
}

/// Hand-over (with the [`grant_of`] filter of the releasing grant): if its lease is live, its
/// last hold passes to `to` with the next token from the counter, hold count 1 and a lease of
/// `ttl_ms` from the server's now, as a fresh grant would; a grant with several holds gives up
/// one, as by [`release_pipeline`], and keeps the lock. If its lease has ended, the lock is
/// marked free, as [`free_if_expired`] marks it after a release that found its grant expired.
/// So the document returned tells the three apart: the old grant (one hold given up), `to`
/// with a new token (handed), or no owner (the grant no longer held). Decided and written by
/// the server in one step on the one document. A live grant never sets `owner` to `null`
/// here: the lock never comes free, so the change streams' filter (which passes the events
/// that can free a lock) lets none of it through to other clients' waiters.
pub(crate) fn hand_over_pipeline(to: &str, ttl_ms: i64) -> Vec<Document> {
    vec![
        doc! { "$set": { "_dl_live": lease_live() } },
        doc! { "$set": {
            "_dl_last": { "$and": [ "$_dl_live", { "$eq": ["$count", 1_i64] } ] },
            "_dl_gone": { "$not": [ "$_dl_live" ] },
        } },
        doc! { "$set": {
            OWNER: { "$cond": [
                "$_dl_last", to, { "$cond": [ "$_dl_gone", Bson::Null, "$owner" ] },
            ] },
            COUNT: { "$cond": [
                "$_dl_last",
                1_i64,
                { "$cond": [ "$_dl_gone", 0_i64, { "$subtract": ["$count", 1_i64] } ] },
            ] },
            TOKEN: { "$cond": [ "$_dl_last", { "$add": ["$token", 1_i64] }, "$token" ] },
            EXPIRES_AT: { "$cond": [
                "$_dl_last",
                lease_end(ttl_ms),
                { "$cond": [ "$_dl_gone", Bson::Null, "$expires_at" ] },
            ] },
            GRANTED_AT: { "$cond": [ "$_dl_last", "$$NOW", "$granted_at" ] },
        } },
        doc! { "$unset": ["_dl_live", "_dl_last", "_dl_gone"] },
    ]
}

/// The tidy-up after a release that did not apply (with the [`grant_of`] filter): if the
/// grant is still recorded but past its lease (nobody has taken it over), the lock is marked
/// free without touching the fencing counter; a live grant is left as it is. The document of
/// an expired grant means the same as a free one, so clearing it changes nothing but what an
/// operator sees.
pub(crate) fn free_if_expired() -> Vec<Document> {
    vec![
        doc! { "$set": { "_dl_gone": { "$not": [ lease_live() ] } } },
        doc! { "$set": {
            OWNER: { "$cond": [ "$_dl_gone", Bson::Null, "$owner" ] },
            COUNT: { "$cond": [ "$_dl_gone", 0_i64, "$count" ] },
            EXPIRES_AT: { "$cond": [ "$_dl_gone", Bson::Null, "$expires_at" ] },
        } },
        doc! { "$unset": ["_dl_gone"] },
    ]
}

/// Proclaim (with the [`grant_of`] filter of the leader's grant): if its lease is live by the
/// server's clock, the value, stamped with the grant's token, replaces whatever value the name
/// had; otherwise nothing changes. The text goes in as a `$literal`, so a value that starts
/// with `$` is stored as text, never read as a field path.
pub(crate) fn proclaim_pipeline(token: i64, value: &str) -> Vec<Document> {
    let stamped = doc! { VALUE_EPOCH: { "$literal": token }, VALUE_TEXT: { "$literal": value } };
    vec![doc! { "$set": { VALUE: { "$cond": [ lease_live(), stamped, "$value" ] } } }]
}

/// Renew (with the [`grant_of`] filter): if the grant's lease is live, it runs at least
/// `ttl_ms` from the server's now, and is never shortened; a lease that has ended by the
/// server's clock is left as it is (a renewal never revives it).
pub(crate) fn renew_pipeline(ttl_ms: i64) -> Vec<Document> {
    vec![doc! { "$set": { EXPIRES_AT: { "$cond": [
        lease_live(),
        at_least(lease_end(ttl_ms)),
        "$expires_at",
    ] } } }]
}

/// A batch renewal (with the [`named`] filter): as [`renew_pipeline`] for each document that
/// one of `grants` holds live, nothing for the others.
pub(crate) fn renew_batch_pipeline(grants: &[(&str, &str, i64)], ttl_ms: i64) -> Vec<Document> {
    vec![doc! { "$set": { EXPIRES_AT: { "$cond": [
        held_by_one_of(grants),
        at_least(lease_end(ttl_ms)),
        "$expires_at",
    ] } } }]
}

/// What a batch renewal reads back after its update: each named document's holder, token and
/// lease left by the server's clock (as inspect reads them). A grant found still recorded and
/// live was live at the update, which therefore extended it: a lease never comes back to life
/// under the same token.
pub(crate) fn renewed_pipeline(grants: &[(&str, &str, i64)]) -> Vec<Document> {
    vec![
        doc! { "$match": named(grants) },
        doc! { "$project": {
            OWNER: 1,
            TOKEN: 1,
            REMAINING_MS: { "$dateDiff": {
                "startDate": "$$NOW", "endDate": "$expires_at", "unit": "millisecond",
            } },
        } },
    ]
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
        assert_eq!(hand_over_pipeline("you", 5).len(), 4);
    }

    /// Whether `$expr` appears anywhere in `doc`, at any depth.
    fn has_expr(doc: &Document) -> bool {
        fn walk(b: &Bson) -> bool {
            match b {
                Bson::Document(d) => d.iter().any(|(k, v)| k == "$expr" || walk(v)),
                Bson::Array(a) => a.iter().any(walk),
                _ => false,
            }
        }
        walk(&Bson::Document(doc.clone()))
    }

    #[test]
    fn per_lock_filters_are_equalities_the_id_index_answers() {
        // The test server scans the whole collection for any filter with `$expr`: release,
        // renew, hand-over and proclaim find their document by equalities with `_id` among
        // them, and judge the lease inside the update.
        let one = grant_of("x", "me", 7);
        assert!(!has_expr(&one));
        assert_eq!(one, doc! { "_id": "x", "owner": "me", "token": 7_i64 });
        let grants = [("x", "me", 7_i64), ("y", "you", 3_i64)];
        let batch = named(&grants);
        assert!(!has_expr(&batch));
        assert_eq!(batch, doc! { "_id": { "$in": ["x", "y"] } });
        for permit in [permit_of("x", "me", 7), permit_with_token("x", 7)] {
            assert!(!has_expr(&permit), "{permit}");
            assert_eq!(permit.get_str("_id"), Ok("x"));
        }
        let read = &renewed_pipeline(&grants)[0];
        assert_eq!(read.get_document("$match").unwrap(), &batch);
        // The lease check is in every one of their updates, by the server's clock.
        let live = Bson::Document(lease_live());
        let mentions_live = |stages: &[Document]| {
            stages
                .iter()
                .any(|s| format!("{s}").contains(&format!("{live}")))
        };
        assert!(mentions_live(&release_pipeline()));
        assert!(mentions_live(&renew_pipeline(5)));
        assert!(mentions_live(&renew_batch_pipeline(&grants, 5)));
        assert!(mentions_live(&hand_over_pipeline("you", 5)));
        assert!(mentions_live(&proclaim_pipeline(7, "v")));
        assert!(mentions_live(&free_if_expired()));
        let live_entry = format!(
            "{}",
            Bson::Document(doc! { "$gt": ["$$this.expires_at", "$$NOW"] })
        );
        let permit =
            |stages: Vec<Document>| stages.iter().any(|s| format!("{s}").contains(&live_entry));
        assert!(permit(permit_release_pipeline(7, 1, true)));
        assert!(permit(permit_renew_pipeline(7, 5)));
        assert!(
            !permit(permit_release_pipeline(7, i64::MAX, false)),
            "the tidy-up"
        );
    }
}
