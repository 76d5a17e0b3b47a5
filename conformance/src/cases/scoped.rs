//! `with_lock`: work done under a lock, released afterwards, and stopped when the lock is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{ErrorKind, LockExt, LockName, LockOptions};

use crate::case::Ctx;

pub(crate) async fn with_lock_runs_the_work_under_the_lock_and_releases(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("scoped");
    let opts = LockOptions::new().wait(Duration::from_secs(10));
    let seen = a
        .with_lock(&name, &opts, |token| {
            let (b, name) = (b.clone(), name.clone());
            async move {
                let info = b
                    .holder(&name)
                    .await
                    .unwrap()
                    .expect("held while the work runs");
                assert!(b.try_lock(&name).await.unwrap().is_none());
                (token, info.token)
            }
        })
        .await
        .unwrap();
    assert_eq!(
        seen.0, seen.1,
        "the work got another token than the holder's"
    );
    assert!(
        b.holder(&name).await.unwrap().is_none(),
        "not released after the work"
    );
}

pub(crate) async fn with_lock_stops_the_work_when_the_lock_is_lost(cx: Ctx) {
    let a = cx.client().await;
    let name = cx.name("scoped-lost");
    let opts = LockOptions::new().watchdog_ttl(cx.harness().short_ttl());
    let finished = Arc::new(AtomicBool::new(false));
    let work = a.with_lock(&name, &opts, |_| {
        let finished = finished.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            finished.store(true, Ordering::SeqCst);
        }
    });
    let remove = async {
        // Let the work start, then take the lock away behind its back.
        tokio::time::sleep(Duration::from_millis(300)).await;
        cx.harness()
            .remove_behind_back(&LockName::new(&name).unwrap())
            .await
            .expect("remove hook");
    };
    let (outcome, ()) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(work, remove)
    })
    .await
    .expect("the work went on after the lock was lost");
    let e = outcome.expect_err("the work finished although the lock was lost");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert!(!finished.load(Ordering::SeqCst));
}
