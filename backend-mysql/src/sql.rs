//! Every statement the backend sends, with `{locks}` and `{fencing}` standing for the configured
//! (validated) table names. Each one is accepted by MySQL 8 and MariaDB 10.11 alike.
//!
//! Time is always the server's: `UTC_TIMESTAMP(6)`, which is `NOW(6)` in UTC, so neither a
//! client's clock nor its session time zone nor a daylight-saving change can move a lease. A
//! row is *live* while `expires_at > UTC_TIMESTAMP(6)`; every statement judges that itself, at
//! the moment it runs, under the row lock it takes.

use std::sync::Arc;

mod permit;

pub(crate) use permit::{permit_table, PermitStatements, MARKER};

/// The lock table's DDL.
pub(crate) const CREATE_LOCKS: &str = include_str!("sql/create_locks.sql");
/// The fencing table's DDL.
pub(crate) const CREATE_FENCING: &str = include_str!("sql/create_fencing.sql");

/// Fails early, with a clear error, if an existing table lacks a column this backend uses.
const CHECK_LOCKS: &str = "SELECT name, owner, hold_count, token, expires_at, granted_at, \
     value, value_token FROM `{locks}` LIMIT 0";
const CHECK_FENCING: &str = "SELECT name, value FROM `{fencing}` LIMIT 0";

/// The current row of a lock, live or not, with its remaining lease in microseconds (zero or
/// negative once expired). Acquire uses it only to choose which conditional write to try;
/// inspect filters out expired rows.
const READ: &str = "SELECT owner, token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
     FROM `{locks}` WHERE name = ?";

/// What an operator sees of a lock: owner, hold count, token, the lease left in microseconds
/// (as [`READ`]), when the grant began, in milliseconds since
/// the epoch (counted from the epoch as a UTC datetime, so the session's time zone plays no
/// part), and the leader's value: only if this grant proclaimed it ([`PROCLAIM`]), never a value
/// an earlier grant left on a row taken over or handed over in place.
const INSPECT: &str = "SELECT owner, hold_count, token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', granted_at) DIV 1000, \
     IF(value_token = token, value, NULL) \
     FROM `{locks}` WHERE name = ?";

/// Every live lock whose name starts with a prefix (its bytes and their length bound), as
/// [`INSPECT`] sees each, in name order. The range condition lets the primary key do the work.
const LIST: &str = "SELECT name, owner, hold_count, token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', granted_at) DIV 1000, \
     IF(value_token = token, value, NULL) \
     FROM `{locks}` \
     WHERE name >= ? AND LEFT(name, ?) = ? AND expires_at > UTC_TIMESTAMP(6) \
     ORDER BY name";

/// Inside the granting transaction: bump the name's counter (creating it at 1) and hand the new
/// value back in the OK packet's last-insert-id, without a second round trip. The row stays
/// locked until the transaction ends, so grants of one name are serialised here and a rolled
/// back grant gives its number back.
const BUMP_FENCING: &str = "INSERT INTO `{fencing}` (name, value) VALUES (?, LAST_INSERT_ID(1)) \
     ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1)";

/// Fallback for the value that `LAST_INSERT_ID(expr)` set, when the OK packet does not carry
/// it (a trigger on the table that inserts resets the packet's insert id). It reads this
/// session's own value, so no other client's statement can change the answer.
pub(crate) const LAST_INSERT_ID: &str = "SELECT LAST_INSERT_ID()";

/// Inside the granting transaction: a fresh grant of a free name. A duplicate-key error means
/// a row is there (held, or expired and not yet taken over).
const INSERT: &str = "INSERT INTO `{locks}` \
     (name, owner, hold_count, token, expires_at, granted_at) \
     VALUES (?, ?, 1, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))";

