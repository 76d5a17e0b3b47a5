//! Scenario 7: `rslock`, the most-used Rust Redis lock crate, on the same servers in the same
//! run, in alternating slices with distlock's Redis (and RedLock) backend.
//!
//! The two do not buy the same thing per cycle: rslock sends `SET NX PX` and a compare-and-delete
//! script (no fencing token, no reentrancy, no wake-up notice, no watchdog), distlock-redis one
//! acquire script (hash + fencing `INCR`) and one release script (+ `PUBLISH`). Both are two
//! round trips, so the comparison shows client-side cost, not protocol differences.

use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockOptions;
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
    let measured = measure_cycles(
        &mut [&mut ours, &mut theirs],
        plan.warmup,
        plan.slice,
        plan.slices,
    )
    .await?;
    let [ours_measured, theirs_measured] = <[Measured; 2]>::try_from(measured)
        .map_err(|_| "measure_cycles returned the wrong number of results")?;
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
