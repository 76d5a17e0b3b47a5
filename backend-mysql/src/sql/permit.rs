//! The statements of semaphore permits (requests for more than one permit), with `{permits}`
//! standing for the permit table beside `{locks}` and `{fencing}`, and `{marker}` for the
//! marker's owner text as an SQL string.
//!
//! A name with live permits keeps one *marker* row in the lock table: owner [`MARKER`] (no
//! owner id can be that text: a label is never empty), `hold_count` the semaphore's `max`,
//! `token` the token of the permit that wrote it first, and `expires_at` the latest expiry of
//! the name's live permits. Every statement that changes a permit's expiry sets the marker's in
//! the same transaction, after the permit rows (the one lock order of every permit
//! transaction: the name's counter, its permit rows, its lock-table row), so the marker is live
//! exactly while a permit is. A lock request then finds the name held, as it would any holder,
//! without reading the permit table.

use std::sync::Arc;

/// The owner text of a semaphore's marker row in the lock table.
pub(crate) const MARKER: &str = "#semaphore";

/// The permit table's DDL.
pub(crate) const CREATE_PERMITS: &str = include_str!("create_permits.sql");

const CHECK_PERMITS: &str = "SELECT name, owner, hold_count, token, permits, expires_at, \
     granted_at FROM `{permits}` LIMIT 0";

/// First statement of every permit transaction but the renewal's: the row lock on the name's
/// counter, creating it at 0 if the name was never granted (a rollback takes it away again).
/// Every grant of the name, lock or permit, takes this lock first, so they are serialised.
const LOCK_COUNTER: &str = "INSERT INTO `{fencing}` (name, value) VALUES (?, 0) \
     ON DUPLICATE KEY UPDATE value = value";

/// What a permit attempt decides on, read under the counter's lock, first: the name's permit
/// rows, live or not, with the µs of lease left, locked. A locking read sees the latest version
/// of each row: a renewal in flight when the lease it extends runs out is waited for, not read
/// as expired. No permit can appear before commit (that takes the counter's lock, held here),
/// and none can be renewed (that takes its row's lock), so what is read is never fewer holders
/// than there are.
const PERMITS_LOCKED: &str = "SELECT owner, token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
     FROM `{permits}` WHERE name = ? FOR UPDATE";

/// Then the lock-table row (a lock, or the marker with the stored `max` as its hold count), live
/// or not, with the µs of lease left: a plain read, so that no gap of the lock table is locked
/// against lock grants of other names. Every write to it below is conditional on what it relies
/// on, so a row that changed since only costs another round.
const LOCK_ROW: &str = "SELECT owner, CAST(hold_count AS SIGNED), \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
     FROM `{locks}` WHERE name = ?";

/// Before a grant: the name's expired permits go (they no longer count against `max`).
const DROP_EXPIRED: &str =
    "DELETE FROM `{permits}` WHERE name = ? AND expires_at <= UTC_TIMESTAMP(6)";

/// The permit's token: the name's counter bumped, the new value in the OK packet.
const NEXT_TOKEN: &str = "UPDATE `{fencing}` SET value = LAST_INSERT_ID(value + 1) WHERE name = ?";

const INSERT: &str = "INSERT INTO `{permits}` \
     (name, owner, hold_count, token, permits, expires_at, granted_at) \
     VALUES (?, ?, 1, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))";

/// The marker of a name that had no lock-table row: made from the permit just inserted (its
/// token, expiry and grant time, and the semaphore's `max` as its hold count).
const MARKER_INSERT: &str = "INSERT INTO `{locks}` \
     (name, owner, hold_count, token, expires_at, granted_at) \
     SELECT name, {marker}, permits, token, expires_at, granted_at FROM `{permits}` \
     WHERE name = ? AND token = ?";

/// The marker of a name whose lock-table row (a lock's or an old marker) has expired: the row
/// becomes the marker of the permit just inserted, as [`MARKER_INSERT`] makes it.
const MARKER_REPLACE: &str = "UPDATE `{locks}` \
     SET owner = {marker}, hold_count = ?, token = ?, \
         expires_at = (SELECT expires_at FROM `{permits}` WHERE name = ? AND token = ?), \
         granted_at = UTC_TIMESTAMP(6) \
     WHERE name = ? AND expires_at <= UTC_TIMESTAMP(6)";

