//! Fencing tokens keep increasing for one name across release, expiry, takeover, reentrancy,
//! owner changes and a server restart; the lock document is never deleted; and nothing is left
//! owning a lock afterwards.
//!
//! Uses the server at `DISTLOCK_MONGO_URL` (default `mongodb://127.0.0.1:27017`), except the
//! restart test, which starts a private `secantusd-rs` on a port of its own.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_mongo::mongodb::bson::{doc, Bson, Document};
use distlock_mongo::{
    fields, DistributedLock, ErrorKind, FencingToken, LockExt, LockOptions, MongoConfig, MongoLock,
    OwnerId,
};
use futures::TryStreamExt;

fn url() -> String {
    distlock_mongo::DESCRIPTOR.test_url()
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{:08x}-",
        std::process::id(),
        distlock_conformance::unique_suffix()
    )
}

async fn client(url: &str, owner: &str) -> Arc<MongoLock> {
    let config = MongoConfig::from_url(url)
        .unwrap()
        .owner(OwnerId::new(owner).unwrap())
        .connect_timeout(Duration::from_secs(5));
    match MongoLock::connect(config).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("{e}\n  start the server: scripts/services up"),
    }
}

/// The lock documents whose `_id` starts with `prefix`.
async fn documents(lock: &MongoLock, prefix: &str) -> Vec<Document> {
    lock.collection()
        .find(doc! { "_id": { "$regex": common::prefix_regex(prefix) } })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_over_fifty_grants_across_release_expiry_and_takeover() {
    let url = url();
    let prefix = unique("fencing");
    let name = format!("{prefix}one");
    let clients = [
        client(&url, "fence-a").await,
        client(&url, "fence-b").await,
        client(&url, "fence-c").await,
    ];
    let short = Duration::from_millis(150);
    let mut last = FencingToken(0);
    let mut expired_takeovers = 0;
    for i in 0..50 {
        let c = &clients[i % clients.len()];
        let started = Instant::now();
        // Waits out the previous holder's lease when that one was abandoned.
        let g = c
            .lock_with(
                &name,
                &LockOptions::new().ttl(short).wait(Duration::from_secs(10)),
            )
            .await
            .unwrap_or_else(|e| panic!("grant {i}: {e}"));
        assert!(
            g.token() > last,
            "grant {i}: token {} after {last}",
            g.token()
        );
        assert_eq!(g.hold_count(), 1, "grant {i}");
        assert_eq!(g.owner().label(), c.core().owner().label());
        last = g.token();
        match i % 3 {
            // Released normally.
            0 => assert!(g.release().await.unwrap(), "grant {i} lost before release"),
            // Reentrant: a second hold joins the grant with the same token, then both go.
            1 => {
                let again = g
                    .reenter_with(&LockOptions::new().ttl(short))
                    .await
                    .expect("reentrant acquire");
                assert_eq!(again.token(), g.token(), "grant {i}: reentrant token");
                assert_eq!(again.hold_count(), 2);
                assert!(again.release().await.unwrap());
                assert!(g.release().await.unwrap(), "grant {i} lost before release");
            }
            // Abandoned: the holder vanishes without releasing (its guard is leaked, so not
            // even the background release runs); the next owner takes over after expiry.
            _ => {
                if i > 2 {
                    expired_takeovers += 1;
                }
                std::mem::forget(g);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "grant {i} slow"
        );
    }
    // The 50th grant (i = 49) was released, so the lock is free now.
    assert!(expired_takeovers >= 15, "{expired_takeovers} takeovers");
    let docs = documents(&clients[0], &prefix).await;
    assert_eq!(
        docs.len(),
        1,
        "the lock document must never be deleted: {docs:?}"
    );
    let doc = &docs[0];
    assert_eq!(
        doc.get_i64(fields::TOKEN).ok(),
        Some(last.0 as i64),
        "{doc}"
    );
    assert_eq!(doc.get(fields::OWNER), Some(&Bson::Null), "{doc}");
    assert_eq!(doc.get_i64(fields::COUNT).ok(), Some(0), "{doc}");
    assert!(clients[0].holder(&name).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_holder_and_a_stale_release_do_not_reset_or_reuse_tokens() {
    let url = url();
    let prefix = unique("fencing-stale");
    let name = format!("{prefix}x");
    let (a, b) = (client(&url, "stale-a").await, client(&url, "stale-b").await);
    let first = a.try_lock(&name).await.unwrap().expect("free");
    let stale = first.grant().clone();
    // An operator clears the holder behind its back (keeping the document).
    a.collection()
        .update_one(
            doc! { "_id": &name },
            doc! { "$set": { fields::OWNER: Bson::Null, fields::COUNT: 0_i64, fields::EXPIRES_AT: Bson::Null } },
        )
        .await
        .unwrap();
    let second = b
        .try_lock(&name)
        .await
        .unwrap()
        .expect("freed by the operator");
    assert!(second.token() > stale.token);
    // The stale grant can neither release nor renew the newer holder's lock.
    assert!(!a.release(&stale).await.unwrap());
    assert_eq!(
        a.renew(&stale, Duration::from_secs(5))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Lost
    );
    assert_eq!(
        a.holder(&name).await.unwrap().map(|i| i.owner),
        Some(second.owner().clone())
    );
    std::mem::forget(first);
    let t2 = second.token();
    assert!(second.release().await.unwrap());
    let third = a.try_lock(&name).await.unwrap().expect("free");
    assert!(third.token() > t2);
    assert!(third.release().await.unwrap());
    assert_no_owner(&a, &prefix).await;
}

/// After everything above released: no document of the run names an owner. An expired owner
/// counts too: the release of a guard that outlived its lease clears it.
async fn assert_no_owner(lock: &MongoLock, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let owned: Vec<_> = documents(lock, prefix)
            .await
            .into_iter()
            .filter(|d| !matches!(d.get(fields::OWNER), None | Some(Bson::Null)))
            .collect();
        if owned.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "documents still owned: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Durability across a restart, on a private server.

/// A `secantusd-rs` of this test's own on a free port in 20000-20999, with its data in a temp
/// directory; stopped (SIGTERM, then SIGKILL) when dropped.
struct PrivateServer {
    child: Option<std::process::Child>,
    port: u16,
    dir: PathBuf,
    exe: PathBuf,
}

impl PrivateServer {
    fn exe() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("SECANTUSD") {
            return Some(PathBuf::from(p));
        }
        let home = std::env::var("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cargo")))
            .ok()?;
        let p = home.join("bin").join("secantusd-rs");
        p.exists().then_some(p)
    }

    fn start(exe: PathBuf) -> Self {
        let port = distlock_conformance::free_ports(20000..21000)
            .next()
            .expect("a free port in 20000-20999");
        let dir = std::env::temp_dir().join(format!(
            "distlock-mongo-restart-{port}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            child: None,
            port,
            dir,
            exe,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = std::process::Command::new(&self.exe)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--storage-path")
            .arg(self.dir.join("data"))
            .args(["--cache-size", "64M", "--log-file-max", "16MB"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start secantusd-rs");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "private server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A clean stop (SIGTERM), as a restart by an operator or an init system does.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn url(&self) -> String {
        format!("mongodb://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_server_restart() {
    if distlock_conformance::skipped_by_env("mongo") {
        eprintln!(
            "SKIPPING tokens_keep_increasing_across_a_server_restart: DISTLOCK_SKIP names mongo"
        );
        return;
    }
    let exe = PrivateServer::exe().expect(
        "no secantusd-rs to restart: run scripts/services up (it installs it), set SECANTUSD, \
         or skip with DISTLOCK_SKIP=mongo",
    );
    let mut server = PrivateServer::start(exe);
    let url = server.url();
    let name = "restart-fencing";
    let before = {
        let c = client(&url, "before-restart").await;
        let mut last = FencingToken(0);
        for _ in 0..5 {
            let g = c.try_lock(name).await.unwrap().expect("free");
            assert!(g.token() > last);
            last = g.token();
            assert!(g.release().await.unwrap());
        }
        // Leaves a holder behind, as a crashed client would, to be taken over after restart.
        let g = c
            .try_lock_with(name, &LockOptions::new().ttl(Duration::from_millis(300)))
            .await
            .unwrap()
            .expect("free");
        let t = g.token();
        std::mem::forget(g);
        t
    };
    server.stop();
    server.spawn();
    let c = client(&url, "after-restart").await;
    let g = c
        .lock(name, Duration::from_secs(10))
        .await
        .expect("the abandoned lease expires after the restart");
    assert!(
        g.token() > before,
        "token {} after a restart, but {before} was issued before it",
        g.token()
    );
    assert!(g.release().await.unwrap());
    drop(c);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_renewal_confirms_each_grant_by_its_own_token() {
    let url = url();
    let prefix = unique("fencing-batch");
    let a = client(&url, "batch-a").await;
    let names: Vec<String> = ["kept", "reissued", "freed"]
        .iter()
        .map(|n| format!("{prefix}{n}"))
        .collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(a.try_lock(name).await.unwrap().expect("free"));
    }
    let kept_until = |docs: &[Document]| {
        docs.iter()
            .find(|d| d.get_str("_id") == Ok(names[0].as_str()))
            .and_then(|d| d.get_datetime(fields::EXPIRES_AT).ok().copied())
            .expect("the kept lock has an expiry")
    };
    let before = kept_until(&documents(&a, &prefix).await);
    // Behind the guards' backs: "reissued" now carries a newer grant of the same owner (as if
    // it had been freed and taken again by this client), and "freed" has no holder.
    a.collection()
        .update_one(
            doc! { "_id": &names[1] },
            doc! { "$inc": { fields::TOKEN: 1_i64 } },
        )
        .await
        .unwrap();
    a.collection()
        .update_one(
            doc! { "_id": &names[2] },
            doc! { "$set": { fields::OWNER: Bson::Null, fields::COUNT: 0_i64, fields::EXPIRES_AT: Bson::Null } },
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Longer than the 30 s the locks were taken with, so the kept one's expiry moves later.
    let ttl = Duration::from_secs(60);
    assert!(a.profile().renew_batch > 1, "the backend renews in batches");
    let batch: Vec<_> = guards.iter().map(|g| (g.grant().clone(), ttl)).collect();
    let results = a.renew_many(&batch).await;
    assert_eq!(results.len(), 3);
    assert_eq!(
        results[0].as_ref().ok(),
        Some(&ttl),
        "kept: {:?}",
        results[0]
    );
    for (name, result) in names.iter().zip(&results).skip(1) {
        assert_eq!(
            result.as_ref().map_err(|e| e.kind()),
            Err(ErrorKind::Lost),
            "{name}: a grant that no longer holds its lock is not renewed"
        );
    }
    let after = kept_until(&documents(&a, &prefix).await);
    assert!(
        after > before,
        "the kept lock's lease was extended: {before} -> {after}"
    );
    let mut guards = guards.into_iter();
    assert!(guards.next().unwrap().release().await.unwrap());
    for g in guards {
        let name = g.name().clone();
        assert!(
            !g.release().await.unwrap(),
            "{name}: released a lock it had lost"
        );
    }
    // "reissued" still names our owner under the newer token; clear it like its holder would.
    a.collection()
        .update_one(
            doc! { "_id": &names[1] },
            doc! { "$set": { fields::OWNER: Bson::Null, fields::COUNT: 0_i64, fields::EXPIRES_AT: Bson::Null } },
        )
        .await
        .unwrap();
    assert_no_owner(&a, &prefix).await;
}
