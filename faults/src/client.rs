//! A client process: several tasks, some on one shared client handle and some on handles of
//! their own, each looping acquire → fenced write → counter increment → hold → let go,
//! recording every operation as a JSON line. The holds use the API as users do: re-entry
//! through the guard, one to three deep (the holds let go in any order), releases and drops (on the
//! task, or on a plain thread), fixed leases left to run out or extended shorter or longer and
//! then held to their end, watchdog holds of several leases, and zombies: a holder that stalls
//! after its last check and writes with its old token once its lease is over.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::{DistributedLock, ErrorKind, LockExt, LockGuard, LockOptions, LostReason};
use serde::{Deserialize, Serialize};

use crate::clock;
use crate::history::{OpId, Rec};
use crate::resource::{Conn, Request};

mod hold;

/// What the runner tells a client process to do.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ClientConfig {
    /// The lock URL (maybe through proxies).
    pub(crate) url: String,
    /// The lock names to contend on.
    pub(crate) names: Vec<String>,
    /// Semaphore names to take permits of, each admitting `sem_max` holders (no register or
    /// counter on them: their holders share them by design).
    #[serde(default)]
    pub(crate) sem_names: Vec<String>,
    /// How many permits each semaphore name has.
    #[serde(default)]
    pub(crate) sem_max: u32,
    /// Election names: taken as locks, and each leader proclaims its value while it holds,
    /// and once more as a zombie, unchecked, after its lease ran out.
    #[serde(default)]
    pub(crate) elect_names: Vec<String>,
    /// Tasks in the process.
    pub(crate) tasks: u32,
    /// How many of them share one handle; each of the rest has its own.
    pub(crate) shared: u32,
    /// How long to loop, in ms, from when the handles are connected.
    pub(crate) duration_ms: u64,
    /// The lease asked for, in ms (per-lock backends; session backends take theirs from the
    /// URL).
    pub(crate) ttl_ms: u64,
    /// Whether leases are per lock (fixed leases and extend are possible).
    pub(crate) per_lock: bool,
    /// Drop acquire futures at random points.
    pub(crate) cancel_storm: bool,
    /// Extend fixed leases to shorter and longer ones.
    pub(crate) lease_shrink: bool,
    /// How long a hold lasts at most, in ms.
    pub(crate) hold_ms: u64,
    /// The resource's address.
    pub(crate) resource: String,
    /// Where to write the history.
    pub(crate) out: String,
    /// The random seed.
    pub(crate) seed: u64,
}

type Out = Arc<Mutex<LineWriter<File>>>;

fn record(out: &Out, rec: &Rec) {
    // A history line that cannot be written makes the run's check wrong, not unsafe: the
    // runner reports a history it cannot parse.
    if let Ok(line) = serde_json::to_string(rec) {
        if let Ok(mut w) = out.lock() {
            let _ = writeln!(w, "{line}");
        }
    }
}

/// Runs a client process to the end of its duration. Errors are setup errors (cannot connect,
/// cannot open the history file); the operations' own errors go into the history.
pub(crate) async fn run(config: ClientConfig) -> Result<(), String> {
    let out: Out = Arc::new(Mutex::new(LineWriter::new(
        File::create(&config.out).map_err(|e| format!("cannot create {}: {e}", config.out))?,
    )));
    // Pin the Instant/CLOCK_MONOTONIC pair before anything is recorded.
    let _ = clock::of_instant(Instant::now());
    let mut handles: Vec<Arc<dyn DistributedLock>> = Vec::new();
    let own = config.tasks.saturating_sub(config.shared.max(1));
    for _ in 0..(1 + own) {
        handles.push(
            distlock::connect(&config.url)
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", config.url))?,
        );
    }
    let deadline = Instant::now() + Duration::from_millis(config.duration_ms);
    let mut tasks = Vec::new();
    for task in 0..config.tasks {
        let shared = task < config.shared.max(1);
        let handle = if shared {
            handles[0].clone()
        } else {
            handles[(task + 1 - config.shared.max(1)) as usize].clone()
        };
        let worker = Worker {
            config: config.clone(),
            handle,
            shared,
            task,
            out: out.clone(),
            rng: fastrand::Rng::with_seed(config.seed ^ (u64::from(task) << 32)),
            was_zombie: false,
            deadline: Instant::now(),
        };
        tasks.push(tokio::spawn(worker.run(deadline)));
    }
    for t in tasks {
        if let Err(e) = t.await {
            return Err(format!("a client task failed: {e}"));
        }
    }
    // Let guards dropped at the end hand their releases to the background before exit.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

/// What a holder does with its hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Release,
    Drop,
    /// Fixed lease, never released: held until it runs out.
    Expire,
    /// Fixed lease, extended to a shorter or longer one, then held until the guard's
    /// safe-until: a lease the server kept shorter than the guard believes shows as an overlap.
    Extend,
    /// A watchdog lease held for two to five leases: renewals that do not extend show.
    Long,
    /// Fixed lease; after its last check the holder stalls past the lease, then writes with
    /// its old token without checking again.
    Zombie,
}

