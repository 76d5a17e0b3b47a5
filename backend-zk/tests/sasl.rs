//! SASL DIGEST-MD5 authentication (feature `sasl`: `ZkConfig::sasl_digest_md5`,
//! `zk://user:password@…?sasl=digest-md5`) against a private server of the test's own that
//! requires SASL of every client (`sessionRequireClientSASLAuth=true`, a JAAS `Server` section
//! with two users):
//!
//! - clients made from the setter and from a URL lock and exclude each other; the nodes they
//!   create are creator-only for `sasl:<user>` (read back with a raw SASL session); a config
//!   with digest credentials too grants its nodes to both identities; a session that replaces
//!   a closed one authenticates again;
//! - a client of the other (valid) user can neither queue on a held lock nor delete its
//!   holder's node: `NoAuth`, at once;
//! - a wrong password or an unknown user fails `connect` with a `Backend` error that says SASL
//!   authentication failed, within a bound, not a hang;
//! - a client without SASL (with digest credentials or none) is refused by the server: it
//!   closes the session with SESSIONCLOSEDREQUIRESASLAUTH at the first request, which
//!   `connect` reports as a `Backend` error saying the server wants SASL.
#![cfg(feature = "sasl")]

mod private_zk;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::given::{excludes_both_ways, skip_printed, unique_name};
use distlock_zk::zookeeper_client as zk;
use distlock_zk::{Error, ErrorKind, LockExt, NodeAcl, ZkConfig, ZkLock};
use private_zk::PrivateZk;
use tokio::task::block_in_place;

const USER: &str = "distlock-app";
const PASSWORD: &str = "right-pw";
/// A second user the server knows: valid credentials, another identity.
const OTHER_USER: &str = "distlock-other";
const OTHER_PASSWORD: &str = "other-pw";
const CONNECT: Duration = Duration::from_secs(3);
/// A bound on each step: a refusal must come within it, never as a hang.
const BOUND: Duration = Duration::from_secs(10);

fn start_server() -> PrivateZk {
    block_in_place(|| PrivateZk::start_sasl(&[(USER, PASSWORD), (OTHER_USER, OTHER_PASSWORD)]))
}

async fn connect(config: ZkConfig) -> Arc<ZkLock> {
    Arc::new(
        tokio::time::timeout(BOUND, ZkLock::connect(config))
            .await
            .expect("connect within the bound")
            .expect("a SASL session"),
    )
}

/// `connect` must fail, within the bound.
async fn refused(config: ZkConfig, who: &str) -> Error {
    let started = Instant::now();
    let outcome = tokio::time::timeout(BOUND, ZkLock::connect(config))
        .await
        .unwrap_or_else(|_| panic!("{who}: connect hung past {BOUND:?}"));
    let Err(e) = outcome else {
        panic!("{who}: the server must refuse the session")
    };
    eprintln!(
        "{who}: refused after {} ms with: {e}",
        started.elapsed().as_millis()
    );
    assert!(started.elapsed() < BOUND, "{who}: {:?}", started.elapsed());
    e
}

/// A raw session of the driver that authenticated with SASL as `user`.
async fn raw_session(hosts: &str, user: &'static str, password: &'static str) -> zk::Client {
    let connect = zk::Client::connector()
        .with_sasl(zk::SaslOptions::digest_md5(user, password))
        .with_session_timeout(Duration::from_secs(5))
        .connect(hosts);
    tokio::time::timeout(BOUND, connect)
        .await
        .expect("a raw SASL session within the bound")
        .expect("a raw SASL session")
}

/// The creator-only ACL of `USER` through SASL: every permission for `sasl:USER`, nothing
/// else.
fn sasl_creator_only() -> Vec<zk::Acl> {
    vec![zk::Acl::new(
        zk::Permission::ALL,
        zk::AuthId::new("sasl", USER),
    )]
}

