//! RedLock hands a lock over between tasks of one client: one round of the hand-over script on
//! the masters gives up the releasing grant and grants the waiting task, decided at a majority
//! like an acquire. Against the test masters (three), with a counting proxy in front of one of
//! them, and with holds removed behind the client's back so that only a minority can pass.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::HandOver;
use distlock_api::{DistributedLock, Grant, LockName};
use distlock_conformance::given::handoff_round_trips;
use distlock_conformance::hand_over::{self, granted, request};
use distlock_conformance::{hosts_of, reroute, Proxy};
use distlock_redis::{LockOptions, RedLock, RedLockConfig};

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redlock");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redlock");
    }
    skip
}

async fn client(url: &str) -> Arc<RedLock> {
    common::redlock_client(url).await
}

/// Whether master `url` has lock `name`'s hash, and whose it is.
async fn owner_on(url: &str, name: &LockName) -> Option<String> {
    use distlock_redis::redis::AsyncCommands;
    let key = RedLockConfig::from_url(&common::redlock_url())
        .unwrap()
        .lock_key(name);
    let mut con = common::raw(url).await.unwrap();
    let fields: Vec<String> = con.hkeys(&key).await.unwrap();
    fields.into_iter().find(|f| !f.starts_with('#'))
}

/// A fresh grant of `name` held on every master, each known to the client: a round ends at a
/// majority, and the last master's answer joins the grant in the background, recorded right
/// after it lands (as in `redlock_pause.rs`).
async fn granted_on_every_master(lock: &RedLock, name: &LockName, masters: &[String]) -> Grant {
    let g = granted(lock, &request(lock, name, Duration::from_secs(30))).await;
    let owner = g.owner.text().to_string();
    let deadline = Instant::now() + Duration::from_secs(3);
    for m in masters {
        while owner_on(m, name).await.as_deref() != Some(owner.as_str()) {
            assert!(Instant::now() < deadline, "{m} never held the grant");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    g
}

/// The script over the masters: a last hold passes with the next token and the new owner's
/// lease; a grant with holds left gives one up and keeps the lock, and a grant that no longer
/// holds changes nothing; no token is issued unseen.
#[tokio::test]
async fn a_redlock_hand_over_passes_only_a_last_hold_and_only_of_a_holding_grant() {
    if skipped() {
        return;
    }
    let url = common::redlock_url();
    let (lock, other) = (client(&url).await, client(&url).await);
    let name = LockName::new(common::unique("redlock-hand-over")).unwrap();
    hand_over::a_last_hold_passes(&*lock, &name).await;
    // A grant the masters do not know: each master's token in its key one higher (and no
    // late joiners, whose record belongs to the real grant).
    let wrong = |g: &Grant| {
        let tokens = g.key.split(';').next().unwrap_or_default();
        let tokens: Vec<String> = tokens
            .split(',')
            .map(|t| match t.parse::<u64>().unwrap() {
                0 => 0,
                t => t + 1,
            })
            .map(|t| t.to_string())
            .collect();
        let mut wrong = g.clone();
        wrong.key = tokens.join(",");
        wrong
    };
    let expired =
        hand_over::only_a_last_hold_of_a_holding_grant_passes_with(&*lock, &*other, &name, wrong)
            .await;
    hand_over::next_grant_follows(&*lock, &name, &expired).await;
}

/// A hand-off between tasks of one client is the release round alone: one request to each
/// master (counted on the first, behind a proxy), where a release and the task's acquire
/// take two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_hand_off_between_tasks_of_one_client_is_one_round() {
    if skipped() {
        return;
    }
    let url = common::redlock_url();
    let hosts = hosts_of(&url);
    let proxy = Proxy::start(hosts[0].clone()).await;
    let proxied = reroute(&url, &hosts[..1], &[proxy.addr()]);
    let lock = client(&proxied).await;
    let name = common::unique("redlock-hand-off-trips");
    // Subscribed throughout, so that a task leaving the release channel sends nothing the
    // proxy would count in a hand-off (as in hand_over.rs).
    let _subscribed = lock
        .subscribe(&LockName::new(name.as_str()).unwrap())
        .await
        .unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(30));
    // One waiting: with more, the order they are handed the lock in is not certain on a
    // polling backend (a release while the handle's polling waiter is in an attempt hands it
    // to the next in line), and the helper checks the order.
    let mut counts = handoff_round_trips(&lock, &lock, &proxy, &name, &opts, 1, 5).await;
    // The round ends at a majority, so this master's answer may come after the grant (0); a
    // connection's health check may land in a hand-off now and then (one more). Most
    // hand-offs send this master one request (two without the hand-over: a release and the
    // task's acquire).
    counts.sort_unstable();
    assert!(
        counts[2] <= 1,
        "requests to one master from release to the waiting task's grant: {counts:?}"
    );
}

