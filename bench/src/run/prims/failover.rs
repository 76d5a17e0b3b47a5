//! Section 10, distlock's side: a leader in a separate process (this benchmark binary again,
//! `--lead`), a second campaigner waiting in this process, an observer reading every 10 ms;
//! the leader is killed with SIGKILL, so its lease or session is never released and the
//! server has to expire it. Measured: from the kill to the observer seeing a later epoch, and
//! to the waiting campaign returning.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_api::{LockExt, LockOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::{fail, failover_bound};
use crate::error::Res;
use crate::model::{FailoverRow, Kind};
use crate::run::plan::Plan;
use crate::run::scenarios::{bounded, unique_name};
use crate::run::stats::Recorder;
use crate::run::targets::{self, Target};

/// How often the observer reads who leads.
pub(super) const OBSERVE_EVERY: Duration = Duration::from_millis(10);

/// How long the second campaigner (or the peer's follower) has to queue before the kill.
const SETTLE: Duration = Duration::from_millis(300);

/// [`SETTLE`] and a random part of the whole lease, so that the kill lands at a uniformly
/// random point of the leader's renewal period rather than at the same point of every sample.
///
/// The window is the lease, not a third of it: implementations renew at different periods
/// (distlock every third of the lease; etcd's Go client, whose keep-alive loop wakes every
/// 500 ms and sends once a third of the TTL has passed since the last answer, every 1 s with a
/// 2 s lease), and the lease is a multiple of each. A window of a third of the lease (as
/// before) only covered two thirds of the Go client's period, always starting at about the same
/// point after its keep-alive, so its leaders died with about 650 ms of their lease spent on
/// average instead of 500 ms, which flattered its failover by about 150 ms (issue 42).
pub(super) fn settle(lease: Duration) -> Duration {
    SETTLE + lease.mul_f64(fastrand::f64())
}

/// The `--lead KIND NAME VALUE TTL_MS` process: campaign, print `leading EPOCH`, and hold
/// leadership (the watchdog renewing it) until killed.
pub(crate) async fn lead(words: &[String]) -> Res<()> {
    let [kind, name, value, ttl] = words else {
        return Err("--lead needs KIND NAME VALUE TTL_MS".into());
    };
    let kind = Kind::from_id(kind).ok_or_else(|| format!("--lead: unknown backend {kind:?}"))?;
    let ttl = Duration::from_millis(ttl.parse().map_err(|_| "--lead: TTL_MS is not a number")?);
    let target = targets::open(kind).await?;
    let lock = target.client_ttl(ttl).await?;
    let opts = LockOptions::new().wait(Duration::from_secs(30));
    let leadership = lock.election(name)?.campaign(value, &opts).await?;
    println!("leading {}", leadership.epoch().0);
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

pub(super) async fn backend(target: &dyn Target, plan: &Plan, row: &mut FailoverRow) {
    if target.kind() == Kind::Memory {
        row.who.skipped =
            Some("in-process: there is no leader process to kill, nor a lease to expire".into());
        return;
    }
    if target.kind().is_redis_topology() {
        row.who.skipped = Some(
            "the Redis row's: a killed leader process is followed on a Sentinel or Cluster \
             topology by the same lease expiry and the same scripts (a failed-over server is \
             the fault cells' subject, not this section's)"
                .into(),
        );
        return;
    }
    let (mut failover, mut elected) = (Recorder::new(), Recorder::new());
    for sample in 0..plan.failover_samples {
        match bounded(failover_bound(plan), once(target, plan.lease)).await {
            Ok((seen, won)) => {
                row.samples_ms.push(seen.as_secs_f64() * 1000.0);
                failover.record(seen);
                elected.record(won);
            }
            Err(e) => fail(&mut row.who, &format!("failover {sample}"), e),
        }
    }
    if failover.len() > 0 {
        row.failover = Some(failover.summary());
        row.elected = Some(elected.summary());
    }
}

/// One kill: from it to the observer seeing the next epoch, and to the campaign returning.
async fn once(target: &dyn Target, lease: Duration) -> Res<(Duration, Duration)> {
    let name = unique_name("failover");
    let exe = std::env::current_exe()?;
    let mut leader = Command::new(exe)
        .args(["--lead", target.kind().id(), &name, "leader-a"])
        .arg(lease.as_millis().to_string())
        .env(targets::RUN_ID_VAR, targets::run_id())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = leader
        .stdout
        .take()
        .ok_or("the leader's stdout is not piped")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next_line().await?.unwrap_or_default();
    let epoch: u64 = first
        .strip_prefix("leading ")
        .and_then(|e| e.trim().parse().ok())
        .ok_or_else(|| format!("the leader process said {first:?}, not `leading EPOCH`"))?;

    let observer = target.client().await?;
    let mut watch = observer.election(&name)?.observe().every(OBSERVE_EVERY);
    loop {
        if watch.next().await?.is_some_and(|l| l.epoch.0 == epoch) {
            break;
        }
    }
    let campaigner = target.client_ttl(lease).await?;
    let election = campaigner.election(&name)?;
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new().wait(Duration::from_secs(120));
        let leadership = election.campaign("leader-b", &opts).await;
        (Instant::now(), leadership)
    });
    tokio::time::sleep(settle(lease)).await;
    if waiting.is_finished() {
        return Err("the second campaigner led while the leader process lived".into());
    }

    let killed = Instant::now();
    leader.start_kill()?;
    let seen = loop {
        if let Some(l) = watch.next().await? {
            if l.epoch.0 > epoch {
                break killed.elapsed();
            }
        }
    };
    let _ = leader.wait().await;
    let (won_at, leadership) = waiting.await?;
    let leadership = leadership?;
    if leadership.epoch().0 <= epoch {
        return Err(format!(
            "the new epoch {} is not above {epoch}",
            leadership.epoch().0
        )
        .into());
    }
    leadership.resign().await?;
    Ok((seen, won_at - killed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_lands_anywhere_in_the_lease_not_only_its_first_third() {
        let lease = Duration::from_secs(2);
        let draws: Vec<Duration> = (0..1000).map(|_| settle(lease) - SETTLE).collect();
        assert!(draws.iter().all(|d| *d < lease), "beyond the lease");
        // A renewal period of 1 s (etcd's Go client with a 2 s lease) must be covered whole:
        // kills in its second half, and in the lease's last third. 1000 uniform draws miss
        // either with a probability of about 1e-176.
        for (lo, hi) in [(lease / 2, lease), (lease * 2 / 3, lease)] {
            assert!(
                draws.iter().any(|d| (lo..hi).contains(d)),
                "no kill in {lo:?}..{hi:?} of the lease"
            );
        }
    }
}
