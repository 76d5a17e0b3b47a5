//! A private, throw-away PostgreSQL server for destructive tests (SIGKILL and restart, SIGSTOP
//! and SIGCONT): a cluster of its own (`initdb`) in a directory under the temp dir, listening
//! on a loopback port of its own in 23100-23199 (never the shared server on 5432), with a test
//! user and database reached with a password over 127.0.0.1. Killed, and its directory
//! removed, when dropped.
//!
//! PostgreSQL is a postmaster and one process per connection (plus its background workers), so
//! every signal goes to the postmaster *and* its children: stopping only the postmaster would
//! leave open sessions answering, and killing only the postmaster would leave its backends
//! holding the shared memory that a restart needs. The server stays in the test's process
//! group, so a test runner that kills the test's group (a timeout) ends the server too.
//!
//! As root (the server refuses to run as root) the directory belongs to `postgres`, `initdb`
//! runs through `runuser -u postgres` and the server through `setpriv` (which execs, so the
//! child is the postmaster itself); as another user both run as that user.
//!
//! Not declared in `common/mod.rs` (the other tests do not start servers): a test that needs it
//! includes it with `#[path = "common/private_postgres.rs"] mod private_postgres;`.

#![allow(dead_code, unreachable_pub)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock_postgres::sqlx::postgres::{PgConnectOptions, PgConnection};
use distlock_postgres::sqlx::{self, AssertSqlSafe, Connection};

/// The private PostgreSQL servers' ports (the MariaDB private servers use 23000-23099, the
/// Redis and Mongo ones 20000-20999; the shared server is on 5432).
const PORTS: std::ops::Range<u16> = 23100..23200;
/// The database and the (non-superuser) user the tests connect as.
const DATABASE: &str = "distlock";
const USER: &str = "faults";
/// The cluster's superuser, for the test's own inspection (`pg_locks`, terminating a backend).
const SUPERUSER: &str = "postgres";
/// How long a start (or restart, with its crash recovery) may take before the test fails.
const START_LIMIT: Duration = Duration::from_secs(30);
/// How long the processes of a killed server may take to disappear.
const EXIT_LIMIT: Duration = Duration::from_secs(10);
/// A small server: the tests' tables hold a handful of rows.
///
/// `fsync=off` keeps a restart after a kill fast: with it on, crash recovery first fsyncs every
/// file of the data directory (about a thousand, seconds on a loaded machine). It does not
/// weaken what a kill tests: the server writes a commit's WAL (`synchronous_commit` keeps its
/// default, on) before it answers, and what was written survives the death of the server's
/// processes in the kernel's page cache; only an OS crash or power loss would need the fsync.
const SETTINGS: [(&str, &str); 6] = [
    ("fsync", "off"),
    ("shared_buffers", "16MB"),
    ("max_connections", "100"),
    ("autovacuum", "off"),
    ("huge_pages", "off"),
    ("listen_addresses", "127.0.0.1"),
];
/// Where Debian's packages put the server binaries (`/usr/lib/postgresql/<major>/bin`).
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
const HINT: &str = "run `scripts/services up postgres` (it installs postgresql), or skip the \
                    PostgreSQL tests with DISTLOCK_SKIP=postgres";
/// The prefix of the private servers' directories under the temp dir.
const DIR_PREFIX: &str = "distlock-pg-faults-";

pub struct PrivatePostgres {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    password: String,
    superuser_password: String,
    child: Option<Child>,
    /// The port's reservation file (see [`reserve`]).
    reservation: Option<PathBuf>,
    /// Where the current start's lines begin in the server log (which every start appends to).
    log_from: usize,
    /// How long `initdb` took.
    pub init_took: Duration,
    /// How long the last start or restart took: from spawning the postmaster until the test
    /// user's first session on this very server.
    pub start_took: Duration,
}

