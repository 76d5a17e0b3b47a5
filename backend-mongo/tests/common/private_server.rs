//! A `secantusd-rs` of a test's own: a free port of the test's range, its data in a temp dir,
//! killed and removed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a private server may take to listen.
const START_BOUND: Duration = Duration::from_secs(30);

/// `secantusd-rs`: `$SECANTUSD`, else the one `cargo install` (and `scripts/services up mongo`)
/// put in Cargo's bin directory, else `secantusd-rs` on PATH.
fn exe() -> PathBuf {
    if let Ok(p) = std::env::var("SECANTUSD") {
        return PathBuf::from(p);
    }
    let cargo_home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    match cargo_home.map(|home| home.join("bin").join("secantusd-rs")) {
        Ok(p) if p.exists() => p,
        _ => PathBuf::from("secantusd-rs"),
    }
}

pub(crate) struct PrivateServer {
    child: Child,
    pub(crate) port: u16,
    dir: PathBuf,
}

impl PrivateServer {
    /// Starts one on a free port of `ports` with `args` besides host, port, storage and cache
    /// (e.g. `--standalone`, or TLS files), and waits until it listens.
    pub(crate) fn start(tag: &str, ports: std::ops::Range<u16>, args: &[&std::ffi::OsStr]) -> Self {
        let exe = exe();
        let port = distlock_conformance::free_ports(ports.clone())
            .next()
            .unwrap_or_else(|| panic!("a free port in {ports:?}"));
        let dir = std::env::temp_dir().join(format!(
            "distlock-mongo-{tag}-{port}-{}-{:08x}",
            std::process::id(),
            distlock_conformance::unique_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let log = std::fs::File::create(dir.join("server.log")).expect("log file");
        let log2 = log.try_clone().expect("log file");
        let child = Command::new(&exe)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--storage-path")
            .arg(dir.join("data"))
            // `j: true` honoured, as on `mongod` (SecantusDB acknowledges before its journal
            // has the write otherwise).
            .args([
                "--cache-size",
                "64M",
                "--log-file-max",
                "16MB",
                "--sync-on-commit",
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} ({e}): `scripts/services up mongo` (as root) installs \
                     secantusd-rs with `cargo install`; or set SECANTUSD, or skip with \
                     DISTLOCK_SKIP=mongo",
                    exe.display()
                )
            });
        let mut server = Self { child, port, dir };
        let deadline = Instant::now() + START_BOUND;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "secantusd-rs exited at start ({status}): {}",
                    std::fs::read_to_string(server.dir.join("server.log")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "secantusd-rs did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        // A server that lost the port to another exits instead of serving: not ours.
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("secantusd-rs exited at start ({status}); port {port} taken?");
        }
        server
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
