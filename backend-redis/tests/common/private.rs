//! A private, throw-away redis-server for destructive tests (restarts, a master going down, a
//! paused master), on a port of its own (a fixed one in 20000-20999, or one the kernel just
//! handed out) under a temp dir; thawed and killed when dropped, panics included.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PrivateRedis {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// TLS files (certificate, key, CA): the port speaks TLS only.
    tls: Option<[PathBuf; 3]>,
}

impl PrivateRedis {
    /// Starts redis-server on `port` without persistence and waits until it answers.
    pub fn start(port: u16) -> Self {
        assert!(
            (20000..21000).contains(&port),
            "private ports are 20000-20999"
        );
        Self::start_on(port)
    }

    /// Starts redis-server on a port the kernel reports free, retrying with another if a
    /// different process takes it between the check and the server's bind.
    pub fn start_free() -> Self {
        Self::start_free_with(None)
    }

    /// Like [`start_free`](Self::start_free), serving TLS only on its port with `certificate`,
    /// `key` and `ca` (clients need no certificate of their own).
    pub fn start_free_tls(certificate: PathBuf, key: PathBuf, ca: PathBuf) -> Self {
        Self::start_free_with(Some([certificate, key, ca]))
    }

    fn start_free_with(tls: Option<[PathBuf; 3]>) -> Self {
        for _ in 0..20 {
            let port = std::net::TcpListener::bind(("127.0.0.1", 0))
                .and_then(|l| l.local_addr())
                .expect("bind an ephemeral port")
                .port();
            let tls = tls.clone();
            if let Ok(s) = std::panic::catch_unwind(|| Self::start_with(port, tls)) {
                return s;
            }
        }
        panic!("no free port for a private redis-server after 20 tries");
    }

    fn start_on(port: u16) -> Self {
        Self::start_with(port, None)
    }

    fn start_with(port: u16, tls: Option<[PathBuf; 3]>) -> Self {
        let dir =
            std::env::temp_dir().join(format!("distlock-redis-test-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut s = Self {
            port,
            dir,
            child: None,
            tls,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        assert!(
            TcpStream::connect(("127.0.0.1", self.port)).is_err(),
            "port {} is already in use: another test's server would be mistaken for ours",
            self.port
        );
        let mut command = Command::new("redis-server");
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some([certificate, key, ca]) => command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .arg("--tls-cert-file")
                .arg(certificate)
                .arg("--tls-key-file")
                .arg(key)
                .arg("--tls-ca-cert-file")
                .arg(ca)
                .args(["--tls-auth-clients", "no"]),
        };
        let child = command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): run `scripts/services up redis`, which installs it")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The port answering must be our child, not a server that raced us to it.
        if let Some(child) = &mut self.child {
            assert!(
                matches!(child.try_wait(), Ok(None)),
                "redis-server on {} exited at start (port taken?)",
                self.port
            );
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Kills the server (its memory, and so every lock and counter, is gone).
    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the server process: a paused server accepts
    /// connections at the kernel level but answers nothing, like a GC pause or a hung host.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        distlock_conformance::send_signal(pid, signal);
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process dies of SIGKILL too, but thawing first keeps that from
            // depending on the platform.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops and starts it again, empty: a restart without persistence.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
