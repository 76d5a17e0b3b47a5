//! The ZooKeeper client handle: connecting, and the lock API over the queue ([`crate::queue`])
//! and the client-side holds ([`crate::holds`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, Waiting};
use distlock_api::backend::{async_trait, AcquireRequest, ClientCore};
use distlock_api::Profile;
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, ErrorKind, Fencing, FencingToken, Grant,
    LeaseKind, LockInfo, LockName, OwnerId, Result, TtlSupport,
};
use tokio::sync::oneshot;
use zookeeper_client as zk;

use crate::cleanup::{delete_reported, Deleted};
use crate::config::ZkConfig;
use crate::error::zk_error;
use crate::holds::{lock, Inner, NodeData};
use crate::path;
use crate::permits;
use crate::queue::MAX_CREATE_ATTEMPTS;
use crate::session::{self, request_error};

/// What the ZooKeeper backend promises. `ttl.min` is stock ZooKeeper's shortest session
/// timeout (2 × the default `tickTime` of 2 s); a server with another `tickTime` or
/// `minSessionTimeout` grants other values, and [`ZkLock::capabilities`] reports what this
/// client's session was granted.
pub const CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Notify)
    .ttl(TtlSupport::new(
        LeaseKind::Session,
        Duration::from_secs(4),
        Duration::from_millis(1),
    ))
    .fair(true)
    .fencing(Fencing::Durable)
    .renewal(true)
    .semaphore(true)
    .election(true);

/// How many locks the watchdog confirms with one multi-read.
const RENEW_BATCH: usize = 64;

/// A client of a ZooKeeper ensemble: one session, in which every lock it takes lives.
///
/// Cloning is not needed: share it in an `Arc` (the [`LockExt`](crate::LockExt) methods take
/// `Arc<ZkLock>`).
pub struct ZkLock {
    inner: Arc<Inner>,
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
        // Asking for another TTL changes nothing (the lease is the session's), so the default
        // is the session timeout; the watchdog renews every third of the lease each grant and
        // renewal reports (`session::lease`).
        let core = core.with_default_ttl(session.timeout)?;
        let (stop, stopped) = oneshot::channel();
        let states = session.client.state_watcher();
        let (timeout, epoch) = (session.timeout, session.epoch);
        let inner = Arc::new(Inner {
            core,
            base: config.base_path.clone(),
            acl: config.get_node_acl(),
            session: RwLock::new(Arc::new(session)),
            holds: Mutex::new(HashMap::new()),
            released: Mutex::default(),
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

    /// The session timeout the server granted: every lock this client holds lives as long as
    /// the session. A guard trusts half of it from each confirmation (its
    /// [`ttl`](crate::LockGuard::ttl)): see the crate's safety model.
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

    /// The base path (below the chroot) the lock nodes live under, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) fn base_path(&self) -> &str {
        &self.inner.base
    }

    /// The path (below the chroot) of `name`'s lock node, whose children are the queue.
    pub fn lock_path(&self, name: &str) -> Result<String> {
        let name = LockName::new(name).map_err(|e| e.with_backend("zk"))?;
        Ok(self.inner.dir(&name))
    }
}

#[async_trait]
impl DistributedLock for ZkLock {
    fn profile(&self) -> Profile {
        let mut capabilities = CAPABILITIES;
        capabilities.ttl.min = self.session_timeout();
        // Waiters queue as sequential nodes, each watching its predecessor. Renewals confirm
        // many grants in one multi-read, unless the server refused one.
        let batch = match self.inner.no_multi_read.load(Ordering::Relaxed) {
            true => 1,
            false => RENEW_BATCH,
        };
        Profile::new(capabilities)
            .waiting(Waiting::Queue)
            .renew_batch(batch)
    }

    async fn give_back(
        &self,
        surplus: &distlock_api::backend::Surplus,
    ) -> distlock_api::Result<bool> {
        distlock_api::backend::give_back_by_release(self, surplus).await
    }

    fn core(&self) -> &ClientCore {
        &self.inner.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        match self.inner.contend(req, None).await {
            Ok(Some(grant)) => Ok(Attempt::Granted(grant)),
            // A session lock has no lease to wait out.
            Ok(None) => Ok(Attempt::Held { expires_in: None }),
            Err(e) => Err(e.with_lock(&req.name)),
        }
    }

