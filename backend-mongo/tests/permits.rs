//! Semaphore permits in the lock document: refusals and full semaphores issue no token, list
//! shows one entry per name, a force-release frees the one permit, and the release of an expired
//! permit removes its entry.
//!
//! Uses the server at `DISTLOCK_MONGO_URL` (default `mongodb://127.0.0.1:27017`).

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::given::{skip_printed, unique_name};
use distlock_mongo::mongodb::bson::{doc, Document};
use distlock_mongo::{fields, ErrorKind, LockExt, LockOptions, MongoConfig, MongoLock};

async fn client() -> Arc<MongoLock> {
    let config = MongoConfig::from_url(&distlock_mongo::DESCRIPTOR.test_url())
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    match MongoLock::connect(config).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("{e}\n  start the server: scripts/services up"),
    }
}

/// The lock document of `name`.
async fn document(lock: &MongoLock, name: &str) -> Document {
    lock.collection()
        .find_one(doc! { "_id": name })
        .await
        .unwrap()
        .expect("the document exists")
}

fn counter(d: &Document) -> i64 {
    d.get_i64(fields::TOKEN).unwrap()
}

fn permits(d: &Document) -> usize {
    d.get_array(fields::PERMITS).map_or(0, |p| p.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_full_semaphores_issue_no_token() {
    if skip_printed("mongo") {
        return;
    }
    let (a, b) = (client().await, client().await);
    let name = unique_name("mongo-permit-tok");
    let opts = LockOptions::new();
    let first = a.try_permit(&name, 2, &opts).await.unwrap().expect("free");
    let second = a
        .try_permit(&name, 2, &opts)
        .await
        .unwrap()
        .expect("one left");
    let before = document(&a, &name).await;
    assert_eq!((counter(&before), permits(&before)), (2, 2));
    assert!(
        b.try_permit(&name, 2, &opts).await.unwrap().is_none(),
        "full"
    );
    let e = b.try_permit(&name, 3, &opts).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("held with 2 permit(s)"), "{e}");
    let e = b.try_lock(&name).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let after = document(&a, &name).await;
    assert_eq!(after, before, "refusals changed the document");
    assert!(first.release().await.unwrap());
    let third = b.try_permit(&name, 2, &opts).await.unwrap().expect("freed");
    assert_eq!(third.token().0, 3, "the next token of the counter");
    assert!(second.release().await.unwrap());
    assert!(third.release().await.unwrap());
    // Free again: the lock of the same name takes the next token of the same counter.
    let lock = b.try_lock(&name).await.unwrap().expect("free");
    assert_eq!(lock.token().0, 4);
    let e = a.try_permit(&name, 2, &opts).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidArgument,
        "a permit of a locked name: {e}"
    );
    assert!(lock.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_a_semaphore_once_and_force_release_frees_one_permit() {
    if skip_printed("mongo") {
        return;
    }
    let (a, b) = (client().await, client().await);
    let name = unique_name("mongo-permit-force");
    let opts = LockOptions::new();
    let older = a.try_permit(&name, 3, &opts).await.unwrap().expect("free");
    let newer = b
        .try_permit(&name, 3, &opts)
        .await
        .unwrap()
        .expect("two left");
    let listed = a.list(&name).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].1.permits, (2, 3));
    assert_eq!(listed[0].1.token, older.token(), "the oldest permit");
    assert!(a.force_release(&name, newer.token()).await.unwrap());
    assert!(
        !a.force_release(&name, newer.token()).await.unwrap(),
        "already freed"
    );
    let info = a.holder(&name).await.unwrap().expect("held");
    assert_eq!((info.permits, info.token), ((1, 3), older.token()));
    assert!(!newer.release().await.unwrap(), "force-released");
    assert!(older.release().await.unwrap());
    assert_eq!(permits(&document(&a, &name).await), 0);
    assert!(a.holder(&name).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_of_an_expired_permit_removes_its_entry() {
    if skip_printed("mongo") {
        return;
    }
    let a = client().await;
    let name = unique_name("mongo-permit-expired");
    let fixed = LockOptions::new().ttl(Duration::from_millis(100));
    let g = a.try_permit(&name, 2, &fixed).await.unwrap().expect("free");
    assert_eq!(permits(&document(&a, &name).await), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(a.holder(&name).await.unwrap().is_none(), "expired");
    assert!(!g.release().await.unwrap(), "released after its lease");
    assert_eq!(permits(&document(&a, &name).await), 0);
}
