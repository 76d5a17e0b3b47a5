//! Cross-process wake-ups through the client's change stream: a waiter on another client (its
//! own `MongoLock::connect`, as another process would have) is woken by the holder's release,
//! not by its backoff; several waiters of a client share one stream, which ends by itself
//! after the linger; a cancelled or timed-out waiter leaves no subscription behind; and
//! against a server without change streams (a private `secantusd-rs --standalone`) the
//! subscription is refused, the refusal remembered, and waiters poll.
//!
//! Uses the server at `DISTLOCK_MONGO_URL` (default `mongodb://127.0.0.1:27017`, which
//! `scripts/services up mongo` starts as a single-node replica set), except the fallback test,
//! which starts a private standalone server on a port of its own.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::private_server::PrivateServer;
use distlock_conformance::given::skip_printed;
use distlock_mongo::{
    DistributedLock, ErrorKind, LockExt, LockName, LockOptions, MongoConfig, MongoLock,
};

/// Ports of this test's private servers (fencing.rs uses 20000-20999, tls.rs 21000-21499).
const PORTS: std::ops::Range<u16> = 21500..22000;
/// A backoff no polling waiter could hand over within [`PROMPT`] with: its first step is
/// 10-20 s.
const SLOW_BASE: Duration = Duration::from_secs(20);
const SLOW_CAP: Duration = Duration::from_secs(60);
/// How soon after a release a woken waiter must hold the lock: far above a wake-up's few
/// milliseconds (for a loaded machine), far below the slow backoff's first step and below the
/// 5 s re-check of a waiter that never hears a notice.
const PROMPT: Duration = Duration::from_secs(2);
/// A lease no hand-off in these tests waits for.
const LONG: Duration = Duration::from_secs(60);

fn url() -> String {
    distlock_mongo::DESCRIPTOR.test_url()
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{:08x}",
        std::process::id(),
        distlock_conformance::unique_suffix()
    )
}

async fn connect(config: MongoConfig) -> Arc<MongoLock> {
    match MongoLock::connect(config).await {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("{e}\n  start the server: scripts/services up mongo"),
    }
}

/// A client whose polling alone could not hand over within [`PROMPT`].
async fn slow_poller(url: &str, change_streams: bool) -> Arc<MongoLock> {
    connect(
        MongoConfig::from_url(url)
            .unwrap()
            .backoff(SLOW_BASE, SLOW_CAP)
            .change_streams(change_streams),
    )
    .await
}

async fn held(holder: &Arc<MongoLock>, name: &str) -> distlock_mongo::LockGuard {
    holder
        .try_lock_with(name, &LockOptions::new().ttl(LONG))
        .await
        .unwrap()
        .expect("the lock is free")
}

