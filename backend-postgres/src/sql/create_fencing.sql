CREATE TABLE IF NOT EXISTS "{fencing}" (
    name  text COLLATE "C" PRIMARY KEY,
    token bigint NOT NULL
);
