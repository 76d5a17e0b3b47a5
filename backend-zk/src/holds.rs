//! The locks a client holds, kept on the client's side: per name and owner, the queue node that
//! stands for the hold and how many holds it counts; and the checks a renewal makes against
//! them before (and after) asking the server.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use distlock_api::backend::{lost, AcquireRequest, ClientCore};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockName, LostReason, OwnerId, Result};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use zookeeper_client as zk;

use crate::config::NodeAcl;
use crate::path;
use crate::session::{request_error, Session, Sessions};

/// What a client handle shares with its session monitor and background tasks.
pub(crate) struct Inner {
    pub(crate) core: ClientCore,
    pub(crate) base: String,
    /// The ACL of the nodes this client creates.
    pub(crate) acl: NodeAcl,
    pub(crate) session: RwLock<Arc<Session>>,
    pub(crate) holds: Mutex<HashMap<HoldKey, Hold>>,
    /// The queue nodes of grants this client released lately, for its own waiters queued
    /// right behind them (see [`Released`]).
    pub(crate) released: Mutex<Released>,
    /// Set once the ensemble refused a multi-read (servers before 3.6): renewals then confirm
    /// each lock with its own request.
    pub(crate) no_multi_read: AtomicBool,
    /// Dropping it stops the session monitor.
    pub(crate) _stop: oneshot::Sender<()>,
}

pub(crate) type HoldKey = (LockName, OwnerId);

/// A lock this client holds for one owner: its queue node and hold count.
pub(crate) struct Hold {
    pub(crate) path: String,
    pub(crate) czxid: i64,
    pub(crate) count: u32,
    pub(crate) epoch: u64,
    /// The value this grant proclaimed (an election's leader), written again with every count
    /// so that a reentrant hold does not erase it.
    pub(crate) value: Option<String>,
}

impl Hold {
    /// What its node says: `owner`, the hold count, and the value proclaimed, if any.
    pub(crate) fn data(&self, owner: &OwnerId) -> Vec<u8> {
        NodeData::bytes(owner, self.count, self.value.as_deref())
    }
}

/// How many released nodes [`Released`] remembers.
const REMEMBER_RELEASED: usize = 256;

/// The queue nodes of grants this client released lately, each with the moment its delete was
/// sent. A node that was granted was the lowest of its queue, and stays the lowest until it is
/// deleted; the waiter queued right behind it (no node between them at its last look, and none
/// can be added below it) is therefore first once it is gone. So a waiter of this client whose
/// predecessor is one of these nodes takes its turn when the deletion event comes, without
/// listing the queue again: a hand-off between tasks of one client costs the release's request
/// alone. The delete went through the leader after the moment kept here, so it vouches for
/// the session as a sync sent then would (see [`crate::session::lease`]): the grant's lease is
/// counted from it.
pub(crate) type Released = distlock_api::backend::Recent<String, Instant, REMEMBER_RELEASED>;

/// What a queue node holds: who it belongs to and how many holds it stands for, so that any
/// client can `inspect` it; and, once its holder proclaimed one as an election's leader, the
/// value. A node without a value is written exactly as before elections (the field is left
/// out), and a reader that does not know the field (an older distlock) ignores it.
#[derive(Serialize, Deserialize)]
pub(crate) struct NodeData {
    pub(crate) owner: String,
    pub(crate) holds: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) value: Option<String>,
}

