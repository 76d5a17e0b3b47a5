//! The lock recipe: one ephemeral-sequential queue node per contender under the lock's
//! container node; the lowest sequence holds; every other contender watches only its
//! predecessor.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

use distlock_api::wait::{Attempt, Waiting};
use distlock_api::{
    async_trait, lost, wait, AcquireRequest, Blocking, Capabilities, ClientCore, DistributedLock,
    Error, ErrorKind, Fencing, FencingToken, Grant, LeaseKind, LockInfo, LockName, LostReason,
    OwnerId, Result, TtlSupport,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::path::{self, QueueNode};
use crate::session::{self, in_doubt, no_answer, zk_error, Session};

/// What the ZooKeeper backend promises. `ttl.min` is stock ZooKeeper's shortest session
/// timeout (2 × the default `tickTime` of 2 s); a server with another `tickTime` or
/// `minSessionTimeout` grants other values, and [`ZkLock::capabilities`] reports what this
/// client's session was granted.
pub const CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    blocking: Blocking::Notify,
    ttl: TtlSupport {
        kind: LeaseKind::Session,
        min: Duration::from_secs(4),
        granularity: Duration::from_millis(1),
    },
    fair: true,
    fencing: Fencing::Durable,
    renewal: true,
};

/// How often an acquire re-creates its queue node after it vanished (removed by an operator)
/// or retries a create whose answer was lost, before it gives up.
const MAX_CREATE_ATTEMPTS: u32 = 5;
/// How many locks the watchdog confirms with one multi-read.
const RENEW_BATCH: usize = 64;

/// A client of a ZooKeeper ensemble: one session, in which every lock it takes lives.
///
/// Cloning is not needed: share it in an `Arc` (the [`LockExt`](crate::LockExt) methods take
/// `Arc<ZkLock>`).
pub struct ZkLock {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    core: ClientCore,
    base: String,
    session: RwLock<Arc<Session>>,
    holds: Mutex<HashMap<HoldKey, Hold>>,
    /// Set once the ensemble refused a multi-read (servers before 3.6): renewals then confirm
    /// each lock with its own request.
    no_multi_read: AtomicBool,
    /// Dropping it stops the session monitor.
    _stop: oneshot::Sender<()>,
}

type HoldKey = (LockName, OwnerId);

/// A lock this client holds for one owner: its queue node and hold count.
struct Hold {
    path: String,
    czxid: i64,
    count: u32,
    epoch: u64,
}

/// What a queue node holds: who it belongs to and how many holds it stands for, so that any
/// client can `inspect` it.
#[derive(Serialize, Deserialize)]
struct NodeData {
    owner: String,
    holds: u32,
}

