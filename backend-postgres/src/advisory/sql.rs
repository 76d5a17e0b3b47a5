//! The statements of advisory mode. The session lock of a key is the lock; the key's row in
//! the advisory table records which name, owner, grant (token) and session (`pid`) hold it,
//! and is believed only while `pg_locks` shows that session holding the key (a session that
//! ended leaves its row behind, stale, until the key is taken again or the sweeper goes by).

/// The advisory table of the lock table `locks`: its name with `_advisory`.
pub(crate) fn advisory_table(locks: &str) -> String {
    format!("{locks}_advisory")
}

/// Whether session `{pid}` holds the advisory lock of the 64-bit key `{key}` in this database
/// (`pg_locks` shows a bigint key's high half as `classid`, its low half as `objid`, and
/// `objsubid` 1).
const HELD: &str = "EXISTS (SELECT 1 FROM pg_locks k \
    WHERE k.locktype = 'advisory' AND k.granted AND k.pid = {pid} \
      AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
      AND k.classid = (({key} >> 32) & 4294967295)::oid \
      AND k.objid = ({key} & 4294967295)::oid AND k.objsubid = 1)";

fn held(key: &str, pid: &str) -> String {
    HELD.replace("{key}", key).replace("{pid}", pid)
}

/// `$1` key, `$2` name, `$3` owner. One row: whether the session took the key, the grant's
/// token (the name's counter, bumped only when the key was taken), and (when it was not) the
/// name the key's row records.
const ACQUIRE: &str = r#"WITH got AS MATERIALIZED (SELECT pg_try_advisory_lock($1) AS ok),
bump AS (
    INSERT INTO "{fencing}" AS c (name, token) SELECT $2, 1 FROM got WHERE got.ok
    ON CONFLICT (name) DO UPDATE SET token = c.token + 1
    RETURNING c.token
),
mark AS (
    INSERT INTO "{advisory}" AS a (key, name, owner, token, hold_count, pid, since)
    SELECT $1, $2, $3, bump.token, 1, pg_backend_pid(), clock_timestamp() FROM bump
    ON CONFLICT (key) DO UPDATE SET name = EXCLUDED.name, owner = EXCLUDED.owner,
        token = EXCLUDED.token, hold_count = 1, pid = EXCLUDED.pid, since = EXCLUDED.since,
        value = NULL
    RETURNING a.token
)
SELECT got.ok, (SELECT token FROM mark) AS token,
       (SELECT a.name FROM "{advisory}" a WHERE a.key = $1 AND NOT got.ok) AS recorded
FROM got"#;

/// `$1` key, `$2` token, `$3` hold count. The grant's row, as this session holds it.
const HOLDS: &str = r#"UPDATE "{advisory}" SET hold_count = $3
WHERE key = $1 AND token = $2 AND pid = pg_backend_pid()"#;

/// `$1` key, `$2` token, `$3` the channel, `$4` name. Deletes the grant's row, unlocks the key
/// (at once: session locks are not transactional) and notifies (at commit). One row: whether
/// the session held the key.
///
/// The commit does not wait for the disk (`synchronous_commit` off for this transaction
/// only): the row is believed only while `pg_locks` shows its session holding the key, so a
/// delete lost in a server crash leaves a row nobody believes (the next grant of the key
/// overwrites it, the sweeper removes it), and the key itself was never on disk. The acquire's
/// commit, which carries the fencing counter, still waits for the disk.
const RELEASE: &str = r#"WITH gone AS (
    DELETE FROM "{advisory}" WHERE key = $1 AND token = $2 AND pid = pg_backend_pid()
    RETURNING 1
),
u AS MATERIALIZED (SELECT pg_advisory_unlock($1) AS ok),
told AS (SELECT pg_notify($3, $4) FROM u WHERE u.ok),
lazy AS (SELECT set_config('synchronous_commit', 'off', true) AS s)
SELECT u.ok, (SELECT count(*) FROM gone) + 0 * (SELECT count(*) FROM told)
       + 0 * (SELECT count(*) FROM lazy) AS rows FROM u"#;

/// `$1` key. Unlocks it once.
pub(crate) const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

