//! The text sent to the server: every statement of the lock table, built once per client with
//! its table names spliced in (identifiers cannot be bound; the config allows only
//! `[a-z0-9_]`, and the statements quote them on top).
//!
//! Every statement reads the server's clock once, as `t.now` (`clock_timestamp()` in a
//! materialized CTE), so that one statement judges one instant: a row is live while
//! `expires_at > t.now`. A statement that waited for a row lock judges with the instant it
//! started at, which errs on the safe side: a lease looks live a little longer, and a lease it
//! grants, counted from that instant, still ends no earlier than the request's send plus the
//! TTL.

pub(crate) mod permit;

/// The statements of one client, for its lock table `locks`, fencing table `fencing` and
/// permit table `permits`.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    pub(crate) locks: String,
    pub(crate) fencing: String,
    pub(crate) permits: String,
    /// `$1` name, `$2` owner, `$3` lease in µs. One row: granted (bool), token, hold count,
    /// (when held by another) the holder's µs of lease left, and (when the holder is a
    /// semaphore's marker) the semaphore's max.
    pub(crate) acquire: String,
    /// `$1` name, `$2` owner, `$3` token, `$4` the channel. One row: how many holds were taken
    /// away from a live grant (0 or 1).
    pub(crate) release: String,
    /// `$1` names, `$2` owners, `$3` tokens, `$4` leases in µs (arrays of one length). The
    /// 1-based positions of the grants renewed.
    pub(crate) renew: String,
    /// `$1` name. The live grant: owner, hold count, token, µs left, since (ms), value; for a
    /// semaphore (its marker) the oldest live permit's, with whether it is a marker, how many
    /// permits are live, and the max.
    pub(crate) inspect: String,
    /// `$1` prefix. Every live grant whose name starts with it, the name first, in name order.
    pub(crate) list: String,
    /// `$1` name, `$2` owner, `$3` token, `$4` value, `$5` the channel.
    pub(crate) proclaim: String,
    /// `$1` rows at most. Deletes expired rows.
    pub(crate) sweep: String,
    /// The permits' statements ([`permit`]).
    pub(crate) permit: PermitStatements,
}

/// The statements of the permit table, with the table names spliced in.
#[derive(Clone, Debug)]
pub(crate) struct PermitStatements {
    pub(crate) counter_lock: String,
    pub(crate) counter_hold: String,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) renew: String,
    pub(crate) owned: String,
    pub(crate) sweep: String,
}

impl Statements {
    pub(crate) fn new(locks: &str, fencing: &str) -> Self {
        let permits = permit_table(locks);
        let fill = |s: &str| {
            s.replace("{locks}", locks)
                .replace("{fencing}", fencing)
                .replace("{permits}", &permits)
                .replace("{marker}", permit::MARKER)
        };
        Self {
            locks: locks.to_string(),
            fencing: fencing.to_string(),
            acquire: fill(ACQUIRE),
            release: fill(RELEASE),
            renew: fill(RENEW),
            inspect: fill(&format!(
                "{INFO} WHERE l.name = $1 AND l.expires_at > t.now"
            )),
            list: fill(&format!(
                "{INFO} WHERE starts_with(l.name, $1) AND l.expires_at > t.now ORDER BY l.name"
            )),
            proclaim: fill(PROCLAIM),
            sweep: fill(SWEEP),
            permit: PermitStatements {
                counter_lock: fill(permit::COUNTER_LOCK),
                counter_hold: fill(permit::COUNTER_HOLD),
                acquire: fill(permit::ACQUIRE),
                release: fill(permit::RELEASE),
                renew: fill(permit::RENEW),
                owned: fill(permit::OWNED),
                sweep: fill(permit::SWEEP),
            },
            permits,
        }
    }

