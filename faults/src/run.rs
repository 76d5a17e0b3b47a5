//! One run of one scenario on one backend: the runner starts the resource (and a private server
//! or proxies where the scenario needs them), spawns the client processes, plays the nemesis,
//! undoes every fault, waits for the leases to run out, looks for residue and checks the
//! history.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::{ErrorKind, LockName};
use distlock_conformance::{hosts_of, reroute, Proxy};
use serde::Serialize;
use tokio::process::{Child, Command};

use crate::checker::{self, Checked, Expect};
use crate::client::ClientConfig;

/// How many permits the campaign's semaphore names have.
const SEM_MAX: u32 = 2;
use crate::clock;
use crate::history::Fault;
use crate::matrix::{Backend, Scenario};
use crate::resource::Resource;
use crate::servers::{Deployment, Kind};

mod residue;
mod timing;

use residue::{admin, residue};

/// Knobs of a run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Knobs {
    /// Client processes.
    pub(crate) procs: usize,
    /// How long the clients loop when nothing is faulted.
    pub(crate) base: Duration,
}

/// What one run gave.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct RunResult {
    /// The checker's verdict.
    pub(crate) checked: Checked,
    /// What was left on the server after the leases ran out.
    pub(crate) residue: Vec<String>,
    /// The faults injected.
    pub(crate) faults: Vec<String>,
    /// A setup failure (server unreachable, client died): the run proves nothing.
    pub(crate) error: Option<String>,
    /// Wall time of the run, in seconds.
    pub(crate) wall_s: f64,
}

/// Where a client process's connection goes: the proxies of one client, one per server.
struct Route {
    proxies: Vec<Proxy>,
}

struct Clients {
    children: Vec<(u32, Child)>,
}

/// Runs `scenario` on `backend` once.
pub(crate) async fn run(
    backend: &Backend,
    scenario: Scenario,
    knobs: Knobs,
    index: usize,
    dir: &Path,
) -> RunResult {
    let started = Instant::now();
    let mut result = match run_inner(backend, scenario, knobs, index, dir).await {
        Ok(r) => r,
        Err(e) => RunResult {
            error: Some(e),
            ..RunResult::default()
        },
    };
    result.wall_s = started.elapsed().as_secs_f64();
    result
}

