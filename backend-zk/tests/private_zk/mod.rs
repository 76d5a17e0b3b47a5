//! A private, throw-away standalone ZooKeeper server for destructive tests (kill -9 and restart,
//! SIGSTOP/SIGCONT), started from the Debian `zookeeper` package the way `scripts/services`
//! starts the shared one, but on a loopback port of its own in 24000-24099, with its data in a
//! temp directory. Dropping it kills the server and removes the directory; a small reaper
//! process kills it too should the test process die without dropping it (a nextest timeout).
//! [`PrivateZk::start_tls`] adds a TLS client port (Netty connection factory, PEM keystore);
//! [`PrivateZk::start_sasl`] requires SASL DIGEST-MD5 of every client (a JAAS file of users).

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The jar `scripts/services up zookeeper` runs (Debian's `zookeeper` package); its manifest
/// names the jars it needs.
const JAR: &str = "/usr/share/java/zookeeper.jar";
const CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar";
/// The Netty connection factory (needed for a TLS port) also needs jars that the ZooKeeper
/// jar's manifest does not name; Debian's `libnetty-java` (a dependency of the `zookeeper`
/// package) has them.
const NETTY_JARS: &str = "/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar:\
                          /usr/share/java/netty-transport-native-unix-common.jar";
/// An SLF4J binding that logs to stderr (Debian's `libslf4j-java`, which the ZooKeeper library
/// package depends on). Without one the server logs nothing; the SASL variant has it, so a test
/// can read what the server said about a client.
const LOG_BINDING: &str = "/usr/share/java/slf4j-simple.jar";
const MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
const PORTS: std::ops::Range<u16> = 24000..24100;
/// The longest a start may take before the test fails: a JVM on a loaded 2-core machine.
const START_BOUND: Duration = Duration::from_secs(30);
const HOW_TO_INSTALL: &str = "run `scripts/services up zookeeper` (it installs Java and the \
                              zookeeper package), or skip with DISTLOCK_SKIP=zk";

pub(crate) struct PrivateZk {
    port: u16,
    /// The TLS client port and the PEM files it serves, if any.
    tls: Option<Tls>,
    /// The JAAS file of a server started with `start_sasl`.
    jaas: Option<PathBuf>,
    dir: PathBuf,
    server: Option<Child>,
    reaper: Option<Child>,
    /// The ports claimed for the server's whole life, restarts included (see [`claim`]).
    _claims: Vec<std::fs::File>,
}

/// Claims `port` against the private servers of the other test processes, which check the
/// same lock file before they take a free port: a server that is down for a restart leaves its
/// port free to bind but claimed. The OS lets go of the lock when the process ends.
fn claim(port: u16) -> Option<std::fs::File> {
    let path = std::env::temp_dir().join(format!("distlock-zk-private-port-{port}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    file.try_lock().ok()?;
    Some(file)
}

/// A TLS client port: its number, the server's key and certificate chain in one PEM file
/// (ZooKeeper's PEM keystore), and the CA file it trusts.
struct Tls {
    port: u16,
    keystore: PathBuf,
    ca: PathBuf,
}

impl PrivateZk {
    /// Starts a fresh server and waits until it serves requests. Panics (never skips) when
    /// Java or the ZooKeeper jar is missing, saying how to install them.
    pub(crate) fn start() -> Self {
        Self::start_with(None, &[])
    }

    /// Like [`start`](Self::start), with a TLS client port too, serving the certificate of
    /// `certs` (key and certificate as PEM files, trusting its CA): the Netty connection
    /// factory, `secureClientPort` and the `ssl.*` settings, with client certificates not
    /// asked for. The plain port stays open for the readiness check.
    pub(crate) fn start_tls(certs: &distlock_conformance::tls::TestCerts) -> Self {
        Self::start_with(Some(certs), &[])
    }

    /// Like [`start`](Self::start), with SASL required of every client: the
    /// `SASLAuthenticationProvider`, `sessionRequireClientSASLAuth=true`, and a JAAS `Server`
    /// section (`DigestLoginModule`) that knows `users` (name, password), for DIGEST-MD5.
    pub(crate) fn start_sasl(users: &[(&str, &str)]) -> Self {
        assert!(!users.is_empty(), "a SASL server needs a user");
        Self::start_with(None, users)
    }

    fn start_with(
        certs: Option<&distlock_conformance::tls::TestCerts>,
        sasl_users: &[(&str, &str)],
    ) -> Self {
        check_installed();
        let dir = std::env::temp_dir().join(format!(
            "distlock-zk-private-{}-{:08x}",
            std::process::id(),
            distlock_conformance::unique_suffix()
        ));
        std::fs::create_dir_all(dir.join("data")).expect("private ZooKeeper's temp dir");
        let tls = certs.map(|certs| {
            let keystore = dir.join("server-keystore.pem");
            let mut pem = std::fs::read(certs.key()).expect("read the server key");
            pem.extend(std::fs::read(certs.cert()).expect("read the server certificate"));
            std::fs::write(&keystore, pem).expect("write the PEM keystore");
            Tls {
                port: 0,
                keystore,
                ca: certs.ca(),
            }
        });
        let jaas = (!sasl_users.is_empty()).then(|| {
            let jaas = dir.join("jaas.conf");
            std::fs::write(&jaas, jaas_server_section(sasl_users)).expect("write the JAAS file");
            jaas
        });
        let mut zk = Self {
            port: 0,
            tls,
            jaas,
            dir,
            server: None,
            reaper: None,
            _claims: Vec::new(),
        };
        // Another test may take the port between our bind check and the server's bind: then our
        // server exits and the next free port is tried.
        let mut tried = Vec::new();
        for port in distlock_conformance::free_ports(PORTS) {
            let Some(claimed) = claim(port) else {
                continue;
            };
            zk._claims = vec![claimed];
            zk.port = port;
            if let Some(tls) = &mut zk.tls {
                let (tls_port, claimed) = distlock_conformance::free_ports(PORTS)
                    .filter(|&p| p != port)
                    .find_map(|p| claim(p).map(|c| (p, c)))
                    .expect("a second free port for TLS");
                tls.port = tls_port;
                zk._claims.push(claimed);
            }
            zk.write_config();
            match zk.spawn() {
                Ok(took) => {
                    eprintln!(
                        "private ZooKeeper on 127.0.0.1:{port} started in {} ms",
                        took.as_millis()
                    );
                    return zk;
                }
                // Lost the port to another server: try the next one.
                Err(Failed::PortTaken(e)) if tried.len() < 3 => tried.push(format!("{port}: {e}")),
                Err(Failed::PortTaken(e) | Failed::NotServing(e)) => {
                    tried.push(format!("{port}: {e}"));
                    break;
                }
            }
        }
        panic!(
            "could not start a private ZooKeeper in ports {PORTS:?}: {tried:?}\n{}",
            zk.log_tail()
        );
    }

    /// `host:port` of the server.
    pub(crate) fn hosts(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A `zk://` URL of the server.
    pub(crate) fn url(&self) -> String {
        format!("zk://{}", self.hosts())
    }

    /// `host:port` of the TLS client port (of a server started with `start_tls`).
    pub(crate) fn tls_hosts(&self) -> String {
        let tls = self.tls.as_ref().expect("a server started with start_tls");
        format!("127.0.0.1:{}", tls.port)
    }

    /// The server's process id, while it runs.
    pub(crate) fn pid(&self) -> u32 {
        self.server.as_ref().expect("server running").id()
    }

    /// Kills the server with SIGKILL, as a crash or an OOM killer does: nothing is flushed or
    /// closed. Its data directory (snapshots and transaction log) stays for a restart.
    pub(crate) fn kill(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        if let Some(mut reaper) = self.reaper.take() {
            let _ = reaper.kill();
            let _ = reaper.wait();
        }
    }

    /// Starts the server again on the same port and data directory; how long until it served
    /// requests again.
    pub(crate) fn restart(&mut self) -> Duration {
        assert!(self.server.is_none(), "restart a killed server only");
        self.spawn().unwrap_or_else(|e| {
            panic!(
                "the private ZooKeeper did not come back on {}: {}\n{}",
                self.hosts(),
                e.message(),
                self.log_tail()
            )
        })
    }

    /// Freezes the server (SIGSTOP): the kernel still accepts connections and buffers requests,
    /// but nothing answers, and its clock-driven work (session expiry) stops, as in a long GC
    /// pause or a hung VM.
    pub(crate) fn pause(&self) {
        self.signal("STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub(crate) fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, signal: &str) {
        distlock_conformance::send_signal(self.pid(), signal);
    }

    fn write_config(&self) {
        // The shared server's settings (scripts/services): a 200 ms tick allows session
        // timeouts from 400 ms, and the maximum is raised so a test may ask for long ones.
        let mut config = format!(
            "tickTime=200\n\
             dataDir={data}\n\
             clientPort={port}\n\
             clientPortAddress=127.0.0.1\n\
             maxSessionTimeout=60000\n\
             maxClientCnxns=0\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=srvr,conf\n",
            data = self.dir.join("data").display(),
            port = self.port,
        );
        if let Some(tls) = &self.tls {
            // Keys the server does not know become `zookeeper.<key>` system properties,
            // which is where the connection factory and the ssl.* settings are read.
            config.push_str(&format!(
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 secureClientPort={port}\n\
                 secureClientPortAddress=127.0.0.1\n\
                 ssl.keyStore.location={keystore}\n\
                 ssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={ca}\n\
                 ssl.trustStore.type=PEM\n\
                 ssl.clientAuth=none\n",
                port = tls.port,
                keystore = tls.keystore.display(),
                ca = tls.ca.display(),
            ));
        }
        if self.jaas.is_some() {
            // `sessionRequireClientSASLAuth` (a system property, as unknown keys become) makes
            // the server close, with SESSIONCLOSEDREQUIRESASLAUTH, any session that sends a
            // request before it has authenticated with SASL.
            config.push_str(
                "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n\
                 sessionRequireClientSASLAuth=true\n",
            );
        }
        std::fs::write(self.dir.join("zoo.cfg"), config).expect("write zoo.cfg");
    }

    /// Starts the server process and waits (bounded) until it serves requests and is ours.
    fn spawn(&mut self) -> Result<Duration, Failed> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .expect("the private server's log file");
        let log2 = log.try_clone().expect("the private server's log file");
        let started = Instant::now();
        let mut server = Command::new("java")
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg(format!("-Dzookeeper.log.dir={}", self.dir.display()))
            // A 1 MB transaction log preallocation instead of 64 MB: disk space is scarce.
            .arg("-Dzookeeper.preAllocSize=1024")
            .arg("-Dznode.container.checkIntervalMs=1000")
            .args(
                (self.jaas.iter())
                    .map(|jaas| format!("-Djava.security.auth.login.config={}", jaas.display())),
            )
            .arg("-cp")
            .arg(match (&self.tls, &self.jaas) {
                (Some(_), _) => format!("{CLASSPATH}:{NETTY_JARS}"),
                (None, Some(_)) => format!("{CLASSPATH}:{LOG_BINDING}"),
                (None, None) => CLASSPATH.to_string(),
            })
            .arg(MAIN)
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run java ({e}): {HOW_TO_INSTALL}"));
        let pid = server.id();
        self.reaper = Some(spawn_reaper(pid, &self.dir));
        let outcome = self.wait_serving(&mut server, started);
        self.server = Some(server);
        if outcome.is_err() {
            self.kill();
        }
        outcome
    }

    fn wait_serving(&self, server: &mut Child, started: Instant) -> Result<Duration, Failed> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            if let Ok(Some(status)) = server.try_wait() {
                return Err(Failed::PortTaken(format!(
                    "the server exited at start ({status}); port taken?"
                )));
            }
            // The port opens before the database is loaded; `srvr` says when it serves.
            if ask(addr, "srvr").is_some_and(|a| a.starts_with("Zookeeper version")) {
                let took = started.elapsed();
                // The server answering must be ours (same data directory), not another test's
                // that took the port first.
                let conf = ask(addr, "conf").unwrap_or_default();
                let data = self.dir.join("data");
                if !conf.contains(&*data.to_string_lossy()) {
                    return Err(Failed::PortTaken(format!(
                        "port {} is served by another server",
                        self.port
                    )));
                }
                return Ok(took);
            }
            if started.elapsed() > START_BOUND {
                return Err(Failed::NotServing(format!(
                    "not serving after {START_BOUND:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's output so far, for a test that checks what the server said about a client
    /// (only a server started with `start_sasl` logs: see [`LOG_BINDING`]).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("server output (last lines):\n{tail}")
    }
}

/// Why a server did not start.
enum Failed {
    /// It exited, or another server answers on its port: another port may work.
    PortTaken(String),
    /// It runs but did not serve in time.
    NotServing(String),
}

impl Failed {
    fn message(&self) -> &str {
        match self {
            Failed::PortTaken(m) | Failed::NotServing(m) => m,
        }
    }
}

impl Drop for PrivateZk {
    fn drop(&mut self) {
        // SIGKILL works on a paused (SIGSTOPped) server too.
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The JAAS `Server` section of a SASL server: DIGEST-MD5 users as `user_<name>="<password>"`.
fn jaas_server_section(users: &[(&str, &str)]) -> String {
    let mut section =
        String::from("Server {\n    org.apache.zookeeper.server.auth.DigestLoginModule required");
    for (user, password) in users {
        assert!(
            !format!("{user}{password}").contains(['"', '\\', ' ', '=', ';']),
            "keep test users and passwords plain: {user:?}"
        );
        section.push_str(&format!("\n    user_{user}=\"{password}\""));
    }
    section.push_str(";\n};\n");
    section
}

/// Java and the ZooKeeper jar must be installed: a missing one fails the test with how to
/// install it.
fn check_installed() {
    let java = Command::new("java")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        java.is_ok_and(|s| s.success()),
        "no working `java` on PATH for the private ZooKeeper server: {HOW_TO_INSTALL}"
    );
    assert!(
        Path::new(JAR).exists(),
        "no ZooKeeper server jar at {JAR}: {HOW_TO_INSTALL}"
    );
}

/// A process that kills the server and removes its directory once this test process is gone,
/// so that a test killed by a timeout leaves no JVM (perhaps a SIGSTOPped one) behind.
fn spawn_reaper(server: u32, dir: &Path) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(
            r#"while kill -0 "$1" 2>/dev/null; do sleep 1; done
               kill -9 "$2" 2>/dev/null; sleep 0.2; rm -rf "$3""#,
        )
        .arg("distlock-zk-reaper")
        .arg(std::process::id().to_string())
        .arg(server.to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the reaper shell")
}

/// Sends a four-letter command; the answer, if one came soon. Short timeouts, so that polling
/// a server that is still starting notices soon when it serves.
fn ask(addr: SocketAddr, command: &str) -> Option<String> {
    let limit = Duration::from_millis(250);
    let mut s = TcpStream::connect_timeout(&addr, limit).ok()?;
    s.set_read_timeout(Some(limit)).ok()?;
    s.set_write_timeout(Some(limit)).ok()?;
    s.write_all(command.as_bytes()).ok()?;
    let _ = s.shutdown(Shutdown::Write);
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    Some(answer)
}
