//! What the nemesis acts on: the run's fault log and names ([`Stage`]), and its client
//! processes ([`Clients`]), which a soak replaces when the nemesis has killed one.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::{Clients, Stage};
use crate::client::ClientConfig;
use crate::clock;
use crate::history::Fault;

impl Stage<'_> {
    /// Records a fault the nemesis injected or undid, now.
    pub(crate) fn note(
        &self,
        what: String,
        killed: Option<u32>,
        recover_from: bool,
        deleted: Option<String>,
    ) {
        let at = clock::now();
        self.faults.lock().expect("faults").push(Fault {
            at,
            done: at,
            what,
            killed,
            recover_from: recover_from && !self.deferred,
            deleted,
        });
    }

    /// Records the end of a soak's fault (its last undo done), now.
    pub(crate) fn note_over(&self, what: String) {
        let at = clock::now();
        self.faults.lock().expect("faults").push(Fault {
            at,
            done: at,
            what,
            killed: None,
            recover_from: true,
            deleted: None,
        });
    }

    /// A client of `alive` seen writing to one of the run's names in the last 150 ms, and
    /// that name; looked for up to 2 s.
    pub(crate) async fn find_holder(&self, alive: Vec<u32>) -> Option<(u32, String)> {
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let now = clock::now();
            let seen = self.names.iter().find_map(|n| {
                self.resource
                    .last_writer(n)
                    .filter(|(pid, at)| {
                        now.saturating_sub(*at) < 150_000_000 && alive.contains(pid)
                    })
                    .map(|(pid, _)| (pid, n.clone()))
            });
            if seen.is_some() {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }
}

impl Clients {
    /// The live clients' pids, in the order of their routes.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.0).collect()
    }

    /// Starts a client in the place of each one that has exited (one the nemesis killed), on
    /// its route, looping until `end`; returns their pids.
    pub(crate) fn replace_exited(&mut self, end: Instant) -> Result<Vec<u32>, String> {
        // This very binary even if a build has replaced its file since (its path then names
        // the new one, or nothing).
        let exe = Path::new("/proc/self/exe");
        let mut started = Vec::new();
        for i in 0..self.children.len() {
            if !matches!(self.children[i].1.try_wait(), Ok(Some(_))) {
                continue;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left < Duration::from_secs(1) {
                continue;
            }
            let config = &mut self.configs[i];
            config.duration_ms = left.as_millis() as u64;
            config.seed = fastrand::u64(..);
            config.out = format!(
                "{}.{}",
                config.out.trim_end_matches(".jsonl"),
                fastrand::u32(..)
            ) + ".jsonl";
            let (pid, child) = spawn_client(exe, config, None)?;
            let old = std::mem::replace(&mut self.children[i], (pid, child));
            self.dead.push(old);
            started.push(pid);
        }
        Ok(started)
    }
}

/// Starts a client process of this binary with `config` (and group id `gid`, which the one-way
/// rows match on).
pub(super) fn spawn_client(
    exe: &Path,
    config: &ClientConfig,
    gid: Option<u32>,
) -> Result<(u32, Child), String> {
    let json = serde_json::to_string(config).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    if let Some(gid) = gid {
        cmd.gid(gid);
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
    Ok((pid, child))
}
