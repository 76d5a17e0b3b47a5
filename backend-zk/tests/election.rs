//! Leader elections on ZooKeeper, through the public API against the server: the leader's value
//! lives in its own queue node, so it is written only while that grant holds and is never seen
//! under a later grant.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::given::{skip_printed, unique_name};
use distlock_zk::zookeeper_client as zk;
use distlock_zk::{DistributedLock, ErrorKind, LockExt, LockName, LockOptions, ZkConfig, ZkLock};

/// A generous bound on every step below.
const BOUND: Duration = Duration::from_secs(10);
/// The short session of the test whose leader's session is closed.
const SHORT_SESSION: Duration = Duration::from_secs(1);
/// How long closing a session out of band may take (see `tests/session_expiry.rs`).
const CLOSE_BOUND: Duration = Duration::from_secs(40);

fn config() -> ZkConfig {
    ZkConfig::from_url(&distlock_zk::DESCRIPTOR.test_url()).expect("DISTLOCK_ZK_URL")
}

async fn connect(config: ZkConfig) -> Arc<ZkLock> {
    Arc::new(
        ZkLock::connect(config)
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start ZooKeeper: scripts/services up zookeeper")),
    )
}

fn opts() -> LockOptions {
    LockOptions::new().wait(BOUND)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_shows_its_value_and_a_new_proclaim_replaces_it() {
    if skip_printed("zk") {
        return;
    }
    let (a, b) = (connect(config()).await, connect(config()).await);
    let name = unique_name("elect-value");
    let election = a.clone().election(&name).unwrap();
    let seen_by_b = b.clone().election(&name).unwrap();
    assert!(seen_by_b.leader().await.unwrap().is_none());

    let mut leading = election.campaign("10.0.0.7:9090", &opts()).await.unwrap();
    let epoch = leading.epoch();
    let leader = seen_by_b.leader().await.unwrap().expect("a leader");
    assert_eq!(leader.epoch, epoch);
    assert_eq!(leader.value.as_deref(), Some("10.0.0.7:9090"));
    assert_eq!(&leader.owner, leading.guard().owner());

    // A new value under the same epoch; any UTF-8, JSON's specials included, and empty.
    let odd = "{\"shard\": [1, 2]}\n\\ ключ 🔒";
    leading.proclaim(odd).await.unwrap();
    let leader = seen_by_b.leader().await.unwrap().expect("a leader");
    assert_eq!((leader.epoch, leader.value.as_deref()), (epoch, Some(odd)));
    leading.proclaim("").await.unwrap();
    let info = b.holder(&name).await.unwrap().expect("held");
    assert_eq!((info.token, info.value.as_deref()), (epoch, Some("")));

    // A reentrant hold rewrites the node's count: the value stays, and so after its release.
    leading.proclaim("kept").await.unwrap();
    let again = leading.guard().reenter().await.unwrap();
    let info = b.holder(&name).await.unwrap().expect("held");
    assert_eq!(
        (info.hold_count, info.value.as_deref(), info.token),
        (2, Some("kept"), epoch)
    );
    assert!(again.release().await.unwrap());
    let info = b.holder(&name).await.unwrap().expect("held");
    assert_eq!((info.hold_count, info.value.as_deref()), (1, Some("kept")));

    // `list` reports the value too.
    let listed = b.list(&name).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.value.as_deref(), Some("kept"));

    assert!(leading.resign().await.unwrap());
    assert!(seen_by_b.leader().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_leader_cannot_proclaim() {
    if skip_printed("zk") {
        return;
    }
    let (a, operator) = (connect(config()).await, connect(config()).await);
    let name = unique_name("elect-forced");
    let election = a.clone().election(&name).unwrap();
    let mut leading = election.campaign("old", &opts()).await.unwrap();
    let epoch = leading.epoch();

    assert!(operator.force_release(&name, epoch).await.unwrap());
    // The server refuses the write although the client has not heard of the loss yet.
    let grant = leading.guard().grant().clone();
    assert!(!a.proclaim(&grant, "deposed").await.unwrap());
    let err = leading.proclaim("deposed").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(leading.value(), "old");
    assert!(operator.holder(&name).await.unwrap().is_none());

    // Someone else leads now; the deposed leader's value never shows under it.
    let other = operator.clone().election(&name).unwrap();
    let next = other.campaign("new", &opts()).await.unwrap();
    assert!(next.epoch() > epoch);
    assert!(leading.proclaim("late").await.is_err());
    let leader = election.leader().await.unwrap().expect("a leader");
    assert_eq!(
        (leader.epoch, leader.value.as_deref()),
        (next.epoch(), Some("new"))
    );
    assert!(!leading.resign().await.unwrap());
    assert!(next.resign().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_never_shows_the_old_value() {
    if skip_printed("zk") {
        return;
    }
    let (a, b) = (connect(config()).await, connect(config()).await);
    let name = unique_name("elect-next");
    let (ea, eb) = (
        a.clone().election(&name).unwrap(),
        b.clone().election(&name).unwrap(),
    );
    let first = ea.campaign("first", &opts()).await.unwrap();
    let e1 = first.epoch();
    assert!(first.resign().await.unwrap());
    assert!(eb.leader().await.unwrap().is_none());

    // The moment between a grant and its proclaim: a plain lock on the election's name.
    let bare = b
        .try_lock_with(&name, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    assert!(bare.token() > e1);
    let info = a.inspect(&LockName::new(&name).unwrap()).await.unwrap();
    let info = info.expect("held");
    assert_eq!((info.token, info.value), (bare.token(), None));
    let leader = ea.leader().await.unwrap().expect("a leader");
    assert_eq!((leader.epoch, leader.value), (bare.token(), None));
    assert!(bare.release().await.unwrap());

    let second = eb.campaign("second", &opts()).await.unwrap();
    assert!(second.epoch() > e1);
    let leader = ea.leader().await.unwrap().expect("a leader");
    assert_eq!(
        (leader.epoch, leader.value.as_deref()),
        (second.epoch(), Some("second"))
    );
    assert!(second.resign().await.unwrap());
}

/// Closes `client`'s session behind its back, as `tests/session_expiry.rs` does: a second
/// client attaches to the session and closes it, which deletes its nodes at once. Done once
/// `observer` sees another holder of `name` (or none).
async fn close_session(client: &ZkLock, config: &ZkConfig, observer: &Arc<ZkLock>, name: &str) {
    let info = client.client().session().clone();
    let old = observer.holder(name).await.unwrap().map(|i| i.token);
    let by = Instant::now() + CLOSE_BOUND;
    loop {
        assert!(Instant::now() < by, "could not close the leader's session");
        let attach = zk::Client::connector()
            .with_session(info.clone())
            .with_session_timeout(SHORT_SESSION)
            .connect(config.hosts());
        match tokio::time::timeout(SHORT_SESSION * 2, attach).await {
            Ok(Ok(thief)) => {
                let mut state = thief.state_watcher();
                drop(thief);
                let _ = tokio::time::timeout(SHORT_SESSION * 2, async {
                    while !state.changed().await.is_terminated() {}
                })
                .await;
            }
            Ok(Err(zk::Error::SessionExpired)) => {}
            Ok(Err(_)) | Err(_) => continue,
        }
        let gone_by = Instant::now() + SHORT_SESSION * 2;
        while Instant::now() < gone_by {
            let now = observer.holder(name).await.unwrap().map(|i| i.token);
            if now != old {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_session_ended_cannot_proclaim_and_the_next_one_leads() {
    if skip_printed("zk") {
        return;
    }
    // ZooKeeper's leases are the session's: no fixed lease to leave to expire, so the leader's
    // session is closed instead.
    let short = config().default_ttl(SHORT_SESSION);
    let (a, b) = (connect(short.clone()).await, connect(config()).await);
    let name = unique_name("elect-session");
    let mut leading = a
        .clone()
        .election(&name)
        .unwrap()
        .campaign("doomed", &opts())
        .await
        .unwrap();
    let epoch = leading.epoch();
    let grant = leading.guard().grant().clone();
    let eb = b.clone().election(&name).unwrap();
    let waiting = {
        let eb = b.clone().election(&name).unwrap();
        tokio::spawn(async move { eb.campaign("successor", &LockOptions::new()).await })
    };
    close_session(&a, &short, &b, &name).await;

    assert!(!a.proclaim(&grant, "late").await.unwrap());
    let err = leading.proclaim("late").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let next = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the next campaigner never led")
        .unwrap()
        .unwrap();
    assert!(next.epoch() > epoch);
    let leader = eb.leader().await.unwrap().expect("a leader");
    assert_eq!(
        (leader.epoch, leader.value.as_deref()),
        (next.epoch(), Some("successor"))
    );
    assert!(!a.proclaim(&grant, "later").await.unwrap());
    assert!(next.resign().await.unwrap());
    let _ = leading.resign().await;
}
