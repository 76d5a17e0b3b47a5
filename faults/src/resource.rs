//! The shared resource the clients write to while they believe they hold a lock, served by the
//! runner over a loopback TCP socket, one JSON request and one JSON answer per line:
//!
//! - a **fenced register** per name, which takes a write whose token is at least the highest
//!   it took and rejects a lower one (a zombie holder's write: "fenced off");
//! - a plain **counter** per name that clients increment by reading, sleeping and writing the
//!   value read plus one: when two clients hold at once, one's update is lost.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::clock;

/// A request to the resource.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Request {
    /// A write to the register of `name` with `token`.
    Fence {
        /// The lock name.
        name: String,
        /// The writer's fencing token.
        token: u64,
        /// The writer's process.
        pid: u32,
        /// The writer's grant (`pid/task/seq`): an equal token from another grant is refused.
        #[serde(default)]
        grant: String,
    },
    /// Reads the counter of `name`.
    Read {
        /// The lock name.
        name: String,
    },
    /// Sets the counter of `name` to `value` (what the client read, plus one).
    Set {
        /// The lock name.
        name: String,
        /// The new value.
        value: u64,
    },
}

/// The answer.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Answer {
    /// For `fence`: whether the register took the write.
    pub(crate) accepted: bool,
    /// For `read`: the counter.
    pub(crate) value: u64,
}

/// A write the register took or refused.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FenceWrite {
    /// When the resource saw it.
    pub(crate) at: u64,
    /// The token.
    pub(crate) token: u64,
    /// The writer.
    pub(crate) pid: u32,
    /// The register's highest token before it.
    pub(crate) highest: u64,
}

/// What the resource knows about one name.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Cell {
    /// The highest token taken.
    pub(crate) highest: u64,
    /// The grant that wrote the highest token.
    pub(crate) highest_by: String,
    /// Writes taken, in the order taken.
    pub(crate) accepted: Vec<FenceWrite>,
    /// Writes refused: the fenced-off writes.
    pub(crate) rejected: Vec<FenceWrite>,
    /// The counter.
    pub(crate) counter: u64,
    /// How many times the counter was set.
    pub(crate) sets: u64,
    /// Sets whose value was not the counter plus one: someone else's update in between was
    /// lost (or repeated).
    pub(crate) lost_updates: u64,
}

/// The resource's state, by name.
pub(crate) type State = Arc<Mutex<BTreeMap<String, Cell>>>;

/// The running resource.
pub(crate) struct Resource {
    addr: String,
    state: State,
    task: tokio::task::JoinHandle<()>,
}

impl Resource {
    /// Serves a fresh resource on a free loopback port.
    pub(crate) async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?.to_string();
        let state = State::default();
        let task = {
            let state = state.clone();
            tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(serve(conn, state.clone()));
                }
            })
        };
        Ok(Self { addr, state, task })
    }

    /// `127.0.0.1:port`.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// A copy of the state now.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, Cell> {
        self.state.lock().expect("resource state").clone()
    }

    /// The process that made the last write the register of `name` took, and when.
    pub(crate) fn last_writer(&self, name: &str) -> Option<(u32, u64)> {
        let state = self.state.lock().expect("resource state");
        state
            .get(name)
            .and_then(|c| c.accepted.last())
            .map(|w| (w.pid, w.at))
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(conn: TcpStream, state: State) {
    let _ = conn.set_nodelay(true);
    let (read, mut write) = conn.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(request) = serde_json::from_str::<Request>(&line) else {
            return;
        };
        let answer = apply(&state, request);
        let mut out = serde_json::to_vec(&answer).unwrap_or_default();
        out.push(b'\n');
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn apply(state: &State, request: Request) -> Answer {
    let at = clock::now();
    let mut state = state.lock().expect("resource state");
    match request {
        Request::Fence {
            name,
            token,
            pid,
            grant,
        } => {
            let cell = state.entry(name).or_default();
            let write = FenceWrite {
                at,
                token,
                pid,
                highest: cell.highest,
            };
            // An equal token is taken only from the grant that wrote it (writing again, or
            // through a re-entered hold, which shares the grant): two grants never share one.
            let accepted =
                token > cell.highest || (token == cell.highest && cell.highest_by == grant);
            if accepted {
                cell.highest = token;
                cell.highest_by = grant;
                cell.accepted.push(write);
            } else {
                cell.rejected.push(write);
            }
            Answer { accepted, value: 0 }
        }
        Request::Read { name } => Answer {
            accepted: true,
            value: state.get(&name).map_or(0, |c| c.counter),
        },
        Request::Set { name, value } => {
            let cell = state.entry(name).or_default();
            if value != cell.counter + 1 {
                cell.lost_updates += 1;
            }
            cell.counter = value;
            cell.sets += 1;
            Answer {
                accepted: true,
                value,
            }
        }
    }
}

/// A client's connection to the resource.
pub(crate) struct Conn {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Conn {
    /// Connects to the resource at `addr`.
    pub(crate) async fn connect(addr: &str) -> std::io::Result<Self> {
        let conn = TcpStream::connect(addr).await?;
        conn.set_nodelay(true)?;
        let (read, write) = conn.into_split();
        Ok(Self {
            lines: BufReader::new(read).lines(),
            write,
        })
    }

    /// Sends `request` and reads its answer.
    pub(crate) async fn call(&mut self, request: &Request) -> std::io::Result<Answer> {
        let mut out = serde_json::to_vec(request)?;
        out.push(b'\n');
        self.write.write_all(&out).await?;
        let line = self.lines.next_line().await?.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "resource closed")
        })?;
        Ok(serde_json::from_str(&line)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn register_fences_off_lower_tokens_and_counter_sees_lost_updates() {
        let resource = Resource::start().await.expect("resource");
        let mut c = Conn::connect(resource.addr()).await.expect("connect");
        let fence = |token, grant: &str| Request::Fence {
            name: "n".into(),
            token,
            pid: 1,
            grant: grant.into(),
        };
        assert!(c.call(&fence(5, "1/0/1")).await.unwrap().accepted);
        assert!(c.call(&fence(5, "1/0/1")).await.unwrap().accepted);
        assert!(
            !c.call(&fence(5, "1/1/1")).await.unwrap().accepted,
            "an equal token from another grant"
        );
        assert!(!c.call(&fence(4, "1/0/1")).await.unwrap().accepted);
        assert!(c.call(&fence(7, "1/2/1")).await.unwrap().accepted);
        let set = |value| Request::Set {
            name: "n".into(),
            value,
        };
        c.call(&set(1)).await.unwrap();
        c.call(&set(2)).await.unwrap();
        // A second writer that read 1 before the write of 2: its update overwrites.
        c.call(&set(2)).await.unwrap();
        let read = c
            .call(&Request::Read { name: "n".into() })
            .await
            .unwrap()
            .value;
        let cell = resource.snapshot().remove("n").expect("cell");
        assert_eq!(read, 2);
        assert_eq!(
            (cell.highest, cell.accepted.len(), cell.rejected.len()),
            (7, 3, 2)
        );
        assert_eq!((cell.sets, cell.lost_updates, cell.counter), (3, 1, 2));
        assert_eq!(resource.last_writer("n").map(|w| w.0), Some(1));
    }
}
