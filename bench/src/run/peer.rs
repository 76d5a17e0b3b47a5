//! Scenario 7: the Rust crates a user would pick instead, on the same servers in the same run,
//! in alternating slices with distlock's backend for that server: `rslock`, the most-used Rust
//! Redis lock crate, against distlock's Redis (and RedLock) backend, and sqlx's
//! `PgAdvisoryLock` against distlock's PostgreSQL backend in both its modes.
//!
//! The two do not buy the same thing per cycle: rslock sends `SET NX PX` and a compare-and-delete
//! script (no fencing token, no reentrancy, no wake-up notice, no watchdog), distlock-redis one
//! acquire script (hash + fencing `INCR`) and one release script (+ `PUBLISH`). Both are two
//! round trips, so the comparison shows client-side cost, not protocol differences. sqlx's lock
//! is a session advisory lock on a connection the caller holds: no lease, no token, no notice.

use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockOptions;
use distlock_postgres::sqlx::postgres::{PgAdvisoryLock, PgConnection};
use distlock_postgres::sqlx::ConnectOptions;
use distlock_postgres::{Mode, PostgresConfig, PostgresLock};
use distlock_redis::redis;
use rslock::LockManager;

use crate::error::Res;
use crate::model::PeerResult;
use crate::run::plan::Plan;
use crate::run::progress::Progress;
use crate::run::scenarios::{
    measure_cycles, unique_name, Cycle, LockCycle, Measured, ACQUIRE_WAIT,
};
use crate::run::targets::{self, Kind};

/// rslock's lease per lock; long enough that nothing expires mid-cycle.
const TTL: Duration = Duration::from_secs(30);

const RSLOCK: &str = "rslock 0.10";

struct RslockCycle {
    manager: LockManager,
    name: String,
}

#[async_trait]
impl Cycle for RslockCycle {
    async fn once(&mut self) -> Res<()> {
        let lock = self
            .manager
            .lock(self.name.as_str(), TTL)
            .await
            .map_err(|e| format!("rslock: {e}"))?;
        self.manager.unlock(&lock).await;
        Ok(())
    }
}

/// rslock against distlock-redis on one server, and against RedLock on three when those
/// answer.
pub(crate) async fn run(plan: &Plan, progress: &Progress, with_redlock: bool) -> Vec<PeerResult> {
    let mut out = Vec::new();
    let kinds: &[Kind] = if with_redlock {
        &[Kind::Redis, Kind::Redlock]
    } else {
        &[Kind::Redis]
    };
    for &kind in kinds {
        let urls = match kind {
            Kind::Redlock => crate::run::targets::redlock_urls(&kind.url()),
            _ => vec![kind.url()],
        };
        let peer = format!(
            "{RSLOCK} ({} instance{})",
            urls.len(),
            if urls.len() == 1 { "" } else { "s" }
        );
        let mut result = PeerResult {
            peer,
            against: kind.id().into(),
            peer_cycle: None,
            peer_per_sec: 0.0,
            distlock_cycle: None,
            distlock_per_sec: 0.0,
            note: match kind {
                Kind::Redlock => "rslock: SET NX PX on every instance, then the delete script on \
                                  every instance (2 parallel rounds); distlock RedLock: acquire \
                                  and release scripts (2 parallel rounds, each ending at a \
                                  majority; the derived token's write-back round only when the \
                                  majority's counters disagree, which they do not here)"
                    .into(),
                _ => "rslock: SET NX PX + EVALSHA compare-and-delete; distlock: EVALSHA acquire \
                      (hash, fencing INCR) + EVALSHA release (+ PUBLISH); both 2 round trips"
                    .into(),
            },
            distlock: None,
            error: None,
            server_us_per_cycle: None,
        };
        match compare(kind, urls, plan).await {
            Ok((ours, theirs, server)) => {
                result.server_us_per_cycle = server;
                result.distlock_per_sec = ours.per_sec();
                result.distlock_cycle = Some(ours.latencies.summary());
                result.peer_per_sec = theirs.per_sec();
                result.peer_cycle = Some(theirs.latencies.summary());
            }
            Err(e) => {
                progress.note(&format!("rslock vs {}: not measured ({e})", kind.id()));
                result.error = Some(e.to_string());
            }
        }
        out.push(result);
    }
    out
}