impl NodeData {
    fn bytes(owner: &OwnerId, holds: u32) -> Vec<u8> {
        serde_json::to_vec(&NodeData {
            owner: owner.to_string(),
            holds,
        })
        .unwrap_or_default()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single insert/remove/assignment, so a poisoned lock
    // still guards consistent state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ZkLock {
    /// Connects to the ensemble, creates the chroot and base path if missing, and starts the
    /// task that watches the session. An ensemble that cannot be reached within the connect
    /// timeout is [`ErrorKind::Unavailable`].
    pub async fn connect(config: ZkConfig) -> Result<Self> {
        config.validate()?;
        let session = session::open(&config, 0).await?;
        let mut core = ClientCore::new("zk");
        if let Some(owner) = &config.client.owner {
            core = core.with_owner(owner.clone());
        }
        // The watchdog renews every TTL/3 of the lease the session grants; asking for another
        // TTL changes nothing, so the default is the lease itself.
        let core = core.with_default_ttl(session.timeout)?;
        let (stop, stopped) = oneshot::channel();
        let states = session.client.state_watcher();
        let (timeout, epoch) = (session.timeout, session.epoch);
        let inner = Arc::new(Inner {
            core,
            base: config.base_path.clone(),
            session: RwLock::new(Arc::new(session)),
            holds: Mutex::new(HashMap::new()),
            no_multi_read: AtomicBool::new(false),
            _stop: stop,
        });
        tokio::spawn(session::monitor(
            Arc::downgrade(&inner),
            config,
            stopped,
            states,
            timeout,
            epoch,
        ));
        Ok(Self { inner })
    }

    /// The session timeout the server granted: the lease of every lock this client holds.
    pub fn session_timeout(&self) -> Duration {
        self.inner.session().timeout
    }

    /// The current session's id (it changes when a lost session is replaced).
    pub fn session_id(&self) -> zk::SessionId {
        zk::SessionId(self.inner.session().id)
    }

    /// The raw client of the current session, for whatever the lock API does not cover. Nodes
    /// under the base path belong to the lock recipe: do not create or delete them.
    pub fn client(&self) -> zk::Client {
        self.inner.session().client.clone()
    }

    /// The path (below the chroot) of `name`'s lock node, whose children are the queue.
    pub fn lock_path(&self, name: &str) -> Result<String> {
        let name = LockName::new(name).map_err(|e| e.with_backend("zk"))?;
        Ok(self.inner.dir(&name))
    }

    async fn contend(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let s = self.inner.session();
        s.check_live()?;
        if let Some(grant) = self.rejoin(&s, req).await? {
            return Ok(Some(grant));
        }
        let dir = self.inner.dir(&req.name);
        let prefix = path::new_queue_prefix();
        let data = NodeData::bytes(&req.owner, 1);
        let mut pending = Pending::new(s.clone(), dir.clone(), prefix.clone());
        let (mut mine, mut czxid) = self.create_node(&s, &dir, &data, &mut pending).await?;
        let mut ended = s.ended.subscribe();
        let mut recreated = 0;
        loop {
            s.check_live()?;
            let sent = Instant::now();
            let children = match s.call_again(|| s.client.list_children(&dir)).await {
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
                    pending.settle().await;
                    return Ok(None);
                }
                pending.known.clear();
                (mine, czxid) = self.create_node(&s, &dir, &data, &mut pending).await?;
                continue;
            };
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
            let position = queue.iter().position(|n| n.seq == me.seq).unwrap_or(0);
            if position == 0 {
                self.inner.register_hold(&s, req, &mine, czxid)?;
                pending.disarm(&mine);
                return Ok(Some(Grant {
                    name: req.name.clone(),
                    owner: req.owner.clone(),
                    token: FencingToken(czxid as u64),
                    hold_count: 1,
                    ttl: s.timeout,
                    sent_at: sent,
                    key: mine,
                }));
            }
            let Some(deadline) = deadline else {
                // try-acquire: not first, so leave the queue.
                pending.settle().await;
                return Ok(None);
            };
            if Instant::now() >= deadline {
                pending.settle().await;
                return Err(wait::timeout(
                    deadline.saturating_duration_since(pending.started),
                ));
            }
            // Watch only the node just ahead of ours: its deletion is our turn (or its owner
            // left the queue, and we re-check).
            let predecessor = path::join(&dir, &queue[position - 1].name);
            let watcher = match s
                .call_again(|| s.client.get_and_watch_data(&predecessor))
                .await
            {
                Ok((_, _, watcher)) => watcher,
                Err(Some(zk::Error::NoNode)) => continue,
                Err(e) => return Err(request_error(e, "cannot watch the predecessor", &s)),
            };
            let timed_out = tokio::select! {
                _ = watcher.changed() => false,
                _ = ended.wait_for(|&ended| ended) => false,
                _ = tokio::time::sleep_until(deadline.into()) => true,
            };
            if timed_out {
                pending.settle().await;
                return Err(wait::timeout(
                    deadline.saturating_duration_since(pending.started),
                ));
            }
        }
    }

