//! One run of one scenario on one backend: the runner starts the resource (and a private server
//! or proxies where the scenario needs them), spawns the client processes, plays the nemesis,
//! undoes every fault, waits for the leases to run out, looks for residue and checks the
//! history.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_conformance::{hosts_of, reroute, Proxy};
use serde::Serialize;
use tokio::process::Child;

use crate::checker::{self, Checked, Expect};
use crate::client::ClientConfig;

/// How many permits the campaign's semaphore names have.
const SEM_MAX: u32 = 2;
use crate::clock;
use crate::history::Fault;
use crate::matrix::{Backend, Scenario};
use crate::resource::Resource;
use crate::servers::{Deployment, Kind};

mod drawn;
mod phases;
mod play;
mod residue;
mod stage;
mod timing;

pub(crate) use drawn::Plan;
pub(crate) use phases::{phases, Phases, WITHIN_NS};
pub(crate) use play::play;
use stage::spawn_client;

use residue::residue;

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
    /// How long the checker took, in seconds, over how many client records.
    pub(crate) check_s: f64,
    pub(crate) history_recs: usize,
    /// A soak's phase coverage: where in the clients' cycles its faults landed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) phases: Option<Phases>,
}

/// Where a client process's connection goes: the proxies of one client, one per server.
pub(crate) struct Route {
    proxies: Vec<Proxy>,
}

#[derive(Default)]
pub(crate) struct Clients {
    children: Vec<(u32, Child)>,
    /// What each live client was started with (to start another in its place).
    configs: Vec<ClientConfig>,
    /// Clients the nemesis killed and replaced (a soak's), still to be reaped.
    dead: Vec<(u32, Child)>,
}

/// What a run is made of: its clients, its names, and what its nemesis plays.
pub(crate) struct Shape<'a> {
    /// The scenario whose private servers (if any) the run starts.
    pub(crate) setup: Scenario,
    /// What the nemesis plays.
    pub(crate) nemesis: Nemesis<'a>,
    /// Lock names (besides a semaphore and an election).
    pub(crate) names: usize,
    /// Client processes, tasks in each, and how many of those share one handle.
    pub(crate) procs: usize,
    pub(crate) tasks: u32,
    pub(crate) shared: u32,
    /// When the first fault comes, and how long the clients loop.
    pub(crate) lead: Duration,
    pub(crate) run_for: Duration,
    /// Whether each client reaches its server through proxies of its own.
    pub(crate) proxied: bool,
    /// How long a hold lasts at most.
    pub(crate) hold_ms: u64,
    /// Which clients drop acquire futures at random points and extend fixed leases.
    pub(crate) cancel_storm: fn(usize) -> bool,
    pub(crate) lease_shrink: fn(usize) -> bool,
    /// What the faults make legitimate.
    pub(crate) expect: Expect,
}

/// The nemesis of a run.
pub(crate) enum Nemesis<'a> {
    /// One scenario's fault, once, after the lead.
    Once(Scenario),
    /// A soak's: faults drawn from a pool until the end (`run/drawn.rs`).
    Soak(&'a Plan),
}

impl Shape<'_> {
    /// A campaign run of `scenario`.
    fn of(scenario: Scenario, knobs: Knobs, ttl: Duration) -> Shape<'static> {
        // Clients connect before they loop: the first fault comes after a moment, which varies
        // so that over the runs a fault lands at every point of the clients' cycles (a fixed
        // moment kept hitting the same phase, and hid a server that lost its last acknowledged
        // writes). The runs are that much longer, so the time after the fault stays the same.
        let lead = Duration::from_millis(fastrand::u64(1500..=3000));
        let (tasks, shared) = match scenario {
            Scenario::SharedHandle => (4, 4),
            _ => (3, 2),
        };
        Shape {
            setup: scenario,
            nemesis: Nemesis::Once(scenario),
            names: 2,
            procs: knobs.procs,
            tasks,
            shared,
            lead,
            run_for: lead - Duration::from_millis(1500)
                + knobs.base
                + ttl * scenario.leases_after(),
            proxied: scenario.proxied(),
            // Long holds where the nemesis looks for a holder to hit.
            hold_ms: ttl.as_millis() as u64 / if scenario.hits_holders() { 1 } else { 4 },
            cancel_storm: if scenario == Scenario::CancelStorm {
                |_| true
            } else {
                |_| false
            },
            lease_shrink: if scenario == Scenario::LeaseShrink {
                |_| true
            } else {
                |_| false
            },
            expect: Expect {
                oob_delete: scenario == Scenario::OobDelete,
                allowance_ns: clock::nanos(ttl + Duration::from_millis(300)),
                server_lease_ns: clock::nanos(ttl),
                client_pause: scenario == Scenario::HolderPause,
                volatile_restart: matches!(
                    scenario,
                    Scenario::ServerRestartVolatile | Scenario::MastersRestartVolatile
                ),
            },
        }
    }
}

/// What the nemesis acts on, for [`play()`].
pub(crate) struct Stage<'a> {
    pub(crate) backend: &'a Backend,
    pub(crate) ttl: Duration,
    base_url: &'a str,
    resource: &'a Resource,
    names: &'a [String],
    /// Every name of the run (locks, semaphore, election).
    every_name: &'a [String],
    faults: &'a Arc<Mutex<Vec<Fault>>>,
    /// A soak's: every action is noted as in force, and the soak notes the end of each of its
    /// faults (two may overlap, and the checker's fault windows do not nest).
    deferred: bool,
}

