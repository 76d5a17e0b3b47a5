//! The nemesis of the cluster rows: the faulted primary killed and its replica promoted, the
//! names' slots migrated to another primary and back, or the primary cut off from the rest of
//! the cluster (not from its clients) until its replica is promoted.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::super::cli::{cli, cli_ok, poll};
use super::super::nemesis::PROMOTION_BOUND;
use super::super::{Deployment, Note};
use super::slots::shard_in;
use super::{slot_of, PORT};
use crate::matrix::Scenario;

/// Keys moved per `MIGRATE`: one, with [`KEY_PAUSE`] after each, so that for a while a name's
/// keys are split between the two primaries (its lock on one, its fencing counter on the other)
/// while clients keep working, as in a migration of a slot with many keys.
const BATCH: &str = "1";
const KEY_PAUSE: Duration = Duration::from_millis(100);

impl Deployment {
    /// Plays `scenario`'s fault on the cluster; `names` are the run's (all in one primary's
    /// slots: the faulted one, whichever member serves them now, so that a soak can fault it
    /// again and again), `hold` how long migrated slots stay away. `Ok(Some(e))`: a fault could
    /// not be undone.
    pub(crate) async fn cluster_fault(
        &mut self,
        scenario: Scenario,
        names: &[String],
        hold: Duration,
        note: Note<'_>,
    ) -> Result<Option<String>, String> {
        let Faulted {
            primary: faulted,
            replica,
            others,
        } = self.shard(names).await?;
        match scenario {
            Scenario::ClusterFailover => {
                self.kill(faulted);
                note(
                    format!("SIGKILL primary (member {faulted}), whose slots hold the names"),
                    None,
                    false,
                    None,
                );
                let killed = Instant::now();
                let promoted = self.await_promotion(replica).await;
                note(
                    format!(
                        "replica (member {replica}) promoted {} ms after the kill",
                        ms(killed)
                    ),
                    None,
                    true,
                    None,
                );
                promoted?;
                let rejoined = "old primary restarted (it rejoins as a replica)";
                self.rejoin(faulted, rejoined, true, note).await?;
                let restarted = Instant::now();
                self.await_replica(replica).await?;
                note(
                    format!(
                        "old primary in sync as a replica {} ms after its restart",
                        ms(restarted)
                    ),
                    None,
                    true,
                    None,
                );
                Ok(None)
            }
            Scenario::ClusterPrimaryCut => {
                self.cut(faulted)?;
                note(
                    format!(
                        "cut primary (member {faulted}) off from its replica and the other \
                         primaries (clients still reach it)"
                    ),
                    None,
                    false,
                    None,
                );
                let cut = Instant::now();
                let promoted = self.await_promotion(replica).await;
                let healed = self.heal(faulted);
                note(
                    format!(
                        "replica promoted {} ms after the cut; healed (the old primary rejoins \
                         as a replica)",
                        ms(cut)
                    ),
                    None,
                    true,
                    None,
                );
                promoted?;
                Ok(healed.err())
            }
            Scenario::ClusterSlotMigration => {
                let slots: BTreeSet<u16> = names.iter().filter_map(|n| slot_of(n)).collect();
                let (to, also) = (others[0], &others[1..]);
                self.move_slots(&slots, [faulted, to], also, note).await?;
                tokio::time::sleep(hold).await;
                self.move_slots(&slots, [to, faulted], also, note).await?;
                Ok(None)
            }
            other => Err(format!("{} is not a cluster row", other.key())),
        }
    }

    /// The members that serve `names` now, once every member that answers agrees on them
    /// (`CLUSTER NODES`): a primary cut off a moment ago still names itself until it learns of
    /// its replica's promotion.
    async fn shard(&self, names: &[String]) -> Result<Faulted, String> {
        let slot = names
            .iter()
            .find_map(|n| slot_of(n))
            .ok_or("no lock name")?;
        let member = |ip: &str| self.members.iter().position(|m| m.ip == ip);
        let what = format!("the members did not agree who serves slot {slot}");
        let shard = poll(PROMOTION_BOUND, &what, async || {
            let mut views = Vec::new();
            for m in &self.members {
                if let Ok(nodes) = cli(&m.ip, PORT, &["CLUSTER", "NODES"]).await {
                    views.push(shard_in(&nodes, slot).ok_or(nodes)?);
                }
            }
            match views.split_first() {
                Some((first, rest)) if rest.iter().all(|v| v == first) => Ok(views.swap_remove(0)),
                _ => Err(format!("{views:?}")),
            }
        })
        .await?;
        let others: Option<Vec<usize>> = shard.others.iter().map(|o| member(o)).collect();
        match (member(&shard.primary), member(&shard.replica), others) {
            (Some(primary), Some(replica), Some(others)) => Ok(Faulted {
                primary,
                replica,
                others,
            }),
            _ => Err(format!("a shard of members not in this cluster: {shard:?}")),
        }
    }

