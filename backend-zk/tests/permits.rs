//! ZooKeeper's semaphores, beyond the conformance suite: how waiters are woken (by a watch, one
//! waiter per release, counted by loopback proxies between each waiter's client and the
//! server), what a conflicting request meets, and a permit's session ending.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::given::{skip_printed, unique_name};
use distlock_conformance::Proxy;
use distlock_zk::zookeeper_client as zk;
use distlock_zk::{
    ErrorKind, FencingToken, LockExt, LockGuard, LockOptions, LostReason, ZkConfig, ZkLock,
};
use tokio::task::JoinHandle;

/// Long enough that a client's pings are 9 s apart, so one rarely lands in a window counted
/// here.
const QUIET_SESSION: Duration = Duration::from_secs(60);
/// A generous bound on every step below.
const BOUND: Duration = Duration::from_secs(10);

fn direct_config() -> ZkConfig {
    ZkConfig::from_url(&distlock_zk::DESCRIPTOR.test_url()).expect("DISTLOCK_ZK_URL")
}

async fn connect(config: ZkConfig) -> Arc<ZkLock> {
    Arc::new(
        ZkLock::connect(config)
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start ZooKeeper: scripts/services up zookeeper")),
    )
}

/// A client behind a counting proxy in front of the first server, and the proxy.
async fn behind_proxy() -> (Arc<ZkLock>, Proxy) {
    let upstream = direct_config()
        .hosts()
        .split(',')
        .next()
        .unwrap()
        .to_string();
    let proxy = Proxy::start(upstream).await;
    let config = ZkConfig::from_url(&format!("zk://{}", proxy.addr()))
        .unwrap()
        .default_ttl(QUIET_SESSION);
    (connect(config).await, proxy)
}

async fn queue_len(lock: &ZkLock, name: &str) -> usize {
    let path = lock.lock_path(name).unwrap();
    lock.client()
        .list_children(&path)
        .await
        .map_or(0, |c| c.len())
}

async fn wait_for_queue(lock: &ZkLock, name: &str, len: usize) {
    let by = Instant::now() + BOUND;
    while queue_len(lock, name).await != len {
        assert!(
            Instant::now() < by,
            "the queue of {name} never had {len} nodes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `count` waiters for a permit of `name` (of `max`), each on a client of its own behind a
/// proxy, queued one after another behind `held` nodes (so in this order), then left to settle
/// on their watches.
async fn queue_waiters(
    observer: &ZkLock,
    name: &str,
    max: u32,
    held: usize,
    count: usize,
) -> Vec<(JoinHandle<LockGuard>, Proxy)> {
    let mut waiters = Vec::new();
    for i in 0..count {
        let (client, proxy) = behind_proxy().await;
        let task = {
            let name = name.to_string();
            tokio::spawn(async move {
                let opts = LockOptions::new().wait(Duration::from_secs(60));
                client.permit(&name, max, &opts).await.expect("a permit")
            })
        };
        wait_for_queue(observer, name, held + i + 1).await;
        waiters.push((task, proxy));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiters.iter().all(|(t, _)| !t.is_finished()),
        "a waiter was granted while every permit was held"
    );
    waiters
}

fn round_trips(waiters: &[(JoinHandle<LockGuard>, Proxy)]) -> Vec<u64> {
    waiters.iter().map(|(_, p)| p.round_trips()).collect()
}

/// Waiters beyond `max` send nothing while they wait (no polling: at most a session ping in
/// two seconds), and the first of them is granted when a holder releases, promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_beyond_max_is_granted_at_a_release_by_its_watch_not_by_polling() {
    if skip_printed("zk") {
        return;
    }
    let holder = connect(direct_config()).await;
    let name = unique_name("sem-watch");
    let opts = LockOptions::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(holder.try_permit(&name, 2, &opts).await.unwrap().unwrap());
    }
    let waiters = queue_waiters(&holder, &name, 2, 2, 3).await;

    let before = round_trips(&waiters);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = round_trips(&waiters);
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(
            a - b <= 1,
            "waiter {i} made {} round trips in 2 s of waiting: it polls",
            a - b
        );
    }
    assert!(waiters.iter().all(|(t, _)| !t.is_finished()));

    let released = Instant::now();
    let last = held.pop().unwrap();
    let last_token = last.token();
    assert!(last.release().await.unwrap());
    let mut waiters = waiters.into_iter();
    let (first, _proxy) = waiters.next().unwrap();
    let g = tokio::time::timeout(BOUND, first)
        .await
        .expect("the first waiter was not granted at the release")
        .unwrap();
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "granted {took:?} after the release"
    );
    assert!(g.token() > last_token);
    let info = holder.holder(&name).await.unwrap().expect("held");
    assert_eq!(info.permits, (2, 2));
    assert_eq!(info.token, held[0].token(), "the oldest permit");
    // The others still wait: one permit was freed.
    let rest: Vec<_> = waiters.collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rest.iter().all(|(t, _)| !t.is_finished()));
    for (t, _) in &rest {
        t.abort();
    }
    assert!(g.release().await.unwrap());
    assert!(held.pop().unwrap().release().await.unwrap());
}

