//! A loopback TCP proxy that can cut a client off from its server, as a network partition
//! would, without touching the server or any other client.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Forwards loopback connections to one upstream server.
///
/// - [`cut`](Proxy::cut): every byte, both ways, on every connection it has or accepts is
///   swallowed, like a partition that drops packets. Nothing is closed or reset: the client
///   only learns of the cut from its own timeouts.
/// - [`mute`](Proxy::mute): requests still reach the server, answers are swallowed.
/// - [`delay`](Proxy::delay): every chunk, both ways, is held back this long before it is
///   passed on (in order), as a slow or congested link would.
/// - [`strand`](Proxy::strand): every connection it has now goes silent for good (both ways,
///   never closed, not even by a heal) while new ones flow: a half-open connection, as a peer
///   whose host rebooted or an expired NAT entry leaves behind.
/// - [`heal`](Proxy::heal): new connections flow again. A connection that lost bytes can
///   never be resumed (its stream would be corrupt), so those are closed, as a stateful
///   firewall would drop them; the client sees them end and reconnects.
/// - [`round_trips`](Proxy::round_trips): how many times, over all its connections, the client
///   spoke after the server had (or first): for a request-answer protocol whose client waits
///   for each answer, the round trips it made.
pub struct Proxy {
    port: u16,
    flags: Arc<Flags>,
    task: tokio::task::JoinHandle<()>,
}

struct Flags {
    cut: AtomicBool,
    muted: AtomicBool,
    healed: Notify,
    /// How many times the proxy healed. A connection poisoned before the latest heal ends even
    /// if it missed that heal's notice (sent while it was busy with a chunk, not waiting).
    heals: AtomicU64,
    round_trips: AtomicU64,
    /// How many times the proxy stranded its connections: a connection accepted before the
    /// latest strand is silent for good.
    strands: AtomicU64,
    /// How long each chunk is held back, in µs.
    delay_us: AtomicU64,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`) on a free loopback port in 20000..=20999.
    pub async fn start(upstream: impl Into<String>) -> Proxy {
        let upstream = upstream.into();
        let first = std::process::id() % 1000;
        let mut listener = None;
        for i in 0..1000 {
            let port = 20000 + (first + i) % 1000;
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port as u16)).await {
                listener = Some(l);
                break;
            }
        }
        let listener = listener.expect("no free loopback port in 20000..=20999 for a proxy");
        let port = listener.local_addr().expect("bound address").port();
        let flags = Arc::new(Flags {
            cut: AtomicBool::new(false),
            muted: AtomicBool::new(false),
            healed: Notify::new(),
            heals: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            strands: AtomicU64::new(0),
            delay_us: AtomicU64::new(0),
        });
        let task = {
            let flags = flags.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // Whether the server spoke since the client last did (or the client has
                    // not spoken yet): the client's next bytes begin a round trip.
                    let turn = Arc::new(AtomicBool::new(true));
                    let born = flags.strands.load(Ordering::SeqCst);
                    tokio::spawn(pipe(cr, sw, flags.clone(), false, born, turn.clone()));
                    tokio::spawn(pipe(sr, cw, flags.clone(), true, born, turn));
                }
            })
        };
        Proxy { port, flags, task }
    }

    /// The proxy's address, `127.0.0.1:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts swallowing everything, both ways.
    pub fn cut(&self) {
        self.flags.cut.store(true, Ordering::SeqCst);
    }

    /// Starts or stops swallowing the server's answers only.
    pub fn mute(&self, muted: bool) {
        self.flags.muted.store(muted, Ordering::SeqCst);
    }

    /// Holds every chunk back `by` before passing it on, both ways (zero: none).
    pub fn delay(&self, by: Duration) {
        let us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.flags.delay_us.store(us, Ordering::SeqCst);
    }

    /// The round trips clients made through the proxy so far (see [`Proxy`]).
    pub fn round_trips(&self) -> u64 {
        self.flags.round_trips.load(Ordering::SeqCst)
    }

