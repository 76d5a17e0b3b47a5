//! TLS to MongoDB through the driver's own URL options (`tls=true&tlsCAFile=…`, passed through
//! unchanged), against a private `secantusd-rs` of the test's own serving a certificate of a
//! throw-away test CA (`TestCerts`): two clients lock and exclude each other over TLS; a client
//! that trusts another CA, and one speaking plaintext to the TLS port, are refused as
//! `Unavailable` within the connect timeout.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::given::{excludes_both_ways, skip_printed, unique_name};
use distlock_conformance::tls::TestCerts;
use distlock_mongo::{ErrorKind, LockExt, MongoConfig, MongoLock};

/// Ports of this test's servers (the restart test in fencing.rs uses 20000-20999).
const PORTS: std::ops::Range<u16> = 21000..21500;
const START_BOUND: Duration = Duration::from_secs(30);
/// The connect timeout of the clients that must be refused, and a bound on their refusal.
const CONNECT: Duration = Duration::from_secs(3);
const REFUSED_WITHIN: Duration = Duration::from_secs(10);

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

/// A `secantusd-rs` with TLS on its only port, its data in a temp dir; killed when dropped.
struct TlsServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl TlsServer {
    fn start(certs: &TestCerts) -> Self {
        let exe = exe();
        let port = distlock_conformance::free_ports(PORTS)
            .next()
            .expect("a free port in 21000-21499");
        let dir = std::env::temp_dir().join(format!(
            "distlock-mongo-tls-{port}-{}-{:08x}",
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
            .args(["--cache-size", "64M", "--log-file-max", "16MB"])
            .arg("--tls-cert-file")
            .arg(certs.cert())
            .arg("--tls-key-file")
            .arg(certs.key())
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

    fn url(&self, options: &str) -> String {
        format!("mongodb://127.0.0.1:{}/?{options}", self.port)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn refused(url: &str) -> distlock_mongo::Error {
    let config = MongoConfig::from_url(url)
        .expect("a valid URL")
        .connect_timeout(CONNECT);
    let started = Instant::now();
    let Err(e) = MongoLock::connect(config).await else {
        panic!("must be refused")
    };
    eprintln!("refused after {:?}: {e}", started.elapsed());
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "refused only after {:?}",
        started.elapsed()
    );
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_the_drivers_tls_and_untrusting_or_plaintext_clients_are_refused() {
    if skip_printed("mongo") {
        return;
    }
    let certs = TestCerts::new("mongo");
    let server = tokio::task::block_in_place(|| TlsServer::start(&certs));
    let url = server.url(&format!(
        "tls=true&tlsCAFile={}&connect_timeout=10s",
        certs.ca().display()
    ));
    let a = Arc::new(
        MongoLock::connect(MongoConfig::from_url(&url).unwrap())
            .await
            .expect("a TLS connection trusting the test CA"),
    );
    let b = Arc::new(
        MongoLock::connect(MongoConfig::from_url(&url).unwrap())
            .await
            .unwrap(),
    );
    excludes_both_ways(&a, &b, &unique_name("tls")).await;
    let guard = a
        .lock(&unique_name("tls-held"), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!guard.is_lost());
    assert!(guard.release().await.unwrap());

    // Trusting another CA: the server's certificate is refused.
    let other = TestCerts::new("mongo-other");
    let e = refused(&server.url(&format!("tls=true&tlsCAFile={}", other.ca().display()))).await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Plaintext to the TLS port.
    let e = refused(&server.url("directConnection=true")).await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    drop(server);
}
