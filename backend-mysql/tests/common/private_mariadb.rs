//! A private, throw-away MariaDB server for destructive tests (SIGKILL and restart, SIGSTOP and
//! SIGCONT): a data directory of its own under the temp dir and a loopback port of its own in
//! 23000-23099, never the shared server on 3306. Killed, and its directory removed, when dropped.
//!
//! Not declared in `common/mod.rs` (the other tests do not start servers): a test that needs it
//! includes it with `#[path = "common/private_mariadb.rs"] mod private_mariadb;`.

#![allow(dead_code, unreachable_pub)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock_mysql::sqlx::mysql::MySqlConnectOptions;
use distlock_mysql::sqlx::{self, Connection, MySqlConnection};

/// The private servers' ports (the shared servers use 3306 and other fixed ports; the Redis and
/// Mongo private servers use 20000-20999).
const PORTS: std::ops::Range<u16> = 23000..23100;
const DATABASE: &str = "distlock";
const USER: &str = "faults";
/// How long a start (or restart) may take before the test fails.
const START_LIMIT: Duration = Duration::from_secs(30);
/// Small buffers and logs, so that install and start take a fraction of a second.
const SIZING: [&str; 4] = [
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=4M",
    "--innodb-autoextend-increment=1",
    "--skip-name-resolve",
];
const HINT: &str = "run `scripts/services up mariadb` (it installs mariadb-server), or skip the \
                    MySQL tests with DISTLOCK_SKIP=mysql";

pub struct PrivateMariadb {
    pub port: u16,
    dir: PathBuf,
    mariadbd: PathBuf,
    password: String,
    child: Option<Child>,
    /// Where the current start's lines begin in the error log (which every start appends to).
    log_from: usize,
    /// How long `mariadb-install-db` took.
    pub install_took: Duration,
    /// How long the last start or restart took: from spawning `mariadbd` to the first session
    /// of the test user that reached this very server.
    pub start_took: Duration,
    /// More options for `mariadbd` (e.g. its TLS files).
    extra: Vec<String>,
}

/// Finds a server binary on the PATH or in the usual sbin directories (`mariadbd` lives in
/// /usr/sbin, which a non-root PATH may lack).
fn find(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no `{program}` binary found (PATH and /usr/sbin): {HINT}"))
}

/// A random number for the directory, password and first port tried, different in every
/// process and every call.
fn salt() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

/// `--user=root` as `scripts/services` passes it, when we are root (the option is refused
/// otherwise, and a non-root server runs as its caller anyway).
fn user_flag() -> Option<&'static str> {
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    root.then_some("--user=root")
}

impl PrivateMariadb {
    /// Creates a fresh data directory, starts `mariadbd` on a free port in 23000-23099 and
    /// waits until the test user can open a session on it, and says how long that took on
    /// stderr. Panics (with the way to install the
    /// server) if MariaDB is not installed.
    pub async fn start() -> Self {
        Self::start_with(Vec::new()).await
    }

