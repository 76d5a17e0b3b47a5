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
use distlock_api::Grant;
use distlock_conformance::given::skip_printed;
use distlock_conformance::{hosts_of, reroute, Proxy};
use distlock_mongo::mongodb::bson::doc;
use distlock_mongo::{
    fields, DistributedLock, ErrorKind, LockInfo, LockName, MongoConfig, MongoLock,
};

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

/// A request for `name` under a fresh owner id of `lock`'s.
fn request(lock: &MongoLock, name: &LockName, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(name.clone(), lock.core().next_owner(), ttl).unwrap()
}

async fn granted(lock: &MongoLock, req: &AcquireRequest) -> Grant {
    lock.attempt(req)
        .await
        .unwrap()
        .into_grant()
        .expect("the name is free")
}

async fn held(lock: &MongoLock, name: &LockName) -> LockInfo {
    lock.inspect(name).await.unwrap().expect("the name is held")
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
/// own lease (shorter or longer than the releasing grant's), judged from the request's send;
/// the old grant holds nothing any more and the new one is a grant like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_hold_passes_with_the_next_token_and_the_waiters_lease() {
    if skip_printed("mongo") {
        return;
    }
    let lock = client().await;
    let name = lock_name("last");
    let mut from = granted(&lock, &request(&lock, &name, Duration::from_secs(20))).await;
    for ttl in [Duration::from_secs(5), Duration::from_secs(60)] {
        let to = request(&lock, &name, ttl);
        let before = Instant::now();
        let HandOver::Handed(g) = lock.hand_over(&from, &to).await.unwrap() else {
            panic!("a last hold was not handed over");
        };
        assert!(g.token > from.token, "{:?} after {:?}", g.token, from.token);
        assert_eq!(g.token.0, from.token.0 + 1, "the counter's next value");
        assert_eq!(counter(&lock, &name).await, g.token.0);
        assert_eq!(
            (&g.name, &g.owner, g.hold_count, g.ttl),
            (&name, &to.owner, 1, ttl)
        );
        assert!(g.sent_at >= before && g.sent_at <= Instant::now());
        let info = held(&lock, &name).await;
        assert_eq!(
            (&info.owner, info.hold_count, info.token),
            (&to.owner, 1, g.token)
        );
        let left = info.remaining.expect("a lease");
        assert!(
            left <= ttl && left + Duration::from_secs(2) > ttl,
            "{left:?} left of a {ttl:?} lease"
        );
        // The old grant: nothing to release, renew or hand over.
        assert!(!lock.release(&from).await.unwrap());
        let renewed = lock.renew(&from, Duration::from_secs(5)).await;
        assert_eq!(renewed.map_err(|e| e.kind()), Err(ErrorKind::Lost));
        let again = lock
            .hand_over(&from, &request(&lock, &name, ttl))
            .await
            .unwrap();
        assert!(matches!(again, HandOver::Released(false)), "{again:?}");
        assert_eq!(held(&lock, &name).await.token, g.token, "nothing changed");
        // The new one renews like any grant.
        lock.renew(&g, Duration::from_secs(30)).await.unwrap();
        from = g;
    }
    // The last new grant releases, and the next fresh grant's token is greater still.
    assert!(lock.release(&from).await.unwrap());
    assert!(lock.inspect(&name).await.unwrap().is_none());
    let next = granted(&lock, &request(&lock, &name, Duration::from_secs(5))).await;
    assert_eq!(next.token.0, from.token.0 + 1);
    assert!(lock.release(&next).await.unwrap());
}

/// A grant with two holds gives one up and keeps the lock, token and lease; a grant that no
/// longer holds (a wrong token, or expired and taken over by another client) changes nothing.
/// Neither moves the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_last_hold_of_a_holding_grant_passes() {
    if skip_printed("mongo") {
        return;
    }
    let lock = client().await;
    let other = client().await;
    let name = lock_name("only");
    let first = request(&lock, &name, Duration::from_secs(30));
    let from = granted(&lock, &first).await;
    let twice = granted(&lock, &first).await;
    assert_eq!((twice.token, twice.hold_count), (from.token, 2));

    let to = request(&lock, &name, Duration::from_secs(5));
    let kept = lock.hand_over(&twice, &to).await.unwrap();
    assert!(matches!(kept, HandOver::Released(true)), "{kept:?}");
    let info = held(&lock, &name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&first.owner, 1, from.token)
    );
    assert!(
        info.remaining.unwrap() > Duration::from_secs(20),
        "lease kept"
    );

    // A wrong token: nothing changes.
    let mut wrong = from.clone();
    wrong.token.0 += 1;
    let stale = lock.hand_over(&wrong, &to).await.unwrap();
    assert!(matches!(stale, HandOver::Released(false)), "{stale:?}");
    let info = held(&lock, &name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&first.owner, 1, from.token)
    );
    assert_eq!(counter(&lock, &name).await, from.token.0, "no token issued");
    assert!(lock.release(&from).await.unwrap());

    // Expired and taken over by another client: nothing changes.
    let short = granted(&lock, &request(&lock, &name, Duration::from_millis(200))).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taker = request(&other, &name, Duration::from_secs(30));
    let taken = granted(&other, &taker).await;
    assert!(taken.token > short.token);
    let stale = lock.hand_over(&short, &to).await.unwrap();
    assert!(matches!(stale, HandOver::Released(false)), "{stale:?}");
    let info = held(&lock, &name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&taker.owner, 1, taken.token)
    );
    assert_eq!(counter(&lock, &name).await, taken.token.0);
    assert!(other.release(&taken).await.unwrap());
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
    let g = granted(&lock, &request(&lock, &name, ttl)).await;
    // The driver's monitor may check the server now and then: the fewest of a few tries shows
    // what a hand-over itself takes.
    let mut handed = Vec::new();
    let mut kept = Vec::new();
    let mut g = g;
    for _ in 0..5 {
        let (done, n) = trips(&proxy, lock.hand_over(&g, &request(&lock, &name, ttl))).await;
        let HandOver::Handed(h) = done.unwrap() else {
            panic!("not handed over");
        };
        handed.push(n);
        assert_eq!(h.token.0, g.token.0 + 1);
        g = h;
        let again = AcquireRequest::new(name.clone(), g.owner.clone(), ttl).unwrap();
        let twice = granted(&lock, &again).await;
        let (done, n) = trips(&proxy, lock.hand_over(&twice, &request(&lock, &name, ttl))).await;
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
    let from = granted(&lock, &request(&lock, &name, ttl)).await;
    let notices = match waiter.subscribe(&name).await {
        Ok(n) => n,
        Err(e) => panic!("the test server has change streams: {e}"),
    };
    let HandOver::Handed(g) = lock
        .hand_over(&from, &request(&lock, &name, ttl))
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
    let twice = granted(&lock, &again).await;
    let kept = lock
        .hand_over(&twice, &request(&lock, &name, ttl))
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