/// Runs `scenario` on `backend` once.
pub(crate) async fn run(
    backend: &Backend,
    scenario: Scenario,
    knobs: Knobs,
    index: usize,
    dir: &Path,
) -> RunResult {
    let shape = Shape::of(scenario, knobs, backend.ttl());
    run_shape(backend, shape, index, dir).await
}

/// Runs `shape` on `backend` once: a campaign run, or a soak.
pub(crate) async fn run_shape(
    backend: &Backend,
    shape: Shape<'_>,
    index: usize,
    dir: &Path,
) -> RunResult {
    let started = Instant::now();
    let mut result = match run_inner(backend, shape, index, dir).await {
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
    shape: Shape<'_>,
    index: usize,
    dir: &Path,
) -> Result<RunResult, String> {
    let ttl = backend.ttl();
    let scenario = shape.setup;
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
    // faults hit all three, and the same checker judges them. On a Redis Cluster, each name
    // takes a suffix until it is in the slots of the primary the nemesis faults (a third of
    // the slots: three tries a name on average, where drawing whole sets of a soak's 16 names
    // again would take millions).
    let caps = backend.capabilities();
    let prefix = format!(
        "faults-{}-{}-{index}-{:08x}-",
        match shape.nemesis {
            Nemesis::Once(s) => s.key(),
            Nemesis::Soak(_) => "soak",
        },
        std::process::id(),
        fastrand::u32(..)
    );
    let placed = |base: String| -> String {
        let fits = |n: &String| {
            server
                .as_ref()
                .is_none_or(|d| d.keeps_together(std::slice::from_ref(n)))
        };
        std::iter::once(base.clone())
            .chain((1..).map(|k| format!("{base}-{k}")))
            .find(fits)
            .expect("an endless supply of names")
    };
    let names: Vec<String> = (0..shape.names)
        .map(|i| placed(format!("{prefix}{i}")))
        .collect();
    let sem_names: Vec<String> = (caps.semaphore)
        .then(|| placed(format!("{prefix}sem")))
        .into_iter()
        .collect();
    let elect_names: Vec<String> = (caps.election)
        .then(|| placed(format!("{prefix}elect")))
        .into_iter()
        .collect();
    let every_name: Vec<String> = (names.iter())
        .chain(&sem_names)
        .chain(&elect_names)
        .cloned()
        .collect();
    let proxied = shape.proxied;
    let (lead, run_for) = (shape.lead, shape.run_for);
    let mut routes = Vec::new();
    let mut clients = Clients {
        children: Vec::new(),
        configs: Vec::new(),
        dead: Vec::new(),
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    for p in 0..shape.procs {
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
            tasks: shape.tasks,
            shared: shape.shared,
            duration_ms: run_for.as_millis() as u64,
            ttl_ms: ttl.as_millis() as u64,
            per_lock: backend.per_lock(),
            cancel_storm: (shape.cancel_storm)(p),
            lease_shrink: (shape.lease_shrink)(p),
            hold_ms: shape.hold_ms,
            resource: resource.addr().to_string(),
            out: dir.join(format!("client-{p}.jsonl")).display().to_string(),
            seed: fastrand::u64(..),
        };
        let gid =
            matches!(scenario, Scenario::Timing(t) if !t.clock()).then(|| timing::client_gid(p));
        let (pid, child) = spawn_client(&exe, &config, gid)?;
        clients.children.push((pid, child));
        clients.configs.push(config);
    }

    let faults: Arc<Mutex<Vec<Fault>>> = Arc::default();
    let stage = Stage {
        backend,
        ttl,
        base_url: &base_url,
        resource: &resource,
        names: &names,
        every_name: &every_name,
        faults: &faults,
        deferred: matches!(shape.nemesis, Nemesis::Soak(_)),
    };
    let t0 = Instant::now();
    tokio::time::sleep_until((t0 + lead).into()).await;
    let undo_error = match shape.nemesis {
        Nemesis::Once(s) => play(s, &stage, &mut server, target, &mut clients, &routes).await?,
        Nemesis::Soak(plan) => {
            let end = t0 + run_for;
            drawn::nemesis(plan, &stage, &mut server, &mut clients, &routes, end).await?
        }
    };
    let note =
        |what, killed, recover_from, deleted| stage.note(what, killed, recover_from, deleted);

    // Wait for the clients; one that outlives its run by far is killed (and believes nothing
    // after that).
    let bound = t0 + run_for + Duration::from_secs(30);
    let mut client_errors = Vec::new();
    for (pid, child) in clients.children.iter_mut().chain(&mut clients.dead) {
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
    let checking = Instant::now();
    let checked = checker::check(&recs, &faults, &resource.snapshot(), run_end, shape.expect);
    let check_s = checking.elapsed().as_secs_f64();
    let phases = matches!(shape.nemesis, Nemesis::Soak(_))
        .then(|| phases(&recs, &faults, backend.per_lock()));
    let history_recs = recs.len();
    drop(recs);
    drop(server);
    let mut errors = client_errors;
    errors.extend(undo_error);
    Ok(RunResult {
        checked,
        residue,
        faults: faults.iter().map(|f| f.what.clone()).collect(),
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        wall_s: 0.0,
        check_s,
        history_recs,
        phases,
    })
}
