//! The statements of semaphore permits (requests for more than one permit), with `{permits}`
//! standing for the permit table beside `{locks}` and `{fencing}`. Release, renewal, re-entry
//! and the sweep are the lock table's own statements, run on the permit table (same columns,
//! and the primary key `(name, token)` finds one permit).

use std::sync::Arc;

/// The permit table's DDL.
pub(crate) const CREATE_PERMITS: &str = include_str!("create_permits.sql");

const CHECK_PERMITS: &str = "SELECT name, owner, hold_count, token, permits, expires_at, \
     granted_at FROM `{permits}` LIMIT 0";

/// First statement of a permit attempt's transaction: the row lock on the name's counter,
/// creating it at 0 if the name was never granted (a rollback takes it away again). Every
/// grant of the name, lock or permit, takes this lock first, so they are serialised here.
const LOCK_COUNTER: &str = "INSERT INTO `{fencing}` (name, value) VALUES (?, 0) \
     ON DUPLICATE KEY UPDATE value = value";

/// What a permit attempt decides on, read under the counter's lock: each permit row (kind 0)
/// and the lock row (kind 1) of the name, live or not, with the semaphore's size (1 for the
/// lock) and the µs of lease left. New rows cannot appear before commit (they need the lock
/// this transaction holds); rows can only go or be renewed, so what is read is never fewer
/// holders than there are.
const STATE: &str = "SELECT CAST(0 AS SIGNED), owner, token, CAST(permits AS SIGNED), \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
     FROM `{permits}` WHERE name = ? \
     UNION ALL SELECT CAST(1 AS SIGNED), owner, token, CAST(1 AS SIGNED), \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
     FROM `{locks}` WHERE name = ?";

/// Before a grant: the name's expired permits go (they no longer count against `max`).
const DROP_EXPIRED: &str =
    "DELETE FROM `{permits}` WHERE name = ? AND expires_at <= UTC_TIMESTAMP(6)";

/// Before a grant: the name's expired lock row goes, so that while permits are held no lock
/// row exists at all (a lock grant then only has to look for live permits when it inserts).
const DROP_EXPIRED_LOCK: &str =
    "DELETE FROM `{locks}` WHERE name = ? AND expires_at <= UTC_TIMESTAMP(6)";

/// The permit's token: the name's counter bumped, the new value in the OK packet.
const NEXT_TOKEN: &str = "UPDATE `{fencing}` SET value = LAST_INSERT_ID(value + 1) WHERE name = ?";

const INSERT: &str = "INSERT INTO `{permits}` \
     (name, owner, hold_count, token, permits, expires_at, granted_at) \
     VALUES (?, ?, 1, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))";

/// The size of a semaphore whose live permits refused a lock request (NULL once none is live).
const SIZE: &str = "SELECT CAST(MAX(permits) AS SIGNED) FROM `{permits}` \
     WHERE name = ? AND expires_at > UTC_TIMESTAMP(6)";

/// The oldest live permit of a name as the lock table's `INSPECT` shows a lock, then how many
/// are live and of how many.
const INSPECT: &str = "SELECT owner, hold_count, token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', granted_at) DIV 1000, \
     (SELECT COUNT(*) FROM `{permits}` q WHERE q.name = p.name \
        AND q.expires_at > UTC_TIMESTAMP(6)), \
     CAST(permits AS SIGNED) \
     FROM `{permits}` p WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) \
     ORDER BY token LIMIT 1";

/// [`INSPECT`] of every semaphore whose name starts with a prefix (bound as the lock table's
/// `LIST` binds it), one row per name, in name order.
const LIST: &str = "SELECT p.name, p.owner, p.hold_count, p.token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), p.expires_at), \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', p.granted_at) DIV 1000, \
     c.held, CAST(p.permits AS SIGNED) \
     FROM `{permits}` p JOIN \
       (SELECT name, MIN(token) AS first, COUNT(*) AS held FROM `{permits}` \
        WHERE name >= ? AND LEFT(name, ?) = ? AND expires_at > UTC_TIMESTAMP(6) \
        GROUP BY name) c ON p.name = c.name AND p.token = c.first \
     ORDER BY p.name";

/// An owner's own live permit of a name, for a give-back (inspect shows only the oldest).
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
    pub(crate) table: Arc<str>,
    pub(crate) create: Arc<str>,
    pub(crate) check: Arc<str>,
    pub(crate) lock_counter: Arc<str>,
    pub(crate) state: Arc<str>,
    pub(crate) drop_expired: Arc<str>,
    pub(crate) drop_expired_lock: Arc<str>,
    pub(crate) next_token: Arc<str>,
    pub(crate) insert: Arc<str>,
    pub(crate) size: Arc<str>,
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
    /// `r` renders `{locks}`, `{fencing}` and `{permits}`; the lock table's statements are
    /// pointed at the permit table.
    pub(crate) fn new(table: &str, r: impl Fn(&str) -> Arc<str>) -> Self {
        let on_permits = |sql: &str| r(&sql.replace("{locks}", "{permits}"));
        Self {
            table: table.into(),
            create: r(CREATE_PERMITS),
            check: r(CHECK_PERMITS),
            lock_counter: r(LOCK_COUNTER),
            state: r(STATE),
            drop_expired: r(DROP_EXPIRED),
            drop_expired_lock: r(DROP_EXPIRED_LOCK),
            next_token: r(NEXT_TOKEN),
            insert: r(INSERT),
            size: r(SIZE),
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
            &self.state,
            &self.drop_expired,
            &self.drop_expired_lock,
            &self.next_token,
            &self.insert,
            &self.size,
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
}
