//! The queue: one ephemeral-sequential node per contender under the lock's container node; the
//! lowest sequence holds the lock (the lowest `max` hold a semaphore's permits, see
//! [`crate::permits`]), and every waiter watches one node, or the first waiter for permits the
//! queue.

use std::sync::Arc;
use std::time::Instant;

use distlock_api::backend::wait::{self, Armed};
use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, ErrorKind, FencingToken, Grant, Result};
use zookeeper_client as zk;

use crate::cleanup::{settle, spawn_delete, QueueNodes};
use crate::error::in_doubt;
use crate::holds::{lock, Inner, NodeData};
use crate::path::{self, QueueNode};
use crate::permits::{judge, mark_granted, other_permits, Verdict};
use crate::session::{request_error, Session};

/// How often an acquire re-creates its queue node after it vanished (removed by an operator)
/// or retries a create whose answer was lost, before it gives up.
pub(crate) const MAX_CREATE_ATTEMPTS: u32 = 5;

impl Inner {
    pub(crate) async fn contend(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let s = self.session();
        s.check_live()?;
        if let Some(grant) = self.rejoin(&s, req).await? {
            return Ok(Some(grant));
        }
        let dir = self.dir(&req.name);
        let prefix = path::new_queue_prefix(req.permits);
        let data = NodeData::bytes(&req.owner, 1, None);
        let mut pending = QueueNodes::armed(s.clone(), dir.clone(), prefix.clone());
        let started = pending.started;
        let (mut mine, mut czxid, mut vouched) =
            self.create_node(&s, &dir, &data, &mut pending).await?;
        let mut ended = s.ended.subscribe();
        let mut recreated = 0;
        loop {
            s.check_live()?;
            // A grant's lease counts from `vouched`, the latest moment a request of ours that
            // went through the leader was sent (see `session::lease`): our create, or a sync
            // sent with this listing when that is too old to leave the grant most of its lease.
            let fresh = vouched.filter(|at| at.elapsed() < s.lease() / 3);
            let sent = Instant::now();
            let listed = match fresh {
                Some(_) => s.call_again(|| s.client.list_children(&dir)).await,
                None => {
                    s.call_again(|| s.behind_sync(|c| c.list_children(&dir)))
                        .await
                }
            };
            let children = match listed {
                Ok(children) => children,
                // Our node cannot exist without its parent: it is gone too.
                Err(Some(zk::Error::NoNode)) => Vec::new(),
                Err(e) => return Err(request_error(e, "cannot list the lock's queue", &s)),
            };
            let queue = path::queue(children);
            // Every node with our prefix is ours: a create retried after a lost answer may have
            // made two. Keep the earliest (our best place in line), delete the others.
            let ours: Vec<&QueueNode> = queue
                .iter()
                .filter(|n| n.name.starts_with(&prefix))
                .collect();
            let Some(me) = ours.first() else {
                // Our node vanished (an operator, or a harness, removed it): queue again.
                recreated += 1;
                if deadline.is_none() || recreated >= MAX_CREATE_ATTEMPTS {
                    settle(pending).await;
                    return Ok(None);
                }
                pending.known.clear();
                (mine, czxid, vouched) = self.create_node(&s, &dir, &data, &mut pending).await?;
                continue;
            };
            let vouched_at = fresh.unwrap_or(sent);
            vouched = Some(vouched_at);
            for dup in &ours[1..] {
                spawn_delete(s.clone(), path::join(&dir, &dup.name));
            }
            let me_path = path::join(&dir, &me.name);
            if me_path != mine {
                match s.call_again(|| s.client.check_stat(&me_path)).await {
                    Ok(Some(stat)) => (mine, czxid) = (me_path, stat.czxid),
                    Ok(None) => continue,
                    Err(e) => return Err(request_error(e, "cannot read the queue node", &s)),
                }
                if !pending.known.contains(&mine) {
                    pending.known.push(mine.clone());
                }
            }
            let my_seq = me.seq;
            let position = queue.iter().position(|n| n.seq == my_seq).unwrap_or(0);
            let verdict = judge(&queue, position, req.permits);
            match verdict {
                Verdict::Hold => {
                    if req.permits > 1 && position + 1 < queue.len() {
                        // Someone queued behind us may be watching our node as a waiter's.
                        mark_granted(&s, &mine, &req.owner);
                    }
                    return self
                        .take_turn(&s, req, pending, mine, czxid, vouched_at)
                        .map(Some);
                }
                Verdict::Refuse(held) => {
                    settle(pending).await;
                    return Err(other_permits(req, held));
                }
                Verdict::Node(_) | Verdict::Children => {}
            }
            let Some(deadline) = deadline else {
                // try-acquire: not first, so leave the queue.
                settle(pending).await;
                return Ok(None);
            };
            if Instant::now() >= deadline {
                settle(pending).await;
                return Err(wait::timeout(deadline.saturating_duration_since(started)));
            }
            let (watcher, predecessor) = match verdict {
                // Watch only the one node the verdict names (for a lock, the one just ahead of
                // ours): its deletion is our turn, or its owner left the queue (or, for a
                // permit, it was granted), and we re-check.
                Verdict::Node(i) => {
                    let watched = path::join(&dir, &queue[i].name);
                    match s.call_again(|| s.client.get_and_watch_data(&watched)).await {
                        // Written to since it was created: a permit granted already (see
                        // `mark_granted`), so our place has changed.
                        Ok((_, stat, _)) if req.permits > 1 && stat.version != 0 => continue,
                        Ok((_, _, watcher)) => (watcher, watched),
                        Err(Some(zk::Error::NoNode)) => continue,
                        Err(e) => return Err(request_error(e, "cannot watch the predecessor", &s)),
                    }
                }
                // The semaphore's first waiter watches the queue: any holder's release is its
                // turn. The watch is set by a listing, judged again so no change is missed.
                _ => match s
                    .call_again(|| s.client.list_and_watch_children(&dir))
                    .await
                {
                    Ok((children, watcher)) => {
                        let now = path::queue(children);
                        let still = now
                            .iter()
                            .position(|n| n.seq == my_seq)
                            .map(|me| judge(&now, me, req.permits));
                        if still != Some(Verdict::Children) {
                            continue;
                        }
                        (watcher, dir.clone())
                    }
                    Err(Some(zk::Error::NoNode)) => continue,
                    Err(e) => return Err(request_error(e, "cannot watch the queue", &s)),
                },
            };
            let woken = tokio::select! {
                event = watcher.changed() => Some(Some(event)),
                _ = ended.wait_for(|&ended| ended) => Some(None),
                _ = tokio::time::sleep_until(deadline.into()) => None,
            };
            let Some(event) = woken else {
                settle(pending).await;
                return Err(wait::timeout(deadline.saturating_duration_since(started)));
            };
            // The predecessor held the lock and is deleted now: ours is first, and the queue
            // need not be listed again. It held it if it was first at our last look (nodes
            // made since are all after ours), or if it was a grant of this client (see
            // `Released`). The lease counts from a request that went through the leader: the
            // release's delete, or the one `vouched` for while that is recent (else the queue
            // is listed again, behind a sync).
            let deleted = req.permits == 1
                && event.is_some_and(|e| e.event_type == zk::EventType::NodeDeleted);
            let turn = deleted
                .then(|| lock(&self.released).get(&predecessor).copied())
                .flatten();
            let turn = turn.or_else(|| {
                (deleted && position == 1 && vouched_at.elapsed() < s.lease() / 3)
                    .then_some(vouched_at)
            });
            if let Some(sent) = turn {
                s.check_live()?;
                return self
                    .take_turn(&s, req, pending, mine, czxid, sent)
                    .map(Some);
            }
        }
    }