/// A fresh grant of a name that is likely free, as one request of several statements (text
/// protocol: the values are written into it, as hexadecimal literals and a number): the
/// transaction of [`BUMP_FENCING`] and [`INSERT`], the new token read back in between. If a row
/// is there, the insert fails with a duplicate-key error, the server runs nothing after it, and
/// the transaction is left open with the counter bumped: [`ROLLBACK_AND_READ`] ends it.
const GRANT_IN_ONE: &str = "BEGIN; \
     INSERT INTO `{fencing}` (name, value) VALUES ({name}, LAST_INSERT_ID(1)) \
     ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1); \
     SELECT LAST_INSERT_ID(); \
     INSERT INTO `{locks}` (name, owner, hold_count, token, expires_at, granted_at) \
     VALUES ({name}, {owner}, 1, LAST_INSERT_ID(), \
             UTC_TIMESTAMP(6) + INTERVAL {ttl} MICROSECOND, UTC_TIMESTAMP(6)); \
     COMMIT";

/// After [`GRANT_IN_ONE`] found a row: roll back (the counter with it) and read the row as
/// [`READ`] does, in one request.
const ROLLBACK_AND_READ: &str = "ROLLBACK; \
     SELECT owner, token, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
     FROM `{locks}` WHERE name = {name}";

/// A hand-over ([`DistributedLock::hand_over`](distlock_api::DistributedLock::hand_over)) as
/// one request of several statements, with the values written in as [`GRANT_IN_ONE`] writes
/// them (`{from}` the releasing owner, `{token}` its grant's token, `{to}` the new owner). One
/// transaction, whatever it finds:
///
/// 1. `LAST_INSERT_ID` is set to 0, so that 0 below means "no token was taken here".
/// 2. The name's fencing counter is bumped, as a fresh grant bumps it, only if the releasing
///    grant holds the lock live with its last hold. The counter row is locked first, as every
///    fresh grant locks it first (no lock-order inversion with them), and while it is locked
///    no grant or takeover of the name can happen.
/// 3. The row passes to the new owner with that token, hold count 1 and a lease from the
///    server's now, under the same conditions again (checked on the row's current version).
/// 4. A guard: if a token was taken but the row was not passed on (it changed between 2 and 3:
///    its lease ran out that very instant, or another hold of the same owner came or went),
///    a duplicate-key insert into the counter table fails, the server runs nothing after it,
///    and the transaction is left open with the counter bumped, for the client to roll back
///    (no token is burned) and to try again.
/// 5. Otherwise a release of one hold of several, as [`RELEASE_ONE`] (matches nothing after a
///    hand-over: the row's owner and token are new).
/// 6. The outcome read back: the new token (0 if none), whether one hold of several was given
///    up, and whether the releasing grant still holds the row live (after nothing was done: a
///    race to try again).
/// 7. The releasing grant's own expired row is deleted, as [`CLEAR_EXPIRED`] after a release
///    that found it expired; then commit.
///
/// Nothing in it frees the name, even for an instant: waiters of other clients see no change
/// but the row's new owner and token.
const HAND_OVER: &str = "BEGIN; \
     DO LAST_INSERT_ID(0); \
     UPDATE `{fencing}` SET value = LAST_INSERT_ID(value + 1) \
     WHERE name = {name} AND EXISTS (SELECT 1 FROM `{locks}` \
         WHERE name = {name} AND owner = {from} AND token = {token} AND hold_count = 1 \
           AND expires_at > UTC_TIMESTAMP(6)); \
     UPDATE `{locks}` \
     SET owner = {to}, hold_count = 1, token = LAST_INSERT_ID(), \
         expires_at = UTC_TIMESTAMP(6) + INTERVAL {ttl} MICROSECOND, \
         granted_at = UTC_TIMESTAMP(6) \
     WHERE name = {name} AND owner = {from} AND token = {token} AND hold_count = 1 \
       AND expires_at > UTC_TIMESTAMP(6) AND LAST_INSERT_ID() > 0; \
     INSERT INTO `{fencing}` (name, value) SELECT {name}, 0 FROM DUAL \
     WHERE LAST_INSERT_ID() > 0 AND NOT EXISTS \
         (SELECT 1 FROM `{locks}` WHERE name = {name} AND token = LAST_INSERT_ID()); \
     UPDATE `{locks}` SET hold_count = hold_count - 1 \
     WHERE name = {name} AND owner = {from} AND token = {token} AND hold_count > 1 \
       AND expires_at > UTC_TIMESTAMP(6); \
     SELECT LAST_INSERT_ID(), ROW_COUNT(), \
         (SELECT expires_at > UTC_TIMESTAMP(6) FROM `{locks}` \
          WHERE name = {name} AND owner = {from} AND token = {token}); \
     DELETE FROM `{locks}` \
     WHERE name = {name} AND owner = {from} AND token = {token} \
       AND expires_at <= UTC_TIMESTAMP(6); \
     COMMIT";