/// The directory of `postgres` and `initdb`: Debian's newest major version, or the PATH.
fn find_bin() -> PathBuf {
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_ROOT)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((major, e.path().join("bin")))
        })
        .collect();
    majors.sort();
    let path = std::env::var_os("PATH").unwrap_or_default();
    majors
        .into_iter()
        .rev()
        .map(|(_, bin)| bin)
        .chain(std::env::split_paths(&path))
        .find(|dir| dir.join("postgres").is_file() && dir.join("initdb").is_file())
        .unwrap_or_else(|| {
            panic!("no PostgreSQL server binaries (`postgres`, `initdb`) in {DEBIAN_ROOT}/*/bin or on the PATH: {HINT}")
        })
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A random number, different in every process and every call.
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

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pids of the processes whose parent is `parent` and that have not exited (zombies
/// excluded), read from `/proc`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((state, ppid)) = state_and_parent(pid) {
            if ppid == parent && !matches!(state, 'Z' | 'X') {
                found.push(pid);
            }
        }
    }
    found
}

/// A process's state letter and parent pid (`/proc/<pid>/stat`), if it still exists.
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces or ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` is gone, or a zombie (which holds no memory and no sockets).
fn exited(pid: u32) -> bool {
    state_and_parent(pid).is_none_or(|(state, _)| matches!(state, 'Z' | 'X'))
}

/// Sends `signal` (`STOP`, `KILL`, …) to `pid`; a process that has exited meanwhile is fine.
fn send(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Removes the directories of private servers whose test process has died without dropping
/// them (killed by a timeout), unless their postmaster still runs.
fn remove_stale_dirs() {
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(owner) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid_alive(owner) {
            continue;
        }
        let postmaster = std::fs::read_to_string(entry.path().join("data/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()));
        if postmaster.is_some_and(|pid| !exited(pid)) {
            continue;
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// Reserves `port` among the private PostgreSQL servers of every test process, with a file in
/// the temp dir naming the reserving process: a server that is down (killed, before its
/// restart) keeps its port, which another test would otherwise find free and take. A
/// reservation of a process that has died is taken over.
fn reserve(port: u16) -> Option<PathBuf> {
    let file = std::env::temp_dir().join(format!("{DIR_PREFIX}port-{port}"));
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
        {
            Ok(mut f) => {
                std::io::Write::write_all(&mut f, std::process::id().to_string().as_bytes())
                    .ok()?;
                return Some(file);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                match holder {
                    Some(pid) if pid_alive(pid) => return None,
                    // Dead, or being written just now (then the next create fails again).
                    _ => {
                        let _ = std::fs::remove_file(&file);
                    }
                }
            }
            Err(_) => return None,
        }
    }
    None
}

impl PrivatePostgres {
    /// Creates a cluster in a fresh directory, starts it on a free port in 23100-23199, creates
    /// the test user and database, and says how long that took on stderr. Panics (with the way
    /// to install PostgreSQL) if the server binaries are missing.
    pub async fn start() -> Self {
        let bin = find_bin();
        remove_stale_dirs();
        let salt = salt();
        let dir = std::env::temp_dir().join(format!(
            "{DIR_PREFIX}{}-{:08x}",
            std::process::id(),
            salt & 0xffff_ffff
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the private server's directory");
        let mut server = Self {
            port: 0,
            dir,
            bin,
            password: format!("pw{:x}", (salt >> 8) & 0xff_ffff_ffff),
            superuser_password: format!("su{:x}", salt >> 24),
            child: None,
            reservation: None,
            log_from: 0,
            init_took: Duration::ZERO,
            start_took: Duration::ZERO,
        };
        // From here on, a panic drops `server`, which removes the directory.
        server.init_cluster().await;
        for port in distlock_conformance::free_ports(PORTS) {
            let Some(reservation) = reserve(port) else {
                continue;
            };
            server.port = port;
            server.reservation = Some(reservation);
            match server.spawn_and_wait().await {
                Ok(took) => {
                    server.start_took = took;
                    server.create_user_and_database().await;
                    eprintln!(
                        "private PostgreSQL on port {port} ({}): initdb {} ms, start {} ms",
                        server.bin.display(),
                        server.init_took.as_millis(),
                        took.as_millis()
                    );
                    return server;
                }
                Err(why) if why.contains("already in use") => {
                    if let Some(file) = server.reservation.take() {
                        let _ = std::fs::remove_file(file);
                    }
                }
                Err(why) => panic!("the private PostgreSQL server did not start: {why}"),
            }
        }
        panic!("no free port in {PORTS:?} for a private PostgreSQL server")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// `initdb` with a superuser password and password authentication for every connection.
    async fn init_cluster(&mut self) {
        let started = Instant::now();
        let pwfile = self.dir.join("superuser.pw");
        std::fs::write(&pwfile, format!("{}\n", self.superuser_password)).expect("write pwfile");
        let root = is_root();
        if root {
            // The server refuses to run as root: everything of it belongs to `postgres`.
            let status = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(&self.dir)
                .status();
            match status {
                Ok(s) if s.success() => {}
                other => panic!(
                    "cannot give {} to the `postgres` user ({other:?}): {HINT}",
                    self.dir.display()
                ),
            }
        }
        let mut cmd = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(self.bin.join("initdb"));
            c
        } else {
            Command::new(self.bin.join("initdb"))
        };
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-U", SUPERUSER, "--auth=scram-sha-256", "--pwfile"])
            .arg(&pwfile)
            // Nothing of a throw-away cluster needs to survive an OS crash.
            .args(["-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"]);
        let log_path = self.dir.join("initdb.log");
        let log = std::fs::File::create(&log_path).expect("initdb log");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("initdb log"))
            .stderr(log);
        let status = tokio::task::spawn_blocking(move || cmd.status())
            .await
            .expect("initdb task");
        let out = std::fs::read_to_string(&log_path).unwrap_or_default();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("initdb failed ({s}):\n{out}"),
            Err(e) => panic!("cannot run initdb ({e}): {HINT}"),
        }
        let _ = std::fs::remove_file(&pwfile);
        self.init_took = started.elapsed();
    }

    /// The test user (not a superuser) and its database, made by the superuser; then a
    /// checkpoint, so that a crash recovery replays only what the test did.
    async fn create_user_and_database(&self) {
        let mut admin = PgConnection::connect_with(&self.superuser_options("postgres"))
            .await
            .expect("a superuser session on the private server");
        let create_role = format!(
            "CREATE ROLE {USER} LOGIN PASSWORD '{}'",
            self.password.replace('\'', "''")
        );
        for statement in [
            create_role,
            format!("CREATE DATABASE {DATABASE} OWNER {USER}"),
            "CHECKPOINT".to_string(),
        ] {
            sqlx::query(AssertSqlSafe(statement.clone()))
                .execute(&mut admin)
                .await
                .unwrap_or_else(|e| panic!("{statement:?} on the private server: {e}"));
        }
        let _ = admin.close().await;
    }

    /// Spawns the postmaster on the data directory and port and waits until a superuser
    /// session reaches it (and not some other server on the port). `Err` with the reason (the
    /// tail of the server's log) if the server exits first or the wait runs out.
    async fn spawn_and_wait(&mut self) -> Result<Duration, String> {
        assert!(
            self.child.is_none(),
            "the private server is already running"
        );
        self.log_from = std::fs::read(self.log_file()).map_or(0, |l| l.len());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file())
            .map_err(|e| format!("server log: {e}"))?;
        let postgres = self.bin.join("postgres");
        let mut cmd = if is_root() {
            // `setpriv` execs: the child is the postmaster, and its pid the one to signal.
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(&postgres);
            c
        } else {
            Command::new(&postgres)
        };
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            // The Unix socket (and its lock file) in the server's own directory.
            .arg("-k")
            .arg(&self.dir);
        for (name, value) in SETTINGS {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        let started = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| format!("server log: {e}"))?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {} ({e}): {HINT}", postgres.display()))?;
        self.child = Some(child);
        let options = self.superuser_options("postgres");
        let ours = self.data_dir();
        let deadline = started + START_LIMIT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                let tail = self.log_tail();
                let why = if tail.contains("Address already in use") {
                    "the port is already in use"
                } else {
                    "it exited at start"
                };
                return Err(format!(
                    "postgres on port {}: {why} ({status}):\n{tail}",
                    self.port
                ));
            }
            let attempt = tokio::time::timeout(Duration::from_secs(1), async {
                let mut conn = PgConnection::connect_with(&options).await?;
                let dir: String = sqlx::query_scalar("SHOW data_directory")
                    .fetch_one(&mut conn)
                    .await?;
                let _ = conn.close().await;
                Ok::<_, sqlx::Error>(dir)
            })
            .await;
            if let Ok(Ok(dir)) = attempt {
                if same_dir(Path::new(&dir), &ours) {
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
                    "postgres on port {} did not accept a session within {START_LIMIT:?}:\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read(self.log_file()).unwrap_or_default();
        let log = String::from_utf8_lossy(log.get(self.log_from..).unwrap_or_default());
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// The server's log since its current start began.
    pub fn log(&self) -> String {
        let log = std::fs::read(self.log_file()).unwrap_or_default();
        String::from_utf8_lossy(log.get(self.log_from..).unwrap_or_default()).into_owned()
    }

    fn superuser_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new_without_pgpass()
            .host("127.0.0.1")
            .port(self.port)
            .username(SUPERUSER)
            .password(&self.superuser_password)
            .database(database)
            .application_name("distlock-faults-admin")
    }

    /// The URL the test's clients use (`?…` parameters may be appended): the test user, who
    /// is no superuser.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{}@127.0.0.1:{}/{DATABASE}",
            self.password, self.port
        )
    }

    /// A superuser session on the test database, for what the test checks or does behind the
    /// clients' backs (`pg_locks`, `pg_terminate_backend`).
    pub async fn admin(&self) -> PgConnection {
        tokio::time::timeout(
            Duration::from_secs(5),
            PgConnection::connect_with(&self.superuser_options(DATABASE)),
        )
        .await
        .expect("a superuser session within 5 s")
        .expect("a superuser session on the private server")
    }

    /// The postmaster's pid.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("the private server is running")
            .id()
    }

    /// Stops the whole server (SIGSTOP to the postmaster, then to every process it has
    /// forked): open sessions stop answering, and new connections wait in the kernel's backlog.
    pub fn pause(&self) {
        let postmaster = self.pid();
        // Stopped first, so that it forks nobody the list below would miss.
        send(postmaster, "STOP");
        for child in children_of(postmaster) {
            send(child, "STOP");
        }
    }

    /// Resumes a server [`pause`](Self::pause) stopped.
    pub fn resume(&self) {
        let postmaster = self.pid();
        for child in children_of(postmaster) {
            send(child, "CONT");
        }
        send(postmaster, "CONT");
    }

    /// Kills the whole server with SIGKILL, as a crash or the OOM killer would (no shutdown
    /// checkpoint: the next start recovers from the WAL), reaps it, and waits until none of its
    /// processes is left. Does nothing if it is not running.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let postmaster = child.id();
        // The postmaster is stopped first, so that it forks nothing more and its children stay
        // its children (a dead parent's children are handed to init) until they are listed.
        send(postmaster, "STOP");
        let children = children_of(postmaster);
        for &pid in &children {
            send(pid, "KILL");
        }
        // SIGKILL also ends a stopped process.
        let _ = child.kill();
        let _ = child.wait();
        let deadline = Instant::now() + EXIT_LIMIT;
        while !children.iter().all(|&pid| exited(pid)) {
            if Instant::now() > deadline {
                let why = format!(
                    "the private server's processes {children:?} outlived SIGKILL by \
                     {EXIT_LIMIT:?}"
                );
                // A panic while dropping during a test's panic would abort the test process.
                if std::thread::panicking() {
                    eprintln!("{why}");
                    return;
                }
                panic!("{why}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts the server again on the same data directory and port, after [`kill`] (which it
    /// calls if the server still runs), and waits until it accepts sessions; returns how long
    /// that took (crash recovery included).
    ///
    /// [`kill`]: PrivatePostgres::kill
    pub async fn restart(&mut self) -> Duration {
        self.kill();
        let took = self
            .spawn_and_wait()
            .await
            .unwrap_or_else(|why| panic!("the private PostgreSQL server did not restart: {why}"));
        self.start_took = took;
        took
    }

    /// Kills the server and starts a new, empty cluster (a new `initdb`) on the same port,
    /// with the same users and passwords: a server that lost its data. Returns how long the
    /// start took.
    pub async fn restart_empty(&mut self) -> Duration {
        self.kill();
        let _ = std::fs::remove_dir_all(self.data_dir());
        self.init_cluster().await;
        let took = self
            .spawn_and_wait()
            .await
            .unwrap_or_else(|why| panic!("the private PostgreSQL server did not restart: {why}"));
        self.create_user_and_database().await;
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

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(file) = self.reservation.take() {
            let _ = std::fs::remove_file(file);
        }
    }
}