    /// The DDL of the three tables, as `connect` runs it.
    pub(crate) fn create_tables(&self) -> String {
        format!(
            "{}\n{}\n{}",
            crate::LOCK_TABLE_DDL.replace("{locks}", &self.locks),
            crate::FENCING_TABLE_DDL.replace("{fencing}", &self.fencing),
            crate::PERMIT_TABLE_DDL.replace("{permits}", &self.permits)
        )
    }
}

/// The permit table of the lock table `locks`: its name with `_permits`.
pub(crate) fn permit_table(locks: &str) -> String {
    format!("{locks}_permits")
}

/// One statement: the counter is bumped (taking its row lock until commit) unless the row, as
/// the statement's snapshot shows it, is live and another owner's; then the row is inserted,
/// or taken over if expired, or re-entered (same token, one more hold) if live and the same
/// owner's. Tokens of fresh grants thus come from bumps made under the counter row's lock in
/// the same transaction as the grant: strictly increasing in grant order. A bump whose grant
/// loses a race (or re-enters) leaves a gap, never a repeat.
const ACQUIRE: &str = r#"WITH t AS MATERIALIZED (SELECT clock_timestamp() AS now),
cur AS (
    SELECT l.owner, l.hold_count, l.expires_at > t.now AS live,
           (EXTRACT(EPOCH FROM (l.expires_at - t.now)) * 1000000)::bigint AS remaining_us
    FROM "{locks}" l, t WHERE l.name = $1
),
bump AS (
    INSERT INTO "{fencing}" AS c (name, token)
    SELECT $1, 1 WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.live AND cur.owner <> $2)
    ON CONFLICT (name) DO UPDATE SET token = c.token + 1
    RETURNING c.token
),
won AS (
    INSERT INTO "{locks}" AS x (name, owner, token, hold_count, expires_at, since)
    SELECT $1, $2, bump.token, 1, t.now + $3 * interval '1 microsecond', t.now FROM bump, t
    ON CONFLICT (name) DO UPDATE SET
        token = CASE WHEN x.expires_at > (SELECT now FROM t) THEN x.token ELSE EXCLUDED.token END,
        hold_count = CASE WHEN x.expires_at > (SELECT now FROM t) THEN x.hold_count + 1 ELSE 1 END,
        since = CASE WHEN x.expires_at > (SELECT now FROM t) THEN x.since ELSE EXCLUDED.since END,
        expires_at = GREATEST(x.expires_at, EXCLUDED.expires_at),
        owner = EXCLUDED.owner
    WHERE x.expires_at <= (SELECT now FROM t) OR x.owner = EXCLUDED.owner
    RETURNING x.token, x.hold_count
)
SELECT true AS granted, won.token, won.hold_count, NULL::bigint AS remaining_us,
       NULL::integer AS size FROM won
UNION ALL
SELECT false, NULL, NULL, (SELECT remaining_us FROM cur),
       (SELECT hold_count FROM cur WHERE cur.live AND cur.owner = '{marker}')
WHERE NOT EXISTS (SELECT 1 FROM won)"#;

/// The last hold (or an expired grant) deletes the row and notifies the table's channel with
/// the name as payload (delivered at commit); an earlier hold takes one away. Only the grant
/// (owner and token) is touched.
///
/// The choice between the two is made on the row as `cur` locks it (`FOR UPDATE` waits for a
/// concurrent release of another hold and then reads the row as that one left it), not on the
/// statement's snapshot: judged on the snapshot, two holds released together each saw two and
/// each took one away, one of them finding the row changed and doing nothing, so the last
/// hold stayed until the lease ran out.
const RELEASE: &str = r#"WITH t AS MATERIALIZED (SELECT clock_timestamp() AS now),
cur AS MATERIALIZED (
    SELECT l.hold_count, l.expires_at > t.now AS live FROM "{locks}" l, t
    WHERE l.name = $1 AND l.owner = $2 AND l.token = $3
    FOR UPDATE OF l
),
gone AS (
    DELETE FROM "{locks}" l USING cur
    WHERE l.name = $1 AND l.owner = $2 AND l.token = $3
      AND (cur.hold_count <= 1 OR NOT cur.live)
    RETURNING cur.live
),
less AS (
    UPDATE "{locks}" l SET hold_count = cur.hold_count - 1 FROM cur
    WHERE l.name = $1 AND l.owner = $2 AND l.token = $3
      AND cur.hold_count > 1 AND cur.live
    RETURNING l.hold_count
),
told AS (SELECT pg_notify($4, $1) FROM gone)
SELECT (SELECT count(*) FROM gone WHERE live) + (SELECT count(*) FROM less)
     + 0 * (SELECT count(*) FROM told) AS released"#;

