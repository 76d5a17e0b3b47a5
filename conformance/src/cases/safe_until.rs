//! Cases of the lease invariant: at every instant, each live guard's safe-until is at most the
//! server's expiry of its hold. Every backend keeps it the same way: a renewal, an `extend(d)`
//! or a re-entry means "the lease lasts at least `d` from now" and never shortens what the
//! server already granted, while the guard's safe-until only ever moves later. Each renewal
//! acts on its exact grant only, so a late one of an old grant leaves a newer grant alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::{DistributedLock, ErrorKind, LockExt, LockGuard, LockOptions, OwnerId};

use crate::case::{unique_suffix, Ctx};

/// The long lease the cases start from; the short one they extend or re-enter with.
const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_secs(1);
/// What must be left of [`LONG`] after the few seconds a case takes.
const STILL_LEFT: Duration = Duration::from_secs(50);
/// How long after [`SHORT`] ran out a case looks: past it, plus room for a slow server.
const PAST_SHORT: Duration = Duration::from_millis(1600);

/// An owner id of this case alone, passed explicitly to every acquire that must share it.
fn explicit_owner(tag: &str) -> OwnerId {
    OwnerId::new(format!("lease-{tag}-{:08x}", unique_suffix())).expect("a valid owner id")
}

async fn take(c: &Arc<dyn DistributedLock>, name: &str, options: &LockOptions) -> LockGuard {
    c.try_lock_with(name, options)
        .await
        .unwrap_or_else(|e| panic!("try_lock_with({name:?}, {options:?}) failed: {e}"))
        .unwrap_or_else(|| panic!("{name:?} should be free (or ours to re-enter)"))
}

/// Asserts that `other` cannot take `name` while `g` holds it, with both the server's lease
/// and `g`'s safe-until still well ahead. Two live holders is reported as such: the first
/// thing a shortened server lease breaks is the invariant, the second is the decision that
/// leases are never shortened.
async fn still_held_long(other: &Arc<dyn DistributedLock>, name: &str, g: &LockGuard) {
    let stolen = other
        .try_lock(name)
        .await
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {e}"));
    let now = Instant::now();
    if let Some(thief) = &stolen {
        assert!(
            g.is_lost(),
            "two holders: another client got {name:?} (token {}) while the first guard (token \
             {}) still claims it until {:?} from now",
            thief.token(),
            g.token(),
            g.safe_until().map(|u| u.saturating_duration_since(now)),
        );
    }
    assert!(
        stolen.is_none(),
        "the server's lease was shortened below the {LONG:?} it granted first (a renewal or \
         re-entry must never shorten it): another client took {name:?}"
    );
    assert!(!g.is_lost(), "guard lost: {:?}", g.lost_reason());
    let until = g.safe_until().expect("a fixed lease has a safe-until");
    assert!(
        until > now + STILL_LEFT,
        "the guard's safe-until moved earlier: {:?} left",
        until.saturating_duration_since(now)
    );
    let info = other
        .holder(name)
        .await
        .unwrap_or_else(|e| panic!("holder({name:?}) failed: {e}"))
        .expect("the lock is held");
    assert_eq!(&info.owner, g.owner());
    assert_eq!(info.token, g.token());
    let left = info
        .remaining
        .expect("a per-lock lease reports what is left");
    assert!(
        left > STILL_LEFT,
        "the server's lease was shortened: {left:?} left of {LONG:?}"
    );
}

/// `extend(d)` to less than the lease left keeps the longer lease on the server, so the guard,
/// whose safe-until never moves earlier, stays honest.
pub(crate) async fn extend_to_a_shorter_lease_keeps_the_guard_honest(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("short-ext");
    let g = take(&a, &name, &LockOptions::new().ttl(LONG)).await;
    let before = g.safe_until().expect("a fixed lease has a safe-until");
    g.extend(SHORT).await.expect("extend while held");
    assert!(
        g.safe_until() >= Some(before),
        "extend moved safe-until earlier"
    );
    tokio::time::sleep(PAST_SHORT).await;
    still_held_long(&b, &name, &g).await;
    assert!(g.release().await.expect("release"), "release: not held");
    assert!(
        b.holder(&name).await.expect("holder").is_none(),
        "held after the release"
    );
}

