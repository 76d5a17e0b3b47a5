//! Throw-away servers for the scenarios that pause, kill or restart the server: the shared ones
//! on the standard ports belong to everyone's tests and are never faulted. Each runs on a free
//! loopback port with its data in a temp dir of its own, and is thawed, killed and removed when
//! dropped.
//!
//! Redis runs with an fsync-always append-only file, so a kill -9 and restart keeps its locks
//! and fencing counters (without persistence a restart forgets both; the docs of
//! distlock-redis say so, and that is not what these scenarios test). etcd keeps its data dir.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to serve after a start.
const START_BOUND: Duration = Duration::from_secs(20);

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Redis,
    Etcd,
}

/// A private server.
pub(crate) struct Private {
    kind: Kind,
    port: u16,
    peer_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

impl Private {
    /// Starts one and waits until it serves. The error says why not.
    pub(crate) async fn start(kind: Kind) -> Result<Self, String> {
        let mut last = String::new();
        // Another process may take the port between the kernel offering it and the bind.
        for _ in 0..5 {
            let port = free_port().map_err(|e| e.to_string())?;
            let peer_port = free_port().map_err(|e| e.to_string())?;
            let dir = std::env::temp_dir().join(format!(
                "distlock-faults-{kind:?}-{}-{port}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let mut server = Self {
                kind,
                port,
                peer_port,
                dir,
                child: None,
            };
            match server.spawn().await {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(format!("no private {kind:?} server started: {last}"))
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let mut cmd = match self.kind {
            Kind::Redis => {
                let mut c = Command::new("redis-server");
                c.args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
                    .args(["--appendonly", "yes", "--appendfsync", "always"])
                    .arg("--dir")
                    .arg(&self.dir);
                c
            }
            Kind::Etcd => {
                let bin = std::env::var("DISTLOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
                let client = format!("http://127.0.0.1:{}", self.port);
                let peer = format!("http://127.0.0.1:{}", self.peer_port);
                let mut c = Command::new(bin);
                c.args(["--name", "faults", "--data-dir"])
                    .arg(self.dir.join("data"))
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &format!("faults={peer}")])
                    .args(["--log-level", "error"]);
                c
            }
        };
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {:?} ({e}); `scripts/services up redis etcd` installs it",
                    self.kind
                )
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + START_BOUND;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err(format!("{:?} on {} exited at start ({status})", self.kind, self.port));
            }
            if self.serves().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{:?} on {} did not serve within {START_BOUND:?}",
                    self.kind, self.port
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether it answers a request (not only accepts connections).
    async fn serves(&self) -> bool {
        match self.kind {
            Kind::Redis => tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok(),
            Kind::Etcd => {
                let url = format!("http://127.0.0.1:{}", self.port);
                let fut = async {
                    let mut c =
                        distlock::etcd::etcd_client::Client::connect([url], None).await.ok()?;
                    c.status().await.ok()
                };
                matches!(
                    tokio::time::timeout(Duration::from_secs(2), fut).await,
                    Ok(Some(_))
                )
            }
        }
    }

    /// The lock URL of the server, with `query` appended.
    pub(crate) fn url(&self) -> String {
        match self.kind {
            Kind::Redis => format!("redis://127.0.0.1:{}", self.port),
            Kind::Etcd => format!("etcd://127.0.0.1:{}", self.port),
        }
    }

    /// SIGSTOP.
    pub(crate) fn pause(&mut self) -> Result<(), String> {
        self.signal("STOP")
    }

    /// SIGCONT.
    pub(crate) fn resume(&mut self) -> Result<(), String> {
        self.signal("CONT")
    }

    /// SIGKILL, keeping the data for a restart.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub(crate) async fn restart(&mut self) -> Result<(), String> {
        self.kill();
        // A restarted server may find its port in TIME_WAIT for a moment.
        let mut last = String::new();
        for _ in 0..5 {
            match self.spawn().await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(last)
    }

    /// Through kill(1) (no `unsafe` for libc::kill), and only while the child is unreaped, so
    /// that its pid cannot be another process's.
    fn signal(&mut self, signal: &str) -> Result<(), String> {
        let Some(child) = self.child.as_mut() else {
            return Err(format!("{:?} is not running", self.kind));
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return Err(format!("{:?} has exited", self.kind));
        }
        crate::signal(child.id(), signal)
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