impl NodeData {
    pub(crate) fn bytes(owner: &OwnerId, holds: u32, value: Option<&str>) -> Vec<u8> {
        serde_json::to_vec(&NodeData {
            owner: owner.to_string(),
            holds,
            value: value.map(str::to_owned),
        })
        .unwrap_or_default()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single insert/remove/assignment, so a poisoned lock
    // still guards consistent state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    pub(crate) fn session(&self) -> Arc<Session> {
        self.session
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn dir(&self, name: &LockName) -> String {
        path::join(&self.base, &path::encode_name(name.as_str()))
    }

    /// Records a fresh grant, unless its session ended meanwhile (then the acquire fails and
    /// its queue node is cleaned up).
    pub(crate) fn register_hold(
        &self,
        s: &Session,
        req: &AcquireRequest,
        path: &str,
        czxid: i64,
    ) -> Result<()> {
        let mut holds = lock(&self.holds);
        if s.is_lost() || self.session().epoch != s.epoch {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "the ZooKeeper session ended while the lock was being acquired",
            )
            .with_backend("zk"));
        }
        holds.insert(
            (req.name.clone(), req.owner.clone()),
            Hold {
                path: path.to_string(),
                czxid,
                count: 1,
                epoch: s.epoch,
                value: None,
            },
        );
        Ok(())
    }

    pub(crate) fn forget_hold(&self, key: &HoldKey, path: &str) {
        let mut holds = lock(&self.holds);
        if holds.get(key).is_some_and(|h| h.path == path) {
            holds.remove(key);
        }
    }

    /// A reentrant acquire: adds a hold to a lock this owner holds through this client, after
    /// confirming (and recording in the node) that the hold is still real. `None` if the owner
    /// holds nothing here (or its hold turned out to be gone).
    pub(crate) async fn rejoin(
        &self,
        s: &Arc<Session>,
        req: &AcquireRequest,
    ) -> Result<Option<Grant>> {
        let key = (req.name.clone(), req.owner.clone());
        let (request, path, czxid, count, sent) = {
            let mut holds = lock(&self.holds);
            let Some(h) = holds.get_mut(&key) else {
                return Ok(None);
            };
            if h.epoch != s.epoch {
                holds.remove(&key);
                return Ok(None);
            }
            h.count += 1;
            let sent = Instant::now();
            // Sent now, under the lock, so concurrent count updates reach the server in the
            // order they were made here.
            let request = s.client.set_data(&h.path, &h.data(&req.owner), None);
            (request, h.path.clone(), h.czxid, h.count, sent)
        };
        let mut undo = UndoHold {
            inner: self,
            session: s,
            key: &key,
            path: &path,
            armed: true,
        };
        match s.call(request).await {
            Ok(stat) if stat.czxid == czxid && stat.ephemeral_owner == s.id => {
                undo.armed = false;
                Ok(Some(
                    Grant::new(
                        req.name.clone(),
                        req.owner.clone(),
                        FencingToken(czxid as u64),
                        count,
                        // The write went through the leader after `sent`.
                        s.lease(),
                        sent,
                    )
                    .with_key(path.clone()),
                ))
            }
            Ok(_) | Err(Some(zk::Error::NoNode)) => {
                // The hold is gone (removed behind our back): forget it and contend afresh.
                undo.armed = false;
                self.forget_hold(&key, &path);
                Ok(None)
            }
            Err(e) => Err(request_error(e, "cannot record the reentrant hold", s)),
        }
    }

    /// Writes `value` into `grant`'s queue node (an election's leader proclaiming), keeping the
    /// owner and hold count: one `setData` on the grant's own path, which the server applies
    /// only while that node exists, that is while the grant holds in a live session (the node
    /// is deleted by its release, a force-release, and the session's end). `Ok(false)` if the
    /// grant no longer holds: released here, its session ended, or its node gone.
    pub(crate) async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        let s = self.session();
        let key = (grant.name.clone(), grant.owner.clone());
        let request = {
            let mut holds = lock(&self.holds);
            let Some(h) = holds.get_mut(&key) else {
                return Ok(false);
            };
            if h.path != grant.key || h.czxid as u64 != grant.token.0 {
                return Ok(false);
            }
            if h.epoch != s.epoch || s.is_lost() {
                // Its session is over: so is the node (the monitor fires lost() on its guards).
                return Ok(false);
            }
            h.value = Some(value.to_owned());
            // Sent now, under the lock, so the node's writes (hold counts, values) reach the
            // server in the order they were made here. No version check: nobody else writes
            // to a lock's node, and the path is never reused, so existing is holding.
            s.client.set_data(&h.path, &h.data(&grant.owner), None)
        };
        match s.call(request).await {
            Ok(stat) => Ok(stat.czxid as u64 == grant.token.0 && stat.ephemeral_owner == s.id),
            Err(Some(zk::Error::NoNode)) => {
                // Deleted behind our back (a force-release): the renewal will say lost.
                self.forget_hold(&key, &grant.key);
                Ok(false)
            }
            Err(Some(zk::Error::SessionExpired)) => {
                let _ = self.session_over(grant, &s);
                Ok(false)
            }
            Err(e) => {
                Err(request_error(e, "cannot write the leader's value", &s).with_lock(&grant.name))
            }
        }
    }

    /// What renewing `grant` can decide without the server: its node's path, or why it no
    /// longer holds.
    pub(crate) fn renew_locally(&self, grant: &Grant, s: &Session) -> Result<String> {
        let Some((path, epoch)) = self.hold_of(grant) else {
            return Err(lost(
                &grant.name,
                "this client does not hold the lock for that grant",
            )
            .with_backend("zk"));
        };
        if epoch != s.epoch {
            // Its session was replaced, which fired lost() on its guards already.
            return Err(lost(
                &grant.name,
                "the ZooKeeper session that held the lock ended",
            )
            .with_backend("zk"));
        }
        if s.is_lost() {
            return Err(self.session_over(grant, s));
        }
        Ok(path)
    }

    /// The session behind `grant` is over, learnt by a renewal before the session monitor:
    /// ends it for every guard now, so they all report it as the session's end.
    pub(crate) fn session_over(&self, grant: &Grant, s: &Session) -> Error {
        let state = match s.client.state() {
            zk::SessionState::Closed => "closed",
            zk::SessionState::AuthFailed => "refused (authentication failed)",
            _ => "expired",
        };
        self.session_ended(s.epoch, &format!("ZooKeeper session {state}"));
        lost(
            &grant.name,
            "the ZooKeeper session that held the lock ended",
        )
        .with_backend("zk")
    }

    /// The renewal's answer for `grant`: its node's `stat`, `None` if the node is gone. The
    /// lease is the one a read behind a `sync` vouches for ([`Session::lease`]).
    pub(crate) fn confirmed(
        &self,
        grant: &Grant,
        s: &Session,
        stat: Option<&zk::Stat>,
    ) -> Result<Duration> {
        match stat {
            Some(stat) if stat.czxid as u64 == grant.token.0 && stat.ephemeral_owner == s.id => {
                Ok(s.lease())
            }
            _ => Err(lost(&grant.name, "the lock's queue node is gone").with_backend("zk")),
        }
    }

    /// The grant's hold, if this client has it: same owner, queue node and token.
    fn hold_of(&self, grant: &Grant) -> Option<(String, u64)> {
        let holds = lock(&self.holds);
        let h = holds.get(&(grant.name.clone(), grant.owner.clone()))?;
        (h.path == grant.key && h.czxid as u64 == grant.token.0).then(|| (h.path.clone(), h.epoch))
    }
}