async fn run_inner(
    backend: &Backend,
    scenario: Scenario,
    knobs: Knobs,
    index: usize,
    dir: &Path,
) -> Result<RunResult, String> {
    let ttl = backend.ttl();
    let mut server = if scenario.members() > 0 {
        let kind = Kind::of(backend.server_key()).ok_or("no server kind for this backend")?;
        Some(Deployment::start_for(kind, scenario).await?)
    } else {
        None
    };
    // The member a clustered scenario faults while one client talks to it alone.
    let target = match (&server, scenario) {
        (Some(d), Scenario::FollowerKill | Scenario::MemberCut) => Some(d.follower().await),
        (Some(d), Scenario::LeaderCut) => {
            Some(d.leader().await.ok_or("the cluster has no leader")?)
        }
        _ => None,
    };
    let base_url = backend.with_session(
        &server
            .as_ref()
            .map_or_else(|| backend.shared_url(), Deployment::url),
    );
    let resource = Resource::start()
        .await
        .map_err(|e| format!("cannot start the resource: {e}"))?;
    // A semaphore and an election beside the locks, where the backend has them: the same
    // faults hit all three, and the same checker judges them. On a Redis Cluster, names are
    // drawn until all of them are in the slots of the primary the nemesis faults.
    let caps = backend.capabilities();
    let (prefix, names, sem_names, elect_names, every_name) = loop {
        let prefix = format!(
            "faults-{}-{}-{index}-{:08x}-",
            scenario.key(),
            std::process::id(),
            fastrand::u32(..)
        );
        let names: Vec<String> = (0..2).map(|i| format!("{prefix}{i}")).collect();
        let sem: Vec<String> = caps
            .semaphore
            .then(|| format!("{prefix}sem"))
            .into_iter()
            .collect();
        let elect: Vec<String> = caps
            .election
            .then(|| format!("{prefix}elect"))
            .into_iter()
            .collect();
        let every: Vec<String> = names.iter().chain(&sem).chain(&elect).cloned().collect();
        if server.as_ref().is_none_or(|d| d.keeps_together(&every)) {
            break (prefix, names, sem, elect, every);
        }
    };
    let proxied = scenario.proxied();
    // Clients connect before they loop: the first fault comes after a moment, which varies so
    // that over the runs a fault lands at every point of the clients' cycles (a fixed moment
    // kept hitting the same phase, and hid a server that lost its last acknowledged writes).
    // The runs are that much longer, so the time after the fault stays the same.
    let lead = Duration::from_millis(fastrand::u64(1500..=3000));
    let run_for = lead - Duration::from_millis(1500) + knobs.base + ttl * scenario.leases_after();
    let (tasks, shared) = match scenario {
        Scenario::SharedHandle => (4, 4),
        _ => (3, 2),
    };

    let mut routes = Vec::new();
    let mut clients = Clients {
        children: Vec::new(),
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    for p in 0..knobs.procs {
        let url = if proxied {
            let hosts = hosts_of(&base_url);
            let mut proxies = Vec::new();
            for h in &hosts {
                proxies.push(Proxy::start(h.clone()).await);
            }
            let to: Vec<String> = proxies.iter().map(Proxy::addr).collect();
            let url = reroute(&base_url, &hosts, &to);
            routes.push(Route { proxies });
            url
        } else {
            base_url.clone()
        };
        let url = match (&server, target) {
            (Some(d), Some(t)) if p == 0 => backend.with_session(&d.member_url(t)),
            _ => url,
        };
        let config = ClientConfig {
            url,
            names: names.clone(),
            sem_names: sem_names.clone(),
            sem_max: SEM_MAX,
            elect_names: elect_names.clone(),
            tasks,
            shared,
            duration_ms: run_for.as_millis() as u64,
            ttl_ms: ttl.as_millis() as u64,
            per_lock: backend.per_lock(),
            cancel_storm: scenario == Scenario::CancelStorm,
            lease_shrink: scenario == Scenario::LeaseShrink,
            // Long holds where the nemesis looks for a holder to hit.
            hold_ms: ttl.as_millis() as u64 / if scenario.hits_holders() { 1 } else { 4 },
            resource: resource.addr().to_string(),
            out: dir.join(format!("client-{p}.jsonl")).display().to_string(),
            seed: fastrand::u64(..),
        };
        let json = serde_json::to_string(&config).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&exe);
        if matches!(scenario, Scenario::Timing(t) if !t.clock()) {
            cmd.gid(timing::client_gid(p));
        }
        let child = cmd
            .arg("client")
            .arg(json)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start a client process: {e}"))?;
        let pid = child.id().ok_or("a client process exited at once")?;
        clients.children.push((pid, child));
    }

    let faults: Arc<Mutex<Vec<Fault>>> = Arc::default();
    let note = |what: String, killed: Option<u32>, recover_from: bool, deleted: Option<String>| {
        let at = clock::now();
        faults.lock().expect("faults").push(Fault {
            at,
            done: at,
            what,
            killed,
            recover_from,
            deleted,
        });
    };
    let t0 = Instant::now();
    let first_fault = t0 + lead;
    let pids: Vec<u32> = clients.children.iter().map(|c| c.0).collect();
    let holder = |names: &[String]| -> Option<(u32, String)> {
        let now = clock::now();
        names.iter().find_map(|n| {
            resource
                .last_writer(n)
                .filter(|(_, at)| now.saturating_sub(*at) < 150_000_000)
                .map(|(pid, _)| (pid, n.clone()))
        })
    };
    let find_holder = |alive: &[u32]| {
        let alive = alive.to_vec();
        let names = names.clone();
        async move {
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                if let Some((pid, name)) = holder(&names).filter(|(p, _)| alive.contains(p)) {
                    return Some((pid, name));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            None
        }
    };
    tokio::time::sleep_until(first_fault.into()).await;
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
                    let admin = admin(backend, &base_url).await?;
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
            for route in &routes {
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
            for route in &routes {
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
            undo_error = d.cluster_fault(scenario, &every_name, ttl, &note).await?;
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

    // Wait for the clients; one that outlives its run by far is killed (and believes nothing
    // after that).
    let bound = t0 + run_for + Duration::from_secs(30);
    let mut client_errors = Vec::new();
    for (pid, child) in &mut clients.children {
        let killed_by_nemesis = faults
            .lock()
            .expect("faults")
            .iter()
            .any(|f| f.killed == Some(*pid));
        match tokio::time::timeout_at(bound.into(), child.wait()).await {
            Ok(Ok(status)) if status.success() || killed_by_nemesis => {}
            Ok(Ok(status)) => {
                let mut stderr = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use tokio::io::AsyncReadExt;
                    let _ = e.read_to_string(&mut stderr).await;
                }
                client_errors.push(format!("client {pid} exited {status}: {}", stderr.trim()));
            }
            Ok(Err(e)) => client_errors.push(format!("client {pid}: {e}")),
            Err(_) => {
                let _ = child.start_kill();
                note(
                    format!("SIGKILL client {pid}: still running 30 s after its run"),
                    Some(*pid),
                    false,
                    None,
                );
                client_errors.push(format!("client {pid} did not finish in time"));
            }
        }
    }
    let run_end = clock::now();
    drop(routes);

    let residue = residue(backend, &base_url, &prefix, &every_name, ttl).await;
    let faults = faults.lock().expect("faults").clone();
    let recs = crate::history::read_dir(dir)?;
    let expect = Expect {
        oob_delete: scenario == Scenario::OobDelete,
        allowance_ns: clock::nanos(ttl + Duration::from_millis(300)),
        client_pause: scenario == Scenario::HolderPause,
        volatile_restart: matches!(
            scenario,
            Scenario::ServerRestartVolatile | Scenario::MastersRestartVolatile
        ),
    };
    let checked = checker::check(&recs, &faults, &resource.snapshot(), run_end, expect);
    drop(server);
    let mut errors = client_errors;
    errors.extend(undo_error);
    Ok(RunResult {
        checked,
        residue,
        faults: faults.iter().map(|f| f.what.clone()).collect(),
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        wall_s: 0.0,
    })
}

fn describe(target: &Option<(u32, String)>) -> String {
    match target {
        Some((_, name)) => format!("it holds {name:?}"),
        None => "no holder seen in 2 s: a random client".into(),
    }
}