struct Worker {
    config: ClientConfig,
    handle: Arc<dyn DistributedLock>,
    shared: bool,
    task: u32,
    out: Out,
    rng: fastrand::Rng,
    /// Whether this task has held as a zombie yet.
    was_zombie: bool,
    /// When the task stops taking the lock: long holds end by then.
    deadline: Instant,
}

/// Keeps what a guard's `lost()` said and when, for the end of belief.
type LostAt = Arc<Mutex<Option<(u64, String)>>>;

/// Whether the holder may still write: not lost, and safe-until far enough ahead that the
/// write lands before it (a loopback round trip, far less than the margin).
fn believes(guard: &LockGuard) -> bool {
    !guard.is_lost()
        && guard
            .safe_until()
            .is_none_or(|s| s > Instant::now() + Duration::from_millis(30))
}

impl Worker {
    async fn run(mut self, deadline: Instant) {
        self.deadline = deadline;
        let pid = std::process::id();
        let mut conn = match Conn::connect(&self.config.resource).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("client {pid}: cannot reach the resource: {e}");
                return;
            }
        };
        let mut seq = 0;
        while Instant::now() < deadline {
            seq += 1;
            let id = OpId {
                pid,
                task: self.task,
                seq,
            };
            let action = self.pick_action();
            let name = match (action, self.config.elect_names.first()) {
                // The second task's first zombie stalls on the election, so that every run has
                // a deposed leader proclaiming after another was elected.
                (Action::Zombie, Some(elect)) if self.task == 1 && !self.was_zombie => {
                    elect.clone()
                }
                _ => self.pick_name(),
            };
            let permits = if self.config.sem_names.contains(&name) {
                self.config.sem_max
            } else {
                1
            };
            let ttl = Duration::from_millis(self.config.ttl_ms);
            let mut options = match action {
                Action::Expire | Action::Extend | Action::Zombie => LockOptions::new().ttl(ttl),
                Action::Release | Action::Drop | Action::Long if self.config.per_lock => {
                    LockOptions::new().watchdog_ttl(ttl)
                }
                _ => LockOptions::new(),
            };
            let wait = self.rng.bool();
            let wait_for = Duration::from_millis(self.rng.u64(20..=2 * self.config.ttl_ms));
            if wait {
                options = options.wait(wait_for);
            }
            let invoke = clock::now();
            let attempt = async {
                if wait {
                    self.handle.permit(&name, permits, &options).await.map(Some)
                } else {
                    self.handle.try_permit(&name, permits, &options).await
                }
            };
            let result = if self.config.cancel_storm && self.rng.u8(..4) != 0 {
                // Dropped at a random point: before it is sent, while waiting, or while the
                // answer is on its way.
                let cut = Duration::from_micros(self.rng.u64(0..=wait_for.as_micros() as u64));
                tokio::time::timeout(cut, attempt).await.ok()
            } else {
                Some(attempt.await)
            };
            let complete = clock::now();
            let mut rec = Rec::Acquire {
                id,
                name: name.clone(),
                how: if wait { "wait" } else { "try" }.into(),
                invoke,
                complete,
                outcome: String::new(),
                error: None,
                token: None,
                owner: None,
                safe_until: None,
                ttl_ms: None,
                shared: self.shared,
                fixed: matches!(action, Action::Expire | Action::Extend | Action::Zombie),
                permits,
            };
            let guard = match result {
                None => {
                    set_outcome(&mut rec, "cancelled", None);
                    None
                }
                Some(Ok(None)) => {
                    set_outcome(&mut rec, "busy", None);
                    None
                }
                Some(Ok(Some(guard))) => {
                    if let Rec::Acquire {
                        outcome,
                        token,
                        owner,
                        safe_until,
                        ttl_ms,
                        ..
                    } = &mut rec
                    {
                        *outcome = "granted".into();
                        *token = Some(guard.token().0);
                        *owner = Some(guard.owner().to_string());
                        *safe_until = guard.safe_until().map(clock::of_instant);
                        *ttl_ms = Some(guard.ttl().as_millis() as u64);
                    }
                    Some(guard)
                }
                Some(Err(e)) if e.kind() == ErrorKind::Timeout => {
                    set_outcome(&mut rec, "timeout", None);
                    None
                }
                Some(Err(e)) => {
                    set_outcome(&mut rec, "error", Some(e.to_string()));
                    None
                }
            };
            record(&self.out, &rec);
            match guard {
                Some(guard) => self.hold(id, &name, guard, action, &mut conn).await,
                None => {
                    let pause = if matches!(&rec, Rec::Acquire { outcome, .. } if outcome == "error")
                    {
                        // An unreachable server: do not spin.
                        self.rng.u64(50..=150)
                    } else {
                        self.rng.u64(1..=20)
                    };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
        }
    }

    /// A name of any kind, locks twice as likely as each other kind.
    fn pick_name(&mut self) -> String {
        let c = &self.config;
        let mut all: Vec<&String> = c.names.iter().chain(&c.names).collect();
        all.extend(c.sem_names.iter().chain(&c.elect_names));
        all[self.rng.usize(..all.len())].clone()
    }

    fn pick_action(&mut self) -> Action {
        if !self.config.per_lock {
            return match self.rng.u8(..20) {
                0..=4 => Action::Drop,
                5 => Action::Long,
                _ => Action::Release,
            };
        }
        // Every process's first task holds as a zombie until it has been one once, so that
        // every run has one, and so does its second where there is an election; none starts a
        // zombie's stall when the run is about to end.
        let time_left = self.deadline.saturating_duration_since(Instant::now());
        let zombie_fits = time_left > Duration::from_millis(2 * self.config.ttl_ms);
        let forced = self.task == 0 || (self.task == 1 && !self.config.elect_names.is_empty());
        if forced && !self.was_zombie && zombie_fits {
            return Action::Zombie;
        }
        if self.config.lease_shrink && self.rng.bool() {
            return Action::Extend;
        }
        match self.rng.u8(..20) {
            0..=1 => Action::Drop,
            2..=3 => Action::Expire,
            4 => Action::Long,
            5 if zombie_fits => Action::Zombie,
            _ => Action::Release,
        }
    }

    async fn release(&self, id: OpId, guard: LockGuard) {
        let invoke = clock::now();
        let result = match guard.release().await {
            Ok(true) => "held".to_string(),
            Ok(false) => "not_held".to_string(),
            Err(e) => e.to_string(),
        };
        record(
            &self.out,
            &Rec::Release {
                id,
                invoke,
                complete: clock::now(),
                result,
            },
        );
    }

    async fn write(&self, id: OpId, name: &str, guard: &LockGuard, conn: &mut Conn) {
        if !believes(guard) {
            return;
        }
        self.write_unchecked(id, name, guard.token().0, conn, false)
            .await;
        if believes(guard) {
            self.proclaim(id, name, guard, false).await;
        }
    }

    /// On an election's name: proclaims the leader's value through the backend's own call, as
    /// `Leadership::proclaim` does but without its check of the guard when `zombie`.
    async fn proclaim(&self, id: OpId, name: &str, guard: &LockGuard, zombie: bool) {
        if !self.config.elect_names.iter().any(|n| n == name) {
            return;
        }
        let invoke = clock::now();
        let value = format!("{id} at {invoke}");
        let result = self.handle.proclaim(guard.grant(), &value).await;
        record(
            &self.out,
            &Rec::Proclaim {
                id,
                name: name.to_string(),
                invoke,
                complete: clock::now(),
                accepted: matches!(result, Ok(true)),
                error: result.err().map(|e| e.to_string()),
                zombie,
            },
        );
    }

    async fn write_unchecked(
        &self,
        id: OpId,
        name: &str,
        token: u64,
        conn: &mut Conn,
        zombie: bool,
    ) {
        if self.config.sem_names.iter().any(|n| n == name) {
            return; // shared by its permits' holders: no register
        }
        let invoke = clock::now();
        let answer = conn
            .call(&Request::Fence {
                name: name.to_string(),
                token,
                pid: id.pid,
                grant: id.to_string(),
            })
            .await;
        record(
            &self.out,
            &Rec::Write {
                id,
                name: name.to_string(),
                token,
                invoke,
                complete: clock::now(),
                accepted: answer.map(|a| a.accepted).unwrap_or(false),
                zombie,
            },
        );
    }

    async fn increment(&mut self, id: OpId, name: &str, guard: &LockGuard, conn: &mut Conn) {
        if !believes(guard) || self.config.sem_names.iter().any(|n| n == name) {
            return;
        }
        let invoke = clock::now();
        let outcome = async {
            let read = conn
                .call(&Request::Read {
                    name: name.to_string(),
                })
                .await?;
            // The window a second holder's update falls into.
            tokio::time::sleep(Duration::from_millis(self.rng.u64(1..=5))).await;
            if !believes(guard) {
                return Ok::<_, std::io::Error>("aborted");
            }
            conn.call(&Request::Set {
                name: name.to_string(),
                value: read.value + 1,
            })
            .await?;
            Ok("done")
        }
        .await;
        record(
            &self.out,
            &Rec::Incr {
                id,
                name: name.to_string(),
                invoke,
                complete: clock::now(),
                outcome: outcome.unwrap_or("error").into(),
            },
        );
    }
}

fn set_outcome(rec: &mut Rec, what: &str, why: Option<String>) {
    if let Rec::Acquire { outcome, error, .. } = rec {
        *outcome = what.into();
        *error = why;
    }
}

/// Sleeps `d`, or less if the guard is lost first.
async fn sleep_or_lost(guard: &LockGuard, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = guard.lost() => {}
    }
}
