//! How fast the lock passes from one holder to the next. A hand-off is a delete event to the
//! next waiter and one read, so it must not wait for etcd's 100 ms catch-up of "unsynced"
//! watchers, which a watch lands in when it starts at or below the store's current revision.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::given::handoff_round_trips;
use distlock_etcd::{EtcdLock, LockExt};

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

struct Stats {
    grants: usize,
    took: Duration,
    /// Every acquire's wait, shortest first.
    waits: Vec<Duration>,
}

impl Stats {
    fn mean(&self) -> Duration {
        self.took / self.grants as u32
    }

    fn median_wait(&self) -> Duration {
        self.waits[self.waits.len() / 2]
    }

    fn longest_wait(&self) -> Duration {
        self.waits[self.waits.len() - 1]
    }
}

/// `contenders` clients that each take and release the lock `rounds` times, queueing again
/// right after each release.
async fn contend(what: &str, contenders: usize, rounds: usize) -> Stats {
    let name = common::unique(what);
    let mut clients = Vec::new();
    for _ in 0..contenders {
        clients.push(client().await);
    }
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .map(|c| {
            let name = name.clone();
            tokio::spawn(async move {
                let mut waits = Vec::new();
                for _ in 0..rounds {
                    let asked = Instant::now();
                    let g = c
                        .lock(&name, Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    waits.push(asked.elapsed());
                    assert!(g.release().await.expect("release"));
                }
                waits
            })
        })
        .collect();
    let mut waits = Vec::new();
    for t in tasks {
        waits.extend(t.await.expect("contender panicked"));
    }
    waits.sort();
    let stats = Stats {
        grants: contenders * rounds,
        took: started.elapsed(),
        waits,
    };
    eprintln!(
        "{what}: {} grants among {contenders} clients in {:?}: {:.0}/s, {:?} per grant, \
         median wait {:?}, longest {:?}",
        stats.grants,
        stats.took,
        stats.grants as f64 / stats.took.as_secs_f64(),
        stats.mean(),
        stats.median_wait(),
        stats.longest_wait(),
    );
    let raw = common::raw().await;
    assert_eq!(common::keys_under(&raw, &name).await, Vec::<String>::new());
    stats
}

/// Two clients passing the lock back and forth: each queues right after its release, while
/// the other is already releasing, so nearly every waiter's watch is set up with writes
/// landing around it. Measured on etcd 3.4: watches started at the read's revision average
/// ~50 ms a grant (every hand-off waits for the catch-up, 0-100 ms); at the read's revision
/// + 1, 13-20 ms with single waits over 100 ms; from "now" with a second read (what the
/// backend does), 5-12 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_pong_hand_offs_do_not_wait_for_watch_catch_up() {
    if common::skip() {
        return;
    }
    let stats = contend("pingpong", 2, 40).await;
    // The median, not the mean: a loaded machine adds outliers, while the catch-up delays half
    // of all hand-offs by more than 50 ms (measured here: a median of 8-9 ms).
    assert!(
        stats.median_wait() < Duration::from_millis(40),
        "half the waits took over {:?}: watches are not live",
        stats.median_wait()
    );
}

/// A deeper queue that keeps rotating: hand-offs go through watches set up long before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_queue_hands_off_in_order() {
    if common::skip() {
        return;
    }
    contend("rotate", 8, 10).await;
}

/// A waiter queued well before the release is woken by the delete event: its grant follows the
/// release by one event and one read (a few ms here), never by its wait bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiter_is_woken_by_the_delete_event() {
    if common::skip() {
        return;
    }
    let (a, b) = (client().await, client().await);
    let name = common::unique("wake");
    let mut delays = Vec::new();
    for _ in 0..10 {
        let g = a.try_lock(&name).await.unwrap().expect("free");
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move {
                let g = b.lock(&name, Duration::from_secs(30)).await;
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        assert!(g.release().await.unwrap());
        let (granted, g2) = waiter.await.expect("waiter panicked");
        delays.push(granted.saturating_duration_since(released));
        assert!(g2.expect("waiter failed").release().await.unwrap());
    }
    delays.sort();
    eprintln!(
        "wake after release: median {:?}, max {:?} (10 samples)",
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    );
    // The promise is that the delete event wakes the waiter: nothing else would before its
    // 30 s wait bound (there is no periodic re-check). How fast is the benchmark's to measure
    // (a 250 ms bound here flaked at 531 ms on a loaded 2-core CI run), so the bound only
    // tells a notified waiter from one left waiting.
    assert!(
        delays[delays.len() - 1] < Duration::from_secs(2),
        "{delays:?}"
    );
}

