//! Throw-away redis-servers the benchmark starts itself, for the scenario that pauses a RedLock
//! master: the shared servers on 6379-6382 belong to everyone's tests and must never be
//! paused. Each one runs on a loopback port the kernel just reported free, without
//! persistence, under a temp dir of its own; it is thawed, killed and removed when dropped,
//! so an error or a panic of the run leaves no stopped server behind.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::error::Res;

/// How long a fresh redis-server may take to accept connections.
const START_BOUND: Duration = Duration::from_secs(10);

/// Free ports tried before giving up: another process may take the port between the kernel
/// reporting it free and the server binding it.
const PORT_TRIES: usize = 10;

pub(crate) struct PrivateRedis {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl PrivateRedis {
    /// Starts one on a free loopback port and waits until it answers. The error says why not
    /// (no `redis-server` binary, no free port), for the report.
    pub(crate) async fn start() -> Res<Self> {
        let mut last = String::new();
        for _ in 0..PORT_TRIES {
            let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
                .local_addr()?
                .port();
            match Self::start_on(port).await {
                Ok(s) => return Ok(s),
                Err(StartError::Fatal(e)) => return Err(e),
                Err(StartError::Port(e)) => last = e,
            }
        }
        Err(
            format!("no free port for a private redis-server after {PORT_TRIES} tries: {last}")
                .into(),
        )
    }

    async fn start_on(port: u16) -> Result<Self, StartError> {
        let dir = std::env::temp_dir().join(format!(
            "distlock-bench-redis-{port}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| {
            StartError::Fatal(format!("cannot create {}: {e}", dir.display()).into())
        })?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(StartError::Fatal(
                    format!(
                        "cannot start redis-server ({e}); `scripts/services up redis` installs it"
                    )
                    .into(),
                ));
            }
        };
        // From here on, Drop kills the child whatever happens.
        let mut server = Self { port, dir, child };
        let deadline = Instant::now() + START_BOUND;
        loop {
            // Exited: most likely another process took the port first.
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(StartError::Port(format!(
                    "redis-server on port {port} exited at start ({status})"
                )));
            }
            if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(StartError::Fatal(
                    format!("redis-server on port {port} did not answer within {START_BOUND:?}")
                        .into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The port answering must be our child, not a server that raced us to it.
        match server.child.try_wait() {
            Ok(None) => Ok(server),
            _ => Err(StartError::Port(format!(
                "redis-server on port {port} exited at start"
            ))),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freezes the server (`SIGSTOP`): the kernel still accepts its connections and buffers
    /// what clients send, but nothing is answered — a hung host or a long GC pause.
    pub(crate) fn pause(&mut self) -> Res<()> {
        self.signal("-STOP")
    }

    /// Thaws it (`SIGCONT`).
    pub(crate) fn resume(&mut self) -> Res<()> {
        self.signal("-CONT")
    }

    /// Through `kill(1)`: the crate forbids `unsafe`, so no `libc::kill`. Only while the child
    /// has not been reaped: until then its pid cannot belong to another process.
    fn signal(&mut self, signal: &str) -> Res<()> {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return Err(format!("redis-server on port {} has exited", self.port).into());
        }
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run kill {signal}: {e}"))?;
        if !status.success() {
            return Err(format!("kill {signal} {} failed ({status})", self.child.id()).into());
        }
        Ok(())
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL too, but thawing first keeps that from depending
        // on the platform.
        let _ = self.resume();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

enum StartError {
    /// Worth another port.
    Port(String),
    /// Another port would not help.
    Fatal(crate::error::BoxError),
}