/// Sets the session's idle bound (`$1`, e.g. `10000ms`) and returns its backend pid.
pub(crate) const SESSION: &str =
    "SELECT set_config('idle_session_timeout', $1, false), pg_backend_pid()";

/// The session's backend pid (compared with [`SESSION`]'s: a transaction-pooling proxy hands
/// each statement to any server session).
pub(crate) const PID: &str = "SELECT pg_backend_pid()";

/// The keepalive probe.
pub(crate) const PING: &str = "SELECT 1";

/// The statements of advisory mode, with the table names spliced in.
#[derive(Clone, Debug)]
pub(crate) struct AdvisoryStatements {
    pub(crate) table: String,
    pub(crate) acquire: String,
    pub(crate) holds: String,
    pub(crate) release: String,
    /// `$1` keys, `$2` tokens. Each grant's position (1-based), whether this session holds
    /// its key, and whether the key's row still records the grant in this session.
    pub(crate) probe: String,
    /// `$1` key, `$2` name. The holder: owner, hold count, token, since (ms), value.
    pub(crate) inspect: String,
    /// `$1` prefix. Every held name starting with it, the name first, in name order.
    pub(crate) list: String,
    /// `$1` key, `$2` name, `$3` token, `$4` value, `$5` the channel.
    pub(crate) proclaim: String,
    /// `$1` key, `$2` name, `$3` token, `$4` the channel. Deletes the row of a held grant: its
    /// holder finds it gone at its next probe and unlocks.
    pub(crate) force: String,
    /// `$1` rows at most. Deletes rows whose session no longer holds their key.
    pub(crate) sweep: String,
    /// The DDL.
    pub(crate) create: String,
}

impl AdvisoryStatements {
    pub(crate) fn new(locks: &str, fencing: &str) -> Self {
        let table = advisory_table(locks);
        let fill = |s: &str| {
            s.replace("{advisory}", &table)
                .replace("{fencing}", fencing)
        };
        let info = format!(
            "SELECT a.name, a.owner, a.hold_count, a.token, \
             (EXTRACT(EPOCH FROM a.since) * 1000)::bigint AS since_ms, a.value \
             FROM \"{{advisory}}\" a WHERE {}",
            held("a.key", "a.pid")
        );
        Self {
            acquire: fill(ACQUIRE),
            holds: fill(HOLDS),
            release: fill(RELEASE),
            probe: fill(&format!(
                "SELECT r.i, {}, EXISTS (SELECT 1 FROM \"{{advisory}}\" a WHERE a.key = r.key \
                 AND a.token = r.token AND a.pid = pg_backend_pid()) \
                 FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY AS r(key, token, i)",
                held("r.key", "pg_backend_pid()")
            )),
            inspect: fill(&format!("{info} AND a.key = $1 AND a.name = $2")),
            list: fill(&format!(
                "{info} AND starts_with(a.name, $1) ORDER BY a.name"
            )),
            proclaim: fill(&format!(
                "WITH done AS (UPDATE \"{{advisory}}\" a SET value = $4 \
                 WHERE a.key = $1 AND a.name = $2 AND a.token = $3 AND {} RETURNING 1), \
                 told AS (SELECT pg_notify($5, $2) FROM done) \
                 SELECT (SELECT count(*) FROM done) + 0 * (SELECT count(*) FROM told)",
                held("a.key", "a.pid")
            )),
            force: fill(&format!(
                "WITH gone AS (DELETE FROM \"{{advisory}}\" a \
                 WHERE a.key = $1 AND a.name = $2 AND a.token = $3 AND {} RETURNING 1), \
                 told AS (SELECT pg_notify($4, $2) FROM gone) \
                 SELECT (SELECT count(*) FROM gone) + 0 * (SELECT count(*) FROM told)",
                held("a.key", "a.pid")
            )),
            sweep: fill(&format!(
                "DELETE FROM \"{{advisory}}\" a WHERE a.key IN (\
                 SELECT b.key FROM \"{{advisory}}\" b WHERE NOT {} \
                 LIMIT $1 FOR UPDATE SKIP LOCKED) AND NOT {}",
                held("b.key", "b.pid"),
                held("a.key", "a.pid")
            )),
            create: crate::ADVISORY_TABLE_DDL.replace("{advisory}", &table),
            table,
        }
    }
}