/// Polls `f` every 10 ms until it holds, for at most `bound`.
async fn eventually(bound: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !f() {
        assert!(Instant::now() < deadline, "not within {bound:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_another_client_gets_the_lock_at_the_release_not_its_backoff() {
    if skip_printed("mongo") {
        return;
    }
    let url = url();
    let holder = connect(MongoConfig::from_url(&url).unwrap()).await;
    let waiter = slow_poller(&url, true).await;
    let name = unique("signal");
    let mut delays = Vec::new();
    for round in 0..5 {
        let g = held(&holder, &name).await;
        let (w, n) = (waiter.clone(), name.clone());
        let task = tokio::spawn(async move {
            let g = w.lock(&n, Duration::from_secs(30)).await;
            (Instant::now(), g)
        });
        // The waiter's attempt finds the lock held, it subscribes and attempts once more.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !task.is_finished(),
            "round {round}: the waiter did not wait"
        );
        let released = Instant::now();
        assert!(g.release().await.unwrap());
        let (granted, g2) = tokio::time::timeout(PROMPT * 2, task)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter was not woken by the release"))
            .unwrap();
        let delay = granted.saturating_duration_since(released);
        assert!(
            delay < PROMPT,
            "round {round}: granted {delay:?} after the release"
        );
        delays.push(delay);
        assert!(g2.unwrap().release().await.unwrap());
    }
    delays.sort();
    eprintln!(
        "release-to-grant on another client: median {:?}, max {:?}",
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    );
    assert_eq!(
        waiter.change_streams_opened(),
        1,
        "one stream for all rounds"
    );
    assert_eq!(holder.change_streams_opened(), 0, "the holder never waited");

    // The control: the same waiter without its change stream polls, and misses the bound.
    let poller = slow_poller(&url, false).await;
    let g = held(&holder, &name).await;
    let (p, n) = (poller.clone(), name.clone());
    let mut task = tokio::spawn(async move { p.lock(&n, Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(g.release().await.unwrap());
    let early = tokio::time::timeout(PROMPT, &mut task).await;
    assert!(
        early.is_err(),
        "a poller with a 10 s step was granted: {early:?}"
    );
    task.abort();
    let e = poller.subscribe(&LockName::new(&name).unwrap()).await;
    assert_eq!(e.err().map(|e| e.kind()), Some(ErrorKind::Unsupported));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_client_share_one_stream_which_ends_after_the_linger() {
    if skip_printed("mongo") {
        return;
    }
    let url = url();
    let holder = connect(MongoConfig::from_url(&url).unwrap()).await;
    let waiter = slow_poller(&url, true).await;
    let prefix = unique("shared");
    let names: Vec<String> = (0..3).map(|i| format!("{prefix}-{i}")).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(held(&holder, n).await);
    }
    let tasks: Vec<_> = names
        .iter()
        .map(|n| {
            let (w, n) = (waiter.clone(), n.clone());
            tokio::spawn(async move { w.lock(&n, Duration::from_secs(30)).await })
        })
        .collect();
    let w = waiter.clone();
    eventually(Duration::from_secs(10), "three names subscribed", || {
        w.watched_names() == 3
    })
    .await;
    assert!(waiter.change_stream_open());
    assert_eq!(
        waiter.change_streams_opened(),
        1,
        "three waiters, one stream"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    for g in guards {
        assert!(g.release().await.unwrap());
    }
    for t in tasks {
        let g = t.await.unwrap().expect("granted");
        assert!(g.release().await.unwrap());
    }
    assert!(
        released.elapsed() < PROMPT,
        "all three woken by their releases: {:?}",
        released.elapsed()
    );
    assert_eq!(waiter.watched_names(), 0, "the waiters are done");
    assert!(waiter.change_stream_open(), "the stream outlives the waits");
    // A new wait in the linger joins the open stream.
    let g = held(&holder, &names[0]).await;
    let (w, n) = (waiter.clone(), names[0].clone());
    let task = tokio::spawn(async move { w.lock(&n, Duration::from_secs(30)).await });
    let w = waiter.clone();
    eventually(Duration::from_secs(10), "subscribed again", || {
        w.watched_names() == 1
    })
    .await;
    assert!(g.release().await.unwrap());
    assert!(task.await.unwrap().unwrap().release().await.unwrap());
    assert_eq!(
        waiter.change_streams_opened(),
        1,
        "joined the lingering one"
    );
    // With no subscriber it ends by itself 10-12.5 s later.
    let idle = Instant::now();
    let w = waiter.clone();
    eventually(Duration::from_secs(20), "the idle stream ended", || {
        !w.change_stream_open()
    })
    .await;
    assert!(
        idle.elapsed() >= Duration::from_secs(9),
        "ended too soon: {:?}",
        idle.elapsed()
    );
    // The next wait opens a new one.
    let g = held(&holder, &names[1]).await;
    let (w, n) = (waiter.clone(), names[1].clone());
    let task = tokio::spawn(async move { w.lock(&n, Duration::from_secs(30)).await });
    let w = waiter.clone();
    eventually(Duration::from_secs(10), "a new stream", || {
        w.change_streams_opened() == 2 && w.watched_names() == 1
    })
    .await;
    assert!(g.release().await.unwrap());
    assert!(task.await.unwrap().unwrap().release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_or_timed_out_waiter_leaves_no_subscription() {
    if skip_printed("mongo") {
        return;
    }
    let url = url();
    let holder = connect(MongoConfig::from_url(&url).unwrap()).await;
    let waiter = slow_poller(&url, true).await;
    let name = unique("cancel");
    let g = held(&holder, &name).await;

    // Dropped while waiting.
    let (w, n) = (waiter.clone(), name.clone());
    let task = tokio::spawn(async move { w.lock(&n, Duration::from_secs(30)).await });
    let w = waiter.clone();
    eventually(Duration::from_secs(10), "subscribed", || {
        w.watched_names() == 1
    })
    .await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(waiter.watched_names(), 0, "the dropped wait unsubscribed");

    // Dropped by a timeout around it, and ended by its own wait bound.
    let outer = tokio::time::timeout(
        Duration::from_millis(500),
        waiter.lock(&name, Duration::from_secs(30)),
    )
    .await;
    assert!(outer.is_err(), "still held");
    assert_eq!(
        waiter.watched_names(),
        0,
        "the timed-out future unsubscribed"
    );
    let e = waiter
        .lock(&name, Duration::from_millis(500))
        .await
        .expect_err("still held");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(waiter.watched_names(), 0, "the timed-out wait unsubscribed");
    assert!(waiter.change_stream_open(), "the stream itself lingers");
    assert_eq!(waiter.change_streams_opened(), 1);
    assert!(g.release().await.unwrap());
}

/// A private `secantusd-rs --standalone` (no change streams).
struct Standalone(PrivateServer);

impl Standalone {
    fn start() -> Self {
        Self(PrivateServer::start(
            "standalone",
            PORTS,
            &["--standalone".as_ref()],
        ))
    }

    fn url(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?connect_timeout=10s", self.0.port)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_change_streams_the_subscription_is_refused_and_waiters_poll() {
    if skip_printed("mongo") {
        return;
    }
    let server = tokio::task::block_in_place(Standalone::start);
    let url = server.url();
    let holder = connect(MongoConfig::from_url(&url).unwrap()).await;
    // Polls with the default backoff (2 ms doubling to 100 ms).
    let waiter = connect(MongoConfig::from_url(&url).unwrap()).await;
    assert_eq!(waiter.server().replica_set, None, "a standalone topology");
    let name = unique("standalone");
    let lock_name = LockName::new(&name).unwrap();

    // The server's refusal (40573: change streams need a replica set) ...
    let e = waiter
        .subscribe(&lock_name)
        .await
        .err()
        .expect("a standalone server has no change streams");
    assert_eq!(e.kind(), ErrorKind::Backend, "the server's refusal: {e}");
    // ... is remembered: the next subscription is refused at once, without asking.
    let started = Instant::now();
    let e = waiter.subscribe(&lock_name).await.err().expect("refused");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "remembered: {e}");
    assert!(started.elapsed() < Duration::from_millis(50));
    assert_eq!(waiter.change_streams_opened(), 0);
    assert_eq!(
        waiter.watched_names(),
        0,
        "the refused subscriptions left nothing"
    );

    // Waiters still get the lock, by polling.
    for round in 0..3 {
        let g = held(&holder, &name).await;
        let (w, n) = (waiter.clone(), name.clone());
        let task = tokio::spawn(async move {
            let g = w.lock(&n, Duration::from_secs(30)).await;
            (Instant::now(), g)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !task.is_finished(),
            "round {round}: the waiter did not wait"
        );
        let released = Instant::now();
        assert!(g.release().await.unwrap());
        let (granted, g2) = task.await.unwrap();
        let g2 = g2.unwrap_or_else(|e| panic!("round {round}: {e}"));
        let delay = granted.saturating_duration_since(released);
        // One capped backoff step plus round trips.
        assert!(
            delay < PROMPT,
            "round {round}: granted {delay:?} after the release"
        );
        assert!(g2.release().await.unwrap());
    }
    assert!(!waiter.change_stream_open());
    drop(server);
}