    /// Leaves every connection it has now silent for good, without closing it; new ones flow.
    pub fn strand(&self) {
        self.flags.strands.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends a cut: connections that lost bytes are closed, new ones are forwarded.
    pub fn heal(&self) {
        self.flags.cut.store(false, Ordering::SeqCst);
        self.flags.muted.store(false, Ordering::SeqCst);
        self.flags.heals.fetch_add(1, Ordering::SeqCst);
        self.flags.healed.notify_waiters();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` until a cut (or, for answers, a mute) is seen, then swallows the rest
/// until the proxy heals, when it ends and so closes both halves. Each chunk is passed on at
/// its arrival plus the delay then in force, by a writer of its own, so a delay adds latency
/// without holding back the chunks behind it.
///
/// A pipe of a connection accepted before the latest strand swallows everything until the peer
/// closes its side, whatever else happens.
async fn pipe(
    mut from: OwnedReadHalf,
    to: OwnedWriteHalf,
    flags: Arc<Flags>,
    answers: bool,
    born: u64,
    turn: Arc<AtomicBool>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(forward(rx, to));
    let mut buf = vec![0u8; 64 * 1024];
    // The heal count when this pipe lost its first bytes (or was opened during a cut): any
    // later heal ends it. The count is read before the flags: a heal stores them first, so a cut
    // still seen is never paired with that heal's count.
    let cut_at = |flags: &Flags| {
        let heals = flags.heals.load(Ordering::SeqCst);
        flags.cut.load(Ordering::SeqCst).then_some(heals)
    };
    let mut poisoned_at = cut_at(&flags);
    loop {
        let healed = flags.healed.notified();
        tokio::pin!(healed);
        healed.as_mut().enable();
        // A heal between the last read and `enable` sent its notice to nobody.
        let poisoned = poisoned_at.is_some();
        if poisoned_at.is_some_and(|at| flags.heals.load(Ordering::SeqCst) != at) {
            return;
        }
        let read = tokio::select! {
            r = from.read(&mut buf) => r,
            _ = healed, if poisoned => return,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if flags.strands.load(Ordering::SeqCst) != born {
            // Stranded: silent for good. The writer half stays open until the peer closes.
            let _keep = tx;
            while let Ok(n) = from.read(&mut buf).await {
                if n == 0 {
                    return;
                }
            }
            return;
        }
        if poisoned_at.is_none() {
            let heals = flags.heals.load(Ordering::SeqCst);
            let muted = answers && flags.muted.load(Ordering::SeqCst);
            poisoned_at = cut_at(&flags).or(muted.then_some(heals));
        }
        if answers {
            turn.store(true, Ordering::SeqCst);
        } else if turn.swap(false, Ordering::SeqCst) {
            flags.round_trips.fetch_add(1, Ordering::SeqCst);
        }
        if poisoned_at.is_some() {
            continue;
        }
        let at = tokio::time::Instant::now()
            + Duration::from_micros(flags.delay_us.load(Ordering::SeqCst));
        if tx.send((at, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

/// Writes each chunk at its time, in order; ends (closing `to`) when the reader does, once the
/// chunks already read are written, or at the first failed write.
async fn forward(
    mut chunks: tokio::sync::mpsc::UnboundedReceiver<(tokio::time::Instant, Vec<u8>)>,
    mut to: OwnedWriteHalf,
) {
    while let Some((at, chunk)) = chunks.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
}

/// The `host:port` servers a connection URL names: what sits between `scheme://` (and any
/// `user:password@`) and the first `/` or `?`, split at commas. `etcd://a:1,b:2/x` gives
/// `["a:1", "b:2"]`.
pub fn hosts_of(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect()
}

/// `url` with each of `from` (as [`hosts_of`] gives them) replaced by the stand-in at the same
/// place in `to`.
pub fn reroute(url: &str, from: &[String], to: &[String]) -> String {
    assert_eq!(from.len(), to.len(), "one stand-in per server");
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|h| {
            let h = h.trim();
            from.iter()
                .position(|f| f == h)
                .map_or_else(|| h.to_string(), |i| to[i].clone())
        })
        .collect();
    let scheme = if scheme.is_empty() {
        String::new()
    } else {
        format!("{scheme}://")
    };
    format!("{scheme}{user}{}{tail}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_skips_scheme_user_and_path() {
        assert_eq!(hosts_of("redis://127.0.0.1:6379"), ["127.0.0.1:6379"]);
        assert_eq!(
            hosts_of("mysql://u:p@w@127.0.0.1:3306/db?x=1"),
            ["127.0.0.1:3306"]
        );
        assert_eq!(
            hosts_of("etcd://a:1, b:2/prefix"),
            ["a:1".to_string(), "b:2".to_string()]
        );
        assert_eq!(hosts_of("zk://h:2181"), ["h:2181"]);
    }

    #[test]
    fn reroute_replaces_each_server_in_place() {
        let from = hosts_of("mysql://u:p@127.0.0.1:3306/db");
        assert_eq!(
            reroute(
                "mysql://u:p@127.0.0.1:3306/db",
                &from,
                &["127.0.0.1:20001".into()]
            ),
            "mysql://u:p@127.0.0.1:20001/db"
        );
        let from = hosts_of("etcd://a:1,b:2/x");
        assert_eq!(
            reroute("etcd://a:1,b:2/x", &from, &["p:1".into(), "p:2".into()]),
            "etcd://p:1,p:2/x"
        );
    }
}
