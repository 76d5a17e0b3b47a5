//! Digest authentication (`zk://user:password@…`, `ZkConfig::digest_auth`) against the shared
//! server (`addauth digest` needs no server configuration): locks work with the credentials,
//! the nodes the backend creates carry the creator-only ACL the docs promise, a client with
//! other credentials (or none) can neither queue on a held lock nor delete its holder's node —
//! it gets a clear `NoAuth` error at once, not a hang — and a session that replaces an expired
//! one authenticates again.
//!
//! Each test keeps its nodes under a base path of its own, which it deletes at the end (nobody
//! else could: the base path is creator-only too).

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::given::{excludes_both_ways, skip_printed, unique_name};
use distlock_zk::zookeeper_client as zk;
use distlock_zk::{ErrorKind, LockExt, NodeAcl, ZkConfig, ZkLock};

const USER: &str = "distlock-test";
const PASSWORD: &str = "right:pw";
/// A bound on each step: a refusal must come within it, never as a hang.
const BOUND: Duration = Duration::from_secs(10);

/// The shared server's URL with `user:password@` in it and `query` appended.
fn url_with(credentials: Option<(&str, &str)>, query: &str) -> String {
    let base = distlock_zk::DESCRIPTOR.test_url();
    let rest = base
        .strip_prefix("zk://")
        .expect("DISTLOCK_ZK_URL is zk://");
    let sep = if rest.contains('?') { '&' } else { '?' };
    match credentials {
        // `:` is allowed raw in the password; `%3A` is the same.
        Some((user, password)) => {
            format!(
                "zk://{user}:{}@{rest}{sep}{query}",
                password.replace(':', "%3A")
            )
        }
        None => format!("zk://{rest}{sep}{query}"),
    }
}

async fn connect(config: ZkConfig) -> Arc<ZkLock> {
    Arc::new(
        tokio::time::timeout(BOUND, ZkLock::connect(config))
            .await
            .expect("connect within the bound")
            .unwrap_or_else(|e| panic!("{e}\n  start ZooKeeper: scripts/services up zookeeper")),
    )
}

/// Checks that `acls` is the creator-only ACL of `USER`: all permissions for the digest
/// identity `USER:<base64 of the SHA-1 of user:password>`, nothing for anyone else.
fn assert_creator_only(acls: &[zk::Acl], what: &str) {
    assert_eq!(acls.len(), 1, "{what}: one ACL entry, got {acls:?}");
    let acl = &acls[0];
    assert_eq!(acl.scheme(), "digest", "{what}: {acls:?}");
    assert_eq!(acl.permission(), zk::Permission::ALL, "{what}: {acls:?}");
    let hash = acl
        .id()
        .strip_prefix(&format!("{USER}:"))
        .unwrap_or_else(|| panic!("{what}: the id is not {USER}'s: {acls:?}"));
    assert_eq!(
        hash.len(),
        28,
        "{what}: a base64 SHA-1 digest, got {hash:?}"
    );
}