/// One release wakes one waiter: of five waiters, the one granted and the next in line (which
/// takes over the watch on the queue) speak after a release; the ones behind them do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_not_the_whole_queue() {
    if skip_printed("zk") {
        return;
    }
    const WAITERS: usize = 5;
    const RELEASES: usize = 3;
    let holder = connect(direct_config()).await;
    let name = unique_name("sem-herd");
    let opts = LockOptions::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(holder.try_permit(&name, 2, &opts).await.unwrap().unwrap());
    }
    let mut waiters = queue_waiters(&holder, &name, 2, 2, WAITERS).await;
    let mut tasks: Vec<Option<JoinHandle<LockGuard>>> = Vec::new();
    let mut proxies = Vec::new();
    for (t, p) in waiters.drain(..) {
        tasks.push(Some(t));
        proxies.push(p);
    }
    let counts = |proxies: &[Proxy]| proxies.iter().map(Proxy::round_trips).collect::<Vec<_>>();
    let mut beyond_next = Vec::new();
    for i in 0..RELEASES {
        let before = counts(&proxies);
        let freed = held.remove(0);
        let freed_token = freed.token();
        assert!(freed.release().await.unwrap());
        let g = tokio::time::timeout(BOUND, tasks[i].take().unwrap())
            .await
            .unwrap_or_else(|_| panic!("waiter {i} was not granted at release {i}"))
            .unwrap();
        assert!(g.token() > freed_token);
        // Let the next in line take over the watch.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = counts(&proxies);
        let spoke: Vec<usize> = (0..WAITERS).filter(|&w| after[w] > before[w]).collect();
        assert!(
            spoke.contains(&i),
            "release {i}: the granted waiter {i} never spoke"
        );
        for (w, t) in tasks.iter().enumerate().skip(i + 1) {
            assert!(
                t.as_ref().is_some_and(|t| !t.is_finished()),
                "release {i}: waiter {w} was granted too"
            );
        }
        beyond_next.push(spoke.iter().filter(|&&w| w > i + 1).count());
        held.push(g);
    }
    // A session ping may land in a window now and then: the quietest of three shows what a
    // release itself wakes.
    assert_eq!(
        beyond_next.iter().min(),
        Some(&0),
        "waiters behind the next in line that spoke after each release: {beyond_next:?}"
    );
    for t in tasks.into_iter().flatten() {
        t.abort();
    }
    for g in held {
        assert!(g.release().await.unwrap());
    }
}

/// The size is stored with the semaphore (in its nodes' names): another size, a lock on a
/// semaphore's name and a permit on a locked name are refused, at once or while waiting, and
/// leave no node behind. A node of another size queued ahead (a conflicting request that has
/// not yet looked) is waited for, never counted as a holder's peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_requests_are_invalid_argument_and_leave_nothing() {
    if skip_printed("zk") {
        return;
    }
    let (a, b) = (
        connect(direct_config()).await,
        connect(direct_config()).await,
    );
    let name = unique_name("sem-conflict");
    let opts = LockOptions::new();
    let waiting = LockOptions::new().wait(Duration::from_millis(500));
    let p = a.try_permit(&name, 3, &opts).await.unwrap().expect("free");
    let dir = a.lock_path(&name).unwrap();
    let children = a.client().list_children(&dir).await.unwrap();
    assert!(
        children.len() == 1 && children[0].contains("-sem3-lock-"),
        "{children:?}"
    );
    for max in [2, 4, 1] {
        let e = b.try_permit(&name, max, &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "max {max}: {e}");
        let e = b.permit(&name, max, &waiting).await.unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::InvalidArgument,
            "max {max}, waiting: {e}"
        );
    }
    let e = b.try_lock(&name).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "a lock: {e}");
    let e = b.lock(&name, Duration::from_millis(500)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "a lock, waiting: {e}");
    assert_eq!(
        queue_len(&a, &name).await,
        1,
        "a refused request left a node"
    );

    // A lock's node queued behind the holder, not yet judged by its owner: a permit queued
    // after it waits for it instead of holding with permits free.
    let raw = a.client();
    let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, seq) = raw
        .create(&format!("{dir}/_c_raw-lock-"), b"{}", &mode)
        .await
        .unwrap();
    let raw_node = format!("{dir}/_c_raw-lock-{seq}");
    assert!(b.try_permit(&name, 3, &opts).await.unwrap().is_none());
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.permit(&name, 3, &LockOptions::new().wait(BOUND))
                .await
                .expect("a permit once the lock's node is gone")
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "held beside a lock's node ahead");
    raw.delete(&raw_node, None).await.unwrap();
    let q = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    assert_eq!(a.holder(&name).await.unwrap().unwrap().permits, (2, 3));
    assert!(p.release().await.unwrap());
    assert!(q.release().await.unwrap());

    // And a permit on a locked name.
    let l = a.try_lock(&name).await.unwrap().expect("free again");
    let e = b.try_permit(&name, 2, &opts).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = b.permit(&name, 2, &waiting).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "waiting: {e}");
    assert_eq!(
        queue_len(&a, &name).await,
        1,
        "a refused request left a node"
    );
    assert!(l.release().await.unwrap());
}