    async fn acquire(&self, req: &AcquireRequest, wait: Duration) -> Result<Grant> {
        let deadline = Instant::now() + wait;
        match self.inner.contend(req, Some(deadline)).await {
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
        enum Step<F> {
            Decrement(F),
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
                        // Sent now, under the lock, so that the node's writes (counts, a
                        // proclaimed value) reach the server in the order they were made here.
                        Step::Decrement(s.client.set_data(&h.path, &h.data(&grant.owner), None))
                    } else {
                        holds.remove(&key);
                        Step::Delete
                    }
                }
                _ => return Ok(false),
            }
        };
        match step {
            Step::Decrement(request) => match s.call(request).await {
                Ok(stat) => Ok(stat.czxid as u64 == grant.token.0),
                Err(Some(zk::Error::NoNode)) => {
                    self.inner.forget_hold(&key, &grant.key);
                    Ok(false)
                }
                Err(e) => {
                    Err(request_error(e, "cannot record the release", &s).with_lock(&grant.name))
                }
            },
            // The hold record is gone already, so nothing else would ever delete the node: a
            // delete that fails goes on in the background (and the caller hears of the failure).
            Step::Delete => {
                // A lock's waiter right behind this node takes its turn at the deletion event
                // (see `Released`); a permit's waiters look at the queue again.
                if grant.permits <= 1 {
                    lock(&self.inner.released).insert(grant.key.clone(), Instant::now());
                }
                match delete_reported(&s, &grant.key).await {
                    Deleted::Yes => Ok(true),
                    Deleted::Absent | Deleted::SessionEnded => Ok(false),
                    Deleted::Failed(e) => Err(e.with_lock(&grant.name)),
                }
            }
        }
    }

    /// Confirms the grant's node with a read behind a `sync`: the server that answers may be a
    /// follower cut off from the leader, whose answer alone would vouch for nothing (see
    /// the crate's safety model). A failed sync fails the renewal as the read's failure would.
    async fn renew(&self, grant: &Grant, _ttl: Duration) -> Result<Duration> {
        let s = self.inner.session();
        let path = self.inner.renew_locally(grant, &s)?;
        match s.call(s.behind_sync(|c| c.check_stat(&path))).await {
            Ok(stat) => self.inner.confirmed(grant, &s, stat.as_ref()),
            Err(Some(zk::Error::SessionExpired)) => Err(self.inner.session_over(grant, &s)),
            Err(e) => Err(request_error(e, "cannot confirm the lock", &s).with_lock(&grant.name)),
        }
    }

    /// Confirms every grant's node with one multi-read (ZooKeeper 3.6+) behind one `sync`, as
    /// [`renew`](Self::renew) does; on an ensemble that does not know multi-read, one renewal
    /// per grant from then on.
    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        let s = self.inner.session();
        let mut results: Vec<Option<Result<Duration>>> = Vec::with_capacity(grants.len());
        let mut asked = Vec::new();
        let mut reader = s.client.new_multi_reader();
        for (i, (grant, _)) in grants.iter().enumerate() {
            let local = self.inner.renew_locally(grant, &s).and_then(|path| {
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
            match s.call(s.behind_sync(|_| reader.commit())).await {
                Ok(answers) => {
                    for (n, &i) in asked.iter().enumerate() {
                        let grant = &grants[i].0;
                        results[i] = Some(match answers.get(n) {
                            Some(zk::MultiReadResult::Data { stat, .. }) => {
                                self.inner.confirmed(grant, &s, Some(stat))
                            }
                            Some(zk::MultiReadResult::Error {
                                err: zk::Error::NoNode,
                            }) => self.inner.confirmed(grant, &s, None),
                            Some(zk::MultiReadResult::Error {
                                err: zk::Error::SessionExpired,
                            }) => Err(self.inner.session_over(grant, &s)),
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
                        results[i] = Some(Err(self.inner.session_over(&grants[i].0, &s)));
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

    /// Writes the value into the grant's own queue node (`Inner::proclaim`): the node
    /// exists only while the grant holds, and is the grant's alone, so a value is never seen
    /// under another grant's token.
    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        self.inner.proclaim(grant, value).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        Ok(self.holder(name).await?.map(|(_, info)| info))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let s = self.inner.session();
        s.check_live().map_err(|e| e.with_backend("zk"))?;
        let base = &self.inner.base;
        let children = match s.call_again(|| s.client.list_children(base)).await {
            Ok(children) => children,
            Err(Some(zk::Error::NoNode)) => return Ok(Vec::new()),
            Err(e) => return Err(request_error(e, "cannot list the locks", &s)),
        };
        let mut names: Vec<LockName> = children
            .iter()
            .filter_map(|segment| path::decode_name(segment))
            .filter(|name| name.starts_with(prefix))
            .filter_map(|name| LockName::new(name).ok())
            .collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut held = Vec::new();
        for name in names {
            if let Some((_, info)) = self.holder(&name).await? {
                held.push((name, info));
            }
        }
        Ok(held)
    }

    async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        let Some((holders, info)) = self.holder(name).await? else {
            return Ok(false);
        };
        let s = self.inner.session();
        let node = if info.token == token {
            holders[0].clone()
        } else {
            // A semaphore's other permits: the holder whose node's czxid is the token. Later
            // nodes were created later, so their czxids are larger: stop past the token.
            let mut found = None;
            for node in &holders[1..] {
                match s.call_again(|| s.client.check_stat(node)).await {
                    Ok(Some(stat)) if stat.czxid as u64 == token.0 => {
                        found = Some(node.clone());
                        break;
                    }
                    Ok(Some(stat)) if stat.czxid as u64 > token.0 => break,
                    Ok(_) => {}
                    Err(e) => {
                        return Err(
                            request_error(e, "cannot read a permit's node", &s).with_lock(name)
                        )
                    }
                }
            }
            let Some(node) = found else {
                return Ok(false);
            };
            node
        };
        // Sequential node paths are never reused, so deleting the path read is deleting that
        // grant's node and nobody else's; its holder's session check then finds it gone, and
        // the watch of the waiter it wakes fires.
        match s.call(s.client.delete(&node, None)).await {
            Ok(()) => Ok(true),
            Err(Some(zk::Error::NoNode)) => Ok(false),
            Err(e) => Err(request_error(e, "cannot delete the holder's node", &s).with_lock(name)),
        }
    }
}

impl ZkLock {
    /// The paths of the nodes that hold, the lowest first, and what the lowest says: its owner
    /// and holds, its creation zxid as the token and its creation time (the server's clock) as
    /// `since`; for a semaphore, how many permits are held of how many.
    async fn holder(&self, name: &LockName) -> Result<Option<(Vec<String>, LockInfo)>> {
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
            let queue = path::queue(children);
            let Some((held, max)) = permits::held(&queue) else {
                return Ok(None);
            };
            let holders: Vec<String> = queue[..held as usize]
                .iter()
                .map(|n| path::join(&dir, &n.name))
                .collect();
            let holder = &holders[0];
            let (data, stat) = match s.call_again(|| s.client.get_data(holder)).await {
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
            let mut info =
                LockInfo::new(owner, parsed.holds, FencingToken(stat.czxid as u64), None)
                    .with_since_unix_ms(stat.ctime)
                    .with_permits(held, max);
            // Read from the holder's own node, whose czxid is the token: always this grant's.
            if let Some(value) = parsed.value {
                info = info.with_value(value);
            }
            return Ok(Some((holders, info)));
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
        let parsed: NodeData = serde_json::from_slice(&NodeData::bytes(&owner, 3, None)).unwrap();
        assert_eq!((parsed.owner.as_str(), parsed.holds), ("worker-1", 3));
        assert_eq!(parsed.value, None);
        // A node without a value is written as before elections, byte for byte.
        assert_eq!(
            NodeData::bytes(&owner, 3, None),
            br#"{"owner":"worker-1","holds":3}"#
        );
        let with = NodeData::bytes(&owner, 1, Some("10.0.0.7:9090 \"x\""));
        let parsed: NodeData = serde_json::from_slice(&with).unwrap();
        assert_eq!(parsed.value.as_deref(), Some("10.0.0.7:9090 \"x\""));
        // What a reader without the value field (an older distlock) makes of it.
        #[derive(serde::Deserialize)]
        struct Older {
            owner: String,
            holds: u32,
        }
        let older: Older = serde_json::from_slice(&with).unwrap();
        assert_eq!((older.owner.as_str(), older.holds), ("worker-1", 1));
    }
}