/// A live marker raised to the expiry of the permit with the given token (just granted,
/// re-entered or renewed), never lowered. Zero rows: no live marker (then no live permit
/// either), and the transaction is rolled back.
const MARKER_RAISE: &str = "UPDATE `{locks}` \
     SET expires_at = GREATEST(expires_at, \
         (SELECT expires_at FROM `{permits}` WHERE name = ? AND token = ?)) \
     WHERE name = ? AND owner = {marker} AND expires_at > UTC_TIMESTAMP(6)";

/// After a live permit went (release, force-release): how many of the name's permits are live,
/// read with the permit rows locked, so that no renewal moves them until the marker is set.
const LIVE_LOCKED: &str = "SELECT CAST(COUNT(*) AS SIGNED) FROM `{permits}` \
     WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) FOR UPDATE";

/// The marker lowered to the latest expiry of the live permits left (to now if they ran out
/// since [`LIVE_LOCKED`]).
const MARKER_LOWER: &str = "UPDATE `{locks}` \
     SET expires_at = COALESCE((SELECT MAX(expires_at) FROM `{permits}` \
         WHERE name = ? AND expires_at > UTC_TIMESTAMP(6)), UTC_TIMESTAMP(6)) \
     WHERE name = ? AND owner = {marker}";

/// The marker of a name with no live permit left.
const MARKER_DELETE: &str = "DELETE FROM `{locks}` WHERE name = ? AND owner = {marker}";

/// The size of the semaphore whose marker refused a lock request (no row once it is not live).
const MARKER_SIZE: &str = "SELECT CAST(hold_count AS SIGNED) FROM `{locks}` \
     WHERE name = ? AND owner = {marker} AND expires_at > UTC_TIMESTAMP(6)";

/// The oldest live permit of a name as the lock table's `INSPECT` shows a lock (a permit keeps
/// no election value: NULL in its place), then how many are live (the `max` is the marker's).
const INSPECT: &str = "SELECT owner, hold_count, token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', granted_at) DIV 1000, NULL, \
     (SELECT COUNT(*) FROM `{permits}` q WHERE q.name = p.name \
        AND q.expires_at > UTC_TIMESTAMP(6)) \
     FROM `{permits}` p WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) \
     ORDER BY token LIMIT 1";

/// [`INSPECT`] of every semaphore whose name starts with a prefix (bound as the lock table's
/// `LIST` binds it), one row per name, in name order; its columns follow the name.
const LIST: &str = "SELECT p.name, p.owner, p.hold_count, p.token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), p.expires_at), \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', p.granted_at) DIV 1000, NULL, c.held \
     FROM `{permits}` p JOIN \
       (SELECT name, MIN(token) AS first, COUNT(*) AS held FROM `{permits}` \
        WHERE name >= ? AND LEFT(name, ?) = ? AND expires_at > UTC_TIMESTAMP(6) \
        GROUP BY name) c ON p.name = c.name AND p.token = c.first \
     ORDER BY p.name";

/// An owner's own live permit of a name, with the semaphore's `max`, for a give-back (inspect
/// shows only the oldest permit).
const OWN: &str = "SELECT token, hold_count, CAST(permits AS SIGNED) FROM `{permits}` \
     WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)";

/// An operator's force-release of one live permit, whatever its hold count.
const FORCE: &str = "DELETE FROM `{permits}` \
     WHERE name = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)";

/// The permit table's name for the lock table `locks`: `{locks}_permits`, or, where that would
/// pass MySQL's 64 characters, the first 47 of `locks`, a hash of all of it and `_permits`.
pub(crate) fn permit_table(locks: &str) -> String {
    const SUFFIX: &str = "_permits";
    if locks.len() + SUFFIX.len() <= 64 {
        return format!("{locks}{SUFFIX}");
    }
    let mut h: u32 = 0x811c_9dc5;
    for &b in locks.as_bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    // Validated table names are ASCII, so any byte index is a char boundary.
    format!("{}_{h:08x}{SUFFIX}", &locks[..47])
}