    /// Waits until `replica`, the faulted primary's, has taken over (it says `ROLE` master).
    async fn await_promotion(&self, replica: usize) -> Result<(), String> {
        let ip = &self.members[replica].ip;
        let what = format!("the replica (member {replica}) was not promoted");
        poll(PROMOTION_BOUND, &what, async || {
            let role = cli(ip, PORT, &["ROLE"]).await?;
            (role.lines().next() == Some("master"))
                .then_some(())
                .ok_or(role)
        })
        .await
    }

    /// Waits until the promoted `replica` has a replica in sync again (the old primary).
    async fn await_replica(&self, replica: usize) -> Result<(), String> {
        let ip = &self.members[replica].ip;
        let what = format!("member {replica} got no replica in sync");
        poll(PROMOTION_BOUND, &what, async || {
            let info = cli(ip, PORT, &["INFO", "replication"]).await?;
            info.contains("state=online").then_some(()).ok_or(info)
        })
        .await
    }

    /// Migrates `slots` from primary `from` to primary `to` as an operator does while clients
    /// keep working: the target imports and the source migrates them (clients are sent on with
    /// `ASK`, or `TRYAGAIN` while a name's keys are split), their keys are moved a few at a time
    /// ([`BATCH`]), and every primary is told the new owner (the target first, then the source,
    /// which answers `MOVED` from then on, then `also`, the other primaries).
    async fn move_slots(
        &self,
        slots: &BTreeSet<u16>,
        [from, to]: [usize; 2],
        also: &[usize],
        note: Note<'_>,
    ) -> Result<(), String> {
        let (from_ip, to_ip) = (&self.members[from].ip, &self.members[to].ip);
        let (from_id, to_id) = (self.node_id(from).await?, self.node_id(to).await?);
        let list: Vec<String> = slots.iter().map(u16::to_string).collect();
        for slot in &list {
            cli_ok(
                to_ip,
                PORT,
                &["CLUSTER", "SETSLOT", slot, "IMPORTING", &from_id],
            )
            .await?;
            cli_ok(
                from_ip,
                PORT,
                &["CLUSTER", "SETSLOT", slot, "MIGRATING", &to_id],
            )
            .await?;
        }
        let list = list.join(", ");
        note(
            format!("slot(s) {list} migrating from primary {from} to primary {to}"),
            None,
            false,
            None,
        );
        let started = Instant::now();
        let moved = self.migrate_keys(slots, [from, to], also, &to_id).await;
        note(
            format!(
                "slot(s) {list} now on primary {to}: {} in {} ms",
                match &moved {
                    Ok(keys) => format!("{keys} key(s) migrated"),
                    Err(e) => format!("failed: {e}"),
                },
                ms(started)
            ),
            None,
            true,
            None,
        );
        moved.map(|_| ())
    }

    /// Moves the keys of `slots` from `from` to `to` and gives `to` the slots; how many keys.
    async fn migrate_keys(
        &self,
        slots: &BTreeSet<u16>,
        [from, to]: [usize; 2],
        also: &[usize],
        to_id: &str,
    ) -> Result<usize, String> {
        let (from_ip, to_ip) = (&self.members[from].ip, &self.members[to].ip);
        let mut moved = 0;
        for slot in slots.iter().map(u16::to_string) {
            loop {
                let got = cli(from_ip, PORT, &["CLUSTER", "GETKEYSINSLOT", &slot, BATCH]).await?;
                let keys: Vec<&str> = got.lines().filter(|k| !k.is_empty()).collect();
                if keys.is_empty() {
                    break;
                }
                let port = PORT.to_string();
                let mut migrate = vec!["MIGRATE", to_ip, &port, "", "0", "5000", "KEYS"];
                migrate.extend(&keys);
                let answer = cli(from_ip, PORT, &migrate).await?;
                // NOKEY: every key of the batch expired in the meantime.
                if answer != "OK" && answer != "NOKEY" {
                    return Err(format!("MIGRATE of slot {slot}: {answer}"));
                }
                moved += keys.len();
                tokio::time::sleep(KEY_PAUSE).await;
            }
        }
        for &p in [to, from].iter().chain(also) {
            for slot in slots.iter().map(u16::to_string) {
                let ip = &self.members[p].ip;
                cli_ok(ip, PORT, &["CLUSTER", "SETSLOT", &slot, "NODE", to_id]).await?;
            }
        }
        Ok(moved)
    }
}

/// The members a cluster fault acts on: the primary of the run's names, a replica of it, and
/// the other primaries.
struct Faulted {
    primary: usize,
    replica: usize,
    others: Vec<usize>,
}

fn ms(since: Instant) -> u128 {
    since.elapsed().as_millis()
}
