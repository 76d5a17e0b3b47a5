//! Round trips of a hand-off between two tasks of one client, counted by a loopback proxy
//! between the client and the server (a round trip: the client speaks after the server did).
//! The waiter is the one task of the client polling for the name; the holder's release hands
//! the lock to it through the handle (`hand_over`, one `findAndModify` that gives up the
//! holder's grant and grants the waiter): one request, whatever the waiter's backoff step (a
//! minute here), where a release and the waiter's next attempt would take two.

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::given::handoff_round_trips;
use distlock_conformance::{hosts_of, reroute, Proxy};
use distlock_mongo::{LockOptions, MongoConfig, MongoLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_between_tasks_of_one_client_is_the_release_alone() {
    if distlock_conformance::given::skip_printed("mongo") {
        return;
    }
    let url = distlock_mongo::DESCRIPTOR.test_url();
    let first = hosts_of(&url)[0].clone();
    let proxy = Proxy::start(first.clone()).await;
    // A direct connection, so the driver does not go looking for the server's own address.
    let proxied = reroute(&url, &[first], &[proxy.addr()]);
    let sep = if proxied.contains('?') { '&' } else { '?' };
    let proxied = format!("{proxied}{sep}directConnection=true");
    // Without the change stream: it would ask for the next events after each release, on a
    // connection of its own and off the hand-off's path, and the proxy would count that too.
    let config = MongoConfig::from_url(&proxied)
        .unwrap()
        .change_streams(false)
        .backoff(Duration::from_secs(60), Duration::from_secs(60));
    let client = Arc::new(
        MongoLock::connect(config)
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start the server: scripts/services up")),
    );
    let name = format!("trips-{}-{}", std::process::id(), line!());
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(30));
    let counts = handoff_round_trips(&client, &client, &proxy, &name, &opts, 1, 5).await;
    // The driver's monitor may check the server in a hand-off now and then: the fewest of five
    // shows what a hand-off itself takes.
    assert_eq!(
        counts.iter().min(),
        Some(&1),
        "round trips from release to the waiter's grant, per hand-off: {counts:?}"
    );
}