/// With the releasing grant's holds gone from two masters of three (an operator, or expiry
/// there), the round passes the lock on one master only: nothing passes, the outcome is a
/// release's of a grant that no longer holds a majority, and the minority's pass is given
/// back, so no master is left held by either owner.
#[tokio::test]
async fn a_hand_over_that_reaches_a_minority_passes_nothing_and_leaves_nothing_held() {
    if skipped() {
        return;
    }
    let url = common::redlock_url();
    let masters = common::redlock_master_urls();
    assert_eq!(masters.len(), 3, "three test masters");
    let lock = client(&url).await;
    let name = LockName::new(common::unique("redlock-minority")).unwrap();
    let from = granted(&*lock, &request(&*lock, &name, Duration::from_secs(30))).await;
    let from_owner = from.owner.text().to_string();
    for m in &masters {
        assert_eq!(
            owner_on(m, &name).await.as_deref(),
            Some(from_owner.as_str())
        );
    }
    for m in &masters[1..] {
        common::remove_lock(m, &name).await.unwrap();
    }
    let to = request(&*lock, &name, Duration::from_secs(30));
    let outcome = lock.hand_over(&from, &to).await.unwrap();
    assert!(matches!(outcome, HandOver::Released(false)), "{outcome:?}");
    // The give-back waits for the masters up to the round's deadline, and goes on in the
    // background after it (on a loaded machine it may): the masters are free soon after.
    let freed_by = Instant::now() + Duration::from_secs(3);
    for m in &masters {
        while owner_on(m, &name).await.is_some() && Instant::now() < freed_by {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(owner_on(m, &name).await, None, "{m} still holds {name}");
    }
    assert!(lock.inspect(&name).await.unwrap().is_none());
    // The name is free for anyone now.
    let next = granted(&*lock, &request(&*lock, &name, Duration::from_secs(5))).await;
    assert!(next.token > from.token);
    assert!(lock.release(&next).await.unwrap());
}

/// With the releasing grant's hold gone from one master of three, a majority still passes:
/// the new owner holds the lock on the two, under a token above the old grant's, and its
/// release frees every master.
#[tokio::test]
async fn a_hand_over_that_reaches_a_majority_passes_the_lock() {
    if skipped() {
        return;
    }
    let url = common::redlock_url();
    let masters = common::redlock_master_urls();
    let lock = client(&url).await;
    let name = LockName::new(common::unique("redlock-majority")).unwrap();
    let from = granted_on_every_master(&lock, &name, &masters).await;
    common::remove_lock(&masters[2], &name).await.unwrap();
    let to = request(&*lock, &name, Duration::from_secs(30));
    let HandOver::Handed(g) = lock.hand_over(&from, &to).await.unwrap() else {
        panic!("a majority held the grant: it passes");
    };
    assert!(g.token > from.token);
    let to_owner = to.owner.text().to_string();
    for m in &masters[..2] {
        assert_eq!(owner_on(m, &name).await.as_deref(), Some(to_owner.as_str()));
    }
    assert_eq!(owner_on(&masters[2], &name).await, None);
    assert!(
        !lock.release(&from).await.unwrap(),
        "the old grant holds nothing"
    );
    assert!(lock.release(&g).await.unwrap());
    for m in &masters {
        assert_eq!(owner_on(m, &name).await, None, "{m} still holds {name}");
    }
}

/// A hand-over whose every answer is lost is undecided (`Unavailable`), though the masters
/// passed the lock. The waiting task goes on under the same owner, and its next attempt takes
/// the lock afresh over the pass. The round's settling of its lost answers reads each master
/// once it answers again, and finds the waiting task's owner there: it must leave that grant
/// alone (here the next attempt comes from a second client of the masters, under the same
/// owner, while the first client's connections are still muted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_hand_over_leaves_the_waiting_owners_later_grant_alone() {
    if skipped() {
        return;
    }
    let url = common::redlock_url();
    let hosts = hosts_of(&url);
    let mut proxies = Vec::new();
    for h in &hosts {
        proxies.push(Proxy::start(h.clone()).await);
    }
    let addrs: Vec<String> = proxies.iter().map(Proxy::addr).collect();
    let lock = client(&reroute(&url, &hosts, &addrs)).await;
    let direct = client(&url).await;
    let masters = common::redlock_master_urls();
    let name = LockName::new(common::unique("redlock-lost-hand-over")).unwrap();
    let from = granted_on_every_master(&lock, &name, &masters).await;

    let to = request(&*lock, &name, Duration::from_secs(30)).fresh();
    proxies.iter().for_each(|p| p.mute(true));
    let undecided = lock.hand_over(&from, &to).await.map(|_| ());
    assert_eq!(
        undecided.map_err(|e| e.kind()),
        Err(distlock_api::ErrorKind::Unavailable)
    );
    for m in &masters {
        assert_eq!(
            owner_on(m, &name).await.as_deref(),
            Some(to.owner.text().as_ref())
        );
    }
    let later = granted(&*direct, &to).await;
    proxies.iter().for_each(Proxy::heal);
    // The first client's settling reads the masters again, with backoff, once they answer.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let info = direct.inspect(&name).await.unwrap().expect("still held");
    assert_eq!((&info.owner, info.token), (&to.owner, later.token));
    assert_eq!(
        direct.renew(&later, Duration::from_secs(30)).await.unwrap(),
        Duration::from_secs(30)
    );
    for m in &masters {
        assert_eq!(
            owner_on(m, &name).await.as_deref(),
            Some(to.owner.text().as_ref()),
            "{m}"
        );
    }
    assert!(direct.release(&later).await.unwrap());
}