/// The permit statements of one client, rendered for its table names.
#[derive(Debug)]
pub(crate) struct PermitStatements {
    /// The permit table's name, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) table: Arc<str>,
    pub(crate) create: Arc<str>,
    pub(crate) check: Arc<str>,
    pub(crate) lock_counter: Arc<str>,
    pub(crate) permits_locked: Arc<str>,
    pub(crate) lock_row: Arc<str>,
    pub(crate) drop_expired: Arc<str>,
    pub(crate) next_token: Arc<str>,
    pub(crate) insert: Arc<str>,
    pub(crate) marker_insert: Arc<str>,
    pub(crate) marker_replace: Arc<str>,
    pub(crate) marker_raise: Arc<str>,
    pub(crate) live_locked: Arc<str>,
    pub(crate) marker_lower: Arc<str>,
    pub(crate) marker_delete: Arc<str>,
    pub(crate) marker_size: Arc<str>,
    pub(crate) inspect: Arc<str>,
    pub(crate) list: Arc<str>,
    pub(crate) own: Arc<str>,
    pub(crate) force: Arc<str>,
    pub(crate) join: Arc<str>,
    pub(crate) release_last: Arc<str>,
    pub(crate) release_one: Arc<str>,
    pub(crate) probe: Arc<str>,
    pub(crate) clear_expired: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) sweep: Arc<str>,
}

impl PermitStatements {
    /// `r` renders `{locks}`, `{fencing}`, `{permits}` and `{marker}`; the lock table's own
    /// statements for re-entry, release, renewal and the sweep are pointed at the permit table
    /// (same columns; the primary key `(name, token)` finds one permit).
    pub(crate) fn new(table: &str, r: impl Fn(&str) -> Arc<str>) -> Self {
        let on_permits = |sql: &str| r(&sql.replace("{locks}", "{permits}"));
        #[cfg(not(feature = "testing"))]
        let _ = table;
        Self {
            #[cfg(feature = "testing")]
            table: table.into(),
            create: r(CREATE_PERMITS),
            check: r(CHECK_PERMITS),
            lock_counter: r(LOCK_COUNTER),
            permits_locked: r(PERMITS_LOCKED),
            lock_row: r(LOCK_ROW),
            drop_expired: r(DROP_EXPIRED),
            next_token: r(NEXT_TOKEN),
            insert: r(INSERT),
            marker_insert: r(MARKER_INSERT),
            marker_replace: r(MARKER_REPLACE),
            marker_raise: r(MARKER_RAISE),
            live_locked: r(LIVE_LOCKED),
            marker_lower: r(MARKER_LOWER),
            marker_delete: r(MARKER_DELETE),
            marker_size: r(MARKER_SIZE),
            inspect: r(INSPECT),
            list: r(LIST),
            own: r(OWN),
            force: r(FORCE),
            join: on_permits(super::JOIN),
            release_last: on_permits(super::RELEASE_LAST),
            release_one: on_permits(super::RELEASE_ONE),
            probe: on_permits(super::PROBE),
            clear_expired: on_permits(super::CLEAR_EXPIRED),
            renew: on_permits(super::RENEW),
            sweep: on_permits(super::SWEEP),
        }
    }

    /// Every statement, for the tests.
    #[cfg(test)]
    pub(crate) fn all(&self) -> Vec<&Arc<str>> {
        vec![
            &self.create,
            &self.check,
            &self.lock_counter,
            &self.permits_locked,
            &self.lock_row,
            &self.drop_expired,
            &self.next_token,
            &self.insert,
            &self.marker_insert,
            &self.marker_replace,
            &self.marker_raise,
            &self.live_locked,
            &self.marker_lower,
            &self.marker_delete,
            &self.marker_size,
            &self.inspect,
            &self.list,
            &self.own,
            &self.force,
            &self.join,
            &self.release_last,
            &self.release_one,
            &self.probe,
            &self.clear_expired,
            &self.renew,
            &self.sweep,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_permit_table_is_named_after_the_lock_table_within_64_characters() {
        assert_eq!(permit_table("distlock_locks"), "distlock_locks_permits");
        let long = "l".repeat(64);
        let other = format!("{}m", "l".repeat(63));
        for t in [&long, &other] {
            let p = permit_table(t);
            assert_eq!(p.len(), 64, "{p}");
            assert!(p.ends_with("_permits"));
        }
        assert_ne!(permit_table(&long), permit_table(&other));
        assert_eq!(permit_table(&"x".repeat(56)).len(), 64);
    }

    #[test]
    fn no_owner_id_is_the_marker() {
        assert!(distlock_api::OwnerId::parse(MARKER).is_err());
        assert!(distlock_api::OwnerId::new(MARKER).is_err());
    }

    #[test]
    fn the_marker_is_written_after_the_permit_rows() {
        // The one lock order (counter, permit rows, lock-table row): each statement that writes
        // the marker reads the permit rows it needs as a subquery, after they were written.
        for sql in [MARKER_INSERT, MARKER_REPLACE, MARKER_RAISE, MARKER_LOWER] {
            assert!(sql.contains("FROM `{permits}`"), "{sql}");
        }
    }
}
