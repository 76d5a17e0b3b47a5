//! What the nemesis does to a member: pause and resume it, kill and restart it, cut it off
//! from its peers and heal it.

use std::time::Duration;

use super::net::nft;
use super::Deployment;

/// What the nemesis notes: what, a killed client, whether it ends a fault, a deleted name.
pub(crate) type Note<'a> = &'a dyn Fn(String, Option<u32>, bool, Option<String>);

/// How long a replica's promotion may take before a failover counts as failed.
pub(super) const PROMOTION_BOUND: Duration = Duration::from_secs(30);

impl Deployment {
    /// SIGSTOP member `i`: it accepts connections but answers nothing, and its timers stop.
    pub(crate) fn pause(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, "STOP")
    }

    /// SIGCONT member `i`.
    pub(crate) fn resume(&mut self, i: usize) -> Result<(), String> {
        self.signal(i, "CONT")
    }

    /// SIGKILL member `i` (its whole process group), keeping its data for a restart.
    pub(crate) fn kill(&mut self, i: usize) {
        let _ = self.signal(i, "KILL");
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
            if self.clock.is_some() {
                super::faked_clock::forget(c.id());
            }
        }
    }

    /// Starts member `i` again on its data and waits until it serves.
    pub(crate) async fn restart(&mut self, i: usize) -> Result<(), String> {
        self.kill(i);
        let mut last = String::new();
        for _ in 0..3 {
            self.spawn(i)?;
            match self.wait_serving(i).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            self.kill(i);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Err(last)
    }

    /// A second after a failover, restarts the old primary `i` on its data; notes `what` (a
    /// fault's end if `ends`) whether or not it came back.
    pub(super) async fn rejoin(
        &mut self,
        i: usize,
        what: &str,
        ends: bool,
        note: Note<'_>,
    ) -> Result<(), String> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let restarted = self.restart(i).await;
        note(what.into(), None, ends, None);
        restarted.map_err(|e| format!("the old primary (member {i}) did not come back: {e}"))
    }

    /// Cuts member `i` off from its peers (both ways), leaving its clients connected.
    pub(crate) fn cut(&self, i: usize) -> Result<(), String> {
        let others: Vec<&str> = self
            .members
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, m)| m.ip.as_str())
            .collect();
        let set = others.join(", ");
        nft(
            &self.members[i].ns,
            &format!(
                "table inet distlock_cut {{\n\
                   chain input {{ type filter hook input priority 0; ip saddr {{ {set} }} drop; }}\n\
                   chain output {{ type filter hook output priority 0; ip daddr {{ {set} }} drop; }}\n\
                 }}\n"
            ),
        )
    }

    /// Undoes [`cut`](Self::cut).
    pub(crate) fn heal(&self, i: usize) -> Result<(), String> {
        nft(&self.members[i].ns, "delete table inet distlock_cut\n")
    }

    /// Through kill(1) to the member's process group (the server and any processes it
    /// started), and only while the child that leads it is unreaped, so that its pid cannot be
    /// another process's.
    fn signal(&mut self, i: usize, signal: &str) -> Result<(), String> {
        let Some(child) = self.members[i].child.as_mut() else {
            return Err(format!("{:?} member {i} is not running", self.kind));
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return Err(format!("{:?} member {i} has exited", self.kind));
        }
        crate::signal_group(child.id(), signal)
    }
}
