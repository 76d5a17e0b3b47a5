//! Watching who leads an election.

use std::time::{Duration, Instant};

use futures::Stream;

use super::Leader;
use crate::backend::wait::Notices;
use crate::error::Result;
use crate::grant::FencingToken;
use crate::guard::context;
use crate::lock::SharedLock;
use crate::name::LockName;

/// How often an observer reads the leader when nothing wakes it, by default.
const DEFAULT_EVERY: Duration = Duration::from_millis(250);

/// Watches who leads an election ([`Election::observe`](super::Election::observe)). Each
/// [`next`](Self::next) returns the next change: the first call the current leader (or `None`),
/// then a takeover, a vacancy (`None`), or a new value proclaimed by the leader.
///
/// Every change comes from a read of the server, made when a notice of a release wakes the
/// observer (where the backend sends them) and at least every [`every`](Self::every) (250 ms
/// unless set), so changes closer together than that may reach it as the latest one only. After
/// an error (a lost connection, a dropped subscription) the next call subscribes again and
/// reads again before it answers. It never returns a leader of an older epoch than one it
/// returned: a read that lags behind (a replica, a reconnect to a server behind) is skipped.
pub struct Observer {
    locks: SharedLock,
    name: LockName,
    every: Duration,
    /// What the last answer said: `None` before the first, `Some(None)` a vacancy.
    shown: Option<Option<(FencingToken, Option<String>)>>,
    /// The newest epoch shown.
    newest: FencingToken,
    /// The newest epoch shown to have ended (a vacancy shown after it): never shown again.
    ended: Option<FencingToken>,
    /// The backend's notices of releases of the name, if it sends them.
    notices: Option<Box<dyn Notices>>,
}

impl Observer {
    pub(super) fn new(locks: SharedLock, name: LockName) -> Self {
        Self {
            locks,
            name,
            every: DEFAULT_EVERY,
            shown: None,
            newest: FencingToken(0),
            ended: None,
            notices: None,
        }
    }

    /// Reads the leader at least this often (250 ms unless set; at least 1 ms).
    #[must_use]
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(1));
        self
    }

    /// The next change of who leads, or of the leader's value; the current state on the first
    /// call. Waits as long as nothing changes.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            if self.notices.is_none() {
                // Subscribed before the read, so a release between the two is not missed. A
                // backend without notices leaves the observer reading every `every`.
                self.notices = self.locks.subscribe(&self.name).await.ok();
            }
            let read = self.read().await;
            let leader = match read {
                Ok(leader) => leader,
                Err(e) => {
                    // A new subscription and a fresh read before the next answer.
                    self.notices = None;
                    return Err(e);
                }
            };
            if let Some(shown) = self.fresh(leader.as_ref()) {
                self.shown = Some(shown);
                return Ok(leader);
            }
            let started = Instant::now();
            match &self.notices {
                Some(notices) => notices.wait(self.every).await,
                None => tokio::time::sleep(self.every).await,
            }
            if started.elapsed() < self.every {
                // Woken by a notice: subscribe afresh, since a backend's notice may be a
                // one-shot watch.
                self.notices = None;
            }
        }
    }

    /// The observer as a stream of changes (see [`next`](Self::next)); it never ends.
    pub fn into_stream(self) -> impl Stream<Item = Result<Option<Leader>>> + Send {
        futures::stream::unfold(self, |mut this| async move {
            let next = this.next().await;
            Some((next, this))
        })
    }

    async fn read(&self) -> Result<Option<Leader>> {
        let info = self
            .locks
            .inspect(&self.name)
            .await
            .map_err(|e| context(e, &*self.locks, &self.name))?;
        Ok(info.map(Leader::of))
    }

    /// What to remember as shown if `leader` is news: a state unlike the last one shown, of
    /// no older epoch than the newest shown, and not of one shown to have ended.
    fn fresh(&mut self, leader: Option<&Leader>) -> Option<Option<(FencingToken, Option<String>)>> {
        let now = leader.map(|l| (l.epoch, l.value.clone()));
        match &now {
            Some((epoch, _)) if *epoch < self.newest || self.ended.is_some_and(|e| *epoch <= e) => {
                return None
            }
            Some((epoch, _)) => self.newest = *epoch,
            None => {}
        }
        if self.shown.as_ref() == Some(&now) {
            return None;
        }
        if now.is_none() && self.shown.is_some() {
            self.ended = Some(self.newest);
        }
        Some(now)
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("name", &self.name)
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::memory::MemoryLock;
    use crate::name::OwnerId;

    fn leader(epoch: u64, value: &str) -> Leader {
        Leader {
            owner: OwnerId::new("someone").unwrap(),
            epoch: FencingToken(epoch),
            value: Some(value.to_owned()),
            since: None,
        }
    }

    /// What an observer shows of a sequence of reads: a read that is not news is left out.
    fn shown(reads: &[Option<Leader>]) -> Vec<Option<(u64, String)>> {
        let mut o = Observer::new(Arc::new(MemoryLock::new()), LockName::new("e").unwrap());
        reads
            .iter()
            .filter(|read| {
                o.fresh(read.as_ref()).is_some_and(|now| {
                    o.shown = Some(now);
                    true
                })
            })
            .map(|read| read.as_ref().map(|l| (l.epoch.0, l.value.clone().unwrap())))
            .collect()
    }

    #[test]
    fn an_observer_shows_changes_once_and_never_goes_back_in_epoch() {
        let reads = [
            None,
            Some(leader(5, "a")),
            Some(leader(5, "a")),   // no news
            Some(leader(5, "b")),   // a proclaim
            Some(leader(4, "old")), // a read that lags: older epoch
            None,                   // a vacancy
            Some(leader(5, "b")),   // a lagging read of the leader that ended
            Some(leader(7, "c")),   // a takeover
        ];
        let want = vec![
            None,
            Some((5, "a".to_owned())),
            Some((5, "b".to_owned())),
            None,
            Some((7, "c".to_owned())),
        ];
        assert_eq!(shown(&reads), want);
    }
}
