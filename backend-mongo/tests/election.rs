//! Leader election on the lock document: the value proclaimed under a grant is stored with its
//! token (`value: { epoch, text }`), written only while that grant holds the name live by the
//! server's clock, and reported only while that token is the holder's.
//!
//! Uses the server at `DISTLOCK_MONGO_URL` (default `mongodb://127.0.0.1:27017`).

use std::sync::Arc;
use std::time::Duration;

use distlock_api::MAX_VALUE_LEN;
use distlock_conformance::given::{skip_printed, unique_name};
use distlock_mongo::mongodb::bson::{doc, Document};
use distlock_mongo::{
    fields, DistributedLock, ErrorKind, LockExt, LockName, LockOptions, MongoConfig, MongoLock,
};

async fn client() -> Arc<MongoLock> {
    let config = MongoConfig::from_url(&distlock_mongo::DESCRIPTOR.test_url())
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    match MongoLock::connect(config).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("{e}\n  start the server: scripts/services up"),
    }
}

/// The stored value slot of `name`: `(epoch, text)`.
async fn stored_value(lock: &MongoLock, name: &str) -> Option<(i64, String)> {
    let d: Document = lock
        .collection()
        .find_one(doc! { "_id": name })
        .await
        .unwrap()?;
    let v = d.get_document(fields::VALUE).ok()?;
    Some((
        v.get_i64("epoch").unwrap(),
        v.get_str("text").unwrap().to_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_value_is_what_it_proclaimed_and_a_new_one_replaces_it() {
    if skip_printed("mongo") {
        return;
    }
    let (a, b) = (client().await, client().await);
    let name = unique_name("mongo-elect-value");
    let opts = LockOptions::new();
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("10.0.0.7:8080", &opts)
        .await
        .unwrap();
    let epoch = leading.epoch();
    let watch = b.election(&name).unwrap();
    let leader = watch.leader().await.unwrap().expect("led");
    assert_eq!(leader.epoch, epoch);
    assert_eq!(leader.value.as_deref(), Some("10.0.0.7:8080"));
    assert_eq!(&leader.owner, leading.guard().owner());
    assert!(leader.since.is_some());

    // Replaced under the same epoch; values a pipeline would misread are stored as text.
    let long = "é".repeat(MAX_VALUE_LEN / 2);
    for v in [
        "10.0.0.7:9090",
        "$owner",
        "",
        "{\"shard\": [1, 2]}",
        long.as_str(),
    ] {
        leading.proclaim(v).await.unwrap();
        let leader = watch.leader().await.unwrap().expect("led");
        assert_eq!((leader.epoch, leader.value.as_deref()), (epoch, Some(v)));
        assert_eq!(leading.value(), v);
        assert_eq!(
            stored_value(&a, &name).await,
            Some((epoch.0 as i64, v.to_owned()))
        );
    }
    // list shows the value too.
    let listed = b.list(&name).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.value.as_deref(), Some(long.as_str()));
    assert!(leading.resign().await.unwrap());
    assert!(watch.leader().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_leader_is_refused_and_its_value_hidden() {
    if skip_printed("mongo") {
        return;
    }
    let (a, op) = (client().await, client().await);
    let name = unique_name("mongo-elect-force");
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("old", &LockOptions::new())
        .await
        .unwrap();
    let grant = leading.guard().grant().clone();
    let lock_name = LockName::new(name.as_str()).unwrap();
    assert!(op.force_release(&name, leading.epoch()).await.unwrap());

    // The server's condition itself refuses, whatever the guard already knows.
    assert!(!a.proclaim(&grant, "direct").await.unwrap());
    let err = leading.proclaim("new").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(op
        .election(&name)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .is_none());
    // The deposed writes changed nothing: the slot still holds the value of its grant.
    assert_eq!(
        stored_value(&op, &name).await,
        Some((grant.token.0 as i64, "old".to_owned()))
    );

    // The next holder does not inherit it.
    let next = op
        .try_lock_with(&name, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    assert!(next.token() > grant.token);
    let info = op.inspect(&lock_name).await.unwrap().expect("held");
    assert_eq!((info.token, info.value), (next.token(), None));
    assert!(!a.proclaim(&grant, "late").await.unwrap());
    assert!(next.release().await.unwrap());
    let _ = leading.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_shows_its_own_epoch_and_value_never_the_old_one() {
    if skip_printed("mongo") {
        return;
    }
    let (a, b) = (client().await, client().await);
    let name = unique_name("mongo-elect-next");
    let lock_name = LockName::new(name.as_str()).unwrap();
    let opts = LockOptions::new();
    let first = a
        .election(&name)
        .unwrap()
        .campaign("a", &opts)
        .await
        .unwrap();
    let old = first.epoch();
    assert!(first.resign().await.unwrap());

    // The moment between a grant and its proclaim: the old value lingers in the document,
    // stamped with the old epoch, and is not reported.
    let bare = b.try_lock_with(&name, &opts).await.unwrap().expect("free");
    assert!(bare.token() > old);
    assert_eq!(
        stored_value(&b, &name).await,
        Some((old.0 as i64, "a".into()))
    );
    let info = b.inspect(&lock_name).await.unwrap().expect("held");
    assert_eq!((info.token, info.value), (bare.token(), None));
    let leader = a
        .election(&name)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .expect("held");
    assert_eq!((leader.epoch, leader.value), (bare.token(), None));
    assert!(bare.release().await.unwrap());

    let second = b
        .election(&name)
        .unwrap()
        .campaign("b", &opts)
        .await
        .unwrap();
    let leader = a
        .election(&name)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .expect("led");
    assert!(leader.epoch > old);
    assert_eq!(
        (leader.epoch, leader.value.as_deref()),
        (second.epoch(), Some("b"))
    );
    assert!(second.resign().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_cannot_proclaim() {
    if skip_printed("mongo") {
        return;
    }
    let (a, b) = (client().await, client().await);
    let name = unique_name("mongo-elect-lapse");
    let lock_name = LockName::new(name.as_str()).unwrap();
    let fixed = LockOptions::new().ttl(Duration::from_millis(300));
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("v1", &fixed)
        .await
        .unwrap();
    let grant = leading.guard().grant().clone();
    leading.proclaim("v2").await.unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;

    // Expired by the server's clock, not taken over: the update matches nothing.
    assert!(!a.proclaim(&grant, "v3").await.unwrap());
    let err = leading.proclaim("v3").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(b.election(&name).unwrap().leader().await.unwrap().is_none());
    assert_eq!(
        stored_value(&b, &name).await,
        Some((grant.token.0 as i64, "v2".into()))
    );
    // A takeover of the lapsed grant sees no value of it.
    let taker = b
        .try_lock_with(&name, &fixed)
        .await
        .unwrap()
        .expect("lapsed");
    let info = b.inspect(&lock_name).await.unwrap().expect("held");
    assert_eq!((info.token, info.value), (taker.token(), None));
    assert!(!a.proclaim(&grant, "v4").await.unwrap());
    assert!(taker.release().await.unwrap());
    let _ = leading.resign().await;
}