impl Sessions for Inner {
    /// Makes `session` the one new requests use.
    fn install(&self, session: Session) {
        *self.session.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(session);
    }

    /// The session of `epoch` is over: every hold in it is gone, so their guards report lost.
    fn session_ended(&self, epoch: u64, reason: &str) {
        let keys: HashSet<String> = {
            let mut holds = lock(&self.holds);
            let s = self.session();
            if s.epoch == epoch {
                s.mark_lost();
            }
            let mut keys = HashSet::new();
            holds.retain(|_, h| {
                if h.epoch == epoch {
                    keys.insert(h.path.clone());
                    false
                } else {
                    true
                }
            });
            keys
        };
        self.core.mark_lost(
            |g| keys.contains(&g.key),
            LostReason::Session(reason.to_string()),
        );
    }
}

/// Gives a reentrant hold back if the acquire that added it is dropped or fails before the
/// server confirmed it.
struct UndoHold<'a> {
    inner: &'a Inner,
    session: &'a Session,
    key: &'a HoldKey,
    path: &'a str,
    armed: bool,
}

impl Drop for UndoHold<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut holds = lock(&self.inner.holds);
        if let Some(h) = holds.get_mut(self.key) {
            if h.path == self.path && h.count > 1 {
                h.count -= 1;
                // Sent at once; nobody waits for the answer.
                drop(
                    self.session
                        .client
                        .set_data(&h.path, &h.data(&self.key.1), None),
                );
            }
        }
    }
}