    /// Creates our queue node, the lock node first if it is missing. A create whose answer is
    /// lost may still have happened: the unique prefix finds it (Curator's "protected" mode).
    async fn create_node(
        &self,
        s: &Arc<Session>,
        dir: &str,
        data: &[u8],
        pending: &mut Pending,
    ) -> Result<(String, i64)> {
        let prefix_path = path::join(dir, &pending.prefix);
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let mut attempts = 0;
        // Whether an earlier create of ours went unanswered (and so may exist unknown to us).
        let mut lost_answers = pending.in_doubt;
        loop {
            attempts += 1;
            s.check_live()?;
            // Until the answer arrives, a dropped acquire must sweep by prefix.
            pending.in_doubt = true;
            let outcome = s.call(s.client.create(&prefix_path, data, &mode)).await;
            match outcome {
                Ok((stat, sequence)) => {
                    pending.in_doubt = lost_answers;
                    let path = format!("{prefix_path}{sequence}");
                    pending.known.push(path.clone());
                    return Ok((path, stat.czxid));
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
                        return Ok((path, czxid));
                    }
                }
                Err(e) => return Err(request_error(e, "cannot create the queue node", s)),
            }
        }
    }

    /// Creates the lock's container node (and the base path, if it went missing).
    async fn make_lock_node(&self, s: &Session, dir: &str) -> Result<()> {
        let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        for _ in 0..2 {
            match s.call_again(|| s.client.create(dir, &[], &container)).await {
                Ok(_) | Err(Some(zk::Error::NodeExists)) => return Ok(()),
                Err(Some(zk::Error::NoNode)) => {
                    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                    s.call_again(|| s.client.mkdir(&self.inner.base, &persistent))
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

    /// A reentrant acquire: adds a hold to a lock this owner holds through this client, after
    /// confirming (and recording in the node) that the hold is still real. `None` if the owner
    /// holds nothing here (or its hold turned out to be gone).
    async fn rejoin(&self, s: &Arc<Session>, req: &AcquireRequest) -> Result<Option<Grant>> {
        let key = (req.name.clone(), req.owner.clone());
        let (request, path, czxid, count, sent) = {
            let mut holds = lock(&self.inner.holds);
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
            let request = s
                .client
                .set_data(&h.path, &NodeData::bytes(&req.owner, h.count), None);
            (request, h.path.clone(), h.czxid, h.count, sent)
        };
        let mut undo = UndoHold {
            inner: &self.inner,
            session: s,
            key: &key,
            path: &path,
            armed: true,
        };
        match s.call(request).await {
            Ok(stat) if stat.czxid == czxid && stat.ephemeral_owner == s.id => {
                undo.armed = false;
                Ok(Some(Grant {
                    name: req.name.clone(),
                    owner: req.owner.clone(),
                    token: FencingToken(czxid as u64),
                    hold_count: count,
                    ttl: s.timeout,
                    sent_at: sent,
                    key: path.clone(),
                }))
            }
            Ok(_) | Err(Some(zk::Error::NoNode)) => {
                // The hold is gone (removed behind our back): forget it and contend afresh.
                undo.armed = false;
                self.inner.forget_hold(&key, &path);
                Ok(None)
            }
            Err(e) => Err(request_error(e, "cannot record the reentrant hold", s)),
        }
    }

    /// What renewing `grant` can decide without the server: its node's path, or why it no
    /// longer holds.
    fn renew_locally(&self, grant: &Grant, s: &Session) -> Result<String> {
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
    fn session_over(&self, grant: &Grant, s: &Session) -> Error {
        let state = match s.client.state() {
            zk::SessionState::Closed => "closed",
            zk::SessionState::AuthFailed => "refused (authentication failed)",
            _ => "expired",
        };
        self.inner
            .session_ended(s.epoch, &format!("ZooKeeper session {state}"));
        lost(
            &grant.name,
            "the ZooKeeper session that held the lock ended",
        )
        .with_backend("zk")
    }

    /// The renewal's answer for `grant`: its node's `stat`, `None` if the node is gone.
    fn confirmed(&self, grant: &Grant, s: &Session, stat: Option<&zk::Stat>) -> Result<Duration> {
        match stat {
            Some(stat) if stat.czxid as u64 == grant.token.0 && stat.ephemeral_owner == s.id => {
                Ok(s.timeout)
            }
            _ => Err(lost(&grant.name, "the lock's queue node is gone").with_backend("zk")),
        }
    }

    /// The grant's hold, if this client has it: same owner, queue node and token.
    fn hold_of(&self, grant: &Grant) -> Option<(String, u64)> {
        let holds = lock(&self.inner.holds);
        let h = holds.get(&(grant.name.clone(), grant.owner.clone()))?;
        (h.path == grant.key && h.czxid as u64 == grant.token.0).then(|| (h.path.clone(), h.epoch))
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
                drop(self.session.client.set_data(
                    &h.path,
                    &NodeData::bytes(&self.key.1, h.count),
                    None,
                ));
            }
        }
    }
}

impl Inner {
    pub(crate) fn session(&self) -> Arc<Session> {
        self.session
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes `session` the one new requests use.
    pub(crate) fn install(&self, session: Session) {
        *self.session.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(session);
    }

    /// The session of `epoch` is over: every hold in it is gone, so their guards report lost.
    pub(crate) fn session_ended(&self, epoch: u64, reason: &str) {
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

    fn dir(&self, name: &LockName) -> String {
        path::join(&self.base, &path::encode_name(name.as_str()))
    }

    /// Records a fresh grant, unless its session ended meanwhile (then the acquire fails and
    /// its queue node is cleaned up).
    fn register_hold(
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
            },
        );
        Ok(())
    }

    fn forget_hold(&self, key: &HoldKey, path: &str) {
        let mut holds = lock(&self.holds);
        if holds.get(key).is_some_and(|h| h.path == path) {
            holds.remove(key);
        }
    }
}

/// Our queue node(s) while an acquire is under way. Unless disarmed (the lock was granted),
/// dropping it deletes them in the background; a create whose answer never came is swept by
/// its unique prefix. So a cancelled, failed or timed-out acquire leaves nothing behind.
struct Pending {
    session: Arc<Session>,
    dir: String,
    prefix: String,
    known: Vec<String>,
    /// A create was sent whose outcome we may not have seen.
    in_doubt: bool,
    armed: bool,
    started: Instant,
}

impl Pending {
    fn new(session: Arc<Session>, dir: String, prefix: String) -> Self {
        Self {
            session,
            dir,
            prefix,
            known: Vec::new(),
            in_doubt: false,
            armed: true,
            started: Instant::now(),
        }
    }

    /// The grant is ours: keep `granted`, delete any other node of ours.
    fn disarm(&mut self, granted: &str) {
        self.armed = false;
        for path in self.known.drain(..).filter(|p| p != granted) {
            spawn_delete(self.session.clone(), path);
        }
    }

    /// Leaves the queue now, before the acquire returns (so a `None` or a timeout means none
    /// of our nodes is left). Failures fall back to the background cleanup of `Drop`.
    async fn settle(&mut self) {
        let mut clean = true;
        for path in &self.known {
            clean &= !matches!(
                delete_until_gone(&self.session, path).await,
                Deleted::Failed(_)
            );
        }
        if self.in_doubt {
            clean &= sweep(&self.session, &self.dir, &self.prefix).await;
        }
        if clean {
            self.armed = false;
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let known = std::mem::take(&mut self.known);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let (s, dir, prefix, in_doubt) = (
                    Arc::downgrade(&self.session),
                    std::mem::take(&mut self.dir),
                    std::mem::take(&mut self.prefix),
                    self.in_doubt,
                );
                // A waiter's node left behind would later be granted the lock with nobody to
                // hold it: the cleanup keeps at it until the nodes are gone or the session is.
                handle.spawn(async move {
                    for path in known {
                        delete_for_good(s.clone(), path, None).await;
                    }
                    if in_doubt {
                        sweep_for_good(s, dir, prefix).await;
                    }
                });
            }
            Err(_) => {
                // No runtime to wait on: send the deletes anyway (requests go out when made);
                // anything they miss ends with the session.
                for path in &known {
                    drop(self.session.client.delete(path, None));
                }
            }
        }
    }
}

/// What became of a node we deleted.
enum Deleted {
    /// Our delete removed it.
    Yes,
    /// It was not there (already deleted, or removed behind our back).
    Absent,
    /// The session is over, so the ephemeral node is (or will be) gone with it.
    SessionEnded,
    /// A server error we cannot retry our way out of.
    Failed(Error),
}

/// The first pause of a background cleanup after a round of deletes failed; it doubles up to
/// [`CLEANUP_BACKOFF_CAP`], so a server that refuses (throttling, an ACL) is not hammered.
const CLEANUP_BACKOFF: Duration = Duration::from_millis(100);
const CLEANUP_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// Deletes `path`, retrying while answers get lost, until it is gone or the session is over.
/// A queue node left behind in a live session would block its lock, so this does not give up
/// early; the session monitor bounds it (a session disconnected for longer than its timeout is
/// given up on). What it does give up on, a refusal or answers lost for too long, callers hand
/// to [`delete_for_good`].
async fn delete_until_gone(s: &Session, path: &str) -> Deleted {
    let give_up = Instant::now() + (s.op_timeout * 3).max(Duration::from_secs(10));
    let mut answer_lost = false;
    loop {
        if s.is_lost() {
            return Deleted::SessionEnded;
        }
        match s.call(s.client.delete(path, None)).await {
            Ok(()) => return Deleted::Yes,
            // After a lost answer, absence most likely means our earlier attempt worked.
            Err(Some(zk::Error::NoNode)) if answer_lost => return Deleted::Yes,
            Err(Some(zk::Error::NoNode)) => return Deleted::Absent,
            Err(Some(zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                return Deleted::SessionEnded
            }
            Err(e) if in_doubt(&e) => {
                if Instant::now() >= give_up {
                    return Deleted::Failed(request_error(e, DELETE_FAILED, s));
                }
                answer_lost = true;
                tokio::time::sleep(session::RETRY_PAUSE).await;
            }
            Err(e) => return Deleted::Failed(request_error(e, DELETE_FAILED, s)),
        }
    }
}

const DELETE_FAILED: &str = "cannot delete the queue node (the delete is retried in the \
                             background until it takes or the session ends)";

/// Deletes our node at `path` until the delete takes, the node is gone or its session is over,
/// pausing (with backoff) between rounds of [`delete_until_gone`] that fail: a node of ours
/// left in a live session holds the lock (or a place in its queue) with no guard and no
/// `lost()`, for as long as the session lives. `first` hears the first round's outcome.
///
/// Between rounds it keeps only a weak reference to the session: once the client handle is
/// dropped (or the session replaced), nothing else keeps the session, which closes or expires
/// and takes the node with it; this task must not keep it open.
async fn delete_for_good(
    s: Weak<Session>,
    path: String,
    mut first: Option<oneshot::Sender<Deleted>>,
) {
    let mut backoff = CLEANUP_BACKOFF;
    loop {
        let outcome = match s.upgrade() {
            Some(session) => delete_until_gone(&session, &path).await,
            None => Deleted::SessionEnded,
        };
        match outcome {
            Deleted::Failed(e) => {
                tracing::warn!(
                    path,
                    error = %e,
                    retry_in = ?backoff,
                    "cannot delete a queue node of ours; retrying in the background"
                );
                if let Some(tx) = first.take() {
                    let _ = tx.send(Deleted::Failed(e));
                }
            }
            done => {
                if let Some(tx) = first.take() {
                    let _ = tx.send(done);
                }
                return;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(CLEANUP_BACKOFF_CAP);
    }
}

/// Deletes our node at `path` in a task of its own that keeps at it ([`delete_for_good`]), and
/// returns the outcome of its first round. Dropping the caller (a release future given up on)
/// leaves the task running, so the delete cannot be forgotten half-way.
async fn delete_reported(s: &Arc<Session>, path: &str) -> Deleted {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(delete_for_good(
        Arc::downgrade(s),
        path.to_string(),
        Some(tx),
    ));
    rx.await.unwrap_or_else(|_| {
        Deleted::Failed(
            Error::new(
                ErrorKind::Unavailable,
                "the task deleting the queue node ended without an answer (runtime shutting down)",
            )
            .with_backend("zk"),
        )
    })
}

/// [`sweep`] until it leaves none of our nodes with `prefix`, pausing with backoff between
/// rounds, for as long as the session lives (held weakly, as in [`delete_for_good`]).
async fn sweep_for_good(s: Weak<Session>, dir: String, prefix: String) {
    let mut backoff = CLEANUP_BACKOFF;
    loop {
        let Some(session) = s.upgrade() else {
            return;
        };
        if sweep(&session, &dir, &prefix).await {
            return;
        }
        drop(session);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(CLEANUP_BACKOFF_CAP);
    }
}

/// Deletes every node under `dir` with our unique `prefix`. `true` if none is left.
async fn sweep(s: &Session, dir: &str, prefix: &str) -> bool {
    let children = match s.call_again(|| s.client.list_children(dir)).await {
        Ok(children) => children,
        Err(Some(zk::Error::NoNode)) => return true,
        Err(_) => return s.is_lost(),
    };
    let mut clean = true;
    for child in children.iter().filter(|c| c.starts_with(prefix)) {
        clean &= !matches!(
            delete_until_gone(s, &path::join(dir, child)).await,
            Deleted::Failed(_)
        );
    }
    clean
}

fn spawn_delete(s: Arc<Session>, path: String) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(delete_for_good(Arc::downgrade(&s), path, None));
        }
        Err(_) => drop(s.client.delete(&path, None)),
    }
}

/// Maps a failed request: a lost answer is `Unavailable`, and so is any error once the
/// session is over (whatever the client reports then).
fn request_error(e: Option<zk::Error>, what: &str, s: &Session) -> Error {
    match e {
        None => no_answer(what, s.op_timeout),
        Some(e) if s.is_lost() => {
            zk_error(e, &format!("{what}: the session ended")).temporary(true)
        }
        Some(e) => zk_error(e, what),
    }
}

#[async_trait]
impl DistributedLock for ZkLock {
    /// [`CAPABILITIES`], with `ttl.min` the session timeout this client was granted: every
    /// lock's lease, whatever TTL is asked for.
    fn capabilities(&self) -> Capabilities {
        let mut caps = CAPABILITIES;
        caps.ttl.min = self.session_timeout();
        caps
    }

    fn core(&self) -> &ClientCore {
        &self.inner.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        match self.contend(req, None).await {
            Ok(Some(grant)) => Ok(Attempt::Granted(grant)),
            // A session lock has no lease to wait out.
            Ok(None) => Ok(Attempt::Held { expires_in: None }),
            Err(e) => Err(e.with_lock(&req.name)),
        }
    }

    /// Waiters queue as sequential nodes, each watching its predecessor.
    fn waiting(&self) -> Waiting {
        Waiting::Queue
    }

    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        let deadline = Instant::now() + wait;
        match self.contend(req, Some(deadline)).await {
            Ok(Some(grant)) => Ok(grant),
            Ok(None) => Err(Error::new(
                ErrorKind::Unavailable,
                "the queue node kept disappearing while waiting",
            )
            .with_backend("zk")
            .with_lock(&req.name)),
            Err(e) => Err(e.with_lock(&req.name)),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        let s = self.inner.session();
        let key = (grant.name.clone(), grant.owner.clone());
        enum Step {
            Decrement(u32),
            Delete,
        }
        let step = {
            let mut holds = lock(&self.inner.holds);
            match holds.get_mut(&key) {
                Some(h) if h.path == grant.key && h.czxid as u64 == grant.token.0 => {
                    if h.epoch != s.epoch {
                        holds.remove(&key);
                        return Ok(false);
                    }
                    if h.count > 1 {
                        h.count -= 1;
                        Step::Decrement(h.count)
                    } else {
                        holds.remove(&key);
                        Step::Delete
                    }
                }
                _ => return Ok(false),
            }
        };
        match step {
            Step::Decrement(count) => {
                let request =
                    s.client
                        .set_data(&grant.key, &NodeData::bytes(&grant.owner, count), None);
                match s.call(request).await {
                    Ok(stat) => Ok(stat.czxid as u64 == grant.token.0),
                    Err(Some(zk::Error::NoNode)) => {
                        self.inner.forget_hold(&key, &grant.key);
                        Ok(false)
                    }
                    Err(e) => {
                        Err(request_error(e, "cannot record the release", &s)
                            .with_lock(&grant.name))
                    }
                }
            }
            // The hold record is gone already, so nothing else would ever delete the node: a
            // delete that fails goes on in the background (and the caller hears of the failure).
            Step::Delete => match delete_reported(&s, &grant.key).await {
                Deleted::Yes => Ok(true),
                Deleted::Absent | Deleted::SessionEnded => Ok(false),
                Deleted::Failed(e) => Err(e.with_lock(&grant.name)),
            },
        }
    }

    async fn renew(&self, grant: &Grant, _ttl: Duration) -> Result<Duration> {
        let s = self.inner.session();
        let path = self.renew_locally(grant, &s)?;
        match s.call(s.client.check_stat(&path)).await {
            Ok(stat) => self.confirmed(grant, &s, stat.as_ref()),
            Err(Some(zk::Error::SessionExpired)) => Err(self.session_over(grant, &s)),
            Err(e) => Err(request_error(e, "cannot confirm the lock", &s).with_lock(&grant.name)),
        }
    }

    fn renew_batch(&self) -> usize {
        if self.inner.no_multi_read.load(Ordering::Relaxed) {
            1
        } else {
            RENEW_BATCH
        }
    }

    /// Confirms every grant's node with one multi-read (ZooKeeper 3.6+); on an ensemble that
    /// does not know multi-read, one request per grant from then on.
    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        let s = self.inner.session();
        let mut results: Vec<Option<Result<Duration>>> = Vec::with_capacity(grants.len());
        let mut asked = Vec::new();
        let mut reader = s.client.new_multi_reader();
        for (i, (grant, _)) in grants.iter().enumerate() {
            let local = self.renew_locally(grant, &s).and_then(|path| {
                reader
                    .add_get_data(&path)
                    .map_err(|e| zk_error(e, "cannot confirm the lock").with_lock(&grant.name))
            });
            results.push(match local {
                Ok(()) => {
                    asked.push(i);
                    None
                }
                Err(e) => Some(Err(e)),
            });
        }
        if !asked.is_empty() {
            match s.call(reader.commit()).await {
                Ok(answers) => {
                    for (n, &i) in asked.iter().enumerate() {
                        let grant = &grants[i].0;
                        results[i] = Some(match answers.get(n) {
                            Some(zk::MultiReadResult::Data { stat, .. }) => {
                                self.confirmed(grant, &s, Some(stat))
                            }
                            Some(zk::MultiReadResult::Error {
                                err: zk::Error::NoNode,
                            }) => self.confirmed(grant, &s, None),
                            Some(zk::MultiReadResult::Error {
                                err: zk::Error::SessionExpired,
                            }) => Err(self.session_over(grant, &s)),
                            Some(zk::MultiReadResult::Error { err }) => {
                                Err(
                                    request_error(Some(err.clone()), "cannot confirm the lock", &s)
                                        .with_lock(&grant.name),
                                )
                            }
                            _ => Err(Error::new(
                                ErrorKind::Backend,
                                "the multi-read's answer does not match its request",
                            )
                            .with_lock(&grant.name)),
                        });
                    }
                }
                Err(Some(zk::Error::Unimplemented)) => {
                    self.inner.no_multi_read.store(true, Ordering::Relaxed);
                    for &i in &asked {
                        let (grant, ttl) = &grants[i];
                        results[i] = Some(self.renew(grant, *ttl).await);
                    }
                }
                Err(Some(zk::Error::SessionExpired)) => {
                    for &i in &asked {
                        results[i] = Some(Err(self.session_over(&grants[i].0, &s)));
                    }
                }
                Err(e) => {
                    for &i in &asked {
                        results[i] =
                            Some(Err(request_error(e.clone(), "cannot confirm the lock", &s)
                                .with_lock(&grants[i].0.name)));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Backend, "no renewal result"))))
            .collect()
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let s = self.inner.session();
        s.check_live()
            .map_err(|e| e.with_backend("zk").with_lock(name))?;
        let dir = self.inner.dir(name);
        let context = |e: Option<zk::Error>, what: &str| request_error(e, what, &s).with_lock(name);
        for _ in 0..MAX_CREATE_ATTEMPTS {
            let children = match s.call_again(|| s.client.list_children(&dir)).await {
                Ok(children) => children,
                Err(Some(zk::Error::NoNode)) => return Ok(None),
                Err(e) => return Err(context(e, "cannot list the lock's queue")),
            };
            let Some(first) = path::queue(children).into_iter().next() else {
                return Ok(None);
            };
            let holder = path::join(&dir, &first.name);
            let (data, stat) = match s.call_again(|| s.client.get_data(&holder)).await {
                Ok(found) => found,
                // Released between the two reads: look again.
                Err(Some(zk::Error::NoNode)) => continue,
                Err(e) => return Err(context(e, "cannot read the holder's node")),
            };
            let parsed: NodeData = serde_json::from_slice(&data).map_err(|e| {
                Error::new(
                    ErrorKind::Backend,
                    "the holder's node holds no distlock owner record",
                )
                .with_source(e)
                .with_backend("zk")
                .with_lock(name)
            })?;
            let owner = OwnerId::parse(&parsed.owner).map_err(|e| {
                Error::new(
                    ErrorKind::Backend,
                    "the holder's node names a malformed owner",
                )
                .with_source(e)
                .with_backend("zk")
                .with_lock(name)
            })?;
            return Ok(Some(LockInfo {
                owner,
                hold_count: parsed.holds,
                token: FencingToken(stat.czxid as u64),
                remaining: None,
            }));
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "the lock changed hands too often to be inspected",
        )
        .with_backend("zk")
        .with_lock(name))
    }
}

impl std::fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.inner.session();
        f.debug_struct("ZkLock")
            .field("session", &zk::SessionId(s.id))
            .field("session_timeout", &s.timeout)
            .field("base", &self.inner.base)
            .field("owner", self.inner.core.owner())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_carry_the_capability_checklist() {
        assert!(include_str!("../docs.md").contains(&CAPABILITIES.checklist()));
    }

    #[test]
    fn node_data_round_trips() {
        let owner = OwnerId::new("worker-1").unwrap();
        let parsed: NodeData = serde_json::from_slice(&NodeData::bytes(&owner, 3)).unwrap();
        assert_eq!((parsed.owner.as_str(), parsed.holds), ("worker-1", 3));
    }
}