async fn compare(
    kind: Kind,
    urls: Vec<String>,
    plan: &Plan,
) -> Res<(Measured, Measured, Option<(f64, f64)>)> {
    let target = targets::open(kind).await?;
    let mut ours = LockCycle {
        lock: target.client().await?,
        name: unique_name("peer-distlock"),
        opts: LockOptions::new().wait(ACQUIRE_WAIT),
    };
    let clients = urls
        .iter()
        .map(|u| redis::Client::open(u.as_str()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut manager = LockManager::from_clients(clients);
    // An uncontended cycle never retries; a failure should surface at once, not after
    // rslock's default three tries 200 ms apart.
    manager.set_retry(1, Duration::from_millis(1));
    let mut theirs = RslockCycle {
        manager,
        name: unique_name("peer-rslock"),
    };
    let (ours_measured, theirs_measured) = alternate(&mut ours, &mut theirs, plan).await?;
    // What each cycle costs the servers themselves (every master, for RedLock), the part of
    // the gap that no client-side work can close: on this machine the servers share the
    // client's cores, so their time is latency.
    let cycles = if plan.quick { 200 } else { 2000 };
    let ours_us = server_us_per_cycle(&urls, &mut ours, cycles).await?;
    let theirs_us = server_us_per_cycle(&urls, &mut theirs, cycles).await?;
    Ok((ours_measured, theirs_measured, Some((ours_us, theirs_us))))
}

/// The servers' own time per cycle of `cycle`: `INFO commandstats`' microseconds summed over
/// every command and every server in `urls`, before and after `cycles` cycles (nothing else
/// uses them meanwhile).
async fn server_us_per_cycle(urls: &[String], cycle: &mut dyn Cycle, cycles: u32) -> Res<f64> {
    let mut cons = Vec::new();
    for url in urls {
        let client = redis::Client::open(url.as_str())?;
        cons.push(client.get_multiplexed_async_connection().await?);
    }
    let busy_us = || {
        let cons = cons.clone();
        async move {
            let mut sum = 0.0;
            for mut con in cons {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(&mut con)
                    .await?;
                sum += info
                    .lines()
                    .filter_map(|l| l.split("usec=").nth(1))
                    .filter_map(|rest| rest.split(',').next()?.parse::<f64>().ok())
                    .sum::<f64>();
            }
            Res::Ok(sum)
        }
    };
    let before = busy_us().await?;
    for _ in 0..cycles {
        cycle.once().await?;
    }
    let after = busy_us().await?;
    // The INFO calls themselves are counted once in `after`: negligible against the cycles.
    Ok((after - before) / f64::from(cycles))
}

/// sqlx's version, as the lock file pins it.
const SQLX: &str = "sqlx 0.9 PgAdvisoryLock";

struct SqlxCycle {
    conn: PgConnection,
    lock: PgAdvisoryLock,
}

#[async_trait]
impl Cycle for SqlxCycle {
    async fn once(&mut self) -> Res<()> {
        let guard = self.lock.acquire(&mut self.conn).await?;
        guard.release_now().await?;
        Ok(())
    }
}

/// sqlx's advisory lock against distlock-postgres in table mode (the default) and in advisory
/// mode (the same server mechanism as sqlx's).
pub(crate) async fn sqlx(plan: &Plan, progress: &Progress) -> Vec<PeerResult> {
    let mut out = Vec::new();
    for mode in [Mode::Table, Mode::Advisory] {
        let (distlock, note) = match mode {
            Mode::Table => (
                None,
                "sqlx: `SELECT pg_advisory_lock($1)` + `SELECT pg_advisory_unlock($1)` on one \
                 connection the caller holds (no lease: the lock lives as long as the session; \
                 no token, no notice; nothing written); distlock table mode: one acquire \
                 statement (row upsert + fencing counter bump) + one release statement (delete \
                 + `pg_notify`), each a durable commit; both 2 round trips",
            ),
            Mode::Advisory => (
                Some("distlock-postgres (advisory mode)".to_string()),
                "sqlx as above; distlock advisory mode, on the client's dedicated session: \
                 `pg_try_advisory_lock`, the fencing counter bump and the holder's row (its \
                 token) in one statement (a durable commit), the row's delete, \
                 `pg_advisory_unlock` and `pg_notify` in another (its commit not waited for); \
                 both 2 round trips",
            ),
        };
        let mut result = PeerResult {
            peer: SQLX.into(),
            against: Kind::Postgres.id().into(),
            peer_cycle: None,
            peer_per_sec: 0.0,
            distlock_cycle: None,
            distlock_per_sec: 0.0,
            note: note.into(),
            distlock,
            error: None,
            server_us_per_cycle: None,
        };
        match compare_sqlx(mode, plan).await {
            Ok((ours, theirs)) => {
                result.distlock_per_sec = ours.per_sec();
                result.distlock_cycle = Some(ours.latencies.summary());
                result.peer_per_sec = theirs.per_sec();
                result.peer_cycle = Some(theirs.latencies.summary());
            }
            Err(e) => {
                progress.note(&format!("sqlx vs postgres ({mode:?}): not measured ({e})"));
                result.error = Some(e.to_string());
            }
        }
        out.push(result);
    }
    out
}

async fn compare_sqlx(mode: Mode, plan: &Plan) -> Res<(Measured, Measured)> {
    let config = PostgresConfig::from_url(&Kind::Postgres.url())?
        .connect_timeout(Duration::from_secs(3))
        .mode(mode);
    let conn = tokio::time::timeout(Duration::from_secs(3), config.connect_options().connect())
        .await
        .map_err(|_| "no PostgreSQL connection within 3 s")??;
    let mut ours = LockCycle {
        lock: std::sync::Arc::new(PostgresLock::connect(config).await?),
        name: unique_name("peer-distlock"),
        opts: LockOptions::new().wait(ACQUIRE_WAIT),
    };
    let mut theirs = SqlxCycle {
        conn,
        lock: PgAdvisoryLock::new(unique_name("peer-sqlx")),
    };
    alternate(&mut ours, &mut theirs, plan).await
}

/// distlock's cycle and the peer's, in alternating slices.
async fn alternate(
    ours: &mut dyn Cycle,
    theirs: &mut dyn Cycle,
    plan: &Plan,
) -> Res<(Measured, Measured)> {
    let measured =
        measure_cycles(&mut [ours, theirs], plan.warmup, plan.slice, plan.slices).await?;
    let [ours, theirs] = <[Measured; 2]>::try_from(measured)
        .map_err(|_| "measure_cycles returned the wrong number of results")?;
    Ok((ours, theirs))
}
