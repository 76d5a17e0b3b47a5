//! Hand-overs ([`DistributedLock::hand_over`]): a release through a handle that grants the lock
//! to a waiting task of the same handle in the same `findAndModify`. The trait method is
//! called directly on a connected client, with the releasing grant from `attempt` and the
//! waiter's request under an owner id of its own; what it did is read back with `inspect`, the
//! stored fencing counter and the grants' own release and renew. Round trips are counted by a
//! loopback proxy between one client and the server.
//!
//! Uses the server at `DISTLOCK_MONGO_URL` (default `mongodb://127.0.0.1:27017`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::HandOver;
use distlock_api::backend::AcquireRequest;
use distlock_conformance::given::skip_printed;
use distlock_conformance::hand_over::{self, granted, request};
use distlock_conformance::{hosts_of, reroute, Proxy};
use distlock_mongo::mongodb::bson::doc;
use distlock_mongo::{fields, DistributedLock, LockName, MongoConfig, MongoLock};

fn url() -> String {
    distlock_mongo::DESCRIPTOR.test_url()
}

fn lock_name(tag: &str) -> LockName {
    LockName::new(format!(
        "ho-{tag}-{}-{:08x}",
        std::process::id(),
        distlock_conformance::unique_suffix()
    ))
    .unwrap()
}

async fn connect(config: MongoConfig) -> Arc<MongoLock> {
    match MongoLock::connect(config.connect_timeout(Duration::from_secs(5))).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("{e}\n  start the server: scripts/services up mongo"),
    }
}

async fn client() -> Arc<MongoLock> {
    connect(MongoConfig::from_url(&url()).unwrap()).await
}

/// The fencing counter stored in `name`'s document.
async fn counter(lock: &MongoLock, name: &LockName) -> u64 {
    let d = lock
        .collection()
        .find_one(doc! { "_id": name.as_str() })
        .await
        .unwrap()
        .expect("the lock document");
    d.get_i64(fields::TOKEN).unwrap() as u64
}

/// A last hold passes to the waiter's owner with the next token, hold count 1 and the waiter's
/// own lease; the old grant holds nothing any more and the new one is a grant like any other
/// ([`hand_over::a_last_hold_passes`]); the stored counter holds the last token issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_hold_passes_with_the_next_token_and_the_waiters_lease() {
    if skip_printed("mongo") {
        return;
    }
    let lock = client().await;
    let name = lock_name("last");
    hand_over::a_last_hold_passes(&*lock, &name).await;
    let last = granted(&*lock, &request(&*lock, &name, Duration::from_secs(5))).await;
    assert_eq!(counter(&lock, &name).await, last.token.0);
    assert!(lock.release(&last).await.unwrap());
}

/// A grant with two holds gives one up and keeps the lock; a grant that no longer holds
/// changes nothing and issues no token ([`hand_over::only_a_last_hold_of_a_holding_grant_passes`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_last_hold_of_a_holding_grant_passes() {
    if skip_printed("mongo") {
        return;
    }
    let lock = client().await;
    let other = client().await;
    let name = lock_name("only");
    let expired =
        hand_over::only_a_last_hold_of_a_holding_grant_passes(&*lock, &*other, &name).await;
    assert_eq!(
        counter(&lock, &name).await,
        expired.token.0,
        "no token issued"
    );
    hand_over::next_grant_follows(&*lock, &name, &expired).await;
}

/// The round trips `op` made through `proxy`.
async fn trips<T>(proxy: &Proxy, op: impl std::future::Future<Output = T>) -> (T, u64) {
    let before = proxy.round_trips();
    let out = op.await;
    (out, proxy.round_trips() - before)
}

/// A hand-over of a last hold is one request, and so is one that gives up one hold of
/// several. (Through the conveniences, a guard's release to a waiting task of the same client:
/// round_trips.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_is_one_request() {
    if skip_printed("mongo") {
        return;
    }
    let url = url();
    let first = hosts_of(&url)[0].clone();
    let proxy = Proxy::start(first.clone()).await;
    // As in round_trips.rs: a direct connection, and no change stream (its own requests would
    // be counted too).
    let proxied = reroute(&url, &[first], &[proxy.addr()]);
    let sep = if proxied.contains('?') { '&' } else { '?' };
    let proxied = format!("{proxied}{sep}directConnection=true");
    let config = MongoConfig::from_url(&proxied)
        .unwrap()
        .change_streams(false)
        .backoff(Duration::from_secs(60), Duration::from_secs(60));
    let lock = connect(config).await;
    let name = lock_name("trips");
    let ttl = Duration::from_secs(60);
    let g = granted(&*lock, &request(&*lock, &name, ttl)).await;
    // The driver's monitor may check the server now and then: the fewest of a few tries shows
    // what a hand-over itself takes.
    let mut handed = Vec::new();
    let mut kept = Vec::new();
    let mut g = g;
    for _ in 0..5 {
        let (done, n) = trips(&proxy, lock.hand_over(&g, &request(&*lock, &name, ttl))).await;
        let HandOver::Handed(h) = done.unwrap() else {
            panic!("not handed over");
        };
        handed.push(n);
        assert_eq!(h.token.0, g.token.0 + 1);
        g = h;
        let again = AcquireRequest::new(name.clone(), g.owner.clone(), ttl).unwrap();
        let twice = granted(&*lock, &again).await;
        let (done, n) = trips(&proxy, lock.hand_over(&twice, &request(&*lock, &name, ttl))).await;
        assert!(matches!(done.unwrap(), HandOver::Released(true)));
        kept.push(n);
    }
    assert_eq!(handed.iter().min(), Some(&1), "handed over: {handed:?}");
    assert_eq!(kept.iter().min(), Some(&1), "one hold of several: {kept:?}");
    assert!(lock.release(&g).await.unwrap());
}

/// The lock never comes free in a hand-over, so the change stream tells a waiter of another
/// client nothing; the new grant's release does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_sends_no_notice_to_other_clients_waiters() {
    if skip_printed("mongo") {
        return;
    }
    let lock = client().await;
    let waiter = client().await;
    let name = lock_name("notice");
    let ttl = Duration::from_secs(60);
    let from = granted(&*lock, &request(&*lock, &name, ttl)).await;
    let notices = match waiter.subscribe(&name).await {
        Ok(n) => n,
        Err(e) => panic!("the test server has change streams: {e}"),
    };
    let HandOver::Handed(g) = lock
        .hand_over(&from, &request(&*lock, &name, ttl))
        .await
        .unwrap()
    else {
        panic!("not handed over");
    };
    let quiet = Duration::from_millis(1500);
    let started = Instant::now();
    notices.wait(quiet).await;
    assert!(
        started.elapsed() >= quiet,
        "a waiter was told after {:?}: the hand-over looked like a release",
        started.elapsed()
    );
    // Kept on one hold of several given up too.
    let again = AcquireRequest::new(name.clone(), g.owner.clone(), ttl).unwrap();
    let twice = granted(&*lock, &again).await;
    let kept = lock
        .hand_over(&twice, &request(&*lock, &name, ttl))
        .await
        .unwrap();
    assert!(matches!(kept, HandOver::Released(true)));
    let started = Instant::now();
    notices.wait(quiet).await;
    assert!(
        started.elapsed() >= quiet,
        "told after {:?}",
        started.elapsed()
    );
    // The release that frees it is told at once.
    assert!(lock.release(&g).await.unwrap());
    let started = Instant::now();
    notices.wait(Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the release was not told within {:?}",
        started.elapsed()
    );
}
