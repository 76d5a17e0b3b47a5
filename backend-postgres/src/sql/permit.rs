//! The statements of the semaphore's permits (see the crate docs, "Semaphores").
//!
//! A name with live permits keeps one *marker* row in the lock table: owner [`MARKER`] (no
//! owner id is that text), hold count the semaphore's `max`, and `expires_at` the latest
//! expiry of its live permits. The lock's statements see it as any live holder and never
//! touch it (their owner never matches); a lock request that finds it is refused by its
//! owner. Every statement here runs in a short transaction after [`COUNTER_LOCK`] or
//! [`COUNTER_HOLD`] took the row lock of the name's counter, and so reads (with a snapshot
//! taken after that lock) every permit and marker change made before it.

/// The owner of a semaphore's marker row in the lock table.
pub(crate) const MARKER: &str = "#semaphore";

/// `$1` name. Takes the row lock of the name's counter, creating it at 0 if the name was
/// never granted (a rollback takes it away again).
pub(crate) const COUNTER_LOCK: &str = r#"INSERT INTO "{fencing}" AS c (name, token) VALUES ($1, 0)
ON CONFLICT (name) DO UPDATE SET token = c.token RETURNING c.token"#;

/// `$1` name. Takes the row lock of the name's counter if it exists (a name without one has
/// no permits).
pub(crate) const COUNTER_HOLD: &str = r#"SELECT token FROM "{fencing}" WHERE name = $1 FOR UPDATE"#;

/// `$1` name, `$2` owner, `$3` lease in µs, `$4` max. One row: what (`grant`, `reenter`,
/// `held`, `lock`: held as a lock, `size`: held with another max), token, hold count,
/// whether the marker was written, the semaphore's max as stored, µs until the soonest live
/// permit's expiry. The caller commits only a grant or re-entry whose marker was written.
pub(crate) const ACQUIRE: &str = r#"WITH t AS MATERIALIZED (SELECT clock_timestamp() AS now),
lk AS (
    SELECT l.owner, l.hold_count, l.expires_at > t.now AS live
    FROM "{locks}" l, t WHERE l.name = $1
),
ps AS (
    SELECT count(*) FILTER (WHERE p.expires_at > t.now) AS n,
           min(p.expires_at) FILTER (WHERE p.expires_at > t.now) AS soonest,
           coalesce(bool_or(p.owner = $2 AND p.expires_at > t.now), false) AS mine
    FROM "{permits}" p, t WHERE p.name = $1
),
st AS MATERIALIZED (
    SELECT CASE
        WHEN lk.live AND lk.owner <> '{marker}' THEN 'lock'
        WHEN lk.live AND lk.hold_count <> $4 THEN 'size'
        WHEN ps.mine THEN 'reenter'
        WHEN ps.n < $4 THEN 'grant'
        ELSE 'held' END AS what,
        CASE WHEN lk.live THEN lk.hold_count END AS size,
        ps.soonest
    FROM ps LEFT JOIN lk ON true
),
re AS (
    UPDATE "{permits}" p SET hold_count = p.hold_count + 1,
        expires_at = GREATEST(p.expires_at, t.now + $3 * interval '1 microsecond')
    FROM t, st
    WHERE st.what = 'reenter' AND p.name = $1 AND p.owner = $2 AND p.expires_at > t.now
    RETURNING p.token, p.hold_count, p.expires_at
),
bump AS (
    UPDATE "{fencing}" c SET token = c.token + 1 FROM st
    WHERE st.what = 'grant' AND c.name = $1
    RETURNING c.token
),
gc AS (
    DELETE FROM "{permits}" p USING t, st
    WHERE st.what = 'grant' AND p.name = $1 AND p.owner <> $2 AND p.expires_at <= t.now
),
g AS (
    SELECT bump.token, t.now + $3 * interval '1 microsecond' AS expires_at FROM bump, t
    UNION ALL
    SELECT re.token, re.expires_at FROM re
),
mk AS (
    INSERT INTO "{locks}" AS x (name, owner, token, hold_count, expires_at, since)
    SELECT $1, '{marker}', g.token, $4, g.expires_at, t.now FROM g, t
    ON CONFLICT (name) DO UPDATE SET
        token = CASE WHEN x.expires_at > (SELECT now FROM t) THEN x.token ELSE EXCLUDED.token END,
        since = CASE WHEN x.expires_at > (SELECT now FROM t) THEN x.since ELSE EXCLUDED.since END,
        value = CASE WHEN x.expires_at > (SELECT now FROM t) THEN x.value END,
        value_epoch = CASE WHEN x.expires_at > (SELECT now FROM t) THEN x.value_epoch END,
        expires_at = GREATEST(x.expires_at, EXCLUDED.expires_at),
        hold_count = EXCLUDED.hold_count,
        owner = EXCLUDED.owner
    WHERE x.expires_at <= (SELECT now FROM t)
       OR (x.owner = '{marker}' AND x.hold_count = EXCLUDED.hold_count)
    RETURNING x.name
),
ins AS (
    INSERT INTO "{permits}" AS p (name, owner, token, hold_count, expires_at, since)
    SELECT $1, $2, bump.token, 1, t.now + $3 * interval '1 microsecond', t.now FROM bump, t
    WHERE EXISTS (SELECT 1 FROM mk)
    ON CONFLICT (name, owner) DO UPDATE SET token = EXCLUDED.token, hold_count = 1,
        expires_at = EXCLUDED.expires_at, since = EXCLUDED.since
    RETURNING p.token, p.hold_count
)
SELECT st.what,
       coalesce((SELECT token FROM ins), (SELECT token FROM re)) AS token,
       coalesce((SELECT hold_count FROM ins), (SELECT hold_count FROM re)) AS holds,
       EXISTS (SELECT 1 FROM mk) AS marked,
       st.size,
       (EXTRACT(EPOCH FROM (st.soonest - t.now)) * 1000000)::bigint AS remaining_us
