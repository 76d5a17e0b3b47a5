CREATE TABLE IF NOT EXISTS "{permits}" (
    name        text COLLATE "C" NOT NULL,
    owner       text NOT NULL,
    token       bigint NOT NULL CHECK (token > 0),
    hold_count  integer NOT NULL CHECK (hold_count > 0),
    expires_at  timestamptz NOT NULL,
    since       timestamptz NOT NULL,
    PRIMARY KEY (name, owner)
);
CREATE INDEX IF NOT EXISTS "{permits}_exp" ON "{permits}" (expires_at);