/// Deletes the test's base path and whatever is left below it, with the owner's credentials.
async fn remove_tree(client: &zk::Client, path: &str) {
    if let Ok(children) = client.list_children(path).await {
        for child in children {
            Box::pin(remove_tree(client, &format!("{path}/{child}"))).await;
        }
    }
    let _ = client.delete(path, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_lock_with_a_creator_only_acl_that_other_credentials_cannot_break() {
    if skip_printed("zk") {
        return;
    }
    let base = format!("/{}", unique_name("distlock-auth"));
    let query = format!("base_path={base}");
    let config = ZkConfig::from_url(&url_with(Some((USER, PASSWORD)), &query)).unwrap();
    assert_eq!(config.get_node_acl(), NodeAcl::Creator);
    let holder = connect(config.clone()).await;
    let peer = connect(config).await;
    // Wrong password: ZooKeeper accepts any digest credentials, as another identity.
    let wrong =
        connect(ZkConfig::from_url(&url_with(Some((USER, "wrong")), &query)).unwrap()).await;
    let anonymous = connect(ZkConfig::from_url(&url_with(None, &query)).unwrap()).await;

    // Two clients with the same credentials lock and unlock, excluding each other.
    let name = unique_name("auth");
    excludes_both_ways(&holder, &peer, &name).await;

    let guard = holder.try_lock(&name).await.unwrap().expect("a free lock");
    let dir = holder.lock_path(&name).unwrap();
    let raw = holder.client();
    let queue = raw.list_children(&dir).await.unwrap();
    assert_eq!(queue.len(), 1, "{queue:?}");
    let node = format!("{dir}/{}", queue[0]);
    // The holder's queue node, the lock node and the base path are all creator-only.
    for path in [&node, &dir, &base] {
        let (acls, _) = raw.get_acl(path).await.unwrap();
        assert_creator_only(&acls, path);
    }

    for (who, client) in [("wrong password", &wrong), ("no credentials", &anonymous)] {
        // Queueing on the held lock is refused at once, with an error that says why.
        let started = Instant::now();
        let e = tokio::time::timeout(BOUND, client.try_lock(&name))
            .await
            .unwrap_or_else(|_| panic!("{who}: try_lock hung"))
            .expect_err(who);
        assert_eq!(e.kind(), ErrorKind::Backend, "{who}: {e}");
        assert!(!e.is_temporary(), "{who}: {e}");
        assert!(e.to_string().contains("NoAuth"), "{who}: {e}");
        eprintln!("{who}: try_lock refused with: {e}");
        let e = tokio::time::timeout(BOUND, client.lock(&name, Duration::from_secs(30)))
            .await
            .unwrap_or_else(|_| panic!("{who}: lock hung"))
            .expect_err(who);
        assert_eq!(e.kind(), ErrorKind::Backend, "{who}: {e}");
        assert!(e.to_string().contains("NoAuth"), "{who}: {e}");
        assert!(
            started.elapsed() < BOUND,
            "{who}: refused only after {:?}",
            started.elapsed()
        );
        // Deleting the holder's node (stealing the lock) is refused by the server.
        let deleted = tokio::time::timeout(BOUND, client.client().delete(&node, None))
            .await
            .unwrap_or_else(|_| panic!("{who}: delete hung"));
        assert_eq!(deleted, Err(zk::Error::NoAuth), "{who}");
        // Nor can it read who holds the lock.
        assert_eq!(
            client.holder(&name).await.unwrap_err().kind(),
            ErrorKind::Backend,
            "{who}"
        );
    }

    // The holder is untouched: still held, by the same node, and released normally.
    assert!(!guard.is_lost());
    assert_eq!(raw.list_children(&dir).await.unwrap(), queue);
    let seen = peer.holder(&name).await.unwrap().expect("still held");
    assert_eq!(seen.token, guard.token());
    assert!(guard.release().await.unwrap());

    drop((wrong, anonymous, peer));
    remove_tree(&raw, &base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_replaces_an_expired_one_authenticates_again() {
    if skip_printed("zk") {
        return;
    }
    let base = format!("/{}", unique_name("distlock-auth-renew"));
    let session = Duration::from_secs(1);
    let config = ZkConfig::from_url(&distlock_zk::DESCRIPTOR.test_url())
        .unwrap()
        .digest_auth(USER, PASSWORD)
        .base_path(base.clone())
        .default_ttl(session);
    let holder = connect(config.clone()).await;
    let first = holder.session_id();

    // Close the client's session behind its back: a second client attaches to it (id and
    // password) and closes it. The client may win its session back before the close lands;
    // then try again.
    let info = holder.client().session().clone();
    let closing_by = Instant::now() + Duration::from_secs(40);
    while holder.session_id() == first {
        assert!(Instant::now() < closing_by, "could not close the session");
        let attach = zk::Client::connector()
            .with_session(info.clone())
            .with_session_timeout(session)
            .connect(config.hosts());
        if let Ok(Ok(thief)) = tokio::time::timeout(session * 2, attach).await {
            drop(thief);
        }
        let replaced_by = Instant::now() + session * 4;
        while holder.session_id() == first && Instant::now() < replaced_by {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // The new session has the credentials: a creator-only create needs an authenticated
    // session (the server refuses it with InvalidAcl otherwise), and the node is the user's.
    let name = unique_name("auth-renewed");
    let guard = tokio::time::timeout(BOUND, holder.lock(&name, BOUND))
        .await
        .expect("lock in the new session hung")
        .expect("lock in the new session");
    let raw = holder.client();
    let dir = holder.lock_path(&name).unwrap();
    let queue = raw.list_children(&dir).await.unwrap();
    let (acls, _) = raw.get_acl(&format!("{dir}/{}", queue[0])).await.unwrap();
    assert_creator_only(&acls, "queue node made in the replacement session");
    assert!(guard.release().await.unwrap());
    remove_tree(&raw, &base).await;
}

#[tokio::test]
async fn bad_credentials_are_invalid_argument_before_any_io() {
    // Port 1 on a TEST-NET address: any I/O would fail as Unavailable, not InvalidArgument.
    for url in [
        "zk://user@192.0.2.1:1",
        "zk://:pw@192.0.2.1:1",
        "zk://user:@192.0.2.1:1",
        "zk://a%3Ab:pw@192.0.2.1:1",
        "zk://192.0.2.1:1?acl=creator",
    ] {
        let e = ZkConfig::from_url(url).expect_err(url);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}: {e}");
    }
    let config = ZkConfig::new("192.0.2.1:1")
        .unwrap()
        .digest_auth("user", "");
    let started = Instant::now();
    let Err(e) = ZkLock::connect(config).await else {
        panic!("must be refused")
    };
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(started.elapsed() < Duration::from_secs(1));
}
