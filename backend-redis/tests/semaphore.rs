//! What the shared semaphore cases cannot see on Redis: the keys a semaphore is made of, a
//! permit removed behind its holder's back, the lock and a semaphore of one name refusing each
//! other, one counter for the lock's and the permits' tokens, and the operator's and the lost
//! answer's paths (force release by token, give back by the owner's own permit).

mod common;

use std::time::Duration;

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::{AcquireRequest, Surplus};
use distlock_redis::redis::{self, AsyncCommands};
use distlock_redis::{
    DistributedLock, ErrorKind, LockExt, LockName, LockOptions, LostReason, RedisConfig,
};

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redis");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
    }
    skip
}

fn config() -> RedisConfig {
    RedisConfig::from_url(&common::redis_url()).unwrap()
}

/// The holders (owner → lease expiry) and the permit data of `name`, read out of band.
async fn semaphore(name: &LockName) -> (Vec<(String, f64)>, Vec<(String, String)>) {
    let [holders, data] = config().semaphore_keys(name);
    let mut con = common::raw(&common::redis_url()).await.unwrap();
    let holders: Vec<(String, f64)> = con.zrange_withscores(holders, 0, -1).await.unwrap();
    let mut data: Vec<(String, String)> = con.hgetall(data).await.unwrap();
    data.sort();
    (holders, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_is_two_keys_that_go_with_its_last_permit() {
    if skipped() {
        return;
    }
    let prefix = common::unique("sem-keys");
    let name = LockName::new(format!("{prefix}s")).unwrap();
    let c = common::client().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let a = c
        .try_permit(name.as_str(), 3, &opts)
        .await
        .unwrap()
        .expect("free");
    let b = c
        .try_permit(name.as_str(), 3, &opts)
        .await
        .unwrap()
        .expect("free");
    let (holders, data) = semaphore(&name).await;
    let owners: Vec<&str> = holders.iter().map(|(o, _)| o.as_str()).collect();
    let (ao, bo) = (a.owner().to_string(), b.owner().to_string());
    assert_eq!(owners.len(), 2);
    assert!(owners.contains(&ao.as_str()) && owners.contains(&bo.as_str()));
    assert!(
        data.contains(&("#max".to_string(), "3".to_string())),
        "{data:?}"
    );
    let a_data = &data.iter().find(|(o, _)| *o == ao).expect("a's data").1;
    assert!(
        a_data.starts_with(&format!("{}:1:", a.token())),
        "token:count:since, got {a_data}"
    );
    // Both keys expire with the latest lease, on the server's clock.
    let mut con = common::raw(&common::redis_url()).await.unwrap();
    for key in config().semaphore_keys(&name) {
        let pttl: i64 = con.pttl(&key).await.unwrap();
        assert!((1..=30_000).contains(&pttl), "{key}: pttl {pttl}");
    }
    assert!(a.release().await.unwrap());
    assert_eq!(semaphore(&name).await.0.len(), 1);
    assert!(b.release().await.unwrap());
    assert_eq!(
        common::leftovers(&common::redis_url(), &prefix)
            .await
            .unwrap(),
        Vec::<String>::new(),
        "the last release deletes both keys"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_semaphore_of_one_name_refuse_each_other() {
    if skipped() {
        return;
    }
    let name = format!("{}x", common::unique("sem-vs-lock"));
    let (a, b) = (common::client().await, common::client().await);
    let opts = LockOptions::new();
    let permit = a
        .try_permit(name.as_str(), 2, &opts)
        .await
        .unwrap()
        .expect("free");
    for e in [
        b.try_lock(&name).await.unwrap_err(),
        b.lock(&name, Duration::from_millis(100)).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("held with 2 permit(s)"), "{e}");
    }
    assert!(permit.release().await.unwrap());
    let lock = a.try_lock(&name).await.unwrap().expect("free again");
    let e = b.try_permit(name.as_str(), 2, &opts).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("held with 1 permit(s)"), "{e}");
    assert!(lock.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_and_the_permits_of_a_name_share_one_rising_counter() {
    if skipped() {
        return;
    }
    let name = format!("{}t", common::unique("sem-counter"));
    let c = common::client().await;
    let opts = LockOptions::new();
    let lock = c.try_lock(&name).await.unwrap().expect("free");
    let first = lock.token();
    assert!(lock.release().await.unwrap());
    let permit = c
        .try_permit(name.as_str(), 2, &opts)
        .await
        .unwrap()
        .expect("free");
    assert!(permit.token() > first);
    let second = permit.token();
    assert!(permit.release().await.unwrap());
    let lock = c.try_lock(&name).await.unwrap().expect("free");
    assert!(lock.token() > second);
    assert!(lock.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_removed_behind_its_back_is_lost() {
    if skipped() {
        return;
    }
    let name = LockName::new(format!("{}r", common::unique("sem-removed"))).unwrap();
    let c = common::client().await;
    let opts = LockOptions::new().watchdog_ttl(Duration::from_millis(600));
    let g = c
        .try_permit(name.as_str(), 2, &opts)
        .await
        .unwrap()
        .expect("free");
    let lost = g.lost();
    let mut con = common::raw(&common::redis_url()).await.unwrap();
    let _: i64 = con
        .del(config().semaphore_keys(&name).to_vec())
        .await
        .unwrap();
    // The watchdog's next renewal finds the permit gone; the bound only keeps a failure short.
    let why = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost() within the lease");
    assert!(!matches!(why, LostReason::Released), "{why:?}");
    assert!(g.is_lost());
    let e = g.extend(Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert!(
        !g.release().await.unwrap(),
        "a removed permit is not released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_semaphore_answers_with_its_soonest_lease_and_lists_as_one_name() {
    if skipped() {
        return;
    }
    let prefix = common::unique("sem-full");
    let name = format!("{prefix}f");
    let c = common::client().await;
    let long = c
        .try_permit(
            name.as_str(),
            2,
            &LockOptions::new().ttl(Duration::from_secs(60)),
        )
        .await
        .unwrap()
        .expect("free");
    let short = c
        .try_permit(
            name.as_str(),
            2,
            &LockOptions::new().ttl(Duration::from_secs(20)),
        )
        .await
        .unwrap()
        .expect("one left");
    let req = AcquireRequest::new(
        LockName::new(&name).unwrap(),
        c.core().next_owner(),
        Duration::from_secs(5),
    )
    .unwrap()
    .with_permits(2)
    .unwrap();
    match c.attempt(&req).await.unwrap() {
        Attempt::Held {
            expires_in: Some(left),
        } => assert!(
            left <= Duration::from_secs(20) && left > Duration::from_secs(10),
            "the soonest lease is the 20 s one: {left:?}"
        ),
        other => panic!("expected held with an expiry, got {other:?}"),
    }
    let listed = c.list(&prefix).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (listed_name, info) = &listed[0];
    assert_eq!(listed_name.as_str(), name);
    assert_eq!(info.permits, (2, 2));
    assert_eq!(
        (&info.owner, info.token),
        (long.owner(), long.token()),
        "the oldest permit"
    );
    assert!(long.release().await.unwrap());
    assert!(short.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_frees_only_the_permit_of_its_token() {
    if skipped() {
        return;
    }
    let name = LockName::new(format!("{}o", common::unique("sem-force"))).unwrap();
    let c = common::client().await;
    let opts = LockOptions::new();
    let a = c
        .try_permit(name.as_str(), 2, &opts)
        .await
        .unwrap()
        .expect("free");
    let b = c
        .try_permit(name.as_str(), 2, &opts)
        .await
        .unwrap()
        .expect("one left");
    let _inner = b.reenter().await.unwrap();
    assert!(c.force_release(name.as_str(), b.token()).await.unwrap());
    assert!(
        !c.force_release(name.as_str(), b.token()).await.unwrap(),
        "gone"
    );
    let info = c.holder(name.as_str()).await.unwrap().expect("a holds");
    assert_eq!((info.token, info.permits), (a.token(), (1, 2)));
    assert!(!b.release().await.unwrap(), "b's permit was freed");
    let token = a.token();
    assert!(a.release().await.unwrap());
    assert!(
        !c.force_release(name.as_str(), token).await.unwrap(),
        "free"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_back_takes_the_surplus_hold_of_the_owners_own_permit() {
    if skipped() {
        return;
    }
    let name = LockName::new(format!("{}g", common::unique("sem-give"))).unwrap();
    let c = common::client().await;
    let opts = LockOptions::new();
    let oldest = c
        .try_permit(name.as_str(), 3, &opts)
        .await
        .unwrap()
        .expect("free");
    let mine = c
        .try_permit(name.as_str(), 3, &opts)
        .await
        .unwrap()
        .expect("free");
    // An acquire whose answer was lost: the server added a hold no guard accounts for.
    let req = AcquireRequest::new(name.clone(), mine.owner().clone(), Duration::from_secs(30))
        .unwrap()
        .with_permits(3)
        .unwrap();
    let Attempt::Granted(extra) = c.attempt(&req).await.unwrap() else {
        panic!("the owner re-enters its permit");
    };
    assert_eq!((extra.token, extra.hold_count), (mine.token(), 2));
    let ttl = Duration::from_secs(30);
    assert!(c
        .give_back(&Surplus::of_acquire(
            name.clone(),
            mine.owner().clone(),
            ttl
        ))
        .await
        .unwrap());
    assert!(
        !c.give_back(&Surplus::of_acquire(
            name.clone(),
            mine.owner().clone(),
            ttl
        ))
        .await
        .unwrap(),
        "no surplus left"
    );
    let (_, data) = semaphore(&name).await;
    let held = &data
        .iter()
        .find(|(o, _)| *o == mine.owner().to_string())
        .expect("still held")
        .1;
    assert!(held.starts_with(&format!("{}:1:", mine.token())), "{held}");
    let owner = mine.owner().clone();
    assert!(mine.release().await.unwrap());
    // Nothing to give back for an owner that holds no permit, or on a free name.
    assert!(!c
        .give_back(&Surplus::of_acquire(name.clone(), owner.clone(), ttl))
        .await
        .unwrap());
    assert!(oldest.release().await.unwrap());
    assert!(!c
        .give_back(&Surplus::of_acquire(name.clone(), owner.clone(), ttl))
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holders_are_dropped_before_the_count() {
    if skipped() {
        return;
    }
    let name = LockName::new(format!("{}e", common::unique("sem-expired"))).unwrap();
    let c = common::client().await;
    let keep = c
        .try_permit(name.as_str(), 2, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    let dead = c
        .try_permit(name.as_str(), 2, &LockOptions::new())
        .await
        .unwrap()
        .expect("one left");
    // Its lease ends in the past, as if its holder died long ago.
    let [holders, _] = config().semaphore_keys(&name);
    let mut con = common::raw(&common::redis_url()).await.unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(&holders)
        .arg("XX")
        .arg(1)
        .arg(dead.owner().to_string())
        .query_async(&mut con)
        .await
        .unwrap();
    let next = c
        .try_permit(name.as_str(), 2, &LockOptions::new())
        .await
        .unwrap()
        .expect("the expired permit does not count");
    assert!(next.token() > dead.token());
    let (holders, _) = semaphore(&name).await;
    assert!(
        !holders.iter().any(|(o, _)| *o == dead.owner().to_string()),
        "the expired holder was dropped: {holders:?}"
    );
    assert!(
        !dead.release().await.unwrap(),
        "an expired permit is not released"
    );
    assert!(next.release().await.unwrap());
    assert!(keep.release().await.unwrap());
}
