//! The client's lease ending behind its back (revoked out of band), and on purpose (`close`,
//! drop). A holder whose process dies is the conformance suite's
//! `killed_holder_process_frees_the_lock_after_its_lease`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_etcd::{ErrorKind, EtcdLock, LockExt, LostReason};

async fn client() -> Arc<EtcdLock> {
    let config = common::config();
    Arc::new(EtcdLock::connect(config).await.unwrap_or_else(|e| {
        panic!(
            "the etcd server at {} cannot be reached: {e}\n  start it: scripts/services up",
            common::url()
        )
    }))
}

/// Starts `client` waiting (30 s) for `name` and returns once its entry is queued behind the
/// holder's: two keys under the lock.
async fn queued_waiter(
    raw: &etcd_client::Client,
    client: &Arc<EtcdLock>,
    name: &str,
) -> tokio::task::JoinHandle<distlock_etcd::Result<distlock_etcd::LockGuard>> {
    let waiter = {
        let (client, name) = (client.clone(), name.to_string());
        tokio::spawn(async move { client.lock(&name, Duration::from_secs(30)).await })
    };
    let queued = Instant::now();
    while common::keys_under(raw, name).await.len() < 2 {
        assert!(
            queued.elapsed() < Duration::from_secs(5),
            "waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    waiter
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_lease_fires_lost_and_the_next_waiter_acquires() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let (a, b) = (client().await, client().await);
    let name = common::unique("revoke");
    let ttl = a.lease_ttl().expect("live lease");
    assert!(ttl >= Duration::from_secs(1), "granted {ttl:?}");

    let g = a.try_lock(&name).await.unwrap().expect("free");
    assert_eq!(g.ttl(), ttl, "a grant reports the lease the server granted");
    let lost = g.lost();
    // The waiter is queued behind the holder: two keys under the lock.
    let waiter = queued_waiter(&raw, &b, &name).await;

    let old_lease = a.lease_id().expect("live lease");
    let revoked_at = Instant::now();
    raw.lease_client()
        .revoke(old_lease)
        .await
        .expect("revoke out of band");

    let reason = tokio::time::timeout(ttl * 3 + Duration::from_secs(2), lost)
        .await
        .expect("lost() did not fire after the lease was revoked");
    let noticed = revoked_at.elapsed();
    // The keep-alive hears "lease not found", or a renewal finds the key gone first.
    assert!(
        matches!(reason, LostReason::Session(_) | LostReason::Taken(_)),
        "{reason:?}"
    );
    assert!(g.is_lost());
    eprintln!("revoke noticed after {noticed:?}: {reason}");

    let g2 = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter did not acquire after the holder's lease was revoked")
        .expect("waiter panicked")
        .expect("waiter failed");
    assert!(g2.token() > g.token(), "{} !> {}", g2.token(), g.token());
    let info = a.holder(&name).await.unwrap().expect("held");
    assert_eq!(&info.owner, g2.owner());
    assert!(
        !g.release().await.unwrap(),
        "the revoked grant's release reported held"
    );

    // The client replaces its lease and keeps working.
    let since = Instant::now();
    let new_lease = loop {
        match a.lease_id() {
            Some(id) if id != old_lease => break id,
            _ => {
                assert!(
                    since.elapsed() < ttl * 3,
                    "no new lease after {:?}",
                    since.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(common::lease_alive(&raw, new_lease).await);
    let other = format!("{name}other");
    let g3 = a.try_lock(&other).await.unwrap().expect("free");
    assert!(!g3.is_lost());
    assert!(g3.release().await.unwrap());

    assert!(g2.release().await.unwrap());
    assert_eq!(common::keys_under(&raw, &name).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_revokes_the_lease_fires_lost_and_frees_the_locks() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let (a, b) = (client().await, client().await);
    let name = common::unique("close");
    let g = a.try_lock(&name).await.unwrap().expect("free");
    // A waiter of the closing client, queued behind another client's lock.
    let busy = format!("{name}busy");
    let held = b.try_lock(&busy).await.unwrap().expect("free");
    let waiter = queued_waiter(&raw, &a, &busy).await;
    let lease = a.lease_id().expect("live lease");
    a.close().await.expect("close");
    let e = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the closed client's waiter kept waiting")
        .expect("waiter panicked")
        .expect_err("the closed client's waiter got the lock");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(!e.is_temporary(), "{e}");
    assert_eq!(common::keys_under(&raw, &busy).await.len(), 1);
    assert!(held.release().await.unwrap());
    assert_eq!(g.lost_reason(), Some(LostReason::ClientGone));
    assert!(
        !common::lease_alive(&raw, lease).await,
        "lease survived close"
    );
    assert_eq!(common::keys_under(&raw, &name).await, Vec::<String>::new());
    // Closed for good: a clear, non-retryable error.
    let e = a.try_lock(&name).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(!e.is_temporary(), "{e}");
    a.close().await.expect("close is idempotent");
    let g2 = b.try_lock(&name).await.unwrap().expect("freed by close");
    assert!(!g.release().await.unwrap());
    assert!(g2.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_revokes_its_lease() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let a = client().await;
    let lease = a.lease_id().expect("live lease");
    assert!(common::lease_alive(&raw, lease).await);
    drop(a);
    let since = Instant::now();
    // Well inside the lease's TTL: only the revoke explains it.
    while common::lease_alive(&raw, lease).await {
        assert!(
            since.elapsed() < Duration::from_secs(1),
            "the dropped client's lease is still alive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_whose_lease_is_revoked_gives_up_promptly() {
    if common::skip() {
        return;
    }
    let raw = common::raw().await;
    let (a, b) = (client().await, client().await);
    let name = common::unique("waitrev");
    let g = a.try_lock(&name).await.unwrap().expect("free");
    let waiter = queued_waiter(&raw, &b, &name).await;
    let revoked_at = Instant::now();
    raw.lease_client()
        .revoke(b.lease_id().expect("live lease"))
        .await
        .expect("revoke out of band");
    let e = waiter
        .await
        .expect("waiter panicked")
        .expect_err("a waiter without a lease was granted");
    let took = revoked_at.elapsed();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_temporary(), "{e}");
    // Told by the keep-alive (a third of the TTL), not by the 5 s re-check of a quiet queue.
    assert!(took < Duration::from_secs(3), "gave up after {took:?}");
    eprintln!("waiter gave up {took:?} after its lease was revoked: {e}");
    assert!(g.release().await.unwrap());
    assert_eq!(common::keys_under(&raw, &name).await, Vec::<String>::new());
}
