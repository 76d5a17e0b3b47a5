//! A release whose delete fails is not forgotten: the queue node of a released hold lives as
//! long as the session, so a delete the server refused, or one whose caller stopped waiting
//! while the connection was down, goes on in the background until it takes. Without that the
//! lock would stay held, with no guard and no `lost()`, until the client process exits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::Proxy;
use distlock_zk::zookeeper_client as zk;
use distlock_zk::{DistributedLock, ErrorKind, LockExt, ZkConfig, ZkLock};

/// The bound within which the lock must be free once the server lets the delete through: the
/// background retry's longest pause (5 s) plus a few round trips, with room for a slow machine.
const FREED_WITHIN: Duration = Duration::from_secs(10);

fn url() -> String {
    distlock_zk::DESCRIPTOR.test_url()
}

fn skip(test: &str) -> bool {
    let skip = distlock_conformance::skipped_by_env("zk");
    if skip {
        eprintln!("SKIPPING {test}: DISTLOCK_SKIP names zk");
    }
    skip
}

async fn connect(config: ZkConfig) -> Arc<ZkLock> {
    Arc::new(
        ZkLock::connect(config)
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start ZooKeeper: scripts/services up zookeeper")),
    )
}

fn unique(tag: &str) -> String {
    format!("failed-release-{tag}-{}", uuid::Uuid::new_v4().simple())
}

async fn queue(via: &ZkLock, name: &str) -> Vec<String> {
    let path = via.lock_path(name).unwrap();
    match via.client().list_children(&path).await {
        Ok(nodes) => nodes,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("cannot list {path}: {e}"),
    }
}

/// `other` acquires `name` (it waits on the predecessor watch, so it wins as soon as the
/// released node is deleted), within [`FREED_WITHIN`] of `since`.
async fn freed_for(other: &Arc<ZkLock>, name: &str, since: Instant) {
    let g = other.lock(name, FREED_WITHIN).await.unwrap_or_else(|e| {
        panic!(
            "the released lock was still held {:?} after the server allowed the delete: {e}",
            since.elapsed()
        )
    });
    assert!(since.elapsed() < FREED_WITHIN, "{:?}", since.elapsed());
    assert!(g.release().await.unwrap());
}

/// The server answers the release's delete with `NoAuth` (the lock node's ACL lost its DELETE
/// permission, as an operator's mistake would do): the release reports the failure, the node
/// stays, and once the ACL is put back the background retry deletes it — in the same session.
/// An abandoned waiter's node, whose delete was refused the same way, goes as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_delete_of_a_released_hold_is_retried_until_it_takes() {
    if skip("refused_delete_of_a_released_hold_is_retried_until_it_takes") {
        return;
    }
    let config = ZkConfig::from_url(&url()).unwrap();
    let (holder, other) = (connect(config.clone()).await, connect(config).await);
    let name = unique("acl");
    let dir = holder.lock_path(&name).unwrap();
    let session = holder.session_id();
    let g = holder.try_lock(&name).await.unwrap().expect("free");

    let no_delete = [zk::Acl::new(
        zk::Permission::READ
            | zk::Permission::WRITE
            | zk::Permission::CREATE
            | zk::Permission::ADMIN,
        zk::AuthId::anyone(),
    )];
    other
        .client()
        .set_acl(&dir, &no_delete, None)
        .await
        .expect("take DELETE off the lock node's ACL");
    let e = g
        .release()
        .await
        .expect_err("a release whose delete was refused reported success");
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    // Refused, not lost in transit: the node is there, and the lock is held with no guard.
    assert_eq!(queue(&other, &name).await.len(), 1);
    let info = other.holder(&name).await.unwrap().expect("still held");
    assert_eq!(info.owner.label(), holder.core().owner().label());
    // A try-lock queues a node and, not being first, deletes it: refused as well, so its node
    // is an abandoned waiter, which must go too once deletes are allowed again.
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "free although the delete was refused"
    );
    // A few background rounds are refused too.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        queue(&other, &name).await.len(),
        2,
        "released holder and abandoned waiter"
    );

    other
        .client()
        .set_acl(&dir, &zk::Acls::anyone_all(), None)
        .await
        .expect("give the lock node its ACL back");
    freed_for(&other, &name, Instant::now()).await;
    assert_eq!(
        holder.session_id(),
        session,
        "the session ended, which frees the lock without any retry"
    );
    assert!(queue(&other, &name).await.is_empty());
}

/// The holder's connection is cut while it releases, and the caller stops waiting for the
/// release (a timeout around it). When the connection comes back, within the session, the
/// delete goes through: giving up on the release future does not give up on the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_release_given_up_during_a_partition_still_takes() {
    if skip("delete_of_a_release_given_up_during_a_partition_still_takes") {
        return;
    }
    // Long enough that the cut below cannot end the session.
    let session_timeout = Duration::from_secs(8);
    let direct = ZkConfig::from_url(&url())
        .map(|c| c.default_ttl(session_timeout))
        .unwrap();
    let upstream = direct.hosts().split(',').next().unwrap().to_string();
    let proxy = Proxy::start(upstream).await;
    let proxied = ZkConfig::from_url(&format!("zk://{}", proxy.addr()))
        .map(|c| c.default_ttl(session_timeout))
        .unwrap();
    let (holder, other) = (connect(proxied).await, connect(direct).await);
    let name = unique("cut");
    let session = holder.session_id();
    let g = holder.try_lock(&name).await.unwrap().expect("free");

    proxy.cut();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), g.release()).await;
    assert!(
        gave_up.is_err(),
        "the release finished through a cut connection: {gave_up:?}"
    );
    // The delete never reached the server.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(queue(&other, &name).await.len(), 1);
    assert!(other.try_lock(&name).await.unwrap().is_none());

    proxy.heal();
    freed_for(&other, &name, Instant::now()).await;
    assert_eq!(
        holder.session_id(),
        session,
        "the session ended, which frees the lock without any retry"
    );
    assert!(queue(&other, &name).await.is_empty());
}
