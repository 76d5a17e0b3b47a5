-- The lock table: one row per held lock (and per expired lock not yet taken over or swept).
-- `{locks}` is the configured table name (validated: 1 to 64 ASCII letters, digits, _ or $).
CREATE TABLE IF NOT EXISTS `{locks}` (
    -- The lock name as its UTF-8 bytes (1..=255). VARBINARY compares bytes: names are
    -- case-sensitive and trailing spaces count ('a' and 'a ' are two locks, which a PAD SPACE
    -- collation such as utf8mb4_bin would merge). 255 bytes is far below InnoDB's 767-byte
    -- (COMPACT) and 3072-byte (DYNAMIC) index key limits.
    name       VARBINARY(255)  NOT NULL,
    -- The holder's owner id: a label of 1..=64 bytes of [A-Za-z0-9-_.:] and a tag (# or @ and
    -- up to 16 hex digits) that tells acquisitions apart, compared byte for byte. Tables made
    -- with VARBINARY(64) are widened on connect (or the connect says how).
    owner      VARBINARY(81)   NOT NULL,
    -- How many times the owner holds it (reentrancy); the row is deleted when it reaches zero.
    hold_count INT UNSIGNED    NOT NULL,
    -- The grant's fencing token, taken from the fencing table in the granting transaction.
    token      BIGINT UNSIGNED NOT NULL,
    -- The end of the lease in UTC on the server's clock (UTC_TIMESTAMP(6)), to the microsecond.
    -- The row is live while expires_at > UTC_TIMESTAMP(6).
    expires_at DATETIME(6)     NOT NULL,
    -- When the grant began, in UTC on the server's clock; shown to operators, never used to
    -- judge a lease. NULL in rows written before the column was added on connect.
    granted_at DATETIME(6)     NULL,
    -- An election leader's value (UTF-8, up to 4096 bytes), written only by a proclaim of a
    -- live grant; shown only while `value_token` is the row's token, so a value left by an
    -- earlier grant (on a row taken over or handed over in place) is never shown. NULL until
    -- a proclaim; added on connect to tables made before it.
    value       BLOB            NULL,
    -- The token (epoch) of the grant that proclaimed `value`.
    value_token BIGINT UNSIGNED NULL,
    PRIMARY KEY (name),
    -- For the sweeper's range scan of expired rows.
    KEY expires_at (expires_at)
) ENGINE = InnoDB
