//! Sections 9 and 10, the peers' side: each in its harness program, on the same server as the
//! distlock backend it is compared with. The permit cycle alternates with distlock's on that
//! server (section 8's [`cycles`]); a failover kills a harness process that leads (`lead`)
//! while a second one (`follow`) campaigns and observes.

use std::time::Instant;

use super::failover::settle;
use super::{fail, failover_bound, failover_row, permit_cycle, permit_row};
use crate::error::Res;
use crate::model::{FailoverRow, PermitRow, Who};
use crate::run::libraries::harness::Harness;
use crate::run::libraries::protocol as cmd;
use crate::run::libraries::{cycles, process, Driver, Library};
use crate::run::plan::Plan;
use crate::run::scenarios::{bound, bounded, unique_name};
use crate::run::stats::Recorder;
use crate::run::targets;

/// The recipe each peer is measured with.
fn recipe(lib: Library, permits: bool) -> &'static str {
    match (lib, permits) {
        (Library::Curator, true) => "Apache Curator InterProcessSemaphoreV2",
        (Library::Curator, false) => "Apache Curator LeaderLatch",
        (Library::EtcdGo, _) => "etcd clientv3/concurrency.Election",
        (Library::RedisSemaphore, _) => "redis-semaphore Semaphore (Node.js)",
        _ => lib.id(),
    }
}

fn who(lib: Library, permits: bool) -> Who {
    Who {
        id: lib.id().into(),
        label: recipe(lib, permits).into(),
        against: Some(lib.against().id().into()),
        version: None,
        skipped: None,
        errors: Vec::new(),
    }
}

/// Starts `lib`'s harness, or says why it is skipped.
async fn start(lib: Library, plan: &Plan, who: &mut Who) -> Option<Harness> {
    let command = match process(lib) {
        Ok(c) => c,
        Err(reason) => {
            who.skipped = Some(reason);
            return None;
        }
    };
    match Harness::start(command, bound(plan)).await {
        Ok(h) => {
            let hello = h.hello();
            who.version = Some(format!("{} ({})", hello.version, hello.runtime));
            Some(h)
        }
        Err(e) => {
            fail(who, "start", e);
            None
        }
    }
}

pub(super) async fn permits(lib: Library, plan: &Plan) -> PermitRow {
    let mut row = permit_row(who(lib, true));
    let kind = lib.against();
    let target = match targets::open(kind).await {
        Ok(t) => t,
        Err(e) => {
            row.who.skipped = Some(format!("the {} server did not answer: {e}", kind.label()));
            return row;
        }
    };
    let Some(mut harness) = start(lib, plan, &mut row.who).await else {
        return row;
    };
    let measured = async {
        let mut ours = permit_cycle(&*target, plan).await?;
        cycles(&mut harness, &mut ours, Some(plan.permit_max), plan).await
    };
    match bounded(bound(plan), measured).await {
        Ok((theirs, mine)) => {
            row.cycles_per_sec = theirs.per_sec();
            row.cycle = Some(theirs.latencies.summary());
            row.beside = Some(mine.latencies.summary());
        }
        Err(e) => fail(&mut row.who, "permit cycle", e),
    }
    Box::new(harness).close().await;
    let _ = target.cleanup().await;
    row
}

pub(super) async fn failover(lib: Library, plan: &Plan) -> FailoverRow {
    let mut row = failover_row(who(lib, false));
    let mut rec = Recorder::new();
    for sample in 0..plan.failover_samples {
        let Some(mut leader) = start(lib, plan, &mut row.who).await else {
            break;
        };
        let Some(mut follower) = start(lib, plan, &mut row.who).await else {
            break;
        };
        let kill = once(&mut leader, &mut follower, plan);
        match bounded(failover_bound(plan), kill).await {
            Ok(took) => {
                row.samples_ms.push(took.as_secs_f64() * 1000.0);
                rec.record(took);
            }
            Err(e) => fail(&mut row.who, &format!("failover {sample}"), e),
        }
        let _ = follower.ok("resign".into()).await;
        Box::new(follower).close().await;
        let _ = leader.kill();
        Box::new(leader).close().await;
    }
    if rec.len() > 0 {
        row.failover = Some(rec.summary());
    }
    row
}

/// One kill of the leading harness process; from it to the follower's observer seeing the
/// follower lead.
async fn once(
    leader: &mut Harness,
    follower: &mut Harness,
    plan: &Plan,
) -> Res<std::time::Duration> {
    let name = unique_name("peer-failover").replace('/', "-");
    leader
        .ok(cmd::campaign_command("lead", &name, "A", plan.lease)?)
        .await?;
    follower
        .ok(cmd::campaign_command("follow", &name, "B", plan.lease)?)
        .await?;
    tokio::time::sleep(settle(plan.lease)).await;
    follower.ask_later(cmd::observe_command("B")?).await?;
    let killed = Instant::now();
    leader.kill()?;
    follower.answered().await?;
    Ok(killed.elapsed())
}