    /// The grant of our node `mine` (first in its queue, or for a permit among the first
    /// `max`), with the lease a request of ours sent at `sent` that went through the leader
    /// vouches for: recorded as held, and any other node of ours deleted.
    fn take_turn(
        &self,
        s: &Session,
        req: &AcquireRequest,
        pending: Armed<QueueNodes>,
        mine: String,
        czxid: i64,
        sent: Instant,
    ) -> Result<Grant> {
        self.register_hold(s, req, &mine, czxid)?;
        pending.disarm().keep_only(&mine);
        Ok(Grant::new(
            req.name.clone(),
            req.owner.clone(),
            FencingToken(czxid as u64),
            1,
            s.lease(),
            sent,
        )
        .with_key(mine))
    }

    /// Creates our queue node, the lock node first if it is missing. A create whose answer is
    /// lost may still have happened: the unique prefix finds it (Curator's "protected" mode).
    /// Returns the node's path and czxid, and when the create was sent if its answer came (the
    /// create went through the leader after that moment, as a sync would have).
    async fn create_node(
        &self,
        s: &Arc<Session>,
        dir: &str,
        data: &[u8],
        pending: &mut QueueNodes,
    ) -> Result<(String, i64, Option<Instant>)> {
        let prefix_path = path::join(dir, &pending.prefix);
        let mode = zk::CreateMode::EphemeralSequential.with_acls(self.acl.acls());
        let mut attempts = 0;
        // Whether an earlier create of ours went unanswered (and so may exist unknown to us).
        let mut lost_answers = pending.in_doubt;
        loop {
            attempts += 1;
            s.check_live()?;
            // Until the answer arrives, a dropped acquire must sweep by prefix.
            pending.in_doubt = true;
            let sent = Instant::now();
            let outcome = s.call(s.client.create(&prefix_path, data, &mode)).await;
            match outcome {
                Ok((stat, sequence)) => {
                    pending.in_doubt = lost_answers;
                    let path = format!("{prefix_path}{sequence}");
                    pending.known.push(path.clone());
                    return Ok((path, stat.czxid, Some(sent)));
                }
                Err(Some(zk::Error::NoNode)) if attempts < MAX_CREATE_ATTEMPTS => {
                    pending.in_doubt = lost_answers;
                    // The lock node is missing, or the container sweeper just removed it.
                    self.make_lock_node(s, dir).await?;
                }
                Err(e) if in_doubt(&e) && attempts < MAX_CREATE_ATTEMPTS => {
                    lost_answers = true;
                    if let Some((path, czxid)) = self.find_mine(s, dir, &pending.prefix).await? {
                        pending.known.push(path.clone());
                        return Ok((path, czxid, None));
                    }
                }
                Err(e) => return Err(request_error(e, "cannot create the queue node", s)),
            }
        }
    }