FROM st, t"#;

/// `$1` name, `$2` owner (NULL: an operator's force-release of every hold), `$3` token, `$4`
/// the channel. A release takes one hold away from the grant (owner and token), deleting it
/// at its last hold or when expired; a force-release deletes the live permit of the token.
/// A permit that goes lowers the marker to the latest expiry of the live permits left, or
/// deletes it (and notifies) when none is left. One row: how many holds of a live permit
/// were taken away (0 or 1).
pub(crate) const RELEASE: &str = r#"WITH t AS MATERIALIZED (SELECT clock_timestamp() AS now),
gone AS (
    DELETE FROM "{permits}" p USING t
    WHERE p.name = $1 AND p.token = $3
      AND CASE WHEN $2::text IS NULL THEN p.expires_at > t.now
               ELSE p.owner = $2 AND (p.hold_count <= 1 OR p.expires_at <= t.now) END
    RETURNING p.expires_at > t.now AS live
),
less AS (
    UPDATE "{permits}" p SET hold_count = p.hold_count - 1 FROM t
    WHERE $2::text IS NOT NULL AND p.name = $1 AND p.owner = $2 AND p.token = $3
      AND p.hold_count > 1 AND p.expires_at > t.now
    RETURNING p.hold_count
),
rest AS (
    SELECT max(p.expires_at) AS until FROM "{permits}" p, t
    WHERE p.name = $1 AND p.expires_at > t.now AND p.token <> $3
),
lowered AS (
    UPDATE "{locks}" l SET expires_at = rest.until FROM rest
    WHERE EXISTS (SELECT 1 FROM gone) AND rest.until IS NOT NULL
      AND l.name = $1 AND l.owner = '{marker}'
),
unmarked AS (
    DELETE FROM "{locks}" l USING rest
    WHERE EXISTS (SELECT 1 FROM gone) AND rest.until IS NULL
      AND l.name = $1 AND l.owner = '{marker}'
),
told AS (SELECT pg_notify($4, $1) FROM gone)
SELECT (SELECT count(*) FROM gone WHERE live) + (SELECT count(*) FROM less)
     + 0 * (SELECT count(*) FROM told) AS released"#;

/// `$1` name, `$2` owner, `$3` token, `$4` lease in µs. The live permit's expiry becomes the
/// later of its own and now plus the lease, and the marker's at least that. One row: permits
/// renewed (0 or 1), markers raised (0 or 1); the caller commits only 1 and 1.
pub(crate) const RENEW: &str = r#"WITH t AS MATERIALIZED (SELECT clock_timestamp() AS now),
p AS (
    UPDATE "{permits}" p
    SET expires_at = GREATEST(p.expires_at, t.now + $4 * interval '1 microsecond') FROM t
    WHERE p.name = $1 AND p.owner = $2 AND p.token = $3 AND p.expires_at > t.now
    RETURNING p.expires_at
),
m AS (
    UPDATE "{locks}" l SET expires_at = GREATEST(l.expires_at, p.expires_at) FROM p, t
    WHERE l.name = $1 AND l.owner = '{marker}' AND l.expires_at > t.now
    RETURNING 1
)
SELECT (SELECT count(*) FROM p) AS renewed, (SELECT count(*) FROM m) AS marked"#;

/// `$1` name, `$2` owner. The owner's live permit of the name: token, hold count, the
/// semaphore's max.
pub(crate) const OWNED: &str = r#"SELECT p.token, p.hold_count, l.hold_count
FROM "{permits}" p JOIN "{locks}" l ON l.name = p.name AND l.owner = '{marker}'
WHERE p.name = $1 AND p.owner = $2 AND p.expires_at > clock_timestamp()"#;

/// `$1` rows at most. Deletes expired permits (their marker expires with the last of them).
pub(crate) const SWEEP: &str = r#"DELETE FROM "{permits}" WHERE (name, owner) IN (
    SELECT name, owner FROM "{permits}" WHERE expires_at <= clock_timestamp()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= clock_timestamp()"#;
