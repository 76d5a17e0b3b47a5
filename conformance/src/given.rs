//! What the backends' own tests share: the printed skip, the check that two clients made
//! differently lock the same names, and hand-offs counted through a proxy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{DistributedLock, LockExt, LockOptions};

use crate::proxy::Proxy;

use crate::runner::skipped_by_env;

/// Whether `DISTLOCK_SKIP` names `backend`, printed when it does (a skip is never silent).
pub fn skip_printed(backend: &str) -> bool {
    let skip = skipped_by_env(backend);
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names {backend}");
    }
    skip
}

/// A name of this test run alone, starting with `tag`.
pub fn unique_name(tag: &str) -> String {
    format!(
        "{tag}-{}-{:08x}",
        std::process::id(),
        crate::unique_suffix()
    )
}

/// Checks that `a` and `b`, two clients of one server made in different ways, exclude each
/// other on `name` both ways: a lock of `a` is held for `b` (whose `holder` shows `a`'s token),
/// and once `a` releases, `b` takes it and `a` finds it held. Panics on any difference.
pub async fn excludes_both_ways<A, B>(a: &Arc<A>, b: &Arc<B>, name: &str)
where
    A: DistributedLock,
    B: DistributedLock,
{
    let guard = a.try_lock(name).await.unwrap().expect("a free lock");
    assert!(
        b.try_lock(name).await.unwrap().is_none(),
        "the other client must see {name} held"
    );
    let seen = b
        .holder(name)
        .await
        .unwrap()
        .expect("the holder is visible");
    assert_eq!(
        seen.token,
        guard.token(),
        "the other client sees the grant's token"
    );
    assert!(guard.release().await.unwrap(), "released");

    let guard = b
        .lock(name, Duration::from_secs(5))
        .await
        .expect("free again after the release");
    assert!(
        a.try_lock(name).await.unwrap().is_none(),
        "held the other way round too"
    );
    assert!(guard.release().await.unwrap(), "released");
}

/// `rounds` times: a holder takes `name` through `holding`, `depth` waiters queue behind it
/// one after another through `waiting` (the same client as `holding` for tasks of one handle),
/// and the lock passes down the line, each releasing as soon as it holds. Returns, per round,
/// the round trips `proxy` counted from the release before the last waiter's grant to that
/// grant: with `depth` 2, a hand-off to a waiter that was not right behind the holder when it
/// queued. Checks on the way that every waiter waits, is granted only after the release before
/// it began, and gets a larger token. `options` bounds the waiters' wait.
pub async fn handoff_round_trips<H, W>(
    holding: &Arc<H>,
    waiting: &Arc<W>,
    proxy: &Proxy,
    name: &str,
    options: &LockOptions,
    depth: usize,
    rounds: usize,
) -> Vec<u64>
where
    H: DistributedLock,
    W: DistributedLock,
{
    let mut counts = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let mut holder = holding.lock_with(name, options).await.unwrap();
        let released = Arc::new(AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for i in 0..depth {
            let (waiting, name, options, released) = (
                waiting.clone(),
                name.to_string(),
                options.clone(),
                released.clone(),
            );
            waiters.push(tokio::spawn(async move {
                let g = waiting.lock_with(&name, &options).await.unwrap();
                let seen = released.load(Ordering::SeqCst);
                assert!(seen > i, "waiter {i} granted after {seen} releases");
                g
            }));
            // It queues (or finds the lock held), then waits.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "the waiters must wait for the holder"
        );
        let mut last = 0;
        for waiter in waiters {
            let before = proxy.round_trips();
            released.fetch_add(1, Ordering::SeqCst);
            let old = holder.token();
            assert!(holder.release().await.unwrap(), "the holder held");
            holder = waiter.await.unwrap();
            last = proxy.round_trips() - before;
            assert!(holder.token() > old, "{:?} after {old:?}", holder.token());
        }
        holder.release().await.unwrap();
        counts.push(last);
    }
    counts
}
