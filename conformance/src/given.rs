//! What the backends' tests of clients built from an application's own driver object share:
//! the printed skip, and the check that two clients made differently lock the same names.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{DistributedLock, LockExt};

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
