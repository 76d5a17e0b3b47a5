//! Deleting our queue nodes: now, in the background until it takes, and when an acquire stops
//! half-way (the [`QueueNodes`] it leaves, armed with lock-api's [`Armed`]).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Armed, Cleanup};
use distlock_api::{Error, ErrorKind};
use tokio::sync::oneshot;
use zookeeper_client as zk;

use crate::error::in_doubt;
use crate::path;
use crate::session::{self, request_error, Session};

/// Our queue node(s) while an acquire is under way, armed ([`Armed`]) until the lock is
/// granted: dropped before that, they are deleted in the background, and a create whose answer
/// never came is swept by its unique prefix. So a cancelled, failed or timed-out acquire
/// leaves nothing behind.
pub(crate) struct QueueNodes {
    session: Arc<Session>,
    pub(crate) dir: String,
    pub(crate) prefix: String,
    pub(crate) known: Vec<String>,
    /// A create was sent whose outcome we may not have seen.
    pub(crate) in_doubt: bool,
    pub(crate) started: Instant,
}

impl QueueNodes {
    /// Nothing created yet, armed.
    pub(crate) fn armed(session: Arc<Session>, dir: String, prefix: String) -> Armed<Self> {
        Armed::new(Self {
            session,
            dir,
            prefix,
            known: Vec::new(),
            in_doubt: false,
            started: Instant::now(),
        })
    }

    /// The lock was granted to `granted`: keep it, delete any other node of ours.
    pub(crate) fn keep_only(self, granted: &str) {
        for path in self.known.into_iter().filter(|p| p != granted) {
            spawn_delete(self.session.clone(), path);
        }
    }
}

impl Cleanup for QueueNodes {
    /// A waiter's node left behind would later be granted the lock with nobody to hold it: the
    /// cleanup keeps at it until the nodes are gone or the session is (held weakly, so the
    /// cleanup does not keep a dropped client's session open).
    fn run(self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let s = Arc::downgrade(&self.session);
        async move {
            for path in self.known {
                delete_for_good(s.clone(), path, None).await;
            }
            if self.in_doubt {
                sweep_for_good(s, self.dir, self.prefix).await;
            }
        }
    }

    /// No runtime to wait on: send the deletes anyway (requests go out when made); anything
    /// they miss ends with the session.
    fn without_runtime(self) {
        for path in &self.known {
            drop(self.session.client.delete(path, None));
        }
    }
}

/// Leaves the queue now, before the acquire returns (so a `None` or a timeout means none of
/// our nodes is left). What fails is left to the background cleanup of the dropped [`Armed`].
pub(crate) async fn settle(mut nodes: Armed<QueueNodes>) {
    let mut clean = true;
    for path in &nodes.known {
        clean &= !matches!(
            delete_until_gone(&nodes.session, path).await,
            Deleted::Failed(_)
        );
    }
    if nodes.in_doubt {
        clean &= sweep(&nodes.session, &nodes.dir, &nodes.prefix).await;
    }
    if clean {
        nodes.known.clear();
        drop(nodes.disarm());
    }
}

/// What became of a node we deleted.
pub(crate) enum Deleted {
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
pub(crate) async fn delete_until_gone(s: &Session, path: &str) -> Deleted {
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
pub(crate) async fn delete_for_good(
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
pub(crate) async fn delete_reported(s: &Arc<Session>, path: &str) -> Deleted {
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
pub(crate) async fn sweep_for_good(s: Weak<Session>, dir: String, prefix: String) {
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
pub(crate) async fn sweep(s: &Session, dir: &str, prefix: &str) -> bool {
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

pub(crate) fn spawn_delete(s: Arc<Session>, path: String) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(delete_for_good(Arc::downgrade(&s), path, None));
        }
        Err(_) => drop(s.client.delete(&path, None)),
    }
}