/// The common case of a hand-over, tried first: the releasing grant holds the lock live with
/// its last hold. Fewer statements than [`HAND_OVER`] (no hold count to lower, no outcome but
/// the token to read, no expired row to clear), so the request a same-handle hand-off waits
/// for is shorter. Values are written in as [`HAND_OVER`] writes them.
///
/// 1. `LAST_INSERT_ID` is set to 0, so that 0 below means "no token was taken here".
/// 2. The name's counter is bumped (locked first, as every grant locks it first).
/// 3. The row passes to the new owner with that token, hold count 1 and a lease from the
///    server's now, if `from` holds it live with its last hold.
/// 4. The guard of [`HAND_OVER`]: a token taken but the row not passed on (two holds, not
///    held, expired, or a race) makes a duplicate-key insert fail, the server runs nothing
///    after it, and the client rolls back and sends [`HAND_OVER`], which tells those cases
///    apart (in one request with the rollback).
/// 5. The new token read back (0 only without a counter row: nothing was changed), commit.
const HAND_OVER_LAST: &str = "BEGIN; \
     DO LAST_INSERT_ID(0); \
     UPDATE `{fencing}` SET value = LAST_INSERT_ID(value + 1) WHERE name = {name}; \
     UPDATE `{locks}` \
     SET owner = {to}, hold_count = 1, token = LAST_INSERT_ID(), \
         expires_at = UTC_TIMESTAMP(6) + INTERVAL {ttl} MICROSECOND, \
         granted_at = UTC_TIMESTAMP(6) \
     WHERE name = {name} AND owner = {from} AND token = {token} AND hold_count = 1 \
       AND expires_at > UTC_TIMESTAMP(6) AND LAST_INSERT_ID() > 0; \
     INSERT INTO `{fencing}` (name, value) SELECT {name}, 0 FROM DUAL \
     WHERE ROW_COUNT() = 0 AND LAST_INSERT_ID() > 0; \
     SELECT LAST_INSERT_ID(); \
     COMMIT";

/// Inside the granting transaction: take over an expired row. Zero rows means it is live (or
/// gone); the transaction is then rolled back.
const TAKEOVER: &str = "UPDATE `{locks}` \
     SET owner = ?, hold_count = 1, token = ?, \
         expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, granted_at = UTC_TIMESTAMP(6) \
     WHERE name = ? AND expires_at <= UTC_TIMESTAMP(6)";

/// Reentrant acquire: one more hold for the live grant (owner and token) that was read. The new
/// count comes back as last-insert-id. The lease is never shortened: other holds of the same
/// owner keep the lease they were promised.
const JOIN: &str = "UPDATE `{locks}` \
     SET hold_count = LAST_INSERT_ID(hold_count + 1), \
         expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
     WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)";

/// Release of the last hold of a live grant.
const RELEASE_LAST: &str = "DELETE FROM `{locks}` \
     WHERE name = ? AND owner = ? AND token = ? AND hold_count = 1 \
       AND expires_at > UTC_TIMESTAMP(6)";

/// Release of one of several holds of a live grant.
const RELEASE_ONE: &str = "UPDATE `{locks}` SET hold_count = hold_count - 1 \
     WHERE name = ? AND owner = ? AND token = ? AND hold_count > 1 \
       AND expires_at > UTC_TIMESTAMP(6)";

