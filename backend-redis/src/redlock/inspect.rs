//! Reading who holds: a lock's holder as a majority of masters reports it, and the held locks
//! under a prefix.

use std::sync::Arc;

use distlock_api::{LockInfo, LockName, Result};

use super::*;

impl Shared {
    pub(super) async fn inspect(self: &Arc<Self>, name: &LockName) -> Result<Option<LockInfo>> {
        let s = self;
        let started = Instant::now();
        let all: Vec<usize> = (0..s.n()).collect();
        let mut pending = {
            let name = name.clone();
            s.launch(&all, move |s, i| {
                let name = name.clone();
                async move { s.servers[i].inspect(&name).await }
            })
        };
        let mut deadline = Deadline::new(s.deadline(s.default_ttl), started + s.response_timeout);
        let mut replies: Vec<Result<Option<Holder>>> = Vec::new();
        let mut answered = vec![false; s.n()];
        while let Some((i, r)) = next_before(&mut pending, deadline.limit).await {
            answered[i] = true;
            deadline.answered();
            replies.push(r);
        }
        // A read changes nothing: an answer that is late is simply not waited for.
        for i in (0..s.n()).filter(|&i| !answered[i]) {
            replies.push(Err(no_answer(&s.servers[i], started.elapsed())));
        }
        let failed = replies.iter().filter(|r| r.is_err()).count();
        let holders: Vec<Holder> = replies
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .collect();
        let mut owners: Vec<&OwnerId> = holders.iter().map(|h| &h.owner).collect();
        owners.sort();
        owners.dedup();
        for owner in owners {
            let mine: Vec<&Holder> = holders.iter().filter(|h| &h.owner == owner).collect();
            if mine.len() < s.quorum {
                continue;
            }
            // The grant's token is the one a majority of its masters keep (a late master may
            // not have had it written yet); the largest while a write-back is under way.
            let kept = mine
                .iter()
                .map(|h| if h.fence > 0 { h.fence } else { h.token });
            let token = agreed(kept.clone(), s.quorum)
                .or_else(|| kept.max())
                .unwrap_or(0);
            let info = LockInfo::new(
                owner.clone(),
                kth_largest(mine.iter().map(|h| h.count).collect(), s.quorum).unwrap_or(1),
                FencingToken(token),
                kth_largest(mine.iter().filter_map(|h| h.pttl).collect(), s.quorum),
            );
            // Each master stamped its own grant; the earliest is when the acquire round began.
            let since = mine.iter().map(|h| h.since_ms).filter(|&ms| ms > 0).min();
            let info = match since {
                Some(ms) => info.with_since_unix_ms(ms),
                None => info,
            };
            // A leader's value counts once a majority of masters keep it under this token:
            // each master shows it only under the epoch it was written for (inspect.lua).
            let values: Vec<&str> = mine
                .iter()
                .filter(|h| (if h.fence > 0 { h.fence } else { h.token }) == token)
                .filter_map(|h| h.value.as_deref())
                .collect();
            let value = values
                .iter()
                .find(|v| values.iter().filter(|w| w == v).count() >= s.quorum);
            return Ok(Some(match value {
                Some(v) => info.with_value(*v),
                None => info,
            }));
        }
        // Nobody holds a majority; unless unanswered masters could hide one, the lock is free.
        let best = holders.len();
        if failed > 0 && best + failed >= s.quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "{failed} of {} masters did not answer; cannot tell who holds the lock",
                    s.n()
                ),
            ));
        }
        Ok(None)
    }

    pub(super) async fn list(self: &Arc<Self>, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let s = self;
        let scans = futures::future::join_all(
            s.servers
                .iter()
                .map(|server| tokio::time::timeout(s.response_timeout, server.held_names(prefix))),
        )
        .await;
        let mut names: Vec<LockName> = Vec::new();
        let mut answered = 0;
        for found in scans.into_iter().flatten().flatten() {
            answered += 1;
            names.extend(found);
        }
        // A lock held on a majority shows on at least one master of any majority.
        if answered < s.quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "only {answered} of {} masters answered; cannot list the locks",
                    s.n()
                ),
            ));
        }
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let mut held = Vec::new();
        for name in names {
            if let Some(info) = self.inspect(&name).await? {
                held.push((name, info));
            }
        }
        Ok(held)
    }
}
