CREATE TABLE IF NOT EXISTS "{locks}" (
    name        text COLLATE "C" PRIMARY KEY,
    owner       text NOT NULL,
    token       bigint NOT NULL CHECK (token > 0),
    hold_count  integer NOT NULL CHECK (hold_count > 0),
    expires_at  timestamptz NOT NULL,
    since       timestamptz NOT NULL,
    value       text,
    value_epoch bigint
);
CREATE INDEX IF NOT EXISTS "{locks}_expires_at" ON "{locks}" (expires_at);
