//! What renewals do to the stored lease: a renewal acts on its exact grant only (owner *and*
//! token, batched renewals included), and it never moves `expires_at` earlier.
//!
//! Uses the server at `DISTLOCK_MONGO_URL` (default `mongodb://127.0.0.1:27017`).

use std::sync::Arc;
use std::time::Duration;

use distlock_mongo::mongodb::bson::{doc, Bson, DateTime};
use distlock_mongo::{
    fields, DistributedLock, ErrorKind, LockExt, LockGuard, LockOptions, MongoConfig, MongoLock,
    OwnerId,
};

fn url() -> String {
    distlock_mongo::DESCRIPTOR.test_url()
}

fn unique(tag: &str) -> String {
    format!(
        "lease-{tag}-{}-{:08x}",
        std::process::id(),
        distlock_conformance::unique_suffix()
    )
}

async fn client(owner: &str) -> Arc<MongoLock> {
    let config = MongoConfig::from_url(&url())
        .unwrap()
        .owner(OwnerId::new(owner).unwrap())
        .connect_timeout(Duration::from_secs(5));
    match MongoLock::connect(config).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("{e}\n  start the server: scripts/services up"),
    }
}

async fn take(c: &Arc<MongoLock>, name: &str, ttl: Duration) -> LockGuard {
    c.try_lock_with(name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name} should be free"))
}

/// The stored token and `expires_at` of `name`'s document.
async fn stored(c: &MongoLock, name: &str) -> (i64, DateTime) {
    let d = c
        .collection()
        .find_one(doc! { "_id": name })
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no document for {name}"));
    (
        d.get_i64(fields::TOKEN).unwrap(),
        *d.get_datetime(fields::EXPIRES_AT)
            .unwrap_or_else(|e| panic!("{name} has no expiry: {e}")),
    )
}

fn assert_lost<T: std::fmt::Debug>(what: &str, r: &distlock_mongo::Result<T>) {
    assert_eq!(
        r.as_ref().map_err(|e| e.kind()).err(),
        Some(ErrorKind::Lost),
        "{what}: {r:?}"
    );
}