/// After both release statements matched nothing: is the grant's row still there, and live?
const PROBE: &str = "SELECT expires_at > UTC_TIMESTAMP(6) FROM `{locks}` \
     WHERE name = ? AND owner = ? AND token = ?";

/// A release of a grant whose lease ran out deletes its own expired row (nobody else's: the
/// token is this grant's), so that a holder that releases leaves nothing behind.
const CLEAR_EXPIRED: &str = "DELETE FROM `{locks}` \
     WHERE name = ? AND owner = ? AND token = ? AND expires_at <= UTC_TIMESTAMP(6)";

/// Renewal: extend a live grant to at least `ttl` from now (never shorten: see [`JOIN`]).
const RENEW: &str = "UPDATE `{locks}` \
     SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
     WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)";

/// An election's leader proclaims its value: stored with the grant's token as its epoch, only
/// while the grant (owner and token) holds the row live by the server's clock, the condition
/// of [`RENEW`]. One row (the driver asks for found rows, not changed rows, so a proclaim of
/// the same value again is 1) or none (not held: expired, released, taken over, handed over).
/// No lock statement reads or writes these two columns: a row taken over or handed over in
/// place keeps the old value under the old token, which [`INSPECT`] does not show.
const PROCLAIM: &str = "UPDATE `{locks}` SET value = ?, value_token = token \
     WHERE name = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)";

/// The sweeper: delete at most `?` expired rows. The condition is evaluated on the locked,
/// current version of each row, so a row renewed a moment earlier is not deleted.
const SWEEP: &str = "DELETE FROM `{locks}` WHERE expires_at <= UTC_TIMESTAMP(6) LIMIT ?";

/// The width of the lock table's `owner` column, to widen a table made for shorter owner ids.
/// (`{locks}` is validated to letters, digits, `_` and `$`, so quoting it as a string is safe.)
const OWNER_WIDTH: &str = "SELECT CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED) \
     FROM information_schema.COLUMNS \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{locks}' AND COLUMN_NAME = 'owner'";

/// The owner column as `create_locks.sql` makes it: room for every owner id's text.
const WIDEN_OWNER: &str = "ALTER TABLE `{locks}` MODIFY owner VARBINARY(81) NOT NULL";

/// Which of the columns added since the first version the lock table has: `granted_at`,
/// `value` and `value_token` (1 or 0 each; tables made before them have not).
const LATER_COLUMNS: &str = "SELECT COUNT(CASE WHEN COLUMN_NAME = 'granted_at' THEN 1 END), \
     COUNT(CASE WHEN COLUMN_NAME = 'value' THEN 1 END), \
     COUNT(CASE WHEN COLUMN_NAME = 'value_token' THEN 1 END) \
     FROM information_schema.COLUMNS \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{locks}'";

/// Adds the `granted_at` column to a table made before it.
const ADD_GRANTED_AT: &str = "ALTER TABLE `{locks}` ADD COLUMN granted_at DATETIME(6) NULL";

/// Adds the `value` column (an election leader's value) to a table made before it.
const ADD_VALUE: &str = "ALTER TABLE `{locks}` ADD COLUMN value BLOB NULL";

/// Adds the `value_token` column (the epoch of `value`) to a table made before it.
const ADD_VALUE_TOKEN: &str = "ALTER TABLE `{locks}` ADD COLUMN value_token BIGINT UNSIGNED NULL";

/// The owner column's width in bytes: [`distlock_api::MAX_OWNER_TEXT_LEN`].
pub(crate) const OWNER_COLUMN_WIDTH: i64 = 81;

/// The server's version string, for docs and errors.
pub(crate) const VERSION: &str = "SELECT VERSION()";