    /// Creates the lock's container node (and the base path, if it went missing).
    async fn make_lock_node(&self, s: &Session, dir: &str) -> Result<()> {
        let container = zk::CreateMode::Container.with_acls(self.acl.acls());
        for _ in 0..2 {
            match s.call_again(|| s.client.create(dir, &[], &container)).await {
                Ok(_) | Err(Some(zk::Error::NodeExists)) => return Ok(()),
                Err(Some(zk::Error::NoNode)) => {
                    let persistent = zk::CreateMode::Persistent.with_acls(self.acl.acls());
                    s.call_again(|| s.client.mkdir(&self.base, &persistent))
                        .await
                        .map_err(|e| request_error(e, "cannot create the base path", s))?;
                }
                Err(e) => return Err(request_error(e, "cannot create the lock node", s)),
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "the base path keeps disappearing while the lock node is created",
        )
        .with_backend("zk"))
    }

    /// Our queue node with `prefix`, if a create whose answer was lost made one.
    async fn find_mine(
        &self,
        s: &Session,
        dir: &str,
        prefix: &str,
    ) -> Result<Option<(String, i64)>> {
        let children = match s.call_again(|| s.client.list_children(dir)).await {
            Ok(children) => children,
            Err(Some(zk::Error::NoNode)) => return Ok(None),
            Err(e) => return Err(request_error(e, "cannot list the lock's queue", s)),
        };
        let Some(node) = path::queue(children)
            .into_iter()
            .find(|n| n.name.starts_with(prefix))
        else {
            return Ok(None);
        };
        let path = path::join(dir, &node.name);
        match s.call_again(|| s.client.check_stat(&path)).await {
            Ok(Some(stat)) => Ok(Some((path, stat.czxid))),
            Ok(None) => Ok(None),
            Err(e) => Err(request_error(e, "cannot read the queue node", s)),
        }
    }
}
