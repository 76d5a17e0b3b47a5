CREATE TABLE IF NOT EXISTS "{advisory}" (
    key         bigint PRIMARY KEY,
    name        text COLLATE "C" NOT NULL,
    owner       text NOT NULL,
    token       bigint NOT NULL CHECK (token > 0),
    hold_count  integer NOT NULL CHECK (hold_count > 0),
    pid         integer NOT NULL,
    since       timestamptz NOT NULL,
    value       text
);
CREATE INDEX IF NOT EXISTS "{advisory}_name" ON "{advisory}" (name);
