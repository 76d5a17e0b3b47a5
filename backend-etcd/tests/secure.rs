//! etcd with user/password authentication (`etcd://user:password@…`) and, with the `tls`
//! feature, TLS (a driver client given to `EtcdConfig::from_client`), each on a private etcd
//! of the test's own: locks work through them, and a client without the credentials, or
//! without trusting the server's certificate, is refused.

mod common;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_etcd::etcd_client::{Client, ConnectOptions};
use distlock_etcd::{ErrorKind, EtcdConfig, EtcdLock, LockExt};

/// One etcd member on free ports, with its data in a temp dir; killed when dropped.
struct PrivateEtcd {
    dir: PathBuf,
    port: u16,
    child: Child,
}

fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

impl PrivateEtcd {
    /// Starts it, with TLS on the client port if `tls` names a certificate and key.
    fn start(tag: &str, tls: Option<(PathBuf, PathBuf)>) -> Self {
        let bin = std::env::var("DISTLOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".to_string());
        let (port, peer) = (free_port(), free_port());
        let dir =
            std::env::temp_dir().join(format!("distlock-etcd-{tag}-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer}");
        let mut command = Command::new(&bin);
        command
            .args(["--name", "solo"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("solo={peer}")]);
        if let Some((cert, key)) = &tls {
            command
                .arg("--cert-file")
                .arg(cert)
                .arg("--key-file")
                .arg(key);
        }
        let log = std::fs::File::create(dir.join("etcd.log")).expect("log file");
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {bin:?}: {e}\n  install etcd (scripts/services up does)")
            });
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "etcd on {port} did not start; log in {dir:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { dir, port, child }
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Retries `f` while the fresh member is still electing itself.
async fn ready<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the private etcd never became ready: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_on_locks_need_the_right_credentials() {
    if common::skip() {
        return;
    }
    let server = PrivateEtcd::start("auth", None);
    let endpoint = format!("127.0.0.1:{}", server.port);
    // Turn authentication on: a root user with the root role.
    let mut admin = ready(|| async {
        let mut c = Client::connect([&endpoint], None)
            .await
            .map_err(|e| e.to_string())?;
        c.status().await.map_err(|e| e.to_string())?;
        Ok(c)
    })
    .await;
    admin.user_add("root", "s3cret", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let url = |userinfo: &str| {
        format!(
            "etcd://{userinfo}127.0.0.1:{}?default_ttl=2s&connect_timeout=3s",
            server.port
        )
    };
    let a = Arc::new(
        EtcdLock::connect(EtcdConfig::from_url(&url("root:s3cret@")).unwrap())
            .await
            .expect("the right credentials connect"),
    );
    let b = Arc::new(
        EtcdLock::connect(EtcdConfig::from_url(&url("root:s3cret@")).unwrap())
            .await
            .unwrap(),
    );
    let guard = a.try_lock("auth").await.unwrap().expect("a free lock");
    assert!(b.try_lock("auth").await.unwrap().is_none(), "held");
    assert!(guard.release().await.unwrap());
    b.try_lock("auth")
        .await
        .unwrap()
        .expect("freed")
        .release()
        .await
        .unwrap();

    // A wrong password is refused at connect (the driver authenticates first); no
    // credentials at all still get a lease (etcd checks no permission for leases) but no lock.
    let e = EtcdLock::connect(EtcdConfig::from_url(&url("root:wrong@")).unwrap())
        .await
        .expect_err("a wrong password is refused");
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    let anonymous = Arc::new(
        EtcdLock::connect(EtcdConfig::from_url(&url("")).unwrap())
            .await
            .expect("a lease needs no permission"),
    );
    let e = anonymous
        .try_lock("auth")
        .await
        .expect_err("no lock without credentials");
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    assert!(
        e.to_string().contains("permission denied") || e.to_string().contains("user name"),
        "{e}"
    );
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_given_client_that_trusts_the_ca_locks_and_one_that_does_not_is_refused() {
    use distlock_conformance::tls::TestCerts;
    use distlock_etcd::etcd_client::{Certificate, TlsOptions};

    if common::skip() {
        return;
    }
    let certs = TestCerts::new("etcd");
    let server = PrivateEtcd::start("tls", Some((certs.cert(), certs.key())));
    let endpoint = format!("https://127.0.0.1:{}", server.port);
    let trusting = || {
        ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_tls(
                TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(certs.ca_pem()))
                    .domain_name("localhost"),
            )
    };
    let connect = || async {
        let mut c = Client::connect([&endpoint], Some(trusting()))
            .await
            .map_err(|e| e.to_string())?;
        c.status().await.map_err(|e| e.to_string())?;
        Ok(c)
    };
    let a = Arc::new(
        EtcdLock::connect(
            EtcdConfig::from_client(ready(connect).await).default_ttl(common::SHORT_TTL),
        )
        .await
        .expect("a lease over TLS"),
    );
    let b = Arc::new(
        EtcdLock::connect(
            EtcdConfig::from_client(ready(connect).await).default_ttl(common::SHORT_TTL),
        )
        .await
        .unwrap(),
    );
    let guard = a.try_lock("tls").await.unwrap().expect("a free lock");
    assert!(b.try_lock("tls").await.unwrap().is_none(), "held over TLS");
    assert!(guard.release().await.unwrap());

    // A client that does not trust the test CA gets no lease.
    let untrusting = Client::connect(
        [&endpoint],
        Some(
            ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_tls(TlsOptions::new()),
        ),
    )
    .await
    .expect("the driver opens its channel lazily: the handshake comes with the first request");
    {
        let client = untrusting;
        let e = EtcdLock::connect(
            EtcdConfig::from_client(client).connect_timeout(Duration::from_secs(3)),
        )
        .await
        .expect_err("an untrusted certificate must not give a lease");
        // Reached but not trusted: not the temporary Unavailable of a server that is down.
        assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
        assert!(!e.is_temporary(), "{e}");
        assert!(e.to_string().contains("certificate"), "{e}");
    }
    // And plain text to the TLS port gets nothing either.
    let plain = EtcdConfig::from_url(&format!(
        "etcd://127.0.0.1:{}?connect_timeout=2s",
        server.port
    ))
    .unwrap();
    let e = EtcdLock::connect(plain)
        .await
        .expect_err("plain text to a TLS port");
    assert!(
        e.kind() == ErrorKind::Unavailable || e.kind() == ErrorKind::Backend,
        "{e}"
    );
}
