//! The nemesis' fault actions, one per scenario: what a campaign run plays once and a soak
//! plays again and again.

use std::time::Duration;

use distlock::{ErrorKind, LockName};

use super::residue::admin;
use super::{timing, Clients, Route, Stage};
use crate::clock;
use crate::history::Fault;
use crate::matrix::Scenario;
use crate::servers::Deployment;

/// Plays `scenario`'s fault once on what `stage` and the rest name; `Ok(Some(_))` is an error
/// undoing it. A fault on the clients alone leaves `server` alone (a soak passes `&mut None`
/// beside a fault on the server); one on the server leaves `clients` alone.
pub(crate) async fn play(
    scenario: Scenario,
    stage: &Stage<'_>,
    server: &mut Option<Deployment>,
    target: Option<usize>,
    clients: &mut Clients,
    routes: &[Route],
) -> Result<Option<String>, String> {
    let (backend, base_url, ttl, faults) = (stage.backend, stage.base_url, stage.ttl, stage.faults);
    let note =
        |what, killed, recover_from, deleted| stage.note(what, killed, recover_from, deleted);
    let pids = clients.pids();
    let find_holder = |alive: &[u32]| stage.find_holder(alive.to_vec());
    let mut undo_error = None;
    match scenario {
        Scenario::Baseline
        | Scenario::SharedHandle
        | Scenario::CancelStorm
        | Scenario::LeaseShrink => {}
        Scenario::HolderKill => {
            let target = find_holder(&pids).await;
            let pid = target.as_ref().map_or(pids[0], |t| t.0);
            if let Some((_, child)) = clients.children.iter_mut().find(|c| c.0 == pid) {
                let _ = child.start_kill();
                note(
                    format!("SIGKILL client {pid} ({})", describe(&target)),
                    Some(pid),
                    true,
                    None,
                );
            }
        }
        Scenario::HolderPause => {
            let target = find_holder(&pids).await;
            let pid = target.as_ref().map_or(pids[0], |t| t.0);
            crate::signal(pid, "STOP")?;
            note(
                format!("SIGSTOP client {pid} ({})", describe(&target)),
                None,
                false,
                None,
            );
            tokio::time::sleep(ttl * 3 / 2 + Duration::from_millis(300)).await;
            // The others must have taken over by now; the zombie wakes.
            if let Err(e) = crate::signal(pid, "CONT") {
                undo_error = Some(e);
            }
            note(format!("SIGCONT client {pid}"), None, true, None);
        }
        Scenario::OobDelete => {
            for _ in 0..3 {
                if let Some((pid, name)) = find_holder(&pids).await {
                    let lock = LockName::new(&name).map_err(|e| e.to_string())?;
                    let admin = admin(backend, base_url).await?;
                    // The deletion counts from when it was sent: the next holder can be granted
                    // before its answer is back.
                    let sent = clock::now();
                    match admin.remove_holder(&lock).await {
                        Ok(()) => faults.lock().expect("faults").push(Fault {
                            at: sent,
                            done: clock::now(),
                            what: format!(
                                "deleted {name:?} on the server while client {pid} held it"
                            ),
                            killed: None,
                            recover_from: false,
                            deleted: Some(name),
                        }),
                        // Released between the look and the delete: nothing to delete this time.
                        Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
                        Err(e) => {
                            return Err(format!("cannot delete {name:?} behind its holder: {e}"))
                        }
                    }
                }
                tokio::time::sleep(ttl).await;
            }
        }
        Scenario::LostReplies | Scenario::ClientCut => {
            if scenario == Scenario::LostReplies {
                // First blips: every client's answers swallowed for 250 ms, then its link
                // healed, which closes the connections that lost answers while their requests
                // still wait. A request the server ran must not run again on a new connection
                // (a release run twice takes a hold a live guard relies on).
                let blips = (ttl.as_millis() / 400).clamp(2, 10);
                note(
                    format!(
                        "{blips} blips: every client's answers lost for 250 ms, then its \
                         connections closed"
                    ),
                    None,
                    false,
                    None,
                );
                for _ in 0..blips {
                    routes
                        .iter()
                        .flat_map(|r| &r.proxies)
                        .for_each(|p| p.mute(true));
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    routes
                        .iter()
                        .flat_map(|r| &r.proxies)
                        .for_each(|p| p.heal());
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
            }
            let target = find_holder(&pids).await;
            let pid = target.as_ref().map_or(pids[0], |t| t.0);
            let i = pids.iter().position(|&p| p == pid).unwrap_or(0);
            let mute = scenario == Scenario::LostReplies;
            for p in &routes[i].proxies {
                if mute {
                    p.mute(true);
                } else {
                    p.cut();
                }
            }
            let how = if mute { "muted" } else { "cut" };
            note(
                format!("{how} client {pid}'s proxy ({})", describe(&target)),
                None,
                false,
                None,
            );
            tokio::time::sleep(ttl * 3 / 2).await;
            for p in &routes[i].proxies {
                p.heal();
            }
            note(format!("healed client {pid}'s proxy"), None, true, None);
        }
        Scenario::Latency => {
            let mut delays = Vec::new();
            for route in routes {
                let delay = Duration::from_millis(fastrand::u64(50..=250));
                for p in &route.proxies {
                    p.delay(delay);
                }
                delays.push(delay.as_millis().to_string());
            }
            note(
                format!("every client's link slowed by {} ms", delays.join("/")),
                None,
                false,
                None,
            );
            tokio::time::sleep(ttl * 2).await;
            for route in routes {
                for p in &route.proxies {
                    p.delay(Duration::ZERO);
                }
            }
            note("links at full speed again".into(), None, true, None);
        }
        Scenario::ServerPause => {
            let s = server.as_mut().ok_or("no private server")?;
            for (i, pause) in [ttl / 2, ttl * 2].into_iter().enumerate() {
                s.pause(0)?;
                note(
                    format!("SIGSTOP server for {} ms", pause.as_millis()),
                    None,
                    false,
                    None,
                );
                tokio::time::sleep(pause).await;
                if let Err(e) = s.resume(0) {
                    undo_error = Some(e);
                }
                note("SIGCONT server".into(), None, true, None);
                if i == 0 {
                    tokio::time::sleep(ttl).await;
                }
            }
        }
        Scenario::ServerRestart => {
            let s = server.as_mut().ok_or("no private server")?;
            s.kill(0);
            note("SIGKILL server".into(), None, false, None);
            tokio::time::sleep(ttl / 2).await;
            let restarted = s.restart(0).await;
            note("server restarted".into(), None, true, None);
            restarted.map_err(|e| format!("the private server did not come back: {e}"))?;
        }
        Scenario::ServerRestartVolatile => {
            let s = server.as_mut().ok_or("no private server")?;
            s.kill(0);
            note("SIGKILL server (no persistence)".into(), None, false, None);
            // Down until every holder's lease, renewed or not, has run out: whoever believed
            // it held has stopped believing before the empty server grants again.
            tokio::time::sleep(ttl + ttl / 2).await;
            let restarted = s.restart(0).await;
            note("server restarted empty".into(), None, true, None);
            restarted.map_err(|e| format!("the private server did not come back: {e}"))?;
        }
        Scenario::LeaderKill | Scenario::FollowerKill => {
            let d = server.as_mut().ok_or("no private cluster")?;
            let victim = match target {
                Some(t) => t,
                None => d.leader().await.ok_or("the cluster has no leader")?,
            };
            let role = if scenario == Scenario::LeaderKill {
                "leader"
            } else {
                "follower"
            };
            d.kill(victim);
            note(
                format!("SIGKILL {role} (member {victim})"),
                None,
                false,
                None,
            );
            tokio::time::sleep(ttl * 2).await;
            let restarted = d.restart(victim).await;
            note(format!("{role} restarted"), None, true, None);
            restarted.map_err(|e| format!("member {victim} did not come back: {e}"))?;
        }
        Scenario::MemberCut | Scenario::LeaderCut => {
            let d = server.as_mut().ok_or("no private cluster")?;
            let victim = target.ok_or("no member to cut off")?;
            let role = if scenario == Scenario::LeaderCut {
                "leader"
            } else {
                "follower"
            };
            d.cut(victim)?;
            note(
                format!("cut {role} {victim} off from its peers (client 0 talks only to it)"),
                None,
                false,
                None,
            );
            tokio::time::sleep(ttl * 2).await;
            if let Err(e) = d.heal(victim) {
                undo_error = Some(e);
            }
            note(format!("healed {role} {victim}"), None, true, None);
        }
        Scenario::MemberRestart => {
            let d = server.as_mut().ok_or("no private cluster")?;
            for i in 0..d.len() {
                d.kill(i);
                note(format!("SIGKILL member {i}"), None, false, None);
                tokio::time::sleep(ttl / 2).await;
                let restarted = d.restart(i).await;
                note(format!("member {i} restarted"), None, true, None);
                restarted.map_err(|e| format!("member {i} did not come back: {e}"))?;
                tokio::time::sleep(ttl / 2).await;
            }
        }
        Scenario::MastersDown(k) => {
            let d = server.as_mut().ok_or("no private masters")?;
            for i in 0..k {
                d.pause(i)?;
            }
            note(format!("SIGSTOP {k} of 5 masters"), None, false, None);
            tokio::time::sleep(ttl * 2).await;
            for i in 0..k {
                if let Err(e) = d.resume(i) {
                    undo_error = Some(e);
                }
            }
            note(format!("SIGCONT {k} masters"), None, true, None);
        }
        Scenario::SentinelFailover | Scenario::SentinelFailoverLagging => {
            let d = server.as_mut().ok_or("no private Sentinel topology")?;
            let lagging = scenario == Scenario::SentinelFailoverLagging;
            undo_error = d.failover(lagging, &note).await?;
        }
        Scenario::ClusterFailover
        | Scenario::ClusterSlotMigration
        | Scenario::ClusterPrimaryCut => {
            let d = server.as_mut().ok_or("no private Redis Cluster")?;
            undo_error = d
                .cluster_fault(scenario, stage.every_name, ttl, &note)
                .await?;
        }
        Scenario::Timing(t) => {
            let d = server.as_mut().ok_or("no private server")?;
            // A one-way cut hits one holder; a clock move hits every holder at once.
            let holder = if t.clock() {
                None
            } else {
                let target = find_holder(&pids).await;
                let pid = target.as_ref().map_or(pids[0], |t| t.0);
                let p = pids.iter().position(|&x| x == pid).unwrap_or(0);
                Some(timing::Holder {
                    pid,
                    gid: timing::client_gid(p),
                    described: describe(&target),
                })
            };
            undo_error = timing::play(t, d, ttl, holder, &note).await?;
        }
        Scenario::MastersRestart | Scenario::MastersRestartVolatile => {
            let d = server.as_mut().ok_or("no private masters")?;
            let volatile = scenario == Scenario::MastersRestartVolatile;
            for i in 0..2 {
                d.kill(i);
            }
            note(
                format!(
                    "SIGKILL 2 of 5 masters{}",
                    if volatile { " (no persistence)" } else { "" }
                ),
                None,
                false,
                None,
            );
            // Without persistence, down until every lease has run out (renewed or not): a
            // master that comes back empty must not hand out what a holder still believes.
            tokio::time::sleep(if volatile { ttl + ttl / 2 } else { ttl / 2 }).await;
            for i in 0..2 {
                if let Err(e) = d.restart(i).await {
                    undo_error = Some(format!("master {i} did not come back: {e}"));
                }
            }
            note("2 masters restarted".into(), None, true, None);
        }
    }

    Ok(undo_error)
}

fn describe(target: &Option<(u32, String)>) -> String {
    match target {
        Some((_, name)) => format!("it holds {name:?}"),
        None => "no holder seen in 2 s: a random client".into(),
    }
}
