-- The fencing counters: one row per lock name ever granted, holding the last token issued.
-- Never swept and never deleted by distlock, so tokens keep increasing across release, expiry,
-- takeover and server restarts (InnoDB is durable).
-- `{fencing}` is the configured table name (validated: 1 to 64 ASCII letters, digits, _ or $).
CREATE TABLE IF NOT EXISTS `{fencing}` (
    name  VARBINARY(255)  NOT NULL,
    value BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB
