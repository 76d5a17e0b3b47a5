//! A RedLock grant is one value on every master: the guard's token, the token `holder()`
//! reports and the one `force_release` accepts are the token each master of the grant keeps
//! (its derived fence where one was written, else its own counter's value) — after contended
//! grants on masters whose counters disagree, after re-entries, and after hand-overs between
//! tasks of one handle. Every master is read directly, not through the client.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::DistributedLock;
use distlock_conformance::{hosts_of, reroute, Proxy};
use distlock_redis::redis::AsyncCommands;
use distlock_redis::{
    ErrorKind, LockExt, LockGuard, LockName, LockOptions, RedLock, RedLockConfig,
};

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redlock");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redlock");
    }
    skip
}

async fn client() -> Arc<RedLock> {
    common::redlock_client(&common::redlock_url()).await
}

/// What one master keeps of a lock: its owner, hold count and token (the fence if written).
async fn kept_on(url: &str, name: &LockName) -> Option<(String, u32, u64)> {
    let key = RedLockConfig::from_url(&common::redlock_url())
        .unwrap()
        .lock_key(name);
    let mut con = common::raw(url).await.unwrap();
    let fields: Vec<(String, String)> = con.hgetall(&key).await.unwrap();
    let field = |f: &str| fields.iter().find(|(k, _)| k == f).map(|(_, v)| v.clone());
    let (owner, count) = fields.iter().find(|(k, _)| !k.starts_with('#'))?;
    let token = field("#fence")
        .or_else(|| field("#token"))
        .and_then(|t| t.parse().ok())?;
    Some((owner.clone(), count.parse().unwrap(), token))
}

