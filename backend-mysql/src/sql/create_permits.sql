-- The permit table: one row per held semaphore permit (and per expired permit not yet dropped
-- by the next acquire of its name or swept). A name's permits are granted one at a time under
-- the row lock of its counter in `{fencing}`, which also gives each permit its token.
-- `{permits}` is the lock table's name with `_permits` appended (shortened with a hash if that
-- would pass 64 characters).
CREATE TABLE IF NOT EXISTS `{permits}` (
    -- The semaphore's name, as the lock table keeps it.
    name       VARBINARY(255)  NOT NULL,
    -- The permit's holder, as the lock table keeps it; one permit per owner and name.
    owner      VARBINARY(81)   NOT NULL,
    -- How many times the owner holds this permit (re-entry); deleted when it reaches zero.
    hold_count INT UNSIGNED    NOT NULL,
    -- The permit's fencing token, from the name's one counter (shared with the lock).
    token      BIGINT UNSIGNED NOT NULL,
    -- The semaphore's size (max) its first holder asked for; every live permit of a name has
    -- the same, and a request with another is refused.
    permits    INT UNSIGNED    NOT NULL,
    -- The end of the permit's lease in UTC on the server's clock, as in the lock table.
    expires_at DATETIME(6)     NOT NULL,
    -- When the permit was granted, in UTC on the server's clock; shown to operators.
    granted_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (name, token),
    -- For the sweeper's range scan of expired rows.
    KEY expires_at (expires_at)
) ENGINE = InnoDB
