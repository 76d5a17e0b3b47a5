-- The permit table: one row per held semaphore permit (and per expired permit not yet swept or
-- dropped by the next permit grant of its name). While a name has live permits, the lock table
-- holds its marker row (owner '#semaphore', hold_count = the semaphore's max, expires_at = the
-- latest expiry of its live permits), so a lock request finds the name held without reading
-- this table. `{permits}` is the lock table's name with `_permits` appended (shortened with a
-- hash if that would pass 64 characters).
CREATE TABLE IF NOT EXISTS `{permits}` (
    -- The semaphore's name, as the lock table keeps it.
    name       VARBINARY(255)  NOT NULL,
    -- The permit's holder, as the lock table keeps it; one permit per owner and name.
    owner      VARBINARY(81)   NOT NULL,
    -- How many times the owner holds this permit (re-entry); deleted when it reaches zero.
    hold_count INT UNSIGNED    NOT NULL,
    -- The permit's fencing token, from the name's one counter (shared with the lock).
    token      BIGINT UNSIGNED NOT NULL,
    -- The semaphore's size (max) the permit was granted under: every live permit of a name has
    -- the same, which the name's marker row also keeps as its hold count.
    permits    INT UNSIGNED    NOT NULL,
    -- The end of the permit's lease in UTC on the server's clock, as in the lock table.
    expires_at DATETIME(6)     NOT NULL,
    -- When the permit was granted, in UTC on the server's clock; shown to operators.
    granted_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (name, token),
    -- For the sweeper's range scan of expired rows.
    KEY expires_at (expires_at)
) ENGINE = InnoDB