    /// Like [`start`](Self::start), with more options for `mariadbd`.
    pub async fn start_with(extra: Vec<String>) -> Self {
        let mariadbd = find("mariadbd");
        let install_db = find("mariadb-install-db");
        let salt = salt();
        let dir = std::env::temp_dir().join(format!(
            "distlock-mariadb-faults-{}-{:x}",
            std::process::id(),
            salt & 0xffff_ffff
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the private server's temp dir");
        let password = format!("pw{:x}", salt >> 16);
        let mut server = Self {
            port: 0,
            dir,
            mariadbd,
            password,
            child: None,
            log_from: 0,
            install_took: Duration::ZERO,
            start_took: Duration::ZERO,
            extra,
        };
        // From here on, a panic drops `server`, which removes the directory.
        let started = Instant::now();
        let tmp = server.tmp_dir();
        std::fs::create_dir_all(&tmp).expect("create the private server's tmpdir");
        let (data, log) = (server.data_dir(), server.dir.join("install.log"));
        let installed = tokio::task::spawn_blocking(move || {
            let log_file = std::fs::File::create(&log).expect("install log");
            let mut cmd = Command::new(install_db);
            // `--no-defaults` must come first: no my.cnf of the machine may change this server.
            cmd.arg("--no-defaults");
            cmd.args(user_flag());
            cmd.arg(format!("--datadir={}", data.display()))
                .arg(format!("--tmpdir={}", tmp.display()))
                .args(["--auth-root-authentication-method=socket", "--skip-test-db"])
                .args(SIZING)
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("install log"))
                .stderr(log_file);
            cmd.status()
        })
        .await
        .expect("mariadb-install-db task");
        let log = std::fs::read_to_string(server.dir.join("install.log")).unwrap_or_default();
        match installed {
            Ok(status) if status.success() => {}
            Ok(status) => panic!("mariadb-install-db failed ({status}):\n{log}"),
            Err(e) => panic!("cannot run mariadb-install-db ({e}): {HINT}"),
        }
        server.install_took = started.elapsed();
        // The test user and database, created by the server itself at start (idempotent, so
        // a restart may run it again). The user may also see every connection's transactions
        // (`information_schema.innodb_trx`), which tests read to find any left open.
        std::fs::write(
            server.dir.join("init.sql"),
            format!(
                "CREATE DATABASE IF NOT EXISTS `{DATABASE}`;\n\
                 CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1' IDENTIFIED BY '{pw}';\n\
                 GRANT ALL PRIVILEGES ON `{DATABASE}`.* TO '{USER}'@'127.0.0.1';\n\
                 GRANT PROCESS ON *.* TO '{USER}'@'127.0.0.1';\n",
                pw = server.password
            ),
        )
        .expect("write init.sql");
        // Pick a port nobody listens on; if another process takes it between our check and
        // the server's bind, the server exits and the next port is tried.
        for port in distlock_conformance::free_ports(PORTS) {
            server.port = port;
            match server.spawn_and_wait().await {
                Ok(took) => {
                    server.start_took = took;
                    eprintln!(
                        "private MariaDB on port {port}: install {} ms, start {} ms",
                        server.install_took.as_millis(),
                        took.as_millis()
                    );
                    return server;
                }
                Err(why) if why.contains("already in use") => continue,
                Err(why) => panic!("the private MariaDB server did not start: {why}"),
            }
        }
        panic!("no free port in {PORTS:?} for a private MariaDB server")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A tmpdir of its own: at start a server deletes every `#sql*` file in its tmpdir, which
    /// in a shared /tmp includes the temporary tables of another server being installed at the
    /// same moment (its `mariadb-install-db` then fails).
    fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    fn error_log(&self) -> PathBuf {
        self.dir.join("error.log")
    }

    /// Spawns `mariadbd` on the data directory and port and waits until a session of the test
    /// user reaches it (and not some other server on the port). `Err` with the reason (the tail
    /// of the server's error log) if the server exits first or the wait runs out.
    async fn spawn_and_wait(&mut self) -> Result<Duration, String> {
        assert!(
            self.child.is_none(),
            "the private server is already running"
        );
        self.log_from = std::fs::read(self.error_log()).map_or(0, |l| l.len());
        let started = Instant::now();
        let child = Command::new(&self.mariadbd)
            .arg("--no-defaults")
            .args(user_flag())
            .arg(format!("--datadir={}", self.data_dir().display()))
            .arg(format!("--tmpdir={}", self.tmp_dir().display()))
            .arg(format!(
                "--socket={}",
                self.dir.join("mysqld.sock").display()
            ))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!(
                "--pid-file={}",
                self.dir.join("mysqld.pid").display()
            ))
            .arg(format!("--log-error={}", self.error_log().display()))
            .arg(format!(
                "--init-file={}",
                self.dir.join("init.sql").display()
            ))
            .args(SIZING)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {} ({e}): {HINT}", self.mariadbd.display()))?;
        self.child = Some(child);
        let options = self.connect_options();
        let datadir = self.data_dir();
        let deadline = started + START_LIMIT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "mariadbd on port {} exited at start ({status}):\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            let attempt = tokio::time::timeout(Duration::from_secs(1), async {
                let mut conn = MySqlConnection::connect_with(&options).await?;
                let dir: String = sqlx::query_scalar("SELECT @@datadir")
                    .fetch_one(&mut conn)
                    .await?;
                let _ = conn.close().await;
                Ok::<_, sqlx::Error>(dir)
            })
            .await;
            if let Ok(Ok(dir)) = attempt {
                if same_dir(Path::new(&dir), &datadir) {
                    return Ok(started.elapsed());
                }
                self.kill();
                return Err(format!(
                    "port {} answered with the data directory {dir}, not ours: already in use",
                    self.port
                ));
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "mariadbd on port {} did not accept the test user within {START_LIMIT:?}:\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read(self.error_log()).unwrap_or_default();
        let log = String::from_utf8_lossy(log.get(self.log_from..).unwrap_or_default());
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn connect_options(&self) -> MySqlConnectOptions {
        MySqlConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username(USER)
            .password(&self.password)
            .database(DATABASE)
    }

    /// The URL clients of this server use (`?…` parameters may be appended).
    pub fn url(&self) -> String {
        format!(
            "mysql://{USER}:{}@127.0.0.1:{}/{DATABASE}",
            self.password, self.port
        )
    }

    fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("the private server is running")
            .id()
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the server process.
    pub fn signal(&self, signal: &str) {
        distlock_conformance::send_signal(self.pid(), signal);
    }

    /// Kills the server with SIGKILL, as a crash or the OOM killer would (no clean shutdown:
    /// InnoDB recovers from its redo log at the next start), and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same data directory and port, after [`kill`], and waits
    /// until it accepts the test user; returns how long that took.
    ///
    /// [`kill`]: PrivateMariadb::kill
    pub async fn restart(&mut self) -> Duration {
        self.kill();
        let took = self
            .spawn_and_wait()
            .await
            .unwrap_or_else(|why| panic!("the private MariaDB server did not restart: {why}"));
        self.start_took = took;
        took
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.as_os_str() == b.as_os_str(),
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped (SIGSTOP) process.
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
