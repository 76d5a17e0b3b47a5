//! Every request of the cluster command connection is sent once: the driver's client is built
//! without retries ([`ClusterSpec::client`](crate::endpoint::ClusterSpec)), because it would
//! send a script again after its connection dropped, when the node may have run it already. A
//! release run twice takes a hold a live guard of its owner relies on, and an acquire run twice
//! adds one nobody accounts for. An unknown outcome is left to the core, which settles it by
//! looking first (see `lost_reply` in `distlock-api`).
//!
//! What the driver's retries did for answers that say the request did *not* run is done here:
//! - `MOVED`: sent to the node named (the driver reloads its slot map meanwhile);
//! - `ASK` (a slot being migrated): sent to the node named, behind `ASKING`, in one write;
//! - `TRYAGAIN`, `CLUSTERDOWN`, no connection to the slot's node yet, a refused connection:
//!   sent again after a pause, while the pauses last (0.75 s in all).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, Pipeline, RedisResult, ServerErrorKind, Value};

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