/// The waiters of one client on one lock share one watch of its directory, which outlives
/// their waits (so the next wait finds it live) and ends on its own once nobody waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_client_share_one_watch_that_ends_when_idle() {
    if common::skip() {
        return;
    }
    let (a, b) = (client().await, client().await);
    let name = common::unique("shared-watch");
    let g = a.try_lock(&name).await.unwrap().expect("free");
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move {
                let g = b
                    .lock(&name, Duration::from_secs(30))
                    .await
                    .expect("acquire");
                assert!(g.release().await.unwrap());
            })
        })
        .collect();
    // All three queued behind `a`.
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::keys_under(&common::raw().await, &name).await.len() < 4 {
        assert!(Instant::now() < deadline, "the waiters never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(b.watched_dirs(), 1, "three waiters, one watch");
    assert_eq!(a.watched_dirs(), 0, "the holder watches nothing");
    assert!(g.release().await.unwrap());
    for w in waiters {
        w.await.expect("waiter panicked");
    }
    assert_eq!(b.watched_dirs(), 1, "the watch outlives the waits");
    // It lingers 10-20 s after the last wait began, then ends by itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.watched_dirs() > 0 {
        assert!(Instant::now() < deadline, "the idle watch was never ended");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Tasks of one client: holder, then two waiters. The second queued behind the first while the
/// holder held, so its predecessor was not the oldest entry when it looked: only the client's
/// record of the grants it released tells it that the entry it watched held the lock, and it
/// takes its turn without reading the queue again. Counted by a loopback proxy (a round trip: the
/// client speaks after the server did); gRPC's own frames (window updates, pings, the lease's
/// keep-alives) may add one now and then, so the fewest of five counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_grant_its_own_client_released_takes_over_on_the_delete_event() {
    if common::skip() {
        return;
    }
    let (proxy, proxied) = behind_proxy().await;
    let config = distlock_etcd::EtcdConfig::from_url(&proxied).unwrap();
    let c = Arc::new(EtcdLock::connect(config).await.unwrap_or_else(|e| {
        panic!(
            "the etcd server at {proxied} cannot be reached: {e}\n  start it: scripts/services up"
        )
    }));
    let name = common::unique("own-handoff");
    let counts = handoff_round_trips(&c, &c, &proxy, &name, &waiter_options(), 2, 5).await;
    // The release's request, and here one more turn of the client's own on the same HTTP/2
    // connection after the delete event arrives (it comes in every run, and without the event
    // nothing would be waiting for it); reading the queue again made it 3 or 4.
    let fewest = counts.iter().min().copied();
    assert!(
        fewest.is_some_and(|n| n <= 2),
        "round trips from the release to the waiter's grant, per hand-off: {counts:?}"
    );
}

/// A hand-off between clients: the waiter read, in its last look at the queue, that the entry
/// before its own was the oldest — the holder's — so when the delete event comes it takes its
/// turn without reading the queue again. Through a counting proxy in front of the waiter only,
/// the waiter sends nothing between the holder's release and its own grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_right_behind_another_clients_holder_takes_over_on_the_delete_event_alone() {
    if common::skip() {
        return;
    }
    let (proxy, proxied) = behind_proxy().await;
    let waiting_client = Arc::new(
        EtcdLock::connect(distlock_etcd::EtcdConfig::from_url(&proxied).unwrap())
            .await
            .unwrap(),
    );
    let holding = client().await;
    let name = common::unique("cross-handoff");
    let counts = handoff_round_trips(
        &holding,
        &waiting_client,
        &proxy,
        &name,
        &waiter_options(),
        1,
        5,
    )
    .await;
    assert_eq!(
        counts.iter().min(),
        Some(&0),
        "the waiter's round trips from the release to its grant, per hand-off: {counts:?}"
    );
}

/// A waiter two places back, behind another client's waiter (not the holder) and with its own
/// client's watch of the lock live when it queued: it counts down the entries older than its
/// own as their deletes arrive, and when the last goes it takes its turn without reading the
/// queue again: nothing sent between the release before it and its grant. (Its first wait,
/// before its client watches the lock, reads the queue once after the delete.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_another_clients_waiter_takes_its_turn_when_every_older_entry_is_gone() {
    if common::skip() {
        return;
    }
    let (proxy, proxied) = behind_proxy().await;
    let waiting = Arc::new(
        EtcdLock::connect(distlock_etcd::EtcdConfig::from_url(&proxied).unwrap())
            .await
            .unwrap(),
    );
    let (holding, between) = (client().await, client().await);
    let name = common::unique("counted-down");
    let mut counts = Vec::new();
    for round in 0..4 {
        let held = holding.lock_with(&name, &waiter_options()).await.unwrap();
        let first = tokio::spawn({
            let (between, name) = (between.clone(), name.clone());
            async move { between.lock_with(&name, &waiter_options()).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let second = tokio::spawn({
            let (waiting, name) = (waiting.clone(), name.clone());
            async move { waiting.lock_with(&name, &waiter_options()).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !first.is_finished() && !second.is_finished(),
            "round {round}"
        );
        let token = held.token();
        assert!(held.release().await.unwrap());
        let first = first.await.unwrap();
        assert!(first.token() > token);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!second.is_finished(), "round {round}: granted while held");
        let before = proxy.round_trips();
        let token = first.token();
        assert!(first.release().await.unwrap());
        let second = second.await.unwrap();
        counts.push(proxy.round_trips() - before);
        assert!(second.token() > token);
        assert!(second.release().await.unwrap());
    }
    // From the second round the waiting client's watch of the lock outlives each wait (it
    // lingers for 10 s), so its waiter subscribes before it queues.
    assert_eq!(
        counts[1..].iter().min(),
        Some(&0),
        "the waiter's round trips from the release before it to its grant, per round: {counts:?}"
    );
}

fn waiter_options() -> distlock_etcd::LockOptions {
    distlock_etcd::LockOptions::new().wait(Duration::from_secs(10))
}

/// A counting proxy in front of the first server of the test URL, and that URL with the proxy
/// as its only server (the others of a cluster are left out, so every request goes through it).
async fn behind_proxy() -> (distlock_conformance::Proxy, String) {
    use distlock_conformance::{hosts_of, reroute, Proxy};
    let url = common::url();
    let first = hosts_of(&url)[0].clone();
    let proxy = Proxy::start(first.clone()).await;
    let proxied = reroute(&url, &[first], &[proxy.addr()]);
    let only_proxy = match proxied.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (hosts, tail) = rest.split_at(end);
            let (user, hosts) = hosts
                .rsplit_once('@')
                .map_or((String::new(), hosts), |(u, h)| (format!("{u}@"), h));
            let one = hosts.split(',').next().unwrap_or(hosts);
            format!("{scheme}://{user}{one}{tail}")
        }
        None => proxied,
    };
    (proxy, only_proxy)
}