/// An owner holding a lock with a long lease re-enters it with a short one and gives that hold
/// back: the lock keeps the long lease the outer hold was granted.
pub(crate) async fn reentrant_holds_with_different_ttls_keep_the_longest_lease(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("reent-ttl");
    let owner = explicit_owner("re");
    let outer = take(
        &a,
        &name,
        &LockOptions::new().owner(owner.clone()).ttl(LONG),
    )
    .await;
    let inner = take(
        &a,
        &name,
        &LockOptions::new().owner(owner.clone()).ttl(SHORT),
    )
    .await;
    assert_eq!(inner.hold_count(), 2, "the second acquire re-entered");
    assert_eq!(inner.token(), outer.token(), "a re-entry keeps the token");
    assert!(inner.release().await.expect("release inner"), "inner hold");
    tokio::time::sleep(PAST_SHORT).await;
    still_held_long(&b, &name, &outer).await;
    let info = b.holder(&name).await.expect("holder").expect("held");
    assert_eq!(info.hold_count, 1, "the outer hold is left");
    assert_eq!(&info.owner, outer.owner());
    assert_eq!(info.owner.label(), owner.label());
    assert!(outer.release().await.expect("release outer"), "outer hold");
    assert!(
        b.holder(&name).await.expect("holder").is_none(),
        "held after the last release"
    );
}

/// A renewal of a grant that ended, sent late, must not act on a newer grant the same owner
/// holds now — neither alone nor in a batch — so the newer grant keeps exactly the lease its
/// guard was told of.
pub(crate) async fn late_renewal_of_an_old_grant_leaves_a_newer_grant_of_its_owner_alone(cx: Ctx) {
    let ttl = cx.harness().short_ttl();
    // The newer grant's lease: short enough that a renewal for the old grant's 60 s would show.
    let newer_lease = Duration::from_secs(5);
    let a = cx.client().await;
    let owner = explicit_owner("late");
    let (name, other) = (cx.name("late"), cx.name("late-other"));
    let old = take(&a, &name, &LockOptions::new().owner(owner.clone()).ttl(ttl)).await;
    tokio::time::sleep(ttl + ttl / 2 + Duration::from_millis(50)).await;
    assert!(old.is_lost(), "the old grant's lease ran out");
    let newer = take(
        &a,
        &name,
        &LockOptions::new().owner(owner.clone()).ttl(newer_lease),
    )
    .await;
    assert_eq!(newer.hold_count(), 1, "a fresh grant, not a re-entry");
    if a.capabilities().fencing_tokens() {
        assert!(
            newer.token() > old.token(),
            "a fresh grant's token is greater"
        );
    }
    // Due together with the old grant, so a batching backend renews both in one request.
    let kept = take(
        &a,
        &other,
        &LockOptions::new().owner(owner.clone()).ttl(LONG),
    )
    .await;

    let e = a
        .renew(old.grant(), LONG)
        .await
        .expect_err("a late renewal of an ended grant succeeded");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    let results = a
        .renew_many(&[(old.grant().clone(), LONG), (kept.grant().clone(), LONG)])
        .await;
    assert_eq!(results.len(), 2);
    assert_eq!(
        results[0].as_ref().map_err(|e| e.kind()).err(),
        Some(ErrorKind::Lost),
        "batch renewal of the ended grant: {:?}",
        results[0]
    );
    assert!(
        results[1].is_ok(),
        "batch renewal of a held grant: {:?}",
        results[1]
    );

    let info = a.holder(&name).await.expect("holder").expect("held");
    assert_eq!(info.token, newer.token(), "the newer grant holds the lock");
    let left = info
        .remaining
        .expect("a per-lock lease reports what is left");
    assert!(
        left <= newer_lease,
        "a renewal of the old grant lengthened the newer grant's lease to {left:?}"
    );
    assert!(!newer.is_lost(), "newer grant: {:?}", newer.lost_reason());
    assert!(
        !old.release().await.expect("release old"),
        "the ended grant's release claimed the lock"
    );
    assert!(newer.release().await.expect("release newer"));
    assert!(kept.release().await.expect("release kept"));
}
