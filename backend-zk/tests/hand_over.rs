//! Hand-offs to a waiter queued right behind the holder's node: when the holder releases, the
//! deletion event makes the waiter the holder without listing the queue again — whether the
//! node was a grant this client released (tasks of one client), or was first when the waiter
//! last looked (another client's holder). Counted by a loopback proxy between a client and the
//! server (a round trip: the client speaks after the server did).

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::given::{handoff_round_trips, skip_printed, unique_name};
use distlock_conformance::Proxy;
use distlock_zk::{LockOptions, ZkConfig, ZkLock};

/// Long enough that the client's pings are seconds apart, so one rarely lands in a hand-off.
const SESSION: Duration = Duration::from_secs(20);

fn waiting() -> LockOptions {
    LockOptions::new().wait(Duration::from_secs(10))
}

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

/// Tasks of one client: holder, then two waiters. The second queued behind the first while the
/// holder held, so its predecessor was not first when it looked: only the client's record of
/// the grants it released tells it that the node it watched held the lock. Its hand-off is the
/// first waiter's release alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_grant_its_own_client_released_takes_over_on_the_deletion_event() {
    if skip_printed("zk") {
        return;
    }
    let (client, proxy) = behind_proxy().await;
    let name = unique_name("handoff");
    let counts = handoff_round_trips(&client, &client, &proxy, &name, &waiting(), 2, 3).await;
    // A ping of the session may land in a hand-off now and then: the fewest of three shows
    // what a hand-off itself takes (listing the queue again would make every one 2).
    assert_eq!(
        counts.iter().min(),
        Some(&1),
        "round trips from the release to the waiter's grant, per hand-off: {counts:?}"
    );
}

/// Another client's holder, and a waiter right behind it: the waiter sends nothing between the
/// release and its grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_right_behind_another_clients_holder_takes_over_on_the_deletion_event_alone() {
    if skip_printed("zk") {
        return;
    }
    let (waiting_client, proxy) = behind_proxy().await;
    let direct = ZkConfig::from_url(&distlock_zk::DESCRIPTOR.test_url())
        .unwrap()
        .default_ttl(SESSION);
    let holding = Arc::new(ZkLock::connect(direct).await.unwrap());
    let name = unique_name("cross-handoff");
    let counts =
        handoff_round_trips(&holding, &waiting_client, &proxy, &name, &waiting(), 1, 3).await;
    assert_eq!(
        counts.iter().min(),
        Some(&0),
        "the waiter's round trips per hand-off: {counts:?}"
    );
}