/// One statement for a batch: each live grant's expiry becomes the later of its own and now
/// plus its lease (never shortened).
///
/// Rows are found by name, and the plan must not depend on the table's statistics: with those
/// of a nearly empty table (a client taking 10,000 locks within a second, before autovacuum
/// analyses it) the planner believed the table held one row and scanned all of it once per
/// grant of the batch (through the expiry index, or the whole primary key), over a second per
/// statement, and the watchdog fell behind until every lease ran out. `name = ANY($1)` gives it
/// an index condition on the primary key for the whole batch (or at worst one pass over the
/// table), and the liveness test is written so that the expiry index cannot serve it.
const RENEW: &str = r#"WITH t AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE "{locks}" l
SET expires_at = GREATEST(l.expires_at, t.now + r.ttl_us * interval '1 microsecond')
FROM t, unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
     WITH ORDINALITY AS r(name, owner, token, ttl_us, i)
WHERE l.name = ANY($1::text[]) AND l.name = r.name AND l.owner = r.owner AND l.token = r.token
  AND l.expires_at - t.now > interval '0'
RETURNING r.i"#;

/// The columns inspect and list read; the value only under the epoch it was proclaimed in.
/// A semaphore's marker shows its oldest live permit (the permit table is read only for a
/// marker: the lateral subquery's filter on the marker's owner is checked once per row).
const INFO: &str = r#"WITH t AS MATERIALIZED (SELECT clock_timestamp() AS now)
SELECT l.name, coalesce(p.owner, l.owner), coalesce(p.hold_count, l.hold_count),
       coalesce(p.token, l.token),
       (EXTRACT(EPOCH FROM (coalesce(p.expires_at, l.expires_at) - t.now)) * 1000000)::bigint
           AS remaining_us,
       (EXTRACT(EPOCH FROM coalesce(p.since, l.since)) * 1000)::bigint AS since_ms,
       CASE WHEN l.value_epoch = l.token THEN l.value END AS value,
       l.owner = '{marker}' AS marker, p.n, l.hold_count AS size
FROM "{locks}" l CROSS JOIN t
LEFT JOIN LATERAL (
    SELECT p.owner, p.hold_count, p.token, p.expires_at, p.since, count(*) OVER () AS n
    FROM "{permits}" p
    WHERE l.owner = '{marker}' AND p.name = l.name AND p.expires_at > t.now
    ORDER BY p.token LIMIT 1
) p ON true"#;

/// The value with the grant's token as its epoch, only while the grant holds; observers hear
/// of it on the channel.
const PROCLAIM: &str = r#"WITH t AS MATERIALIZED (SELECT clock_timestamp() AS now),
done AS (
    UPDATE "{locks}" l SET value = $4, value_epoch = l.token FROM t
    WHERE l.name = $1 AND l.owner = $2 AND l.token = $3 AND l.expires_at > t.now
    RETURNING l.name
),
told AS (SELECT pg_notify($5, $1) FROM done)
SELECT (SELECT count(*) FROM done) + 0 * (SELECT count(*) FROM told) AS proclaimed"#;

/// At most `$1` expired rows, skipping rows another transaction has locked (a takeover in
/// progress), rechecked at delete time.
const SWEEP: &str = r#"DELETE FROM "{locks}" WHERE name IN (
    SELECT name FROM "{locks}" WHERE expires_at <= clock_timestamp()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= clock_timestamp()"#;