/// Force-release frees the one permit of the token given, the oldest or another, and wakes a
/// waiter; the permit's guard learns it lost at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_frees_the_permit_of_its_token() {
    if skip_printed("zk") {
        return;
    }
    let (a, b) = (
        connect(direct_config()).await,
        connect(direct_config()).await,
    );
    let name = unique_name("sem-force");
    let opts = LockOptions::new();
    let first = a.try_permit(&name, 2, &opts).await.unwrap().unwrap();
    let second = a.try_permit(&name, 2, &opts).await.unwrap().unwrap();
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.permit(&name, 2, &LockOptions::new().wait(BOUND))
                .await
                .unwrap()
        })
    };
    wait_for_queue(&a, &name, 3).await;
    let stale = FencingToken(second.token().0 + 1);
    assert!(!b.force_release(&name, stale).await.unwrap());
    assert!(b.force_release(&name, second.token()).await.unwrap());
    let g = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    let reason = tokio::time::timeout(BOUND, second.lost())
        .await
        .expect("the forced permit's guard never learnt it");
    assert!(matches!(reason, LostReason::Taken(_)), "{reason:?}");
    assert!(!first.is_lost());
    let info = b.holder(&name).await.unwrap().unwrap();
    assert_eq!((info.token, info.permits), (first.token(), (2, 2)));
    assert!(first.release().await.unwrap());
    assert!(g.release().await.unwrap());
}

/// A permit lives with its session: when the session is closed behind the holder's back, its
/// node goes, its guard reports lost, the waiter is granted, and the other permit stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permits_session_ending_frees_it() {
    if skip_printed("zk") {
        return;
    }
    const SESSION: Duration = Duration::from_secs(1);
    let config = direct_config().default_ttl(SESSION);
    let (dying, staying, waiting) = (
        connect(config.clone()).await,
        connect(direct_config()).await,
        connect(direct_config()).await,
    );
    let name = unique_name("sem-session");
    let opts = LockOptions::new();
    let doomed = dying.try_permit(&name, 2, &opts).await.unwrap().unwrap();
    let kept = staying.try_permit(&name, 2, &opts).await.unwrap().unwrap();
    let lost = doomed.lost();
    let waiter = {
        let (waiting, name) = (waiting.clone(), name.clone());
        tokio::spawn(async move {
            let g = waiting
                .permit(&name, 2, &LockOptions::new().wait(Duration::from_secs(60)))
                .await;
            (Instant::now(), g)
        })
    };
    wait_for_queue(&staying, &name, 3).await;

    // Close the holder's session behind its back: another connection attaches to it (id and
    // password) and closes it, which deletes its ephemeral nodes. The holder's client may win
    // its session back first; then try again.
    let info = dying.client().session().clone();
    let closing_by = Instant::now() + Duration::from_secs(40);
    'closing: loop {
        assert!(Instant::now() < closing_by, "could not close the session");
        let attach = zk::Client::connector()
            .with_session(info.clone())
            .with_session_timeout(SESSION)
            .connect(config.hosts());
        match tokio::time::timeout(SESSION * 2, attach).await {
            Ok(Ok(thief)) => {
                let mut state = thief.state_watcher();
                drop(thief);
                let _ = tokio::time::timeout(SESSION * 2, async {
                    while !state.changed().await.is_terminated() {}
                })
                .await;
            }
            Ok(Err(zk::Error::SessionExpired)) => {}
            Ok(Err(_)) | Err(_) => continue,
        }
        let gone_by = Instant::now() + SESSION * 2;
        while Instant::now() < gone_by {
            if queue_len(&staying, &name).await < 3 {
                break 'closing;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let closed = Instant::now();
    let reason = tokio::time::timeout(BOUND, lost)
        .await
        .expect("lost() did not fire after the session ended");
    // The server's notice that the session ended says `Session`; a holder whose client the
    // attach kicked off may first see its safe-until pass unconfirmed, and say `Expired`.
    assert!(
        matches!(reason, LostReason::Session(_) | LostReason::Expired),
        "{reason:?}"
    );
    let (granted, g) = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    let g = g.expect("the waiter's permit");
    eprintln!(
        "granted {:?} after the session was closed",
        granted.saturating_duration_since(closed)
    );
    assert!(g.token() > doomed.token() && g.token() > kept.token());
    assert!(!kept.is_lost());
    assert_eq!(
        staying.holder(&name).await.unwrap().unwrap().permits,
        (2, 2)
    );
    assert!(!doomed.release().await.unwrap());
    assert!(kept.release().await.unwrap());
    assert!(g.release().await.unwrap());
}
