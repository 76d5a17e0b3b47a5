//! Asking members how they are: whether one serves requests, and which member leads a
//! cluster (and which follows).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::{Deployment, Kind};

/// Sends `line` to `addr` and reads what comes back within a second.
fn ask(addr: SocketAddr, line: &[u8]) -> Option<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    if !line.is_empty() {
        conn.write_all(line).ok()?;
    }
    let mut buf = vec![0; 4096];
    let mut got = Vec::new();
    // 4-letter words answer and close; Redis answers one line; MariaDB greets first.
    while let Ok(n) = conn.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if !line.starts_with(b"srvr") {
            break;
        }
    }
    (!got.is_empty()).then(|| String::from_utf8_lossy(&got).into_owned())
}
impl Deployment {
    pub(super) async fn serves(&self, i: usize) -> bool {
        let addr = self.addr(i);
        match self.kind {
            Kind::Redis => {
                let answer = tokio::task::spawn_blocking(move || ask(addr, b"PING\r\n")).await;
                answer
                    .ok()
                    .flatten()
                    .is_some_and(|a| a.starts_with("+PONG"))
            }
            Kind::Zk => {
                let answer = tokio::task::spawn_blocking(move || ask(addr, b"srvr")).await;
                answer.ok().flatten().is_some_and(|a| {
                    a.contains("Mode: leader")
                        || a.contains("Mode: follower")
                        || a.contains("Mode: standalone")
                })
            }
            Kind::Mariadb => {
                // The greeting comes once the init file ran and the server takes clients.
                let answer = tokio::task::spawn_blocking(move || ask(addr, b"")).await;
                answer.ok().flatten().is_some_and(|a| a.contains("MariaDB"))
            }
            Kind::Mongo => {
                tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
                    .await
                    .is_ok_and(|c| c.is_ok())
            }
            Kind::Etcd => self.etcd_status(i).await.is_some(),
            // Connections are taken before recovery ends; a query is answered after it.
            Kind::Postgres => {
                use distlock_postgres::sqlx::{self, Connection};
                let url = self.member_url(i);
                let fut = async {
                    let mut c = sqlx::postgres::PgConnection::connect(&url).await.ok()?;
                    sqlx::query_scalar::<_, i32>("SELECT 1")
                        .fetch_one(&mut c)
                        .await
                        .ok()
                };
                tokio::time::timeout(Duration::from_secs(2), fut)
                    .await
                    .ok()
                    .flatten()
                    == Some(1)
            }
        }
    }

    /// (member id, leader id) as member `i` sees them.
    async fn etcd_status(&self, i: usize) -> Option<(u64, u64)> {
        let url = format!("http://{}", self.addr(i));
        let fut = async {
            let options = distlock::etcd::etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_millis(500))
                .with_timeout(Duration::from_millis(800));
            let mut c = distlock::etcd::etcd_client::Client::connect([url], Some(options))
                .await
                .ok()?;
            let s = c.status().await.ok()?;
            Some((s.header()?.member_id(), s.leader()))
        };
        tokio::time::timeout(Duration::from_secs(2), fut)
            .await
            .ok()
            .flatten()
    }

    /// The member the others follow, if they agree on one now.
    pub(crate) async fn leader(&self) -> Option<usize> {
        match self.kind {
            Kind::Etcd => {
                let mut ids = Vec::new();
                let mut leader = None;
                for i in 0..self.members.len() {
                    let (id, l) = self.etcd_status(i).await.unwrap_or((0, 0));
                    ids.push(id);
                    if l != 0 {
                        leader = Some(l);
                    }
                }
                let leader = leader?;
                ids.iter().position(|&id| id == leader)
            }
            Kind::Zk => {
                for i in 0..self.members.len() {
                    let addr = self.addr(i);
                    let answer = tokio::task::spawn_blocking(move || ask(addr, b"srvr"))
                        .await
                        .ok()
                        .flatten();
                    if answer.is_some_and(|a| a.contains("Mode: leader")) {
                        return Some(i);
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// A member other than the leader (the first one when there is no leader).
    pub(crate) async fn follower(&self) -> usize {
        let leader = self.leader().await;
        (0..self.members.len())
            .find(|&i| Some(i) != leader)
            .unwrap_or(0)
    }
}