/// The statements of one client, rendered for its table names once at connect. `Arc<str>`, so
/// each use is a reference-count bump and the driver's prepared-statement cache keys match.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) create_locks: Arc<str>,
    pub(crate) create_fencing: Arc<str>,
    pub(crate) check_locks: Arc<str>,
    pub(crate) check_fencing: Arc<str>,
    pub(crate) owner_width: Arc<str>,
    pub(crate) widen_owner: Arc<str>,
    pub(crate) read: Arc<str>,
    pub(crate) inspect: Arc<str>,
    pub(crate) list: Arc<str>,
    pub(crate) later_columns: Arc<str>,
    pub(crate) add_granted_at: Arc<str>,
    pub(crate) add_value: Arc<str>,
    pub(crate) add_value_token: Arc<str>,
    pub(crate) bump_fencing: Arc<str>,
    pub(crate) insert: Arc<str>,
    pub(crate) takeover: Arc<str>,
    pub(crate) join: Arc<str>,
    pub(crate) release_last: Arc<str>,
    pub(crate) release_one: Arc<str>,
    pub(crate) probe: Arc<str>,
    pub(crate) clear_expired: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) sweep: Arc<str>,
    pub(crate) proclaim: Arc<str>,
    /// The statements of semaphore permits (`sql/permit.rs`).
    pub(crate) permit: PermitStatements,
    grant_in_one: Arc<str>,
    rollback_and_read: Arc<str>,
    hand_over: Arc<str>,
    hand_over_last: Arc<str>,
    /// The lock table's (validated) name, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) locks: Arc<str>,
}

impl Statements {
    /// Renders every statement for these (already validated) table names.
    pub(crate) fn new(locks: &str, fencing: &str) -> Self {
        let permits = permit_table(locks);
        let marker = format!("'{MARKER}'");
        let r = |sql: &str| -> Arc<str> {
            sql.replace("{locks}", locks)
                .replace("{fencing}", fencing)
                .replace("{permits}", &permits)
                .replace("{marker}", &marker)
                .into()
        };
        Self {
            permit: PermitStatements::new(&permits, r),
            create_locks: r(CREATE_LOCKS),
            create_fencing: r(CREATE_FENCING),
            check_locks: r(CHECK_LOCKS),
            check_fencing: r(CHECK_FENCING),
            owner_width: r(OWNER_WIDTH),
            widen_owner: r(WIDEN_OWNER),
            read: r(READ),
            inspect: r(INSPECT),
            list: r(LIST),
            later_columns: r(LATER_COLUMNS),
            add_granted_at: r(ADD_GRANTED_AT),
            add_value: r(ADD_VALUE),
            add_value_token: r(ADD_VALUE_TOKEN),
            bump_fencing: r(BUMP_FENCING),
            insert: r(INSERT),
            takeover: r(TAKEOVER),
            join: r(JOIN),
            release_last: r(RELEASE_LAST),
            release_one: r(RELEASE_ONE),
            probe: r(PROBE),
            clear_expired: r(CLEAR_EXPIRED),
            renew: r(RENEW),
            sweep: r(SWEEP),
            proclaim: r(PROCLAIM),
            grant_in_one: r(GRANT_IN_ONE),
            rollback_and_read: r(ROLLBACK_AND_READ),
            hand_over: r(HAND_OVER),
            hand_over_last: r(HAND_OVER_LAST),
            #[cfg(feature = "testing")]
            locks: locks.into(),
        }
    }
}

impl Statements {
    /// [`GRANT_IN_ONE`] for `name`, `owner` and a lease of `ttl_us` microseconds.
    pub(crate) fn grant_in_one(&self, name: &[u8], owner: &[u8], ttl_us: u64) -> String {
        self.grant_in_one
            .replace("{name}", &hex_literal(name))
            .replace("{owner}", &hex_literal(owner))
            .replace("{ttl}", &ttl_us.to_string())
    }

    /// [`HAND_OVER_LAST`] and [`HAND_OVER`] of `name` from the grant of `from` with `token` to
    /// `to`, with a lease of `ttl_us` microseconds.
    pub(crate) fn hand_over(
        &self,
        name: &[u8],
        from: &[u8],
        token: u64,
        to: &[u8],
        ttl_us: u64,
    ) -> (String, String) {
        let fill = |sql: &str| {
            sql.replace("{name}", &hex_literal(name))
                .replace("{from}", &hex_literal(from))
                .replace("{token}", &token.to_string())
                .replace("{to}", &hex_literal(to))
                .replace("{ttl}", &ttl_us.to_string())
        };
        (fill(&self.hand_over_last), fill(&self.hand_over))
    }