/// Checks `g` against every master: a majority keep its owner with its token and hold count
/// at once, and within a moment (late masters join in the background) every master that keeps
/// its owner keeps that token; `holder()` reports the same token.
async fn agrees_with_the_masters(lock: &Arc<RedLock>, g: &LockGuard, what: &str) {
    let name = g.name();
    let owner = g.owner().text().to_string();
    let masters = common::redlock_master_urls();
    let quorum = masters.len() / 2 + 1;
    let mut kept = Vec::new();
    for m in &masters {
        kept.push(kept_on(m, name).await);
    }
    let agreeing = kept
        .iter()
        .flatten()
        .filter(|(o, n, t)| *o == owner && *t == g.token().0 && *n >= g.hold_count())
        .count();
    assert!(
        agreeing >= quorum,
        "{what}: guard token {} ({} holds), masters keep {kept:?}",
        g.token(),
        g.hold_count()
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut kept = Vec::new();
        for m in &masters {
            kept.push(kept_on(m, name).await);
        }
        let odd: Vec<_> = kept
            .iter()
            .flatten()
            .filter(|(o, _, t)| *o == owner && *t != g.token().0)
            .collect();
        if odd.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: guard token {}, yet masters keep {odd:?} for its owner",
            g.token()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info = lock.holder(name.as_str()).await.unwrap().expect("held");
    assert_eq!(
        (info.owner.text().to_string(), info.token),
        (owner.clone(), g.token()),
        "{what}: holder() disagrees with the guard"
    );
}

/// Puts the masters' counters for `name` out of step, as grants that reached only some of
/// them leave them: each master's counter a different distance ahead.
async fn counters_out_of_step(name: &LockName) {
    let key = RedLockConfig::from_url(&common::redlock_url())
        .unwrap()
        .fence_key(name);
    for (i, m) in common::redlock_master_urls().iter().enumerate() {
        let mut con = common::raw(m).await.unwrap();
        let _: u64 = con.incr(&key, 3 * i as u64 + 1).await.unwrap();
    }
}

/// Four handles contend for one name; every grant (fresh, with the counters out of step; and
/// re-entered) is checked against the masters, and `force_release` by another handle takes
/// exactly the guard's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_grants_and_reentries_keep_one_token_on_every_master() {
    if skipped() {
        return;
    }
    let name = LockName::new(common::unique("redlock-tokens")).unwrap();
    counters_out_of_step(&name).await;
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(client().await);
    }
    let operator = client().await;
    let mut tasks = Vec::new();
    for (h, lock) in handles.into_iter().enumerate() {
        let (name, operator) = (name.clone(), operator.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..12 {
                let what = format!("handle {h}, round {round}");
                if round % 4 == 3 {
                    // Another step of the counters, so that later grants disagree again.
                    counters_out_of_step(&name).await;
                }
                let g = lock
                    .lock(name.as_str(), Duration::from_secs(20))
                    .await
                    .unwrap();
                agrees_with_the_masters(&lock, &g, &what).await;
                let inner = g.reenter().await.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!((inner.token(), inner.hold_count()), (g.token(), 2));
                agrees_with_the_masters(&lock, &inner, &format!("{what}, re-entered")).await;
                assert!(inner.release().await.unwrap());
                if round % 3 == 2 {
                    let wrong = distlock_redis::FencingToken(g.token().0 + 1);
                    assert!(!operator.force_release(name.as_str(), wrong).await.unwrap());
                    assert!(
                        operator
                            .force_release(name.as_str(), g.token())
                            .await
                            .unwrap(),
                        "{what}: force_release refused the guard's token {}",
                        g.token()
                    );
                    drop(g);
                } else {
                    assert!(g.release().await.unwrap(), "{what}");
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Tasks of one handle hand the lock to each other; each hand-over's grant is checked against
/// the masters, before and after a re-entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_overs_keep_one_token_on_every_master() {
    if skipped() {
        return;
    }
    let name = LockName::new(common::unique("redlock-tokens-ho")).unwrap();
    counters_out_of_step(&name).await;
    let lock = client().await;
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .wait(Duration::from_secs(20));
    let mut tasks = Vec::new();
    for t in 0..3 {
        let (lock, name, opts) = (lock.clone(), name.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..8 {
                let what = format!("task {t}, round {round}");
                let g = lock.lock_with(name.as_str(), &opts).await.unwrap();
                agrees_with_the_masters(&lock, &g, &what).await;
                if round % 2 == 0 {
                    let inner = g.reenter().await.unwrap_or_else(|e| panic!("{what}: {e}"));
                    agrees_with_the_masters(&lock, &inner, &format!("{what}, re-entered")).await;
                    assert!(inner.release().await.unwrap());
                }
                assert!(g.release().await.unwrap(), "{what}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(lock.holder(name.as_str()).await.unwrap().is_none());
}

/// An attempt of an acquisition takes the lock afresh over a hold an earlier attempt of it left
/// (its answer lost), so that attempt's give-back — sent to every master, and again where its
/// answer was lost too — cannot take the grant's holds.
#[tokio::test]
async fn an_attempt_takes_afresh_the_hold_a_lost_attempt_of_its_acquisition_left() {
    if skipped() {
        return;
    }
    let (lock, other) = (client().await, client().await);
    let name = LockName::new(common::unique("redlock-lost-attempt")).unwrap();
    common::an_attempt_takes_afresh_the_hold_a_lost_attempt_left(&*lock, &*other, &name).await;
}

/// A re-entry two masters of three answer too late fails with `Unavailable`; the masters apply
/// it anyway, and the hold it added there is given back once, by the client's settling of the
/// lost answer, not a second time by the round's own handling of the late answers: the outer
/// guard keeps its one hold on every master, and its release frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_the_masters_answer_too_late_is_given_back_once() {
    if skipped() {
        return;
    }
    let url = common::redlock_url();
    let hosts = hosts_of(&url);
    let slow = [
        Proxy::start(hosts[1].clone()).await,
        Proxy::start(hosts[2].clone()).await,
    ];
    let proxied = reroute(&url, &hosts[1..], &[slow[0].addr(), slow[1].addr()]);
    let lock = common::redlock_client(&proxied).await;
    let name = common::unique("redlock-late-reentry");
    // A long lease: no renewal falls within the test.
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let outer = lock
        .try_lock_with(&name, &opts)
        .await
        .unwrap()
        .expect("free");
    let owner = outer.owner().text().to_string();
    let masters = common::redlock_master_urls();
    let once = Some((owner.clone(), 1, outer.token().0));
    wait_for_masters(outer.name(), &masters, &once).await;

    // Each way: the round gives up on these two long before their answers come.
    for p in &slow {
        p.delay(Duration::from_millis(400));
    }
    let err = outer
        .reenter()
        .await
        .expect_err("only one master answered in time");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // The late acquires land, then their answers and the give-back's reads, then releases.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for p in &slow {
        p.delay(Duration::ZERO);
    }
    for m in &masters {
        assert_eq!(
            kept_on(m, outer.name()).await,
            once,
            "{m} after the late re-entry was given back"
        );
    }
    assert!(!outer.is_lost());
    let name = outer.name().clone();
    assert!(outer.release().await.unwrap());
    for m in &masters {
        assert_eq!(kept_on(m, &name).await, None, "{m} after the release");
    }
}

/// Waits up to 3 s for every master to keep `want` for `name` (late masters join a grant in
/// the background).
async fn wait_for_masters(name: &LockName, masters: &[String], want: &Option<(String, u32, u64)>) {
    let deadline = Instant::now() + Duration::from_secs(3);
    for m in masters {
        while kept_on(m, name).await != *want {
            assert!(Instant::now() < deadline, "{m} never kept {want:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A release decided at a majority keeps its hold counted on the client until the master it
/// still waits for has answered: a give-back of the owner's meanwhile (a lost answer being
/// settled) reads that master's count against the client's, and would otherwise take the
/// hold the late release is about to take, as a surplus, and leave the master free under the
/// outer guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_keeps_its_hold_counted_until_the_last_master_answers() {
    if skipped() {
        return;
    }
    let url = common::redlock_url();
    let hosts = hosts_of(&url);
    let slow = Proxy::start(hosts[2].clone()).await;
    let proxied = reroute(&url, &hosts[2..], &[slow.addr()]);
    let lock = common::redlock_client(&proxied).await;
    let name = common::unique("redlock-straggling-release");
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let outer = lock
        .try_lock_with(&name, &opts)
        .await
        .unwrap()
        .expect("free");
    let inner = outer.reenter().await.unwrap();
    let masters = common::redlock_master_urls();
    let twice = Some((outer.owner().text().to_string(), 2, outer.token().0));
    wait_for_masters(outer.name(), &masters, &twice).await;
    // The slow master's answer reaches the client a moment after the master applied it:
    // then the re-entry's release is sent there too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let counted = {
        let (lock, name, owner) = (lock.clone(), outer.name().clone(), outer.owner().clone());
        move || lock.core().holds_accounted(&name, &owner)
    };
    assert_eq!(counted(), 2);

    slow.delay(Duration::from_millis(500));
    assert!(
        inner.release().await.unwrap(),
        "decided by the two quick masters"
    );
    assert_eq!(counted(), 2, "the slow master has not taken its hold yet");
    counted_down_to(&counted, 1, "after the slow master answered").await;
    slow.delay(Duration::ZERO);
    let once = Some((outer.owner().text().to_string(), 1, outer.token().0));
    wait_for_masters(outer.name(), &masters, &once).await;
    assert!(outer.release().await.unwrap());
    counted_down_to(&counted, 0, "after the last release").await;
}

/// Waits up to 5 s for `counted` to fall to `n`.
async fn counted_down_to(counted: &impl Fn() -> u32, n: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while counted() > n {
        assert!(Instant::now() < deadline, "still counted {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
