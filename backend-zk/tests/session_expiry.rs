//! A holder whose session is expired out of band: its guard reports lost, the next waiter
//! acquires with a greater token, and the client carries on with a fresh session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_zk::zookeeper_client as zk;
use distlock_zk::{DistributedLock, LockExt, LostReason, ZkConfig, ZkLock};

const SESSION: Duration = Duration::from_secs(1);
/// A generous bound on every step below, several session timeouts long.
const BOUND: Duration = Duration::from_secs(10);
/// How long closing the holder's session out of band may take. It is set-up, not a promise:
/// under load the holder's client can win its session back several times in a row (a CI run
/// once needed more than 10 s), and each try takes up to three session timeouts.
const CLOSE_BOUND: Duration = Duration::from_secs(40);

fn config() -> ZkConfig {
    let url = distlock_zk::DESCRIPTOR.test_url();
    ZkConfig::from_url(&url)
        .map(|c| c.default_ttl(SESSION))
        .expect("DISTLOCK_ZK_URL")
}

async fn connect(config: &ZkConfig) -> Arc<ZkLock> {
    Arc::new(
        ZkLock::connect(config.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}\n  start ZooKeeper: scripts/services up zookeeper")),
    )
}

async fn queue_len(lock: &ZkLock, name: &str) -> usize {
    let path = lock.lock_path(name).unwrap();
    lock.client()
        .list_children(&path)
        .await
        .map_or(0, |c| c.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_session_fires_lost_and_the_next_waiter_acquires() {
    if distlock_conformance::skipped_by_env("zk") {
        eprintln!("SKIPPING expired_session_fires_lost_and_the_next_waiter_acquires: DISTLOCK_SKIP names zk");
        return;
    }
    let config = config();
    let (holder, waiter) = (connect(&config).await, connect(&config).await);
    let name = format!("session-expiry-{}", uuid::Uuid::new_v4().simple());
    let g = holder.lock(&name, BOUND).await.unwrap();
    let first = g.token();
    let lost = g.lost();
    let old_session = holder.session_id();

    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let g = waiter.lock(&name, Duration::from_secs(30)).await;
            (Instant::now(), g)
        })
    };
    let queued_by = Instant::now() + BOUND;
    while queue_len(&holder, &name).await < 2 {
        assert!(Instant::now() < queued_by, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Expire the holder's session behind its back: a second client attaches to the same
    // session (id and password) and closes it, which deletes its ephemeral nodes at once. The
    // holder's client, kicked off by the attach, may win the session back before the close
    // lands; then the thief tries again.
    let info = holder.client().session().clone();
    let closing_by = Instant::now() + CLOSE_BOUND;
    'closing: loop {
        assert!(
            Instant::now() < closing_by,
            "could not close the holder's session"
        );
        let attach = zk::Client::connector()
            .with_session(info.clone())
            .with_session_timeout(SESSION)
            .connect(config.hosts());
        match tokio::time::timeout(SESSION * 2, attach).await {
            Ok(Ok(thief)) => {
                let mut thief_state = thief.state_watcher();
                drop(thief);
                let _ = tokio::time::timeout(SESSION * 2, async {
                    loop {
                        if thief_state.changed().await.is_terminated() {
                            return;
                        }
                    }
                })
                .await;
            }
            // Possibly closed by an earlier attempt whose answer got lost: checked below.
            Ok(Err(zk::Error::SessionExpired)) => {}
            Ok(Err(_)) | Err(_) => continue,
        }
        // The close only counts once the server dropped the holder's ephemeral node; under load
        // the holder's client can win its session back before the close lands.
        let gone_by = Instant::now() + SESSION * 2;
        while Instant::now() < gone_by {
            if queue_len(&waiter, &name).await < 2 {
                break 'closing;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let expired_at = Instant::now();

    let reason = tokio::time::timeout(BOUND, lost)
        .await
        .expect("lost() did not fire after the session expired");
    let lost_after = expired_at.elapsed();
    // The server's notice that the session ended says `Session`; a holder whose client the
    // attach kicked off may first see its safe-until pass unconfirmed, and say `Expired`.
    assert!(
        matches!(reason, LostReason::Session(_) | LostReason::Expired),
        "{reason:?}"
    );
    assert!(g.is_lost());

    let (acquired_at, g2) = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiter did not acquire after the holder's session expired")
        .expect("waiter task");
    let g2 = g2.expect("waiter");
    assert_eq!(g2.owner().label(), waiter.core().owner().label());
    assert!(g2.token() > first, "{} !> {first}", g2.token());
    eprintln!(
        "lost fired {lost_after:?} and the waiter acquired {:?} after the session was closed",
        acquired_at.saturating_duration_since(expired_at)
    );

    // The lost guard's release touches nothing; the holder carries on in a new session.
    assert!(!g.release().await.unwrap());
    let info = waiter.holder(&name).await.unwrap().expect("held");
    assert_eq!(&info.owner, g2.owner());
    let renewed_by = Instant::now() + BOUND;
    while holder.session_id() == old_session {
        assert!(Instant::now() < renewed_by, "no new session after expiry");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = format!("{name}-after");
    let g3 = holder
        .lock(&other, BOUND)
        .await
        .expect("lock in the new session");
    assert!(!g3.is_lost());
    assert!(g3.release().await.unwrap());
    assert!(g2.release().await.unwrap());
}
