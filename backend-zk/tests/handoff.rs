//! Hand-offs to a waiter queued right behind the holder's node: when the holder releases, the
//! deletion event makes the waiter the holder without listing the queue again — whether the
//! holder is a task of the same client (its node was a grant this client released) or another
//! client (its node was first when the waiter last looked). Counted by a loopback proxy between
//! a client and the server (a round trip: the client speaks after the server did). Whatever the
//! count, the two never hold at once and the tokens increase.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::given::{skip_printed, unique_name};
use distlock_conformance::Proxy;
use distlock_zk::{LockExt, ZkConfig, ZkLock};

/// Long enough that the client's pings are seconds apart, so one rarely lands in a hand-off.
const SESSION: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(10);

/// A client behind a counting proxy in front of the first server, and the proxy.
async fn behind_proxy() -> (Arc<ZkLock>, Proxy) {
    let direct = ZkConfig::from_url(&distlock_zk::DESCRIPTOR.test_url()).unwrap();
    let upstream = direct.hosts().split(',').next().unwrap().to_string();
    let proxy = Proxy::start(upstream).await;
    let config = ZkConfig::from_url(&format!("zk://{}", proxy.addr()))
        .unwrap()
        .default_ttl(SESSION);
    let client = Arc::new(
        ZkLock::connect(config)
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start ZooKeeper: scripts/services up zookeeper")),
    );
    (client, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_its_own_clients_holder_takes_over_on_the_deletion_event_alone() {
    if skip_printed("zk") {
        return;
    }
    let (client, proxy) = behind_proxy().await;
    let name = unique_name("handoff");
    let mut counts = Vec::new();
    let mut holder = client.lock(&name, WAIT).await.unwrap();
    for _ in 0..3 {
        let held = Arc::new(AtomicBool::new(true));
        let waiter = {
            let (client, name, held) = (client.clone(), name.clone(), held.clone());
            tokio::spawn(async move {
                let g = client.lock(&name, WAIT).await.unwrap();
                assert!(
                    !held.load(Ordering::SeqCst),
                    "granted while the holder had not begun its release"
                );
                g
            })
        };
        // The waiter queues (create, list, watch), then sits on its watch.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "the waiter must wait for the holder");
        let before = proxy.round_trips();
        held.store(false, Ordering::SeqCst);
        let old = holder.token();
        assert!(holder.release().await.unwrap(), "the holder held");
        holder = waiter.await.unwrap();
        counts.push(proxy.round_trips() - before);
        assert!(holder.token() > old, "{:?} after {old:?}", holder.token());
    }
    holder.release().await.unwrap();
    // A ping of the session may land in a hand-off now and then: the fewest of three shows
    // what a hand-off itself takes (listing the queue again would make every one 2).
    assert_eq!(
        counts.iter().min(),
        Some(&1),
        "round trips from release to the waiter's grant, per hand-off: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_right_behind_another_clients_holder_takes_over_on_the_deletion_event_alone() {
    if skip_printed("zk") {
        return;
    }
    let (waiting, proxy) = behind_proxy().await;
    let direct = ZkConfig::from_url(&distlock_zk::DESCRIPTOR.test_url())
        .unwrap()
        .default_ttl(SESSION);
    let holding = Arc::new(ZkLock::connect(direct).await.unwrap());
    let name = unique_name("cross-handoff");
    let mut counts = Vec::new();
    for _ in 0..3 {
        let holder = holding.lock(&name, WAIT).await.unwrap();
        let waiter = {
            let (waiting, name) = (waiting.clone(), name.clone());
            tokio::spawn(async move { waiting.lock(&name, WAIT).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "the waiter must wait for the holder");
        let before = proxy.round_trips();
        let old = holder.token();
        assert!(holder.release().await.unwrap(), "the holder held");
        let g = waiter.await.unwrap();
        counts.push(proxy.round_trips() - before);
        assert!(g.token() > old, "{:?} after {old:?}", g.token());
        g.release().await.unwrap();
    }
    // The waiter's own round trips from the release to its grant: none (listing the queue
    // again would be one; a ping of its session may land in one hand-off now and then).
    assert_eq!(
        counts.iter().min(),
        Some(&0),
        "the waiter's round trips per hand-off: {counts:?}"
    );
}