/// An owner's grant of a name ends (its fixed lease ran out) and the same owner takes the name
/// again under a newer token. A renewal of the old grant sent late — alone, or in a batch with
/// another lock of the owner — must fail as lost and leave the newer grant's stored lease
/// exactly as it was: a batch filtered on the owner alone would have set it to 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_batch_renewal_of_an_old_grant_leaves_the_same_owners_newer_grant_alone() {
    let owner = unique("late");
    let a = client(&owner).await;
    let (name, other) = (format!("{owner}-x"), format!("{owner}-y"));
    // One explicit owner for every grant: acquisitions without one have owners of their own.
    let me = OwnerId::new("late-owner").unwrap();
    let as_me = |ttl| LockOptions::new().owner(me.clone()).ttl(ttl);
    let old = a
        .try_lock_with(&name, &as_me(Duration::from_millis(300)))
        .await
        .unwrap()
        .expect("free");
    let kept = a
        .try_lock_with(&other, &as_me(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let newer = a
        .try_lock_with(&name, &as_me(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("free after the old lease ran out");
    assert!(newer.token() > old.token());
    assert_eq!(newer.owner(), old.owner(), "one owner, two grants");
    let (token, newer_until) = stored(&a, &name).await;
    assert_eq!(token as u64, newer.token().0);
    let (_, kept_until) = stored(&a, &other).await;

    let long = Duration::from_secs(60);
    assert!(a.profile().renew_batch > 1, "the backend renews in batches");
    let results = a
        .renew_many(&[(old.grant().clone(), long), (kept.grant().clone(), long)])
        .await;
    assert_lost("batch renewal of the old grant", &results[0]);
    assert_eq!(results[1].as_ref().ok(), Some(&long), "{:?}", results[1]);
    assert_eq!(
        stored(&a, &name).await,
        (token, newer_until),
        "the batch renewal of the old grant rewrote the newer grant's lease"
    );
    let (_, kept_after) = stored(&a, &other).await;
    assert!(
        kept_after > kept_until,
        "the kept lock was renewed: {kept_until} -> {kept_after}"
    );

    assert_lost(
        "renewal of the old grant",
        &a.renew(old.grant(), long).await,
    );
    assert_eq!(stored(&a, &name).await, (token, newer_until));

    assert!(
        !old.release().await.unwrap(),
        "the old grant released a lock"
    );
    assert!(newer.release().await.unwrap());
    assert!(kept.release().await.unwrap());
}

/// Renewing to less than the lease left, alone or in a batch, confirms the grant and keeps the
/// stored expiry: `extend(d)` means "at least `d` from now".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_to_a_shorter_lease_keeps_the_stored_expiry() {
    let owner = unique("short");
    let a = client(&owner).await;
    let names = [format!("{owner}-x"), format!("{owner}-y")];
    let long = Duration::from_secs(60);
    let short = Duration::from_secs(1);
    let x = take(&a, &names[0], long).await;
    let y = take(&a, &names[1], long).await;
    let before = [stored(&a, &names[0]).await, stored(&a, &names[1]).await];

    assert_eq!(a.renew(x.grant(), short).await.ok(), Some(short));
    x.extend(short).await.unwrap();
    let results = a
        .renew_many(&[(x.grant().clone(), short), (y.grant().clone(), short)])
        .await;
    for r in &results {
        assert_eq!(r.as_ref().ok(), Some(&short), "{r:?}");
    }
    let after = [stored(&a, &names[0]).await, stored(&a, &names[1]).await];
    assert_eq!(
        after, before,
        "a renewal to a shorter lease moved the expiry"
    );
    let left = a
        .holder(&names[0])
        .await
        .unwrap()
        .and_then(|i| i.remaining)
        .expect("held, with a lease");
    assert!(left > Duration::from_secs(50), "{left:?} left");

    assert!(x.release().await.unwrap());
    assert!(y.release().await.unwrap());
}

/// A grant whose lease ran out by the server's clock, still recorded (nobody took the name
/// over), matches the equality filters of renew and release: the update's pipeline, not the
/// filter, must refuse it. Its renewals, alone and in a batch with a live lock, fail as lost
/// and leave the stored lease exactly as it was (a renewal never revives a lease); its release
/// reports `false` and only then tidies the document to free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_grant_still_recorded_is_neither_renewed_nor_released() {
    let owner = unique("expired");
    let a = client(&owner).await;
    let (name, other) = (format!("{owner}-x"), format!("{owner}-y"));
    let gone = take(&a, &name, Duration::from_millis(200)).await;
    let kept = take(&a, &other, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let expired = stored(&a, &name).await;
    assert_eq!(expired.0 as u64, gone.token().0, "nobody took it over");
    assert!(
        a.holder(&name).await.unwrap().is_none(),
        "expired by the server"
    );

    let long = Duration::from_secs(60);
    assert_lost(
        "renewal of the expired grant",
        &a.renew(gone.grant(), long).await,
    );
    assert_eq!(
        stored(&a, &name).await,
        expired,
        "the renewal revived the lease"
    );
    let results = a
        .renew_many(&[(gone.grant().clone(), long), (kept.grant().clone(), long)])
        .await;
    assert_lost("batch renewal of the expired grant", &results[0]);
    assert_eq!(results[1].as_ref().ok(), Some(&long), "{:?}", results[1]);
    assert_eq!(
        stored(&a, &name).await,
        expired,
        "the batch revived the lease"
    );
    assert!(a.holder(&name).await.unwrap().is_none());

    let token = gone.token().0;
    assert!(!gone.release().await.unwrap(), "released an expired grant");
    let doc = a
        .collection()
        .find_one(doc! { "_id": &name })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(doc.get(fields::OWNER), Some(&Bson::Null), "tidied: {doc}");
    assert_eq!(doc.get_i64(fields::TOKEN).unwrap() as u64, token);
    assert!(kept.release().await.unwrap());
}

/// A release by a stale token (the same owner's earlier grant of the name) finds the newer
/// grant's document by its equality filter on `_id` and owner but not the token: it neither
/// gives up the newer grant's hold nor tidies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_tokens_release_leaves_the_same_owners_newer_grant_held() {
    let owner = unique("stale");
    let a = client(&owner).await;
    let name = format!("{owner}-x");
    let me = OwnerId::new("stale-owner").unwrap();
    let as_me = |ttl| LockOptions::new().owner(me.clone()).ttl(ttl);
    let old = a
        .try_lock_with(&name, &as_me(Duration::from_millis(200)))
        .await
        .unwrap()
        .expect("free");
    let stale = old.grant().clone();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let newer = a
        .try_lock_with(&name, &as_me(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free after the old lease ran out");
    let before = stored(&a, &name).await;
    assert!(
        !a.release(&stale).await.unwrap(),
        "the stale token released"
    );
    assert_eq!(stored(&a, &name).await, before);
    let info = a.holder(&name).await.unwrap().expect("still held");
    assert_eq!((info.token, info.hold_count), (newer.token(), 1));
    assert!(!newer.is_lost());
    assert!(newer.release().await.unwrap());
    drop(old);
}
