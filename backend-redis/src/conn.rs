//! The command connection ([`Conn`]): to one server through the driver's connection manager,
//! or to a cluster through its cluster client. What follows is the cluster's: each request
//! sent once, and the connection remade after a request timed out.
//!
//! **Once.** The driver's client is built without retries ([`ClusterSpec::client`]), because
//! it would send a script again after its connection dropped, when the node may have run it
//! already. A release run twice takes a hold a live guard of its owner relies on, and an
//! acquire run twice adds one nobody accounts for. An unknown outcome is left to the core,
//! which settles it by looking first (see `lost_reply` in `distlock-api`). What the driver's
//! retries did for answers that say the request did *not* run is done here:
//! - `MOVED`: sent to the node named (the driver reloads its slot map meanwhile);
//! - `ASK` (a slot being migrated): sent to the node named, behind `ASKING`, in one write;
//! - `TRYAGAIN`, `CLUSTERDOWN`, no connection to the slot's node yet, a refused connection:
//!   sent again after a pause, while the pauses last (0.75 s in all).
//!
//! **Remade.** The driver replaces a node's connection only once it sees it fail. One that went
//! silent without closing (a half-open connection: the node's host rebooted, a NAT entry
//! expired) fails nothing but the requests that time out on it, until TCP gives up on it many
//! minutes later. So after a timeout a new cluster connection is made in the background, from
//! the seeds, and takes the old one's place ([`Remake`]); requests in flight finish on the old.
//!
//! [`ClusterSpec::client`]: crate::endpoint::ClusterSpec

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value};

/// The command connection: to one server, or to a cluster through the driver's cluster client
/// (each request sent once, remade after a timeout: see above).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => Box::pin(command(c, cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => Box::pin(self::pipeline(c, pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Redirects followed for one request: enough for a slot moved on while it was redirected.
const HOPS: usize = 5;

/// The pauses before a request that did not run is sent again.
const PAUSES: [Duration; 5] = [
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(375),
];

/// Where a redirect sends a request.
struct Redirect {
    node: SingleNodeRoutingInfo,
    /// `ASK`: the node serves the key only right after `ASKING`.
    asking: bool,
}

/// Sends `cmd` once, following answers that say it did not run.
pub(crate) async fn command(c: &mut ClusterConnection, cmd: &Cmd) -> RedisResult<Value> {
    let mut replies = following(c, Request::Command(cmd)).await?;
    replies.pop().ok_or_else(no_reply)
}

/// Sends `pipeline` once (its replies `offset..offset + count`), following answers that say it
/// did not run. Every command of a pipeline is for one slot here.
pub(crate) async fn pipeline(
    c: &mut ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    following(c, Request::Pipeline(pipeline, offset, count)).await
}

/// A command, or a pipeline with the replies wanted (`offset`, `count`).
#[derive(Clone, Copy)]
enum Request<'a> {
    Command(&'a Cmd),
    Pipeline(&'a Pipeline, usize, usize),
}

/// Sends `request` (first routed by slot, then as the last answer redirected it) until it gets
/// an answer that is not one of those above, or the hops or pauses run out.
async fn following(c: &mut ClusterConnection, request: Request<'_>) -> RedisResult<Vec<Value>> {
    let mut to = None;
    let (mut hops, mut paused) = (0, 0);
    loop {
        let e = match send(c, request, to.take()).await {
            Ok(replies) => return Ok(replies),
            Err(e) => e,
        };
        let not_run = matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown)
                | ErrorKind::ClusterConnectionNotFound
        ) || e.is_connection_refusal();
        match e.kind() {
            ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask))
                if hops < HOPS =>
            {
                let Some(node) = e.redirect_node().and_then(address) else {
                    return Err(e);
                };
                hops += 1;
                to = Some(Redirect {
                    node,
                    asking: kind == ServerErrorKind::Ask,
                });
            }
            _ if not_run && paused < PAUSES.len() => {
                tokio::time::sleep(PAUSES[paused]).await;
                paused += 1;
            }
            _ => return Err(e),
        }
    }
}

/// One attempt: routed by slot, or to a redirect's node (behind `ASKING` for `ASK`).
async fn send(
    c: &mut ClusterConnection,
    request: Request<'_>,
    to: Option<Redirect>,
) -> RedisResult<Vec<Value>> {
    let Some(Redirect { node, asking }) = to else {
        return match request {
            Request::Command(cmd) => c.req_packed_command(cmd).await.map(|v| vec![v]),
            Request::Pipeline(p, offset, count) => c.req_packed_commands(p, offset, count).await,
        };
    };
    let mut pipe = redis::pipe();
    if asking {
        pipe.cmd("ASKING");
    }
    let skip = usize::from(asking);
    let (offset, count) = match request {
        Request::Command(cmd) => {
            pipe.add_command(cmd.clone());
            (skip, 1)
        }
        Request::Pipeline(p, offset, count) => {
            p.cmd_iter().for_each(|cmd| {
                pipe.add_command(cmd.clone());
            });
            (offset + skip, count)
        }
    };
    let replies = c.route_pipeline(pipe, offset, count, node).await?;
    match request {
        // As the driver gives a command's answer: a server error as an error.
        Request::Command(_) => Ok(vec![replies
            .into_iter()
            .next()
            .ok_or_else(no_reply)?
            .extract_error()?]),
        Request::Pipeline(..) => Ok(replies),
    }
}

/// The node of a redirect's `host:port`.
fn address((hostport, _slot): (&str, u16)) -> Option<SingleNodeRoutingInfo> {
    let (host, port) = hostport.rsplit_once(':')?;
    Some(SingleNodeRoutingInfo::ByAddress {
        host: host.to_string(),
        port: port.parse().ok()?,
    })
}

fn no_reply() -> redis::RedisError {
    redis::RedisError::from((ErrorKind::UnexpectedReturnType, "no reply from the cluster"))
}

/// What makes a new cluster connection after a timeout: the driver's client (the seeds and
/// options), and whether a new connection is being made.
pub(crate) struct Remake {
    client: ClusterClient,
    /// The bound on making one (the connect and operation timeouts).
    limit: Duration,
    busy: AtomicBool,
}

impl Remake {
    pub(crate) fn new(client: ClusterClient, limit: Duration) -> Arc<Self> {
        Arc::new(Self {
            client,
            limit,
            busy: AtomicBool::new(false),
        })
    }

    /// Makes a new cluster connection in the background and hands it to `install` (one at a
    /// time; if it cannot be made in time, nothing changes).
    pub(crate) fn start(
        self: &Arc<Self>,
        install: impl FnOnce(ClusterConnection) + Send + 'static,
    ) {
        if self.busy.swap(true, Ordering::SeqCst) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let made = tokio::time::timeout(this.limit, this.client.get_async_connection()).await;
            if let Ok(Ok(fresh)) = made {
                install(fresh);
            }
            this.busy.store(false, Ordering::SeqCst);
        });
    }
}