    /// [`ROLLBACK_AND_READ`] for `name`.
    pub(crate) fn rollback_and_read(&self, name: &[u8]) -> String {
        self.rollback_and_read.replace("{name}", &hex_literal(name))
    }
}

/// `bytes` as an SQL hexadecimal literal (`X'61'`): a binary string whatever the bytes are, so
/// no value written into a statement can be read as SQL.
fn hex_literal(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(3 + 2 * bytes.len());
    out.push_str("X'");
    for b in bytes {
        let _ = write!(out, "{b:02X}");
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_column_holds_every_owner_id() {
        assert_eq!(
            OWNER_COLUMN_WIDTH as usize,
            distlock_api::MAX_OWNER_TEXT_LEN
        );
        assert!(CREATE_LOCKS.contains("owner      VARBINARY(81)"));
        assert!(WIDEN_OWNER.contains("VARBINARY(81)"));
        assert!(Statements::new("l_t", "f_t").owner_width.contains("'l_t'"));
    }

    #[test]
    fn values_written_into_the_one_request_grant_are_hex_literals() {
        assert_eq!(hex_literal(b"a'; DROP"), "X'61273B2044524F50'");
        let s = Statements::new("l_t", "f_t");
        let sql = s.grant_in_one(b"n'", b"o#1", 1_500);
        assert!(sql.contains("`f_t` (name, value) VALUES (X'6E27', LAST_INSERT_ID(1))"));
        assert!(sql.contains("VALUES (X'6E27', X'6F2331', 1, LAST_INSERT_ID(),"));
        assert!(sql.contains("INTERVAL 1500 MICROSECOND"));
        assert!(!sql.contains('{'), "{sql}");
        let (last, full) = s.hand_over(b"n'", b"o#1", u64::MAX, b"p#2", 2_500);
        for ho in [&last, &full] {
            assert!(
                ho.starts_with("BEGIN; DO LAST_INSERT_ID(0); UPDATE `f_t`"),
                "{ho}"
            );
            assert!(ho.contains("owner = X'6F2331' AND token = 18446744073709551615"));
            assert!(ho.contains("SET owner = X'702332', hold_count = 1, token = LAST_INSERT_ID()"));
            assert!(ho.contains("INTERVAL 2500 MICROSECOND") && ho.ends_with("COMMIT"));
            assert!(!ho.contains('{') && !ho.contains("NOW("), "{ho}");
        }
        assert!(last.len() < full.len());
        let read = s.rollback_and_read(b"n");
        assert!(read.starts_with("ROLLBACK; SELECT") && read.ends_with("WHERE name = X'6E'"));
    }

    #[test]
    fn every_placeholder_is_rendered() {
        let s = Statements::new("l_t", "f_t");
        for sql in [
            &s.create_locks,
            &s.create_fencing,
            &s.check_locks,
            &s.check_fencing,
            &s.widen_owner,
            &s.read,
            &s.inspect,
            &s.list,
            &s.add_granted_at,
            &s.add_value,
            &s.add_value_token,
            &s.proclaim,
            &s.bump_fencing,
            &s.insert,
            &s.takeover,
            &s.join,
            &s.release_last,
            &s.release_one,
            &s.probe,
            &s.clear_expired,
            &s.renew,
            &s.sweep,
        ]
        .into_iter()
        .chain(s.permit.all())
        {
            assert!(!sql.contains('{') && !sql.contains('}'), "{sql}");
            assert!(
                sql.contains("`l_t`") || sql.contains("`f_t`") || sql.contains("`l_t_permits`"),
                "{sql}"
            );
            assert!(!sql.contains("NOW("), "client-zone clock in {sql}");
        }
    }
}
