//! Leader elections on etcd, through the public API: the leader's value lives at the name's
//! value key (`<prefix>/<encoded name>`, `<epoch>:<value>`), written by a transaction that
//! requires the leader's entry key with its create-revision (the epoch), and reported only for
//! the holder whose token is that epoch.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock_etcd::etcd_client::Client;
use distlock_etcd::{DistributedLock, ErrorKind, EtcdLock, LockExt, LockName, LockOptions};

async fn client() -> Arc<EtcdLock> {
    Arc::new(
        EtcdLock::connect(common::config())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the etcd server at {} cannot be reached: {e}\n  start it: scripts/services up",
                    common::url()
                )
            }),
    )
}

fn opts() -> LockOptions {
    LockOptions::new().wait(Duration::from_secs(30))
}

/// What the name's value key holds on the server, as stored (`<epoch>:<value>`).
async fn stored(raw: &Client, name: &str) -> Option<String> {
    let key = common::config().value_key(&LockName::new(name).unwrap());
    let resp = raw.kv_client().get(key, None).await.expect("reading");
    resp.kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

const STEP: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_value_is_what_it_proclaimed_and_a_proclaim_replaces_it() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let (a, b) = (client().await, client().await);
    let name = common::unique("elect-value");
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("v1", &opts())
        .await
        .unwrap();
    let epoch = leading.epoch();
    let leader = b
        .election(&name)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .expect("led");
    assert_eq!(leader.epoch, epoch);
    assert_eq!(&leader.owner, leading.guard().owner());
    assert_eq!(leader.value.as_deref(), Some("v1"));
    assert_eq!(stored(&raw, &name).await, Some(format!("{}:v1", epoch.0)));
    // Nobody else gets in.
    assert!(b
        .election(&name)
        .unwrap()
        .try_campaign("b", &opts())
        .await
        .unwrap()
        .is_none());

    // Replaced under the same epoch, whatever the value holds (empty, separators, the most).
    // MAX_VALUE_LEN bytes.
    let long = "é".repeat(4096 / 2);
    for v in ["v2", "", "a:b:c\n/x", "ключ 🔒", long.as_str()] {
        leading.proclaim(v).await.unwrap();
        let leader = b.election(&name).unwrap().leader().await.unwrap().unwrap();
        assert_eq!((leader.epoch, leader.value.as_deref()), (epoch, Some(v)));
    }
    leading.proclaim("v3").await.unwrap();
    // A re-entry counts a hold into the entry's value and leaves the leader's value alone.
    let again = leading.guard().reenter().await.unwrap();
    assert_eq!(again.token(), epoch);
    let info = b.holder(&name).await.unwrap().unwrap();
    assert_eq!((info.hold_count, info.value.as_deref()), (2, Some("v3")));
    assert!(again.release().await.unwrap());
    // `list` reports it too.
    let listed = b.list(&name).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.value.as_deref(), Some("v3"));
    assert!(leading.resign().await.unwrap());
    assert!(b.election(&name).unwrap().leader().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_leader_is_deposed_and_its_value_never_shows() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let (a, b, op) = (client().await, client().await, client().await);
    let name = common::unique("elect-forced");
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("old", &opts())
        .await
        .unwrap();
    let epoch = leading.epoch();
    assert!(op.force_release(&name, epoch).await.unwrap());

    let err = leading.proclaim("late").await.expect_err("deposed");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    // The backend's own answer, past the guard's local checks: refused by the server.
    let grant = leading.guard().grant().clone();
    assert!(!a.proclaim(&grant, "later").await.unwrap());
    assert!(op
        .election(&name)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .is_none());
    // The deposed leader's value lingers (its client lives) but never shows for the next one.
    assert_eq!(stored(&raw, &name).await, Some(format!("{}:old", epoch.0)));
    let g = b
        .try_lock_with(&name, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    assert!(g.token() > epoch);
    let info = op.holder(&name).await.unwrap().unwrap();
    assert_eq!((info.token, info.value), (g.token(), None));
    let leader = op.election(&name).unwrap().leader().await.unwrap().unwrap();
    assert_eq!((leader.epoch, leader.value), (g.token(), None));
    assert!(!a.proclaim(&grant, "latest").await.unwrap());
    assert_eq!(stored(&raw, &name).await, Some(format!("{}:old", epoch.0)));
    assert!(g.release().await.unwrap());
    drop(leading);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_has_a_higher_epoch_and_never_the_old_value() {
    if common::skip() {
        return;
    }
    let (a, b) = (client().await, client().await);
    let name = common::unique("elect-next");
    let election_a = a.election(&name).unwrap();
    let election_b = b.election(&name).unwrap();
    let first = election_a.campaign("first", &opts()).await.unwrap();
    let old = first.epoch();
    assert!(first.resign().await.unwrap());
    assert!(election_b.leader().await.unwrap().is_none());

    // Between a grant and its proclaim: the holder has no value, not the old leader's.
    let g = b
        .try_lock_with(&name, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    let info = a
        .inspect(&LockName::new(name.as_str()).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(info.token > old);
    assert_eq!(info.value, None);
    assert_eq!(election_a.leader().await.unwrap().unwrap().value, None);
    assert!(g.release().await.unwrap());

    let second = election_b.campaign("second", &opts()).await.unwrap();
    let leader = election_a.leader().await.unwrap().unwrap();
    assert!(leader.epoch > info.token);
    assert_eq!(leader.epoch, second.epoch());
    assert_eq!(leader.value.as_deref(), Some("second"));
    assert!(second.resign().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_ended_cannot_proclaim() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let (a, b) = (client().await, client().await);
    let name = common::unique("elect-lease");
    // The lease is the client's (a fixed per-lock TTL is unsupported): end it behind its back.
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("v", &opts())
        .await
        .unwrap();
    let grant = leading.guard().grant().clone();
    let lease = a.lease_id().expect("live lease");
    raw.lease_client().revoke(lease).await.expect("revoke");
    // Straight after, most likely before the client noticed: refused (by the server then).
    assert!(!a.proclaim(&grant, "after").await.unwrap());
    let err = leading.proclaim("after").await.expect_err("lease gone");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    // The value went with the lease.
    assert_eq!(stored(&raw, &name).await, None);
    assert!(b.election(&name).unwrap().leader().await.unwrap().is_none());
    tokio::time::timeout(STEP, leading.lost())
        .await
        .expect("lost");
    let err = leading.proclaim("later").await.expect_err("lost");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
}