/// The path of the one queue node under the lock node `dir`.
async fn only_queue_node(raw: &zk::Client, dir: &str) -> String {
    let queue = raw.list_children(dir).await.expect("list the queue");
    assert_eq!(queue.len(), 1, "{queue:?}");
    format!("{dir}/{}", queue[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_clients_lock_with_a_creator_only_acl_that_another_user_cannot_break() {
    if skip_printed("zk") {
        return;
    }
    let mut server = start_server();
    let hosts = server.hosts();
    let base = format!("/{}", unique_name("distlock-sasl"));

    let by_setter = ZkConfig::new(&hosts)
        .unwrap()
        .sasl_digest_md5(USER, PASSWORD)
        .base_path(base.clone())
        .connect_timeout(CONNECT);
    assert_eq!(by_setter.get_sasl_user(), Some(USER));
    assert_eq!(by_setter.get_digest_user(), None);
    assert_eq!(by_setter.get_node_acl(), NodeAcl::Creator);
    let by_url = ZkConfig::from_url(&format!(
        "zk://{USER}:{PASSWORD}@{hosts}?sasl=digest-md5&base_path={base}&connect_timeout=3s"
    ))
    .unwrap();
    assert_eq!(by_url.get_sasl_user(), Some(USER));
    assert_eq!(
        by_url.get_digest_user(),
        None,
        "sasl=digest-md5 makes the URL's credentials SASL ones"
    );
    assert_eq!(by_url.get_node_acl(), NodeAcl::Creator);
    let by_setter = connect(by_setter).await;
    let by_url = connect(by_url).await;

    // (a) Two clients with the right credentials exclude each other, both ways.
    let name = unique_name("sasl");
    excludes_both_ways(&by_url, &by_setter, &name).await;

    // The nodes they create are creator-only for the SASL identity, as a raw SASL session of
    // the same user reads them.
    let guard = by_setter
        .try_lock(&name)
        .await
        .unwrap()
        .expect("a free lock");
    let dir = by_setter.lock_path(&name).unwrap();
    let raw = raw_session(&hosts, USER, PASSWORD).await;
    let node = only_queue_node(&raw, &dir).await;
    for path in [&node, &dir, &base] {
        let (acls, _) = raw.get_acl(path).await.unwrap();
        assert_eq!(acls, sasl_creator_only(), "{path}");
    }

    // (d) The other user, with valid credentials of its own, is another identity: it can
    // neither queue on the held lock nor delete the holder's node, and is told so at once.
    let other = connect(
        ZkConfig::new(&hosts)
            .unwrap()
            .sasl_digest_md5(OTHER_USER, OTHER_PASSWORD)
            .base_path(base.clone())
            .connect_timeout(CONNECT),
    )
    .await;
    let started = Instant::now();
    let e = tokio::time::timeout(BOUND, other.try_lock(&name))
        .await
        .expect("try_lock hung")
        .expect_err("another user's try_lock");
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    assert!(!e.is_temporary(), "{e}");
    assert!(e.to_string().contains("NoAuth"), "{e}");
    let e = tokio::time::timeout(BOUND, other.lock(&name, Duration::from_secs(30)))
        .await
        .expect("lock hung")
        .expect_err("another user's lock");
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    assert!(e.to_string().contains("NoAuth"), "{e}");
    assert!(
        started.elapsed() < BOUND,
        "refused only after {:?}",
        started.elapsed()
    );
    let deleted = tokio::time::timeout(BOUND, other.client().delete(&node, None))
        .await
        .expect("delete hung");
    assert_eq!(deleted, Err(zk::Error::NoAuth));
    assert_eq!(
        other.holder(&name).await.unwrap_err().kind(),
        ErrorKind::Backend
    );
    // The holder is untouched.
    assert!(!guard.is_lost());
    assert_eq!(only_queue_node(&raw, &dir).await, node);
    let seen = by_url.holder(&name).await.unwrap().expect("still held");
    assert_eq!(seen.token, guard.token());
    assert!(guard.release().await.unwrap());

    // Digest credentials as well as SASL ones: the session has both identities, and the
    // creator ACL grants the nodes to both.
    let both = connect(
        ZkConfig::new(&hosts)
            .unwrap()
            .sasl_digest_md5(USER, PASSWORD)
            .digest_auth("digest-user", "digest-pw")
            .base_path(base.clone())
            .connect_timeout(CONNECT),
    )
    .await;
    let both_name = unique_name("sasl-and-digest");
    let guard = both
        .try_lock(&both_name)
        .await
        .unwrap()
        .expect("a free lock");
    let node = only_queue_node(&raw, &both.lock_path(&both_name).unwrap()).await;
    let (mut acls, _) = raw.get_acl(&node).await.unwrap();
    acls.sort_by(|a, b| a.scheme().cmp(b.scheme()));
    assert_eq!(acls.len(), 2, "{acls:?}");
    assert_eq!(acls[0].scheme(), "digest", "{acls:?}");
    assert!(acls[0].id().starts_with("digest-user:"), "{acls:?}");
    assert_eq!(acls[1], sasl_creator_only()[0], "{acls:?}");
    assert!(acls.iter().all(|a| a.permission() == zk::Permission::ALL));
    assert!(guard.release().await.unwrap());

    drop((by_setter, by_url, other, both, raw));

    // A session that replaces a lost one authenticates with SASL again: the server refuses a
    // session without it, and the nodes the new one creates are the user's. The session is
    // lost by stopping the server for longer than the session timeout (a thief closing it,
    // as tests/auth.rs does, loses the race with the client's reconnects here: every SASL
    // reconnect takes the session back before the thief's handshake completes).
    let short = connect(
        ZkConfig::new(&hosts)
            .unwrap()
            .sasl_digest_md5(USER, PASSWORD)
            .base_path(base.clone())
            .default_ttl(Duration::from_secs(1))
            .connect_timeout(CONNECT),
    )
    .await;
    let held = short
        .try_lock(&unique_name("sasl-lost"))
        .await
        .unwrap()
        .expect("a free lock");
    let first = short.session_id();
    let killed_at = Instant::now();
    block_in_place(|| server.kill());
    tokio::time::timeout(BOUND, held.lost())
        .await
        .expect("lost() fires once the lease is gone");
    // The guard stops trusting its lease at half the session timeout, before the session ends:
    // the driver gives the session up after 7/5 of its timeout without the server. A server
    // back before that would take the old session back, so it stays down until then.
    tokio::time::sleep_until((killed_at + Duration::from_millis(2_000)).into()).await;
    let restarted_in = block_in_place(|| server.restart());
    eprintln!("restarted in {} ms", restarted_in.as_millis());
    let replaced_by = Instant::now() + Duration::from_secs(30);
    while short.session_id() == first {
        assert!(Instant::now() < replaced_by, "no replacement session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let renewed_name = unique_name("sasl-renewed");
    let guard = tokio::time::timeout(BOUND, short.lock(&renewed_name, BOUND))
        .await
        .expect("lock in the new session hung")
        .expect("lock in the new session");
    let raw = raw_session(&hosts, USER, PASSWORD).await;
    let node = only_queue_node(&raw, &short.lock_path(&renewed_name).unwrap()).await;
    let (acls, _) = raw.get_acl(&node).await.unwrap();
    assert_eq!(
        acls,
        sasl_creator_only(),
        "queue node of the replacement session"
    );
    assert!(guard.release().await.unwrap());
    drop((held, short, raw));
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_sasl_credentials_are_refused_by_connect_within_a_bound() {
    if skip_printed("zk") {
        return;
    }
    let server = start_server();
    let hosts = server.hosts();

    // (b) A wrong password, and a user the server does not know: the SASL exchange fails, and
    // connect says so with a Backend error (retrying cannot help), not a hang or Unavailable.
    // (The unknown user's password is one no user has: ZooKeeper 3.8.0's callback handler
    // keeps the last user it looked up, so an unknown name with the password of the user who
    // authenticated last is accepted — see the crate docs.)
    for (who, user, password) in [
        ("wrong password", USER, "wrong-pw"),
        ("unknown user", "nobody", "nobody-pw"),
    ] {
        let config = ZkConfig::from_url(&format!(
            "zk://{user}:{password}@{hosts}?sasl=digest-md5&connect_timeout=3s"
        ))
        .unwrap();
        let e = refused(config, who).await;
        assert_eq!(e.kind(), ErrorKind::Backend, "{who}: {e}");
        assert!(!e.is_temporary(), "{who}: {e}");
        let message = e.to_string();
        assert!(
            message.contains("SASL authentication failed"),
            "{who}: {message}"
        );
        assert!(message.contains(&format!("{user:?}")), "{who}: {message}");
        assert!(!message.contains(password), "{who}: password in {message}");
    }

    // (c) No SASL at all, or only digest credentials: the server lets the TCP connection and
    // the session handshake through, then closes the session at its first request because it
    // has no SASL identity; connect reports that as a Backend error that points at SASL.
    for (who, config) in [
        ("no credentials", ZkConfig::new(&hosts).unwrap()),
        (
            "digest credentials only",
            ZkConfig::new(&hosts).unwrap().digest_auth(USER, PASSWORD),
        ),
    ] {
        let e = refused(config.connect_timeout(CONNECT), who).await;
        assert_eq!(e.kind(), ErrorKind::Backend, "{who}: {e}");
        assert!(!e.is_temporary(), "{who}: {e}");
        let message = e.to_string();
        assert!(message.contains("AuthFailed"), "{who}: {message}");
        assert!(message.contains("sasl=digest-md5"), "{who}: {message}");
    }
    // What the server did, in its own words: it failed both SASL exchanges, and closed the
    // sessions without a SASL identity (the first had only its `ip` one, the second `digest`
    // too).
    let log = server.log();
    let said = |words: &str| log.matches(words).count();
    assert_eq!(said("failed to SASL authenticate"), 2, "{log}");
    assert_eq!(
        said("does not match with any of the expected authentication scheme [sasl]"),
        2,
        "{log}"
    );
    drop(server);
}

#[tokio::test]
async fn sasl_url_options_are_checked_before_any_io() {
    // Port 1 on a TEST-NET address: any I/O would fail as Unavailable, not InvalidArgument.
    for (url, says) in [
        ("zk://u:p@192.0.2.1:1?sasl=gssapi", "only digest-md5"),
        ("zk://u:p@192.0.2.1:1?sasl=", "only digest-md5"),
        ("zk://192.0.2.1:1?sasl=digest-md5", "needs the credentials"),
        ("zk://u%22:p@192.0.2.1:1?sasl=digest-md5", "SASL user name"),
    ] {
        let e = ZkConfig::from_url(url).expect_err(url);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}: {e}");
        assert!(e.to_string().contains(says), "{url}: {e}");
    }
    // Unlike a digest user, a SASL user may contain ':'.
    let config = ZkConfig::from_url("zk://a%3Ab:pw@192.0.2.1:1?sasl=digest-md5").unwrap();
    assert_eq!(config.get_sasl_user(), Some("a:b"));
    let config = ZkConfig::new("192.0.2.1:1")
        .unwrap()
        .sasl_digest_md5("user", "");
    let started = Instant::now();
    let Err(e) = ZkLock::connect(config).await else {
        panic!("must be refused")
    };
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(started.elapsed() < Duration::from_secs(1));
}
